"""``IOLoop.wait_reading`` and ``claim``: which thread reads the stolen descriptors while several
wait, and what a thread that claimed them ahead of its wait gets."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from regency._transport.io_loop import IOLoop

pytestmark = pytest.mark.timeout(60)

LOOP_THREAD = "regency-test-io"


class Waiter:
    """A thread in ``loop.wait_reading`` until :meth:`release`; counts its checks of ``until``."""

    def __init__(self, loop: IOLoop, name: str) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.checks = 0
        self.released = False
        self.result: bool | None = None
        self._checked = threading.Condition()
        self.thread = threading.Thread(target=self._run, args=(loop,), name=name, daemon=True)
        self.thread.start()
        self.wait_checks(1)

    def _until(self) -> bool:
        with self._checked:
            self.checks += 1
            self._checked.notify_all()
        return self.released

    def wait_checks(self, count: int) -> None:
        """Block until ``until()`` has been checked ``count`` times."""
        with self._checked:
            assert self._checked.wait_for(lambda: self.checks >= count, 10), self.checks

    def _run(self, loop: IOLoop) -> None:
        self.result = loop.wait_reading(self._until, self.fd, 30)

    def release(self) -> None:
        """Make ``until()`` true, wake the thread through its eventfd, and join it."""
        self.released = True
        os.eventfd_write(self.fd, 1)
        self.thread.join(10)
        assert not self.thread.is_alive()
        os.close(self.fd)


class Peer:
    """One end of a socket pair registered as stealable; records which thread read each byte."""

    def __init__(self, loop: IOLoop) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.ours.setblocking(False)
        self.readers: list[str] = []
        self._got = threading.Event()
        loop.register(self.ours.fileno(), self._readable, stealable=True)

    def _readable(self, _events: int) -> None:
        # Two threads polling the same socket both wake; the one that finds it empty returns.
        with contextlib.suppress(BlockingIOError):
            if self.ours.recv(1):
                self.readers.append(threading.current_thread().name)
                self._got.set()

    def exchange(self) -> str:
        """Send one byte; return the name of the thread that read it."""
        self._got.clear()
        self.theirs.send(b"x")
        assert self._got.wait(10), "nobody read the byte"
        return self.readers[-1]


@pytest.fixture
def loop() -> Iterator[IOLoop]:
    io = IOLoop(LOOP_THREAD)
    yield io
    io.stop()


def test_only_the_latest_waiter_reads_inline(loop: IOLoop) -> None:
    peer = Peer(loop)
    first = Waiter(loop, "first")
    assert peer.exchange() == "first"  # a lone waiter reads its sockets itself

    second = Waiter(loop, "second")  # it has taken over by the time its first check ran
    # Any check of the earlier waiter that begins now is followed by its switch to its eventfd
    # alone, before it polls again (a check counted earlier may be its 100 ms re-check from
    # before the takeover, which under load can come first).
    first.wait_checks(first.checks + 1)
    began, checks = time.monotonic(), first.checks
    readers = {peer.exchange() for _ in range(50)}
    elapsed = time.monotonic() - began
    # Each of 50 bytes woke the earlier waiter too while it polled the socket; now only its
    # bounded re-check (every 100 ms) does.
    assert first.checks - checks <= 2 + int(elapsed / 0.1), (first.checks - checks, elapsed)
    assert readers == {"second"}

    second.release()
    assert second.result is True
    # The reader is done: the loop thread reads again; the earlier waiter still does not.
    assert {peer.exchange() for _ in range(5)} == {LOOP_THREAD}
    first.release()
    assert first.result is True


def test_a_claimed_turn_keeps_frames_for_the_claiming_thread(loop: IOLoop) -> None:
    claimed = Peer(loop)
    # Read by the loop thread alone: once it has read this, it would have read `claimed` too.
    marker = socket.socketpair()
    marker_read = threading.Event()

    def read_marker(_events: int) -> None:
        marker[0].recv(1)
        marker_read.set()

    loop.register(marker[0].fileno(), read_marker)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        turn = loop.claim(fd)
        assert turn is not None
        claimed.theirs.send(b"x")  # arrives before the claiming thread polls
        marker[1].send(b"m")
        assert marker_read.wait(10)
        assert claimed.readers == []  # it waits in the kernel for the claiming thread

        got = loop.wait_reading(lambda: bool(claimed.readers), fd, 10, turn=turn)
        assert got is True
        assert claimed.readers == [threading.current_thread().name]
        # The wait is over: the loop thread reads again.
        assert claimed.exchange() == LOOP_THREAD
    finally:
        loop.unregister(marker[0].fileno())
        for end in marker:
            end.close()
        os.close(fd)


def test_a_released_turn_gives_the_sockets_back_to_the_loop(loop: IOLoop) -> None:
    peer = Peer(loop)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        turn = loop.claim(fd)
        assert turn is not None
        loop.release(turn)
        assert peer.exchange() == LOOP_THREAD
    finally:
        os.close(fd)


def test_the_loop_thread_cannot_claim(loop: IOLoop) -> None:
    Peer(loop)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    claims: list[object] = []
    done = threading.Event()

    def on_loop() -> None:
        claims.append(loop.claim(fd))
        done.set()

    try:
        loop.call_soon(on_loop)
        assert done.wait(10)
        assert claims == [None]
    finally:
        os.close(fd)


class Marker:
    """A socket the loop thread alone reads: once it has read a byte sent after another
    socket's, it has seen that socket readable too (one epoll_wait brings both)."""

    def __init__(self, loop: IOLoop) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.read = threading.Event()
        loop.register(self.ours.fileno(), self._readable)

    def _readable(self, _events: int) -> None:
        self.ours.recv(1)
        self.read.set()

    def pass_through(self) -> None:
        """Send a byte and wait until the loop thread has read it."""
        self.read.clear()
        self.theirs.send(b"m")
        assert self.read.wait(10)


def test_a_connection_registered_during_a_turn_is_the_loops_until_the_next_claim(
    loop: IOLoop,
) -> None:
    first = Peer(loop)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        turn = loop.claim(fd)
        assert turn is not None
        later = Peer(loop)  # not among the turn's connections: the loop reads it meanwhile
        assert later.exchange() == LOOP_THREAD
        # A claim now takes both; the loop reads neither until they are given back.
        again = loop.claim(fd)
        assert again is turn
        marker = Marker(loop)
        first.theirs.send(b"x")
        later.theirs.send(b"x")
        marker.pass_through()
        assert (first.readers, later.readers) == ([], [LOOP_THREAD])
        both = loop.wait_reading(lambda: len(later.readers) == 2, fd, 10, turn=turn)
        assert both is True
        me = threading.current_thread().name
        assert (first.readers, later.readers) == ([me], [LOOP_THREAD, me])
        assert {first.exchange(), later.exchange()} == {LOOP_THREAD}
    finally:
        os.close(fd)


def test_a_connection_unregistered_during_a_turn_is_not_given_back(loop: IOLoop) -> None:
    peer = Peer(loop)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        turn = loop.claim(fd)
        assert turn is not None
        loop.unregister(peer.ours.fileno())
        loop.release(turn)
        peer.theirs.send(b"x")
        Marker(loop).pass_through()
        assert peer.readers == []  # nobody watches it any more
        # Not back in the epoll set behind the loop's back: it can be registered anew.
        loop.register(peer.ours.fileno(), peer._readable, stealable=True)
        assert peer._got.wait(10)
        assert peer.readers == [LOOP_THREAD]
    finally:
        os.close(fd)
