"""``SSHJob``: a worker daemon on each of a list of machines, each started over ``ssh``.

For every host the controller runs one ``ssh`` session (in its own session, so it outlives the
controller and a re-run can reconnect through the job cache) whose remote command is a small
keeper, ``python -c 'from regency.job._ssh import serve_over_ssh; serve_over_ssh()' --listen
tcp://0.0.0.0:PORT``. The keeper

- reads the job secret (hex) as the first line of its stdin: the controller writes it into the
  ssh session's stdin, so it is on no command line (``ps``) and in no file;
- starts the worker daemon (``python -m regency worker``) with the secret in its environment,
  in a process group of its own, its stdout going back over the ssh session;
- ends the worker's whole process group (worker, zygote, procs), waits until it is gone, and
  exits when its stdin reaches end-of-file or receives another line, or when it gets
  ``SIGTERM``/``SIGHUP``. Closing the ssh session closes that stdin, so **closing the ssh
  session kills the worker**; and when the worker exits the keeper exits with its status,
  closing the session.

The session's stdin is a FIFO in the job's private directory (mode 0700), opened read-write as
ssh's stdin: ssh itself holds a writer, so the stdin stays open after the controller exits.
``kill()`` (from this or a later controller) writes ``stop`` into it and waits until each ssh
session has ended, which happens only once the keeper has seen the worker's processes gone.

The controller learns each worker's address from the ``regency worker listening on
tcp://IP:PORT`` line that comes back on the session's stdout (written, with ssh's stderr, to a
log file in the job's directory).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from regency._transport.auth import SECRET_ENV
from regency.actor._worker import worker_command
from regency.job._errors import JobError
from regency.job._process import _alive, _group_members, _start_time, _wait_gone
from regency.job._trait import JobTrait

__all__ = ["SSHJob", "serve_over_ssh"]

_LISTENING = re.compile(rb"regency worker listening on (tcp://\S+)\n")
_STOP_LINE = b"stop\n"
_EXIT_TIMEOUT = 15.0  # the keeper waits up to 10 s for the worker's processes, then ssh exits
_KEEPER = "from regency.job._ssh import serve_over_ssh; serve_over_ssh()"


@dataclass
class _Session:
    """One ssh session running a keeper and its worker: local ssh process, files, address."""

    host: str
    pid: int
    started: int
    fifo: str
    log: str
    address: str | None = None


class SSHJob(JobTrait):
    """Hosts reached over ``ssh``: a regency worker daemon on each machine, one ssh session each.

    ``hosts`` is a list of ssh destinations (one mesh named ``hosts``) or a mapping of mesh name
    to destinations::

        job = SSHJob({"trainers": ["gpu1", "gpu2"], "servers": ["cpu1"]},
                     python_exe="/opt/venv/bin/python")
        trainers = job.state().trainers.spawn_procs(per_host={"gpus": 8})
        ...
        job.kill()

    A destination is anything ``ssh`` accepts (``host``, ``user@host``, an alias of your ssh
    configuration). Authentication must work without a prompt (keys or an agent): ssh runs with
    ``BatchMode=yes``. Every remote machine needs ``python_exe`` with regency importable.

    Args:
        hosts: destinations, or mesh name -> destinations.
        python_exe: the Python on the remote machines.
        port: the TCP port every worker listens on (on all interfaces); ``0`` lets each worker
            take a free port (it is reported back, so this works too).
        ssh_args: extra ``ssh`` arguments, placed before the destination (e.g.
            ``("-o", "ProxyJump=bastion")``).
        user: ``ssh -l USER``.
        identity_file: ``ssh -i FILE``.
        ssh_port: ``ssh -p PORT`` (the sshd port, not the worker's).
        ssh_exe: the ssh client to run.
        connect_timeout: ssh's ``ConnectTimeout`` in seconds.
        start_timeout: seconds ``state()`` waits for every worker to report its address; on
            timeout (or when a session ends first) every session is closed and the error names
            the hosts that failed, with the tail of their ssh output.
        env: extra environment variables for the remote workers (and so their procs), set by
            the keeper; do not put secrets here (they are on the keeper's command line).

    """

    def __init__(
        self,
        hosts: Sequence[str] | Mapping[str, Sequence[str]],
        *,
        python_exe: str = "python3",
        port: int = 22222,
        ssh_args: Sequence[str] = (),
        user: str | None = None,
        identity_file: str | os.PathLike[str] | None = None,
        ssh_port: int | None = None,
        ssh_exe: str = "ssh",
        connect_timeout: float = 10.0,
        start_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(hosts, str):
            raise TypeError("hosts is a sequence of ssh destinations, not one string")
        meshes = {"hosts": list(hosts)} if not isinstance(hosts, Mapping) else dict(hosts)
        if not meshes:
            raise ValueError("SSHJob needs at least one mesh of hosts")
        self.hosts: dict[str, list[str]] = {}
        for name, destinations in meshes.items():
            if not name.isidentifier():
                raise ValueError(f"mesh name {name!r} is not a Python identifier")
            if isinstance(destinations, str):
                raise TypeError(f"mesh {name!r}: hosts must be a sequence, not the string")
            if not destinations:
                raise ValueError(f"mesh {name!r} needs at least one host")
            self.hosts[name] = [str(d) for d in destinations]
        if not 0 <= port < 65536:
            raise ValueError(f"port must be 0..65535, not {port}")
        if isinstance(ssh_args, str):
            raise TypeError("ssh_args is a sequence of arguments, not one string")
        self.python_exe = python_exe
        self.port = port
        self.ssh_args: tuple[str, ...] = tuple(ssh_args)
        self.user = user
        self.identity_file = None if identity_file is None else os.fspath(identity_file)
        self.ssh_port = ssh_port
        self.ssh_exe = ssh_exe
        self.connect_timeout = connect_timeout
        self.start_timeout = start_timeout
        self.env: dict[str, str] = dict(env or {})
        self.job_dir: str | None = None
        self._sessions: dict[str, list[_Session]] = {}
        self._popens: dict[int, subprocess.Popen[bytes]] = {}

    # -- the commands -------------------------------------------------------------------------

    def remote_command(self) -> str:
        """The command ssh runs on every host (a shell command line; holds no secret)."""
        argv = [self.python_exe, "-c", _KEEPER, "--listen", f"tcp://0.0.0.0:{self.port}"]
        for key, value in sorted(self.env.items()):
            argv += ["--env", f"{key}={value}"]
        return shlex.join(argv)

    def ssh_command(self, host: str) -> list[str]:
        """The full ``ssh`` argv for one destination."""
        argv = [
            self.ssh_exe,
            "-T",  # no terminal: stdin/stdout are plain pipes
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o",
            "ServerAliveInterval=5",  # a vanished host ends the session (and so _running)
            "-o",
            "ServerAliveCountMax=3",
        ]
        if self.user is not None:
            argv += ["-l", self.user]
        if self.identity_file is not None:
            argv += ["-i", self.identity_file]
        if self.ssh_port is not None:
            argv += ["-p", str(self.ssh_port)]
        argv += [*self.ssh_args, "--", host, self.remote_command()]
        return argv

    # -- JobTrait hooks -------------------------------------------------------------------------

    def _spec(self) -> Any:
        return (
            tuple((name, tuple(hosts)) for name, hosts in self.hosts.items()),
            self.python_exe,
            self.port,
            self.ssh_args,
            self.user,
            self.identity_file,
            self.ssh_port,
            self.ssh_exe,
            tuple(sorted(self.env.items())),
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_popens"] = {}  # process handles belong to the process that started them
        return state

    def _create(self) -> None:
        if shutil.which(self.ssh_exe) is None:
            raise JobError(f"`{self.ssh_exe}` not found: SSHJob needs an ssh client")
        self.job_dir = tempfile.mkdtemp(prefix="regency-ssh-")  # mode 0700
        self._sessions = {}
        secret_line = self.secret.hex().encode() + b"\n"
        try:
            for name, hosts in self.hosts.items():
                sessions = self._sessions[name] = []
                for index, host in enumerate(hosts):
                    sessions.append(self._start(host, f"{name}_{index}", secret_line))
        except BaseException:
            self._kill()
            raise

    def _start(self, host: str, stem: str, secret_line: bytes) -> _Session:
        assert self.job_dir is not None
        fifo = os.path.join(self.job_dir, f"{stem}.stdin")
        log = os.path.join(self.job_dir, f"{stem}.log")
        os.mkfifo(fifo, 0o600)
        # Read-write: opening does not wait for a peer, and ssh, holding a writer itself, never
        # sees end-of-file on it until kill() writes the stop line.
        stdin = os.open(fifo, os.O_RDWR)
        try:
            os.write(stdin, secret_line)
            with open(log, "wb") as out:
                popen = subprocess.Popen(
                    self.ssh_command(host),
                    stdin=stdin,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        finally:
            os.close(stdin)
        self._popens[popen.pid] = popen
        return _Session(host, popen.pid, _start_time(popen.pid) or 0, fifo, log)

    def _running(self) -> bool:
        sessions = [s for group in self._sessions.values() for s in group]
        return bool(sessions) and all(_alive(s.pid, s.started) for s in sessions)

    def _worker_addresses(self) -> dict[str, list[str]]:
        sessions = [s for group in self._sessions.values() for s in group]
        if not sessions:
            raise JobError("SSHJob has no ssh sessions: call apply() or state() first")
        self._wait_for_addresses(sessions)
        return {name: [s.address or "" for s in group] for name, group in self._sessions.items()}

    def _wait_for_addresses(self, sessions: list[_Session]) -> None:
        deadline = time.monotonic() + self.start_timeout
        failed: dict[str, str] = {}
        waiting = [s for s in sessions if s.address is None]
        while waiting:
            for session in list(waiting):
                text = Path(session.log).read_bytes()
                found = _LISTENING.search(text)
                if found is not None:
                    session.address = found.group(1).decode()
                    waiting.remove(session)
                elif not _alive(session.pid, session.started):
                    failed[session.host] = "the ssh session ended before the worker listened"
                    waiting.remove(session)
            if failed or not waiting:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                for session in waiting:
                    failed[session.host] = (
                        f"no worker address within start_timeout={self.start_timeout:g}s"
                    )
                break
            # Nothing to await but output in a file: wait on the first session's exit, briefly.
            _wait_gone(waiting[0].pid, waiting[0].started, min(left, 0.02))
        if failed:
            logs = {s.host: _tail(s.log) for s in sessions}
            pending = [s.host for s in waiting if s.host not in failed]
            self._kill()
            lines = [
                f"host {host!r}: {why}; ssh output:\n{_indent(logs[host])}"
                for host, why in failed.items()
            ]
            if pending:
                lines.append(f"(still starting when the job was stopped: {pending})")
            raise JobError(
                "SSHJob could not start its workers; every ssh session was closed:\n"
                + "\n".join(lines)
            )

    def _kill(self) -> None:
        sessions = [s for group in self._sessions.values() for s in group]
        for session in sessions:
            _request_stop(session)
        for session in sessions:
            if not _wait_gone(session.pid, session.started, _EXIT_TIMEOUT):
                # The remote side did not answer: end the ssh client; sshd then closes the
                # keeper's stdin, which ends the worker on that host.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(session.pid, signal.SIGKILL)
                _wait_gone(session.pid, session.started, _EXIT_TIMEOUT)
        for popen in self._popens.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(_EXIT_TIMEOUT)
        self._popens.clear()
        self._sessions = {}
        if self.job_dir is not None:
            shutil.rmtree(self.job_dir, ignore_errors=True)
            self.job_dir = None


def _request_stop(session: _Session) -> None:
    """Write the stop line into a session's stdin (nothing to do once ssh is gone)."""
    if not _alive(session.pid, session.started):
        return
    try:
        fd = os.open(session.fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader (ENXIO) or the FIFO is gone: the session has ended
        return
    try:
        os.write(fd, _STOP_LINE)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


# -- the remote side -----------------------------------------------------------------------------


def serve_over_ssh(argv: Sequence[str] | None = None) -> NoReturn:
    """The keeper run by ``SSHJob`` on each host (see the module docstring).

    ``argv`` (default ``sys.argv[1:]``): ``--listen ADDRESS [--env KEY=VALUE ...]``. The job
    secret is the first line of stdin.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    listen = None
    extra: dict[str, str] = {}
    while args:
        flag = args.pop(0)
        if flag == "--listen" and args:
            listen = args.pop(0)
        elif flag == "--env" and args:
            key, _, value = args.pop(0).partition("=")
            extra[key] = value
        else:
            _die(f"unexpected argument {flag!r}")
    if listen is None:
        _die("--listen ADDRESS is required")
    stdin = sys.stdin.fileno()
    secret = _read_line(stdin).strip()
    if not secret:
        _die("no job secret on stdin")
    env = {**os.environ, **extra, SECRET_ENV: secret.decode()}
    worker = subprocess.Popen(
        worker_command(listen, python=sys.executable),
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the worker, its zygote and procs
    )
    started = _start_time(worker.pid) or 0

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    status = 0
    try:
        exited = os.pidfd_open(worker.pid)
        while True:
            ready, _, _ = select.select([stdin, exited], [], [])
            if exited in ready:
                status = worker.wait()
                break
            if stdin in ready:
                break  # end-of-file (the session closed) or the stop line: either way, stop
    finally:
        _end_group(worker.pid, started)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(10)
    sys.stdout.flush()
    os._exit(status if status >= 0 else 128 - status)


def _end_group(pgid: int, started: int) -> None:
    """SIGKILL the worker's process group and wait until every member is gone."""
    members = _group_members(pgid)
    if _alive(pgid, started) and (pgid, started) not in members:
        members.append((pgid, started))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for pid, born in members:
        _wait_gone(pid, born, 10.0)


def _read_line(fd: int) -> bytes:
    """One line from a file descriptor, read a byte at a time (nothing after it is consumed)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return bytes(line)


def _die(message: str) -> NoReturn:
    print(f"regency ssh keeper: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)
