"""Monarch's published SPMD example (``docs/source/examples/ddp/spmd_ddp.py``), as a ported
program uses it: the master from rank 0's ``get_host_port(None)``, found through the mesh's
``_labels``, then ``main`` with a DDP script on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from regency.actor import this_host
from regency.spmd import SPMDActor

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(180)

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "linear_ddp.py")


def test_the_monarch_spmd_example_trains_with_equal_parameters(tmp_path: Path) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        actors = procs.spawn("_SPMDActor", SPMDActor)
        first = dict.fromkeys(procs._labels, 0)
        assert first == {"gpus": 0}
        master_addr, master_port = actors.slice(**first).get_host_port.call_one(None).get(60)
        out = str(tmp_path / "params-{}.pt")
        actors.main.call(master_addr, master_port, [SCRIPT, out]).get(timeout=120)
    finally:
        procs.stop().get(timeout=60)
    rank0, rank1 = (torch.load(out.format(rank)) for rank in (0, 1))
    assert rank0.keys() == {"weight", "bias"}
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    torch.manual_seed(0)  # rank 0's initial parameters, which DDP broadcast to every rank
    initial = torch.nn.Linear(10, 1).state_dict()
    assert not torch.equal(rank0["weight"], initial["weight"]), "the parameters never moved"
