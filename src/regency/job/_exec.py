"""``exec_command``: run a command on every host of a host mesh (Monarch's ``exec_command``).

One proc is started per host, holding a :class:`BashActor` that runs the command with
``subprocess``. Each host's command sees ``REGENCY_RANK_<DIM>`` and ``REGENCY_SIZE_<DIM>`` for
every dimension of the host mesh (``REGENCY_RANK_HOSTS=1``, ``REGENCY_SIZE_HOSTS=2``). Output can
stream back line by line through a port while the commands run; the result is a ``ValueMesh`` of
``CommandResult(returncode, stdout, stderr)``, one per host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from regency._transport.auth import SECRET_ENV
from regency.actor import (
    Actor,
    Channel,
    Future,
    HostMesh,
    Port,
    ValueMesh,
    concurrent_endpoint,
    current_rank,
    endpoint,
)
from regency.shape import Point

RANK_ENV = "REGENCY_RANK_"
SIZE_ENV = "REGENCY_SIZE_"
_STOP_TIMEOUT = 30.0
_READ_CHUNK = 65536

# (rank, stream, text): stream is "stdout" or "stderr" (text is one line, without its newline),
# "end" (that rank has sent all its lines) or "done" (the call finished; sent by the caller).
_Event = tuple[int, str, str]
LineHandler = Callable[[int, str, str], None]


class CommandResult(NamedTuple):
    """What one host's command did: its exit status and everything it wrote."""

    returncode: int
    stdout: str
    stderr: str


def rank_env(point: Mapping[str, int], sizes: Mapping[str, int]) -> dict[str, str]:
    """``REGENCY_RANK_<DIM>`` / ``REGENCY_SIZE_<DIM>`` for a host at ``point`` of a mesh."""
    env = {}
    for label, index in point.items():
        env[RANK_ENV + label.upper()] = str(index)
        env[SIZE_ENV + label.upper()] = str(sizes[label])
    return env


class BashActor(Actor):
    """Runs commands on its host with ``subprocess``, streaming lines to a port if given.

    Each command runs in its own process group, so that :meth:`kill` ends it with everything
    it started; ``run`` is concurrent, so ``kill`` is served while a command runs.
    """

    def __init__(self) -> None:
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    @concurrent_endpoint
    async def run(
        self,
        cmd: Sequence[str] | str,
        envs: Sequence[Mapping[str, str]],
        cwd: str | None,
        port: Port[_Event] | None,
    ) -> CommandResult:
        """Run ``cmd`` (an argv, or a string for ``sh -c``) with ``envs[my rank]`` added."""
        rank = current_rank().rank
        return await asyncio.to_thread(self._run, rank, cmd, envs[rank], cwd, port)

    @endpoint
    async def kill(self) -> int:
        """SIGKILL the process group of every command still running; return how many."""
        with self._lock:
            running = list(self._running)
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        return len(running)

    def _run(
        self,
        rank: int,
        cmd: Sequence[str] | str,
        extra: Mapping[str, str],
        cwd: str | None,
        port: Port[_Event] | None,
    ) -> CommandResult:
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV} | dict(extra)
        argv: Sequence[str] = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        try:
            child = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            message = f"cannot run {argv[0]!r}: {exc}"
            if port is not None:
                port.send((rank, "stderr", message))
                port.send((rank, "end", ""))
            return CommandResult(127, "", message + "\n")
        with self._lock:
            self._running.add(child)
        try:
            texts = _pump(child, rank, port)
            returncode = child.wait()
        finally:
            with self._lock:
                self._running.discard(child)
        if port is not None:
            port.send((rank, "end", ""))
        return CommandResult(returncode, texts["stdout"], texts["stderr"])


def _pump(child: subprocess.Popen[bytes], rank: int, port: Port[_Event] | None) -> dict[str, str]:
    """Read the child's stdout and stderr to their ends, sending each line as it completes."""
    assert child.stdout is not None
    assert child.stderr is not None
    collected = {"stdout": bytearray(), "stderr": bytearray()}
    partial = {"stdout": bytearray(), "stderr": bytearray()}
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ, "stdout")
        selector.register(child.stderr, selectors.EVENT_READ, "stderr")
        while selector.get_map():
            for key, _ in selector.select():
                name: str = key.data
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    if partial[name]:
                        _send(port, rank, name, bytes(partial[name]))
                    continue
                collected[name] += chunk
                buffer = partial[name]
                buffer += chunk
                *lines, rest = bytes(buffer).split(b"\n")
                buffer[:] = rest
                for line in lines:
                    _send(port, rank, name, line)
    child.stdout.close()
    child.stderr.close()
    return {name: data.decode(errors="replace") for name, data in collected.items()}


