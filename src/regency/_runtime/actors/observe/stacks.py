"""The Python stacks of a proc mesh's processes, every thread, as text per rank.

A proc answers a :class:`~regency._runtime.actors.control.control.DumpStacks` on its proc agent's
thread, so an actor stuck in an endpoint does not keep it from answering: with ``py-spy`` on
its ``PATH`` (or next to its Python) it runs ``py-spy dump`` on itself, which also shows native
frames' Python callers and idle threads as py-spy sees them; otherwise, or if py-spy fails, it
formats ``sys._current_frames()`` (every thread, with its name). The controller gathers the
answers into a :class:`ValueMesh`; a rank whose process is gone, or that does not answer in
time (its Python cannot run: a native call holding the GIL, a SIGSTOP), gets a line saying so
instead of failing the others.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path

from regency._runtime.actors.base.future import Future
from regency._runtime.actors.base.value_mesh import ValueMesh
from regency._runtime.actors.control.control import DumpStacks
from regency._runtime.actors.observe.answers import Answers
from regency._runtime.kernel.pending import Pending
from regency.shape import Shape

_PR_SET_PTRACER = 0x59616D61  # Yama: let a process (and its descendants) trace the caller
_PYSPY_TIMEOUT = 10.0


def thread_stacks() -> str:
    """Every thread's current Python stack in this process but the calling one's (the dump's
    own)."""
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    blocks = []
    for ident, frame in sorted(sys._current_frames().items()):
        if ident == me:
            continue
        thread = names.get(ident)
        name = thread.name if thread is not None else "<not a threading.Thread>"
        daemon = " daemon" if thread is not None and thread.daemon else ""
        lines = "".join(traceback.format_stack(frame))
        blocks.append(f'Thread {ident} "{name}"{daemon} (most recent call last):\n{lines}')
    return f"Process {os.getpid()} ({sys.executable}), {len(blocks)} threads\n\n" + "\n".join(
        blocks
    )


def pyspy_path() -> str | None:
    """The ``py-spy`` executable: next to this Python (a venv's bin), else on ``PATH``."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def pyspy_stacks(program: str) -> str | None:
    """``py-spy dump`` of this very process, or ``None`` if it cannot run here."""
    with contextlib.suppress(OSError, AttributeError):
        # Under Yama's ptrace_scope=1 only ancestors may trace: allow our own descendants.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, os.getpid(), 0, 0, 0)
    try:
        done = subprocess.run(
            [program, "dump", "--pid", str(os.getpid())],
            check=False,
            capture_output=True,
            text=True,
            timeout=_PYSPY_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return done.stdout


def local_stacks(use_pyspy: bool) -> str:
    """This process's stacks: through py-spy when wanted and installed, else built in."""
    program = pyspy_path() if use_pyspy else None
    if program is not None:
        dumped = pyspy_stacks(program)
        if dumped is not None:
            return f"(py-spy dump)\n{dumped}"
    return f"(sys._current_frames)\n{thread_stacks()}"


def stacks_of(addrs: Sequence[str], use_pyspy: bool, timeout: float) -> Pending:
    """Ask each of ``addrs`` for its stacks; the pending completes with the texts by index."""
    gather: Answers[str] = Answers(
        addrs,
        lost=lambda addr, reason: f"(no stacks: {addr} is gone: {reason})",
        silent=f"(no answer within {timeout:g} s: the process could not run Python, e.g. a "
        "native call holding the GIL or a stopped process)",
    )
    return gather.ask(lambda port, rank: DumpStacks(port, rank, use_pyspy), timeout)


def gather_stacks(
    shape: Shape, addrs: Sequence[str], use_pyspy: bool, timeout: float
) -> Future[ValueMesh[str]]:
    """The stacks of a mesh's procs (``addrs``, by rank) as a ValueMesh over ``shape``."""
    pending = stacks_of(addrs, use_pyspy, timeout)
    return Future._from_pending(pending, lambda texts: ValueMesh(shape, texts))
