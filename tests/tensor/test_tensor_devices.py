"""``CUDA_VISIBLE_DEVICES`` per tensor worker process (issue 15 part 5): how a host's GPUs are
shared out (pure logic, any device count), and what the workers of a real mesh see."""

from __future__ import annotations

import os

import pytest
import torch

import regency
from regency._tensor import devices
from regency._tensor.devices import assign_device, visible_devices
from regency.actor import ProcMesh

pytestmark = pytest.mark.timeout(120)

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize(
    ("inherited", "count", "procs", "expected"),
    [
        (None, 0, 2, [None, None]),  # no GPU: the variable is left alone
        (None, 4, 4, ["0", "1", "2", "3"]),  # one each (Monarch's case)
        (None, 8, 2, ["0,1,2,3", "4,5,6,7"]),  # an equal block each
        (None, 2, 4, ["0", "1", "0", "1"]),  # fewer GPUs than procs: shared round robin
        (None, 3, 2, ["0", "1"]),  # not a multiple: one each, round robin
        ("3,5", 2, 2, ["3", "5"]),  # the devices the proc was started with
        ("GPU-aa,GPU-bb", 2, 1, ["GPU-aa,GPU-bb"]),  # uuids, one proc: all of them
        ("0,1,9", 2, 2, ["0", "1"]),  # CUDA stops at the first entry naming no device
        ("", 0, 2, [None, None]),  # started with none visible
    ],
)
def test_a_hosts_gpus_are_shared_out_by_local_rank(
    inherited: str | None, count: int, procs: int, expected: list[str | None]
) -> None:
    assert [visible_devices(inherited, count, r, procs) for r in range(procs)] == expected


def test_a_local_rank_outside_the_host_is_refused() -> None:
    with pytest.raises(ValueError, match="local rank 2 is not below the host's 2"):
        visible_devices(None, 2, 2, 2)


@pytest.mark.skipif(GPUS > 0, reason="checks a machine without GPUs")
def test_without_gpus_the_variable_is_left_unset(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "_assigned", [])  # as in a fresh proc
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    assert assign_device(env) is None
    assert "CUDA_VISIBLE_DEVICES" not in env
    seen = regency.remote(_visible, propagate="inspect")
    with procs.activate():
        got = seen.call().get(timeout=60)
    assert sorted(got.values()) == [("0", None), ("1", None)]


def _visible() -> tuple[str, str | None]:
    return os.environ["LOCAL_RANK"], os.environ.get("CUDA_VISIBLE_DEVICES")


def _device_of_cuda_tensor() -> tuple[str | None, int, str]:
    t = torch.ones(1, device="cuda")
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), str(t.device)


@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs (this machine has {GPUS})")
def test_each_proc_sees_its_own_gpu(make_procs) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(2)
    with mesh.activate():
        t = torch.ones(2, device="cuda") * (mesh.rank_tensor("gpus") + 1)
        got = regency.remote(_device_of_cuda_tensor, propagate="inspect").call().get(timeout=60)
        total = t.reduce("gpus", "sum")  # NCCL
    assert sorted(got.values()) == [("0", 1, "cuda:0"), ("1", 1, "cuda:0")]
    assert regency.inspect(total, gpus=1).tolist() == [3.0, 3.0]


def _sum_on_device(t: torch.Tensor) -> tuple[str, float]:
    return str(t.device), float(t.sum())


@pytest.mark.skipif(GPUS < 1, reason=f"needs a CUDA GPU (this machine has {GPUS})")
def test_one_gpu_runs_ops_a_reduce_and_an_endpoint(make_procs) -> None:  # type: ignore[no-untyped-def]
    """A one-proc mesh on one GPU: ops run on the device, a reduce goes through NCCL (a world of
    one), a fetch comes back as the values computed on the CPU, and an endpoint gets the shard
    as a CUDA tensor."""
    mesh = make_procs(1)
    with mesh.activate():
        x = torch.arange(12.0, device="cuda").reshape(3, 4)
        y = (x @ torch.ones(4, 5, device="cuda")).relu() * 2
        total = y.reduce("gpus", "sum")
        seen = regency.remote(_sum_on_device, propagate="inspect").call(y).get(timeout=60)
    expected = (torch.arange(12.0).reshape(3, 4) @ torch.ones(4, 5)).relu() * 2
    assert torch.equal(regency.inspect(total, gpus=0).cpu(), expected)
    assert list(seen.values()) == [("cuda:0", float(expected.sum()))]
