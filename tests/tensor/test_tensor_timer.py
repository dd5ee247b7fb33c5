"""``regency.timer`` (Monarch's ``monarch.timer``): sections timed on the workers, driven from
the controller as remote functions by import path."""

from __future__ import annotations

import time

import pytest
import torch

from regency.actor import ProcMesh
from regency.tensor import fetch_shard, remote
from regency.timer import ExecutionTimer, get_execution_timer_average_ms

pytestmark = pytest.mark.timeout(120)

timer_start = remote("regency.timer.execution_timer_start", propagate="inspect")
timer_stop = remote("regency.timer.execution_timer_stop", propagate="inspect")
average_ms = remote(
    "regency.timer.get_execution_timer_average_ms",
    propagate=lambda name="default": torch.tensor(0.0, dtype=torch.float64),
)
latest_ms = remote(
    "regency.timer.get_latest_timer_measurement",
    propagate=lambda name=None: torch.tensor(0.0, dtype=torch.float64),
)
summary = remote("regency.timer.get_execution_timer_summary")


@remote(propagate="inspect")
def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_sections_are_timed_on_every_worker_in_order_with_the_ops(procs: ProcMesh) -> None:
    with procs.activate():
        for _ in range(3):
            timer_start("nap")
            _sleep(0.02)
            timer_stop("nap")
        timer_start()
        timer_stop()
        mean = [fetch_shard(average_ms("nap"), gpus=g).result() for g in (0, 1)]
        last = fetch_shard(latest_ms()).result()
        table = summary.call().get()
    assert all(m.dtype == torch.float64 and 20.0 <= float(m) < 2000.0 for m in mean)
    assert 0.0 <= float(last) < 20.0  # the empty default section
    for stats in table.values():
        assert stats["nap"]["count"] == 3
        assert stats["nap"]["min_ms"] >= 20.0
        assert stats["default"]["count"] == 1


def test_the_timer_runs_locally_and_refuses_a_stop_without_start() -> None:
    ExecutionTimer.reset()
    with ExecutionTimer.time("block", use_cpu=True):
        time.sleep(0.01)
    assert float(get_execution_timer_average_ms("block")) >= 10.0
    with pytest.raises(RuntimeError, match="no timer section 'other' was started"):
        ExecutionTimer.stop("other", use_cpu=True)
    with pytest.raises(KeyError, match="'missing' has no measurement"):
        get_execution_timer_average_ms("missing")
    ExecutionTimer.reset()
    assert ExecutionTimer.summary() == {}


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 1, reason=f"needs a CUDA GPU (this machine has {GPUS})")
def test_cuda_sections_are_timed_with_events(procs: ProcMesh) -> None:
    with procs.activate():
        a = torch.rand(2000, 2000, device="cuda")
        timer_start("cuda_mm")
        for _ in range(10):
            a = a @ a / 2000.0
        timer_stop("cuda_mm")
        table = summary.call().get()
    for stats in table.values():
        assert stats["cuda_mm"]["count"] == 1
        assert stats["cuda_mm"]["mean_ms"] > 0.0
