"""Another local user cannot lock the owner out of a transport listener, nor out-guess its budget.

On one machine the listeners tell local users apart by what the kernel says (the uid owning a
loopback peer's socket), not by address: the other user's failures count against that user
whatever 127.x.y.z address it dials from, and never against the owner. A correct proof is always
judged and accepted; a wrong one past the budget is held unanswered until the connection's
deadline, so the budget stays a budget. The attacker is a second uid (``_attacker``) running
``_guesser.py`` with the system's Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _attacker import Attacker, attacker
from _transport_ends import End, marker
from _worker_helpers import raw_worker

from regency._transport import address, auth, routing
from regency._transport.ratelimit import FREE_FAILURES, FailureLimiter
from regency.job import attach_to_workers

pytestmark = pytest.mark.timeout(120)
__all__ = ["attacker"]  # fixtures
GUESSER = Path(__file__).with_name("_guesser.py")
SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture
def as_attacker(attacker: Attacker) -> Attacker:
    """The second user, able to run the guesser."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the second user to run the guesser with")
    return attacker


def run_as(attacker: Attacker, spec: dict[str, object], timeout: float = 60) -> dict[str, float]:
    """Run the guesser as ``attacker``; its JSON report."""
    done = subprocess.run(
        [str(SYSTEM_PYTHON), "-I", str(GUESSER), json.dumps(spec)],
        user=attacker.name,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, float] = json.loads(done.stdout)
    return report


def guesses(target: str, count: int, **more: object) -> dict[str, object]:
    """A guesser spec: ``count`` wrong proofs at transport address ``target``."""
    return {
        "mode": "guess",
        "host": address.tcp_host(target),
        "port": address.tcp_port(target),
        "preamble": routing.preamble("").hex(),
        "hello_len": auth.HELLO_LEN,
        "refused": auth.REFUSED.hex(),
        "count": count,
        **more,
    }


def answered(report: dict[str, float]) -> float:
    """Guesses whose verdict came back (a refusal or a hang-up after the proof)."""
    return report.get("refused", 0) + report.get("hung up", 0)


def test_wrong_proofs_of_another_user_do_not_lock_the_owner_out_of_a_worker(
    as_attacker: Attacker,
) -> None:
    secret = os.urandom(32)
    with raw_worker(secret) as worker:
        report = run_as(as_attacker, guesses(worker.address, 20, parallel=20, wait=2.0))
        started = time.monotonic()
        hosts = attach_to_workers([worker.address], secret=secret, timeout=10)
        took = time.monotonic() - started
        hosts.shutdown().get(timeout=30)
    assert took < 5, f"the owner's attach took {took:.1f} s"
    assert answered(report) <= FREE_FAILURES, report


@pytest.fixture
def listener() -> Iterator[End]:
    end = End()
    try:
        yield end
    finally:
        end.close()


def test_rotating_loopback_addresses_buys_no_more_guesses(
    as_attacker: Attacker, listener: End
) -> None:
    sources = [f"127.0.{i // 200}.{i % 200 + 2}" for i in range(40)]
    spec = guesses(listener.transport.address, 40, parallel=20, wait=1.5, sources=sources)
    report = run_as(as_attacker, spec)
    # One budget for the user, whichever address it dials from; the rest are held unanswered.
    assert answered(report) <= FREE_FAILURES, report
    assert report.get("held", 0) >= 40 - FREE_FAILURES, report
    # The owner, holding the secret, is served at once meanwhile.
    dialer = End()
    try:
        sent = marker()
        dialer.send(listener.transport.address, sent)
        assert listener.frames.get(timeout=10) == sent
    finally:
        dialer.close()


def test_a_churning_flood_of_another_user_leaves_every_fresh_connection_working(
    as_attacker: Attacker, listener: End
) -> None:
    target = listener.transport.address
    flood = {
        "mode": "flood",
        "host": address.tcp_host(target),
        "port": address.tcp_port(target),
        "preamble": routing.preamble("").hex(),
        "source": "127.0.0.1",
        "seconds": 8.0,
        "keep": 200,
        "limit": 20000,
        "pause": 0.0,
        "parallel": 4,
    }
    proc = subprocess.Popen(
        [str(SYSTEM_PYTHON), "-I", str(GUESSER), json.dumps(flood)],
        user=as_attacker.name,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    times = []
    try:
        deadline = time.monotonic() + 10
        while listener.transport._inbound.pending() < 64 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener.transport._inbound.pending() >= 64, "the flood did not start"
        for _ in range(8):
            dialer = End()
            try:
                sent = marker()
                started = time.monotonic()
                dialer.send(target, sent)
                times.append(time.monotonic() - started)
                assert listener.frames.get(timeout=10) == sent
            finally:
                dialer.close()
    finally:
        out, _ = proc.communicate(timeout=30)
    assert json.loads(out)["opened"] > 200, out
    assert max(times) < 5, times


def test_the_rdma_transfer_service_keeps_the_same_budget(
    as_attacker: Attacker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regency.rdma import RDMABuffer, _service

    monkeypatch.setattr(_service, "_auth_failures", FailureLimiter())  # this test's own count
    buf = RDMABuffer(bytearray(64))
    try:
        spec = guesses(buf._handle.tcp_address, 12, parallel=12, wait=1.5, preamble="")
        report = run_as(as_attacker, spec)
    finally:
        buf.drop().get(timeout=30)
    assert answered(report) <= FREE_FAILURES, report
    assert report.get("held", 0) >= 12 - FREE_FAILURES, report


def test_held_guesses_filling_the_listener_do_not_turn_the_owner_away(
    as_attacker: Attacker, listener: End
) -> None:
    # Small bounds stand for several local users holding all 256 places with held guesses.
    inbound = listener.transport._inbound
    inbound._limit = inbound._per_peer = 8
    free = run_as(as_attacker, guesses(listener.transport.address, FREE_FAILURES, wait=3.0))
    assert free.get("refused") == FREE_FAILURES, free
    spec = guesses(listener.transport.address, 8, parallel=8, wait=3.0)
    attack = subprocess.Popen(
        [str(SYSTEM_PYTHON), "-I", str(GUESSER), json.dumps(spec)],
        user=as_attacker.name,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 10
        while inbound.pending() < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert inbound.pending() == 8, "the guesses did not fill the listener"
        dialer = End()
        try:
            sent = marker()
            dialer.send(listener.transport.address, sent)
            assert listener.frames.get(timeout=10) == sent
        finally:
            dialer.close()
    finally:
        out, _ = attack.communicate(timeout=30)
    assert answered(json.loads(out)) <= 1, out  # the one pushed out to make room