def _send(port: Port[_Event] | None, rank: int, stream: str, line: bytes) -> None:
    if port is not None:
        port.send((rank, stream, line.decode(errors="replace")))


def print_line(label: Callable[[int], str] = str) -> LineHandler:
    """A line handler printing ``[label] line`` to this process's stdout or stderr."""

    def handle(rank: int, stream: str, line: str) -> None:
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(f"[{label(rank)}] {line}\n")
        out.flush()

    return handle


def run_on_hosts(
    host_mesh: HostMesh,
    cmd: Sequence[str] | str,
    envs: Sequence[Mapping[str, str]],
    *,
    on_line: LineHandler | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> ValueMesh[CommandResult]:
    """Run ``cmd`` on each host of ``host_mesh``, host ``i`` with ``envs[i]`` added.

    ``on_line(rank, stream, line)`` is called for each line as it arrives (in order per rank).
    The procs started for the commands are stopped before this returns.
    """
    if len(envs) != len(host_mesh):
        raise ValueError(f"need one environment per host: {len(host_mesh)}, got {len(envs)}")
    procs = host_mesh.spawn_procs(name="exec")
    actors: BashActor | None = None
    try:
        actors = procs.spawn("bash", BashActor)
        if on_line is None:
            done: Future[ValueMesh[CommandResult]] = actors.run.call(cmd, list(envs), cwd, None)
            return done.get(timeout=timeout)
        port, receiver = Channel[_Event].open()
        call: Future[ValueMesh[CommandResult]] = actors.run.call(cmd, list(envs), cwd, port)
        deadline = None if timeout is None else time.monotonic() + timeout
        _relay(call, port, receiver.recv, len(host_mesh), on_line, deadline)
        return call.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
    except BaseException:
        # A timeout (or Ctrl-C) here ends the commands too, with whatever they started.
        if actors is not None:
            with contextlib.suppress(Exception):
                actors.kill.call().get(timeout=_STOP_TIMEOUT)
        raise
    finally:
        # Stopping may fail for a lost host; its error (if any) is the call's error.
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=_STOP_TIMEOUT)


def _relay(
    call: Future[Any],
    port: Port[_Event],
    recv: Callable[[], Future[_Event]],
    ranks: int,
    on_line: LineHandler,
    deadline: float | None,
) -> None:
    """Hand lines to ``on_line`` until every rank ended, or the call failed.

    Raises ``TimeoutError`` at ``deadline`` (``time.monotonic()``), if given.
    """

    def announce() -> None:
        call.exception()  # wait for the outcome, whatever it is
        port.send((-1, "done", ""))

    threading.Thread(target=announce, name="regency-exec-done", daemon=True).start()
    ended = 0
    while ended < ranks:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        rank, stream, line = recv().get(timeout=left)
        if stream == "end":
            ended += 1
        elif stream == "done":
            if call.exception() is not None:
                return  # a host was lost: its lines will not all come
        else:
            on_line(rank, stream, line)


def exec_command(
    host_mesh: HostMesh,
    cmd: Sequence[str] | str,
    *,
    env: Mapping[str, str] | None = None,
    stream: bool | LineHandler = False,
    cwd: str | None = None,
    timeout: float | None = None,
) -> ValueMesh[CommandResult]:
    """Run ``cmd`` on every host of ``host_mesh``; a ``ValueMesh`` of ``CommandResult``.

    ``cmd`` is an argv list or a shell string (run with ``/bin/sh -c``). Each host's command
    gets ``env`` plus ``REGENCY_RANK_<DIM>`` / ``REGENCY_SIZE_<DIM>`` for every dimension of
    ``host_mesh``. With ``stream=True`` every output line is printed here as it arrives,
    prefixed with its host's rank (``[1] text``; stderr lines to stderr); a callable
    ``stream(rank, "stdout" | "stderr", line)`` receives them instead. Either way the result
    still holds each host's whole output. A lost host raises (``SupervisionError``);
    ``timeout`` (seconds, whole run) raises ``TimeoutError`` after killing each host's command
    with its whole process group (everything it started).
    """
    extent = host_mesh.extent
    sizes = dict(extent)
    envs = [
        {**(env or {}), **rank_env(Point(rank, extent), sizes)} for rank in range(len(host_mesh))
    ]
    handler: LineHandler | None
    if stream is True:
        handler = print_line()
    elif stream is False:
        handler = None
    else:
        handler = stream
    return run_on_hosts(host_mesh, cmd, envs, on_line=handler, cwd=cwd, timeout=timeout)
