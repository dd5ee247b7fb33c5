"""``regency.job.spmd``: reading torchrun commands and ``serve``'s checks (no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from regency.job import LocalJob
from regency.job._spmd import _from_appdef
from regency.job.spmd import TorchrunCommand, parse_torchrun, serve

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["torchrun", "--nnodes=1", "--nproc-per-node=8", "-m", "train", "--lr", "0.001"],
            TorchrunCommand(["-m", "train", "--lr", "0.001"], 8, 1),
        ),
        (
            ["python", "-m", "torch.distributed.run", "--nproc_per_node", "4", "train.py", "a"],
            TorchrunCommand(["train.py", "a"], 4, 1),
        ),
        (
            ["python3", "-m", "torchrun", "--standalone", "train.py", "--nproc-per-node=9"],
            TorchrunCommand(["train.py", "--nproc-per-node=9"], 1, 1),
        ),
        (["python3", "train.py", "--x"], TorchrunCommand(["train.py", "--x"], 1, 1)),
        (
            ["/opt/venv/bin/torchrun", "--nnodes=2:2", "--max-restarts=3", "t.py"],
            TorchrunCommand(["t.py"], 1, 2),
        ),
    ],
)
def test_torchrun_commands(command: list[str], expected: TorchrunCommand) -> None:
    assert parse_torchrun(command) == expected


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ([], "command cannot be empty"),
        (["bash", "train.sh"], "Expected args to start with torchrun"),
        (["torchrun", "--nnodes=1:4", "t.py"], "elastic node ranges are not supported"),
        (["torchrun", "--nnodes=two", "t.py"], "--nnodes=two is not a number of nodes"),
        (["torchrun", "--nproc-per-node=0", "t.py"], "--nproc-per-node=0 must be at least 1"),
        (["torchrun", "--nproc-per-node=2"], "names no training script"),
    ],
)
def test_bad_torchrun_commands_are_named(command: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_torchrun(command)


def test_nproc_that_is_no_number_warns_and_means_one() -> None:
    with pytest.warns(UserWarning, match="--nproc-per-node=gpu is not an integer"):
        assert parse_torchrun(["torchrun", "--nproc-per-node=gpu", "t.py"]).nproc_per_node == 1


def test_appdef_role_becomes_a_torchrun_command_with_its_replicas() -> None:
    role = SimpleNamespace(
        entrypoint="workspace/entrypoint.sh",
        args=["torchrun", "--nproc-per-node=4", "-m", "train"],
        num_replicas=2,
    )
    command = _from_appdef(SimpleNamespace(roles=[role]))
    assert command == ["torchrun", "--nnodes=2", "--nproc-per-node=4", "-m", "train"]
    assert parse_torchrun(command) == TorchrunCommand(["-m", "train"], 4, 2)
    with pytest.raises(ValueError, match="Multiple roles provided"):
        serve(SimpleNamespace(roles=[role, role]))
    with pytest.raises(ValueError, match="No roles provided"):
        serve(SimpleNamespace(roles=[]))


def test_serve_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="Multi-node torchrun commands are not supported"):
        serve(["torchrun", "--nnodes=2", "t.py"], scheduler="local_cwd")
    with pytest.raises(ValueError, match="unknown scheduler 'mast_conda'"):
        serve(["torchrun", "t.py"], scheduler="mast_conda")
    with pytest.raises(ValueError, match="scheduler_cfg applies to a scheduler name"):
        serve(["torchrun", "t.py"], scheduler=LocalJob(), scheduler_cfg={"x": 1})
