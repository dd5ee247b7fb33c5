"""``Pending``: filled once from any thread; ``wait`` blocks until then (its lock is made only
for a blocking wait, not with every pending)."""

from __future__ import annotations

import threading
import time

import pytest

from regency._runtime.kernel.pending import Pending

pytestmark = pytest.mark.timeout(30)


def test_wait_times_out_then_sees_the_value_filled_later() -> None:
    pending = Pending()
    began = time.monotonic()
    assert pending.wait(0.05) is False
    assert time.monotonic() - began >= 0.05
    filler = threading.Timer(0.05, lambda: pending.set_result(7))
    filler.start()
    assert pending.wait(10) is True  # a second wait after a timed-out one
    filler.join()
    assert pending.outcome() == 7


def test_a_filled_pending_does_not_block() -> None:
    pending = Pending()
    pending.set_exception(ValueError("no"))
    assert pending.wait(0) is True
    assert pending.is_done()
    with pytest.raises(ValueError, match="no"):
        pending.outcome()


def test_every_waiting_thread_is_woken() -> None:
    pending = Pending()
    woke: list[bool] = []
    threads = [threading.Thread(target=lambda: woke.append(pending.wait(10))) for _ in range(4)]
    for thread in threads:
        thread.start()
    # Each blocking wait registers one callback: set the value only once all four block.
    deadline = time.monotonic() + 10
    while len(pending._callbacks or ()) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(pending._callbacks or ()) == 4, "the threads never blocked in wait()"
    pending.set_raw([b"\x80\x05K\x03."])  # pickle of 3
    for thread in threads:
        thread.join(10)
    assert woke == [True] * 4
    assert pending.outcome() == 3
