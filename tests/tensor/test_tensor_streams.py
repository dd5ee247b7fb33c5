"""Streams and borrows (issue 15 part 7): values on two streams, borrows and their access rules,
streams running concurrently, and the Monarch bug of dropping a borrow that has views."""

from __future__ import annotations

import threading

import pytest
import torch

import regency
from regency.actor import ProcMesh
from regency.tensor import Stream, get_active_stream

pytestmark = pytest.mark.timeout(120)

WAIT_S = 20.0
"""How long a remote function waits for another stream before it gives up (and fails)."""

# One flag per test, set on the workers (one process per rank: each rank's streams share it).
_flags: dict[str, threading.Event] = {}


def _flag(name: str) -> threading.Event:
    return _flags.setdefault(name, threading.Event())


def _wait_then_copy(t: torch.Tensor, name: str) -> torch.Tensor:
    if not _flag(name).wait(WAIT_S):
        raise TimeoutError(f"flag {name!r} was not set: the other stream did not run meanwhile")
    return t.clone()


def _set_flag(t: torch.Tensor, name: str) -> torch.Tensor:
    _flag(name).set()
    return t.clone()


wait_then_copy = regency.remote(_wait_then_copy, propagate=lambda t, name: t.clone())
set_flag = regency.remote(_set_flag, propagate=lambda t, name: t.clone())


def test_default_stream_and_activation() -> None:
    main = get_active_stream()
    assert main.name == "main"
    side = Stream("side")
    with side.activate():
        assert get_active_stream() is side
    assert get_active_stream() is main
    assert regency.Stream is Stream
    assert regency.get_active_stream is get_active_stream


def test_values_on_two_streams(procs: ProcMesh) -> None:
    other = Stream("other")
    with procs.activate():
        a = torch.ones(3) * 2
        with other.activate():
            b = torch.arange(3.0) + 10
            c = b * b
        d = a + 1
    assert c.stream is other
    assert d.stream.name == "main"
    with other.activate():  # a fetch runs on the active stream, as Monarch's
        assert regency.inspect(c, gpus=1).tolist() == [100.0, 121.0, 144.0]
    assert regency.inspect(d, gpus=1).tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(TypeError, match=r"WRONG_STREAM: .* is on <Stream\('other'\)"):
        regency.inspect(c, gpus=1)
    with other.activate(), pytest.raises(TypeError, match=r"WRONG_STREAM: .*'main'"):
        regency.inspect(d, gpus=1)


def test_borrow_compute_drop_then_mutate(procs: ProcMesh) -> None:
    reader, releaser = Stream("reader"), Stream("releaser")
    with procs.activate():
        x = torch.ones(4)
        x.add_(1)
        borrowed, borrow = reader.borrow(x)
        with reader.activate():
            # Blocks until the releaser stream runs; reads x's value of the borrow point.
            seen = wait_then_copy(borrowed, "borrow-drop") * 10
        borrow.drop()
        x.mul_(100)  # waits on the workers for the drop, so the reader saw 2, not 200
        with releaser.activate():
            set_flag(torch.zeros(1), "borrow-drop")
    assert borrowed.dropped
    with reader.activate():
        assert regency.inspect(seen, gpus=1).tolist() == [20.0] * 4
    assert regency.inspect(x, gpus=1).tolist() == [200.0] * 4


def test_mutable_borrow_writes_the_original(procs: ProcMesh) -> None:
    side = Stream("writer")
    with procs.activate():
        x = torch.zeros(3)
        with side.borrow(x, mutable=True)[1] as borrow:
            pass
        assert borrow.dropped
        y, borrow = side.borrow(x, mutable=True)
        with side.activate():
            y.add_(procs.rank_tensor("gpus").float() + 5)
        borrow.drop()
        z = x * 2  # waits for the writer's drop
    assert regency.inspect(z, gpus=0).tolist() == [10.0] * 3
    assert regency.inspect(z, gpus=1).tolist() == [12.0] * 3


@regency.remote(propagate=lambda t: t.add_(1))
def add_one_(t: torch.Tensor) -> torch.Tensor:
    return t.add_(1)


