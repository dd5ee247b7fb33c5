"""Where a ``call_one`` round trip's time goes, on the controller and on the proc (issue 17,
target 7).

One proc with a ``ping`` actor; after a warm-up, ``--calls`` sequential
``mesh.ping.call_one().get()``:

- *CPU per call* of every thread of the controller and of the proc (``/proc/PID/task/*/
  schedstat``), and each thread's voluntary context switches per call (wake-ups);
- *system calls per call* on each side (``perf stat`` on the ``syscalls:sys_enter_*``
  tracepoints of both processes' threads), when ``perf`` is there and allowed;
- *Python bytecodes per call* on each side by stage, counted with ``sys.settrace`` opcode
  events on the calling thread and on the actor's thread (deterministic, unlike times on a
  shared machine; the proc's I/O thread is idle here, its actor thread reads inline).

The stages group functions by the job they do (``STAGES``); bytecodes say how much Python runs,
the CPU figures what it costs. Run it once per source tree (``PYTHONPATH=tree/src``) to compare.

``--plain`` runs the timed calls alone, for a sampling profiler around it (the flame graphs in
``benchmarks/profiles/issue17-call-one-*.svg``)::

    py-spy record --subprocesses --nonblocking --rate 1000 --format flamegraph -o out.svg -- \
        .venv/bin/python benchmarks/call_profile.py --plain --calls 20000

``--pipelined`` instead issues ``--calls`` calls without waiting, then takes every value, five
times: the rate, the calling thread's CPU per call in each phase (``time.thread_time``) and
every thread's CPU per call on each side (where the controller's GIL-bound time goes).

Usage: .venv/bin/python benchmarks/call_profile.py [--calls 3000] [--json out.json]
[--plain | --pipelined]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regency.actor import Actor, endpoint, this_host

SYSCALLS = ("sendmsg", "recvfrom", "poll", "epoll_wait", "epoll_ctl", "read", "write", "futex")
# Function name (co_qualname) prefixes of each stage, first match wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "wait: inline reading, wake-ups",
        (
            "wait_pending",
            "wait_until",
            "IOLoop.",
            "Turn.",
            "_Poller",
            "thread_waker",
            "thread_eventfd",
            "waker",
            "Waker.",
            "Pending.add_done_callback",
            "Pending.done",
            "Pending.is_done",
            "FrameRouter.flush",
            "FrameRouter._flush",
            "Transport.flush",
            "existing",
            "SyncExecutor._idle_until",
            "SyncExecutor._has_queued",
            "SyncExecutor._release_turn",
            "SyncExecutor._before_reply",
            "FrameRouter.posts",
            "claim_reading",
            "release_reading",
            "suppress.",
            "current_thread",
            "Condition.",
        ),
    ),
    (
        "read: socket to frames",
        ("reading.", "FrameReader.", "decode", "__create_fn__"),
    ),
    (
        "route: frame to mailbox or port, ordering",
        (
            "FrameRouter._on_frame",
            "FrameRouter._deliver_local",
            "FrameRouter.mailbox",
            "Mailbox.",
            "SyncExecutor._post_sync",
            "OnceReply.deliver",
            "Pending.set_raw",
            "Pending._finish",
            "FrameRouter.close_port",
            "Losses.unwatch",
        ),
    ),
    (
        "send: router and transport, to the socket",
        (
            "FrameRouter.send_actor",
            "FrameRouter.post_actor",
            "FrameRouter._send_actor",
            "FrameRouter.send_port",
            "FrameRouter._send_port",
            "Transport.post",
            "Transport._mark_dirty",
            "Connection.",
            "Losses.check_alive",
            "buffers_size",
            "own_copies",
        ),
    ),
    (
        "frame: header and part table",
        ("Encoder.", "encode", "_nbytes", "_table", "one_part", "two_parts"),
    ),
    (
        "pickle: envelope, arguments, value",
        (
            "dumps",
            "loads",
            "_is_plain",
            "Pending._materialize",
            "Pending.outcome",
            "ActorCore._open",
            "namedtuple",
        ),
    ),
    (
        "call: adverb, reply port, sequence, future",
        (
            "Endpoint.",
            "ArgumentCheck.",
            "ActorMesh.",
            "SendPipeline.",
            "OnceReply.",
            "Pending.__init__",
            "FrameRouter.open_port",
            "PortRef",
            "Losses.watch",
            "InstanceBase.next_seq",
            "current_instance",
            "current_or_none",
            "client",
            "runtime",
            "Future.",
            "<lambda>",
        ),
    ),
    (
        "actor: run the endpoint, settle",
        (
            "SyncExecutor.",
            "ActorCore.",
            "Context.",
            "set_current",
            "endpoint_finished",
            "Point.",
            "Pinger.",
        ),
    ),
)


class Counter:
    """Counts bytecodes per function on the thread it traces."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()

    def trace(self, frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            self.ops[frame.f_code.co_qualname] += 1
        return self.trace


def by_stage(ops: dict[str, int], calls: int) -> dict[str, float]:
    """Bytecodes per call of each stage (and of what no stage claims)."""
    out: dict[str, float] = collections.defaultdict(float)
    for name, count in ops.items():
        stage = next(
            (label for label, prefixes in STAGES if name.startswith(prefixes)), "other: " + name
        )
        out[stage] += count / calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class Pinger(Actor):
    """The cheapest endpoint, and a bytecode counter on the actor's own thread."""

    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def count(self, on: bool) -> dict[str, int] | None:
        if on:
            self.counter = Counter()
            sys.settrace(self.counter.trace)
            return None
        sys.settrace(None)
        return dict(self.counter.ops)


def threads(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread of ``pid``: (CPU ns so far, voluntary context switches so far)."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            cpu = int(Path(f"{task}/schedstat").read_text().split()[0])
            status = Path(f"{task}/status").read_text()
        except OSError:
            continue
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[task.rsplit("/", 1)[1]] = (cpu, switches)
    return out


def cpu_us_per_call(before: dict[str, tuple[int, int]], pid: int, calls: int) -> float:
    """CPU µs per call that ``pid``'s threads spent since ``before`` (a :func:`threads`)."""
    spent = 0
    for tid, (cpu, _) in threads(pid).items():
        spent += cpu - before.get(tid, (0, 0))[0]
    return spent / calls / 1e3


def pipelined(ping: Any, n: int, me: int, proc_pid: int) -> dict[str, float]:
    """``n`` calls issued, then their values taken: rate and CPU per call."""
    controller, proc = threads(me), threads(proc_pid)
    start, cpu_start = time.perf_counter(), time.thread_time()
    futures = [ping.call_one() for _ in range(n)]
    sent, cpu_sent = time.perf_counter(), time.thread_time()
    futures_per_s = n / (sent - start)
    for future in futures:
        future.get()
    done, cpu_done = time.perf_counter(), time.thread_time()
    return {
        "calls_per_s": n / (done - start),
        "issued_per_s": futures_per_s,
        "caller_cpu_us_sending": (cpu_sent - cpu_start) / n * 1e6,
        "caller_cpu_us_taking": (cpu_done - cpu_sent) / n * 1e6,
        "controller_cpu_us": cpu_us_per_call(controller, me, n),
        "proc_cpu_us": cpu_us_per_call(proc, proc_pid, n),
    }


def perf_syscalls(pids: list[int]) -> subprocess.Popen[str] | None:
    """``perf stat`` counting system calls of every thread of ``pids`` (None without perf)."""
    tids = [t.rsplit("/", 1)[1] for p in pids for t in glob.glob(f"/proc/{p}/task/*")]
    events = ",".join(f"syscalls:sys_enter_{s}" for s in SYSCALLS)
    try:
        proc = subprocess.Popen(
            ["perf", "stat", "--per-thread", "-x", ",", "-e", events, "-t", ",".join(tids)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return None
    time.sleep(0.5)  # let perf attach
    return proc if proc.poll() is None else None


def main() -> None:
    """Run the profile and print (or write) its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--plain", action="store_true", help="only the timed calls")
    parser.add_argument("--pipelined", action="store_true", help="calls issued, then gathered")
    args = parser.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("pinger", Pinger)
    proc_pid = mesh.pid.call_one().get()
    me = os.getpid()
    for _ in range(500):
        mesh.ping.call_one().get()
    n = args.calls
    result: dict[str, Any] = {"calls": n}

    def loop() -> list[float]:
        times = []
        for _ in range(n):
            begin = time.perf_counter()
            mesh.ping.call_one().get()
            times.append(time.perf_counter() - begin)
        return sorted(times)

    if args.pipelined:
        result["runs"] = [pipelined(mesh.ping, n, me, proc_pid) for _ in range(5)]
        procs.stop().get()
        print(json.dumps(result, indent=1))
        return
    if args.plain:
        times = loop()
        print(f"median {times[n // 2] * 1e6:.0f} us, p99 {times[int(n * 0.99)] * 1e6:.0f} us")
        procs.stop().get()
        return
    before = {"controller": threads(me), "proc": threads(proc_pid)}
    times = loop()
    after = {"controller": threads(me), "proc": threads(proc_pid)}
    result["median_us"] = times[n // 2] * 1e6
    result["p99_us"] = times[int(n * 0.99)] * 1e6
    for side in ("controller", "proc"):
        per = []
        for tid, (cpu, switches) in after[side].items():
            cpu0, switches0 = before[side].get(tid, (0, 0))
            per.append(((cpu - cpu0) / n / 1e3, (switches - switches0) / n))
        per.sort(reverse=True)
        result[f"{side}_cpu_us"] = sum(c for c, _ in per)
        result[f"{side}_wakeups"] = sum(s for _, s in per)
        result[f"{side}_threads"] = [[round(c, 1), round(s, 2)] for c, s in per if c > 0.3]

    counting = perf_syscalls([me, proc_pid])
    if counting is not None:
        loop()
        counting.send_signal(signal.SIGINT)
        _, err = counting.communicate()
        calls: dict[str, dict[str, float]] = {"controller": {}, "proc": {}}
        tids = {side: set(after[side]) for side in calls}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) < 4 or not fields[1].strip().isdigit():
                continue
            tid = fields[0].rsplit("-", 1)[-1]
            name = fields[3].removeprefix("syscalls:sys_enter_")
            for side, counts in calls.items():
                if tid in tids[side]:
                    counts[name] = counts.get(name, 0) + int(fields[1]) / n
        result["syscalls"] = calls

    traced = 300
    mesh.count.call_one(True).get()
    counter = Counter()
    sys.settrace(counter.trace)
    for _ in range(traced):
        mesh.ping.call_one().get()
    sys.settrace(None)
    proc_ops = mesh.count.call_one(False).get() or {}
    result["bytecodes"] = {
        "controller": round(sum(counter.ops.values()) / traced),
        "proc": round(sum(proc_ops.values()) / traced),
    }
    result["stages"] = {
        "controller": by_stage(dict(counter.ops), traced),
        "proc": by_stage(proc_ops, traced),
    }
    result["load_average"] = os.getloadavg()[0]
    procs.stop().get()
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text)
    print(text)


if __name__ == "__main__":
    main()
