"""torchrun's contract on a regency mesh: Monarch's ``monarch.spmd``.

Set torchrun's environment in every proc of a mesh, then run ordinary ``torch.distributed``
code there (an unmodified torchrun script, or your own actors)::

    from regency.actor import this_host
    from regency.spmd import SPMDActor, setup_torch_elastic_env

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    setup_torch_elastic_env(procs)              # RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...

    spmd = procs.spawn("train", SPMDActor)       # or run a torchrun script as it is:
    host, port = spmd.slice(gpus=0).get_host_port.call_one(None).get()
    spmd.main.call(host, port, ["train.py", "--epochs", "2"]).get()

The command line has the same for users with only a script: ``regency run --nproc-per-node 4
train.py --epochs 2``. See ``docs/spmd.md``.
"""

from __future__ import annotations

from regency import _public
from regency.spmd._actor import SPMDActor
from regency.spmd._env import TORCH_PRELOAD
from regency.spmd._script import ScriptExit
from regency.spmd._setup import setup_torch_elastic_env, setup_torch_elastic_env_async
from regency.spmd._store_mesh import host_mesh_from_store

__all__ = [
    "TORCH_PRELOAD",
    "SPMDActor",
    "ScriptExit",
    "host_mesh_from_store",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
]

_public.publish(__name__, globals())
