"""What log forwarding costs on the call path: ``call_one`` round trips with it on and off.

One proc on this machine, spawned with ``enable_log_forwarding`` on (its stdout and stderr are
pipes its host agent reads, lines go to the controller) or off (it inherits the controller's
terminal). Each round spawns both, one after the other, and times ``call_one`` to an endpoint
that prints nothing (the cost forwarding adds to every call) and to one that prints a line per
call (what a chatty endpoint pays). The modes alternate round by round, so a busy machine moves
both alike; the figures are medians over the rounds' medians, and the ratios on / off.

Usage: python benchmarks/log_call_bench.py [--rounds 6] [--calls 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

from benchlib import median, percentile

from regency import config
from regency.actor import Actor, endpoint, this_host


class Echo(Actor):
    """A quiet endpoint and a chatty one."""

    @endpoint
    def quiet(self, i: int) -> int:
        return i

    @endpoint
    def chatty(self, i: int) -> int:
        print(f"step {i} done")
        return i


def _round_trips(call: object, calls: int) -> list[float]:
    times = []
    for i in range(calls):
        start = time.perf_counter()
        call.call_one(i).get(timeout=30)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
    return times


def measure(forwarding: bool, calls: int) -> dict[str, float]:
    """One proc with forwarding on or off: median and p99 round trip of each endpoint, in µs."""
    with config.configured(enable_log_forwarding=forwarding):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    figures: dict[str, float] = {}
    try:
        echo = procs.spawn("echo", Echo)
        _round_trips(echo.quiet, 300)  # warm up
        for name in ("quiet", "chatty"):
            times = _round_trips(getattr(echo, name), calls)
            figures[f"{name}_median_us"] = median(times) * 1e6
            figures[f"{name}_p99_us"] = percentile(times, 99) * 1e6
    finally:
        procs.stop().get(timeout=60)
    return figures


def main() -> None:
    """Alternate the modes over the rounds; print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    # The chatty endpoint's lines reach this process's fd 1 when forwarding is off (the procs
    # inherit it) and its sys.stdout when on; both go to /dev/null, away from the JSON.
    saved = os.dup(1)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        os.dup2(sink.fileno(), 1)
        try:
            for i in range(args.rounds):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                for mode in order:
                    rounds[mode].append(measure(mode == "on", args.calls))
        finally:
            os.dup2(saved, 1)
    keys = rounds["on"][0].keys()
    medians = {
        mode: {k: statistics.median(r[k] for r in rs) for k in keys} for mode, rs in rounds.items()
    }
    ratios = {k: medians["on"][k] / medians["off"][k] for k in keys}
    print(
        json.dumps(
            {
                "medians": medians,
                "on_over_off": ratios,
                "rounds": rounds,
                "load_average": os.getloadavg(),
            },
            indent=2,
        ),
    )


if __name__ == "__main__":
    main()
