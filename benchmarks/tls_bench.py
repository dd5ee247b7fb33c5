"""TLS on vs off between two network-namespace hosts: call_one round trip, 16 MiB throughput.

Two namespace hosts (``NetnsCluster(2)`` of ``tests/multihost/netns.py``) each run two worker
daemons: one with TLS (the default) and one with ``REGENCY_TLS=0``. Each round starts a fresh
controller subprocess per mode (with the same ``REGENCY_TLS``), which attaches that mode's two
workers, puts actor ``a`` on host 0 and actor ``b`` on host 1, and has ``a`` measure, against
``b`` (so the traffic crosses the bridge between the hosts, never the controller):

- ``call_one`` round trip: the median of ``--calls`` calls of an empty endpoint;
- throughput: ``--sends`` calls that carry a 16 MiB ``bytes`` argument, MiB/s over all of them.

Modes alternate round by round (off, on, off, on…) so drift on a shared machine hits both; the
figures are the medians over rounds, and the ratios TLS/plain. Needs root (``ip netns``).

Usage: python benchmarks/tls_bench.py [--rounds 3] [--calls 2000] [--sends 40] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "multihost"))
LISTENING = re.compile(r"regency worker listening on (tcp://\S+)")
PAYLOAD = 16 << 20


def _child(addresses: list[str], calls: int, sends: int) -> dict[str, float]:
    from regency.actor import Actor, attach_to_workers, endpoint

    class Sink(Actor):
        @endpoint
        def ping(self) -> None:
            return None

        @endpoint
        def take(self, data: bytes) -> int:
            return len(data)

    class Driver(Actor):
        @endpoint
        def measure(self, peer: Any, calls: int, sends: int) -> dict[str, float]:
            for _ in range(50):
                peer.ping.call_one().get()
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                peer.ping.call_one().get()
                times.append(time.perf_counter() - start)
            data = os.urandom(PAYLOAD)
            peer.take.call_one(data).get()
            start = time.perf_counter()
            for _ in range(sends):
                assert peer.take.call_one(data).get() == PAYLOAD
            elapsed = time.perf_counter() - start
            return {
                "rtt_us": statistics.median(times) * 1e6,
                "mib_s": sends * PAYLOAD / elapsed / (1 << 20),
            }

    hosts = attach_to_workers(addresses, timeout=60)
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    a = procs.slice(hosts=0).spawn("a", Driver)
    b = procs.slice(hosts=1).spawn("b", Sink)
    result: dict[str, float] = a.measure.call_one(b, calls, sends).get(timeout=600)
    procs.stop().get(timeout=60)
    return result


def _start_worker(cluster: Any, host: Any, secret: bytes, tls_on: bool) -> tuple[Any, str]:
    from regency.job import worker_command, worker_env

    env = {**os.environ, **worker_env(secret), "REGENCY_TLS": "1" if tls_on else "0"}
    proc = cluster.popen(
        host,
        worker_command(f"tcp://{host.ip}:0"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    found = LISTENING.search(line)
    if not found:
        raise RuntimeError(f"worker on {host.netns} printed {line!r}")
    return proc, found.group(1)


def _round(addresses: list[str], secret: bytes, tls_on: bool, args: Any) -> dict[str, float]:
    env = {**os.environ, "REGENCY_JOB_SECRET": secret.hex(), "REGENCY_TLS": "1" if tls_on else "0"}
    argv = [sys.executable, __file__, "--child", json.dumps(addresses)]
    argv += ["--calls", str(args.calls), "--sends", str(args.sends)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"controller (tls={tls_on}) failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--sends", type=int, default=40)
    parser.add_argument("--markdown", action="store_true", help="print a RESULTS.md table")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child), args.calls, args.sends)))
        return

    from netns import NetnsCluster, unavailable_reason

    reason = unavailable_reason()
    if reason:
        sys.exit(f"tls_bench needs network namespaces: {reason}")
    secret = os.urandom(32)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with NetnsCluster(2) as cluster:
        workers = {
            mode: [_start_worker(cluster, h, secret, mode) for h in cluster.hosts]
            for mode in (False, True)
        }
        try:
            for _ in range(args.rounds):
                for mode in (False, True):
                    addresses = [address for _, address in workers[mode]]
                    runs[mode].append(_round(addresses, secret, mode, args))
                    print(f"tls={'on ' if mode else 'off'} {runs[mode][-1]}", file=sys.stderr)
        finally:
            for group in workers.values():
                for proc, _ in group:
                    proc.kill()
                    proc.wait()
    fig = {
        mode: {k: statistics.median(r[k] for r in runs[mode]) for k in ("rtt_us", "mib_s")}
        for mode in (False, True)
    }
    rtt_ratio = fig[True]["rtt_us"] / fig[False]["rtt_us"]
    tput_ratio = fig[True]["mib_s"] / fig[False]["mib_s"]
    summary = {"off": fig[False], "on": fig[True], "rtt_ratio": rtt_ratio, "tput_ratio": tput_ratio}
    if args.markdown:
        print("| figure | TLS off | TLS on | on/off | target |")
        print("|---|---|---|---|---|")
        print(
            f"| call_one round trip between two netns hosts, median (µs) ↓ | "
            f"{fig[False]['rtt_us']:.0f} | {fig[True]['rtt_us']:.0f} | {rtt_ratio:.2f}x | ≤ 1.25x |"
        )
        print(
            f"| 16 MiB argument, throughput between two netns hosts (MiB/s) ↑ | "
            f"{fig[False]['mib_s']:.0f} | {fig[True]['mib_s']:.0f} | {tput_ratio:.2f}x | ≥ 0.70x |"
        )
    else:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
