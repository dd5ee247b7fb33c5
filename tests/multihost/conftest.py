"""Multi-host fixtures: network namespaces as hosts, and the real Slurm test cluster.

``netns_cluster``: three namespaces on a bridge (see ``netns.py``), torn down after the test.
Skipped, with the reason, when not root or ``ip netns`` does not work. ``hosts_and_workers``: the
same with a worker daemon listening on each namespace's own address.

``slurm_cluster``: the Slurm cluster that ``scripts/slurm_cluster.sh start`` runs (CI starts it
in ``.ci/run``). Skipped, with the reason, when no controller answers or fewer than two nodes
are up, so a developer machine without Slurm still passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _worker_helpers import Failures, start_netns_workers  # noqa: E402
from netns import NetnsCluster, unavailable_reason  # noqa: E402

import regency.actor  # noqa: E402

_START_HINT = "start one with `sudo scripts/slurm_cluster.sh start`"


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> Failures:
    """Failures that reach the root are recorded here instead of ending the test run."""
    recorder = Failures()
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", recorder)
    return recorder


@pytest.fixture
def netns_cluster() -> Iterator[NetnsCluster]:
    """Three network namespaces ``rgy-h0..2`` on bridge ``rgy-br0`` (10.200.0.0/16)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(3) as cluster:
        yield cluster


@pytest.fixture
def hosts_and_workers(netns_cluster: NetnsCluster) -> Iterator[tuple[NetnsCluster, list[str]]]:
    """A worker daemon on each namespace host; their addresses; the job secret in the env."""
    secret = os.urandom(32)
    addresses = start_netns_workers(netns_cluster, secret)
    os.environ["REGENCY_JOB_SECRET"] = secret.hex()
    try:
        yield netns_cluster, addresses
    finally:
        del os.environ["REGENCY_JOB_SECRET"]


@dataclass(frozen=True)
class SlurmCluster:
    """What the tests know about the reachable Slurm cluster."""

    nodes: tuple[str, ...]
    partition: str


def _slurm_unavailable_reason() -> str | None:
    for tool in ("sbatch", "squeue", "scancel", "sinfo", "scontrol"):
        if shutil.which(tool) is None:
            return f"no Slurm cluster: `{tool}` is not installed ({_START_HINT})"
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    if not Path(conf).is_file():
        return f"no Slurm cluster: no configuration at {conf} ({_START_HINT})"
    try:
        ping = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return f"no Slurm cluster: `scontrol ping` timed out ({_START_HINT})"
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        detail = ((ping.stdout + ping.stderr).strip().splitlines() or ["no output"])[0]
        return f"no Slurm controller answers: {detail} ({_START_HINT})"
    return None


def _slurm_nodes() -> tuple[tuple[str, ...], str]:
    # -r: responding nodes only; %P: partition (the default one is starred).
    out = subprocess.run(
        ["sinfo", "-h", "-r", "-N", "-o", "%N %P %t"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    ).stdout
    nodes: list[str] = []
    partition = ""
    for line in out.splitlines():
        name, part, state = line.split()
        if part.endswith("*"):
            partition = part.rstrip("*")
        if state.rstrip("*~#") in ("idle", "mix", "alloc", "comp") and name not in nodes:
            nodes.append(name)
    return tuple(nodes), partition


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The running two-node Slurm cluster; skips the test when there is none."""
    reason = _slurm_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    nodes, partition = _slurm_nodes()
    if len(nodes) < 2:
        pytest.skip(f"Slurm cluster has {len(nodes)} node(s) up ({nodes}); tests need 2")
    return SlurmCluster(nodes=nodes, partition=partition)
