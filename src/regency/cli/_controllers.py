"""Finding a running controller of this user, and the secret a client proves to it.

``regency debug``, ``regency stacks``, ``regency top`` and ``regency dashboard`` talk to a
controller's services; each service says where it listens in the controller's file
(:mod:`regency.observe.rendezvous`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from regency.cli._exec import UsageError, _load_job
from regency.cli._secrets import read_secret
from regency.job._trait import DEFAULT_JOB_PATH
from regency.observe.rendezvous import Controller, running_controllers


def add_secret_args(parser: Any) -> None:
    """``--pid``, ``--job`` and ``--secret-file``: which controller, and the secret to prove."""
    parser.add_argument("--pid", type=int, help="the controller's process id (when several run)")
    parser.add_argument(
        "--job",
        metavar="PATH",
        help=f"prove the secret of this cached job (e.g. {DEFAULT_JOB_PATH})",
    )
    parser.add_argument("--secret-file", metavar="PATH", help="prove the secret in this file (hex)")


def given_secret(args: argparse.Namespace) -> bytes | None:
    """The secret of ``--secret-file`` or of the ``--job`` cache; ``None`` when neither is given."""
    if args.secret_file is not None:
        try:
            return read_secret(args.secret_file)
        except (OSError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
    if args.job is not None:
        secret: bytes = _load_job(Path(args.job)).secret
        return secret
    return None


def default_job_secret() -> bytes:
    """The secret of the job cached at the default path, for a client given only an address."""
    default = Path(DEFAULT_JOB_PATH)
    if not default.exists():
        raise UsageError("with an explicit address, give --job PATH or --secret-file PATH to prove")
    secret: bytes = _load_job(default).secret
    return secret


def choose_controller(section: str, pid: int | None, command: str, service: str) -> Controller:
    """The newest live controller of this user serving ``section`` (or the one with ``pid``)."""
    found = running_controllers(section)
    if pid is not None:
        found = [c for c in found if c.pid == pid]
    if not found:
        which = f"controller {pid}" if pid is not None else "controller of yours"
        raise UsageError(f"no running {which} serves {service}")
    chosen = found[0]
    if len(found) > 1:
        print(
            f"regency {command}: {len(found)} controllers serve {service}; using pid "
            f"{chosen.pid} ({chosen.program}); --pid chooses another",
            file=sys.stderr,
        )
    return chosen


def add_admin_args(parser: Any) -> None:
    """``--url`` and the secret arguments: which controller's admin API, and how to prove."""
    parser.add_argument("--url", help="the admin API's URL (default: the controller's file)")
    add_secret_args(parser)


def admin_target(args: argparse.Namespace, command: str) -> tuple[str, str]:
    """The admin API's URL and the bearer token to send, from ``add_admin_args``' arguments."""
    from regency.observe import admin_token

    secret = given_secret(args)
    if args.url is not None:
        return args.url.rstrip("/"), admin_token(
            secret if secret is not None else default_job_secret()
        )
    chosen = choose_controller(
        "admin",
        args.pid,
        command,
        "the admin API (start it with job.enable_admin() or regency.observe.start_admin(), "
        "or give --url)",
    )
    section = chosen.sections["admin"]
    token = admin_token(secret) if secret is not None else str(section["token"])
    return str(section["url"]).rstrip("/"), token
