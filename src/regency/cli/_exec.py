"""``regency exec`` and ``regency kill``: work with the job an earlier ``job.state()`` cached."""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regency._errors import RegencyError
from regency.job._trait import DEFAULT_JOB_PATH, resolve_cache_link

_NO_JOB = 2  # exit status when there is no usable job
_LOST = 255  # exit status when a host was lost mid-command


def add_exec_parser(commands: Any) -> None:
    """Add ``exec`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "exec",
        help="run a command on the cached job's hosts",
        description="Run CMD on hosts of the job cached by job.state() (one proc per host). "
        "Each host's command sees REGENCY_RANK_<DIM> and REGENCY_SIZE_<DIM>. The exit "
        "status is 0 if every host's command succeeded, else the first non-zero one.",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every host (the default)")
    which.add_argument("--one", action="store_true", help="only the first host of each mesh")
    which.add_argument(
        "--point",
        action="append",
        metavar="DIM=I",
        help="only the hosts at DIM=I (repeat for several dimensions)",
    )
    parser.add_argument("--mesh", metavar="NAME", help="only this mesh (default: all of them)")
    _add_job_arg(parser)
    parser.add_argument(
        "--collect",
        action="store_true",
        help="print each host's output at the end, rank by rank, instead of streaming it",
    )
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="K=V", help="set a variable"
    )
    parser.add_argument("--workdir", metavar="DIR", help="run the command in DIR on each host")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def add_kill_parser(commands: Any) -> None:
    """Add ``kill`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "kill",
        help="tear the cached job down",
        description="Kill the job cached by job.state() (its workers and every process they "
        "started) and remove the cache file. With NAME, the job of that context (see "
        "regency context); without, the active context's.",
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="a context whose job to kill")
    _add_job_arg(parser)


def _add_job_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job",
        metavar="PATH",
        default=DEFAULT_JOB_PATH,
        help=f"the cached job (default: {DEFAULT_JOB_PATH})",
    )


class UsageError(RegencyError):
    """A problem with the command line or the cached job, reported without a traceback."""


@dataclass(frozen=True)
class Target:
    """One host to run on: its mesh, its rank and coordinates there, and its label."""

    mesh: str
    rank: int
    point: dict[str, int]
    sizes: dict[str, int]
    base: int
    label: str


def _parse_points(items: list[str] | None) -> dict[str, int]:
    constraints: dict[str, int] = {}
    for item in items or []:
        for part in item.split(","):
            dim, sep, index = part.partition("=")
            if not sep or not dim.strip() or not index.strip().lstrip("-").isdigit():
                raise UsageError(f"--point takes DIM=INDEX, got {part!r}")
            constraints[dim.strip()] = int(index)
    return constraints


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"-e takes K=V, got {item!r}")
        env[key] = value
    return env


def _running_state(path: Path) -> Any:
    """The state of the job cached at ``path``, attached; a :class:`UsageError` saying why not."""
    from regency.actor._attach import AttachError

    job = _load_job(path)
    if not job._running():
        raise UsageError(
            f"the job cached at {path} ({type(job).__name__}) is not running any more; "
            "`regency kill` removes the cache"
        )
    try:
        return job.state(cached_path=path)
    except AttachError as exc:
        raise UsageError(f"cannot reach the job's hosts: {exc}") from exc


def _load_job(path: Path) -> Any:
    from regency.job._trait import job_load

    if not path.exists():
        raise UsageError(
            f"no job cached at {path}: run `regency apply MODULE.ATTR` or a script that calls "
            "job.state() first (or give --job PATH)"
        )
    try:
        return job_load(path)
    except Exception as exc:
        raise UsageError(f"cannot read the cached job at {path}: {exc}") from exc


def _targets(meshes: dict[str, Any], args: argparse.Namespace) -> list[Target]:
    """The hosts ``args`` selects, in mesh order then rank order."""
    from regency.shape import Point

    if args.mesh is not None:
        if args.mesh not in meshes:
            raise UsageError(f"the job has no mesh {args.mesh!r}; its meshes are {sorted(meshes)}")
        meshes = {args.mesh: meshes[args.mesh]}
    constraints = _parse_points(args.point)
    several = len(meshes) > 1
    targets = []
    for name, mesh in meshes.items():
        extent = mesh.extent
        unknown = sorted(set(constraints) - set(extent.labels))
        if unknown:
            raise UsageError(
                f"mesh {name!r} has no dimension {unknown[0]!r}; its dimensions are {extent.labels}"
            )
        bases = list(mesh.shape.ranks())
        for rank in range(len(mesh)):
            point = dict(Point(rank, extent))
            if any(point[d] != i for d, i in constraints.items()):
                continue
            if args.one and rank != 0:
                continue
            label = f"{name}:{rank}" if several else str(rank)
            targets.append(Target(name, rank, point, dict(extent), bases[rank], label))
    if not targets:
        raise UsageError(f"no host matches --point {' '.join(args.point or [])}")
    return targets


def run_exec(args: argparse.Namespace) -> int:
    """``regency exec``: run the command, print what it wrote, return the exit status."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("regency exec: no command given (regency exec [...] -- CMD ...)", file=sys.stderr)
        return _NO_JOB
    try:
        return _exec(args, cmd)
    except UsageError as exc:
        print(f"regency exec: {exc}", file=sys.stderr)
        return _NO_JOB


def _exec(args: argparse.Namespace, cmd: list[str]) -> int:
    from regency._runtime.actors.base.errors import SupervisionError
    from regency._runtime.actors.meshes.meshes import HostInfo, HostMesh
    from regency.job._exec import print_line, rank_env, run_on_hosts
    from regency.shape import Extent, Shape

    env = _parse_env(args.env)
    state = _running_state(Path(args.job))
    targets = _targets(dict(state._meshes), args)
    hosts = [state._meshes[t.mesh]._hosts[t.base] for t in targets]
    mesh = HostMesh(
        Shape.from_extent(Extent(["hosts"], [len(targets)])),
        [HostInfo(h.agent) for h in hosts],
    )
    envs = [{**env, **rank_env(t.point, t.sizes)} for t in targets]
    on_line = None if args.collect else print_line(lambda i: targets[i].label)
    try:
        results = list(run_on_hosts(mesh, cmd, envs, on_line=on_line, cwd=args.workdir).values())
    except SupervisionError as exc:
        print(f"regency exec: a host was lost: {exc}", file=sys.stderr)
        return _LOST
    if args.collect:
        for target, result in zip(targets, results, strict=True):
            print(f"=== [{target.label}] exit status {result.returncode} ===", flush=True)
            sys.stdout.write(result.stdout)
            sys.stdout.flush()
            sys.stderr.write(result.stderr)
            sys.stderr.flush()
    failed = [(t, r.returncode) for t, r in zip(targets, results, strict=True) if r.returncode]
    if not failed:
        return 0
    detail = ", ".join(f"rank {t.label} (exit status {code})" for t, code in failed)
    print(
        f"regency exec: failed on {len(failed)} of {len(targets)} hosts: {detail}", file=sys.stderr
    )
    code = failed[0][1]
    return 128 - code if code < 0 else min(code, 255)  # killed by signal N: 128 + N


def run_kill(args: argparse.Namespace) -> int:
    """``regency kill``: kill the cached job and remove its cache file."""
    from regency.job._context import context_state

    try:
        path = Path(args.job) if args.name is None else context_state(args.name)
    except ValueError as exc:
        print(f"regency kill: {exc}", file=sys.stderr)
        return _NO_JOB
    try:
        job = _load_job(path)
    except UsageError as exc:
        print(f"regency kill: {exc}", file=sys.stderr)
        return _NO_JOB
    job.kill()
    with contextlib.suppress(FileNotFoundError):
        resolve_cache_link(path).unlink()  # a context's state file, never the context link
    print(f"regency kill: killed the {type(job).__name__} cached at {path}", file=sys.stderr)
    return 0