def test_type_errors(procs: ProcMesh) -> None:
    side = Stream("checks")
    with procs.activate():
        x = torch.ones(3)
        v = x[1:]
        with side.activate():
            with pytest.raises(TypeError, match=r"WRONG_STREAM: .* is on <Stream\('main'\)"):
                torch.add(x, 1)
            s = torch.ones(3)
        with pytest.raises(TypeError, match=r"WRONG_STREAM: .*stream.borrow"):
            torch.mul(s, 2)
        with pytest.raises(TypeError, match=r"WRONG_STREAM: .* is on <Stream\('checks'\)"):
            regency.fetch_shard((x, s))
        with Stream("checks").activate():  # a second stream of the same name is another stream
            with pytest.raises(TypeError, match="WRONG_STREAM"):
                torch.add(s, 1)
        # Immutable borrow: nobody may write, both may read.
        r, borrow = side.borrow(x)
        with pytest.raises(TypeError, match=r"MUTATING_BORROW: .*read-only while it is borrowed"):
            x.add_(1)
        with pytest.raises(TypeError, match="MUTATING_BORROW"):
            v.mul_(2)  # a view made before the borrow shares its storage
        with side.activate(), pytest.raises(TypeError, match="MUTATING_BORROW"):
            r.add_(1)
        with pytest.raises(TypeError, match="MUTATING_BORROW"):
            add_one_(x)  # a remote function whose propagation writes its input
        with pytest.raises(RuntimeError, match="Cannot borrow this tensor mutably"):
            side.borrow(x, mutable=True)
        ok = x + 1
        borrow.drop()
        x.add_(1)
        # Mutable borrow: the original may not be used at all, nor fetched.
        m, borrow = side.borrow(x, mutable=True)
        with pytest.raises(TypeError, match=r"BORROWED: .*borrowed mutably by another stream"):
            torch.add(x, 1)
        with pytest.raises(TypeError, match="BORROWED"):
            regency.fetch_shard(v)
        with pytest.raises(TypeError, match="BORROWED"):
            side.borrow(x)
        borrow.drop()
        with pytest.raises(TypeError, match="DROPPED"):
            torch.add(m, 1)
    with pytest.raises(TypeError, match="LOCAL_TENSOR: only a mesh tensor can be borrowed"):
        side.borrow(torch.ones(2))
    assert regency.inspect(ok).tolist() == [2.0] * 3
    assert regency.inspect(x).tolist() == [2.0] * 3


def test_streams_overlap(procs: ProcMesh) -> None:
    blocked, unblocker = Stream("blocked"), Stream("unblocker")
    with procs.activate():
        with blocked.activate():
            # Would time out (and fail) if the streams ran one after the other.
            waited = wait_then_copy(torch.ones(2), "overlap")
        with unblocker.activate():
            done = set_flag(torch.ones(2) * 3, "overlap")
    with blocked.activate():
        assert regency.inspect(waited, gpus=1).tolist() == [1.0, 1.0]
    with unblocker.activate():
        assert regency.inspect(done, gpus=1).tolist() == [3.0, 3.0]


def test_reduce_on_two_streams(procs: ProcMesh) -> None:
    comms = Stream("comms")
    with procs.activate():
        a = procs.rank_tensor("gpus").float() + 1
        with comms.activate():
            b = (procs.rank_tensor("gpus").float() + 1) * 10
            total_b = b.reduce("gpus", "sum")
        total_a = a.reduce("gpus", "sum")
    assert regency.inspect(total_a, gpus=1).item() == 3.0
    with comms.activate():
        assert regency.inspect(total_b, gpus=0).item() == 30.0


def test_dropping_a_borrow_with_views_keeps_workers(procs: ProcMesh) -> None:
    # Monarch 0.7 kills the borrowing stream's worker here.
    side = Stream("views")
    with procs.activate():
        x = torch.arange(6.0)
        r, borrow = side.borrow(x)
        with side.activate():
            view = r.view(2, 3)
            row = view[1]
            kept = row * 2
        borrow.drop()
        assert view.dropped
        assert row.dropped
        x.add_(1)
        with side.activate():
            after = kept + torch.ones(3)
    with side.activate():
        assert regency.inspect(after, gpus=1).tolist() == [7.0, 9.0, 11.0]
    assert regency.inspect(x, gpus=1).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_borrow_collected_before_drop_warns_and_drops(procs: ProcMesh) -> None:
    side = Stream("forgetful")
    with procs.activate():
        x = torch.ones(2)
        r, borrow = side.borrow(x, mutable=True)
        with pytest.warns(ResourceWarning, match="garbage-collected before borrow.drop"):
            del borrow
        assert r.dropped
        y = x + 1
    assert regency.inspect(y).tolist() == [2.0, 2.0]
