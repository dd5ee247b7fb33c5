"""One rank of a torchrun-style job that builds its host mesh with host_mesh_from_store.

Usage: store_mesh.py RANK WORLD_SIZE LOCAL_WORLD_SIZE STORE_PORT TRANSPORT NAME. Rank 0 spawns
one proc per host, asks each for its pid, and prints the mesh's extent and those pids as JSON;
every other rank calls that actor mesh too (rank 0 hands it over through the store), prints the
pids it answered with, and stays until rank 0 is done (its worker serves until then).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from datetime import timedelta

from torch.distributed import TCPStore

from regency.actor import Actor, endpoint, shutdown_context
from regency.spmd import host_mesh_from_store


class Where(Actor):
    @endpoint
    def where(self) -> int:
        return os.getpid()


def main() -> None:
    rank, world, local_world, port = (int(a) for a in sys.argv[1:5])
    transport, name = sys.argv[5:7]
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=200))
    mesh = host_mesh_from_store(
        store,
        transport=transport,
        rank=rank,
        local_rank=rank % local_world,
        world_size=world,
        local_world_size=local_world,
        name=name,
        timeout=120,
    )
    if mesh is None:
        # Every rank can call the actors rank 0 spawned (its controller shares the secret).
        where = pickle.loads(store.get("where"))
        print(sorted(where.where.call().get(timeout=150).values()), flush=True)
        store.set(f"called/{rank}", "1")
        store.get("done")
        store.set(f"left/{rank}", "1")
        return
    procs = mesh.spawn_procs(per_host={"gpus": 1})
    where = procs.spawn("where", Where)
    found = where.where.call().get(timeout=150)
    store.set("where", pickle.dumps(where))
    print(json.dumps({"extent": dict(mesh.extent), "where": list(found.values())}), flush=True)
    store.wait([f"called/{r}" for r in range(1, world)])
    procs.stop().get(timeout=60)
    shutdown_context().get()
    store.set("done", "1")
    store.wait([f"left/{r}" for r in range(1, world)])


if __name__ == "__main__":
    main()
