"""regency.spmd's public surface, and the pure parts of the environment contract."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import regency.spmd
from regency.shape import Extent, Point
from regency.spmd._env import check_master, elastic_env

EXPORTED = [
    "SPMDActor",
    "ScriptExit",
    "host_mesh_from_store",
    "TORCH_PRELOAD",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
]


def test_exported_names() -> None:
    assert sorted(regency.spmd.__all__) == sorted(EXPORTED)


@pytest.mark.parametrize("name", [n for n in EXPORTED if n != "TORCH_PRELOAD"])
def test_public_names_claim_the_public_module_and_are_documented(name: str) -> None:
    obj = getattr(regency.spmd, name)
    assert obj.__module__ == "regency.spmd"
    assert inspect.getdoc(obj)


def test_spmd_actor_has_monarchs_endpoints() -> None:
    sig = regency.spmd.SPMDActor.main.signature  # an endpoint property keeps it
    assert list(sig.parameters) == ["self", "master_addr", "master_port", "argv"]
    for name in ("get_host_port", "setup_env", "main"):
        assert inspect.getdoc(getattr(regency.spmd.SPMDActor, name))


def test_importing_spmd_does_not_import_torch() -> None:
    code = "import sys, regency.spmd, regency.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_env_of_a_point() -> None:
    env = elastic_env(Point(5, Extent(["hosts", "gpus"], [2, 4])), "h0", 1234)
    assert env == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "8",
        "ROLE_NAME": "rank",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "1234",
    }
    lone = elastic_env(Point(0, Extent([], [])), "h0", 1)
    assert (lone["RANK"], lone["WORLD_SIZE"], lone["LOCAL_WORLD_SIZE"]) == ("0", "1", "1")


def test_partial_master_message_names_both() -> None:
    with pytest.raises(ValueError, match="give both master_addr and master_port, or neither"):
        check_master("h", None)
    with pytest.raises(ValueError, match="master_port=29500"):
        check_master(None, 29500)
    check_master(None, None)
    check_master("h", 1)
