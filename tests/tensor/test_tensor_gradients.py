"""``grad_generator`` / ``GradGenerator`` / ``grad_function`` / ``gradient_execution_order``
on mesh tensors: the gradients are computed on the workers, equal plain local autograd's, and
come out one by one as backward reaches them."""

from __future__ import annotations

import threading

import pytest
import torch

import regency
from regency._tensor import commands, engine, sites
from regency.actor import ProcMesh
from regency.gradient_generator import GradGenerator, gradient_execution_order
from regency.tensor import grad_function, grad_generator, no_mesh

pytestmark = pytest.mark.timeout(120)


def _leaves(rank_offset: torch.Tensor | float) -> list[torch.Tensor]:
    """x, w1, w2, b (made under the caller's mode: on the mesh or locally)."""
    x = (torch.arange(6.0).reshape(2, 3) / 5 + rank_offset).requires_grad_(True)
    w1 = (torch.arange(12.0).reshape(3, 4) / 7 - 0.5).requires_grad_(True)
    w2 = (torch.arange(8.0).reshape(4, 2) / 3 - 1).requires_grad_(True)
    b = torch.full((2,), 0.25, requires_grad=True)
    return [x, w1, w2, b]


def _loss(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((x @ w1).tanh() @ w2 + b).pow(2).sum()


def test_gradients_equal_local_autograd_on_every_rank(procs: ProcMesh) -> None:
    with procs.activate():
        leaves = _leaves(procs.rank_tensor("gpus").float())
        loss = _loss(*leaves)
        wanted = [leaves[3], leaves[2], leaves[1], leaves[0]]  # backward's order
        grads = list(grad_generator(loss, wanted))
    assert len(grads) == 4
    assert all(isinstance(g, regency.Tensor) for g in grads)
    for rank in range(2):
        local = _leaves(float(rank))
        expected = torch.autograd.grad(_loss(*local), [local[3], local[2], local[1], local[0]])
        got = regency.inspect(grads, gpus=rank)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)


def test_each_gradient_comes_before_backward_goes_on(procs: ProcMesh) -> None:
    reached: list[str] = []

    def traced(name: str):  # type: ignore[no-untyped-def]
        @grad_function
        def through(t: torch.Tensor):  # type: ignore[no-untyped-def]
            def backward(grad: torch.Tensor) -> torch.Tensor:
                reached.append(name)
                return grad

            return t.clone(), backward

        return through

    with procs.activate():
        w1 = torch.ones(3, requires_grad=True)
        w2 = torch.ones(3, requires_grad=True)
        h = traced("layer1")(w1 * 2)
        out = traced("layer2")(h * w2).sum()
        gen = grad_generator(out, [w2, w1])
        g2 = next(gen)
        assert reached == ["layer2"]  # layer1's backward is not issued yet
        early = g2 * 10  # issued between the two halves of backward
        g1 = next(gen)
        assert reached == ["layer2", "layer1"]
        assert list(gen) == []
    torch.testing.assert_close(regency.inspect(early, gpus=1), torch.full((3,), 20.0))
    torch.testing.assert_close(regency.inspect(g1, gpus=0), torch.full((3,), 2.0))


def test_unused_input_yields_none_and_edges_work(procs: ProcMesh) -> None:
    with procs.activate():
        a = torch.ones(2, requires_grad=True)
        unused = torch.ones(2, requires_grad=True)
        mid = a * 3
        loss = (mid * mid).sum()
        edge = torch.autograd.graph.get_gradient_edge(mid)
        grads = list(grad_generator([loss], [edge, unused, a]))
    assert grads[1] is None
    torch.testing.assert_close(regency.inspect(grads[0]), torch.full((2,), 6.0))
    torch.testing.assert_close(regency.inspect(grads[2]), torch.full((2,), 18.0))


def test_runs_on_the_roots_mesh_from_outside_it(procs: ProcMesh) -> None:
    with procs.activate():
        x = torch.rand(3, 4, requires_grad=True)
        y = torch.rand(4, 3, requires_grad=True)
        z = torch.rand(3, requires_grad=True)
        loss = (x @ y + z).sum()
    with no_mesh.activate():
        grads = list(grad_generator(loss, [z, y, x]))
    assert [tuple(g.shape) for g in grads] == [(3,), (4, 3), (3, 4)]
    torch.testing.assert_close(regency.inspect(grads[0], gpus=1), torch.full((3,), 3.0))


def test_grad_roots_and_local_tensors() -> None:
    t = torch.rand(3, requires_grad=True)
    u = torch.rand(3, requires_grad=True)
    out = t * u
    seed = torch.tensor([1.0, 2.0, 3.0])
    expected = torch.autograd.grad([out], [u, t], [seed], retain_graph=True)
    got = list(grad_generator([out], [u, t], [seed]))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_grad_generator_trees(procs: ProcMesh) -> None:
    with procs.activate():
        layer1 = {"w": torch.ones(3, requires_grad=True), "b": torch.zeros(3, requires_grad=True)}
        layer2 = (torch.full((3,), 2.0, requires_grad=True),)
        h = layer1["w"] * 5 + layer1["b"]
        loss = (h * layer2[0]).sum()
        gen = GradGenerator()
        gen.grad(layer1)
        gen.grad(layer2)
        gen.root(loss)
        first, second = list(gen)
    assert isinstance(first, tuple)  # the last group first
    assert set(second) == {"w", "b"}
    torch.testing.assert_close(regency.inspect(first[0]), torch.full((3,), 5.0))
    torch.testing.assert_close(regency.inspect(second["w"]), torch.full((3,), 10.0))
    torch.testing.assert_close(regency.inspect(second["b"]), torch.full((3,), 2.0))


