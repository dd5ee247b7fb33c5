"""Exceptions vs crashes and supervision (monarch-api.md §2.8 outcome matrix, §2.9, §1.1).

A failure poisons Monarch's proc (no new spawns there), so each scenario that breaks an actor
gets procs of its own (``make_procs``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading

import pytest
from compat_impl import SupervisionError, actor
from compat_util import CALL_TIMEOUT, wait_for

Actor = actor.Actor
endpoint = actor.endpoint

FAILED = "and all its descendants have failed"


class Custom(BaseException):
    pass


class Worker(Actor):
    def __init__(self) -> None:
        self.cleanups: list[str] = []

    @endpoint
    async def ok(self) -> int:
        return actor.current_rank().rank

    @endpoint
    async def fail(self, text: str = "failed") -> None:
        raise ValueError(text)

    @endpoint
    async def base(self) -> None:
        raise Custom("custom base")

    @endpoint
    async def exit(self, code: int) -> None:
        os._exit(code)

    @endpoint
    async def kill_self(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    async def exit_on(self, rank: int, code: int) -> int:
        if actor.current_rank().rank == rank:
            os._exit(code)
        return actor.current_rank().rank

    @endpoint(explicit_response_port=True)
    async def explicit_raise(self, port) -> None:
        raise ValueError("explicit raised")

    @actor.concurrent_endpoint
    async def conc_fail(self) -> None:
        raise ValueError("conc fail")

    @endpoint
    async def sleep(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"


class InitFails(Actor):
    def __init__(self) -> None:
        raise ValueError("init bad")

    @endpoint
    def a(self) -> int:
        return 1


class Supervisor(Actor):
    """Owns a child mesh on its own proc and reports what __supervise__ saw."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.seen: list[str] = []
        self.names: list[str] = []
        self.child = None

    def __supervise__(self, failure) -> bool:
        self.seen.append(str(failure))
        self.names.append(failure.mesh_name)
        if self.verdict == "raise":
            raise RuntimeError("supervise raised this")
        return self.verdict == "handle"

    @endpoint
    def spawn_child(self, gpus: int = 1) -> None:
        procs = actor.this_host().spawn_procs(per_host={"gpus": gpus})
        self.child = procs.spawn("child", Worker)
        self.child.initialized.get()

    @endpoint
    def child_ref(self):
        return self.child

    @endpoint
    def break_child(self) -> None:
        self.child.fail.broadcast("child broke")

    @endpoint
    def seen_so_far(self) -> list[str]:
        return list(self.seen)

    @endpoint
    def mesh_names(self) -> list[str]:
        return list(self.names)

    @endpoint
    def alive(self) -> str:
        return "alive"


class Holder(Actor):
    @endpoint
    def break_it(self, mesh) -> None:
        mesh.fail.broadcast("broken by holder")

    @endpoint
    def alive(self) -> str:
        return "holder alive"


def _one(make_procs, cls=Worker, name="w", *args):
    return make_procs(1).spawn(name, cls, *args)


# --- outcome matrix ---------------------------------------------------------------------


def test_exception_with_reply_is_actor_error_and_no_supervision(make_procs, failures):
    w = _one(make_procs)
    with pytest.raises(actor.ActorError, match="plain"):
        w.fail.call_one("plain").get(timeout=CALL_TIMEOUT)
    assert w.ok.call_one().get(timeout=CALL_TIMEOUT) == 0
    assert failures.new() == []


def test_broadcast_exception_kills_the_actor(make_procs, failures):
    w = _one(make_procs, Worker, "bc")
    w.fail.broadcast("no reply path")
    got = failures.wait(1)
    assert "crashed_ranks=[0]" in str(got[0])
    with pytest.raises(SupervisionError, match=FAILED):
        w.ok.call_one().get(timeout=CALL_TIMEOUT)


def test_send_without_port_exception_kills_the_actor(make_procs, failures):
    w = _one(make_procs, Worker, "snp")
    actor.send(w.fail, ("no port",), {})
    failures.wait(1)
    with pytest.raises(SupervisionError, match=FAILED):
        w.ok.call_one().get(timeout=CALL_TIMEOUT)


