"""``shell``: an interactive shell on one host of a mesh (Monarch's ``monarch.job.shell``).

The host side is a :class:`_ShellActor` in a proc started on the host: it opens a real pty,
starts ``$SHELL -i`` (``/bin/bash`` by default) as the session leader with the pty as its
controlling terminal, and relays the pty's bytes as actor messages over regency's channels. The
client side puts the local terminal in raw mode, sends what it reads from stdin and the window
size (again on every ``SIGWINCH``), and writes the shell's output to stdout. Both directions are
flow-controlled by credit (:mod:`regency.job._flow`): a terminal that does not read stalls the
shell's output on the host, not the memory of either side.

End of input on the client hangs up the pty (``SIGHUP`` to the shell and its foreground job,
``SIGTERM`` and ``SIGKILL`` after a grace period), as closing a terminal does. The shell's exit
status comes back as :func:`shell`'s value (``128 + N`` when killed by signal ``N``). A failure
to write the client's stdout ends the session and raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import signal
import stat
import struct
import sys
import termios
import tty
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NamedTuple

from regency._transport.auth import SECRET_ENV
from regency.actor import Actor, Channel, HostMesh, Port, PortReceiver, current_rank, endpoint
from regency.job._exec import rank_env
from regency.job._flow import Credit, collect

CHUNK = 16 * 1024  # bytes read from a pty or stdin per message
WINDOW = 1024 * 1024  # bytes one direction may have sent and not yet had consumed
GRACE = 1.0  # seconds between SIGHUP, SIGTERM and SIGKILL when a session is stopped
DEFAULT_SHELL = "/bin/bash"
# Run in the child: it is already a session leader (start_new_session); make the pty on
# stdin its controlling terminal, give back the signals Python ignores, then become the shell.
_TAKE_TERMINAL = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGPIPE, signal.SIGXFSZ)]; "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


class _Input(NamedTuple):
    data: bytes


class _Resize(NamedTuple):
    rows: int
    columns: int


class _Close(NamedTuple):
    pass


class _Output(NamedTuple):
    data: bytes


class _Exited(NamedTuple):
    returncode: int


class _Failed(NamedTuple):
    error: str


_ToHost = _Input | _Resize | _Close
_ToClient = _Output | _Exited | _Failed


class _Link(NamedTuple):
    """Where one side sends its messages and returns the other side's credit."""

    messages: Port[Any]
    credit: Port[int]


def _set_window_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _window_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


def exit_status(returncode: int) -> int:
    """A shell's exit status as a shell reports it: ``128 + N`` when killed by signal ``N``."""
    return returncode if returncode >= 0 else min(128 - returncode, 255)


async def _hang_up(master: int, process: asyncio.subprocess.Process) -> None:
    """Stop the shell and its foreground job: SIGHUP, then SIGTERM, then SIGKILL."""
    groups = {process.pid}
    with contextlib.suppress(OSError):
        groups.add(os.tcgetpgrp(master))
    groups.discard(os.getpgrp())
    groups = {group for group in groups if group > 1}
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        if sig is signal.SIGKILL:
            break
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=GRACE)
        groups = {group for group in groups if _alive(group)}
        if not groups and process.returncode is not None:
            return
    await process.wait()


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


@contextlib.asynccontextmanager
async def _reader(fd: int) -> AsyncIterator[Callable[[], Awaitable[bytes]]]:
    """An async ``read()`` of ``fd`` (``b""`` at its end; a pty's EIO is its end).

    The fd is read directly when the event loop says it is readable, so that what arrived
    before the end is never lost behind it; a regular file is read as it is.
    """
    if stat.S_ISREG(os.fstat(fd).st_mode):

        async def read_file() -> bytes:
            return os.read(fd, CHUNK)

        yield read_file
        return
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)

    async def read() -> bytes:
        while True:
            try:
                return os.read(fd, CHUNK)
            except BlockingIOError:
                pass
            except OSError as error:
                if error.errno == errno.EIO:  # every holder of the pty's other end closed it
                    return b""
                raise
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(fd)

    yield read


@contextlib.asynccontextmanager
async def _writer(fd: int) -> AsyncIterator[Callable[[bytes], Awaitable[None]]]:
    """An async ``write_all()`` to ``fd``, waiting on the event loop while it is full.

    Written directly rather than through a pipe transport: an event loop's write-pipe
    transport may read the fd to notice its far end closing, which on a pty master would
    swallow the shell's output.
    """
    loop = asyncio.get_running_loop()
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.set_blocking(fd, False)

    async def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
                continue
            except BlockingIOError:
                pass
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)

    yield write


