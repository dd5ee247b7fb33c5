"""Shared by the worker and ProcessJob tests: raw worker daemons, actors, process checks."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from netns import NetnsCluster

from regency.actor import Actor, MeshFailure, current_rank, endpoint, this_host
from regency.job import worker_command, worker_env
from regency.job._process import ProcessJob, _alive, _group_members, _start_time
from regency.shape import Shape, Slice

LISTENING = re.compile(r"regency worker listening on (tcp://\S+)")


class Probe(Actor):
    """Answers where it runs; can call a peer, sleep, or spawn on its own host."""

    def __init__(self, peer: object = None) -> None:
        self.peer = peer

    @endpoint
    def where(self) -> dict[str, object]:
        return {
            "rank": dict(current_rank()),
            "pid": os.getpid(),
            "host": next(iter(this_host()._agents())),
        }

    @endpoint
    def value(self, scale: int) -> int:
        return scale * (1 + current_rank().rank)

    @endpoint
    def ping(self, hops: int) -> list[int]:
        if hops == 0 or self.peer is None:
            return [os.getpid()]
        return [os.getpid(), *self.peer.ping.call_one(hops - 1).get(timeout=30)]  # type: ignore[attr-defined]

    @endpoint
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @endpoint
    def spawn_by_host_rank(self, per_host: int) -> object:
        """Spawn on this host, picked from its host mesh by this actor's ``hosts`` rank (the way
        Monarch's nested-mesh test does); returns the new actor mesh."""
        rank = current_rank()["hosts"]
        here = Shape(["hosts"], Slice(offset=rank, sizes=[1], strides=[1]))
        procs = this_host()._new_with_shape(here).spawn_procs(per_host={"gpus": per_host})
        return procs.spawn("nested", Probe)

    @endpoint
    def spawn_on_my_host(self) -> dict[str, object]:
        inner = this_host().spawn_procs(per_host={"local": 1}).spawn("inner", Probe)
        return inner.where.call_one().get(timeout=30)


@dataclass
class RawWorker:
    """A worker daemon started with ``python -m regency worker``; stderr is kept for its log."""

    proc: subprocess.Popen[bytes]
    address: str
    log: bytearray = field(default_factory=bytearray)

    def wait_for_log(self, text: str, timeout: float = 10) -> str:
        """Read the worker's stderr until a line containing ``text`` (returns that line)."""
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log.decode(errors="replace").splitlines():
                if text in line:
                    return line
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} in the worker's log:\n{self.log.decode()}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                assert chunk, f"worker exited:\n{self.log.decode()}"
                self.log += chunk


@contextmanager
def raw_worker(
    secret: bytes, listen: str = "tcp://127.0.0.1:0", argv: list[str] | None = None
) -> Iterator[RawWorker]:
    """A worker daemon holding ``secret``, killed (with its process group) afterwards.

    ``argv`` replaces the ``regency worker`` command (it must print the listening line first).
    """
    proc = subprocess.Popen(
        argv or worker_command(listen),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **worker_env(secret)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        found = LISTENING.search(line)
        assert found, f"worker printed {line!r}"
        yield RawWorker(proc, found.group(1))
    finally:
        kill_group(proc.pid)
        proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def kill_group(pgid: int) -> None:
    """SIGKILL a process group and wait until every member is gone."""
    members = _group_members(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for pid, started in members:
        wait_gone(pid, started)


def wait_gone(pid: int, started: int | None = None, timeout: float = 10) -> None:
    """Wait until process ``pid`` has exited (it need not be our child)."""
    started = started if started is not None else _start_time(pid)
    if started is None:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        deadline = time.monotonic() + timeout
        while _alive(pid, started):
            left = deadline - time.monotonic()
            assert left > 0, f"process {pid} is still alive"
            select.select([pidfd], [], [], min(left, 0.1))
    finally:
        os.close(pidfd)


def job_processes(job: ProcessJob) -> list[tuple[int, int]]:
    """Every live process of a job: each worker's process group (worker, zygote, procs)."""
    return [
        member
        for group in job._workers.values()
        for worker in group
        for member in _group_members(worker.pid)
    ]


def kill_and_check(job: ProcessJob) -> None:
    """``job.kill()``, then check that no process of the job is left."""
    members = job_processes(job)
    job.kill()
    left = [pid for pid, started in members if _alive(pid, started)]
    assert not left, f"processes left after kill(): {left}"


def stop_processes(pids: list[int], timeout: float = 10) -> None:
    """SIGSTOP ``pids`` and wait until the kernel shows every one of them stopped.

    A stop takes effect when each thread of the process next enters the kernel, which under load
    can be after a message already in its socket was answered; a test that needs silence waits.
    """
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if state != "T":
                running.append((pid, state))
        if not running:
            return
        assert time.monotonic() < deadline, f"not stopped after {timeout} s: {running}"
        time.sleep(0.005)


def host_processes(job: ProcessJob, mesh: str, index: int) -> list[tuple[int, int]]:
    """The live processes of one host of a job (its worker's process group)."""
    return _group_members(job._workers[mesh][index].pid)


class Failures:
    """Records the failures that reach the root, and lets a test wait for them."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._cond:
            self.seen.append(str(failure))
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 10) -> list[str]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.seen) >= count, timeout), self.seen
            return list(self.seen)


def all_cmdlines() -> str:
    """Every process's command line on this machine, one per line (to look for secrets)."""
    lines = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                lines.append(Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(lines)


def start_netns_workers(
    cluster: NetnsCluster, secret: bytes, port: int = 0, bind_all: bool = False
) -> list[str]:
    """A worker daemon on every namespace host; the addresses they print once bound.

    Each listens on its host's own address, or (``bind_all``) on every address of its host
    (``0.0.0.0``, as a pod's worker does), on ``port`` (0: any free one).
    """
    addresses = []
    for host in cluster.hosts:
        bind = "0.0.0.0" if bind_all else host.ip
        proc = cluster.popen(
            host,
            worker_command(f"tcp://{bind}:{port}"),
            env={**os.environ, **worker_env(secret)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the worker prints it once bound, or exits
        found = LISTENING.search(line)
        assert found, f"worker on {host.netns} printed {line!r} (exit status {proc.poll()})"
        assert found.group(1).startswith(f"tcp://{host.ip}:"), line
        if port:
            assert found.group(1) == f"tcp://{host.ip}:{port}", line
        addresses.append(found.group(1))
    return addresses
