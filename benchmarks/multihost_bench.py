"""Multi-host figures of regency (no peers): worker hosts over TCP, Slurm start-up, host loss.

Runs ``figures.MULTIHOST_FIGURES``:

- ``multihost_calls``: ``call_one`` round trips to one actor and ``call`` + gather over 4 procs
  spread over two worker hosts (TCP through each worker's port), next to the same on
  ``this_host()`` (unix sockets). The worker hosts are network namespaces (``NetnsCluster``
  of ``tests/multihost/netns.py``: own addresses on a bridge, workers attached with
  ``attach_to_workers``) when this process is root and ``ip netns`` works, else two
  ``ProcessJob`` worker subprocesses on 127.0.0.1; ``mh_hosts`` (``"netns"`` or ``"process"``)
  and ``mh_hosts_note`` say which;
- ``multihost_slurm``: seconds from ``SlurmJob.state()`` to the first reply of an actor on the
  allocation, when ``scripts/slurm_cluster.sh status`` finds a cluster (skipped with the reason
  otherwise);
- ``host_loss``: 2 fresh worker hosts attached with ``heartbeat_timeout`` set (2 s); an actor
  on host 1 is in a 60 s call when the benchmark cuts host 1 off: on namespace hosts its link
  goes down (``ip link set ... down``: silent, no socket error), on ``ProcessJob`` hosts its
  worker, zygote and procs are SIGSTOPped; the time is from the cut until the pending future
  raises (``host_loss_hosts`` says which).

Usage: python benchmarks/multihost_bench.py [--quick] [--figures multihost_calls,host_loss]
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from actor_bench import make_actor_class, versions
from benchlib import REPO_ROOT, describe, export_bench_path
from figures import MULTIHOST_FIGURES, MultihostAdapter, await_path, main

STOP_TIMEOUT_S = 30.0
SLURM_TIMEOUT_S = 120.0
ATTACH_TIMEOUT_S = 30.0
NETNS_DIR = REPO_ROOT / "tests" / "multihost"  # netns.py: the namespace-hosts fixture
LISTENING = re.compile(r"regency worker listening on (tcp://\S+)")


def netns_unavailable() -> str | None:
    """Why namespace hosts cannot be used here (``None`` when they can)."""
    if str(NETNS_DIR) not in sys.path:
        sys.path.insert(0, str(NETNS_DIR))
    try:
        from netns import unavailable_reason
    except ImportError as exc:
        return f"cannot import {NETNS_DIR}/netns.py: {exc}"
    try:
        return unavailable_reason()
    except (OSError, subprocess.SubprocessError) as exc:
        return describe(exc, 200)


@contextmanager
def netns_hosts(n: int) -> Iterator[tuple[Any, Any]]:
    """``n`` namespace hosts with a worker each, attached: yields ``(cluster, host_mesh)``.

    Everything (workers, their procs, namespaces, bridge) is removed on exit, also on errors.
    """
    from netns import NetnsCluster

    from regency.job import attach_to_workers, worker_command, worker_env

    secret = os.urandom(32)
    env = {**os.environ, **worker_env(secret)}
    with NetnsCluster(n) as cluster:
        addresses = []
        for host in cluster.hosts:
            proc = cluster.popen(
                host,
                worker_command(f"tcp://{host.ip}:0"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            line = proc.stdout.readline()  # printed once bound; "" when the worker exited
            found = LISTENING.search(line)
            if found is None:
                raise RuntimeError(
                    f"worker on {host.netns} printed {line!r} (exit status {proc.poll()})"
                )
            addresses.append(found.group(1))
        yield cluster, attach_to_workers(addresses, secret=secret, timeout=ATTACH_TIMEOUT_S)


def make_sleeper_class(api: Any) -> type:
    """An actor whose ``sleep`` marks a file, then blocks (the call the host loss interrupts)."""

    def sleep(self: Any, marker: str, seconds: float) -> None:
        Path(marker).touch()
        time.sleep(seconds)

    return type("Sleeper", (api.Actor,), {"sleep": api.endpoint(sleep)})


class RegencyMultihost:
    """:class:`figures.MultihostAdapter` over regency's jobs."""

    def __init__(self) -> None:
        import regency.actor as api

        self._api = api
        self._actor_class = make_actor_class(api)
        self._sleeper_class = make_sleeper_class(api)
        api.unhandled_fault_hook = lambda failure: None  # host loss reaches the root: expected
        self._netns_reason = netns_unavailable()

    def hosts(self) -> tuple[str, str]:
        """What the worker hosts are: ``("netns", ...)`` or ``("process", why not netns)``."""
        if self._netns_reason is None:
            return "netns", (
                "2 network namespaces (`tests/multihost/netns.py`: 10.200.0.10-11 on bridge"
                " `rgy-br0`), one worker daemon each, attached with `attach_to_workers`"
            )
        return "process", (
            "2 `ProcessJob` worker subprocesses on 127.0.0.1 (network namespaces unavailable:"
            f" {self._netns_reason})"
        )

    @contextmanager
    def _worker_hosts(self) -> Iterator[tuple[Any, Any]]:
        """2 fresh worker hosts: yields ``(host_mesh, cut)``, ``cut()`` isolating host 1."""
        if self._netns_reason is None:
            with netns_hosts(2) as (cluster, hosts):
                yield hosts, lambda: cluster.cut(1)
            return
        from regency.job import ProcessJob
        from regency.job._process import _group_members

        job = ProcessJob({"hosts": 2})
        stopped: list[int] = []

        def cut() -> None:
            for pid, _ in _group_members(job._workers["hosts"][1].pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)

        try:
            yield job.state(cached_path=None).hosts, cut
        finally:
            job.kill()  # SIGKILL ends stopped processes too
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    @contextmanager
    def spawn(self, where: str, n: int) -> Iterator[tuple[Any, Any]]:
        """``n`` actors on two worker hosts (``tcp``: see :meth:`hosts`) or this host."""
        with contextlib.ExitStack() as stack:
            if where == "tcp":
                hosts, _ = stack.enter_context(self._worker_hosts())
                procs = hosts.spawn_procs(per_host={"gpus": n // 2})
            else:
                procs = self._api.this_host().spawn_procs(per_host={"gpus": n})
            try:
                mesh = procs.spawn("bench", self._actor_class)
                # The single actor: the first of the second host, or the last local one.
                one = mesh.slice(hosts=1, gpus=0) if where == "tcp" else mesh.slice(gpus=n - 1)
                yield mesh, one
            finally:
                procs.stop().get(timeout=STOP_TIMEOUT_S)

    def call(self, group: Any, method: str) -> list[Any]:
        """``mesh.method.call().get()`` as a list."""
        return list(getattr(group, method).call().get().values())

    def call_one(self, group: Any, method: str) -> Any:
        """``mesh.method.call_one()``."""
        return getattr(group, method).call_one()

    def wait(self, future: Any) -> Any:
        """``future.get()``."""
        return future.get()

    def slurm_first_reply(self) -> tuple[float | None, str]:
        """Time ``SlurmJob.state()`` until a ping answers, when a Slurm cluster is reachable."""
        script = REPO_ROOT / "scripts" / "slurm_cluster.sh"
        if shutil.which("sbatch") is None:
            return None, "skipped: no Slurm cluster (`sbatch` is not installed)"
        status = subprocess.run(
            ["bash", str(script), "status"], capture_output=True, text=True, timeout=30, check=False
        )
        if status.returncode != 0:
            why = (status.stdout + status.stderr).strip().splitlines()[-1:] or ["no output"]
            return None, f"skipped: `scripts/slurm_cluster.sh status` failed: {why[0]}"
        from regency.job import SlurmJob

        with tempfile.TemporaryDirectory(prefix="mh-slurm-") as logs:
            job = SlurmJob(
                {"hosts": 2},
                port=0,  # the test cluster's nodes may share a machine
                log_dir=logs,
                job_name=f"rgy-bench-{uuid.uuid4().hex[:8]}",
                time_limit=10,
                job_start_timeout=SLURM_TIMEOUT_S,
            )
            try:
                start = time.perf_counter()
                procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 1})
                mesh = procs.spawn("bench", self._actor_class)
                mesh.slice(hosts=0, gpus=0).ping.call_one().get(timeout=SLURM_TIMEOUT_S)
                seconds = time.perf_counter() - start
                procs.stop().get(timeout=STOP_TIMEOUT_S)
            finally:
                job.kill()
        return seconds, "2 hosts of the cluster that `scripts/slurm_cluster.sh status` lists"

    def host_loss(self, heartbeat_timeout_s: float, wait_s: float) -> tuple[float, str]:
        """Cut host 1 of 2 fresh worker hosts off under a pending call; time the failure."""
        from regency import config

        loss = config.configured(heartbeat_timeout=heartbeat_timeout_s)
        with loss, self._worker_hosts() as (hosts, cut):
            procs = None
            try:
                procs = hosts.spawn_procs(per_host={"gpus": 1})
                sleepers = procs.spawn("sleepers", self._sleeper_class)
                with tempfile.TemporaryDirectory(prefix="mh-loss-") as tmp:
                    marker = Path(tmp) / "asleep"
                    victim = sleepers.slice(hosts=1, gpus=0)
                    future = victim.sleep.call_one(str(marker), 60.0)
                    if not await_path(marker, wait_s):
                        raise TimeoutError("the victim's call did not start")
                    start = time.perf_counter()
                    cut()
                    try:
                        value = future.get(timeout=wait_s)
                    except TimeoutError:
                        raise
                    except Exception as exc:
                        return time.perf_counter() - start, describe(exc, 300)
                    raise AssertionError(f"the cut host's call returned {value!r}")
            finally:
                if procs is not None:
                    with contextlib.suppress(Exception):
                        procs.stop().get(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        """``shutdown_context().get()``."""
        self._api.shutdown_context().get()


def connect() -> tuple[MultihostAdapter, dict[str, Any]]:
    """Import regency and make the adapter."""
    export_bench_path()
    start = time.perf_counter()
    adapter = RegencyMultihost()
    meta = {"versions": versions("regency"), "multihost_connect_s": time.perf_counter() - start}
    return adapter, meta


if __name__ == "__main__":
    sys.exit(main({"regency": connect}, figures=MULTIHOST_FIGURES))
