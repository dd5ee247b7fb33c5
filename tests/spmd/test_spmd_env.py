"""setup_torch_elastic_env on one host: torchrun's variables in every proc."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator

import pytest

from regency.actor import Actor, ProcMesh, endpoint, this_host
from regency.spmd import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async

pytestmark = pytest.mark.timeout(120)

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class Env(Actor):
    @endpoint
    def env(self) -> dict[str, str | None]:
        return {key: os.environ.get(key) for key in KEYS}

    @endpoint
    def clear(self) -> None:
        for key in KEYS:
            os.environ.pop(key, None)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    """Four local procs shaped like two hosts of two GPUs."""
    mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        yield mesh
    finally:
        mesh.stop().get(timeout=30)


def envs(procs: ProcMesh) -> list[dict[str, str | None]]:
    return list(procs.spawn("env", Env).env.call().get(timeout=60).values())


def test_every_proc_gets_torchruns_variables(procs: ProcMesh) -> None:
    procs.spawn("clear", Env).clear.call().get(timeout=60)
    setup_torch_elastic_env(procs)
    got = envs(procs)
    port = got[0]["MASTER_PORT"]
    assert port is not None
    assert 0 < int(port) < 65536
    for rank, env in enumerate(got):
        assert env == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % 2),  # the coordinate on the last dimension
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(rank // 2),
            "GROUP_WORLD_SIZE": "2",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "4",
            "ROLE_NAME": "rank",
            "WORLD_SIZE": "4",
            "MASTER_ADDR": socket.gethostname(),  # rank 0's host
            "MASTER_PORT": port,
        }


def test_a_new_setup_picks_a_new_free_port(procs: ProcMesh) -> None:
    setup_torch_elastic_env(procs)
    first = envs(procs)[0]["MASTER_PORT"]
    setup_torch_elastic_env(procs)
    second = envs(procs)[0]["MASTER_PORT"]
    assert first is not None
    assert second is not None
    with socket.socket() as sock:  # nothing holds the port: a store can bind it
        sock.bind(("", int(second)))


def test_explicit_address_and_port(procs: ProcMesh) -> None:
    setup_torch_elastic_env(procs, master_addr="10.1.2.3", master_port=29555)
    got = envs(procs)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in got} == {("10.1.2.3", "29555")}
    assert [e["RANK"] for e in got] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    "kwargs", [{"master_addr": "10.1.2.3"}, {"master_port": 29555}], ids=["addr", "port"]
)
def test_only_one_of_address_and_port_is_an_error(procs: ProcMesh, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=r"master_addr.*master_port"):
        setup_torch_elastic_env(procs, **kwargs)
    with pytest.raises(ValueError, match=r"master_addr.*master_port"):
        asyncio.run(setup_torch_elastic_env_async(procs, **kwargs))


def test_async_variant(procs: ProcMesh) -> None:
    procs.spawn("clear2", Env).clear.call().get(timeout=60)

    async def setup() -> None:
        await setup_torch_elastic_env_async(procs)

    asyncio.run(setup())
    got = envs(procs)
    assert [e["LOCAL_RANK"] for e in got] == ["0", "1", "0", "1"]
    assert [e["GROUP_RANK"] for e in got] == ["0", "0", "1", "1"]
    assert len({e["MASTER_PORT"] for e in got}) == 1


def test_one_dimension_mesh_is_one_host(procs: ProcMesh) -> None:
    mesh = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        setup_torch_elastic_env(mesh, "127.0.0.1", 29600)
        got = list(mesh.spawn("env", Env).env.call().get(timeout=60).values())
        assert [e["LOCAL_RANK"] for e in got] == ["0", "1", "2"]
        assert {e["GROUP_RANK"] for e in got} == {"0"}
        assert {e["GROUP_WORLD_SIZE"] for e in got} == {"1"}
        assert {e["LOCAL_WORLD_SIZE"] for e in got} == {"3"}
    finally:
        mesh.stop().get(timeout=30)


def test_get_host_port_modes(procs: ProcMesh) -> None:
    spmd = procs.spawn("hp", SPMDActor).slice(hosts=0, gpus=0)
    host, port = spmd.get_host_port.call_one(None).get(timeout=60)
    assert host == socket.gethostname()
    assert port > 0
    ip, _ = spmd.get_host_port.call_one(True).get(timeout=60)
    socket.inet_aton(ip)  # an IPv4 address
    name, _ = spmd.get_host_port.call_one(False).get(timeout=60)
    assert name == socket.gethostname()
