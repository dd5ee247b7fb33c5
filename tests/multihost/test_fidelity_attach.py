"""Monarch's multi-host bootstrap, unchanged: worker loops and attach_to_workers with ``ca=``.

A Monarch bootstrap script runs ``run_worker_loop_forever(address=..., ca="trust_all_connections")``
on each host and ``attach_to_workers(workers=[...], ca="trust_all_connections")`` in the
controller. In regency the same calls work; the job secret (``REGENCY_JOB_SECRET``) still
authenticates every connection.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _worker_helpers import Probe, kill_group

from regency.actor import attach_to_workers, returns_future
from regency.job import worker_env

pytestmark = pytest.mark.timeout(120)

MONARCH_WORKER = (
    "from regency.actor import run_worker_loop_forever\n"
    "run_worker_loop_forever(address={address!r}, ca='trust_all_connections')\n"
)


@contextmanager
def monarch_style_worker(secret: bytes, address: str) -> Iterator[str]:
    """A worker started the way Monarch's scripts start one; yields the address it announced."""
    proc = subprocess.Popen(
        [sys.executable, "-c", MONARCH_WORKER.format(address=address)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **worker_env(secret)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"regency worker listening on (\S+)", line)
        assert found, f"worker printed {line!r}"
        yield found.group(1)
    finally:
        kill_group(proc.pid)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_monarch_bootstrap_script_runs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = os.urandom(32)
    monkeypatch.setenv("REGENCY_JOB_SECRET", secret.hex())
    with (
        monarch_style_worker(secret, "tcp://127.0.0.1:0") as first,
        monarch_style_worker(secret, "service<2MuAHeDjLCEd>@tcp://127.0.0.1:0") as second,
    ):

        @returns_future
        async def discovered() -> str:
            return second

        hosts = attach_to_workers(
            workers=[f"service<x>@{first}", discovered()],
            ca="trust_all_connections",
            name="hosts",
        )
        assert hosts.sizes == {"hosts": 2}
        assert hosts.initialized.get(timeout=10) is True
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        try:
            where = procs.spawn("probes", Probe).where.call().get(timeout=60)
            assert [w["host"] for w in where.values()] == [first, second]
        finally:
            procs.stop().get(timeout=30)


def test_ipc_workers_like_monarchs_process_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = os.urandom(32)
    monkeypatch.setenv("REGENCY_JOB_SECRET", secret.hex())
    given = [f"ipc://{tmp_path}/hosts_{i}" for i in range(2)]
    with (
        monarch_style_worker(secret, given[0]) as first,
        monarch_style_worker(secret, given[1]) as second,
    ):
        assert [first, second] == [f"unix:{tmp_path}/hosts_{i}" for i in range(2)]
        hosts = attach_to_workers(workers=given, ca="trust_all_connections")
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        try:
            where = procs.spawn("probes", Probe).where.call().get(timeout=60)
            assert [w["host"] for w in where.values()] == [first, first, second, second]
            assert len({w["pid"] for w in where.values()}) == 4
        finally:
            procs.stop().get(timeout=30)


def test_wildcard_and_bind_alias_addresses() -> None:
    secret = os.urandom(32)
    with monarch_style_worker(secret, "tcp://*:0") as wildcard:
        assert "*" not in wildcard
        assert "0.0.0.0" not in wildcard, "a wildcard is announced as the primary IP"
    with monarch_style_worker(secret, "tcp://localhost:7@tcp://127.0.0.1:0") as alias:
        assert alias == "tcp://localhost:7", "the dial side of dial@bind is announced"


HOSTS_FROM_CONFIG = textwrap.dedent(
    """
    from _worker_helpers import Probe
    from regency.actor import hosts_from_config

    hosts = hosts_from_config("trainers")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    where = procs.spawn("probes", Probe).where.call().get(timeout=60)
    print(hosts.sizes, len({w["host"] for w in where.values()}), flush=True)
    procs.stop().get(timeout=30)
    """
)


def test_hosts_from_config_gives_two_local_hosts() -> None:
    done = subprocess.run(
        [sys.executable, "-c", HOSTS_FROM_CONFIG],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'hosts': 2} 2"
