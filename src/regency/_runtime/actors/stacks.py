"""The Python stacks of a proc mesh's processes, every thread, as text per rank.

A proc answers a :class:`~regency._runtime.actors.control.DumpStacks` on its proc agent's
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
import pickle
import shutil
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path

from regency._runtime.actors.control import DumpStacks
from regency._runtime.actors.future import Future
from regency._runtime.actors.value_mesh import ValueMesh
from regency._runtime.kernel import state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part
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


class StacksGather:
    """Port handler collecting one stack dump per rank (by flat rank of the mesh)."""

    def __init__(self, addrs: Sequence[str]) -> None:
        self.pending = Pending()
        self.port = -1
        self._addrs = list(addrs)
        self._texts: list[str | None] = [None] * len(addrs)
        self._left = len(addrs)
        self._lock = threading.Lock()
        if not addrs:
            self.pending.set_result([])

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """One rank's dump (our own pickled ``str``)."""
        self._fill([rank], pickle.loads(parts[0]))

    def peer_lost(self, addr: str, reason: str) -> None:
        """A proc is gone: its ranks get the reason instead of a dump."""
        ranks = [r for r, a in enumerate(self._addrs) if a == addr]
        self._fill(ranks, f"(no stacks: {addr} is gone: {reason})")

    def expire(self, timeout: float) -> None:
        """The wait is over: ranks still silent say so."""
        silent = [r for r, text in enumerate(self._texts) if text is None]
        self._fill(
            silent,
            f"(no answer within {timeout:g} s: the process could not run Python, e.g. a native "
            "call holding the GIL or a stopped process)",
        )

    def _fill(self, ranks: Sequence[int], text: str) -> None:
        with self._lock:
            for rank in ranks:
                if 0 <= rank < len(self._texts) and self._texts[rank] is None:
                    self._texts[rank] = text
                    self._left -= 1
            finished = self._left == 0 and not self.pending.done
        if finished:
            state.runtime().close_port(self.port, self._addrs)
            self.pending.set_result(list(self._texts))


def gather_stacks(
    shape: Shape, addrs: Sequence[str], use_pyspy: bool, timeout: float
) -> Future[ValueMesh[str]]:
    """Ask each of ``addrs`` (the mesh's procs, by rank) for its stacks."""
    rt = state.runtime()
    handler = StacksGather(addrs)
    ref = rt.open_port(handler, watch=sorted(set(addrs)))
    handler.port = ref.port
    for rank, addr in enumerate(addrs):
        with contextlib.suppress(PeerLostError):  # the watch fills in the reason
            rt.send_control(addr, wire.SERVICE_PROC, DumpStacks(ref, rank, use_pyspy))
    rt.loop.call_later(timeout, lambda: handler.expire(timeout))
    return Future._from_pending(handler.pending, lambda texts: ValueMesh(shape, texts))