def test_mesh_failure_str_names_mesh_and_ranks(make_procs, failures):
    w = _one(make_procs, Worker, "named_failure")
    w.fail.broadcast("for the report")
    f = failures.wait(1)[0]
    text = str(f)
    assert text.startswith("MeshFailure(mesh_name=named_failure")
    assert "crashed_ranks=[0]" in text
    assert "<root>.<test_compat_supervision.Worker named_failure{'gpus': 0/1}>" in text
    assert f.mesh_name.startswith("named_failure")
    assert FAILED in f.report()


def test_explicit_port_endpoint_raising_is_supervision_error(make_procs, failures):
    w = _one(make_procs, Worker, "xp")
    with pytest.raises(SupervisionError) as info:
        w.explicit_raise.call_one().get(timeout=CALL_TIMEOUT)
    assert str(info.value).startswith(
        "Endpoint call xp.explicit_raise() failed, The actor "
        "<root>.<test_compat_supervision.Worker xp{'gpus': 0/1}> "
        "and all its descendants have failed"
    )
    with pytest.raises(SupervisionError, match=FAILED):
        w.ok.call_one().get(timeout=CALL_TIMEOUT)


def test_concurrent_endpoint_exception_is_actor_error(make_procs, failures):
    w = _one(make_procs, Worker, "ce")
    with pytest.raises(actor.ActorError, match="conc fail") as info:
        w.conc_fail.call_one().get(timeout=CALL_TIMEOUT)
    assert str(info.value).startswith("Actor call ce.conc_fail failed.")
    assert w.ok.call_one().get(timeout=CALL_TIMEOUT) == 0


def test_base_exception_is_supervision_error(make_procs, failures):
    w = _one(make_procs, Worker, "be")
    with pytest.raises(SupervisionError) as info:
        w.base.call_one().get(timeout=CALL_TIMEOUT)
    assert str(info.value).startswith("Endpoint call be.base() failed, The actor ")
    assert FAILED in str(info.value)
    with pytest.raises(SupervisionError):
        w.ok.call_one().get(timeout=CALL_TIMEOUT)


def test_supervision_error_is_runtime_error():
    assert issubclass(SupervisionError, RuntimeError)


def test_init_failure_is_not_raised_at_spawn(make_procs, failures):
    mesh = make_procs(1).spawn("initfail", InitFails)
    assert mesh is not None
    with pytest.raises(SupervisionError, match=FAILED):
        mesh.a.call_one().get(timeout=CALL_TIMEOUT)
    got = failures.wait(1)
    assert "initfail" in str(got[0])


def test_init_failure_one_event_per_rank(make_procs, failures):
    make_procs(2).spawn("initfail2", InitFails)
    got = failures.wait(1)
    ranks = "".join(str(f) for f in got)
    assert "initfail2" in ranks


def test_process_exit_is_supervision_error(make_procs, failures):
    w = _one(make_procs, Worker, "ex")
    with pytest.raises(SupervisionError) as info:
        w.exit.call_one(3).get(timeout=CALL_TIMEOUT)
    text = str(info.value)
    assert text.startswith(
        "Endpoint call ex.exit() failed, The actor "
        "<root>.<test_compat_supervision.Worker ex{'gpus': 0/1}> "
        "and all its descendants have failed:"
    )
    assert "the process this actor was running on exited with non-zero code 3" in text


def test_sigkill_is_supervision_error(make_procs, failures):
    w = _one(make_procs, Worker, "sk")
    with pytest.raises(SupervisionError, match=FAILED) as info:
        w.kill_self.call_one().get(timeout=CALL_TIMEOUT)
    assert "the process this actor was running on" in str(info.value)


def test_after_process_death_healthy_rank_works(make_procs, failures):
    procs = make_procs(2)
    w = procs.spawn("half", Worker)
    with pytest.raises(SupervisionError):
        w.exit_on.call(1, 4).get(timeout=CALL_TIMEOUT)
    assert w.slice(gpus=0).ok.call_one().get(timeout=CALL_TIMEOUT) == 0


def test_after_process_death_calls_to_dead_rank_fail_fast(make_procs, failures):
    procs = make_procs(2)
    w = procs.spawn("dead", Worker)
    with pytest.raises(SupervisionError):
        w.slice(gpus=1).exit.call_one(5).get(timeout=CALL_TIMEOUT)
    with pytest.raises(SupervisionError, match="exited with non-zero code 5"):
        w.slice(gpus=1).ok.call_one().get(timeout=CALL_TIMEOUT)
    with pytest.raises(SupervisionError, match=FAILED):
        w.ok.call().get(timeout=CALL_TIMEOUT)


