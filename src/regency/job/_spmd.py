"""``SPMDJob`` and ``serve``: a torchrun command run as a job on regency's schedulers.

Monarch's ``monarch.job.spmd`` takes a torchrun command (or a torchx ``AppDef``), launches
workers through torchx and runs the script on ``--nproc-per-node`` procs per host. Regency does
the same on its own jobs: ``scheduler`` names one (``local_cwd``: this machine; ``process``,
``slurm``: :class:`ProcessJob`, :class:`SlurmJob` with ``scheduler_cfg`` as their keyword
arguments) or is a job object of any kind (an ``SSHJob``, a ``KubernetesJob`` ...).
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regency.job._local import LocalJob
from regency.job._process import ProcessJob
from regency.job._slurm import SlurmJob
from regency.job._trait import DEFAULT_JOB_PATH, JobState, JobTrait

_TORCHRUN = ("torchrun", "torch.distributed.run")
_PYTHON = ("python", "python3")
_LOCAL = ("local", "local_cwd")
SCHEDULERS = (*_LOCAL, "process", "slurm")


@dataclass(frozen=True)
class TorchrunCommand:
    """What a torchrun command line asks for: ``script_args`` on ``nnodes`` x ``nproc_per_node``.

    ``script_args`` is ``[script, args...]`` or ``["-m", module, args...]``, as
    :meth:`regency.spmd.SPMDActor.main` takes it.
    """

    script_args: list[str]
    nproc_per_node: int
    nnodes: int


def _torchrun_parser() -> argparse.ArgumentParser:
    """A parser of torchrun's options (``torch/distributed/run.py``).

    Those regency does not use are read and ignored, as Monarch does.
    """
    parser = argparse.ArgumentParser(prog="torchrun", add_help=False)
    parser.add_argument("--nnodes", default="1:1")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--no-python", "--no_python", action="store_true")
    parser.add_argument("--run-path", "--run_path", action="store_true")
    parser.add_argument("-m", "--module", action="store_true")
    for option in (
        "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts",
        "monitor-interval", "start-method", "role", "log-dir", "redirects", "tee",
        "local-ranks-filter", "node-rank", "master-addr", "master-port", "local-addr",
    ):  # fmt: skip
        parser.add_argument(f"--{option}", f"--{option.replace('-', '_')}")
    parser.add_argument("-r", dest="redirects_short")
    parser.add_argument("-t", dest="tee_short")
    parser.add_argument("training_script", nargs="?")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def _count(option: str, text: str) -> int:
    """``--nnodes``'s ``N`` or ``N:N`` as a number (regency runs no elastic ranges)."""
    low, _, high = text.strip().partition(":")
    try:
        value, upper = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"{option}={text} is not a number of nodes (N or N:N)") from None
    if value != upper:
        raise ValueError(f"{option}={text}: elastic node ranges are not supported; give N or N:N")
    if value < 1:
        raise ValueError(f"{option}={text} must be at least 1")
    return value


def parse_torchrun(command: Sequence[str]) -> TorchrunCommand:
    """Read a torchrun command line, as Monarch's ``serve`` does.

    ``command`` is ``["torchrun", OPTIONS..., script, args...]`` (also ``torch.distributed.run``,
    ``python -m torch.distributed.run`` or ``python -m torchrun``), or ``["python", script,
    args...]`` for one proc. A ``--nproc-per-node`` that is not a number (``gpu``, ``auto``) warns
    and means 1, as in Monarch.
    """
    args = list(command)
    if not args:
        raise ValueError("command cannot be empty")
    first = os.path.basename(args[0])
    if first in _TORCHRUN:
        options = args[1:]
    elif first in _PYTHON:
        if len(args) >= 3 and args[1] == "-m" and args[2] in _TORCHRUN:
            options = args[3:]
        else:
            return TorchrunCommand(args[1:], 1, 1)
    else:
        raise ValueError(
            "Expected args to start with torchrun, torch.distributed.run, python, or python3, "
            f"got: {args[0]}"
        )
    parsed, _ = _torchrun_parser().parse_known_args(options)
    try:
        nproc = int(parsed.nproc_per_node)
    except ValueError:
        warnings.warn(
            f"--nproc-per-node={parsed.nproc_per_node} is not an integer, defaulting to 1. "
            f"Use an explicit integer value instead of '{parsed.nproc_per_node}'.",
            stacklevel=2,
        )
        nproc = 1
    if nproc < 1:
        raise ValueError(f"--nproc-per-node={nproc} must be at least 1")
    script = ["-m"] if parsed.module else []
    if parsed.training_script:
        script.append(parsed.training_script)
    script.extend(parsed.training_script_args or [])
    if not script or script == ["-m"]:
        raise ValueError(f"the torchrun command names no training script: {args}")
    return TorchrunCommand(script, nproc, _count("--nnodes", parsed.nnodes))


