"""Factories, ops and fetch; shapes known with no round trip; batching; misuse errors."""

from __future__ import annotations

import gc

import pytest
import torch
from _tensor_helpers import flushes

import regency
from regency._tensor import commands as c
from regency._tensor import engine
from regency.actor import ProcMesh

pytestmark = pytest.mark.timeout(120)


def test_factories_ops_inspect_per_rank(procs: ProcMesh) -> None:
    with procs.activate():
        x = torch.rand(3, 4)
        y = (x @ torch.ones(4, 5)).relu()
    assert isinstance(y, regency.Tensor)
    assert y.shape == (3, 5)
    assert y.dtype == torch.float32
    x0, y0 = regency.inspect((x, y), gpus=0)
    x1, y1 = regency.inspect([x, y], gpus=1)
    assert isinstance(x0, torch.Tensor)
    assert not isinstance(x0, regency.Tensor)
    torch.testing.assert_close(y0, (x0 @ torch.ones(4, 5)).relu())
    torch.testing.assert_close(y1, (x1 @ torch.ones(4, 5)).relu())
    assert not torch.equal(x0, x1)  # each proc made its own random shard


def test_shapes_known_with_no_message_sent(procs: ProcMesh) -> None:
    with procs.activate():
        a = torch.zeros(2, 3)
    before = flushes(procs)
    b = (a + 1).t().unsqueeze(0) * 2  # outside activate: ops on mesh tensors stay remote
    assert b.shape == (1, 3, 2)
    assert b.stride() == torch.zeros(2, 3).t().unsqueeze(0).stride()
    assert flushes(procs) == before
    fut = regency.fetch_shard({"b": b, "n": 7}, gpus=1)
    assert flushes(procs) == before + 1
    got = fut.get(timeout=60)
    assert got["n"] == 7
    torch.testing.assert_close(got["b"], torch.full((1, 3, 2), 2.0))


def test_shape_error_raises_before_send(procs: ProcMesh) -> None:
    with procs.activate():
        a = torch.rand(3, 4)
        b = torch.rand(5, 6)
        before = flushes(procs)
        root = engine.known_root(procs)
        assert root is not None
        pending = len(root.buffer)
        with pytest.raises(RuntimeError, match="must have same reduction dim"):
            a @ b
        assert len(root.buffer) == pending
        assert flushes(procs) == before