def test_after_process_death_root_sees_crashed_rank(make_procs, failures):
    procs = make_procs(2)
    w = procs.spawn("crashed", Worker)
    with pytest.raises(SupervisionError):
        w.slice(gpus=1).exit.call_one(6).get(timeout=CALL_TIMEOUT)
    got = failures.wait(1)
    assert any("crashed_ranks=[1]" in str(f) for f in got)


def test_proc_mesh_stop_succeeds_after_process_death(make_procs, failures):
    procs = make_procs(2)
    w = procs.spawn("stopdead", Worker)
    with pytest.raises(SupervisionError):
        w.slice(gpus=0).exit.call_one(7).get(timeout=CALL_TIMEOUT)
    assert procs.stop().get(timeout=CALL_TIMEOUT) is None


def test_respawn_on_same_host_after_death_works(make_procs, failures):
    w = _one(make_procs, Worker, "first")
    with pytest.raises(SupervisionError):
        w.exit.call_one(8).get(timeout=CALL_TIMEOUT)
    again = make_procs(1).spawn("second", Worker)
    assert again.ok.call_one().get(timeout=CALL_TIMEOUT) == 0


def test_other_meshes_on_the_same_procs_unaffected_by_exception_failure(make_procs, failures):
    procs = make_procs(1)
    a = procs.spawn("victim", Worker)
    b = procs.spawn("bystander", Worker)
    b.initialized.get(timeout=CALL_TIMEOUT)
    a.fail.broadcast("only a")
    failures.wait(1)
    assert b.ok.call_one().get(timeout=CALL_TIMEOUT) == 0


def test_slice_excluding_failed_rank_still_works(make_procs, failures):
    procs = make_procs(2)
    w = procs.spawn("partial", Worker)
    w.slice(gpus=1).fail.broadcast("rank 1 only")
    failures.wait(1)
    assert w.slice(gpus=0).ok.call_one().get(timeout=CALL_TIMEOUT) == 0
    with pytest.raises(SupervisionError):
        w.slice(gpus=1).ok.call_one().get(timeout=CALL_TIMEOUT)


def test_long_running_endpoint_is_not_a_failure(make_procs, failures):
    w = _one(make_procs, Worker, "long")
    assert w.sleep.call_one(2.0).get(timeout=CALL_TIMEOUT) == "slept"
    assert failures.new() == []


@pytest.mark.deviation(
    "regency keeps a proc usable after an actor on it failed; Monarch poisons it", skip="regency"
)
def test_proc_is_poisoned_after_a_failure(make_procs, failures):
    procs = make_procs(1)
    w = procs.spawn("poison", Worker)
    w.fail.broadcast("poison")
    failures.wait(1)
    poisoned = "Cannot spawn new actors on mesh with supervision events"
    with pytest.raises(RuntimeError, match=poisoned):
        procs.spawn("after", Worker).initialized.get(timeout=CALL_TIMEOUT)


# --- __supervise__ and propagation -----------------------------------------------------------


def _supervisor(make_procs, verdict):
    sup = make_procs(1).spawn("sup", Supervisor, verdict)
    sup.spawn_child.call_one().get(timeout=CALL_TIMEOUT)
    return sup


def _wait_seen(sup):
    return wait_for(
        lambda: sup.seen_so_far.call_one().get(timeout=CALL_TIMEOUT), CALL_TIMEOUT, "__supervise__"
    )


def test_supervise_true_handles_the_failure(make_procs, failures):
    sup = _supervisor(make_procs, "handle")
    sup.break_child.call_one().get(timeout=CALL_TIMEOUT)
    seen = _wait_seen(sup)
    assert len(seen) >= 1
    assert "child" in seen[0]
    assert sup.alive.call_one().get(timeout=CALL_TIMEOUT) == "alive"
    assert failures.new() == []


def test_supervise_receives_the_owned_mesh_name(make_procs, failures):
    sup = _supervisor(make_procs, "handle")
    sup.break_child.call_one().get(timeout=CALL_TIMEOUT)
    _wait_seen(sup)
    names = sup.mesh_names.call_one().get(timeout=CALL_TIMEOUT)
    assert names
    assert names[0].startswith("child")


def test_supervise_false_fails_the_owner(make_procs, failures):
    sup = _supervisor(make_procs, "propagate")
    sup.break_child.call_one().get(timeout=CALL_TIMEOUT)
    got = failures.wait(1)
    assert any("sup" in str(f) for f in got)
    with pytest.raises(SupervisionError, match=FAILED):
        sup.alive.call_one().get(timeout=CALL_TIMEOUT)


