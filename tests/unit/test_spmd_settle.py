"""The wait for native threads to settle before a finished script's objects are freed."""

from __future__ import annotations

import os
import threading
import time

import pytest

from regency.spmd import _settle

pytestmark = pytest.mark.timeout(30)

IDLE = ("S", "futex_wait_queue\n", "voluntary_ctxt_switches: 3\n")


def test_a_thread_blocked_on_a_futex_settles_only_when_not_scheduled_between_samples() -> None:
    assert _settle._settled(1, IDLE, {1: IDLE})
    woke = ("S", IDLE[1], "voluntary_ctxt_switches: 4\n")  # a GIL waiter wakes every 5 ms
    assert not _settle._settled(1, woke, {1: IDLE})


def test_a_thread_in_an_event_loop_settles_although_its_timer_wakes_it() -> None:
    before = ("S", "do_epoll_wait", "voluntary_ctxt_switches: 3\n")
    after = ("S", "do_epoll_wait", "voluntary_ctxt_switches: 9\n")
    assert _settle._settled(1, after, {1: before})


def test_a_running_or_new_thread_has_not_settled() -> None:
    assert not _settle._settled(1, ("R", "0", IDLE[2]), {1: ("R", "0", IDLE[2])})
    assert not _settle._settled(1, IDLE, {})


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_python_threads_are_not_waited_for() -> None:
    stop = threading.Event()
    busy = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)], daemon=True)
    busy.start()
    try:
        start = time.monotonic()
        assert _settle.wait_for_native_threads_to_settle(timeout=5)
        assert time.monotonic() - start < 2
    finally:
        stop.set()
        busy.join()


class _ScriptObjects:
    """Stands in for a finished script's globals."""


def test_a_scripts_objects_are_kept_when_the_threads_did_not_settle() -> None:
    import gc
    import weakref

    from regency.spmd import _script

    unsettled, settled = _ScriptObjects(), _ScriptObjects()
    kept, freed = weakref.ref(unsettled), weakref.ref(settled)
    _script.keep_if_unsettled(False, unsettled)
    _script.keep_if_unsettled(True, settled)
    del unsettled, settled
    gc.collect()
    try:
        assert kept() is not None  # freeing it could have deadlocked in gloo's destructor
        assert freed() is None
    finally:
        _script._KEPT.clear()
