"""Cutting an ibverbs transfer into work requests, and keeping a window of them in flight."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regency.rdma._ibverbs.plan import (
    CHUNK_BYTES,
    STAGING_BYTES,
    Window,
    access_flags,
    chunk_size,
    chunks,
    make_wr_id,
    next_epoch,
    pause_after,
    split_wr_id,
    use_staging,
)

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20


def test_chunks_are_capped_by_both_ports_and_the_backend() -> None:
    assert chunk_size(1 << 31, 1 << 31) == CHUNK_BYTES == MIB
    assert chunk_size(1 << 31, 65536) == 65536  # the owner's port carries less
    assert chunk_size(4096, 1 << 31) == 4096
    with pytest.raises(ValueError, match="no usable message size"):
        chunk_size(0, 1 << 31)


@given(
    st.integers(0, 300 * MIB).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(max(1, n // 4096), 8 * MIB))
    )
)
def test_chunks_tile_the_transfer_exactly(case: tuple[int, int]) -> None:
    nbytes, chunk = case  # at most 4096 chunks, so the check stays small
    parts = chunks(nbytes, chunk)
    assert sum(n for _, n in parts) == nbytes
    offset = 0
    for off, n in parts:
        assert off == offset
        assert 0 < n <= chunk
        offset += n
    assert len(parts) == -(-nbytes // chunk)


def test_chunks_of_a_64_mib_transfer() -> None:
    parts = chunks(64 * MIB + 3, MIB)
    assert len(parts) == 65
    assert parts[0] == (0, MIB)
    assert parts[-1] == (64 * MIB, 3)
    with pytest.raises(ValueError):
        chunks(10, 0)


def test_small_transfers_go_through_staging() -> None:
    assert use_staging(1)
    assert use_staging(STAGING_BYTES)
    assert not use_staging(STAGING_BYTES + 1)
    assert not use_staging(64 * MIB)


def test_access_flags_follow_the_ibverbs_rules() -> None:
    # LOCAL_WRITE=1, REMOTE_WRITE=2, REMOTE_READ=4 (enum ibv_access_flags)
    assert access_flags(remote=True, writable=True) == 1 | 2 | 4
    assert access_flags(remote=True, writable=False) == 4  # bytes, read-only arrays
    assert access_flags(remote=False, writable=True) == 1  # an RDMA READ's destination
    assert access_flags(remote=False, writable=False) == 0  # an RDMA WRITE's source


@given(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1))
def test_work_request_ids_carry_epoch_and_chunk(epoch: int, index: int) -> None:
    wr_id = make_wr_id(epoch, index)
    assert 0 <= wr_id < 1 << 64
    assert split_wr_id(wr_id) == (epoch, index)


def test_work_request_ids_refuse_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="chunk index"):
        make_wr_id(1, 1 << 32)
    with pytest.raises(ValueError, match="epoch"):
        make_wr_id(1 << 32, 0)
    assert next_epoch(5) == 6
    assert next_epoch((1 << 32) - 1) == 0


def test_polling_spins_then_backs_off_to_a_millisecond() -> None:
    pauses = [pause_after(n) for n in range(1, 2000)]
    assert pauses[:200] == [0.0] * 200
    assert pauses == sorted(pauses)
    assert 0 < pauses[300] <= pauses[-1] == 1e-3


def test_window_keeps_at_most_depth_requests_in_flight() -> None:
    w = Window(total=10, depth=4)
    assert list(w.take()) == [0, 1, 2, 3]
    assert list(w.take()) == []  # full
    assert w.outstanding == 4
    w.complete(2)  # completions may arrive in any order
    assert list(w.take()) == [4]
    for i in (0, 1, 3, 4):
        w.complete(i)
    assert list(w.take()) == [5, 6, 7, 8]
    for i in (5, 6, 7, 8):
        w.complete(i)
    assert list(w.take()) == [9]
    assert not w.done
    w.complete(9)
    assert w.done
    assert list(w.take()) == []
    assert w.outstanding == 0


def test_window_refuses_completions_it_did_not_post() -> None:
    w = Window(total=3, depth=2)
    w.take()
    with pytest.raises(ValueError, match="chunk 2"):
        w.complete(2)  # never posted
    w.complete(0)
    with pytest.raises(ValueError, match="chunk 0"):
        w.complete(0)  # twice
    with pytest.raises(ValueError):
        Window(total=1, depth=0)


def test_an_empty_transfer_is_done_at_once() -> None:
    w = Window(total=0, depth=16)
    assert w.done
    assert list(w.take()) == []


@given(st.integers(0, 200), st.integers(1, 32), st.randoms(use_true_random=False))
def test_window_drives_any_transfer_to_completion(
    total: int, depth: int, rng: random.Random
) -> None:
    w = Window(total, depth)
    posted: list[int] = []
    in_flight: list[int] = []
    while not w.done:
        batch = list(w.take())
        posted.extend(batch)
        in_flight.extend(batch)
        assert 0 < len(in_flight) <= depth
        for _ in range(rng.randint(1, len(in_flight))):
            w.complete(in_flight.pop(rng.randrange(len(in_flight))))
    assert posted == list(range(total))
