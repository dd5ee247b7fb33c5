"""More rows of monarch-api.md §1.1 and §2.8-2.10: bootstrap, logger, cleanup on failure,
partial call failures, tracing helpers, MeshFailure, kill."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
from compat_impl import SupervisionError, actor
from compat_util import CALL_TIMEOUT, stop_quietly, wait_for

Actor = actor.Actor
endpoint = actor.endpoint


def _boot_env() -> None:
    os.environ["COMPAT_BOOTSTRAPPED"] = str(os.getpid())


def _boot_fails() -> None:
    raise RuntimeError("bootstrap went wrong")


class Probe(Actor):
    def __init__(self, port=None) -> None:
        self.port = port

    @endpoint
    def env(self) -> tuple[str | None, int]:
        return os.environ.get("COMPAT_BOOTSTRAPPED"), os.getpid()

    @endpoint
    def logger_info(self) -> tuple[str, int, bool]:
        return self.logger.name, self.logger.level, isinstance(self.logger, logging.Logger)

    @endpoint
    def fail_on(self, rank: int) -> int:
        if actor.current_rank().rank == rank:
            raise ValueError(f"rank {rank} fails")
        return actor.current_rank().rank

    @endpoint
    def fail(self) -> None:
        raise ValueError("failing for cleanup")

    @endpoint
    def kill_self(self) -> None:
        actor.context().actor_instance.kill()

    @endpoint
    def ok(self) -> str:
        return "ok"

    def __cleanup__(self, exc: Exception | None) -> None:
        if self.port is not None:  # a file path (see test_compat_lifecycle.Cleaner)
            with open(self.port, "a") as f:
                f.write(f"{exc}\n")


def test_bootstrap_runs_on_each_proc_before_actors():
    procs = actor.this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_boot_env)
    try:
        got = list(procs.spawn("boot", Probe).env.call().get(timeout=CALL_TIMEOUT).values())
        assert [value == str(pid) for value, pid in got] == [True, True]
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_bootstrap_failure_surfaces_on_initialized():
    procs = actor.this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_boot_fails)
    try:
        with pytest.raises(Exception, match="bootstrap went wrong"):
            procs.initialized.get(timeout=CALL_TIMEOUT)
    finally:
        stop_quietly(procs)  # Monarch's stop raises the bootstrap's ActorError again


def test_actor_mesh_initialized_resolves(procs2):
    mesh = procs2.spawn("init_ok", Probe)
    assert mesh.initialized.get(timeout=CALL_TIMEOUT) is None


def test_actor_logger_named_after_the_class(procs2):
    name, level, is_logger = (
        procs2.spawn("logs", Probe).slice(gpus=0).logger_info.call_one().get(timeout=CALL_TIMEOUT)
    )
    assert is_logger
    assert name.endswith("Probe") or "Probe" in name
    assert level == logging.DEBUG


def test_call_with_one_failing_rank_raises_actor_error(procs2):
    mesh = procs2.spawn("partial_call", Probe)
    with pytest.raises(actor.ActorError, match="rank 1 fails"):
        mesh.fail_on.call(1).get(timeout=CALL_TIMEOUT)
    assert list(mesh.fail_on.call(5).get(timeout=CALL_TIMEOUT).values()) == [0, 1]


def test_cleanup_sees_the_error_when_the_actor_fails(make_procs, failures, tmp_path):
    path = tmp_path / "cleanup"
    mesh = make_procs(1).spawn("cleanup_err", Probe, str(path))
    mesh.fail.broadcast()
    got = wait_for(lambda: path.exists() and path.read_text(), CALL_TIMEOUT, "cleanup")
    assert "failing for cleanup" in got


def test_kill_is_a_failure(make_procs, failures):
    mesh = make_procs(1).spawn("killed", Probe)
    mesh.kill_self.broadcast()
    got = failures.wait(1)
    assert any("killed" in str(f) and "crashed_ranks=[0]" in str(f) for f in got)
    with pytest.raises(SupervisionError):
        mesh.ok.call_one().get(timeout=CALL_TIMEOUT)


def test_mesh_failure_is_not_picklable(make_procs, failures):
    mesh = make_procs(1).spawn("nopickle", Probe)
    mesh.fail.broadcast()
    failure = next(f for f in failures.wait(1) if "nopickle" in str(f))
    with pytest.raises(Exception):
        pickle.dumps(failure)


def test_span_and_traced_are_usable():
    with actor.span("compat-span"):
        pass

    @actor.traced
    def plain(x: int) -> int:
        return x + 1

    @actor.traced(name="named")
    def named(x: int) -> int:
        return x * 2

    assert plain(1) == 2
    assert named(3) == 6


def test_get_meter_returns_a_meter():
    from opentelemetry import metrics

    meter = actor.get_meter()
    assert isinstance(meter, metrics.Meter)
    meter.create_counter("compat.counter").add(1, {"kind": "compat"})
    meter.create_up_down_counter("compat.updown").add(-1)
    meter.create_histogram("compat.histogram").record(2.5)
