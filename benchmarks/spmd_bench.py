"""SPMD benchmarks: regency.spmd next to torch.multiprocessing + gloo and torchrun, same run.

Figures (2 ranks, gloo, the MLP of ``spmd_work.py``, one torch thread per rank):

* ``per_step``: seconds per DDP step with the loop inside an actor, and with one endpoint call
  per step from the controller, next to a ``torch.multiprocessing.spawn`` baseline.
* ``first_step``: from starting the command to rank 0's first finished step,
  ``regency run`` (with and without the torch preload) next to ``torchrun --standalone``.
* ``recovery``: from SIGKILL of rank 1 to rank 0's first step after the restart,
  ``examples/ddp_train.py`` (one_for_all) next to ``torchrun --max-restarts 1`` (with
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: see ``TORCHRUN_ENV``).
* ``call_cost`` (not in the default set): per call to both ranks, of a noop endpoint and of the
  step, the seconds, each rank's CPU seconds, the CPU seconds of the controller's calling
  thread and the voluntary context switches of each regency thread of the ranks and the
  controller (the actor's, the I/O loop's, the main thread): counts of wake-ups that the
  machine's load hardly moves.

Configurations alternate within each round (short per-step trials, in a rotating order) and the
medians are reported, since other work on the machine moves every figure. ``--write-results``
puts the table into ``RESULTS.md`` (between the ``spmd-bench`` markers).

    .venv/bin/python benchmarks/spmd_bench.py --rounds 3 --write-results
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import spmd_work  # noqa: E402

from regency.spmd import TORCH_PRELOAD  # noqa: E402

PY = sys.executable
WORK = str(HERE / "spmd_work.py")
EXAMPLE = str(ROOT / "examples" / "ddp_train.py")
MARK_START, MARK_END = "<!-- spmd-bench:start -->", "<!-- spmd-bench:end -->"


def _bin(name: str) -> str:
    return str(Path(PY).parent / name)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- per-step --------------------------------------------------------------------------------


class Baseline:
    """Two ``torch.multiprocessing`` workers (spawned) that time steps on request."""

    def __init__(self) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.commands = [ctx.SimpleQueue(), ctx.SimpleQueue()]
        self.out = ctx.SimpleQueue()
        self.workers = mp.start_processes(
            spmd_work.mp_worker,
            args=(2, _free_port(), self.commands, self.out),
            nprocs=2,
            join=False,
            start_method="spawn",
        )
        for _ in range(2):
            self.out.get()

    def timed(self, warmup: int, steps: int) -> float:
        for queue in self.commands:
            queue.put((warmup, steps))
        return float(self.out.get())

    def close(self) -> None:
        for queue in self.commands:
            queue.put(None)
        self.workers.join()


class Gang:
    """Two regency procs with torchrun's environment and a ``spmd_work.Trainer`` actor each."""

    def __init__(self) -> None:
        from regency.actor import Actor, endpoint, this_host
        from regency.spmd import setup_torch_elastic_env

        class Bench(Actor):
            def __init__(self) -> None:
                self.trainer: Any = None

            @endpoint
            def init(self) -> None:
                self.trainer = spmd_work.Trainer()

            @endpoint
            def loop(self, warmup: int, steps: int) -> float:
                return float(self.trainer.timed(warmup, steps))

            @endpoint
            def step(self) -> float:
                return float(self.trainer.step())

            @endpoint
            def noop(self) -> None:
                pass

            @endpoint
            def usage(self) -> dict[str, float]:
                used = resource.getrusage(resource.RUSAGE_SELF)
                return {"cpu": used.ru_utime + used.ru_stime, **thread_switches()}

            @endpoint
            def close(self) -> None:
                self.trainer.close()

        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        setup_torch_elastic_env(self.procs)
        self.bench = self.procs.spawn("bench", Bench)
        self.bench.init.call().get(timeout=300)

    def loop(self, warmup: int, steps: int) -> float:
        """Seconds per step with the loop inside the actors."""
        return float(self.bench.loop.call(warmup, steps).get(timeout=300).item(gpus=0))

    def per_call(self, warmup: int, steps: int) -> float:
        """Seconds per step with one endpoint call (to both ranks) per step."""
        for _ in range(warmup):
            self.bench.step.call().get(timeout=60)
        began = time.perf_counter()
        for _ in range(steps):
            self.bench.step.call().get(timeout=60)
        return (time.perf_counter() - began) / steps

    def call_cost(self, endpoint: str, calls: int) -> dict[str, float]:
        """Per call of ``endpoint``: ``call`` seconds; ``rank_cpu`` seconds and the voluntary
        context switches of each thread (``rank_*``: the mean of the ranks; ``controller_*``:
        the controller's) as :func:`thread_switches` names them; ``controller_cpu``, the
        seconds of the calling thread."""
        call = getattr(self.bench, endpoint).call
        before = list(self.bench.usage.call().get(timeout=60).values())
        ours = thread_switches()
        began = time.perf_counter()
        for _ in range(calls):
            call().get(timeout=60)
        took = time.perf_counter() - began
        ours = {k: v - ours.get(k, 0) for k, v in thread_switches().items()}
        after = list(self.bench.usage.call().get(timeout=60).values())
        cost = {"call": took}
        pairs = list(zip(after, before, strict=True))
        for key in after[0]:
            cost[f"rank_{key}"] = statistics.fmean(a[key] - b[key] for a, b in pairs)
        cost.update({f"controller_{k}": v for k, v in ours.items()})
        return {k: v / calls for k, v in cost.items()}

    def close(self) -> None:
        self.bench.close.call().get(timeout=60)
        self.procs.stop().get(timeout=60)


