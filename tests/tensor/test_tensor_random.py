"""Seeding and generator states of the workers: the random builtins
(``regency.tensor.builtins.random``) and ``regency.random``, as Monarch's."""

from __future__ import annotations

import pytest
import torch

import regency.random as mesh_random
from regency.actor import ProcMesh
from regency.tensor import fetch_shard, no_mesh, remote
from regency.tensor.builtins import random as remote_random

pytestmark = pytest.mark.timeout(120)


def test_a_manual_seed_repeats_the_draws_also_in_nested_activations(procs: ProcMesh) -> None:
    # a nested activate() of the same mesh (as Monarch's test harness does) used to issue the
    # first of each factory twice, so the draw after a seed was not the seed's first
    with procs.activate(), procs.activate():
        remote_random.set_manual_seed_remote(12345)
        t1 = torch.rand(5, 5)
        remote_random.set_manual_seed_remote(12345)
        t2 = torch.rand(5, 5)
        remote_random.set_manual_seed_remote(12346)
        t3 = torch.rand(5, 5)
        r = fetch_shard((t1, t2, t3), gpus=1).result()
    torch.manual_seed(12345)
    expected = torch.rand(5, 5)
    assert torch.equal(r[0], expected)
    assert torch.equal(r[1], expected)
    assert not torch.equal(r[0], r[2])


def test_a_factory_in_nested_activations_runs_once(procs: ProcMesh) -> None:
    with procs.activate():
        remote_random.set_manual_seed_remote(99)
        with procs.activate():
            first = torch.randn(7)  # never drawn before in this process's meta cache
        second = torch.randn(7)
        r = fetch_shard((first, second)).result()
    torch.manual_seed(99)
    assert torch.equal(r[0], torch.randn(7))
    assert torch.equal(r[1], torch.randn(7))


def test_a_saved_state_replays_the_draws(procs: ProcMesh) -> None:
    with procs.activate(), procs.activate():
        state = remote_random.get_rng_state_remote()
        t1 = torch.rand(3, 3)
        t2 = torch.rand(3, 3)
        remote_random.set_rng_state_remote(state)
        t3 = torch.rand(3, 3)
        r = fetch_shard((t1, t2, t3, state)).result()
    assert r[3].dtype == torch.uint8
    assert not torch.equal(r[0], r[1])
    assert torch.equal(r[0], r[2])


def test_seed_remote_reseeds_each_worker_differently(procs: ProcMesh) -> None:
    controller_state = torch.get_rng_state()
    with procs.activate():
        remote_random.random_seed_remote()
        t1 = torch.rand(5, 5)
        remote_random.random_seed_remote()
        t2 = torch.rand(5, 5)
        remote_random.seed_remote()
        t3 = torch.rand(5, 5)
        r0 = fetch_shard((t1, t2, t3), gpus=0).result()
        r1 = fetch_shard(t1, gpus=1).result()
    assert not torch.equal(r0[0], r0[1])
    assert not torch.equal(r0[1], r0[2])
    assert not torch.equal(r0[0], r1)
    assert torch.equal(torch.get_rng_state(), controller_state)  # the controller's untouched


def test_new_state_is_the_seeds_state_and_set_state_switches(procs: ProcMesh) -> None:
    with procs.activate():
        seeded = mesh_random.new_state(procs.rank_tensor("gpus") + 7)
        before = torch.rand(3)
        saved = mesh_random.get_state()
        mesh_random.set_state(seeded)
        drawn = torch.rand(3)
        mesh_random.set_state(saved)
        after = torch.rand(3)
        r = [fetch_shard((before, drawn, after, seeded), gpus=g).result() for g in (0, 1)]
    assert isinstance(seeded, mesh_random.State)
    for rank, (first, from_seed, resumed, state) in enumerate(r):
        torch.manual_seed(7 + rank)
        assert torch.equal(from_seed, torch.rand(3))  # torch.manual_seed(7 + rank)'s draws
        assert not torch.equal(first, resumed)  # the saved state went on where it was
        assert state.cpu.shape == torch.get_rng_state().shape
        assert torch.equal(state.cuda, torch.zeros(16, dtype=torch.uint8))  # no CUDA here
    with procs.activate():
        # new_state left the workers' own generator where it was: the same draws as without
        mesh_random.set_state(saved)
        again = fetch_shard(torch.rand(3), gpus=1).result()
    assert torch.equal(again, r[1][2])


@remote(propagate=lambda: torch.empty((), dtype=torch.bool))
def _deterministic() -> torch.Tensor:
    return torch.tensor(torch.are_deterministic_algorithms_enabled())


def test_make_deterministic_switches_the_workers_only(procs: ProcMesh) -> None:
    with procs.activate():
        mesh_random.make_deterministic()
        flags = _deterministic()
        r = [fetch_shard(flags, gpus=g).result() for g in (0, 1)]
    with no_mesh.activate():
        assert all(bool(f) for f in r)
    assert not torch.are_deterministic_algorithms_enabled()


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_cuda = pytest.mark.skipif(GPUS < 1, reason=f"needs a CUDA GPU (this machine has {GPUS})")


@needs_cuda
def test_cuda_seeding_and_states_replay_cuda_draws(procs: ProcMesh) -> None:
    with procs.activate():
        remote_random.manual_seed_cuda_remote(12345)
        t1 = torch.rand(5, 5, device="cuda")
        remote_random.manual_seed_all_cuda_remote(12345)
        t2 = torch.rand(5, 5, device="cuda")
        states = remote_random.get_rng_state_all_cuda_remote()
        t3 = torch.rand(5, 5, device="cuda")
        remote_random.set_rng_state_all_cuda_remote(states)
        t4 = torch.rand(5, 5, device="cuda")
        saved = mesh_random.get_state()
        t5 = torch.rand(5, 5, device="cuda")
        mesh_random.set_state(saved)
        t6 = torch.rand(5, 5, device="cuda")
        r = fetch_shard((t1, t2, t3, t4, t5, t6, states, saved.cuda), gpus=1).result()
    assert torch.equal(r[0], r[1])
    assert torch.equal(r[2], r[3])
    assert not torch.equal(r[0], r[2])
    assert torch.equal(r[4], r[5])
    assert isinstance(r[6], list)
    assert len(r[6]) == 1
    assert r[7].shape == (16,)
