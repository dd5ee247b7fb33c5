"""Mesh tensors next to actors: passed to endpoints (each rank gets its local shard, in order
with the tensor ops before the call), ``endpoint.rref`` (results left on the workers), the
errors, and a view activated before its parent."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from pathlib import Path

import pytest
import torch

import regency
from regency.actor import (
    Actor,
    ActorError,
    MeshFailure,
    ProcMesh,
    RestartPolicy,
    SupervisionError,
    current_rank,
    endpoint,
)
from regency.mesh_controller import RemoteException

pytestmark = pytest.mark.timeout(120)

T = 60.0


def explode(t: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom from the worker")


failing = regency.remote(explode, propagate=lambda t: t)


@regency.remote(propagate="inspect")
def wait_for(path: str, seconds: float) -> None:
    """Keep the stream busy until ``path`` exists (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@regency.remote(propagate="inspect")
def exit_worker() -> None:
    raise SystemExit("the tensor worker exits")


def my_pid() -> int:
    return os.getpid()


class Summer(Actor):
    def __init__(self) -> None:
        self.kept: torch.Tensor | None = None

    @endpoint
    def total(self, t: torch.Tensor) -> tuple[str, int, list[float]]:
        return type(t).__name__, current_rank().rank, t.tolist()

    @endpoint
    def keep(self, t: torch.Tensor) -> None:
        self.kept = t

    @endpoint
    def kept_values(self) -> list[float]:
        assert self.kept is not None
        return self.kept.tolist()

    @endpoint(propagate=lambda t, k: (t * k, t.sum()))
    def scaled(self, t: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
        return t * k + current_rank().rank, t.sum()

    @endpoint(propagate=lambda t: t)
    def refuse(self, t: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"rank {current_rank().rank} refuses")

    @endpoint(propagate=lambda: torch.empty(2, dtype=torch.float64))
    def wrong_shape(self) -> torch.Tensor:
        return torch.zeros(3)

    @endpoint(propagate=lambda: (torch.empty(3), torch.empty(3)))
    def wrong_count(self) -> torch.Tensor:
        return torch.zeros(3)

    @endpoint(propagate="inspect")
    def note(self, t: torch.Tensor) -> torch.Tensor:
        self.kept = t
        return t

    @endpoint
    def no_propagate(self) -> torch.Tensor:
        return torch.zeros(1)

    @endpoint(propagate=lambda t: t)
    def die(self, t: torch.Tensor) -> torch.Tensor:
        raise SystemExit("the actor exits")

    @endpoint
    def whoami(self) -> tuple[int, int]:
        return current_rank().rank, os.getpid()


class AsyncSummer(Actor):
    @endpoint
    async def total(self, t: torch.Tensor) -> list[float]:
        await asyncio.sleep(0)
        return t.tolist()


def test_mesh_tensor_arrives_as_each_ranks_local_shard(procs: ProcMesh) -> None:
    actors = procs.spawn("summer", Summer)
    with procs.activate():
        t = torch.ones(3) * (procs.rank_tensor("gpus") + 1)
        # Inside activate(): the call is an actor call like any other.
        got = sorted(actors.total.call(t).get(timeout=T).values())
    assert got == [("Tensor", 0, [1.0] * 3), ("Tensor", 1, [2.0] * 3)]
    # Outside activate() too, and one rank at a time; t stays usable.
    assert actors.slice(gpus=1).total.call_one(t).get(timeout=T)[2] == [2.0] * 3
    assert regency.inspect(t + 1, gpus=1).tolist() == [3.0] * 3
    asynchronous = procs.spawn("async_summer", AsyncSummer)
    assert asynchronous.total.call(t).get(timeout=T).item(gpus=0) == [1.0] * 3


def test_the_call_sees_the_ops_issued_before_it_and_a_copy_of_them(
    procs: ProcMesh, tmp_path: Path
) -> None:
    # The stream's worker is busy while the actors' messages arrive, so each actor decodes its
    # message before the worker decodes the batch that publishes its shard: the order in which
    # an earlier version, waiting inside unpickling (under the import lock), hung.
    actors = procs.spawn("keeper", Summer)
    flag = tmp_path / "go"
    with procs.activate():
        t = torch.zeros(2)
        wait_for(str(flag), 30.0)  # the stream is busy: the write below waits behind this
        t.add_(5)
        actors.keep.broadcast(t)  # the actors wait for the stream to reach this point
        t.add_(100)  # later ops on the stream do not show in what the actors were given
        later = actors.kept_values.call()  # ordered after keep, as calls are
        assert not later._pending.done
        flag.touch()
        assert later.get(timeout=T).item(gpus=1) == [5.0, 5.0]
        assert regency.inspect(t, gpus=1).tolist() == [105.0, 105.0]


def test_a_poisoned_tensor_fails_the_call_with_the_remote_exception_text(
    procs: ProcMesh,
) -> None:
    actors = procs.spawn("poisoned", Summer)
    with pytest.raises(RemoteException):  # noqa: PT012 - the failure is also raised at exit
        with procs.activate():
            bad = failing(torch.ones(2))  # the call site the error must name
            with pytest.raises(ActorError) as caught:
                actors.total.call(bad).get(timeout=T)
            text = str(caught.value)
            assert "A remote command failed on rank" in text
            assert "bad = failing(torch.ones(2))  # the call site the error must name" in text
            assert "ValueError: boom from the worker" in text
            assert isinstance(caught.value.exception, RemoteException)
            # The actors and the stream go on.
            assert actors.slice(gpus=0).total.call_one(torch.ones(1)).get(timeout=T)[2] == [1.0]


def test_a_tensor_of_another_mesh_or_without_a_shard_there_is_a_value_error(
    procs: ProcMesh, procs4: ProcMesh
) -> None:
    elsewhere = procs4.spawn("elsewhere", Summer)
    with procs.activate():
        t = torch.ones(1)
    with pytest.raises(ValueError, match="must be located on the same process as the actor"):
        elsewhere.total.call(t)
    actors = procs.spawn("sliced", Summer)
    with procs.slice(gpus=0).activate():
        only_rank_0 = torch.ones(1)
    with pytest.raises(ValueError, match=r"no shard on the procs of ranks \[1\]"):
        actors.total.call(only_rank_0)
    assert actors.slice(gpus=0).total.call_one(only_rank_0).get(timeout=T)[2] == [1.0]
    # Outside an actor call a mesh tensor does not pickle.
    with pytest.raises(TypeError, match="only as an argument of an actor endpoint"):
        pickle.dumps(t)


class Holder(Actor):
    def __init__(self, state: torch.Tensor, k: int = 0) -> None:
        self.state = state
        self.k = k

    @endpoint
    def show(self) -> tuple[str, int, list[float], int]:
        return type(self.state).__name__, current_rank().rank, self.state.tolist(), self.k


def test_a_mesh_tensor_as_a_constructor_argument(procs: ProcMesh, procs4: ProcMesh) -> None:
    with procs.activate():
        state = torch.ones(2) * (procs.rank_tensor("gpus") + 1)
        holders = procs.spawn("holders", Holder, state, k=3)  # each rank gets its shard
    shown = holders.show.call().get(timeout=T)
    assert shown.item(gpus=0) == ("Tensor", 0, [1.0, 1.0], 3)
    assert shown.item(gpus=1) == ("Tensor", 1, [2.0, 2.0], 3)
    with pytest.raises(ValueError, match="must be located on the same process as the actor"):
        procs4.spawn("foreign", Holder, state)
    with pytest.raises(ValueError, match="cannot be combined with a restart policy"):
        procs.spawn("restarting", Holder, state, restart=RestartPolicy())


class Maker(Actor):
    @endpoint
    def make(self, n: int) -> torch.Tensor:
        return torch.full((n,), float(current_rank().rank))


def test_replies_and_fetched_values_are_local_inside_activate(procs: ProcMesh) -> None:
    makers = procs.spawn("makers", Maker)
    with procs.activate():
        small = makers.make.call(3).get(timeout=T).item(gpus=1)  # read inside the block
        big = makers.make.call(1 << 16).get(timeout=T).item(gpus=1)  # out of band
        total = regency.inspect(torch.ones(4).sum()).item()  # .item() of a fetched value
    assert type(small) is torch.Tensor
    assert small.tolist() == [1.0, 1.0, 1.0]
    assert type(big) is torch.Tensor
    assert float(big.sum()) == float(1 << 16)
    assert total == 4.0


def test_rref_leaves_the_results_on_the_workers(procs: ProcMesh) -> None:
    actors = procs.spawn("scaler", Summer)
    with procs.activate():
        t = torch.ones(2) * (procs.rank_tensor("gpus") + 1)
        scaled, total = actors.scaled.rref(t, 10.0)
        assert scaled.shape == (2,)
        assert total.shape == ()
        after = scaled + total  # usable in later ops, like any mesh tensor
        assert regency.inspect(after, gpus=0).tolist() == [12.0, 12.0]
        assert regency.inspect(scaled, gpus=1).tolist() == [21.0, 21.0]
        assert actors.note.rref(t) is None  # propagate="inspect": no results
        trusted = actors.wrong_shape.rref()  # propagate is trusted, as Monarch trusts it
        assert (trusted.shape, trusted.dtype) == ((2,), torch.float64)
        assert regency.inspect(trusted, gpus=1).tolist() == [0.0, 0.0, 0.0]
        assert actors.kept_values.call().get(timeout=T).item(gpus=1) == [2.0, 2.0]
    with pytest.raises(NotImplementedError, match="Cached propagation"):
        actors.no_propagate.rref()


def test_rref_failures_poison_the_results(procs: ProcMesh) -> None:
    actors = procs.spawn("refuser", Summer)
    with pytest.raises(RemoteException):  # noqa: PT012 - unfetched failures raise at exit
        with procs.activate():
            refused = actors.refuse.rref(torch.ones(2))
            with pytest.raises(RemoteException, match="rank 1 refuses") as caught:
                regency.inspect(refused + 1, gpus=1)
            assert "refused = actors.refuse.rref(torch.ones(2))" in str(caught.value)
            wrong = actors.wrong_count.rref()
            with pytest.raises(RemoteException, match=r"returned tensors \[torch.float32\[3\]\]"):
                regency.inspect(wrong)
            assert regency.inspect(torch.ones(1) * 2, gpus=1).tolist() == [2.0]


def test_rref_to_an_actor_that_dies_poisons_its_results_instead_of_hanging(
    procs: ProcMesh, request: pytest.FixtureRequest
) -> None:
    failures: list[MeshFailure] = request.getfixturevalue("_record_root_failures")
    actors = procs.spawn("doomed", Summer)
    with procs.activate():
        results = actors.die.rref(torch.ones(2))  # each actor dies running it
        for rank in range(2):
            with pytest.raises(RemoteException, match=r"(?s)doomed.die.*SystemExit"):
                regency.inspect(results, gpus=rank)
        assert regency.inspect(torch.ones(1) + 1, gpus=1).tolist() == [2.0]
    deadline = time.monotonic() + T
    while not any("doomed" in str(f) for f in failures):
        assert time.monotonic() < deadline, "the owner never heard of the failure"
        time.sleep(0.01)
    # Once the owner knows, an rref to the failed actors is refused before anything is sent.
    with procs.activate(), pytest.raises(SupervisionError, match="doomed"):
        actors.scaled.rref(torch.ones(2), 1.0)


def test_killing_a_proc_fails_the_call_waiting_for_its_tensor(make_procs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(2)
    actors = mesh.spawn("waiting", Summer)
    _, victim = actors.slice(gpus=1).whoami.call_one().get(timeout=T)
    flag = tmp_path / "go"
    with mesh.activate():
        t = torch.ones(2)
        wait_for(str(flag), 60.0)
        fut = actors.total.call(t + 1)  # both actors wait for the stream
    assert not fut._pending.done
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(SupervisionError, match="waiting"):
        fut.get(timeout=T)
    assert time.monotonic() - start < 5.0
    flag.touch()  # rank 0's stream and actor go on (and the mesh stops without waiting)


def test_a_failed_tensor_worker_fails_the_call_waiting_for_it(make_procs) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(2)
    actors = mesh.spawn("orphaned", Summer)
    with mesh.activate():
        t = torch.ones(2)
        exit_worker()  # the stream's worker dies of this before it reaches the call
        fut = actors.total.call(t)
    with pytest.raises(ActorError, match="worker of stream 'main' on this proc failed"):
        fut.get(timeout=T)
    assert actors.whoami.call().get(timeout=T).item(gpus=1)[0] == 1  # the actors live on


def test_slice_made_before_its_parent_was_activated(make_procs) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(4)
    upper = mesh.slice(gpus=slice(2, 4))  # the mesh has no workers yet
    with upper.activate():
        r = upper.rank_tensor("gpus") + 0
    assert [regency.inspect(r, gpus=i).item() for i in range(2)] == [0, 1]
    with mesh.activate():
        whole = mesh.rank_tensor("gpus") * 1
    assert regency.inspect(whole, gpus=3).item() == 3


class Released(Actor):
    """Takes mesh tensors; fails (a broadcast that raises) once a file exists."""

    @endpoint
    def fail_once(self, path: str) -> None:
        deadline = time.monotonic() + T
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("the actor fails with calls queued behind this one")

    @endpoint
    def total(self, t: torch.Tensor) -> list[float]:
        return t.tolist()

    @endpoint
    def pair(self, a: torch.Tensor, b: torch.Tensor) -> list[float]:
        return a.tolist() + b.tolist()


class ShardCount(Actor):
    @endpoint
    def held(self) -> tuple[int, int]:
        """Shards published on this proc for calls that have not taken them, and slots of
        calls that will never run whose shards are still to come."""
        from regency._tensor import handoff

        return len(handoff._slots), len(getattr(handoff, "_discarded", ()))


def test_a_call_that_never_runs_releases_its_shards(make_procs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The call is sent (and its shards published) while the actors are healthy, queued behind
    # a message that fails them: they answer it without running it.
    procs = make_procs(2)
    counts = procs.spawn("counts", ShardCount)
    actors = procs.spawn("released", Released)
    flag = tmp_path / "fail"
    with procs.activate():
        t = torch.ones(3)
        actors.fail_once.broadcast(str(flag))
        never_run = [actors.slice(gpus=rank).total.call_one(t) for rank in range(2)]
        flag.touch()
        for call in never_run:  # each rank's answer: both have refused their call
            with pytest.raises(SupervisionError, match="released"):
                call.get(timeout=T)
        for rank in range(2):  # each proc's stream is past the Publish
            assert regency.inspect(t + 1, gpus=rank).tolist() == [2.0] * 3
    assert list(counts.held.call().get(timeout=T).values()) == [(0, 0), (0, 0)]


def test_a_poisoned_argument_releases_the_other_arguments_shards(make_procs) -> None:  # type: ignore[no-untyped-def]
    procs = make_procs(2)
    counts = procs.spawn("counts", ShardCount)
    actors = procs.spawn("pairs", Released)
    with pytest.raises(RemoteException):  # noqa: PT012 - the failure is also raised at exit
        with procs.activate():
            bad = failing(torch.ones(2))
            with pytest.raises(ActorError, match="boom from the worker"):
                actors.pair.call(bad, torch.ones(2)).get(timeout=T)
            assert actors.pair.call(torch.ones(1), torch.zeros(1)).get(timeout=T).item(gpus=0) == [
                1.0,
                0.0,
            ]
    assert list(counts.held.call().get(timeout=T).values()) == [(0, 0), (0, 0)]


def test_a_call_refused_before_its_shards_are_published_drops_them_when_they_come(
    make_procs,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # The stream is busy, so the actors refuse the call before its Publish runs there: the
    # shards are dropped when it does.
    procs = make_procs(2)
    counts = procs.spawn("counts", ShardCount)
    actors = procs.spawn("early", Released)
    fail, go = tmp_path / "fail", tmp_path / "go"
    with procs.activate():
        t = torch.ones(3)
        wait_for(str(go), T)
        actors.fail_once.broadcast(str(fail))
        never_run = [actors.slice(gpus=rank).total.call_one(t) for rank in range(2)]
        fail.touch()
        for call in never_run:
            with pytest.raises(SupervisionError, match="early"):
                call.get(timeout=T)
        assert list(counts.held.call().get(timeout=T).values()) == [(0, 1), (0, 1)]
        go.touch()
        for rank in range(2):
            assert regency.inspect(t + 1, gpus=rank).tolist() == [2.0] * 3
    assert list(counts.held.call().get(timeout=T).values()) == [(0, 0), (0, 0)]
