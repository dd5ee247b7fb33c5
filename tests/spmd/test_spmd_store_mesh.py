"""host_mesh_from_store: a host mesh built by every rank of a torchrun-style job through a
torch.distributed store (what Monarch offers only as a private name, and weight-sync stores
such as torchstore call)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from regency.actor import context
from regency.spmd import host_mesh_from_store

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).parent / "scripts" / "store_mesh.py"


def _free_port() -> int:
    """A port nothing is bound to now, below the kernel's ephemeral range: a port the kernel
    hands out (bind to 0) can be taken by any outgoing connection before the store binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 10000), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _running(marker: str) -> list[int]:
    """The pids of live processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _run_job(world: int, local_world: int, transport: str) -> tuple[list[str], str]:
    name = f"store_mesh_{uuid.uuid4().hex[:8]}"
    port = _free_port()
    args = [str(world), str(local_world), str(port), transport, name]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(rank), *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    try:
        outs = [rank.communicate(timeout=260)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert [rank.returncode for rank in ranks] == [0] * world, outs
    return outs, name


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_every_rank_calls_it_and_rank_0_gets_one_host_per_node(transport: str) -> None:
    outs, name = _run_job(world=4, local_world=2, transport=transport)
    found = json.loads(outs[0].strip().splitlines()[-1])
    assert found["extent"] == {"hosts": 2}
    pids = found["where"]
    assert len(set(pids)) == 2
    # The other ranks called the same actors, handed over through the store.
    assert [out.strip() for out in outs[1:]] == [str(sorted(pids))] * 3
    # Each worker ended with the rank that started it, and took its procs with it.
    assert _running(name) == []
    assert not [pid for pid in pids if _alive(pid)]


def test_missing_topology_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="needs the RANK environment variable"):
        host_mesh_from_store(_NoStore())
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK must be an integer, not 'zero'"):
        host_mesh_from_store(_NoStore())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 6, "local_world_size": 4}, r"WORLD_SIZE \(6\) must be a multiple of"),
        ({"rank": 8}, r"RANK \(8\) and LOCAL_RANK \(0\) must lie within"),
        ({"transport": "udp"}, "unsupported transport 'udp'"),
        ({"transport": "tcp", "monarch_port": 70000}, "monarch_port must be a TCP port"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"rank": 0, "local_rank": 0, "world_size": 8, "local_world_size": 4}
    with pytest.raises(ValueError, match=message):
        host_mesh_from_store(_NoStore(), **{**args, **kwargs})  # type: ignore[arg-type]


class _NoStore:
    """A store that must not be used: the call fails before it publishes anything."""

    def set(self, key: str, value: str | bytes) -> None:
        raise AssertionError(f"set({key!r}) was called")

    def get(self, key: str) -> bytes:
        raise AssertionError(f"get({key!r}) was called")


def test_a_process_already_running_regency_is_refused() -> None:
    context()  # this process's controller runs, with a secret of its own
    with pytest.raises(RuntimeError, match="already runs in this process with a secret of its"):
        host_mesh_from_store(
            _NoStore(), rank=1, local_rank=1, world_size=2, local_world_size=2, secret=b"s" * 32
        )
