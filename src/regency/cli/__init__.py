"""The ``regency`` command (also ``python -m regency``).

``regency worker --listen tcp://HOST:PORT [--secret-file PATH] [--idle-timeout SECONDS]
[--exit-with-controller]`` runs a worker daemon that serves this machine as a host to a controller
(see ``docs/multihost.md``). The job secret (at least 16 bytes) comes from ``--secret-file`` or
the ``REGENCY_JOB_SECRET`` environment variable (hex); without one the command exits with status
2. With ``--idle-timeout`` it exits (status 0) once no controller has been attached for that
long; with ``--exit-with-controller``, once the controller it serves goes.

``regency apply [MODULE.ATTR]`` imports a job object (``myjob.job``), saves it as the active
context's job and brings it up; ``regency context create|use|rm|ls NAME`` manages the contexts
(``.regency/NAME/``) that ``.regency/job_state.pkl`` links to, and scripts get the active job
from ``regency.job.load_current_job()`` (see ``docs/multihost.md``).

``regency exec [--all | --one | --point DIM=I ...] [--mesh NAME] [--job PATH] -- CMD ...`` runs a
command on the hosts of the job cached by an earlier ``job.state()`` (``.regency/job_state.pkl``),
streaming each host's lines prefixed with its rank; ``regency kill [NAME] [--job PATH]`` tears that
job (or context ``NAME``'s) down and removes the cache.

``regency shell [--mesh NAME] [--point DIM=I ...] [--local] [--job PATH] [-e K=V] [--workdir DIR]``
opens an interactive shell on a pty of one host of the cached job, or of this machine with
``--local`` (see ``docs/port-forwarding.md``).

``regency logs [--job PATH] [--run ID | --list] [--tail N]`` prints the log files of forwarded
procs: this machine's, or those of the cached job's hosts (see ``docs/observability.md``).

``regency debug [--pid PID | --host H --port P] [--job PATH | --secret-file PATH]`` attaches to
the debugger of a running controller whose procs reached ``breakpoint()`` (see
``docs/observability.md``).

``regency stacks [--pid PID | --url URL] [--mesh NAME] [--job PATH | --secret-file PATH]``
prints every proc's Python stacks through a running controller's admin API (see
``docs/observability.md``).

``regency telemetry sql "SELECT ..." [--db PATH] [--json]`` queries the spans, metrics and
failures that controllers with telemetry on recorded locally; with ``--live [--pid PID | --url
URL]`` it queries the whole job's tables (actors, meshes, messages, ...) through a running
controller's admin API instead (see ``docs/introspection.md``).

``regency top [--pid PID | --url URL] [--interval SECONDS]`` shows a running controller's hosts,
procs and actors live in the terminal (the ``tui`` extra), and ``regency dashboard [--open]``
prints the link of its web dashboard (see ``docs/introspection.md``).

``regency run --nproc-per-node N [--job PATH] [-m] SCRIPT ARGS ...`` runs a torchrun script on
``N`` procs per host (this host, or the cached job's) with torchrun's environment, printing each
rank's output with a ``[rankN]:`` prefix, and exits with the first failing rank's status (see
``docs/spmd.md``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from regency._transport.auth import SECRET_ENV
from regency.cli._secrets import read_secret


def _parser() -> argparse.ArgumentParser:
    from regency.cli._context import add_apply_parser, add_context_parser
    from regency.cli._debug import add_debug_parser
    from regency.cli._exec import add_exec_parser, add_kill_parser
    from regency.cli._logs import add_logs_parser
    from regency.cli._run import add_run_parser
    from regency.cli._shell import add_shell_parser
    from regency.cli._stacks import add_stacks_parser
    from regency.cli._telemetry import add_telemetry_parser
    from regency.cli._top import add_dashboard_parser, add_top_parser

    parser = argparse.ArgumentParser(prog="regency", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="serve this machine as a host")
    worker.add_argument(
        "--listen", required=True, metavar="tcp://HOST:PORT", help="where to listen (port 0: any)"
    )
    worker.add_argument(
        "--secret-file",
        metavar="PATH",
        help=f"file holding the job secret in hex (default: ${SECRET_ENV})",
    )
    worker.add_argument(
        "--idle-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="exit once no controller has been attached for this long (default: serve forever)",
    )
    worker.add_argument(
        "--exit-with-controller",
        action="store_true",
        help="exit once the controller served goes (default: wait for the next one)",
    )
    add_apply_parser(commands)
    add_context_parser(commands)
    add_exec_parser(commands)
    add_kill_parser(commands)
    add_shell_parser(commands)
    add_run_parser(commands)
    add_logs_parser(commands)
    add_debug_parser(commands)
    add_stacks_parser(commands)
    add_telemetry_parser(commands)
    add_top_parser(commands)
    add_dashboard_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``regency`` command line; return the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "apply":
        from regency.cli._context import run_apply

        return run_apply(args)
    if args.command == "context":
        from regency.cli._context import run_context

        return run_context(args)
    if args.command == "exec":
        from regency.cli._exec import run_exec

        return run_exec(args)
    if args.command == "run":
        from regency.cli._run import run_run

        return run_run(args)
    if args.command == "kill":
        from regency.cli._exec import run_kill

        return run_kill(args)
    if args.command == "shell":
        from regency.cli._shell import run_shell

        return run_shell(args)
    if args.command == "logs":
        from regency.cli._logs import run_logs

        return run_logs(args)
    if args.command == "debug":
        from regency.cli._debug import run_debug

        return run_debug(args)
    if args.command == "stacks":
        from regency.cli._stacks import run_stacks

        return run_stacks(args)
    if args.command == "telemetry":
        from regency.cli._telemetry import run_telemetry

        return run_telemetry(args)
    if args.command == "top":
        from regency.cli._top import run_top

        return run_top(args)
    if args.command == "dashboard":
        from regency.cli._top import run_dashboard

        return run_dashboard(args)
    return _worker(args)


def _worker(args: argparse.Namespace) -> int:
    try:
        secret = read_secret(args.secret_file)
    except (OSError, ValueError) as exc:
        print(f"regency worker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        format="regency worker %(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from regency.actor._worker import run_worker_loop_forever

    if args.idle_timeout is not None and args.idle_timeout <= 0:
        print("regency worker: --idle-timeout must be > 0 seconds", file=sys.stderr)
        return 2
    try:
        run_worker_loop_forever(
            address=args.listen,
            secret=secret,
            idle_timeout=args.idle_timeout,
            exit_with_controller=args.exit_with_controller,
        )
    except (OSError, ValueError) as exc:
        print(f"regency worker: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    return 0
