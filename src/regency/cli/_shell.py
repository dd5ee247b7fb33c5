"""``regency shell``: an interactive shell on one host of the cached job (or this machine)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from regency.cli._exec import UsageError, _add_job_arg, _parse_env, _running_state, _targets

_NO_JOB = 2  # exit status when there is no usable job


def add_shell_parser(commands: Any) -> None:
    """Add ``shell`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "shell",
        help="open an interactive shell on one host of the cached job",
        description="Open an interactive shell ($SHELL, else /bin/bash) on a pty of one host of "
        "the job cached by job.state(): the first host of the first mesh, or the one --mesh "
        "and --point pick; --local opens it on this machine. The shell sees REGENCY_RANK_<DIM> "
        "and REGENCY_SIZE_<DIM>. The exit status is the shell's.",
    )
    parser.add_argument("--mesh", metavar="NAME", help="a host of this mesh (default: the first)")
    parser.add_argument(
        "--point",
        action="append",
        metavar="DIM=I",
        help="the host at DIM=I (repeat for several dimensions; default: rank 0)",
    )
    parser.add_argument(
        "--local", action="store_true", help="this machine instead of a host of the cached job"
    )
    _add_job_arg(parser)
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="K=V", help="set a variable"
    )
    parser.add_argument("--workdir", metavar="DIR", help="start the shell in DIR on the host")


def run_shell(args: argparse.Namespace) -> int:
    """``regency shell``: run the shell until it exits; return its exit status."""
    from regency.job._shell import shell

    try:
        env = _parse_env(args.env)
        host, rank_env = _this_host() if args.local else _job_host(args)
    except UsageError as exc:
        print(f"regency shell: {exc}", file=sys.stderr)
        return _NO_JOB
    return shell(host, env={**rank_env, **env}, workdir=args.workdir)


def _this_host() -> tuple[Any, dict[str, str]]:
    from regency.actor import this_host

    return this_host(), {}


def _job_host(args: argparse.Namespace) -> tuple[Any, dict[str, str]]:
    """The cached job's host that ``args`` picks, as a singleton host mesh, and its rank env.

    The rank env is the host's ``REGENCY_RANK_<DIM>`` / ``REGENCY_SIZE_<DIM>`` in its mesh.
    """
    from regency._runtime.actors.meshes.meshes import HostInfo, HostMesh
    from regency.job._exec import rank_env
    from regency.shape import Extent, Shape

    state = _running_state(Path(args.job))
    meshes = dict(state._meshes)
    if args.mesh is None and meshes:
        first = next(iter(meshes))
        meshes = {first: meshes[first]}
    args.one = not args.point
    target = _targets(meshes, args)[0]
    agent = state._meshes[target.mesh]._hosts[target.base].agent
    host = HostMesh(Shape.from_extent(Extent(["hosts"], [1])), [HostInfo(agent)])
    return host, rank_env(target.point, target.sizes)