def test_supervise_raising_reaches_the_client(make_procs, failures):
    sup = _supervisor(make_procs, "raise")
    sup.break_child.call_one().get(timeout=CALL_TIMEOUT)
    failures.wait(1)
    with pytest.raises(SupervisionError, match="supervise raised this"):
        sup.alive.call_one().get(timeout=CALL_TIMEOUT)


def test_failure_on_a_reference_goes_to_the_owner(make_procs, failures):
    sup = _supervisor(make_procs, "handle")
    child = sup.child_ref.call_one().get(timeout=CALL_TIMEOUT)
    holder = make_procs(1).spawn("holder", Holder)
    holder.break_it.call_one(child).get(timeout=CALL_TIMEOUT)
    seen = _wait_seen(sup)
    assert len(seen) >= 1
    assert holder.alive.call_one().get(timeout=CALL_TIMEOUT) == "holder alive"
    assert failures.new() == []


def test_unhandled_fault_hook_called_once_per_failure(make_procs, failures):
    w = _one(make_procs, Worker, "once")
    w.fail.broadcast("once")
    failures.wait(1)
    assert len([f for f in failures.new() if "once" in str(f)]) == 1


# --- where Monarch hangs and regency does better ----------------------------------------------


@pytest.mark.deviation(
    "Monarch: a spawn on a proc mesh one of whose procs died never completes (initialized and "
    "calls time out); regency spawns on the surviving procs",
    skip="monarch",
)
def test_spawn_after_a_proc_death_works_on_surviving_procs(make_procs, failures):
    procs = make_procs(2)
    w = procs.spawn("dies", Worker)
    with pytest.raises(SupervisionError):
        w.slice(gpus=1).exit.call_one(9).get(timeout=CALL_TIMEOUT)
    again = procs.spawn("again", Worker)
    assert again.slice(gpus=0).ok.call_one().get(timeout=CALL_TIMEOUT) == 0


# --- an actor blocked in __init__ (issue 18, difference 3) ------------------------------------


class Helper(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


class BlocksInInit(Actor):
    def __init__(self, port) -> None:
        helper = actor.context().actor_instance.proc.spawn("helper", Helper)
        port.send(helper)
        threading.Event().wait()  # forever: only a stop or the proc's end releases it

    @endpoint
    def never(self) -> None:
        pass


@pytest.mark.timeout(90)
def test_actor_blocked_in_init_does_not_block_its_proc(make_procs):
    procs = make_procs(1)
    port, receiver = actor.Channel.open()
    procs.spawn("blocked", BlocksInInit, port)
    helper = receiver.recv().get(timeout=CALL_TIMEOUT)
    assert helper.ping.call_one().get(timeout=CALL_TIMEOUT) == "pong"


# --- failures two owners down -------------------------------------------------------------


class Lambda(Actor):
    @endpoint
    def run(self, func):
        return func()


class Nest(Actor):
    """Owns a mesh of its own, spawned on procs it started."""

    def __init__(self) -> None:
        self.nest = actor.this_host().spawn_procs(per_host={"a_dim": 1}).spawn("nested", Lambda)

    @endpoint
    def nested(self, func) -> None:
        self.nest.run.broadcast(func)

    @endpoint
    def kill_nest(self) -> None:
        pid = self.nest.run.call_one(os.getpid).get(timeout=CALL_TIMEOUT)
        os.kill(pid, signal.SIGKILL)


def _nested_error() -> None:
    raise ValueError("nested went wrong")


def test_nested_failure_report_names_the_nested_actor(make_procs, failures):
    top = _one(make_procs, Nest, "nest_top")
    top.nested.call_one(_nested_error).get(timeout=CALL_TIMEOUT)
    report = failures.wait(1)[0].report()
    pattern = r"The actor .*test_compat_supervision\.Lambda nested\{'a_dim': 0/1\}.*" + FAILED
    assert re.search(pattern, report), report


def test_killed_nested_proc_reads_killed_sig_9(make_procs, failures):
    top = _one(make_procs, Nest, "nest_kill")
    top.kill_nest.call_one().get(timeout=CALL_TIMEOUT)
    report = failures.wait(1)[0].report()
    assert "the process this actor was running on failed: Killed(sig=9)" in report, report
