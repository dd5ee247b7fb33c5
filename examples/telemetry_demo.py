"""Telemetry: spans and metrics of a small training loop, then the question "which endpoint was
slowest in the last minute?" answered by the local recorder.

    python examples/telemetry_demo.py
    regency telemetry sql "SELECT ..."      # the queries of docs/introspection.md

Every call is traced here (``telemetry_traces_per_s`` raised from its default of 100 per
process), so each step's trace holds the calls it made.
"""

from __future__ import annotations

import time

from regency import config
from regency.actor import Actor, endpoint, get_meter, span, this_host
from regency.observe.telemetry import enable_telemetry, flush, run_sql


class Trainer(Actor):
    """Trains (a little slowly) and checkpoints (much more slowly)."""

    def __init__(self) -> None:
        self.samples = get_meter().create_counter("demo.samples")

    @endpoint
    def train_step(self, step: int) -> float:
        with span("forward+backward"):
            time.sleep(0.01)
        self.samples.add(32)
        return 1.0 / (1 + step)

    @endpoint
    def checkpoint(self) -> None:
        time.sleep(0.25)


def main() -> None:
    config.configure(telemetry_traces_per_s=1000.0)
    enable_telemetry()
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainers = procs.spawn("trainers", Trainer)
    for step in range(20):
        with span("step"):
            trainers.train_step.call(step).get()
    trainers.checkpoint.call().get()
    procs.stop().get()  # the procs send what they still hold as they stop
    flush()  # and this controller records what it holds now
    _, rows = run_sql(
        "SELECT endpoint, SUM(count), ROUND(MAX(max), 1) FROM metrics "
        "WHERE name = 'regency.call.duration' GROUP BY endpoint ORDER BY 3 DESC"
    )
    for endpoint_name, calls, slowest in rows:
        print(f"{endpoint_name}: {calls} calls, slowest {slowest} ms")


if __name__ == "__main__":
    main()
