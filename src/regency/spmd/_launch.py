"""``regency run``: torchrun for a user who has only a script, on regency procs."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from regency.actor import ActorError, Channel, Port, SupervisionError, current_rank, endpoint
from regency.spmd._actor import SPMDActor, run_as_rank
from regency.spmd._output import captured_output
from regency.spmd._script import ScriptExit, script_traceback
from regency.spmd._setup import rank0

_SIGNAL = re.compile(r"signal \w+ \((\d+)\)")
_CODE = re.compile(r"non-zero code (-?\d+)")

# After a first failure, how long other ranks' reports are awaited to find the earliest one.
_FAILURE_WINDOW = 1.0

OutputMessage = tuple[int, str, list[str]]  # rank, stream ("stdout" | "stderr" | "eof"), lines


class RankRunner(SPMDActor):
    """An ``SPMDActor`` for ``regency run``: reports exit statuses, forwards output.

    Instead of raising, ``run_rank`` returns the status ``python script`` would exit with, and
    sends the script's output to the launcher's port.
    """

    @endpoint
    def run_rank(
        self,
        master_addr: str,
        master_port: int,
        argv: Sequence[str],
        output: Port[OutputMessage] | None,
    ) -> tuple[int, int, float]:
        """Run ``argv`` as ``SPMDActor.main`` does; return ``(rank, exit status, ended at)``.

        The status is what ``python argv...`` would exit with: 0, the ``sys.exit`` code, or 1
        after printing the traceback of an exception. ``ended at`` is the wall-clock time the
        script ended, so the launcher can tell which rank failed first.
        """
        rank = current_rank().rank
        ended = [0.0]

        def script_ended() -> None:
            ended[0] = time.time()

        def sink(stream: str, lines: list[str]) -> None:
            assert output is not None
            output.send((rank, stream, lines))

        with captured_output(sink) if output is not None else _nothing():
            status = 0
            try:
                run_as_rank(master_addr, master_port, argv, script_ended)
            except ScriptExit as exc:
                status = exc.code
            except BaseException as exc:
                sys.stderr.write(script_traceback(exc))
                sys.stderr.flush()
                status = 1
        if output is not None:
            output.send((rank, "eof", []))
        return rank, status, ended[0] or time.time()


class _nothing:  # noqa: N801 (a stand-in for contextlib.nullcontext, typed for this use)
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def status_of_lost(error: BaseException) -> int:
    """The exit status to report for a rank whose process died: 128 + signal, or its code."""
    text = str(error)
    found = _SIGNAL.search(text)
    if found:
        return 128 + int(found.group(1))
    found = _CODE.search(text)
    if found:
        return int(found.group(1)) % 256 or 1
    return 1


class _Printer:
    """Prints forwarded lines with their rank's prefix until every rank said ``eof``."""

    def __init__(self, ranks: int, prefix: bool) -> None:
        self.port, self._receiver = Channel[OutputMessage].open()
        self._left = set(range(ranks))
        self._ended = {rank: threading.Event() for rank in range(ranks)}
        self._prefix = prefix
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regency-run-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._left:
            try:
                rank, stream, lines = self._receiver.recv().get()
            except Exception:
                break
            if stream == "eof":
                self._left.discard(rank)
                self._ended[rank].set()
                continue
            out = sys.stderr if stream == "stderr" else sys.stdout
            tag = f"[rank{rank}]: " if self._prefix else ""
            out.write("".join(f"{tag}{line}\n" for line in lines))
            out.flush()
        self.done.set()

    def wait_for(self, rank: int, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until ``rank``'s output is all printed."""
        self._ended[rank].wait(timeout)


def launch(
    hosts: Any,
    nproc_per_node: int,
    argv: Sequence[str],
    prefix: bool = True,
    log: Any = None,
) -> int:
    """Run ``argv`` on ``nproc_per_node`` procs of every host in ``hosts``; return the status.

    Every rank gets torchrun's environment; their output is printed here with ``[rankN]: ``
    in front (without, if not ``prefix``). The result is 0 when every rank succeeded, else the
    status of the first rank to fail, by the time its script ended (128 + N for a rank killed
    by signal N). Once a rank has failed the others are waited for 1 s at most.
    """
    say = log or (lambda text: print(f"regency run: {text}", file=sys.stderr, flush=True))
    procs = hosts.spawn_procs(per_host={"gpus": nproc_per_node}, name="run")
    runners = procs.spawn("run", RankRunner)
    size = len(runners)
    printer = _Printer(size, prefix)
    try:
        host, port = rank0(runners).get_host_port.call_one(None).get()
        # (ended at, rank, status) of the failed ranks: a rank that fails makes the others fail
        # soon after (their collectives lose it), and their reports may arrive first.
        failed: list[tuple[float, int, int]] = []
        deadline = None
        for future in runners.run_rank.stream(host, port, list(argv), printer.port):
            wait = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                rank, status, ended = future.get(timeout=wait)
            except TimeoutError:
                break
            except SupervisionError as exc:
                if deadline is not None:
                    break  # a consequence of the first failure
                status = status_of_lost(exc)
                say(f"a rank's process was lost (exit status {status}): {exc}")
                return status
            except ActorError as exc:
                if deadline is not None:
                    break
                say(f"a rank failed: {exc}")
                return 1
            if status != 0:
                failed.append((ended, rank, status))
                if deadline is None:
                    deadline = time.monotonic() + _FAILURE_WINDOW
        if failed:
            _, rank, status = min(failed)
            printer.wait_for(rank, 2.0)
            say(f"rank {rank} failed with exit status {status}")
            return status
        printer.done.wait(5.0)
        return 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
