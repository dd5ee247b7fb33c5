"""Where a large ``bytes`` argument's time goes, per call (issue 17, target 7).

Spawns one proc with a sink actor and sends it ``--calls`` ``bytes`` of ``--mib`` MiB (after
one warm-up), then reports per call: the controller's wall time and CPU time, and the proc's
CPU time and minor page faults (``getrusage`` inside the proc, all its threads; a minor fault
is a page touched for the first time since it was mapped). With ``--pyspy DIR`` it also records
the proc with py-spy (``--native``, every thread) into ``DIR/bytes-<mib>mib.svg``; py-spy then
pauses the proc for every sample, so take the times from a run without it.

Run it with a tree's ``src`` first on ``PYTHONPATH`` to profile that tree:

    PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/profile_bytes.py --pyspy /tmp/a
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def usage() -> tuple[float, int]:
    """This process's CPU seconds (all threads) and minor faults so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_minflt


def main() -> None:
    """Parse the command line, run the calls, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--pyspy", type=Path, help="record the proc with py-spy into this folder")
    args = parser.parse_args()
    from regency.actor import Actor, endpoint, this_host

    class Sink(Actor):
        @endpoint
        def take(self, value: Any) -> int:
            return len(value)

        @endpoint
        def usage(self) -> tuple[int, float, int]:
            return (os.getpid(), *usage())

    nbytes = args.mib << 20
    data = os.urandom(nbytes)
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        sink = procs.spawn("sink", Sink)
        assert sink.take.call_one(data).get(timeout=120) == nbytes  # warm-up
        pid, proc_cpu, proc_faults = sink.usage.call_one().get(timeout=60)
        recorder = None
        pyspy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        if args.pyspy and pyspy:
            args.pyspy.mkdir(parents=True, exist_ok=True)
            svg = args.pyspy / f"bytes-{args.mib}mib.svg"
            command = [pyspy, "record", "--pid", str(pid), "--native", "--threads"]
            command += ["--rate", "500", "--output", str(svg), "--format", "flamegraph"]
            recorder = subprocess.Popen(
                command,  # --native samples pause the proc: time the calls without --pyspy
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attaches
        my_cpu, _ = usage()
        start = time.perf_counter()
        for _ in range(args.calls):
            assert sink.take.call_one(data).get(timeout=120) == nbytes
        wall = time.perf_counter() - start
        mine = usage()[0] - my_cpu
        _, cpu_after, faults_after = sink.usage.call_one().get(timeout=60)
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            recorder.wait(timeout=60)
    finally:
        procs.stop().get(timeout=60)
    per = 1e3 / args.calls
    print(
        json.dumps(
            {
                "mib": args.mib,
                "calls": args.calls,
                "wall_ms_per_call": wall * per,
                "gbps": nbytes * args.calls / wall / 1e9,
                "controller_cpu_ms_per_call": mine * per,
                "proc_cpu_ms_per_call": (cpu_after - proc_cpu) * per,
                "proc_minor_faults_per_call": (faults_after - proc_faults) / args.calls,
                "pages_per_value": nbytes // resource.getpagesize(),
                "load_average": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