def test_data_dependent_calls_name_the_fix(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(2).sum()
        with pytest.raises(regency.DataDependentError, match=r"\.item\(\).*regency\.inspect"):
            t.item()
        with pytest.raises(regency.DataDependentError, match="fetch_shard"):
            bool(t)
        with pytest.raises(regency.DataDependentError, match="tolist"):
            t.tolist()
        with pytest.raises(regency.DataDependentError, match="inspect"):
            torch.nonzero(torch.ones(3))


def test_fetch_coordinates(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(1)
    assert regency.inspect(t).shape == (1,)  # no coordinates: 0 on every dimension
    assert regency.inspect(5) == 5
    with pytest.raises(KeyError, match="hosts"):
        regency.fetch_shard(t, hosts=0)


def test_fetch_missing_dimension(procs4: ProcMesh) -> None:
    with procs4.activate():
        t = torch.ones(1)
    with pytest.raises(ValueError, match="missing"):
        regency.fetch_shard(t, gpus=1)
    assert regency.inspect(t, hosts=1, gpus=1).shape == (1,)


def test_local_tensor_is_a_type_error(procs: ProcMesh) -> None:
    local = torch.ones(3)
    with procs.activate():
        t = torch.ones(3)
        with pytest.raises(TypeError, match="LOCAL_TENSOR"):
            torch.add(t, local)
        # Through an operator, Python turns the TypeError into its own (as in Monarch).
        with pytest.raises(TypeError):
            t + local
        # 0-dim local tensors are values, as Python numbers are.
        assert (t * torch.tensor(2.0)).shape == (3,)
        # torch.tensor(data) inside activate() makes a mesh tensor from the data.
        c = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(regency.inspect(t + c), torch.tensor([2.0, 3.0, 4.0]))


def test_wrong_mesh_is_a_type_error(procs: ProcMesh, procs4: ProcMesh) -> None:
    with procs.activate():
        a = torch.ones(2)
    with procs4.activate():
        b = torch.ones(2)
    with pytest.raises(TypeError, match="WRONG_MESH"):
        torch.add(a, b)


def test_dropped_is_a_type_error(procs: ProcMesh) -> None:
    with procs.activate():
        a = torch.ones(2)
        assert not a.dropped
        a.drop()
        a.drop()  # idempotent, as Monarch's
        assert a.dropped
        with pytest.raises(TypeError, match="DROPPED"):
            torch.add(a, 1)
    with pytest.raises(TypeError, match="DROPPED"):
        regency.fetch_shard(a)


def test_drop_drops_every_alias(procs: ProcMesh) -> None:
    with procs.activate():
        base = torch.ones(4)
        head, tail = base[:2], base[2:]
        other = torch.ones(4)
        tail.drop()  # as Monarch's drop: the views of its storage and what they view
        for gone in (base, head, tail):
            with pytest.raises(TypeError, match="DROPPED"):
                torch.add(gone, 1)
        assert regency.inspect(other + 1).tolist() == [2.0] * 4


def _ref_counts(mesh: ProcMesh) -> list[int]:
    root = engine.known_root(mesh)
    assert root is not None
    root.flush_all()
    return [v for _, v in root.workers.ref_count.call().get(timeout=60).items()]


def test_garbage_collected_refs_are_deleted_in_one_batch(procs: ProcMesh) -> None:
    with procs.activate():
        keep = torch.zeros(1)
    gc.collect()
    start = _ref_counts(procs)
    with procs.activate():
        many = [torch.ones(2) for _ in range(50)]
    assert [n - s for n, s in zip(_ref_counts(procs), start, strict=True)] == [50, 50]
    before = flushes(procs)
    del many
    gc.collect()
    root = engine.known_root(procs)
    assert root is not None
    assert sum(len(v) for v in root.deletes.values()) == 50
    assert flushes(procs) == before  # nothing sent for the deletes alone
    assert _ref_counts(procs) == start
    assert flushes(procs) == before + 1  # one message carried all 50 deletes
    assert regency.inspect(keep).shape == (1,)


def test_a_big_tensor_freed_by_the_next_op_is_deleted_before_it(procs: ProcMesh) -> None:
    """``y = f(x)`` in a loop: the old ``y``'s delete goes before the op making the new one
    (so the worker can reuse its memory), unless that op reads it."""
    root = engine.View(procs).root
    with procs.activate(), regency.coalescing():
        x = torch.ones(engine.BIG_DELETE)
        y = x * 2
        old = y._ref
        y = x * 3  # frees the old y
        last, before = root.buffer[-1], root.buffer[-2]
        assert isinstance(before, c.Delete)
        assert old in before.refs  # with whatever deletes were pending for these procs
        assert isinstance(last, c.CallOp)
        assert last.outs == (y._ref,)
        old = y._ref
        y = y + 1  # reads the old y: its delete must come after
        assert isinstance(root.buffer[-1], c.Delete)
        assert old in root.buffer[-1].refs
    assert regency.inspect(y[:2], gpus=1).tolist() == [4.0, 4.0]


def test_coalescing_sends_one_message(procs: ProcMesh) -> None:
    with procs.activate():
        before = flushes(procs)
        with regency.coalescing():
            t = torch.zeros(4)
            for _ in range(3 * engine.FLUSH_AT):
                t = t + 1
        assert flushes(procs) == before + 1
    torch.testing.assert_close(regency.inspect(t), torch.full((4,), 3.0 * engine.FLUSH_AT))


def test_buffer_flushes_at_its_size_limit(procs: ProcMesh) -> None:
    with procs.activate():
        before = flushes(procs)
        t = torch.zeros(1)
        for _ in range(engine.FLUSH_AT * 2):
            t = t + 1
        assert flushes(procs) - before >= 2


def test_active_mesh_and_no_mesh(procs: ProcMesh) -> None:
    with pytest.raises(ValueError, match="no device mesh is active"):
        regency.get_active_mesh()
    with procs.activate():
        assert regency.get_active_mesh() is procs
        x = torch.ones(3)
        with regency.no_mesh.activate():
            local = torch.ones(2) * 3
            with pytest.raises(ValueError, match="no device mesh is active"):
                regency.get_active_mesh()
        assert not isinstance(local, regency.Tensor)
        assert regency.get_active_mesh() is procs
    with pytest.raises(ValueError, match="no device mesh is active"):
        regency.get_active_mesh()
    later = x * 5  # a mesh tensor's ops run on its mesh outside the block too
    assert isinstance(later, regency.Tensor)
    assert later.mesh is procs
    torch.testing.assert_close(regency.inspect(later, gpus=1), torch.full((3,), 5.0))


def test_spawn_tensor_engine_is_a_device_mesh_with_exit(procs: ProcMesh) -> None:
    from regency.mesh_controller import RemoteException, spawn_tensor_engine

    dm = spawn_tensor_engine(procs)
    with dm.activate():
        assert regency.get_active_mesh() is dm
        x = torch.zeros(3) + dm.rank("gpus")
    assert x.mesh is dm
    torch.testing.assert_close(regency.inspect(x, gpus=1), torch.ones(3))
    with dm.flatten("all").activate():
        flat = regency.inspect(2 * torch.ones(2), all=1)
    torch.testing.assert_close(flat, torch.full((2,), 2.0))
    bad = regency.remote(_refuse, propagate=lambda t: t)
    with pytest.raises(RemoteException, match="refused"), dm.activate():
        regency.inspect(bad(torch.zeros(2)))
    dm.exit()
    dm.exit()  # idempotent
    with pytest.raises(RuntimeError, match="device mesh was exited"):
        dm.activate()
    assert regency.inspect(procs.rank_tensor("gpus"), gpus=1).item() == 1  # the procs go on


def _refuse(t: torch.Tensor) -> torch.Tensor:
    raise ValueError("refused")
