"""Running an unmodified torchrun script (or ``-m module``) as ``__main__`` in this process."""

from __future__ import annotations

import contextlib
import gc
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from regency._errors import RegencyError
from regency.spmd._settle import wait_for_native_threads_to_settle

_HERE = os.path.dirname(os.path.abspath(__file__))
_ACTOR_FILE = os.path.join(_HERE, "_actor.py")
_LAUNCH_FILE = os.path.join(_HERE, "_launch.py")

NO_SCRIPT = (
    "No script or module specified: SPMDActor.main's argv is empty; pass [script, args...] "
    "or ['-m', module, args...]"
)


class ScriptExit(RegencyError):  # noqa: N818 (it reads as what happened: the script exited)
    """A script ended with ``sys.exit(n)``, ``n`` not 0 or ``None``: that rank failed.

    ``code`` is the exit status the script asked for (``1`` for a non-integer argument, whose
    text is printed as Python does).
    """

    def __init__(self, code: int, rank: int | None = None) -> None:
        self.code = code
        self.rank = rank
        where = f"rank {rank}" if rank is not None else "the script"
        super().__init__(f"{where} exited with status {code} (sys.exit)")


def exit_status(exc: SystemExit) -> int:
    """The process exit status ``exc`` would give, as the interpreter computes it."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int):
        print(code, file=sys.stderr, flush=True)
        return 1
    return code


def run_argv(argv: Sequence[str]) -> dict[str, Any]:
    """Run ``[script, args...]`` or ``["-m", module, args...]`` as ``__main__``.

    ``sys.argv`` is set as ``python script args...`` would set it, and the script's directory (or
    the working directory, for ``-m``) goes first on ``sys.path`` for the run; both are put back
    afterwards. ``SystemExit`` propagates. Returns the script's globals, so that the caller decides
    when its objects are freed (see ``release_process_group``).
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise ValueError(NO_SCRIPT)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                raise ValueError("SPMDActor.main: '-m' needs a module name: ['-m', module, ...]")
            module = argv[1]
            sys.argv = [module, *argv[2:]]  # runpy puts the module's file in argv[0]
            sys.path.insert(0, os.getcwd())
            return runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            if not os.path.exists(script):
                raise FileNotFoundError(f"SPMDActor.main: no script {script!r} (cwd {os.getcwd()})")
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            return runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        restore_std_streams()


def restore_std_streams() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``; reopen one the script closed.

    A script may close them (``json.tool`` closes its output file, which is ``sys.stdout``); the
    proc lives on, so they are reopened on their file descriptors, which closing them then
    leaves open.
    """
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is not None and not stream.closed:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
            continue
        try:
            os.fstat(fd)
        except OSError:  # the descriptor itself is gone: whoever restores it reopens the stream
            continue
        setattr(sys, name, open(fd, "w", buffering=1, closefd=False))  # noqa: SIM115


def script_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as ``python script`` prints it: from the script's frames on.

    Frames of regency and ``runpy`` that ran the script are left out.
    """
    tb = exc.__traceback__
    while tb is not None and _is_launcher_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _is_launcher_frame(filename: str) -> bool:
    ours = (__file__, _ACTOR_FILE, _LAUNCH_FILE)
    return filename in ours or "runpy" in os.path.basename(filename)


def release_process_group() -> bool:
    """Destroy the default ``torch.distributed`` process group a script left behind.

    A torchrun script's process exits when it ends or fails, which closes its connections to
    the other ranks; a proc lives on. Destroying the group closes them just as promptly, so the
    other ranks' collectives fail at once instead of waiting out gloo's timeout, and the next
    ``main`` can initialize a new group. A no-op when the script never imported torch.

    The caller still holds the script's objects (its globals, or the traceback of what it
    raised): they are freed only after this returns, once torch's native threads have settled
    (see ``regency.spmd._settle``), and then collected with ``gc.collect()``. Returns whether
    they settled (see :func:`keep_if_unsettled`).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return True
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # a broken group: nothing left to release
        print(f"regency.spmd: destroying the process group failed: {exc}", file=sys.stderr)
    return wait_for_native_threads_to_settle()


# Scripts' objects not freed because torch's threads had not settled (see keep_if_unsettled).
_KEPT: list[object] = []


def keep_if_unsettled(settled: bool, script_objects: object) -> None:
    """Keep ``script_objects`` alive for good when torch's threads did not settle in time.

    Freeing them could run gloo's group destructor while a worker still needs the GIL, the
    deadlock :mod:`regency.spmd._settle` waits out; on a machine too loaded for the threads to
    settle within the wait, holding on to one script's objects is the safe side.
    """
    if settled or script_objects is None:
        return
    _KEPT.append(script_objects)
    print(
        "regency.spmd: torch's threads had not settled after the script; keeping its objects "
        "alive rather than risk gloo's destructor deadlock",
        file=sys.stderr,
    )


def collect_script_objects() -> None:
    """Free what the script left in reference cycles, once the caller dropped its globals.

    A ``DistributedDataParallel`` module holds its group, and with it gloo's threads and sockets,
    often in cycles: free them now, while the peers are still up, rather than when the
    interpreter exits.
    """
    gc.collect()
