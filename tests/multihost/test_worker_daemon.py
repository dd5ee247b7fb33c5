"""The worker daemon: its command line, who may attach to it, and one controller at a time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _worker_helpers import LISTENING, Failures, Probe, kill_group, raw_worker, wait_gone

from regency.job import AttachError, attach_to_workers, worker_command, worker_env

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent


def test_worker_without_a_secret_exits_with_status_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_JOB_SECRET"}
    done = subprocess.run(
        worker_command("tcp://127.0.0.1:0"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no job secret: REGENCY_JOB_SECRET is not set" in done.stderr
    assert done.stdout == ""


def test_worker_with_a_bad_address_exits_with_status_2() -> None:
    done = subprocess.run(
        worker_command("tcp://127.0.0.1:0/proc"),
        env={**os.environ, **worker_env(os.urandom(32))},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "cannot listen on tcp://127.0.0.1:0/proc" in done.stderr


def test_secret_file_and_wildcard_address(tmp_path: Path) -> None:
    secret = os.urandom(32)
    path = tmp_path / "secret"
    path.write_text(secret.hex())
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_JOB_SECRET"}
    proc = subprocess.Popen(
        [*worker_command("tcp://0.0.0.0:0"), "--secret-file", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = LISTENING.search(line)
        assert found, line
        assert "0.0.0.0" not in found.group(1), "a wildcard is announced as the primary IP"
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def test_wrong_secret_is_refused_on_both_sides() -> None:
    with raw_worker(os.urandom(32)) as worker:
        with pytest.raises(AttachError) as info:
            attach_to_workers([worker.address], secret=os.urandom(32), timeout=10)
        message = str(info.value)
        assert f"cannot attach worker {worker.address}" in message, message
        assert "authentication failed" in message, message
        line = worker.wait_for_log("rejected a connection from 127.0.0.1")
        assert "wrong secret" in line
        assert worker.proc.poll() is None, "a bad peer does not hurt the worker"


def test_address_that_does_not_answer_fails_within_the_timeout() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"tcp://127.0.0.1:{closed.getsockname()[1]}"
    with socket.socket() as silent:  # accepts (in the backlog) but never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        mute = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(AttachError) as info:
            attach_to_workers([refused, mute], secret=os.urandom(32), timeout=1)
        assert time.monotonic() - start < 3
    message = str(info.value)
    for address in (refused, mute):
        assert f"cannot attach worker {address}: " in message, message
    assert message.count("no answer within 1 s") == 2, message


CONTROLLER = textwrap.dedent(
    """
    import json, sys
    from _worker_helpers import Probe
    from regency.job import attach_to_workers

    hosts = attach_to_workers([sys.argv[1]], timeout=30)
    probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
    print(json.dumps([w["pid"] for w in probes.where.call().get(timeout=30).values()]), flush=True)
    sys.stdin.readline()
    """
)


def test_one_controller_at_a_time_and_the_next_after_a_disconnect() -> None:
    secret = os.urandom(32)
    with raw_worker(secret) as worker:
        first = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER, worker.address],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **worker_env(secret)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert first.stdout is not None
            line = first.stdout.readline()
            assert line, "the first controller failed"
            pids = json.loads(line)
            with pytest.raises(AttachError, match="already serves controller"):
                attach_to_workers([worker.address], secret=secret, timeout=10)
        finally:
            first.kill()  # its connections drop at once: no goodbye
            first.wait(10)
            for pipe in (first.stdin, first.stdout):
                if pipe is not None:
                    pipe.close()
        for pid in pids:
            wait_gone(pid)  # the worker stopped the lost controller's procs
        worker.wait_for_log("waiting for the next controller")
        hosts = attach_to_workers([worker.address], secret=secret, timeout=10)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        where = procs.spawn("probes", Probe).where.call_one().get(timeout=30)
        assert where["host"] == worker.address
        assert where["pid"] not in pids
        procs.stop().get(timeout=30)


def test_a_new_worker_on_a_lost_workers_port_is_attached_afresh(failures: Failures) -> None:
    """Over a long run the kernel hands a new worker the TCP port of one this controller lost
    earlier; attaching to the new one must dial it, not report the old one's loss."""
    secret = os.urandom(32)
    with raw_worker(secret) as first:
        hosts = attach_to_workers([first.address], secret=secret, timeout=10)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        old = procs.spawn("probes", Probe).where.call_one().get(timeout=30)
        kill_group(first.proc.pid)
        failures.wait_for(1, timeout=30)  # the controller saw the host go
    with raw_worker(secret, listen=first.address) as second:
        assert second.address == first.address
        hosts = attach_to_workers([second.address], secret=secret, timeout=10)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        where = procs.spawn("probes", Probe).where.call_one().get(timeout=30)
        assert where["host"] == second.address
        assert where["pid"] != old["pid"]
        procs.stop().get(timeout=30)
