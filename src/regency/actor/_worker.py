"""Starting worker daemons: the loop itself, and the command and environment that run it."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from regency._lowlevel import Pending, serve_worker, serve_worker_until_shutdown, start_worker
from regency._runtime.actors.base.future import Future
from regency._transport.auth import SECRET_ENV, check_secret
from regency.actor._attach import (
    CA,
    PrivateKey,
    _check_security,
    ipc_to_unix,
    secret_from_env,
)


def _bind_and_advertise(given: str) -> tuple[str, str | None]:
    """Where to listen and what to announce, from Monarch's address forms.

    ``service<ID>@tcp://...`` drops the proc id; ``dial@bind`` listens on ``bind`` and announces
    ``dial``; a ``*`` host listens on every interface.
    """
    head, sep, rest = given.partition("@")
    if sep and "://" not in head:
        given = rest
    dial, sep, bind = given.partition("@")
    listen = ipc_to_unix(bind if sep else dial)
    listen = listen.replace("tcp://*:", "tcp://0.0.0.0:", 1)
    return listen, (ipc_to_unix(dial) if sep else None)


def _secret(secret: bytes | None) -> bytes:
    """The worker's job secret (at least 16 bytes), taken out of this process's environment.

    Procs, and the commands they run, must not inherit it: they hold the controller's secret.
    """
    if secret is not None:
        return check_secret(secret, "secret=")
    value = secret_from_env()
    os.environ.pop(SECRET_ENV, None)
    return value


def run_worker_loop_forever(
    *,
    address: str,
    ca: CA | None = None,
    private_key: PrivateKey = None,
    secret: bytes | None = None,
    idle_timeout: float | None = None,
    exit_with_controller: bool = False,
) -> NoReturn:
    """Serve this machine as a host at ``address`` until the process is killed.

    A controller that shuts the host down (``HostMesh.shutdown``) ends the loop too: the
    process then exits with code 0.

    Monarch's form works unchanged: ``run_worker_loop_forever(address="tcp://HOST:PORT",
    ca="trust_all_connections")``. ``address`` is ``tcp://HOST:PORT`` (port 0 picks a free
    one; a ``*`` or ``0.0.0.0`` host listens on every interface), Monarch's
    ``service<ID>@tcp://...``, or ``dial@bind`` (listen on ``bind``, announce ``dial``).
    ``secret`` is the job secret every controller must prove, at least 16 bytes (default:
    ``REGENCY_JOB_SECRET``, hex, which is then removed from this process's environment so that
    procs and their commands do not inherit it). Connections run mutual TLS 1.3 under the
    secret handshake: ``ca=None`` or ``"trust_all_connections"`` uses the job's certificates
    derived from the secret; a CA certificate (PEM bytes or a path) with ``private_key`` (the
    key and its certificate, PEM bytes or a path) uses those, as ``REGENCY_TLS_{CA,CERT,KEY}``
    do. Once listening, prints ``regency worker listening on tcp://IP:PORT`` on stdout; a
    wildcard host is shown as this machine's primary IP. ``idle_timeout`` (regency's addition;
    default: serve forever) ends the loop, exiting with code 0, once no controller has been
    attached for that many seconds (from the start, or since the last one went away).

    Whenever the controller served goes (its connection closes, or falls silent for
    ``heartbeat_timeout``), the worker stops the procs it started for it and its zygote, and
    waits for the next controller; ``exit_with_controller=True`` (regency's addition, for a
    worker that no other controller will attach to) makes it exit instead, with code 0.
    """
    _check_security(ca, private_key)
    if idle_timeout is not None and not idle_timeout > 0:
        raise ValueError(f"idle_timeout must be > 0 seconds or None, got {idle_timeout!r}")
    listen, advertise = _bind_and_advertise(address)
    serve_worker(listen, _secret(secret), advertise, idle_timeout, exit_with_controller)
    raise AssertionError("the worker loop returned")


def start_worker_loop_forever(
    *,
    address: str,
    ca: CA | None = None,
    private_key: PrivateKey = None,
    secret: bytes | None = None,
) -> Future[None]:
    """Start serving this machine as a host in the background; return once listening.

    Takes the arguments of :func:`run_worker_loop_forever`. The returned future stays pending
    while the worker serves (regency's workers serve until their process ends).
    """
    _check_security(ca, private_key)
    listen, advertise = _bind_and_advertise(address)
    start_worker(listen, _secret(secret), advertise)
    return Future._from_pending(Pending())


def run_worker_loop_until_shutdown(
    *,
    address: str,
    ca: CA | None = None,
    private_key: PrivateKey = None,
    secret: bytes | None = None,
) -> None:
    """Serve this machine as a host at ``address`` until its owning ``HostMesh`` shuts it down.

    Then return, instead of ending the process as :func:`run_worker_loop_forever` does. Takes
    the arguments of :func:`run_worker_loop_forever`.
    """
    _check_security(ca, private_key)
    listen, advertise = _bind_and_advertise(address)
    serve_worker_until_shutdown(listen, _secret(secret), advertise)


def worker_command(
    address: str,
    python: str = sys.executable,
    *,
    idle_timeout: float | None = None,
    exit_with_controller: bool = False,
) -> list[str]:
    """The argv that starts a worker daemon listening on ``address``.

    ``python`` is the interpreter to run it with; it must have regency installed.
    ``idle_timeout`` makes it exit once no controller was attached for that many seconds;
    ``exit_with_controller`` once the controller it serves goes.
    """
    argv = [python, "-m", "regency", "worker", "--listen", address]
    if idle_timeout is not None:
        argv += ["--idle-timeout", f"{idle_timeout:g}"]
    if exit_with_controller:
        argv.append("--exit-with-controller")
    return argv


def worker_env(secret: bytes) -> dict[str, str]:
    """The environment additions that give a worker daemon the job secret."""
    return {SECRET_ENV: secret.hex()}
