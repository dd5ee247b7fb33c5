"""Hundreds of real hosts on one machine: regency's curves over hosts = 1, 2, 4 ... 256.

Every size gets a fresh cluster of network-namespace hosts (``tests/multihost/netns.py``: own
addresses on one bridge), a ``regency worker`` in each, attached over TCP with TLS (every
non-loopback TCP connection runs mutual TLS 1.3), ``--per-host`` procs on each. Before each
size the benchmark checks that the machine's available memory holds it (a host costs ~23 MB of
worker, ~20 MB of zygote and ~11 MB per proc here; see ``host_mb``) and stops the curve there,
saying so in the JSON, when it does not. Per size:

- ``attach_s``: start-up of the workers is not timed; ``attach_to_workers`` is, then
  ``spawn_s``: ``spawn_procs`` + ``spawn`` + a first ``ping.call()`` that every actor answered;
- ``gather_*``: ``mesh.ping.call().get()`` median, p10 and p90 (ms), the controller's CPU per gather
  (µs, all its threads, from ``/proc/self/task/*/schedstat``) and the time its threads waited
  for a core (``core_wait``: where that is a large part of the latency, cores are the limit);
- ``broadcast_*``: ``K`` ``mesh.incr.broadcast()`` then ``mesh.total.call()`` that must count
  ``K`` from every actor, after one such stream to warm up, ``ROUNDS`` times (the median round
  reported, every round in ``broadcast_rounds_us``): deliveries/s and the controller's CPU per
  broadcast (µs; the final gather's CPU taken off), in windows that hold no heartbeat sweep
  (:class:`Stream`: the controller's pings to idle hosts cost per second, not per cast; they
  are the idle figures), closed :data:`SETTLE_S` after the final call (the heads' last
  acknowledgements);
  ``broadcast_window_sweeps`` counts the sweeps that fell in a window all the same (0 unless a
  window outlasts the interval); ``broadcast_paced_controller_cpu_us``: the same for ``PACED``
  broadcasts ``PACE_S`` apart (each cast's frames leave on their own, as a cast does that is
  not part of a stream; the sleeps' own CPU included);
- ``call_one_busy_*``: ``call_one`` to an idle actor on the last host while every actor of the
  main mesh sleeps in a call (median, p99 ms);
- ``controller_rss_mb_per_host`` and ``controller_fds_per_host``: growth over the controller
  before ``attach``, divided by the hosts; ``idle_cpu_pct``: the controller's CPU over
  ``--idle`` seconds with every host attached and the mesh up (% of one core, from the
  ``utime + stime`` of ``/proc/self/stat``, which also counts threads that ended, in 10 ms
  ticks; ``idle_cpu_pct_schedstat`` the same from the live threads' ``schedstat``, in ns), with
  the load average before and after that window;
- ``cut_1`` and ``cut_rack`` (``min(64, hosts // 2)`` hosts at once, or ``--rack``, at most
  ``hosts - 2``; from 4 hosts on): actors on the cut hosts are in a 60 s call when their links
  go down (silent: no socket error); the
  time until every one of those calls has failed, until the root's supervision hook
  (``unhandled_fault_hook``: the controller owns these meshes) has run for each cut mesh, and
  the ``call_one`` latency to a healthy actor during that storm next to its quiet value.

Usage (as root; one command runs the whole curve, ~30-60 min on a quiet machine):
    PYTHONPATH=src .venv/bin/python benchmarks/scale_hosts_bench.py \
        --hosts 1,2,4,8,16,32,64,128,256 --json benchmarks/results/scale-hosts.json

The cut figures use the default ``--heartbeat-timeout`` (2 s); the broadcast figures want
``--parts main --heartbeat-timeout 40``, whose sweeps (10 s apart while they run) leave room
for a window between two at every size.

``--parts idle`` (or ``idle,cuts``) leaves out the busy figures (spawn, gather, broadcast): the
idle controller's CPU and the cuts alone, which are what a shared machine can still measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchlib import export_bench_path, percentile
from multihost_bench import netns_unavailable
from scale_actor import ENDPOINTS, ScaleBehavior
from scale_bench import cpu_ns

HOSTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LISTENING = re.compile(r"regency worker listening on (tcp://\S+)")
WORKER_START_S = 300.0
ATTACH_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 300.0
HEARTBEAT_S = 2.0
RACK = 64
WORKER_MB, ZYGOTE_MB, PROC_MB, RESERVE_MB = 23.0, 20.0, 11.0, 512.0


def make_scale_actor(api: Any) -> type:
    """Wrap :class:`ScaleBehavior` into an ``Actor`` subclass whose methods are endpoints."""
    namespace: dict[str, Any] = {"__init__": ScaleBehavior.__init__}
    namespace.update({name: api.endpoint(getattr(ScaleBehavior, name)) for name in ENDPOINTS})
    return type("ScaleActor", (api.Actor, ScaleBehavior), namespace)


def host_mb(per_host: int) -> float:
    """What one namespace host costs in memory here: worker, zygote and its procs (MB)."""
    return WORKER_MB + ZYGOTE_MB + PROC_MB * per_host


def available_mb() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in MB."""
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def own_status(field: str) -> float:
    """A ``kB`` field of ``/proc/self/status`` (e.g. ``VmRSS``) in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def own_fds() -> int:
    """How many file descriptors this process holds."""
    return len(os.listdir("/proc/self/fd"))


def own_stat_cpu_s() -> float:
    """CPU seconds this process has run (``utime + stime`` of ``/proc/self/stat``: every
    thread, ended ones included)."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_ns() -> int:
    """CPU time (ns) all of this process's threads have run."""
    return cpu_ns([os.getpid()])


