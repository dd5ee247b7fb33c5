"""Telemetry's cost: call_one round trip and broadcast rate with telemetry off, with the local
recorder on, and with OTLP export on, alternated in one run (one controller, the same 4 procs).

Each round measures the three modes in turn: ``off`` (``disable_telemetry()``), ``recorder``
(``enable_telemetry()``: spans within the default budget of 100 new traces per second, metrics
of every message, the SQLite recorder) and ``otlp`` (the same, plus OTLP/HTTP export to a
receiver in another process that decodes nothing and answers 200). Per mode and round: the
median and p99 of 2,000 ``call_one`` round trips to one actor (200 warm-up calls first), and
the rate of 10,000 broadcasts to 4 actors followed by one call. Reported: each mode's median
over the rounds and its ratio to ``off``.

    python benchmarks/telemetry_bench.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from regency import config
from regency.actor import Actor, endpoint, this_host
from regency.observe.telemetry import disable_telemetry, enable_telemetry

_RECEIVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""
CALLS, WARMUP, BROADCASTS = 2000, 200, 10_000


class Bench(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def incr(self) -> None:
        self.count += 1

    @endpoint
    def total(self) -> int:
        return self.count

    @endpoint
    def pid(self) -> int:
        return os.getpid()


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _switch(mode: str, otlp_url: str) -> None:
    disable_telemetry()
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if mode == "otlp":
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_url
    if mode != "off":
        enable_telemetry()


def _measure(mesh: Any, pids: list[int], calls: int, broadcasts: int) -> dict[str, float]:
    one = mesh.slice(gpus=0)
    for _ in range(WARMUP):
        one.ping.call_one().get()
    samples = []
    cpu = _cpu(pids)
    for _ in range(calls):
        start = time.perf_counter()
        one.ping.call_one().get()
        samples.append(time.perf_counter() - start)
    call_cpu = _cpu(pids) - cpu
    samples.sort()
    before = sum(mesh.total.call().get().values())
    cpu = _cpu(pids)
    start = time.perf_counter()
    for _ in range(broadcasts):
        mesh.incr.broadcast()
    after = sum(mesh.total.call().get().values())
    elapsed = time.perf_counter() - start
    broadcast_cpu = _cpu(pids) - cpu
    assert after - before == 4 * broadcasts
    return {
        "call_one_median_us": samples[len(samples) // 2] * 1e6,
        "call_one_p99_us": samples[int(len(samples) * 0.99) - 1] * 1e6,
        "call_one_cpu_us": call_cpu / calls * 1e6,
        "broadcasts_per_s": broadcasts / elapsed,
        "broadcast_cpu_us": broadcast_cpu / broadcasts * 1e6,
    }


def _per_op(fn: Any, n: int = 200_000) -> float:
    """µs per call of ``fn(i)``, the best of three runs of ``n``."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def micro() -> dict[str, float]:
    """What the hooks and the collector add per message, timed in tight loops (less noisy than
    the wall-clock rates on a shared machine)."""
    from regency._lowlevel import Pending, tracing
    from regency.observe.telemetry.collector import Collector, identity

    probe = tracing.Probe(traces_per_s=0.0, tracing=True)  # untraced: the common case

    def cast(_: int) -> None:
        start, trace = probe.begin(False)
        probe.sent("bench.incr", start, trace, 500, 4, None, False)

    def call(_: int) -> None:
        start, trace = probe.begin(True)
        pending = Pending()
        probe.sent("bench.ping", start, trace, 500, 1, pending, False)
        pending.set_result(0)

    class Core:
        name, stopped, failed = "bench", False, None

    core = Core()

    def reply_only(_: int) -> None:  # what a call costs anyway: its pending and its reply
        Pending().set_result(0)

    costs = {
        "sender, per cast": _per_op(cast),
        "sender, per call (with its reply)": _per_op(call) - _per_op(reply_only),
        "receiver, per message": _per_op(lambda _: probe.count(core, "incr", False)),
    }
    records = list(probe.records)
    collector = Collector(probe, lambda batch: None, identity("bench", "bench"))
    start = time.perf_counter()
    collector._convert(records, 0.0, 1.0)
    costs["collector, per call or cast"] = (time.perf_counter() - start) / len(records) * 1e6
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--broadcasts", type=int, default=BROADCASTS)
    parser.add_argument("--modes", default="off,recorder,otlp")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout is not None
        url = f"http://127.0.0.1:{receiver.stdout.readline().strip()}"
        with tempfile.TemporaryDirectory() as scratch:
            config.configure(telemetry_db=str(Path(scratch) / "bench.db"))
            procs = this_host().spawn_procs(per_host={"gpus": 4})
            mesh = procs.spawn("bench", Bench)
            mesh.ping.call().get()
            pids = [os.getpid(), *mesh.pid.call().get().values()]
            modes = tuple(args.modes.split(","))
            results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for n in range(args.rounds):
                for mode in modes:
                    _switch(mode, url)
                    time.sleep(0.5)  # the procs follow by control message
                    results[mode].append(_measure(mesh, pids, args.calls, args.broadcasts))
                    print(f"round {n + 1} {mode:8s} {results[mode][-1]}", flush=True)
            _switch("off", url)
            procs.stop().get()
    finally:
        receiver.kill()
        receiver.wait()
    summary: dict[str, dict[str, float]] = {}
    for mode in modes:
        summary[mode] = {
            key: statistics.median(r[key] for r in results[mode]) for key in results[mode][0]
        }
    print(f"\nload average at the end: {os.getloadavg()}")
    base = summary["off"]
    print(
        f"{'mode':9s} {'call_one µs':>11s} {'p99 µs':>8s} {'CPU µs':>7s} {'bcast/s':>8s} "
        f"{'CPU µs':>7s}   round trip, CPU/call, bcast time, CPU/bcast vs off"
    )
    for mode in modes:
        s = summary[mode]
        ratios = ", ".join(
            f"{s[k] / base[k]:.2f}x" if k != "broadcasts_per_s" else f"{base[k] / s[k]:.2f}x"
            for k in (
                "call_one_median_us",
                "call_one_cpu_us",
                "broadcasts_per_s",
                "broadcast_cpu_us",
            )
        )
        print(
            f"{mode:9s} {s['call_one_median_us']:11.1f} {s['call_one_p99_us']:8.1f} "
            f"{s['call_one_cpu_us']:7.1f} {s['broadcasts_per_s']:8.0f} {s['broadcast_cpu_us']:7.1f}"
            f"   {ratios}"
        )
    costs = micro()
    print("\nadded CPU per message with telemetry on (untraced), tight loops:")
    for what, us in costs.items():
        print(f"  {what:36s} {us:6.2f} µs")
    if args.json is not None:
        document = {"rounds": results, "summary": summary, "micro_us": costs}
        args.json.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
