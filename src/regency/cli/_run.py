"""``regency run``: launch a torchrun script on regency procs (this host or a cached job)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

from regency._errors import RegencyError
from regency.job._trait import DEFAULT_JOB_PATH

_USAGE = 2


def add_run_parser(commands: Any) -> None:
    """Add ``run`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "run",
        help="run a torchrun script on N procs per host",
        description="Run SCRIPT (or -m MODULE) on N procs per host with torchrun's environment "
        "(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), printing each rank's output with a "
        "[rankN]: prefix. Exits 0 when every rank succeeded, else with the status of the first "
        "rank that failed (128+N for a rank killed by signal N).",
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int,
        default=1,
        metavar="N",
        help="procs per host (default 1)",
    )
    parser.add_argument(
        "--job",
        metavar="PATH",
        help=f"run on the hosts of the job cached at PATH (e.g. {DEFAULT_JOB_PATH}) instead of "
        "this host",
    )
    parser.add_argument("--mesh", metavar="NAME", help="the job's host mesh to use")
    parser.add_argument(
        "-m", "--module", action="store_true", help="SCRIPT is a module name (python -m)"
    )
    parser.add_argument(
        "--no-prefix", action="store_true", help="print the ranks' output without [rankN]:"
    )
    parser.add_argument(
        "--preload",
        default="torch",
        metavar="MODULES",
        help="modules (comma-separated) that this host's procs start with already imported, "
        "forked from a process that imported them once; 'torch' means regency.spmd."
        "TORCH_PRELOAD (default: torch, where it is installed; '' for none; "
        "REGENCY_ZYGOTE_PRELOAD overrides)",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")


class _UsageError(RegencyError):
    pass


def _job_hosts(path: str, mesh_name: str | None) -> Any:
    from regency.actor._attach import AttachError
    from regency.cli._exec import UsageError, _load_job

    try:
        job = _load_job(Path(path))
    except UsageError as exc:
        raise _UsageError(str(exc)) from None
    if not job._running():
        raise _UsageError(f"the job cached at {path} is not running any more")
    try:
        meshes = dict(job.state(cached_path=path)._meshes)
    except AttachError as exc:
        raise _UsageError(f"cannot reach the job's hosts: {exc}") from exc
    if mesh_name is None:
        if len(meshes) != 1:
            raise _UsageError(f"the job has meshes {sorted(meshes)}: pick one with --mesh")
        return next(iter(meshes.values()))
    if mesh_name not in meshes:
        raise _UsageError(f"the job has no mesh {mesh_name!r}; its meshes are {sorted(meshes)}")
    return meshes[mesh_name]


def run_run(args: argparse.Namespace) -> int:
    """``regency run``: launch, stream the output, return the first failing rank's status."""
    from regency._runtime.host.zygote import PRELOAD_ENV
    from regency.actor import shutdown_context, this_host
    from regency.spmd._env import TORCH_PRELOAD
    from regency.spmd._launch import launch

    if args.nproc_per_node < 1:
        print("regency run: --nproc-per-node must be at least 1", file=sys.stderr)
        return _USAGE
    argv = ["-m", args.script, *args.args] if args.module else [args.script, *args.args]
    preload = TORCH_PRELOAD if args.preload == "torch" else (args.preload or "")
    if preload and importlib.util.find_spec(preload.split(",")[0]) is not None:
        os.environ.setdefault(PRELOAD_ENV, preload)
    try:
        hosts = _job_hosts(args.job, args.mesh) if args.job else this_host()
    except _UsageError as exc:
        print(f"regency run: {exc}", file=sys.stderr)
        return _USAGE
    status = _USAGE
    try:
        status = launch(hosts, args.nproc_per_node, argv, prefix=not args.no_prefix)
        return status
    finally:
        if status == 0:
            shutdown_context()
        else:
            # Ranks still running after another failed are killed without waiting for them.
            logging.getLogger("regency.host").setLevel(logging.ERROR)
            shutdown_context(host_timeout=1.0)
