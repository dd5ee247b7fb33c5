"""regency.spmd on two network-namespace hosts: torchrun's variables on a {hosts: 2, gpus: 2}
mesh, rank 0's host address as the master, and gloo reaching across the hosts with them."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
from netns import NetnsCluster

from regency.actor import Actor, endpoint
from regency.job import attach_to_workers
from regency.spmd import setup_torch_elastic_env

pytestmark = pytest.mark.timeout(240)

# Workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

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
    "GLOO_SOCKET_IFNAME",
)


class Env(Actor):
    @endpoint
    def env(self) -> dict[str, str | None]:
        return {key: os.environ.get(key) for key in KEYS}

    @endpoint
    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo")  # env:// with the variables set above
        try:
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return float(t.item())
        finally:
            dist.destroy_process_group()


def test_env_on_two_namespace_hosts(hosts_and_workers: tuple[NetnsCluster, list[str]]) -> None:
    cluster, addresses = hosts_and_workers
    hosts = attach_to_workers(addresses[:2], timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        setup_torch_elastic_env(procs)
        probes = procs.spawn("env", Env)
        got = list(probes.env.call().get(timeout=60).values())
        port = got[0]["MASTER_PORT"]
        assert port is not None
        for rank, env in enumerate(got):
            assert env == {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % 2),
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": str(rank // 2),
                "GROUP_WORLD_SIZE": "2",
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": "4",
                "ROLE_NAME": "rank",
                "WORLD_SIZE": "4",
                # Rank 0's host by its own address (the namespaces share one hostname).
                "MASTER_ADDR": cluster.hosts[0].ip,
                "MASTER_PORT": port,
                # gloo binds the interface holding the host's address, not the hostname's.
                "GLOO_SOCKET_IFNAME": "eth0",
            }
        pytest.importorskip("torch")
        sums = list(probes.all_reduce.call().get(timeout=120).values())
        assert sums == [10.0] * 4  # 1 + 2 + 3 + 4, across both hosts
    finally:
        procs.stop().get(timeout=60)
