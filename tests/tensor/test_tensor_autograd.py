"""Autograd on the controller: nn.Module, loss.backward() and torch.optim on mesh tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import regency
from regency.actor import ProcMesh

pytestmark = pytest.mark.timeout(120)


def test_linear_sgd_step_exact_per_rank(procs: ProcMesh) -> None:
    with procs.activate():
        model = nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.rand(8, 4)
        target = torch.rand(8, 3)
        w0 = model.weight.detach().clone()
        b0 = model.bias.detach().clone()
        loss = ((model(x) - target) ** 2).mean()
        loss.backward()
        grads = (model.weight.grad, model.bias.grad)
        opt.step()
    assert isinstance(model.weight, nn.Parameter)
    assert model.weight.grad is not None
    assert model.weight.grad.shape == (3, 4)
    for rank in range(2):
        got = regency.inspect(
            {
                "x": x,
                "t": target,
                "w0": w0,
                "b0": b0,
                "loss": loss,
                "g": grads,
                "w": model.weight,
                "b": model.bias,
            },
            gpus=rank,
        )
        local = nn.Linear(4, 3)
        with torch.no_grad():
            local.weight.copy_(got["w0"])
            local.bias.copy_(got["b0"])
        local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
        local_loss = ((local(got["x"]) - got["t"]) ** 2).mean()
        local_loss.backward()
        torch.testing.assert_close(got["g"][0], local.weight.grad, rtol=0, atol=0)
        torch.testing.assert_close(got["g"][1], local.bias.grad, rtol=0, atol=0)
        local_opt.step()
        torch.testing.assert_close(got["loss"], local_loss.detach(), rtol=0, atol=0)
        torch.testing.assert_close(got["w"], local.weight.detach(), rtol=0, atol=0)
        torch.testing.assert_close(got["b"], local.bias.detach(), rtol=0, atol=0)


def test_parameter_of_a_mesh_tensor(procs: ProcMesh) -> None:
    with procs.activate():
        p = nn.Parameter(torch.ones(2, 2))
        (p * 3).sum().backward()
    assert isinstance(p, regency.Tensor)
    assert p.requires_grad
    torch.testing.assert_close(regency.inspect(p.grad, gpus=1), torch.full((2, 2), 3.0))


def test_requires_grad_propagates_on_the_controller(procs: ProcMesh) -> None:
    with procs.activate():
        a = torch.rand(3, requires_grad=True)
        b = (a * 2).exp()
        c = b.detach()
    assert b.requires_grad
    assert b.grad_fn is not None
    assert not c.requires_grad