def thread_switches() -> dict[str, float]:
    """This process's voluntary context switches per regency thread (``io``, the I/O loop;
    ``actor``, the bench actor's thread; ``main``) and the calling thread's CPU seconds
    (``thread_cpu``): counts of wake-ups that the machine's load hardly moves."""
    names = {"regency-io": "io", "regency-actor-bench": "actor", "MainThread": "main"}
    found: dict[str, float] = {}
    for thread in threading.enumerate():
        name = names.get(thread.name)
        if name is None:
            continue
        with contextlib.suppress(OSError):
            status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
            found[f"{name}_switches"] = float(
                status.split("voluntary_ctxt_switches:")[1].split()[0]
            )
    found["thread_cpu"] = time.thread_time()
    return found


# -- start to first step ---------------------------------------------------------------------


def _first_step(cmd: list[str], env: dict[str, str] | None = None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        mark = Path(tmp) / "first"
        began = time.time()
        done = subprocess.run(
            [*cmd, WORK, "--first-step", str(mark)],
            cwd=HERE,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0 or not mark.exists():
            raise RuntimeError(f"{cmd} failed ({done.returncode}): {done.stderr[-2000:]}")
        return float(mark.read_text()) - began


def torchrun_first_step() -> float:
    return _first_step([_bin("torchrun"), "--standalone", "--nproc-per-node", "2"])


def regency_first_step(preload: str) -> float:
    return _first_step(
        [_bin("regency"), "run", "--nproc-per-node", "2", "--preload", preload],
        env={"REGENCY_ZYGOTE_PRELOAD": preload},
    )


# -- kill to training again ------------------------------------------------------------------

# torchrun (torch 2.13, c10d rendezvous) shares its agent's TCPStore with the workers and keeps
# it across restarts, and the workers' process group keys carry no attempt prefix: a restarted
# rank may read the killed attempt's gloo addresses (connectFullMesh refused) unless its peers
# wrote theirs first. Without sharing, each attempt's rank 0 hosts a fresh store, as before
# torch 2.5 (pytorch/pytorch#135712).
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
TRAIN = ["--epochs", "3", "--samples", "512", "--batch", "16", "--ckpt-every", "4"]
KILL_AT = 8


def _rank_pid(root: int, rank: str) -> int | None:
    """The pid of the process below ``root`` whose environment has ``RANK=rank``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if f"RANK={rank}".encode() not in env or b"TORCHELASTIC_RUN_ID" not in b" ".join(env):
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == root or _is_below(ppid, root):
            return int(entry)
    return None


def _is_below(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def torchrun_recovery() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, first = Path(tmp) / "ckpt.pt", Path(tmp) / "first"
        cmd = [
            _bin("torchrun"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
            EXAMPLE, "--train", *TRAIN, "--checkpoint", str(ckpt), "--first-step-file",
            str(first), "--step-delay", "0.01",
        ]  # fmt: skip
        log = open(Path(tmp) / "torchrun.log", "w")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=log, start_new_session=True, env={**os.environ, **TORCHRUN_ENV}
        )
        try:
            step_file = Path(f"{ckpt}.step")
            deadline = time.time() + 240
            while time.time() < deadline:
                try:
                    if int(step_file.read_text() or 0) >= KILL_AT:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.005)
            victim = _rank_pid(proc.pid, "1")
            if victim is None:
                raise RuntimeError("torchrun's rank 1 not found")
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            while time.time() < deadline:
                try:
                    again = float(first.read_text())
                    if again > killed:
                        return again - killed
                except (OSError, ValueError):
                    pass
                if proc.poll() is not None:
                    kept = Path(tempfile.gettempdir()) / f"spmd_bench_torchrun_{proc.pid}.log"
                    shutil.copy(Path(tmp) / "torchrun.log", kept)  # the whole log, kept
                    tail = kept.read_text()[-1500:]
                    raise RuntimeError(
                        f"torchrun ended ({proc.returncode}) without training (log: {kept}): {tail}"
                    )
                time.sleep(0.005)
            raise RuntimeError("torchrun did not train again within the deadline")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()


def regency_recovery(preload: str) -> float:
    done = subprocess.run(
        [PY, EXAMPLE, "--nproc", "2", "--kill-at", str(KILL_AT), *TRAIN, "--step-delay", "0.01"],
        env={**os.environ, "REGENCY_ZYGOTE_PRELOAD": preload},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    for line in done.stdout.splitlines():
        if "finished its first step again" in line:
            return float(line.split("t=")[1].split("]")[0])
    raise RuntimeError(f"no recovery line ({done.returncode}): {done.stdout[-1500:]}")


# -- driver ----------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def run(
    rounds: int, warmup: int, steps: int, figures: set[str], trials: int = 40
) -> dict[str, Any]:
    raw: dict[str, list[float]] = {}
    errors: list[str] = []

    def add(key: str, value: float) -> None:
        raw.setdefault(key, []).append(value)
        print(f"  {key}: {value:.6g}", file=sys.stderr, flush=True)

    def measure(key: str, fn: Any, *args: Any) -> None:
        try:
            add(key, fn(*args))
        except Exception as exc:  # one failed trial is reported, the run goes on
            errors.append(f"{key}: {exc}")
            print(f"  {key} FAILED: {exc}", file=sys.stderr, flush=True)

    for r in range(rounds):
        print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        if "per_step" in figures:
            # Both gangs stay up; short trials alternate, in a rotating order, so drifting
            # load hits all three alike.
            baseline, gang = Baseline(), Gang()
            try:
                for trial in range(trials):
                    kinds = [
                        ("mp", baseline.timed),
                        ("loop", gang.loop),
                        ("call", gang.per_call),
                    ]
                    times = {}
                    for kind, fn in kinds[trial % 3 :] + kinds[: trial % 3]:
                        times[kind] = fn(warmup, steps)
                    mp_s, loop_s, call_s = times["mp"], times["loop"], times["call"]
                    add("mp_step_s", mp_s)
                    add("actor_loop_step_s", loop_s)
                    add("actor_call_step_s", call_s)
                    add("loop_ratio", loop_s / mp_s)
                    add("call_ratio", call_s / mp_s)
            finally:
                baseline.close()
                gang.close()
        if "call_cost" in figures:
            gang = Gang()
            try:
                for _ in range(trials):
                    for endpoint in ("noop", "step"):
                        for key, value in gang.call_cost(endpoint, steps).items():
                            add(f"{endpoint}_{key}", value)
            finally:
                gang.close()
        if "first_step" in figures:
            measure("torchrun_first_s", torchrun_first_step)
            measure("regency_first_s", regency_first_step, TORCH_PRELOAD)
            measure("regency_first_cold_s", regency_first_step, "")
        if "recovery" in figures:
            measure("torchrun_recovery_s", torchrun_recovery)
            measure("regency_recovery_s", regency_recovery, TORCH_PRELOAD)
            measure("regency_recovery_cold_s", regency_recovery, "")
    med = {k: _median(v) for k, v in raw.items()}
    ratios = {}
    if "mp_step_s" in med:
        # The median of the ratios of adjacent trials.
        ratios["actor_loop_vs_mp"] = med["loop_ratio"]
        ratios["actor_call_vs_mp"] = med["call_ratio"]
    if "torchrun_first_s" in med and "regency_first_s" in med:
        ratios["first_step_vs_torchrun"] = med["regency_first_s"] / med["torchrun_first_s"]
        if "regency_first_cold_s" in med:
            ratios["first_step_cold_vs_torchrun"] = (
                med["regency_first_cold_s"] / med["torchrun_first_s"]
            )
    if "torchrun_recovery_s" in med and "regency_recovery_s" in med:
        ratios["recovery_vs_torchrun"] = med["regency_recovery_s"] / med["torchrun_recovery_s"]
        if "regency_recovery_cold_s" in med:
            ratios["recovery_cold_vs_torchrun"] = (
                med["regency_recovery_cold_s"] / med["torchrun_recovery_s"]
            )
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": rounds,
        "warmup": warmup,
        "steps": steps,
        "trials": trials,
        "load_avg": os.getloadavg(),
        "raw": raw,
        "median": med,
        "ratios": ratios,
        "errors": errors,
    }


def render(doc: dict[str, Any]) -> str:
    m, q = doc["median"], doc["ratios"]

    def row(name: str, key: str, peer: str, ratio: str, target: str) -> str:
        if key not in m or peer not in m or ratio not in q:
            return ""
        return (
            f"| {name} | {m[key] * 1e3:.1f} ms | {m[peer] * 1e3:.1f} ms | "
            f"**{q[ratio]:.2f}x** | {target} |\n"
        )

    lines = (
        f"## SPMD (`benchmarks/spmd_bench.py`)\n\n"
        f"Run {doc['date']}, {doc['rounds']} rounds (configurations alternating; medians), "
        f"load average at the end {doc['load_avg'][0]:.2f}. 2 ranks, gloo, one torch thread "
        f"per rank, the MLP of `spmd_work.py` ({spmd_work.WIDTH}-wide, batch "
        f"{spmd_work.BATCH}); per-step figures: {doc.get('trials', 40)} trials per round of "
        f"{doc['steps']} steps after {doc['warmup']} warm-up steps, the three configurations "
        "alternating in a rotating order; the ratios are medians of the ratios within a trial."
        "\n\n"
        "| figure | regency | peer | ratio | target |\n|---|---|---|---|---|\n"
        + row("DDP step, loop inside the actor", "actor_loop_step_s", "mp_step_s",
              "actor_loop_vs_mp", "≤ 1.05x torch.multiprocessing")
        + row("DDP step, one endpoint call per step", "actor_call_step_s", "mp_step_s",
              "actor_call_vs_mp", "≤ 1.2x")
        + row("start to first step, `regency run` (torch preloaded)", "regency_first_s",
              "torchrun_first_s", "first_step_vs_torchrun", "≤ 0.5x `torchrun --standalone`")
        + row("start to first step, `regency run --preload ''`", "regency_first_cold_s",
              "torchrun_first_s", "first_step_cold_vs_torchrun", "—")
        + row("SIGKILL of rank 1 to training again (torch preloaded)", "regency_recovery_s",
              "torchrun_recovery_s", "recovery_vs_torchrun",
              "next to `torchrun --max-restarts 1` (unshared store, see below)")
        + row("SIGKILL of rank 1 to training again, cold procs", "regency_recovery_cold_s",
              "torchrun_recovery_s", "recovery_cold_vs_torchrun", "—")
    )  # fmt: skip
    return lines


def write_results(section: str, path: Path) -> None:
    text = path.read_text() if path.exists() else ""
    block = f"{MARK_START}\n{section}{MARK_END}\n"
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        tail = rest.split(MARK_END, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=25, help="steps per per-step trial")
    parser.add_argument("--trials", type=int, default=40, help="alternating trials per round")
    parser.add_argument("--figures", default="per_step,first_step,recovery")
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    doc = run(args.rounds, args.warmup, args.steps, set(args.figures.split(",")), args.trials)
    print(json.dumps(doc, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.write_results:
        write_results(render(doc), HERE / "RESULTS.md")


if __name__ == "__main__":
    main()
