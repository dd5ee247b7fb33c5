"""``SlurmJob``: worker daemons on the nodes of one Slurm allocation.

One ``sbatch`` reserves ``sum(meshes.values())`` nodes; the batch script runs one job step
(``srun``) with one task per node, and each task runs a regency worker daemon
(``python -m regency worker --listen tcp://0.0.0.0:PORT``). The allocation is split by node
ranges: with ``meshes={"trainers": 2, "servers": 1}`` tasks 0-1 serve ``trainers`` and task 2
serves ``servers`` (a heterogeneous job would need the backfill scheduler and gains nothing
here, since every node runs the same daemon).

The job secret reaches the workers through ``sbatch``'s environment (``--export=ALL`` carries it
into the batch script and on to the tasks), never through a command line or a file.

Each task writes its output to ``{log_dir}/regency-{job_id}-{task}.out``. The controller learns
the workers' addresses from those files: the task prints its Slurm node name, then the worker
prints ``regency worker listening on tcp://IP:PORT``; the controller connects to that port at
the node's ``NodeAddr`` (the address ``slurmctld`` itself uses to reach the node). So ``port=0``
works (every worker takes a free port and reports it), which a cluster running several
``slurmd`` on one machine needs; ``log_dir`` must be a directory the controller and the nodes
share (on one machine, any directory; on a cluster, a shared file system, as Slurm output
usually is).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from regency.actor._worker import worker_command, worker_env
from regency.job._errors import JobError
from regency.job._trait import JobTrait

__all__ = ["SlurmJob"]

# squeue states in which the job exists and may yet run workers.
_ALIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "RESIZING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "SIGNALING",
        "STAGE_OUT",
    }
)
# Whole lines only (ending in a newline): a line still being written must not match.
_LISTENING = re.compile(r"regency worker listening on (tcp://\S+)\n")
_NODE_LINE = re.compile(r"^regency slurm node (\S+)\n", re.MULTILINE)
_DEFAULT_LOG_DIR = Path(".regency") / "slurm"
_SLURM_TIMEOUT_S = 60.0  # one Slurm client command; slurmctld answers in milliseconds


class SlurmJob(JobTrait):
    """Hosts from one Slurm allocation: a regency worker daemon on each allocated node.

    ``meshes`` maps a mesh name to its number of hosts (nodes); ``job.state().<name>`` is then a
    ``HostMesh`` over that many nodes. All meshes share one ``sbatch`` allocation of
    ``sum(meshes.values())`` nodes, split by node ranges in the order of ``meshes``::

        job = SlurmJob({"trainers": 2}, partition="gpu", gpus_per_node=8, port=0)
        trainers = job.state().trainers.spawn_procs(per_host={"gpus": 8})
        ...
        job.kill()

    Args:
        meshes: mesh name -> number of nodes.
        python_exe: the Python on the nodes that has regency installed.
        slurm_args: extra ``sbatch`` arguments, appended last (they override the ones below).
        port: the TCP port every worker listens on; ``0`` lets each worker take a free port
            and report it (needed when several Slurm nodes share one machine).
        job_name: ``sbatch --job-name``.
        ntasks_per_node: ``sbatch --ntasks-per-node``: task slots reserved on each node. One
            worker runs per node whatever this is; its procs use the node's whole allocation.
        time_limit: ``sbatch --time``: minutes (int) or a Slurm time string (``"1:30:00"``).
        partition: ``sbatch --partition``.
        log_dir: where the batch script and the workers write their output, read back by the
            controller to learn the workers' addresses (default ``./.regency/slurm``).
        exclusive: ``sbatch --exclusive`` (nodes not shared with other jobs).
        gpus_per_node: ``sbatch --gpus-per-node``.
        cpus_per_task: ``sbatch --cpus-per-task``.
        mem: ``sbatch --mem``: megabytes (int) or a Slurm size string (``"16G"``).
        job_start_timeout: seconds to wait, from the start of ``state()``'s wait, for the
            allocation to start and every worker to listen; when exceeded the job is cancelled
            and ``TimeoutError`` raised. ``None`` waits as long as the queue takes.
        account: ``sbatch --account``.
        qos: ``sbatch --qos``.

    """

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str = sys.executable,
        slurm_args: Sequence[str] = (),
        port: int = 22222,
        job_name: str = "regency_job",
        ntasks_per_node: int = 1,
        time_limit: int | str | None = None,
        partition: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        exclusive: bool = False,
        gpus_per_node: int | str | None = None,
        cpus_per_task: int | None = None,
        mem: int | str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
    ) -> None:
        super().__init__()
        if not meshes:
            raise ValueError("SlurmJob needs at least one mesh, e.g. {'hosts': 2}")
        for name, count in meshes.items():
            if not name.isidentifier():
                raise ValueError(f"mesh name {name!r} is not a Python identifier")
            if not isinstance(count, int) or count < 1:
                raise ValueError(f"mesh {name!r} needs a positive number of nodes, not {count!r}")
        if not 0 <= port < 65536:
            raise ValueError(f"port must be 0..65535, not {port}")
        if isinstance(slurm_args, str):
            raise TypeError("slurm_args is a sequence of arguments, not one string")
        self.meshes: dict[str, int] = dict(meshes)
        self.python_exe = python_exe
        self.slurm_args: tuple[str, ...] = tuple(slurm_args)
        self.port = port
        self.job_name = job_name
        self.ntasks_per_node = ntasks_per_node
        self.time_limit = time_limit
        self.partition = partition
        self.log_dir = Path(log_dir if log_dir is not None else _DEFAULT_LOG_DIR).absolute()
        self.exclusive = exclusive
        self.gpus_per_node = gpus_per_node
        self.cpus_per_task = cpus_per_task
        self.mem = mem
        self.job_start_timeout = job_start_timeout
        self.account = account
        self.qos = qos
        self.job_id: str | None = None
        self._addresses: dict[str, list[str]] | None = None

    # -- JobTrait hooks -------------------------------------------------------------------------

    def _spec(self) -> Any:
        return (
            tuple(self.meshes.items()),
            self.python_exe,
            self.slurm_args,
            self.port,
            self.job_name,
            self.ntasks_per_node,
            self.time_limit,
            self.partition,
            self.exclusive,
            self.gpus_per_node,
            self.cpus_per_task,
            self.mem,
            self.account,
            self.qos,
        )

    def _create(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **worker_env(self.secret)}
        out = _slurm(
            [*self.sbatch_args(), "--parsable"], input=self.batch_script(), env=env
        ).strip()
        # --parsable prints "JOBID" or "JOBID;CLUSTER".
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise JobError(f"sbatch printed {out!r}, not a job id")
        self.job_id = job_id
        self._addresses = None

    def _running(self) -> bool:
        if self.job_id is None:
            return False
        return self._squeue_state()[0] in _ALIVE_STATES

    def _worker_addresses(self) -> dict[str, list[str]]:
        if self._addresses is None:
            self._addresses = self._wait_for_workers()
        return self._addresses

    def _kill(self) -> None:
        job_id = self.job_id
        if job_id is None:
            return
        cancel = subprocess.run(
            ["scancel", job_id],
            capture_output=True,
            text=True,
            timeout=_SLURM_TIMEOUT_S,
            check=False,
        )
        # Wait until Slurm has ended the tasks (COMPLETING means some still run), so that no
        # worker of this job is left and its ports are free when kill() returns.
        delay = 0.05
        deadline = time.monotonic() + _SLURM_TIMEOUT_S
        while True:
            state, _ = self._squeue_state()
            if state not in _ALIVE_STATES and state != "COMPLETING":
                break
            if time.monotonic() >= deadline:
                raise JobError(
                    f"Slurm job {job_id} is still {state} {_SLURM_TIMEOUT_S:.0f}s after "
                    f"scancel ({cancel.stderr.strip() or 'no error'}); kill() again to retry"
                )
            time.sleep(delay)  # Slurm has no completion event to wait on: poll squeue
            delay = min(delay * 2, 0.5)
        self.job_id = None
        self._addresses = None

    # -- the submission -------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """The allocation's node count: the sum of the meshes' sizes."""
        return sum(self.meshes.values())

    def sbatch_args(self) -> list[str]:
        """The ``sbatch`` command line (the script is passed on stdin)."""
        args = [
            "sbatch",
            f"--job-name={self.job_name}",
            f"--nodes={self.num_nodes}",
            f"--ntasks-per-node={self.ntasks_per_node}",
            f"--output={self.log_dir}/regency-%j.batch.out",
            "--export=ALL",
        ]
        optional: list[tuple[str, object]] = [
            ("--time", self.time_limit),
            ("--partition", self.partition),
            ("--gpus-per-node", self.gpus_per_node),
            ("--cpus-per-task", self.cpus_per_task),
            ("--mem", self.mem),
            ("--account", self.account),
            ("--qos", self.qos),
        ]
        args += [f"{flag}={value}" for flag, value in optional if value is not None]
        if self.exclusive:
            args.append("--exclusive")
        args += self.slurm_args
        return args

    def batch_script(self) -> str:
        """The batch script: one ``srun`` step running a worker on every node."""
        worker = worker_command(f"tcp://0.0.0.0:{self.port}", python=self.python_exe)
        ranges = []
        start = 0
        for name, count in self.meshes.items():
            ranges.append(f"{name}={start}-{start + count - 1}")
            start += count
        srun = [
            "srun",
            f"--nodes={self.num_nodes}",
            f"--ntasks={self.num_nodes}",
            "--ntasks-per-node=1",
            "--whole",
            "--kill-on-bad-exit=0",
            f"--output={self.log_dir}/regency-%j-%t.out",
            f"--error={self.log_dir}/regency-%j-%t.err",
            "bash",
            "-c",
            'echo "regency slurm node $SLURMD_NODENAME"; exec "$@"',
            "regency-worker",
            *worker,
        ]
        return (
            "#!/bin/bash\n"
            "# regency SlurmJob: one worker daemon per node; tasks by mesh: "
            f"{' '.join(ranges)}\n"
            f"exec {shlex.join(srun)}\n"
        )

    # -- finding the workers --------------------------------------------------------------------

    def _task_output(self, task: int) -> Path:
        return self.log_dir / f"regency-{self.job_id}-{task}.out"

    def _squeue_state(self) -> tuple[str, str]:
        """(state, reason) of the job; ("", "") once Slurm has forgotten it."""
        assert self.job_id is not None
        proc = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", self.job_id, "-o", "%T|%r"],
            capture_output=True,
            text=True,
            timeout=_SLURM_TIMEOUT_S,
            check=False,
        )
        line = proc.stdout.strip().splitlines()
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # finished long enough ago to be purged
                return "", ""
            raise JobError(f"squeue failed ({proc.returncode}): {proc.stderr.strip()}")
        if not line:
            return "", ""
        state, _, reason = line[0].partition("|")
        return state.strip(), reason.strip()

    def _wait_for_workers(self) -> dict[str, list[str]]:
        if self.job_id is None:
            raise JobError("SlurmJob has no Slurm job: call apply() or state() first")
        found: dict[int, str] = {}
        deadline = (
            None if self.job_start_timeout is None else time.monotonic() + self.job_start_timeout
        )
        delay = 0.02
        next_check = 0.0
        state = reason = ""
        while len(found) < self.num_nodes:
            for task in range(self.num_nodes):
                if task not in found:
                    address = self._read_address(task)
                    if address is not None:
                        found[task] = address
            if len(found) == self.num_nodes:
                break
            now = time.monotonic()
            if now >= next_check:  # squeue costs a slurmctld RPC: at most twice a second
                state, reason = self._squeue_state()
                if state not in _ALIVE_STATES:
                    self._fail_started(state)
                next_check = now + 0.5
            if deadline is not None and now >= deadline:
                job_id = self.job_id
                self._kill()
                raise TimeoutError(
                    f"Slurm job {job_id} did not start within job_start_timeout="
                    f"{self.job_start_timeout}s (state {state or 'unknown'}, reason "
                    f"{reason or 'none'}; {len(found)}/{self.num_nodes} workers listening); "
                    "the job was cancelled"
                )
            # Neither Slurm nor the output files offer an event to wait on: poll, backing off.
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        addresses: dict[str, list[str]] = {}
        task = 0
        for name, count in self.meshes.items():
            addresses[name] = [found[t] for t in range(task, task + count)]
            task += count
        return addresses

    def _read_address(self, task: int) -> str | None:
        try:
            text = self._task_output(task).read_text(errors="replace")
        except FileNotFoundError:
            return None
        match = _LISTENING.search(text)
        if match is None:
            return None
        # The worker listens on all interfaces; reach it at its node's NodeAddr, the address
        # slurmctld itself uses for the node (the worker's own guess at its IP may not route).
        port = match.group(1).rpartition(":")[2]
        node = _NODE_LINE.search(text)
        if node is None:
            raise JobError(f"{self._task_output(task)} does not name its Slurm node")
        return f"tcp://{_node_address(node.group(1))}:{port}"

    def _fail_started(self, state: str) -> None:
        """The job ended (or vanished) before all workers listened: raise with its output."""
        job_id = self.job_id
        logs = []
        for path in [
            self.log_dir / f"regency-{job_id}.batch.out",
            *(self.log_dir / f"regency-{job_id}-{t}.err" for t in range(self.num_nodes)),
        ]:
            try:
                tail = path.read_text(errors="replace").strip().splitlines()[-10:]
            except FileNotFoundError:
                continue
            if tail:
                logs.append(f"--- {path}:\n" + "\n".join(tail))
        self._kill()
        detail = ("\n" + "\n".join(logs)) if logs else ""
        raise JobError(
            f"Slurm job {job_id} ended before its workers listened "
            f"(state {state or 'gone from squeue'}){detail}"
        )


def _slurm(argv: list[str], *, input: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run a Slurm client command; its stdout, or a :class:`JobError` with its stderr."""
    if shutil.which(argv[0]) is None:
        raise JobError(f"`{argv[0]}` not found: SlurmJob needs the Slurm client commands on PATH")
    proc = subprocess.run(
        argv,
        input=input,
        capture_output=True,
        text=True,
        env=env,
        timeout=_SLURM_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise JobError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _node_address(node: str) -> str:
    """The IP of a Slurm node: its ``NodeAddr``, resolved."""
    out = _slurm(["scontrol", "show", "node", "-o", node])
    match = re.search(r"\bNodeAddr=(\S+)", out)
    addr = match.group(1) if match else node
    try:
        return socket.gethostbyname(addr)
    except OSError:
        return addr
