"""``regency telemetry sql "SELECT ..."``: query the telemetry recorder, or the live job's tables.

By default it reads the SQLite file that controllers with telemetry on write (``telemetry_db``,
by default this user's ``$TMPDIR/regency-<uid>/telemetry/telemetry.db``), read-only: a
statement that would change it fails; no server is needed. With ``--live`` it asks a running
controller's admin API (``/v1/telemetry/query``) instead, which answers over the whole job's
tables kept on every host (actors, meshes, messages, ...). Prints an aligned table, or JSON
rows with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from regency.cli._controllers import add_admin_args, admin_target
from regency.cli._exec import UsageError

_USAGE = 2
_WIDTH_MAX = 60


def add_telemetry_parser(commands: Any) -> None:
    """Add ``telemetry`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "telemetry",
        help="query the local telemetry recorder",
        description="Query the spans, metrics and failures that controllers with telemetry on "
        "recorded (see docs/introspection.md for the tables).",
    )
    actions = parser.add_subparsers(dest="telemetry_command", required=True)
    sql = actions.add_parser("sql", help="run one read-only SQL statement")
    sql.add_argument("statement", help='e.g. "SELECT name, duration_ms FROM spans LIMIT 5"')
    sql.add_argument("--db", metavar="PATH", help="the database (default: this user's recorder)")
    sql.add_argument("--json", action="store_true", help="print the rows as JSON objects")
    sql.add_argument(
        "--live",
        action="store_true",
        help="query the whole job's tables through a running controller's admin API",
    )
    add_admin_args(sql)


def _live(args: argparse.Namespace) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The statement's answer from the running controller's admin API."""
    from regency.observe.admin_client import AdminClient

    if args.db is not None:
        raise UsageError("--live queries the running job, --db a recorder file: give one")
    answer = AdminClient(*admin_target(args, "telemetry sql")).query(args.statement)
    if answer.get("truncated"):
        print(f"regency telemetry: only the first {len(answer['rows'])} rows", file=sys.stderr)
    return list(answer["columns"]), [tuple(row) for row in answer["rows"]]


def run_telemetry(args: argparse.Namespace) -> int:
    """Run ``regency telemetry sql``; return the exit status."""
    from regency._private_paths import UnsafePathError
    from regency.observe.admin_client import AdminError
    from regency.observe.telemetry.recorder import database_path, run_sql

    if args.live:
        try:
            columns, rows = _live(args)
        except (UsageError, AdminError) as exc:
            print(f"regency telemetry: {exc}", file=sys.stderr)
            return _USAGE
    elif any(getattr(args, name) is not None for name in ("url", "pid", "job", "secret_file")):
        print("regency telemetry: --url, --pid, --job and --secret-file go with --live",
              file=sys.stderr)  # fmt: skip
        return _USAGE
    else:
        path = Path(args.db).expanduser() if args.db else database_path()
        try:
            columns, rows = run_sql(args.statement, path)
        except (FileNotFoundError, UnsafePathError) as exc:
            print(f"regency telemetry: {exc}", file=sys.stderr)
            return 1
        except sqlite3.Error as exc:
            print(f"regency telemetry: {type(exc).__name__}: {exc} (in {path})", file=sys.stderr)
            return _USAGE
    if args.json:
        for row in rows:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=str))
        return 0
    print(_table(columns, rows))
    return 0


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    text = str(value)
    return text if len(text) <= _WIDTH_MAX else text[: _WIDTH_MAX - 3] + "..."


def _table(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)
