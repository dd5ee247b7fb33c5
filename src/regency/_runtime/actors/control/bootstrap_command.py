"""How a proc is started: Monarch's ``BootstrapCommand`` and per-proc CPU/NUMA binding."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from regency.shape import Point, Shape

# proc_bind keys that numactl applies; ``cpus`` is applied by the proc itself.
NUMACTL_KEYS = ("cpunodebind", "membind", "physcpubind")


@dataclass(slots=True)
class BootstrapCommand:
    """The command a host runs to start a proc: ``program`` (run with ``argv[0] = arg0`` when
    given) with ``args``, and ``env`` over the host's environment (or over nothing when
    ``inherit_env`` is false; a ``None`` value removes a variable).

    Regency appends one argument, the pipe the proc reads its settings from, so the command
    must end up running ``python -m regency._runtime.bootstrap`` (wrappers around it are fine).
    """

    program: str
    arg0: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    inherit_env: bool = True

    def with_env(self, env: dict[str, str | None]) -> BootstrapCommand:
        """A copy with ``env`` added to its environment."""
        return dataclasses.replace(self, args=list(self.args), env={**self.env, **env})

    def argv(self, *extra: str) -> list[str]:
        """The argv to exec (``argv[0]`` is ``arg0`` or ``program``)."""
        return [self.arg0 or self.program, *self.args, *extra]

    def environment(self, inherited: dict[str, str]) -> dict[str, str]:
        """The proc's environment over ``inherited`` (the host's)."""
        env = dict(inherited) if self.inherit_env else {}
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command regency starts procs with: this interpreter running
    ``-m regency._runtime.bootstrap``; customise it with :meth:`BootstrapCommand.with_env`."""
    return BootstrapCommand(sys.executable, None, ["-m", "regency._runtime.bootstrap"], {})


# Set in the environment of a proc started by ``HostMesh.with_python_executable``: the
# interpreter, which the procs it spawns through ``this_host()`` start with too.
PYTHON_ENV = "REGENCY_PYTHON_EXECUTABLE"


def python_bootstrap_cmd(python: str) -> BootstrapCommand:
    """The default command run by the interpreter ``python``, which the proc passes on."""
    command = default_bootstrap_cmd()
    return dataclasses.replace(command, program=python, env={PYTHON_ENV: python})


def inherited_python() -> str | None:
    """The interpreter this proc was started with by ``with_python_executable``, if it was."""
    return os.environ.get(PYTHON_ENV) or None


@dataclass(frozen=True, slots=True)
class ProcLaunch:
    """Per-proc start options from ``spawn_procs(proc_bind=..., bootstrap_command=...)``."""

    bind: dict[str, str] | None
    command: BootstrapCommand | None

    @property
    def needs_exec(self) -> bool:
        """Whether the proc must be started by exec (not forked from the warm template)."""
        return self.command is not None or bool(
            self.bind and any(k in self.bind for k in NUMACTL_KEYS)
        )

    def numactl_prefix(self) -> list[str]:
        """``numactl --KEY=VALUE ...`` for the numactl keys of ``bind`` (``OSError`` when
        numactl is not installed on this host)."""
        options = [f"--{k}={self.bind[k]}" for k in NUMACTL_KEYS if self.bind and k in self.bind]
        if not options:
            return []
        numactl = shutil.which("numactl")
        if numactl is None:
            raise OSError(
                f"proc_bind {self.bind} needs numactl, which is not installed on this host"
            )
        return [numactl, *options]


def parse_cpus(text: str) -> set[int]:
    """CPUs in taskset's list form: ``"0,2,4-7"``; ``ValueError`` if malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        if sep:
            cpus.update(range(int(first), int(last) + 1))
        else:
            cpus.add(int(first))
    return cpus


def apply_cpus(bind: dict[str, str] | None) -> None:
    """Pin this process to ``bind["cpus"]`` (``os.sched_setaffinity``), if given."""
    if bind and "cpus" in bind:
        os.sched_setaffinity(0, parse_cpus(bind["cpus"]))


def launches_for(
    shape: Shape,
    per_host: int,
    proc_bind: Sequence[dict[str, str]] | None,
    command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None,
) -> tuple[ProcLaunch | None, ...] | None:
    """Each proc's binding and command, by rank (``None`` when neither is given).

    ``proc_bind`` has one entry per proc of a host (``ValueError`` otherwise); ``command`` is
    one command for all or a function of each proc's ``Point``.
    """
    if proc_bind is None and command is None:
        return None
    if proc_bind is not None:
        if len(proc_bind) != per_host:
            raise ValueError(
                f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({per_host})"
            )
        for given in proc_bind:
            if "cpus" in given:
                try:
                    parse_cpus(given["cpus"])
                except ValueError:
                    cpus = given["cpus"]
                    raise ValueError(f"proc_bind cpus {cpus!r} is not a CPU list") from None
    launches = []
    for rank in range(len(shape)):
        bind = dict(proc_bind[rank % per_host]) if proc_bind is not None else None
        cmd = command(Point(rank, shape.extent)) if callable(command) else command
        if cmd is not None and not isinstance(cmd, BootstrapCommand):
            raise TypeError(f"bootstrap_command must give a BootstrapCommand, got {cmd!r}")
        launches.append(ProcLaunch(bind, cmd))
    return tuple(launches)
