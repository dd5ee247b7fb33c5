"""``regency debug``: attach this terminal to the debugger of a running controller.

The controller is found in this user's controller files (:mod:`regency.observe.rendezvous`),
or given with ``--host``/``--port``. The client proves a secret the controller holds: the one
in the controller's file, the cached job's (``--job``), or one from ``--secret-file`` (hex).
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from regency.cli._controllers import (
    add_secret_args,
    choose_controller,
    default_job_secret,
    given_secret,
)
from regency.cli._exec import UsageError

_USAGE = 2


def add_debug_parser(commands: Any) -> None:
    """Add ``debug`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "debug",
        help="attach to the ranks paused in breakpoint()",
        description="Attach this terminal to the debugger of a running controller whose procs "
        "reached breakpoint(): list the paused ranks, attach to one rank's pdb, cast a pdb "
        "command to several ranks, continue them all.",
    )
    parser.add_argument("--host", help="the debugger server's host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="the debugger server's port")
    add_secret_args(parser)


def _target(args: argparse.Namespace) -> tuple[tuple[str, int], str]:
    """Where to connect and the token to prove."""
    from regency.observe.debug_wire import debug_token

    secret = given_secret(args)
    if args.port is not None:
        token = debug_token(secret if secret is not None else default_job_secret())
        return (args.host or "127.0.0.1", args.port), token
    chosen = choose_controller(
        "debug",
        args.pid,
        "debug",
        "the debugger: none of its procs has reached breakpoint() yet (or give --host/--port)",
    )
    section = chosen.sections["debug"]
    host, _, port = str(section["address"]).rpartition(":")
    token = debug_token(secret) if secret is not None else str(section["token"])
    return (host.strip("[]"), int(port)), token


def _read_line(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        print()
        return None


def run_debug(args: argparse.Namespace) -> int:
    """``regency debug``: the client's whole session; returns the exit status."""
    from regency.observe.debug_wire import LineChannel, WireError, proof

    try:
        address, token = _target(args)
    except UsageError as exc:
        print(f"regency debug: {exc}", file=sys.stderr)
        return _USAGE
    if sys.stdin.isatty():
        import readline  # noqa: F401  (line editing and history for input())
    try:
        sock = socket.create_connection(address, timeout=10)
    except OSError as exc:
        print(f"regency debug: cannot reach {address[0]}:{address[1]}: {exc}", file=sys.stderr)
        return 1
    channel = LineChannel(sock)
    try:
        challenge = channel.receive().get("challenge")
        if not isinstance(challenge, str):
            raise WireError("the server sent no challenge: is this a regency debugger?")
        channel.send(proof=proof(token, challenge))
        answer = channel.receive()
        if "error" in answer:
            print(f"regency debug: refused: {answer['error']}", file=sys.stderr)
            return 1
        sock.settimeout(None)
        while True:
            message = channel.receive()
            if "out" in message:
                sys.stdout.write(str(message["out"]))
                sys.stdout.flush()
            elif "read" in message:
                line = _read_line(str(message["read"]))
                channel.send(line="quit" if line is None else line)
            elif "error" in message:
                print(f"regency debug: {message['error']}", file=sys.stderr)
                return 1
            elif "bye" in message:
                return 0
    except (OSError, WireError) as exc:
        print(f"regency debug: the connection ended: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print()
        return 130
    finally:
        channel.close()
