"""``regency.show`` (Monarch's ``monarch.show``): one shard fetched and handed to torchshow."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import regency
from regency.actor import ProcMesh
from regency.tensor import show

pytestmark = pytest.mark.timeout(120)


def test_show_hands_the_fetched_shard_to_torchshow(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[object] = []

    def fake_show(value: object) -> str:
        # torchshow runs locally: torch ops on the value here are not sent to the workers
        assert isinstance(value, torch.Tensor)
        shown.append(value + 0)
        return "figure"

    monkeypatch.setitem(sys.modules, "torchshow", types.SimpleNamespace(show=fake_show))
    with procs.activate():
        t = torch.ones(2, 3) * (procs.rank_tensor("gpus") + 1)
        assert show(t, gpus=1) == "figure"
        assert regency.show(t, {"gpus": 0}) == "figure"
    assert torch.equal(shown[0], torch.full((2, 3), 2.0))  # type: ignore[arg-type]
    assert torch.equal(shown[1], torch.full((2, 3), 1.0))  # type: ignore[arg-type]


def test_show_without_torchshow_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchshow", None)  # an import of it raises ImportError
    with pytest.raises(ImportError, match=r"pip install torchshow \(or regency\[show\]\)"):
        show(torch.ones(1))  # refused before anything is fetched
