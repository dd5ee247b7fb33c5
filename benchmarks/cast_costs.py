"""Measure the per-hop costs of ``cast_model.Costs`` on this machine, through regency's real stack.

CPU costs come from ``/proc/PID/task/TID/schedstat`` (CPU time each thread ran, so a loaded
machine stretches the wall time but not these figures); link delays from round trips minus
the CPU they contain.

1. *Flat casts* to N = 1, 2, 4, 8 procs of ``this_host()`` (fan-out 16: the controller sends
   every frame): ``K`` streamed broadcasts and ``G`` gathers one at a time. Least squares over
   N: the controller's CPU per broadcast has intercept ``prepare`` and slope ``send`` (a frame
   out, the cheapest frame cost measured; a frame in, ``recv``, is taken to cost the same); its
   CPU per gather has slope ``send + recv + merge``, which gives ``merge`` (a reply's handling,
   the ValueMesh's share included). A proc's CPU per gather is ``recv + deliver + send``, which
   gives ``deliver`` (the actor's thread hop, the handler, its reply).
2. *Narrow trees*: 2, 4, 8 and 16 procs of this host at ``cast_fanout`` 2: the controller sends
   2 frames and receives 2 replies whatever N, so the slope over N of its CPU per broadcast is
   ``route`` (per destination a frame carries) and that per gather, less ``route``, is
   ``assemble`` (per value a reply carries, the ValueMesh's included); the flat slopes above
   then give ``send = recv`` (a frame of one destination, less ``route``) and ``merge`` (less
   ``assemble``). At 8 procs, the procs' extra CPU per broadcast against fan-out 16 over the
   frames they relayed (8 - 2) is ``send + forward`` (acknowledgements, batched per 10 ms, in
   it). One ``ack`` (a small port message) costs ``send + recv``.
3. *TLS*: the flat gathers again over 1 and 4 network-namespace hosts (one proc each, TCP with
   TLS). A gather sends each host a frame and gets one back, four TLS ends: the controller's
   extra CPU per host (its slope over 1 -> 4 hosts less the slope over 1 -> 4 local procs) plus
   a proc's extra CPU per gather, over 4, is ``tls``.
4. *Links*: ``call_one`` round trips to an actor on a proc of this host (unix socket) and on a
   namespace host: (round trip - the CPU of the controller and the proc) / 2, never below 0, is
   a hop's delay, ``link_local`` and ``link_tls``.

Usage (as root for the namespace host): PYTHONPATH=src .venv/bin/python \
    benchmarks/cast_costs.py --json benchmarks/results/cast-costs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

from benchlib import export_bench_path
from cast_model import Costs
from multihost_bench import netns_unavailable
from scale_bench import fit
from scale_hosts_bench import CALL_TIMEOUT_S, make_scale_actor, own_cpu_ns, worker_cluster

SIZES = (1, 2, 4, 8)
ROUTE_SIZES = (2, 4, 8, 16)  # local procs at fan-out 2 (8 is also the relayed case)
TLS_SIZES = (1, 4)  # namespace hosts of the flat gathers over TLS (a subset of SIZES)
BROADCASTS = 1000
GATHERS = 200
ROUND_TRIPS = 400


def thread_ns(pid: int, tid: int) -> int:
    """CPU time (ns) one thread has run."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
        return int(stat.read().split()[0])


def process_ns(pid: int) -> int:
    """CPU time (ns) of every thread of ``pid``."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += thread_ns(pid, int(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class Meter:
    """CPU of the controller, of the procs' actor threads and of the procs' other threads."""

    def __init__(self, mesh: Any) -> None:
        self.pids = [int(p) for p in mesh.pid.call().get(timeout=CALL_TIMEOUT_S).values()]
        self.tids = [int(t) for t in mesh.tid.call().get(timeout=CALL_TIMEOUT_S).values()]

    def read(self) -> tuple[int, int, int]:
        """(controller, actor threads, other proc threads) in ns."""
        actor = sum(thread_ns(p, t) for p, t in zip(self.pids, self.tids, strict=True))
        procs = sum(process_ns(p) for p in self.pids)
        return own_cpu_ns(), actor, procs - actor


def per_op(before: tuple[int, int, int], after: tuple[int, int, int], ops: int) -> list[float]:
    """Seconds of CPU per operation for each of the three figures."""
    return [(b - a) / ops / 1e9 for a, b in zip(before, after, strict=True)]


def flat(api: Any, actor: type, n: int, hosts: Any = None) -> dict[str, float]:
    """Broadcast and gather CPU with ``n`` procs: of this host, or one on each of ``hosts``."""
    if hosts is None:
        procs = api.this_host().spawn_procs(per_host={"gpus": n})
    else:
        procs = hosts.slice(hosts=slice(0, n)).spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("costs", actor)
        meter = Meter(mesh)
        for _ in range(20):
            mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
        before = meter.read()
        for _ in range(BROADCASTS):
            mesh.incr.broadcast()
        mesh.total.call().get(timeout=CALL_TIMEOUT_S)
        cast = per_op(before, meter.read(), BROADCASTS)
        before = meter.read()
        for _ in range(GATHERS):
            mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
        gather = per_op(before, meter.read(), GATHERS)
        return {
            "cast_controller": cast[0],
            "cast_actor_per_proc": cast[1] / n,
            "cast_io_per_proc": cast[2] / n,
            "gather_controller": gather[0],
            "gather_actor_per_proc": gather[1] / n,
            "gather_io_per_proc": gather[2] / n,
            "procs_cast_total": cast[1] + cast[2],
        }
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT_S)


def tree(api: Any, actor: type, n: int, fanout: int) -> dict[str, float]:
    """:func:`flat`'s figures for ``n`` procs of this host at ``fanout``."""
    from regency import config

    with config.configured(cast_fanout=fanout):
        return flat(api, actor, n)


