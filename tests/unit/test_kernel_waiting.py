"""``wait_pending``: a thread spins for its reply only while its replies come that quickly."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from regency._runtime.kernel import waiting
from regency._runtime.kernel.pending import Pending
from regency._transport.io_loop import REPLY_SPIN_SECONDS, IOLoop, Turn

pytestmark = pytest.mark.timeout(30)


class Clock:
    """``time.monotonic`` for the module under test: moved on by the fake wait."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_a_thread_spins_only_while_its_replies_come_within_the_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    spins: list[float] = []
    # How long each successive reply takes to come.
    takes = [10e-6, 3e-3, 3e-3, 10e-6, 10e-6]

    def fake_wait_until(
        until: Callable[[], bool],
        fd: int,
        timeout: float | None,
        spin: float = 0.0,
        turn: Turn | None = None,
    ) -> bool:
        spins.append(spin)
        clock.now += takes[len(spins) - 1]
        return True

    monkeypatch.setattr(waiting, "time", clock)
    monkeypatch.setattr(waiting, "wait_until", fake_wait_until)
    results: list[Any] = []

    def waiter() -> None:  # a thread of its own: the spin is decided per thread
        results.extend(waiting.wait_pending(Pending(), 1.0) for _ in takes)

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(10)
    assert results == [True] * len(takes)
    # A first wait spins; a slow reply stops the next wait's spin, a quick one brings it back.
    assert spins == [REPLY_SPIN_SECONDS, REPLY_SPIN_SECONDS, 0.0, 0.0, REPLY_SPIN_SECONDS]


def test_a_flush_that_raises_gives_the_claimed_turn_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waiting thread claimed the connections before flushing: if the flush raises, the
    loop must read them again (nobody else would)."""
    loop = IOLoop(name="test-waiting")
    released: list[Turn] = []

    class Runtime:
        def __init__(self) -> None:
            self.loop = loop

        def flush(self) -> None:
            raise KeyboardInterrupt

    turn = Turn(0)
    monkeypatch.setattr(waiting.state, "existing", Runtime)
    monkeypatch.setattr(loop, "release", released.append)
    try:
        with pytest.raises(KeyboardInterrupt):
            waiting.wait_until(lambda: False, 0, 1.0, turn=turn)
    finally:
        loop.stop()
    assert released == [turn]
