"""A proc agent serves its requests by type: held while its proc boots, unknown ones refused."""

from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from regency._runtime.actors.control.control import PingProc, ProcStats
from regency._runtime.actors.execution.proc_agent import ProcAgent, _Booted
from regency._runtime.kernel.refs import PortRef


def _agent(booting: bool) -> tuple[ProcAgent, list[tuple[PortRef, int, Any]]]:
    answers: list[tuple[PortRef, int, Any]] = []

    def send_port(port: PortRef, rank: int, flags: int, parts: list[bytes]) -> None:
        answers.append((port, rank, pickle.loads(parts[0])))

    runtime: Any = SimpleNamespace(address="unix:/tmp/proc", send_port=send_port)
    return ProcAgent(runtime, booting=booting), answers


def test_a_ping_waits_for_the_bootstrap_while_stats_do_not() -> None:
    agent, answers = _agent(booting=True)
    port = PortRef("unix:/tmp/caller", 7)
    agent.handle(PingProc(port, 3))
    agent.handle(ProcStats(port, 4))
    assert answers == [(port, 4, {})]  # the ping is held
    agent.handle(_Booted("Traceback: boom"))
    assert answers == [(port, 4, {}), (port, 3, "Traceback: boom")]


def test_an_unknown_request_is_refused_with_its_type_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, answers = _agent(booting=False)
    with caplog.at_level(logging.WARNING, logger="regency.proc"):
        agent.handle({"spawn": "me"})
        agent.handle(_Booted(None))  # only meaningful while booting
    assert answers == []
    # (a record made in an actor's process carries the [actor=...] prefix first)
    assert [r.getMessage().rpartition("] ")[2] for r in caplog.records] == [
        "proc agent got an unknown request 'dict'",
        "proc agent got an unknown request '_Booted'",
    ]