def hop_delay(procs: Any, actor: type, **where: int) -> dict[str, float]:
    """Median ``call_one`` round trip to the actor at ``where`` and the delay of one hop."""
    one = procs.spawn("hop", actor).slice(**where)
    meter = Meter(one)
    for _ in range(20):
        one.ping.call_one().get(timeout=CALL_TIMEOUT_S)
    times, before = [], meter.read()
    for _ in range(ROUND_TRIPS):
        begin = time.perf_counter()
        one.ping.call_one().get(timeout=CALL_TIMEOUT_S)
        times.append(time.perf_counter() - begin)
    cpu = sum(per_op(before, meter.read(), ROUND_TRIPS))
    rtt = statistics.median(times)
    return {"rtt": rtt, "cpu": cpu, "link": max(0.0, (rtt - cpu) / 2)}


def main() -> None:
    """Measure, fit, print (and write) the costs and the raw figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    why = netns_unavailable()
    if why is not None:
        sys.exit(f"namespace hosts are unavailable: {why}")
    export_bench_path()
    import regency.actor as api
    from regency.job import attach_to_workers

    actor = make_scale_actor(api)
    raw: dict[str, Any] = {"flat": {}}
    for n in SIZES:
        raw["flat"][str(n)] = flat(api, actor, n)
        print(f"flat {n}: {raw['flat'][str(n)]}", file=sys.stderr, flush=True)
    sizes = [float(n) for n in SIZES]
    rows = [raw["flat"][str(n)] for n in SIZES]
    cast_fit = fit(sizes, [r["cast_controller"] for r in rows])
    gather_fit = fit(sizes, [r["gather_controller"] for r in rows])
    frame = cast_fit["b"]
    proc_call = statistics.median(
        r["gather_actor_per_proc"] + r["gather_io_per_proc"] for r in rows
    )
    # At fan-out 2 the controller sends 2 frames and gets 2 replies whatever N: what grows with
    # N is per destination a frame carries (route) and per value a reply carries (assemble).
    raw["fanout_2"] = {str(n): tree(api, actor, n, 2) for n in ROUTE_SIZES}
    narrow = [raw["fanout_2"][str(n)] for n in ROUTE_SIZES]
    route_sizes = [float(n) for n in ROUTE_SIZES]
    route_fit = fit(route_sizes, [r["cast_controller"] for r in narrow])
    values_fit = fit(route_sizes, [r["gather_controller"] for r in narrow])
    route = max(0.0, route_fit["b"])
    assemble = max(0.0, values_fit["b"] - route)
    relayed = raw["fanout_2"]["8"]["procs_cast_total"]
    direct = raw["flat"]["8"]["procs_cast_total"]
    local_procs = api.this_host().spawn_procs(per_host={"gpus": 1})
    raw["hop_local"] = hop_delay(local_procs, actor, gpus=0)
    local_procs.stop().get(timeout=CALL_TIMEOUT_S)
    raw["flat_tls"] = {}
    with worker_cluster(max(TLS_SIZES)) as (_, addresses, secret):
        hosts = attach_to_workers(addresses, secret=secret, timeout=CALL_TIMEOUT_S)
        remote = hosts.slice(hosts=slice(0, 1)).spawn_procs(per_host={"gpus": 1})
        raw["hop_tls"] = hop_delay(remote, actor, hosts=0, gpus=0)
        remote.stop().get(timeout=CALL_TIMEOUT_S)
        for n in TLS_SIZES:
            raw["flat_tls"][str(n)] = flat(api, actor, n, hosts)
    # A gather sends each host one frame and gets one back: four TLS ends per host, at the
    # controller (its CPU's slope over hosts) and at the proc (its CPU per gather), over the
    # same with unix sockets.
    local = {n: raw["flat"][str(n)] for n in TLS_SIZES}
    remote_rows = {n: raw["flat_tls"][str(n)] for n in TLS_SIZES}
    low, high = min(TLS_SIZES), max(TLS_SIZES)

    def slope(rows: dict[int, dict[str, float]]) -> float:
        return (rows[high]["gather_controller"] - rows[low]["gather_controller"]) / (high - low)

    def proc_cpu(rows: dict[int, dict[str, float]]) -> float:
        return statistics.fmean(
            r["gather_actor_per_proc"] + r["gather_io_per_proc"] for r in rows.values()
        )

    tls_ends = slope(remote_rows) - slope(local) + proc_cpu(remote_rows) - proc_cpu(local)
    costs = Costs(
        prepare=max(0.0, cast_fit["a"]),
        send=max(0.0, frame - route),
        recv=max(0.0, frame - route),
        forward=max(0.0, (relayed - direct) / (8 - 2) - frame),
        deliver=max(0.0, proc_call - 2 * frame),
        merge=max(0.0, gather_fit["b"] - 2 * frame + route - assemble),
        assemble=assemble,
        route=route,
        ack=2 * frame,
        tls=max(0.0, tls_ends / 4),
        link_local=raw["hop_local"]["link"],
        link_tls=raw["hop_tls"]["link"],
    )
    result = {
        "costs_s": asdict(costs),
        "fits": {
            "cast_controller": cast_fit,
            "gather_controller": gather_fit,
            "cast_controller_fanout_2": route_fit,
            "gather_controller_fanout_2": values_fit,
        },
        "proc_cpu_per_call_s": proc_call,
        "raw": raw,
        "load_average": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")
    print(text)
    api.shutdown_context().get()


if __name__ == "__main__":
    main()
