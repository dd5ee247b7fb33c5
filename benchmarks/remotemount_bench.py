"""Remote mount: a cold import of a package from the mount vs from local disk, and a re-mount.

    PYTHONPATH=src python benchmarks/remotemount_bench.py [--module torch] [--hosts 2 | --netns 8]

The source is a hard-link copy of this interpreter's site-packages (made under ``--work``, on the
same file system), so nothing of the venv is ever changed. Each host imports ``--module`` in a
fresh ``python -S`` whose only ``sys.path`` entry for packages is its mount (or, for the local
baseline, the copy itself). The mount is fresh, so every block the import reads is fetched from
the client; the client's source reads hit the page cache as the local baseline's do (the page
cache is not dropped on a shared machine). Then one small file is edited and the mount
refreshed: bytes sent (index and blocks) and seconds. Prints one JSON object.

Hosts: this host (default), ``--hosts N`` ProcessJob hosts, or ``--netns N`` network-namespace
hosts (root; ``tests/multihost/netns.py``, one worker daemon each, attached over TLS as
``multihost_bench.py`` does). Several hosts share this machine, so each mounts at its ``$SUBDIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from regency.actor import Actor, current_rank, endpoint, this_host
from regency.job import ProcessJob
from regency.remotemount import remotemount
from regency.remotemount._actors import point_key

EDITED = "regency_bench_edit.py"
HERE = Path(__file__).resolve().parent


def timed_import(path: str, module: str) -> float:
    """Seconds a fresh ``python -S`` takes to import ``module`` with ``path`` on ``sys.path``."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter(); "
        f"import {module}; print(time.perf_counter() - t)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, path], capture_output=True, text=True, check=True
    )
    return float(done.stdout.split()[-1])


def _host_dir(base: str, per_host: bool) -> str:
    return os.path.join(base, point_key(dict(current_rank()))) if per_host else base


class ImportTimer(Actor):
    """Times an import from this host's mount (``<base>`` or ``<base>/<its $SUBDIR>``)."""

    @endpoint
    def time_import(self, base: str, module: str, per_host: bool) -> float:
        return timed_import(_host_dir(base, per_host), module)

    @endpoint
    def read(self, base: str, name: str, per_host: bool) -> str:
        return Path(_host_dir(base, per_host), name).read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--module", default="torch")
    parser.add_argument("--hosts", type=int, default=1, help="1: this host; N: N ProcessJob hosts")
    parser.add_argument("--netns", type=int, default=0, help="N network-namespace hosts")
    parser.add_argument("--work", default=str(HERE / ".mount-work"))
    args = parser.parse_args()

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = work / "site-packages"
    subprocess.run(["cp", "-al", sysconfig.get_paths()["purelib"], str(source)], check=True)
    (source / EDITED).write_text("EDIT = 0\n")
    files = sum(len(names) for _, _, names in os.walk(source))
    size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file() and not p.is_symlink())
    result: dict[str, Any] = {"module": args.module, "source_files": files, "source_bytes": size}
    result["local_import_s"] = [timed_import(str(source), args.module) for _ in range(2)]
    try:
        with contextlib.ExitStack() as stack:
            if args.netns:
                result["hosts"] = f"{args.netns} netns"
                sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "multihost")]
                from multihost_bench import netns_hosts

                _, hosts = stack.enter_context(netns_hosts(args.netns))
            elif args.hosts > 1:
                result["hosts"] = f"{args.hosts} ProcessJob"
                job = ProcessJob({"hosts": args.hosts})
                stack.callback(job.kill)
                hosts = job.state(cached_path=None).hosts
            else:
                result["hosts"] = "this_host()"
                hosts = this_host()
            per_host = bool(args.netns) or args.hosts > 1
            measure(result, hosts, source, args.module, per_host)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=1))


def measure(result: dict[str, Any], hosts: Any, source: Path, module: str, per_host: bool) -> None:
    """Mount ``source`` on ``hosts``; time the imports and a re-mount into ``result``."""
    mnt = tempfile.mkdtemp(prefix="regency-mount-bench-")
    handler = remotemount(hosts, str(source), f"{mnt}/$SUBDIR" if per_host else mnt)
    started = time.perf_counter()
    handler.open()
    result["open_s"] = time.perf_counter() - started
    result["after_open"] = handler.stats()
    bench_procs = hosts.spawn_procs(name="bench")
    timers = bench_procs.spawn("timer", ImportTimer)
    started = time.perf_counter()
    cold = timers.time_import.call(mnt, module, per_host).get(timeout=600)
    result["mount_cold_import_wall_s"] = time.perf_counter() - started
    result["mount_cold_import_s"] = [v for _, v in cold.items()]
    warm = timers.time_import.call(mnt, module, per_host).get(timeout=600)
    result["mount_warm_import_s"] = [v for _, v in warm.items()]
    result["after_import"] = before = handler.stats()

    edited = source / EDITED
    replacement = source / (EDITED + ".new")
    replacement.write_text("EDIT = 1\n")
    replacement.replace(edited)  # a new inode: the hard-linked original is never touched
    started = time.perf_counter()
    handler.refresh()
    result["refresh_s"] = time.perf_counter() - started
    started = time.perf_counter()
    seen = timers.read.call(mnt, EDITED, per_host).get(timeout=60)
    result["first_read_after_refresh_s"] = time.perf_counter() - started
    assert all(text == "EDIT = 1\n" for _, text in seen.items())
    after = handler.stats()
    result["remount_sent"] = {k: after[k] - before[k] for k in after}
    bench_procs.stop().get(timeout=60)
    handler.close()


if __name__ == "__main__":
    main()
