"""Starting worker daemons: the loop itself, and the command and environment that run it."""

from __future__ import annotations

import sys
from typing import NoReturn

from regency._runtime import worker
from regency.job._attach import SECRET_ENV, secret_from_env


def run_worker_loop_forever(*, address: str, secret: bytes | None = None) -> NoReturn:
    """Serve this machine as a host at ``address`` until the process is killed.

    A controller that shuts the host down (``HostMesh.shutdown``) ends the loop too: the
    process then exits with code 0.

    ``address`` is ``tcp://HOST:PORT`` (port 0 picks a free one). ``secret`` is the job
    secret (default: ``REGENCY_JOB_SECRET``, hex). Once listening, prints
    ``regency worker listening on tcp://IP:PORT`` on stdout; a wildcard host is shown as this
    machine's primary IP.
    """
    worker.serve(address, secret if secret is not None else secret_from_env())
    raise AssertionError("the worker loop returned")


def worker_command(address: str, python: str = sys.executable) -> list[str]:
    """The argv that starts a worker daemon listening on ``address``.

    ``python`` is the interpreter to run it with; it must have regency installed.
    """
    return [python, "-m", "regency", "worker", "--listen", address]


def worker_env(secret: bytes) -> dict[str, str]:
    """The environment additions that give a worker daemon the job secret."""
    return {SECRET_ENV: secret.hex()}
