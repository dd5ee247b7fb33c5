"""``OpaqueRef`` / ``OpaqueObject`` (Monarch's): Python objects that live on the workers, named
from the controller, passed between remote functions."""

from __future__ import annotations

import pytest
import torch

import regency
from regency.actor import ProcMesh
from regency.tensor import OpaqueObject, OpaqueRef, fetch_shard, opaque_method, remote

pytestmark = pytest.mark.timeout(120)


class Accumulator:
    """A stateful worker-side object (what an opaque reference is for)."""

    def __init__(self, start: float) -> None:
        self.total = torch.full((2,), start)

    def add(self, t: torch.Tensor) -> torch.Tensor:
        self.total = self.total + t
        return self.total.clone()

    def count(self) -> int:
        return int(self.total[0].item())


@remote(propagate=lambda start: OpaqueRef(None))
def make_accumulator(start: torch.Tensor) -> OpaqueRef:
    return OpaqueRef(Accumulator(float(start)))


@remote(propagate=lambda ref, t: torch.empty(2))
def accumulate(ref: OpaqueRef, t: torch.Tensor) -> torch.Tensor:
    assert isinstance(ref, OpaqueRef)
    return ref.value.add(t)


class Tracked:
    """Counts its live instances in the worker process."""

    live = 0

    def __init__(self) -> None:
        Tracked.live += 1

    def __del__(self) -> None:
        Tracked.live -= 1


@remote(propagate=lambda: OpaqueRef(None))
def make_tracked() -> OpaqueRef:
    return OpaqueRef(Tracked())


@remote(propagate=lambda: torch.empty((), dtype=torch.int64))
def alive() -> torch.Tensor:
    return torch.tensor(Tracked.live)


def test_an_object_made_on_each_worker_keeps_its_state_across_calls(procs: ProcMesh) -> None:
    with procs.activate():
        ref = make_accumulator(procs.rank_tensor("gpus") * 10)
        assert isinstance(ref, OpaqueRef)
        accumulate(ref, torch.ones(2))
        second = accumulate(ref, torch.ones(2))
        got = [fetch_shard(second, gpus=g).result() for g in (0, 1)]
    assert torch.equal(got[0], torch.full((2,), 2.0))
    assert torch.equal(got[1], torch.full((2,), 12.0))


def test_the_controller_cannot_reach_the_value(procs: ProcMesh) -> None:
    with procs.activate():
        ref = make_accumulator(torch.zeros(()))
        with pytest.raises(RuntimeError, match="Client is attempting to access an OpaqueRef"):
            _ = ref.value
    with pytest.raises(RuntimeError, match="Client is attempting to create an OpaqueRef"):
        OpaqueRef(3)


class Wrapped(OpaqueObject):
    @opaque_method
    def add(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t)

    @opaque_method
    def count(self) -> None:
        return None


def test_opaque_object_methods_run_on_every_worker(procs: ProcMesh) -> None:
    with procs.activate():
        obj = Wrapped(f"{__name__}.Accumulator", 1.0)
        obj.add(torch.ones(2))
        out = obj.add(torch.ones(2) * (procs.rank_tensor("gpus") + 1))
        results = [fetch_shard(out, gpus=g).result() for g in (0, 1)]
        counted = obj.call_method_on_shard_and_fetch("count").result()
        same = Wrapped(obj)  # wrapping an existing reference makes nothing new
        again = fetch_shard(same.add(torch.zeros(2)), gpus=1).result()
    assert torch.equal(results[0], torch.full((2,), 3.0))
    assert torch.equal(results[1], torch.full((2,), 4.0))
    assert counted == 3
    assert torch.equal(again, torch.full((2,), 4.0))


def test_the_object_is_freed_with_the_controllers_reference(procs: ProcMesh) -> None:
    with procs.activate():
        ref = make_tracked()
        during = regency.inspect(alive())
        del ref  # its delete rides at the end of the next batch
        regency.inspect(alive())
        after = regency.inspect(alive())
    assert (int(during), int(after)) == (1, 0)
