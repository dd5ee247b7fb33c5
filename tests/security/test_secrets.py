"""Issue 12 §3: job secrets must be long enough, guessing them online must be slow, and the job
secret stays in the worker daemon (procs and the commands they run never see it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fault_helpers import wait_until
from _worker_helpers import kill_and_check

from regency._transport.ratelimit import (
    FREE_FAILURES,
    GLOBAL_FREE_FAILURES,
    FailureLimiter,
    Peer,
    identify,
)
from regency.actor import Actor, endpoint, this_host
from regency.job import ProcessJob, attach_to_workers, start_worker_loop_forever
from regency.job._exec import run_on_hosts

pytestmark = pytest.mark.timeout(60)

SECRET = os.urandom(32)
SHORT = [b"", b"x", b"fifteen bytes!!"]


def _worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "REGENCY_JOB_SECRET"}
    return subprocess.run(
        [sys.executable, "-m", "regency", "worker", "--listen", "tcp://127.0.0.1:0", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# -- length ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n", "ab", "00" * 15])
def test_short_secret_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "secret"
    path.write_text(text)
    done = _worker({}, "--secret-file", str(path))
    assert done.returncode == 2, done
    assert "at least 16" in done.stderr, done.stderr
    assert str(path) in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["", "  ", "ab", "00" * 15])
def test_short_secret_in_the_environment_is_refused(value: str) -> None:
    done = _worker({"REGENCY_JOB_SECRET": value})
    assert done.returncode == 2, done
    assert "REGENCY_JOB_SECRET" in done.stderr, done.stderr
    assert "at least 16" in done.stderr, done.stderr


@pytest.mark.parametrize("secret", SHORT)
def test_short_secret_argument_is_refused(secret: bytes) -> None:
    with pytest.raises(ValueError, match=r"attach_to_workers\(secret=\).*at least 16"):
        attach_to_workers(["tcp://127.0.0.1:9"], secret=secret)
    with pytest.raises(ValueError, match="at least 16"):
        start_worker_loop_forever(address="tcp://127.0.0.1:0", secret=secret)


def test_sixteen_bytes_are_enough(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("  " + os.urandom(16).hex() + "\n")
    argv = [sys.executable, "-m", "regency", "worker", "--listen", "tcp://127.0.0.1:0"]
    worker = subprocess.Popen(
        [*argv, "--secret-file", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert "listening on tcp://127.0.0.1:" in worker.stdout.readline()
    finally:
        worker.kill()
        worker.wait(10)


# -- rate limit ------------------------------------------------------------------------------


def test_failure_limiter_backs_off_then_forgets() -> None:
    now = [0.0]
    limiter = FailureLimiter(clock=lambda: now[0])
    for _ in range(FREE_FAILURES):
        limiter.failed("ip:10.0.0.1")
        assert limiter.blocked("ip:10.0.0.1") == 0.0
    limiter.failed("ip:10.0.0.1")
    first = limiter.blocked("ip:10.0.0.1")
    assert first > 0.0
    limiter.failed("ip:10.0.0.1")
    assert limiter.blocked("ip:10.0.0.1") > first, "each further failure waits longer"
    assert limiter.blocked("ip:10.0.0.2") == 0.0, "other peers are not affected"
    now[0] += 3600.0
    assert limiter.blocked("ip:10.0.0.1") == 0.0
    limiter.failed("ip:10.0.0.3")  # a new peer prunes the stale record
    assert len(limiter) == 1
    limiter.succeeded("ip:10.0.0.3")
    assert len(limiter) == 0


def test_failure_limiter_keeps_one_budget_for_all_peers_together() -> None:
    # Many keys (addresses of another host, local uids) get one global budget of quick answers
    # between them, besides each its own.
    now = [0.0]
    limiter = FailureLimiter(clock=lambda: now[0])
    for i in range(GLOBAL_FREE_FAILURES):
        limiter.failed(f"ip:10.0.{i}.1")
        assert not limiter.over_budget(f"ip:10.0.{i}.1")
    limiter.failed("ip:10.0.255.1")  # one more than all may make together
    assert limiter.over_budget("ip:10.9.9.9"), "a fresh peer is past the budget of all"
    assert limiter.blocked("ip:10.9.9.9") == 0.0, "but nothing is held against it alone"
    assert not limiter.over_budget(None), "the owner's own processes are never limited"
    now[0] += 3600.0
    assert not limiter.over_budget("ip:10.9.9.9"), "the budget refills"


def test_local_peers_are_known_by_uid_whatever_loopback_address_they_use() -> None:
    me = f"uid:{os.geteuid()}"
    with socket.create_server(("127.0.0.1", 0)) as server:
        for source in ("127.0.0.1", "127.0.3.9"):
            with socket.socket() as client:
                client.bind((source, 0))
                client.connect(server.getsockname())
                accepted, _ = server.accept()
                with accepted:
                    assert identify(accepted) == Peer(me, limited=False)
        # A peer gone before the lookup is nobody's: counted as this machine.
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        client.close()
        with accepted:
            assert wait_until(lambda: identify(accepted) == Peer("host:loopback", True), 5)
    left, right = socket.socketpair()
    with left, right:
        assert identify(left) == Peer(me, limited=False)


def test_failure_limiter_stays_bounded() -> None:
    limiter = FailureLimiter()
    for i in range(20000):
        limiter.failed(f"ip:10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")
    assert len(limiter) <= 4096


# -- no job secret in children ---------------------------------------------------------------


class Env(Actor):
    @endpoint
    def secret_var(self) -> str | None:
        return os.environ.get("REGENCY_JOB_SECRET")


def test_local_procs_do_not_inherit_the_job_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_JOB_SECRET", SECRET.hex())
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert procs.spawn("env", Env).secret_var.call_one().get(timeout=30) is None
    finally:
        procs.stop().get(timeout=30)


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 1})
    job.state(cached_path=None)
    yield job
    kill_and_check(job)


def test_worker_procs_and_exec_commands_do_not_see_the_job_secret(job: ProcessJob) -> None:
    hosts = job.state(cached_path=None).hosts
    procs = hosts.spawn_procs()
    try:
        assert procs.spawn("env", Env).secret_var.call_one().get(timeout=30) is None
    finally:
        procs.stop().get(timeout=30)
    script = "import os; print(os.environ.get('REGENCY_JOB_SECRET', 'absent'))"
    (result,) = run_on_hosts(hosts, [sys.executable, "-c", script], [{}], timeout=30).values()
    assert result.stdout.strip() == "absent", result
