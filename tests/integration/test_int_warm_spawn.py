"""Procs forked from the warm zygote start with the runtime already imported (issue 17,
target 5): a proc's own CPU time until its actor runs stays a few milliseconds. After the
runtime moved into layer folders the zygote imported only the bootstrap module, and every proc
imported the rest itself after the fork (~160 ms of CPU each on the loaded 2-core machine:
8 procs took 2-3 s to answer instead of 0.1 s)."""

from __future__ import annotations

import os
import time

import pytest

from regency.actor import Actor, endpoint, this_host

pytestmark = pytest.mark.timeout(120)

T = 60.0
# A warm fork spends ~8 ms of CPU until its actor runs; importing the runtime took 70-200 ms.
CPU_BUDGET_S = 0.04


def test_procs_forked_from_the_zygote_import_nothing_heavy_after_the_fork() -> None:
    class Started(Actor):  # defined here, so it travels by value: no test module to import
        def __init__(self) -> None:
            self.cpu_at_start = time.process_time()  # all threads, since the fork

        @endpoint
        def report(self) -> tuple[int, float]:
            return os.getppid(), self.cpu_at_start

    this_host().spawn_procs(per_host={"gpus": 1}).stop().get(timeout=T)  # the zygote is up
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        reports = list(procs.spawn("started", Started).report.call().get(timeout=T).values())
    finally:
        procs.stop().get(timeout=T)
    parents = {parent for parent, _ in reports}
    assert os.getpid() not in parents, "the procs were started cold, not forked from the zygote"
    assert len(parents) == 1, f"forked by more than one process: {parents}"
    spent = sorted(cpu for _, cpu in reports)
    assert spent[-1] < CPU_BUDGET_S, f"procs spent {spent} s of CPU before their actor ran"
