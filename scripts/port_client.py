#!/usr/bin/env python3
"""Run a Monarch client library's own tests on regency (see docs/porting.md).

Give it a checkout of the library (it fetches nothing); it copies the checkout to a scratch
directory, rewrites the library's Monarch imports there to regency's public names (the table
in docs/porting.md), lists any private Monarch name it could not map, and runs pytest in the
copy with this checkout's ``src`` first on ``PYTHONPATH``::

    python scripts/port_client.py ~/src/torchstore --overlay /tmp/ts-deps -- tests/test_store.py

``--overlay`` is a ``pip install --target`` folder with the library's own pure-Python
dependencies (torchstore: pygtrie, portpicker, pytest-asyncio, pytest-unordered); it goes on
``PYTHONPATH`` after regency. ``--monarch`` runs the unchanged copy instead (with the
interpreter given by ``--python``: one that has torchmonarch), for the side-by-side figure.
The arguments after ``--`` go to pytest. The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# (pattern, replacement): Monarch's private names first, then its public modules.
REWRITES: list[tuple[str, str]] = [
    # The current context variable: ``actor_mesh._context.get()`` -> ``context_or_none()``.
    (
        r"from monarch\._src\.actor import actor_mesh\b",
        "from regency.actor import context_or_none as _regency_context_or_none",
    ),
    (r"\bactor_mesh\._context\.get\(\)", "_regency_context_or_none()"),
    # A host mesh from a torch.distributed store.
    (r"\bmonarch\._src\.spmd\.host_mesh\b", "regency.spmd"),
    # The meshes an actor spawned.
    (r"\bactor_instance\._children\b", "actor_instance.children"),
    # Monarch's public modules have regency twins of the same name.
    (r"\bmonarch\.(actor|rdma|config|job|spmd|shape)\b", r"regency.\1"),
    (r"^import monarch$", "import regency as monarch"),
    (r"^from monarch import ", "from regency import "),
]
# ``from monarch._src.actor.actor_mesh import _context``, then ``_context.get()``.
IMPORTED_CONTEXT = re.compile(r"^from monarch\._src\.actor\.actor_mesh import _context$", re.M)
BARE_CONTEXT = re.compile(r"(?<![\w.])_context\.get\(\)")
# Private names left: Monarch's private modules, and ``_children`` read off another variable
# than ``actor_instance`` (port it by hand: ``.children``, which holds live meshes only).
LEFT_OVER = re.compile(r"\bmonarch\._(?:src|rust_bindings)\b[\w.]*|\w+\._children\b")


def rewrite(text: str) -> str:
    """``text`` with every mapped Monarch name replaced by regency's."""
    if IMPORTED_CONTEXT.search(text):
        text = IMPORTED_CONTEXT.sub(
            "from regency.actor import context_or_none as _regency_context_or_none", text
        )
        text = BARE_CONTEXT.sub("_regency_context_or_none()", text)
    for pattern, replacement in REWRITES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def port(library: Path, scratch: Path) -> list[str]:
    """Copy ``library`` into ``scratch`` with its imports rewritten; return what is left over."""
    shutil.copytree(library, scratch, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    left: list[str] = []
    for path in sorted(scratch.rglob("*.py")):
        text = path.read_text()
        ported = rewrite(text)
        if ported != text:
            path.write_text(ported)
        left += [f"{path.relative_to(scratch)}: {name}" for name in LEFT_OVER.findall(ported)]
    return left


def main() -> int:
    """Port the library given on the command line and run its tests."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path, help="a checkout of the client library")
    parser.add_argument("--overlay", type=Path, help="the library's dependencies (pip --target)")
    parser.add_argument("--scratch", type=Path, help="where to copy it (default: a new temp dir)")
    parser.add_argument("--monarch", action="store_true", help="run it unchanged, on Monarch")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for pytest")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    pytest_args = argv[split + 1 :]
    if not args.library.is_dir():
        parser.error(f"{args.library} is not a directory")
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="regency-port-")) / "library"
    if scratch.exists():
        parser.error(f"{scratch} exists: give a new --scratch path")
    if args.monarch:
        shutil.copytree(args.library, scratch, ignore=shutil.ignore_patterns(".git"))
        paths = [scratch]
    else:
        for line in port(args.library, scratch):
            print(f"not ported (no regency name): {line}", file=sys.stderr)
        paths = [SRC, scratch]
    if args.overlay is not None:
        paths.append(args.overlay.resolve())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}
    print(f"running the tests of {scratch}", file=sys.stderr)
    command = [args.python, "-m", "pytest", "-p", "pytest_asyncio", *pytest_args]
    return subprocess.run(command, cwd=scratch, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
