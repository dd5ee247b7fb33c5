"""Waiting until a process's native (non-Python) threads are all blocked.

torch 2.13's gloo backend can deadlock when a script's last reference to a process group (a
``DistributedDataParallel`` module holds one) is dropped: the group's destructor joins its worker
threads while holding the GIL, and a worker that has just finished a collective launched during
``backward()`` needs the GIL once more to free a Python object captured with it. A torchrun script
exits before this matters; a proc lives on and frees the script's objects. Waiting, with the GIL
released, until every native thread is blocked and stays blocked lets such a worker finish first.
"""

from __future__ import annotations

import os
import threading
import time

_TASKS = "/proc/self/task"


def wait_for_native_threads_to_settle(timeout: float = 2.0, interval: float = 0.01) -> bool:
    """Sleep until every native thread is blocked on something other than the GIL.

    Two samples ``interval`` apart, with the GIL released in between: a thread has settled when it
    sleeps in both and either waits in the kernel on something other than a futex (an event
    loop's ``epoll_wait`` that wakes on a timer is fine) or was not scheduled in between (its
    context-switch counts did not move), since the GIL, which this thread does not hold while it
    sleeps, is waited for on a futex. Returns ``False`` if ``timeout`` passed first and ``True`` at
    once where ``/proc`` is absent.
    """
    if not os.path.isdir(_TASKS):
        return True
    deadline = time.monotonic() + timeout
    previous: dict[int, _Activity] = {}
    while True:
        current = _native_thread_activity()
        if all(_settled(tid, activity, previous) for tid, activity in current.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        previous = current
        time.sleep(interval)


_Activity = tuple[str, str, str]
"""A thread's scheduler state, the kernel function it waits in, and its context-switch counts."""


def _settled(tid: int, activity: _Activity, previous: dict[int, _Activity]) -> bool:
    state, waits_in, _ = activity
    before = previous.get(tid)
    if state not in "SD" or before is None or before[0] not in "SD":
        return False
    return "futex" not in waits_in or before == activity


def _native_thread_activity() -> dict[int, _Activity]:
    """For each thread not started by Python: what ``_Activity`` holds."""
    python_threads = {t.native_id for t in threading.enumerate()}
    activity: dict[int, _Activity] = {}
    for name in os.listdir(_TASKS):
        tid = int(name)
        if tid in python_threads:
            continue
        try:
            with open(f"{_TASKS}/{name}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(f"{_TASKS}/{name}/status") as f:
                switches = "".join(line for line in f if "ctxt_switches" in line)
        except (OSError, IndexError):  # the thread ended between listing and reading
            continue
        try:
            with open(f"{_TASKS}/{name}/wchan") as f:
                waits_in = f.read()
        except OSError:  # hidden: count it as a futex, so only unchanged counts settle it
            waits_in = "futex"
        activity[tid] = (state, waits_in, switches)
    return activity
