"""Remote functions: by import path, module function, closure; the three propagate kinds."""

from __future__ import annotations

import pytest
import torch

import regency
from regency._tensor.remote import Remote
from regency.actor import ProcMesh

pytestmark = pytest.mark.timeout(120)


def double_and_count(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    return t * 2, 7


@regency.remote(propagate=lambda t: t.sum(0))
def column_sums(t: torch.Tensor) -> torch.Tensor:
    return t.sum(0)


def test_by_import_path_with_a_propagator(procs: ProcMesh) -> None:
    relu = regency.remote("torch.nn.functional.relu", propagate=lambda t: t)
    with procs.activate():
        t = torch.arange(-2.0, 2.0)
        r = relu(t)
    assert r.shape == (4,)
    torch.testing.assert_close(regency.inspect(r, gpus=1), torch.tensor([0.0, 0.0, 0.0, 1.0]))


def test_module_function_decorated(procs: ProcMesh) -> None:
    with procs.activate():
        s = column_sums(torch.ones(3, 2))
    assert s.shape == (2,)
    torch.testing.assert_close(regency.inspect(s), torch.full((2,), 3.0))


def test_closure_with_cached_propagation(procs: ProcMesh) -> None:
    offset = 10.0

    def shifted(t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": t + offset, "z": t[:1]}

    fn = regency.remote(shifted)
    assert isinstance(fn, Remote)
    with procs.activate():
        x = torch.zeros(3)
        out = fn(x)
        again = fn(torch.ones(3))  # same input metadata: the cached pattern, no probe
    assert out["y"].shape == (3,)
    assert out["z"].shape == (1,)
    assert len(fn._cache) == 1
    got = regency.inspect(again, gpus=1)
    torch.testing.assert_close(got["y"], torch.full((3,), 11.0))


def test_non_tensor_results_pass_through_cached_propagation(procs: ProcMesh) -> None:
    fn = regency.remote(double_and_count)
    with procs.activate():
        t, n = fn(torch.ones(2))
    assert n == 7
    torch.testing.assert_close(regency.inspect(t), torch.full((2,), 2.0))


def test_inspect_propagation_has_no_results(procs: ProcMesh) -> None:
    fn = regency.remote("torch.manual_seed", propagate="inspect")
    with procs.activate():
        assert fn(3) is None


def test_call_and_call_one(procs: ProcMesh) -> None:
    fn = regency.remote(double_and_count)
    with procs.activate():
        t = torch.ones(2)
        values = fn.call(t).get(timeout=60)
        with pytest.raises(ValueError, match="call_one"):
            fn.call_one(t).get(timeout=60)
    results = list(values.values())
    assert len(results) == 2
    assert all(v[1] == 7 for v in results)
    with procs.slice(gpus=1).activate():
        t1 = torch.ones(1)
        one = fn.call_one(t1).get(timeout=60)
    torch.testing.assert_close(one[0], torch.full((1,), 2.0))


def test_call_on_shard_and_fetch(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(2)
        got = regency.call_on_shard_and_fetch(double_and_count, t, shard={"gpus": 1})
    value, n = got.get(timeout=60)
    assert n == 7
    torch.testing.assert_close(value, torch.full((2,), 2.0))


def seven() -> int:
    return 7


def test_adverbs_run_over_the_active_mesh(procs: ProcMesh) -> None:
    fn = regency.remote(double_and_count)
    with procs.activate():
        t = torch.ones(2) * (procs.rank_tensor("gpus") + 1)
        values = fn.call(t).get(timeout=60)
        shard1 = regency.call_on_shard_and_fetch(fn, t, shard={"gpus": 1}).get(timeout=60)
    assert [float(v[0].sum()) for v in values.values()] == [4.0, 8.0]
    torch.testing.assert_close(shard1[0], torch.full((2,), 4.0))
    with procs.slice(gpus=1).activate():  # a part of the tensor's mesh
        part = fn.call(t).get(timeout=60)
        one = fn.call_one(t).get(timeout=60)
    assert len(part) == 1
    torch.testing.assert_close(one[0], torch.full((2,), 4.0))


def test_remote_functions_need_an_active_mesh(procs: ProcMesh) -> None:
    fn = regency.remote(double_and_count)
    with procs.activate():
        t = torch.ones(2)
    needs = "requires an active proc_mesh"
    with pytest.raises(ValueError, match=needs):
        fn.call(t)
    with pytest.raises(ValueError, match=needs):
        fn.call_one(t)
    with pytest.raises(ValueError, match=needs):
        regency.call_on_shard_and_fetch(fn, t, shard={"gpus": 1})
    with pytest.raises(TypeError, match="active device mesh"):
        regency.remote(seven, propagate=lambda: torch.zeros(()))()
    with procs.activate(), regency.no_mesh.activate():
        with pytest.raises(ValueError, match=needs):
            regency.remote(seven).call()


def scale_(t: torch.Tensor, k: float) -> torch.Tensor:
    if k < 0:
        raise ValueError("no negative scales")
    return t.mul_(k)


scale_in_place = regency.remote(scale_, propagate=lambda t, k: t.mul_(k))


def test_a_function_that_writes_its_input(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(2)
        out = scale_in_place(t, 3.0)  # propagation writes t: the call is known to write t
        assert regency.inspect(t).tolist() == [3.0, 3.0]
        assert regency.inspect(out).tolist() == [3.0, 3.0]
        scale_in_place(t, -1.0)  # fails: t, which it was writing, is poisoned too
        with pytest.raises(regency.RemoteException, match="no negative scales"):
            regency.inspect(t, gpus=1)
        with pytest.raises(regency.RemoteException, match="no negative scales"):
            regency.inspect(t, gpus=0)