class SPMDJob(JobTrait):
    """A torchrun-style job: ``command`` run on every host of ``job`` by :meth:`run_spmd`.

    ``job`` (any regency job; its first host mesh is used) provides the hosts; ``state()``
    returns them as the mesh ``workers``, as Monarch's ``SPMDJob`` does. Made by :func:`serve`.
    """

    def __init__(self, job: JobTrait, command: Sequence[str]) -> None:
        super().__init__()
        self.job = job
        self.command = list(command)
        self.torchrun = parse_torchrun(self.command)

    def run_spmd(self) -> None:
        """Run the command: ``nproc_per_node`` procs on each host with torchrun's environment.

        Blocks until every rank's script has ended; a rank whose script raises or exits
        non-zero makes it raise (an ``ActorError`` naming the rank). The procs are stopped
        afterwards; the hosts stay, for another run or ``kill()``.

        A job not applied yet (one from ``load_current_job()``) first looks for the running job
        in the default cache, as ``state()`` does: it runs on the hosts ``regency apply``
        started. A job ``serve`` applied leaves that cache alone.
        """
        from regency.spmd import SPMDActor

        workers = self.state(cached_path=None if self.active else DEFAULT_JOB_PATH).workers
        procs = workers.spawn_procs(per_host={"gpus": self.torchrun.nproc_per_node})
        try:
            actors: Any = procs.spawn("_SPMDActor", SPMDActor)
            first = actors.slice(**dict.fromkeys(procs.sizes, 0))
            master_addr, master_port = first.get_host_port.call_one(None).get()
            actors.main.call(master_addr, master_port, self.torchrun.script_args).get()
        finally:
            procs.stop().get()

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this running job serves ``spec``: the same command on hosts its job serves."""
        return (
            isinstance(spec, SPMDJob)
            and spec.command == self.command
            and self.job.can_run(spec.job)
        )

    def _spec(self) -> Any:
        return (tuple(self.command), type(self.job).__name__, self.job._spec())

    def _connect(self) -> JobState:
        meshes = self.job._connect()._meshes
        if not meshes:
            raise ValueError(f"{type(self.job).__name__} has no host mesh to run on")
        return JobState({"workers": next(iter(meshes.values()))})

    def _create(self) -> None:
        self.job.apply()

    def _running(self) -> bool:
        return self.job._running()

    def _worker_addresses(self) -> dict[str, list[str]]:
        return self.job._worker_addresses()

    def _kill(self) -> None:
        self.job.kill()


def _from_appdef(appdef: Any) -> list[str]:
    """The command of a torchx ``AppDef``'s one role, with ``--nnodes`` its replica count."""
    roles = list(getattr(appdef, "roles", None) or [])
    if not roles:
        raise ValueError("No roles provided")
    if len(roles) > 1:
        raise ValueError("Multiple roles provided. regency supports single-role SPMD jobs")
    role = roles[0]
    command = [role.entrypoint, *role.args]
    if os.path.basename(command[0]) not in (*_TORCHRUN, *_PYTHON):
        command = command[1:]  # an entrypoint script (workspace/entrypoint.sh) running its args
    replicas = int(getattr(role, "num_replicas", 1))
    if replicas > 1 and command and os.path.basename(command[0]) in _TORCHRUN:
        command = [command[0], f"--nnodes={replicas}", *command[1:]]
    return command


def _scheduler_job(scheduler: str, nnodes: int, cfg: Mapping[str, Any]) -> JobTrait:
    if scheduler in _LOCAL:
        if nnodes != 1:
            raise ValueError(
                f"Multi-node torchrun commands are not supported with serve() on the "
                f"{scheduler} scheduler. Got --nnodes={nnodes}. Use a scheduler that provides "
                "hosts (process, slurm, or a job object) for multi-node training."
            )
        return LocalJob(("workers",))
    if scheduler == "process":
        return ProcessJob({"workers": nnodes}, **cfg)
    if scheduler == "slurm":
        return SlurmJob({"workers": nnodes}, **cfg)
    raise ValueError(
        f"unknown scheduler {scheduler!r}: use one of {', '.join(SCHEDULERS)}, or pass a job "
        "object (e.g. an SSHJob or KubernetesJob)"
    )


def serve(
    appdef: Any,
    scheduler: str | JobTrait = "local_cwd",
    scheduler_cfg: Mapping[str, Any] | None = None,
) -> SPMDJob:
    """Launch the hosts of a torchrun command and return its :class:`SPMDJob`.

    ``appdef`` is a torchrun command (``["torchrun", "--nproc-per-node=4", "train.py"]``, see
    :func:`parse_torchrun`) or a torchx ``AppDef`` with one role (its ``num_replicas`` hosts).
    ``scheduler`` is ``"local_cwd"`` (this machine; ``--nnodes`` must be 1), ``"process"`` (a
    :class:`ProcessJob` of ``--nnodes`` hosts) or ``"slurm"`` (a :class:`SlurmJob` of
    ``--nnodes`` nodes), built with ``scheduler_cfg`` as keyword arguments; or a job object whose
    first host mesh is used as it is. Then ``job.run_spmd()`` runs the script there::

        job = serve(["torchrun", "--nproc-per-node=4", "--standalone", "train.py"])
        job.run_spmd()
        job.kill()
    """
    command = list(appdef) if isinstance(appdef, list | tuple) else _from_appdef(appdef)
    torchrun = parse_torchrun(command)
    if isinstance(scheduler, JobTrait):
        if scheduler_cfg:
            raise ValueError("scheduler_cfg applies to a scheduler name, not to a job object")
        job: JobTrait = scheduler
    else:
        job = _scheduler_job(scheduler, torchrun.nnodes, scheduler_cfg or {})
    spmd = SPMDJob(job, command)
    spmd.apply()
    print(f"Launched: {type(job).__name__} ({torchrun.nnodes} x {torchrun.nproc_per_node} procs)")
    return spmd