class _ShellActor(Actor):
    """Runs one interactive shell on a pty of its host and relays it to the client."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._master: int | None = None
        self._session: asyncio.Task[None] | None = None

    @endpoint
    async def start(
        self,
        client: _Link,
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        terminal: str,
        window_size: tuple[int, int],
    ) -> _Link:
        """Start the shell; return where the client sends its input and credit."""
        if self._process is not None:
            raise RuntimeError("this shell is already running")
        point = current_rank()
        child_env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        child_env |= rank_env(dict(point), dict(point.extent))
        child_env |= env or {}
        child_env["TERM"] = terminal
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        program = child_env.get("SHELL") or DEFAULT_SHELL
        if shutil.which(program, path=child_env.get("PATH")) is None:
            raise FileNotFoundError(f"no shell {program!r} to run on this host ($SHELL)")
        master, slave = os.openpty()
        try:
            _set_window_size(master, *window_size)
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _TAKE_TERMINAL,
                program,
                "-i",
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=child_env,
                start_new_session=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._process, self._master = process, master
        messages, receiver = Channel[_ToHost].open()
        credit_port, credit_receiver = Channel[int].open()
        self._session = asyncio.create_task(
            self._serve(master, process, client, receiver, credit_receiver)
        )
        return _Link(messages, credit_port)

    async def _serve(
        self,
        master: int,
        process: asyncio.subprocess.Process,
        client: _Link,
        receiver: PortReceiver[_ToHost],
        credit_receiver: PortReceiver[int],
    ) -> None:
        credit = Credit(WINDOW)
        output = asyncio.create_task(self._output(master, process, client, credit))
        tasks = [
            output,
            asyncio.create_task(self._input(master, process, client, receiver)),
            asyncio.create_task(collect(credit_receiver, credit)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
            await output
        except Exception as error:
            with contextlib.suppress(Exception):
                client.messages.send(_Failed(f"{type(error).__name__}: {error}"))
            await _hang_up(master, process)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _output(
        self, master: int, process: asyncio.subprocess.Process, client: _Link, credit: Credit
    ) -> None:
        async with _reader(master) as read:
            while data := await read():
                await credit.take(len(data))
                client.messages.send(_Output(data))
        client.messages.send(_Exited(exit_status(await process.wait())))

    async def _input(
        self,
        master: int,
        process: asyncio.subprocess.Process,
        client: _Link,
        receiver: PortReceiver[_ToHost],
    ) -> None:
        async with _writer(master) as write:
            while True:
                message = await receiver.recv()
                if isinstance(message, _Input):
                    await write(message.data)
                    client.credit.send(len(message.data))
                elif isinstance(message, _Resize):
                    _set_window_size(master, message.rows, message.columns)
                elif isinstance(message, _Close):
                    await _hang_up(master, process)
                    return

    async def __cleanup__(self, exc: Exception | None) -> None:
        process, master = self._process, self._master
        if process is not None and master is not None and process.returncode is None:
            await _hang_up(master, process)
        if self._session is not None:
            self._session.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._session
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None


@contextlib.contextmanager
def _terminal_mode(stdin: int, stdout: int) -> Iterator[None]:
    """Raw mode on a terminal stdin; both fds' blocking flags restored afterwards."""
    blocking = {fd: os.get_blocking(fd) for fd in {stdin, stdout}}
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    if saved is not None:
        tty.setraw(stdin)
    try:
        yield
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        for fd, was in blocking.items():
            with contextlib.suppress(OSError):
                os.set_blocking(fd, was)


@contextlib.contextmanager
def _on_resize(notify: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGWINCH, notify)
    except (RuntimeError, ValueError):  # not the main thread
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGWINCH)


async def _terminal(host: _Link, receiver: PortReceiver[_ToClient], credit: Credit) -> int:
    """Relay the local terminal to the host's shell until it exits; return its exit status."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()

    async def send_input(read: Callable[[], Awaitable[bytes]]) -> None:
        try:
            while data := await read():
                await credit.take(len(data))
                host.messages.send(_Input(data))
        finally:
            with contextlib.suppress(Exception):
                host.messages.send(_Close())

    async def receive_output(write: Callable[[bytes], Awaitable[None]]) -> int:
        while True:
            message = await receiver.recv()
            if isinstance(message, _Output):
                await write(message.data)
                host.credit.send(len(message.data))
            elif isinstance(message, _Exited):
                return message.returncode
            elif isinstance(message, _Failed):
                raise RuntimeError(f"the remote shell failed: {message.error}")

    def resize() -> None:
        host.messages.send(_Resize(*_window_size(stdin)))

    with _terminal_mode(stdin, stdout), _on_resize(resize):
        async with _reader(stdin) as read, _writer(stdout) as write:
            sending = asyncio.create_task(send_input(read))
            output = asyncio.create_task(receive_output(write))
            try:
                done, _ = await asyncio.wait([sending, output], return_when=asyncio.FIRST_COMPLETED)
                if sending in done:
                    sending.result()  # a failure to read stdin
                return await output
            finally:
                sending.cancel()
                output.cancel()
                await asyncio.gather(sending, output, return_exceptions=True)


async def _session(host_mesh: HostMesh, env: dict[str, str] | None, workdir: str | None) -> int:
    credit = Credit(WINDOW)
    messages, receiver = Channel[_ToClient].open()
    credit_port, credit_receiver = Channel[int].open()
    procs = host_mesh.spawn_procs()
    collecting = asyncio.create_task(collect(credit_receiver, credit))
    try:
        actor = procs.spawn("shell", _ShellActor)
        host = await actor.start.call_one(
            _Link(messages, credit_port),
            env,
            workdir,
            os.getcwd(),
            os.environ.get("TERM", "xterm-256color"),
            _window_size(sys.stdin.fileno()),
        )
        return await _terminal(host, receiver, credit)
    finally:
        collecting.cancel()
        await asyncio.gather(collecting, return_exceptions=True)
        await procs.stop()


def shell(
    host_mesh_singleton: HostMesh,
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> int:
    """Run an interactive shell on the one host of ``host_mesh_singleton``; return its status.

    The shell (``$SHELL``, else ``/bin/bash``, run with ``-i``) runs on a real pty of the host
    with the rank variables of the host (``REGENCY_RANK_<DIM>``, ``REGENCY_SIZE_<DIM>``) and
    ``env`` added, in ``workdir`` (default: this process's working directory when the host has
    it). Terminal data goes both ways, the window size follows the local terminal's, end of
    input hangs the shell up, and the shell's exit status is returned. Raises ``ValueError``
    unless the mesh has exactly one host (slice it first), and ``BrokenPipeError`` or
    ``ConnectionResetError`` when stdout cannot be written.
    """
    if host_mesh_singleton.size() != 1:
        raise ValueError("shell requires a singleton HostMesh; slice the mesh to one host first")
    return asyncio.run(_session(host_mesh_singleton, env, workdir))