def test_grad_function_moves_the_gradient_back(procs4: ProcMesh) -> None:
    @grad_function
    def moved(x: torch.Tensor, mesh: ProcMesh):  # type: ignore[no-untyped-def]
        home = x.mesh

        def backward(grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            return grad.to_mesh(home), None

        return x.to_mesh(mesh), backward

    host0, host1 = procs4.slice(hosts=0), procs4.slice(hosts=1)
    with host0.activate():
        x = torch.full((2, 3), 1.0, requires_grad=True)
        y = torch.full((3, 2), 2.0, requires_grad=True)
        t = moved(x @ y, host1)
    with host1.activate():
        z = torch.full((2,), 3.0, requires_grad=True)
        loss = ((t + z) ** 2).sum()
    gz, gy, gx = grad_generator(loss, [z, y, x])
    assert isinstance(gz, regency.Tensor)
    assert isinstance(gx, regency.Tensor)
    assert isinstance(gy, regency.Tensor)
    local_x = torch.full((2, 3), 1.0, requires_grad=True)
    local_y = torch.full((3, 2), 2.0, requires_grad=True)
    local_z = torch.full((2,), 3.0, requires_grad=True)
    expected = torch.autograd.grad(
        ((local_x @ local_y + local_z) ** 2).sum(), [local_z, local_y, local_x]
    )
    torch.testing.assert_close(regency.inspect(gz, gpus=1), expected[0])
    torch.testing.assert_close(regency.inspect(gy, gpus=1), expected[1])
    torch.testing.assert_close(regency.inspect(gx, gpus=0), expected[2])


def test_a_failing_backward_raises_from_next() -> None:
    @grad_function
    def broken(t: torch.Tensor):  # type: ignore[no-untyped-def]
        def backward(grad: torch.Tensor) -> torch.Tensor:
            raise ValueError("backward of broken")

        return t * 1, backward

    a = torch.ones(2, requires_grad=True)
    b = torch.ones(2, requires_grad=True)
    loss = (broken(a) * b).sum()
    gen = grad_generator(loss, [b, a])
    torch.testing.assert_close(next(gen), torch.ones(2))
    with pytest.raises(ValueError, match="backward of broken"):
        next(gen)


def test_closing_stops_backward_and_removes_its_hooks() -> None:
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(2, requires_grad=True)
    loss = (a * b * 2).sum()
    before = threading.active_count()
    gen = grad_generator(loss, [b, a])
    assert gen.__next__() is not None
    gen.close()
    with pytest.raises(StopIteration):
        next(gen)
    state = gen._state
    assert state.thread is not None
    state.thread.join(timeout=10)
    assert not state.thread.is_alive()
    assert threading.active_count() == before
    (a * b).sum().backward()  # no hook of the closed generator is left to fire
    torch.testing.assert_close(a.grad, torch.ones(2))


def test_gradient_execution_order() -> None:
    t = torch.rand(3, 3, requires_grad=True)
    w1, w2, w3 = (torch.rand(3, 3, requires_grad=True) for _ in range(3))
    a = (t @ w1).relu()
    a = (a @ w2).relu()
    last = (a @ w3).relu()
    loss = last.sum()
    assert gradient_execution_order([loss], [w2, w3, w1, last]) == [3, 1, 0, 2]


def test_bad_arguments() -> None:
    t = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="at least one root"):
        grad_generator([], [t])
    with pytest.raises(ValueError, match="grad_roots has 2 gradients for 1 roots"):
        grad_generator([t.sum()], [t], [None, None])
    with pytest.raises(TypeError, match="tensors or GradientEdges, not int"):
        grad_generator(t.sum(), [3])  # type: ignore[list-item]


def test_backwards_commands_name_the_grad_generator_call(procs: ProcMesh) -> None:
    with procs.activate():
        w = torch.ones(3, requires_grad=True)
        loss = (w * w).sum()
        root = engine.known_root(procs)
        assert root is not None
        root.flush()
        gen = grad_generator(loss, [w])  # the line backward's commands are attributed to
        next(gen)
        issued = [cmd for cmd in root.buffer if isinstance(cmd, commands.CallOp)]
    assert issued
    for cmd in issued:
        assert "gen = grad_generator(loss, [w])" in sites.describe(cmd.site)


def test_a_long_backward_sends_its_own_batches_in_order(procs: ProcMesh) -> None:
    def chain(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = w
        for i in range(200):  # backward issues more commands than one batch holds
            y = y * 1.001 + b * (i % 3)
        return y.sum()

    with procs.activate():
        w = torch.ones(3, requires_grad=True)
        b = torch.full((3,), 0.5, requires_grad=True)
        gen = grad_generator(chain(w, b), [b, w])
        gb = next(gen)
        gw = next(gen)
    local_w = torch.ones(3, requires_grad=True)
    local_b = torch.full((3,), 0.5, requires_grad=True)
    expected = torch.autograd.grad(chain(local_w, local_b), [local_b, local_w])
    torch.testing.assert_close(regency.inspect(gb, gpus=1), expected[0])
    torch.testing.assert_close(regency.inspect(gw, gpus=0), expected[1])
