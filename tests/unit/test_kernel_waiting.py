"""``wait_pending``: a thread spins for its reply only while its replies come that quickly, and
gives the connections it claimed back however its wait ends."""

from __future__ import annotations

import socket
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


class Loop:
    """An I/O loop whose inline wait takes as long as the next entry of ``takes``."""

    def __init__(self, clock: Clock, takes: list[float]) -> None:
        self.clock = clock
        self.takes = takes
        self.spins: list[float] = []

    def wait_reading(
        self,
        until: Callable[[], bool],
        wake_fd: int,
        timeout: float | None,
        spin_until: float = 0.0,
        turn: Turn | None = None,
        before: Callable[[], None] | None = None,
    ) -> bool:
        self.spins.append(spin_until and spin_until - self.clock.now)
        self.clock.now += self.takes[len(self.spins) - 1]
        return True


class Runtime:
    def __init__(self, loop: Any) -> None:
        self.loop = loop

    def flush(self) -> None:
        pass


def test_a_thread_spins_only_while_its_replies_come_within_the_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    # How long each successive reply takes to come.
    takes = [10e-6, 3e-3, 3e-3, 10e-6, 10e-6]
    loop = Loop(clock, takes)
    monkeypatch.setattr(waiting, "monotonic", clock.monotonic)
    monkeypatch.setattr(waiting.state, "existing", lambda: Runtime(loop))
    results: list[Any] = []

    def waiter() -> None:  # a thread of its own: the spin is decided per thread
        results.extend(waiting.wait_pending(Pending(), 1.0) for _ in takes)

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(10)
    assert results == [True] * len(takes)
    # A first wait spins; a slow reply stops the next wait's spin, a quick one brings it back.
    spin = pytest.approx(REPLY_SPIN_SECONDS)
    assert loop.spins == [spin, spin, 0.0, 0.0, spin]


def test_a_flush_that_raises_gives_the_claimed_sockets_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The waiting thread claimed the connections before flushing: if the flush raises, the
    loop must read them again (nobody else would)."""
    loop = IOLoop(name="test-waiting")
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    readers: list[str] = []
    got = threading.Event()

    def readable(_: int) -> None:
        if ours.recv(1):
            readers.append(threading.current_thread().name)
            got.set()

    class Failing(Runtime):
        def flush(self) -> None:
            raise KeyboardInterrupt

    loop.register(ours.fileno(), readable, stealable=True)
    monkeypatch.setattr(waiting.state, "existing", lambda: Failing(loop))
    try:
        with pytest.raises(KeyboardInterrupt):
            waiting.wait_pending(Pending(), 1.0)
        theirs.send(b"x")
        assert got.wait(10), "nobody read the socket after the failed wait"
        assert readers == ["test-waiting"]
    finally:
        loop.stop()
        ours.close()
        theirs.close()


class TimingOut(Loop):
    """An inline wait that always runs out of time."""

    def wait_reading(self, *args: Any, **kwargs: Any) -> bool:
        super().wait_reading(*args, **kwargs)
        return False


@pytest.mark.parametrize("inline", [True, False])
def test_timed_out_waits_leave_no_callbacks_behind(
    monkeypatch: pytest.MonkeyPatch, inline: bool
) -> None:
    # A caller polling get(timeout) on a long call: each timed-out wait must take back the
    # wake-up it registered, or the pending holds one more callback per poll.
    clock = Clock()
    loop = TimingOut(clock, [1e-3] * 50)
    monkeypatch.setattr(waiting, "monotonic", clock.monotonic)
    monkeypatch.setattr(waiting.state, "existing", lambda: Runtime(loop) if inline else None)
    pending = Pending()
    seen: list[str] = []
    pending.add_done_callback(lambda _: seen.append("done"))
    assert [waiting.wait_pending(pending, 0.001) for _ in range(50)] == [False] * 50
    assert len(pending._callbacks or ()) == 1  # only the caller's own
    pending.set_result(7)
    assert seen == ["done"]
    assert pending.outcome() == 7