def own_wait_ns() -> int:
    """Time (ns) this process's threads waited, runnable, for a core (``schedstat`` field 2)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with (
            contextlib.suppress(FileNotFoundError, ProcessLookupError),
            open(f"/proc/self/task/{tid}/schedstat") as stat,
        ):
            total += int(stat.read().split()[1])
    return total


@contextmanager
def worker_cluster(
    n: int, heartbeat_s: float | None = None
) -> Iterator[tuple[Any, list[str], bytes]]:
    """``n`` namespace hosts, a worker listening on each: ``(cluster, addresses, secret)``.

    The workers start together (a sequential start would cost minutes at 256 hosts). With
    ``heartbeat_s``, they start with that ``heartbeat_timeout`` (a worker tunes the kernel's
    keepalive of the controller's connection with its own settings when it accepts it, before
    the controller's arrive).
    """
    from netns import NetnsCluster

    from regency.job import worker_command, worker_env

    secret = os.urandom(32)
    env = {**os.environ, **worker_env(secret)}
    if heartbeat_s is not None:
        env["REGENCY_HEARTBEAT_TIMEOUT"] = str(heartbeat_s)
    with NetnsCluster(n) as cluster:
        workers = [
            cluster.popen(
                host,
                worker_command(f"tcp://{host.ip}:0"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            for host in cluster.hosts
        ]
        addresses, deadline = [], time.monotonic() + WORKER_START_S
        for host, proc in zip(cluster.hosts, workers, strict=True):
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                raise TimeoutError(f"worker on {host.netns} did not listen in {WORKER_START_S} s")
            line = proc.stdout.readline()  # printed once bound; "" when the worker exited
            found = LISTENING.search(line)
            if found is None:
                raise RuntimeError(f"worker on {host.netns} printed {line!r} ({proc.poll()})")
            addresses.append(found.group(1))
        yield cluster, addresses, secret


def timed_calls(call: Any, reps: int) -> list[float]:
    """Seconds each of ``reps`` runs of ``call().get()`` took."""
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        call().get(timeout=CALL_TIMEOUT_S)
        times.append(time.perf_counter() - begin)
    return times


ROUNDS = 3  # streams of broadcasts measured (the median is reported)
PACED, PACE_S = 200, 0.004  # broadcasts one at a time, and the pause after each
SETTLE_S = 0.6  # after the final call: the heads' acknowledgements (``ACK_DELAY`` a level) come


def heartbeat_sweeps() -> int:
    """Heartbeat sweeps the controller has run so far (each pings every idle host)."""
    from regency._runtime.kernel import state

    return int(state.runtime().transport.heartbeat.statistics()["sweeps"])


def after_sweep() -> None:
    """Return just after the controller's next heartbeat sweep (its answers back): a window
    that starts here holds no sweep for one ``heartbeat_interval``."""
    sweeps, deadline = heartbeat_sweeps(), time.monotonic() + 120
    while heartbeat_sweeps() == sweeps:
        if time.monotonic() > deadline:
            raise TimeoutError("the controller's heartbeat sweeps stopped")
        time.sleep(0.005)
    time.sleep(0.2)


class Stream:
    """Broadcasts to ``mesh``, and the controller's CPU per broadcast in windows that hold no
    heartbeat sweep.

    Every ``heartbeat_interval`` the controller pings each idle host: work per second, not per
    cast, that a stream the receivers drain slowly (256 hosts on two cores take ~5-10 ms a
    cast) would otherwise count against its casts, and that costs more during a stream than at
    rest, so that subtracting a rate measured at rest leaves part of it in. So each window
    starts just after a sweep and counts the sweeps that still fell in it (``measure_main``
    sets an interval of a quarter of the heartbeat timeout, longer than a window at the
    timeout the sweeps use, so none should); the pings are measured on their own (the idle
    figures). The final call that checks every actor got every cast waits until the receivers
    are done (:attr:`drain_s`): its replies then come back together, as when its CPU was
    measured alone and taken off, not one by one as each receiver finishes. The window closes
    :data:`SETTLE_S` after it (what the casts cause last: the heads' acknowledgements).
    """

    def __init__(self, mesh: Any, actors: int, gather_us: float) -> None:
        self.mesh = mesh
        self.actors = actors
        self.gather_ns = gather_us * 1e3  # the final ``total`` call's own CPU
        self.sweeps = 0  # sweeps that fell inside the measured windows
        self.drain_s = 0.0  # how long the receivers take after the last cast left
        self.total = sum(mesh.total.call().get(timeout=CALL_TIMEOUT_S).values())

    def send(self, count: int, pace: float = 0.0) -> float:
        """``count`` broadcasts (``pace`` seconds apart), then, :attr:`drain_s` after the
        last, a call that must count them all; the seconds from the first cast to its answer."""
        begin = time.perf_counter()
        for _ in range(count):
            self.mesh.incr.broadcast()
            if pace:
                time.sleep(pace)
        time.sleep(self.drain_s)
        totals = sum(self.mesh.total.call().get(timeout=CALL_TIMEOUT_S).values())
        seconds = time.perf_counter() - begin
        if totals - self.total != count * self.actors:
            raise AssertionError(
                f"{count} broadcasts to {self.actors} actors: {totals - self.total} came"
            )
        self.total = totals
        return seconds

    def throughput(self, count: int) -> float:
        """Seconds ``count`` broadcasts take until every actor counted them (the final call
        at once); sets :attr:`drain_s` from them, with a margin."""
        self.drain_s = 0.0
        seconds = self.send(count)
        self.drain_s = 1.5 * seconds + 0.1
        return seconds

    def measure(self, count: int, pace: float = 0.0) -> float:
        """One window of ``count`` broadcasts: the controller's CPU per broadcast (µs, the
        final call's taken off)."""
        after_sweep()
        sweeps, before = heartbeat_sweeps(), own_cpu_ns()
        self.send(count, pace)
        time.sleep(SETTLE_S)
        spent = own_cpu_ns() - before - self.gather_ns
        self.sweeps += heartbeat_sweeps() - sweeps
        return spent / count / 1e3


def measure_main(api: Any, actor: type, hosts: Any, n: int, per_host: int) -> dict[str, Any]:
    """Spawn, gather, broadcast and busy ``call_one`` figures on a mesh over all ``n`` hosts."""
    figures: dict[str, Any] = {}
    start = time.perf_counter()
    procs = hosts.spawn_procs(per_host={"gpus": per_host})
    try:
        mesh = procs.spawn("scale", actor)
        mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
        figures["spawn_s"] = time.perf_counter() - start
        probe = procs.spawn("probe", actor)
        probe.ping.call().get(timeout=CALL_TIMEOUT_S)
        actors = n * per_host
        reps = max(20, min(100, 2000 // actors))
        timed_calls(mesh.ping.call, 5)
        before, waited = own_cpu_ns(), own_wait_ns()
        times = timed_calls(mesh.ping.call, reps)
        figures["gather_controller_cpu_us"] = (own_cpu_ns() - before) / reps / 1e3
        # Waiting for a core: the share of a gather the machine's load, not regency, costs.
        figures["gather_controller_core_wait_us"] = (own_wait_ns() - waited) / reps / 1e3
        figures["gather_median_ms"] = statistics.median(times) * 1e3
        figures["gather_p90_ms"] = percentile(times, 90) * 1e3
        # The fastest tenth: gathers that found the cores free (the others' load is bursty).
        figures["gather_p10_ms"] = percentile(times, 10) * 1e3
        count = max(300, min(2000, 20000 // actors))
        stream = Stream(mesh, actors, figures["gather_controller_cpu_us"])
        stream.send(count)  # warm-up: the first casts define their parts on each connection
        seconds = stream.throughput(count)
        figures["broadcast_s"] = seconds
        figures["broadcast_deliveries_per_s"] = count * actors / seconds
        rounds = [stream.measure(count) for _ in range(ROUNDS)]
        figures["broadcast_rounds_us"] = rounds
        figures["broadcast_controller_cpu_us"] = sorted(rounds)[ROUNDS // 2]  # the median
        # The same, one cast at a time (PACE_S apart): each cast's frames leave alone, none
        # coalesced with the next cast's, and no backlog builds up behind slow receivers.
        figures["broadcast_paced_controller_cpu_us"] = stream.measure(PACED, pace=PACE_S)
        figures["broadcast_window_sweeps"] = stream.sweeps
        one = probe.slice(hosts=n - 1, gpus=per_host - 1).ping.call_one
        busy = mesh.sleep.call(2.0)
        times = timed_calls(one, 20)
        busy.get(timeout=CALL_TIMEOUT_S)
        figures["call_one_busy_median_ms"] = statistics.median(times) * 1e3
        figures["call_one_busy_p99_ms"] = percentile(times, 99) * 1e3
        return figures
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT_S)


class FaultLog:
    """The root's ``unhandled_fault_hook``: when each failure arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, failure: Any) -> None:
        with self.lock:
            self.times.append(time.perf_counter())

    def since(self, start: float) -> list[float]:
        """Seconds from ``start`` to each failure that arrived after it."""
        with self.lock:
            return [t - start for t in self.times if t >= start]


def storm(
    cluster: Any,
    hosts: Any,
    actor: type,
    faults: FaultLog,
    cut: range,
    healthy: Any,
    heartbeat_s: float,
) -> dict[str, float]:
    """Cut ``cut`` (host indices) at once under 60 s calls; time the failures and the probe."""
    procs = hosts.slice(hosts=slice(cut.start, cut.stop)).spawn_procs(per_host={"gpus": 1})
    victims = procs.spawn("victims", actor)
    victims.ping.call().get(timeout=CALL_TIMEOUT_S)
    pending = [victims.slice(hosts=i, gpus=0).sleep.call_one(60.0) for i in range(len(cut))]
    quiet = timed_calls(healthy.ping.call_one, 50)
    start = time.perf_counter()
    for index in cut:
        cluster.cut(index)
    cut_s = time.perf_counter() - start
    during, failed_at = [], 0.0
    deadline = start + 20 * heartbeat_s + 60
    while time.perf_counter() < deadline:
        during += timed_calls(healthy.ping.call_one, 1)
        if all(f.done() for f in pending):
            failed_at = time.perf_counter() - start
            break
    else:
        raise TimeoutError(f"{sum(not f.done() for f in pending)} calls still pending")
    for future in pending:
        if future.exception(timeout=0) is None:
            raise AssertionError("a call to a cut host returned")
    while not faults.since(start) and time.perf_counter() < deadline:
        during += timed_calls(healthy.ping.call_one, 1)
    supervised = faults.since(start)
    return {
        "hosts_cut": len(cut),
        "cut_links_s": cut_s,
        "all_calls_failed_s": failed_at,
        "supervision_first_s": min(supervised, default=float("nan")),
        "supervision_last_s": max(supervised, default=float("nan")),
        "supervision_events": len(supervised),
        "call_one_quiet_median_ms": statistics.median(quiet) * 1e3,
        "call_one_quiet_p99_ms": percentile(quiet, 99) * 1e3,
        "call_one_storm_median_ms": statistics.median(during) * 1e3,
        "call_one_storm_p99_ms": percentile(during, 99) * 1e3,
        "call_one_storm_calls": len(during),
    }


def measure_size(
    api: Any,
    actor: type,
    n: int,
    per_host: int,
    idle_s: float,
    parts: set[str],
    rack: int,
    heartbeat_s: float,
) -> dict[str, Any]:
    """Everything in ``parts`` for one cluster of ``n`` hosts (fresh)."""
    from regency import config
    from regency.job import attach_to_workers

    faults = FaultLog()
    api.unhandled_fault_hook = faults
    rss0, fds0 = own_status("VmRSS"), own_fds()
    with (
        config.configured(heartbeat_timeout=heartbeat_s),
        worker_cluster(n, heartbeat_s) as (cluster, addresses, secret),
    ):
        start = time.perf_counter()
        hosts = attach_to_workers(addresses, secret=secret, timeout=ATTACH_TIMEOUT_S)
        result: dict[str, Any] = {"attach_s": time.perf_counter() - start}
        if "main" in parts:
            # Sweeps a quarter of the timeout apart (the hosts still hear several in time): a
            # broadcast window fits between two at the sweeps' timeout, 40 s (see Stream).
            with config.configured(heartbeat_interval=heartbeat_s / 4):
                result.update(measure_main(api, actor, hosts, n, per_host))
            after_sweep()  # this sweep reads the interval back: one a second again
        if "idle" in parts:
            result.update(measure_idle(actor, hosts, n, per_host, idle_s, (rss0, fds0)))
        # Host 0 serves the healthy actor and host n - 1 is cut alone first: at most n - 2.
        rack = min(rack or min(RACK, n // 2), n - 2) if n >= 4 else 0
        if n >= 2 and "cuts" in parts:
            healthy_procs = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1})
            healthy = healthy_procs.spawn("healthy", actor).slice(gpus=0)
            healthy.ping.call_one().get(timeout=CALL_TIMEOUT_S)
            result["cut_1"] = storm(
                cluster, hosts, actor, faults, range(n - 1, n), healthy, heartbeat_s
            )
            if rack:
                cut = range(n - 1 - rack, n - 1)
                result["cut_rack"] = storm(cluster, hosts, actor, faults, cut, healthy, heartbeat_s)
        return result


def measure_idle(
    actor: type, hosts: Any, n: int, per_host: int, idle_s: float, start: tuple[float, int]
) -> dict[str, float]:
    """The controller's memory and fds (growth over ``start``: RSS MB and fds before the
    attach) and CPU with every host attached and a mesh up, idle."""
    rss0, fds0 = start
    result: dict[str, float] = {}
    procs = hosts.spawn_procs(per_host={"gpus": per_host})
    mesh = procs.spawn("idle", actor)
    mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
    result["controller_rss_mb_per_host"] = (own_status("VmRSS") - rss0) / n
    result["controller_fds_per_host"] = (own_fds() - fds0) / n
    time.sleep(1.0)  # the spawn's stragglers (replies, log lines) settle first
    result["idle_load_before"] = os.getloadavg()[0]
    before, before_ns, begin = own_stat_cpu_s(), own_cpu_ns(), time.perf_counter()
    time.sleep(idle_s)  # the measurement itself: an idle window
    seconds = time.perf_counter() - begin
    result["idle_s"] = seconds
    result["idle_cpu_pct"] = (own_stat_cpu_s() - before) / seconds * 100
    # The same from the threads' schedstat (ns, not 10 ms ticks; live threads only).
    result["idle_cpu_pct_schedstat"] = (own_cpu_ns() - before_ns) / 1e9 / seconds * 100
    result["idle_load_after"] = os.getloadavg()[0]
    procs.stop().get(timeout=CALL_TIMEOUT_S)
    return result


def main() -> None:
    """Parse the command line, run the sizes, print (and write) the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default=",".join(map(str, HOSTS)), help="host counts")
    parser.add_argument("--per-host", type=int, default=1, help="procs per host")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle window")
    parser.add_argument(
        "--parts", default="main,idle,cuts", help="what to measure: main, idle, cuts (comma list)"
    )
    parser.add_argument(
        "--rack", type=int, default=0, help="hosts cut at once (default: min(64, hosts / 2))"
    )
    parser.add_argument("--fanout", type=int, default=16, help="cast_fanout (16: the default)")
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=HEARTBEAT_S,
        help="heartbeat_timeout in seconds (2: the cut figures' default; regency's own is 5)",
    )
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    why = netns_unavailable()
    if why is not None:
        sys.exit(f"namespace hosts are unavailable: {why}")
    export_bench_path()
    import regency.actor as api
    from regency import config

    config.configure(cast_fanout=args.fanout)  # the procs inherit it
    actor = make_scale_actor(api)
    sizes = [int(n) for n in args.hosts.split(",") if n]
    result: dict[str, Any] = {
        "per_host": args.per_host,
        "fanout": args.fanout,
        "heartbeat_timeout_s": args.heartbeat_timeout,
        "parts": args.parts,
        "sizes": {},
        "skipped": {},
    }
    for n in sizes:
        need, have = n * host_mb(args.per_host) + RESERVE_MB, available_mb()
        if need > have:
            result["skipped"][str(n)] = f"needs ~{need:.0f} MB, {have:.0f} MB available"
            print(f"{n} hosts: skipped, {result['skipped'][str(n)]}", file=sys.stderr)
            break
        parts = set(args.parts.split(","))
        figures = measure_size(
            api, actor, n, args.per_host, args.idle, parts, args.rack, args.heartbeat_timeout
        )
        figures["available_mb_before"] = have
        figures["load_average_after"] = os.getloadavg()[0]
        result["sizes"][str(n)] = figures
        print(f"{n} hosts: {json.dumps(figures)}", file=sys.stderr, flush=True)
        if args.json:  # after every size: a long run that dies keeps what it measured
            with open(args.json, "w") as out:
                json.dump(result, out, indent=1)
    with contextlib.suppress(Exception):
        api.shutdown_context().get()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
