"""``ProcessJob``: each host is a worker daemon in a local subprocess (multi-host, one machine)."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regency import config
from regency.actor._worker import worker_command, worker_env
from regency.job._errors import JobError
from regency.job._trait import DEFAULT_JOB_PATH, JobState, JobTrait

_LISTENING = re.compile(rb"regency worker listening on (tcp://\S+)")
_START_TIMEOUT = 60.0
_EXIT_TIMEOUT = 10.0
# How long a ProcessJob worker waits for a controller before it exits (see ProcessJob).
DEFAULT_IDLE_TIMEOUT = 600.0


@dataclass
class _Worker:
    """One worker daemon: a process (named by pid and start time), its log and its address."""

    pid: int
    started: int
    log: str
    address: str | None = None


def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/PID/stat`` (state first), or ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def _alive(pid: int, started: int) -> bool:
    """Whether process ``pid`` is the one started at ``started`` and has not exited."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


def _group_members(pgid: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every live process in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append((int(entry), int(fields[19])))
    return members


def _wait_gone(pid: int, started: int, timeout: float) -> bool:
    """Wait until process ``pid`` has exited (it need not be our child)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        deadline = time.monotonic() + timeout
        while _alive(pid, started):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Readable once the process has exited; checked again in case it is a zombie.
            select.select([pidfd], [], [], min(left, 0.1))
        return True
    finally:
        os.close(pidfd)


class ProcessJob(JobTrait):
    """Hosts as local worker daemons, one subprocess per host (each in its own session).

    ``meshes`` maps a mesh name to its number of hosts; ``env`` adds environment variables for
    the workers (and so their procs). Each worker listens on ``tcp://127.0.0.1:0`` and the job
    reads its address from the line it prints. Workers outlive the controller that started
    them, so a re-run of the same script reconnects to them (see ``JobTrait.state``); ``kill()``
    ends them and every process they started. The workers' output goes to log files in a
    temporary directory (``log_dir``).

    When its controller goes (ends, crashes or is killed), a worker stops the procs it started
    for it and its zygote within seconds. A worker started by ``state(cached_path=None)``, which
    no later run can find, then exits too. Others wait for a re-run to reconnect through the
    cache, and exit by themselves once no controller has been attached for ``idle_timeout``
    seconds (default :data:`DEFAULT_IDLE_TIMEOUT`, 10 minutes; ``None``: never); a later run
    starts new workers.
    """

    def __init__(
        self,
        meshes: dict[str, int],
        env: dict[str, str] | None = None,
        *,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        super().__init__()
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be > 0 seconds or None, got {idle_timeout!r}")
        self.idle_timeout = idle_timeout
        for name, count in meshes.items():
            if not isinstance(count, int) or count <= 0:
                raise ValueError(f"mesh {name!r} needs a positive number of hosts, got {count!r}")
            config._check_procs_per_host(count, f"ProcessJob mesh {name!r} of {count} hosts")
        self.meshes = dict(meshes)
        self.env = dict(env or {})
        self.log_dir: str | None = None
        self._workers: dict[str, list[_Worker]] = {}
        self._popens: dict[int, subprocess.Popen[bytes]] = {}

    # Set by state(cached_path=None): the workers it starts exit with their controller.
    _uncached = False

    def _spec(self) -> Any:
        return (sorted(self.meshes.items()), sorted(self.env.items()))

    def state(self, cached_path: str | Path | None = DEFAULT_JOB_PATH) -> JobState:
        """As :meth:`JobTrait.state`; the workers a call without a cache starts exit early.

        With ``cached_path=None`` no later run can find the workers this call starts, so they
        exit as soon as their controller goes.
        """
        self._uncached = cached_path is None
        try:
            return super().state(cached_path)
        finally:
            self._uncached = False

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_popens"] = {}  # process handles belong to the process that started them
        return state

    def _create(self) -> None:
        self.log_dir = tempfile.mkdtemp(prefix="regency-job-")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            **self.env,
            **worker_env(self.secret),
        }
        self._workers = {}
        for name, count in self.meshes.items():
            workers = self._workers[name] = []
            for index in range(count):
                log = Path(self.log_dir) / f"{name}_{index}.log"
                with open(log, "wb") as out:
                    popen = subprocess.Popen(
                        worker_command(
                            "tcp://127.0.0.1:0",
                            idle_timeout=getattr(self, "idle_timeout", DEFAULT_IDLE_TIMEOUT),
                            exit_with_controller=self._uncached,
                        ),
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                self._popens[popen.pid] = popen
                workers.append(_Worker(popen.pid, _start_time(popen.pid) or 0, str(log)))

    def _running(self) -> bool:
        workers = [w for group in self._workers.values() for w in group]
        return bool(workers) and all(_alive(w.pid, w.started) for w in workers)

    def _worker_addresses(self) -> dict[str, list[str]]:
        deadline = time.monotonic() + _START_TIMEOUT
        for group in self._workers.values():
            for worker in group:
                if worker.address is None:
                    worker.address = self._wait_for_address(worker, deadline)
        return {name: [w.address or "" for w in group] for name, group in self._workers.items()}

    def _wait_for_address(self, worker: _Worker, deadline: float) -> str:
        """Read the worker's address from its log once it has printed it."""
        log = Path(worker.log)
        while True:
            found = _LISTENING.search(log.read_bytes())
            if found is not None:
                return found.group(1).decode()
            if not _alive(worker.pid, worker.started):
                raise JobError(
                    f"worker {worker.pid} exited before listening; its log "
                    f"({log}):\n{log.read_text(errors='replace')[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"worker {worker.pid} did not report its address within "
                    f"{_START_TIMEOUT:g} s (log: {log})"
                )
            _wait_gone(worker.pid, worker.started, 0.01)

    def _kill(self) -> None:
        workers = [w for group in self._workers.values() for w in group]
        for worker in workers:
            if not _alive(worker.pid, worker.started):
                continue
            members = _group_members(worker.pid)  # the worker, its zygote and procs
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            for pid, started in members:
                _wait_gone(pid, started, _EXIT_TIMEOUT)
        for popen in self._popens.values():
            popen.wait(_EXIT_TIMEOUT)
        self._popens.clear()
        self._workers = {}
        if self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None
