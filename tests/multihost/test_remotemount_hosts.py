"""Remote and gather mounts across ProcessJob hosts (each host its own worker daemon)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from _worker_helpers import kill_and_check, kill_group

from regency.actor import Actor, current_rank, endpoint
from regency.gather_mount import gather_mount
from regency.job import ProcessJob
from regency.remotemount import remotemount
from regency.remotemount._fuse import fuse_problem, is_mounted

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(fuse_problem() is not None, reason=f"no FUSE here: {fuse_problem()}"),
]


class HostImporter(Actor):
    """Imports a client-only package from its host's mount (``<base>/hosts_<n>``)."""

    @endpoint
    def import_from(self, base: str) -> tuple[int, str]:
        directory = os.path.join(base, f"hosts_{current_rank()['hosts']}")
        sys.path.insert(0, directory)
        try:
            import hostonly_pkg  # type: ignore[import-not-found]
        finally:
            sys.path.remove(directory)
        return hostonly_pkg.VALUE, hostonly_pkg.__file__


def _mounts_under(base: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return [line.split()[4] for line in table if line.split()[4].startswith(str(base))]


def _mounts_left_under(base: Path, timeout: float = 15.0) -> list[str]:
    """The mounts under ``base`` once they are gone, or when ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while (left := _mounts_under(base)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_remote_mount_on_every_host_then_gather_their_outputs(tmp_path: Path) -> None:
    source = tmp_path / "client"
    (source / "hostonly_pkg").mkdir(parents=True)
    (source / "hostonly_pkg" / "__init__.py").write_text("VALUE = 7\n")
    mounts = tmp_path / "mounts"
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        # Both "hosts" share this machine, so each mounts at its own $SUBDIR.
        handler = remotemount(hosts, str(source), f"{mounts}/$SUBDIR")
        handler.open()
        assert sorted(_mounts_under(mounts)) == [f"{mounts}/hosts_0", f"{mounts}/hosts_1"]
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        found = procs.spawn("imp", HostImporter).import_from.call(str(mounts)).get(timeout=60)
        assert sorted(value for _, value in found.items()) == sorted(
            [(7, f"{mounts}/hosts_{h}/hostonly_pkg/__init__.py") for h in (0, 1) for _ in (0, 1)]
        )

        outputs = tmp_path / "outputs"
        for h in (0, 1):
            (outputs / f"hosts_{h}").mkdir(parents=True)
            (outputs / f"hosts_{h}" / "rank.log").write_text(f"host {h}\n")
        gathered = tmp_path / "gathered"
        with gather_mount(hosts, f"{outputs}/$SUBDIR", str(gathered)):
            assert sorted(os.listdir(gathered)) == ["hosts_0", "hosts_1"]
            assert (gathered / "hosts_1" / "rank.log").read_text() == "host 1\n"
            assert (gathered / "hosts_0" / "rank.log").read_text() == "host 0\n"
        assert not is_mounted(str(gathered))

        procs.stop().get(timeout=30)
        handler.close()
        assert _mounts_under(mounts) == []
    finally:
        kill_and_check(job)
    assert _mounts_left_under(tmp_path) == []


def test_killing_the_hosts_leaves_no_stale_mount(tmp_path: Path) -> None:
    source = tmp_path / "client"
    source.mkdir()
    (source / "a.py").write_text("A = 1\n")
    mounts = tmp_path / "mounts"
    job = ProcessJob({"hosts": 2})
    try:
        handler = remotemount(job.state(cached_path=None).hosts, str(source), f"{mounts}/$SUBDIR")
        handler.open()
        assert (mounts / "hosts_1" / "a.py").read_text() == "A = 1\n"
        # SIGKILL each host's whole process group at once (worker, zygote, procs, and whatever
        # they started in their group): no code of theirs runs, no helper of theirs survives.
        for group in job._workers.values():
            for worker in group:
                kill_group(worker.pid)
        assert _mounts_left_under(mounts) == [], "a FUSE mount outlived its host"
    finally:
        kill_and_check(job)


def test_gather_mount_of_a_lost_host_reads_eio_and_the_others_still_serve(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    for h in (0, 1):
        (outputs / f"hosts_{h}").mkdir(parents=True)
        (outputs / f"hosts_{h}" / "rank.log").write_text(f"host {h}\n")
    gathered = tmp_path / "gathered"
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        with gather_mount(hosts, f"{outputs}/$SUBDIR", str(gathered)) as mount:
            assert (gathered / "hosts_1" / "rank.log").read_text() == "host 1\n"
            kill_group(job._workers["hosts"][1].pid)
            started = time.monotonic()
            with pytest.raises(OSError) as caught:
                (gathered / "hosts_1" / "rank.log").read_text()
            assert caught.value.errno == 5  # EIO
            assert time.monotonic() - started < 35, "the read waited past its call timeout"
            assert (gathered / "hosts_0" / "rank.log").read_text() == "host 0\n"
            mount.close()
        assert not is_mounted(str(gathered))
    finally:
        kill_and_check(job)
