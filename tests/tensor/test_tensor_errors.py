"""Worker failures: poisoning, RemoteException text, errors at activate() exit, dead workers."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import regency
import regency.actor
from regency.actor import ProcMesh
from regency.mesh_controller import RemoteException

pytestmark = pytest.mark.timeout(120)


def explode(t: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom from the worker")


failing = regency.remote(explode, propagate=lambda t: t)


@regency.remote(propagate="inspect")
def sleeper(t: torch.Tensor, seconds: float) -> None:
    time.sleep(seconds)


def refuse_on_rank_1(t: torch.Tensor) -> torch.Tensor:
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 refuses")
    return t + 1


refusing = regency.remote(refuse_on_rank_1, propagate=lambda t: t)


def test_a_failure_on_one_rank_fails_the_fetch_on_every_rank(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults: list[object] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", faults.append)
    with procs.activate():
        good = torch.ones(2)
        half = refusing(good)  # fine on rank 0, failed on rank 1
        derived = half * 2
        for value in (half, derived):
            for rank in (0, 1):  # a value is only delivered once it is correct on every rank
                with pytest.raises(RemoteException, match="rank 1 refuses") as caught:
                    regency.inspect(value, gpus=rank)
                assert "half = refusing(good)  # fine on rank 0" in str(caught.value)
                assert caught.value.rank == 1
        assert regency.inspect(good * 3, gpus=0).tolist() == [3.0, 3.0]  # independent: fine
    assert faults == []  # the workers go on; nothing reaches the fault hook


def my_pid() -> int:
    return os.getpid()


def test_failure_poisons_dependents_and_spares_the_rest(procs: ProcMesh) -> None:
    # The block is the subject: rank 0's failure, never fetched, is raised when it exits.
    with pytest.raises(RemoteException):  # noqa: PT012
        with procs.activate():
            good = torch.ones(2)
            bad = failing(good)  # the call site the error must name
            worse = (bad + 1).sum()
            fine = good * 3
            with pytest.raises(RemoteException) as caught:
                regency.inspect(worse, gpus=1)
            text = str(caught.value)
            assert "failing(good)  # the call site the error must name" in text
            assert "test_tensor_errors.py" in text
            assert "ValueError: boom from the worker" in text
            assert "rank 1" in text
            assert caught.value.rank == 1
            # Independent values and new ops keep working; the workers survive.
            assert regency.inspect(fine, gpus=1).tolist() == [3.0, 3.0]
            assert regency.inspect(good + 1).tolist() == [2.0, 2.0]
    assert regency.RemoteException is RemoteException


def test_fetched_error_is_not_raised_again_at_exit(procs: ProcMesh) -> None:
    with pytest.raises(RemoteException):  # noqa: PT012 - the block is the subject
        with procs.activate():
            bad = failing(torch.ones(1))
            for rank in range(2):
                with pytest.raises(RemoteException):
                    regency.inspect(bad, gpus=rank)
            raise RemoteException("leave by this one", 0, "")
    with procs.activate():  # nothing unfetched is left over
        assert regency.inspect(torch.ones(1)).shape == (1,)


def test_unfetched_error_is_raised_when_activate_exits(procs: ProcMesh) -> None:
    with pytest.raises(RemoteException, match="boom from the worker"):  # noqa: PT012
        with procs.activate():
            failing(torch.ones(1))
            # A fetch from each rank: their failure reports were sent before these replies.
            regency.inspect(torch.ones(1), gpus=0)
            regency.inspect(torch.ones(1), gpus=1)
    with procs.activate():
        assert regency.inspect(torch.ones(1) * 2).tolist() == [2.0]


def test_killed_worker_fails_the_pending_fetch_within_a_second(make_procs) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(2)
    pid = regency.remote(my_pid).call_one
    with mesh.activate():
        t = torch.ones(4)
    with mesh.slice(gpus=1).activate():
        victim = pid().get(timeout=60)
    regency.inspect(t, gpus=1)  # the worker is up and has run everything so far
    sleeper(t, 30)  # keeps the worker busy: the fetch below stays pending
    fut = regency.fetch_shard(t, gpus=1)
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        fut.get(timeout=30)
    assert time.monotonic() - start < 1.0
    assert "rank" in str(caught.value) or "gpus" in str(caught.value)
