"""Fault-tolerant DDP (examples/ddp_train.py): SIGKILL a rank mid-run; supervision sees it, the
one_for_all policy restarts the gang, training resumes from the checkpoint and ends with the
same parameters, bit for bit, as a run nobody disturbed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_killed_rank_recovers_from_checkpoint_with_identical_parameters(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    settings = ["--epochs", "2", "--samples", "256", "--batch", "16", "--ckpt-every", "4"]

    calm = example.parse([*settings, "--checkpoint", str(tmp_path / "a.pt")])
    calm.out = str(tmp_path / "calm.pt")
    assert example.run_fault_tolerant(calm) == {}  # no kill: no timeline

    lines: list[str] = []
    hurt = example.parse(
        [*settings, "--checkpoint", str(tmp_path / "b.pt"), "--step-delay", "0.05"]
    )
    hurt.out = str(tmp_path / "hurt.pt")
    timeline = example.run_fault_tolerant(hurt, kill_at=4, log=lines.append)
    print("\n".join(lines))

    # Supervision saw the kill and the new gang was up within a second.
    assert timeline["detected"] <= 1.0, timeline
    assert timeline["restarted"] <= 1.0, timeline
    assert timeline["detected"] <= timeline["restarted"] <= timeline["training"], timeline
    # The survivor's old actor ended at once (main destroyed its process group, so its
    # collective failed with the dead peer), not after cleanup_timeout.
    assert "still busy" not in capfd.readouterr().err
    assert any("SIGKILL rank 1" in line for line in lines)
    assert any("one_for_all" in line for line in lines)

    a = torch.load(calm.out, weights_only=True)
    b = torch.load(hurt.out, weights_only=True)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
