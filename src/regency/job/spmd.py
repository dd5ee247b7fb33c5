"""torchrun-style jobs (Monarch's ``monarch.job.spmd``): ``serve`` and ``SPMDJob``.

A torchrun command becomes a job on one of regency's schedulers, and ``run_spmd()`` runs its
script on ``--nproc-per-node`` procs per host with torchrun's environment::

    from regency.job.spmd import serve

    job = serve(["torchrun", "--nproc-per-node=4", "--standalone", "train.py"])
    job.run_spmd()
    job.kill()

See ``docs/spmd.md``.
"""

from __future__ import annotations

from regency import _public
from regency.job._spmd import SPMDJob, TorchrunCommand, parse_torchrun, serve

__all__ = ["SPMDJob", "TorchrunCommand", "parse_torchrun", "serve"]

_public.publish(__name__, globals())
