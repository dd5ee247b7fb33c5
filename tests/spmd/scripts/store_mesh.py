"""One rank of a torchrun-style job that builds its host mesh with host_mesh_from_store.

Usage: store_mesh.py RANK WORLD_SIZE LOCAL_WORLD_SIZE STORE_PORT TRANSPORT NAME. Rank 0 spawns
one proc per host, asks each for its pid, and prints the mesh's extent and those pids as JSON;
every other rank prints ``None`` and stays until rank 0 is done (its worker serves until then).
"""

from __future__ import annotations

import json
import os
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
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    mesh = host_mesh_from_store(
        store,
        transport=transport,
        rank=rank,
        local_rank=rank % local_world,
        world_size=world,
        local_world_size=local_world,
        name=name,
    )
    if mesh is None:
        print("None", flush=True)
        store.get("done")
        store.set(f"left/{rank}", "1")
        return
    procs = mesh.spawn_procs(per_host={"gpus": 1})
    found = procs.spawn("where", Where).where.call().get(timeout=60)
    print(json.dumps({"extent": dict(mesh.extent), "where": list(found.values())}), flush=True)
    procs.stop().get(timeout=30)
    shutdown_context().get()
    store.set("done", "1")
    store.wait([f"left/{r}" for r in range(1, world)])


if __name__ == "__main__":
    main()
