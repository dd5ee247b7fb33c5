"""Pipes: a data source on every worker whose values become mesh tensors with ``recv()``
(``remote_generator``, ``create_pipe``), values sent to it with ``send()``, and its failures
poisoning what it would have produced."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import regency
from regency.actor import ProcMesh
from regency.tensor import Pipe, create_pipe, remote, remote_generator

pytestmark = pytest.mark.timeout(120)

HERE = __name__


# The sources, run on the workers (by import path).


def counting_loader(pipe: Any, batch: int, start: int) -> Iterator[dict[str, torch.Tensor]]:
    """A generator source: batches whose values say which rank and step made them."""
    rank = pipe.ranks["gpus"]
    for step in range(start, start + 3):
        yield {"x": torch.full((batch, 2), float(10 * rank + step)), "y": torch.tensor(step)}


def sending_source(pipe: Any, n: int) -> None:
    """A source that sends (Monarch's style) and stops after ``n`` values."""
    for i in range(n):
        pipe.send(torch.full((), float(i)))


def echo_add(pipe: Any) -> None:
    """Adds its rank to what the controller sends, and sends it back."""
    while True:
        pipe.send(pipe.recv() + 1 + pipe.ranks["gpus"])


def failing_source(pipe: Any) -> Iterator[torch.Tensor]:
    """One good value, then an error on rank 1 only."""
    yield torch.ones(2)
    if pipe.ranks["gpus"] == 1:
        raise OSError("the data file is gone")
    yield torch.ones(2)


def sizes_source(pipe: Any) -> Iterator[torch.Tensor]:
    yield torch.tensor([pipe.sizes["gpus"], pipe.ranks["gpus"]])


# Their propagations, run on the controller.


@remote_generator(f"{HERE}.counting_loader")
def loader(pipe: Any, batch: int, start: int) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield {"x": torch.empty(batch, 2), "y": torch.empty((), dtype=torch.int64)}


def scalar_stream(pipe: Any, *args: Any) -> Iterator[torch.Tensor]:
    while True:
        yield torch.empty(())


def like_sent(pipe: Any) -> Iterator[torch.Tensor]:
    while True:
        yield pipe.recv()


def test_recv_gives_each_ranks_values_as_mesh_tensors(procs: ProcMesh) -> None:
    with procs.activate():
        pipe = loader(4, 5)
        batches = [pipe.recv() for _ in range(3)]
        total = batches[0]["x"] + batches[2]["x"]  # used in ops like any mesh tensor
    assert isinstance(pipe, Pipe)
    assert isinstance(batches[1]["x"], regency.Tensor)
    assert batches[1]["x"].shape == (4, 2)
    for rank in range(2):
        got = regency.inspect(batches, gpus=rank)
        for step, b in zip(range(5, 8), got, strict=True):
            torch.testing.assert_close(b["x"], torch.full((4, 2), float(10 * rank + step)))
            assert int(b["y"]) == step
        torch.testing.assert_close(
            regency.inspect(total, gpus=rank), torch.full((4, 2), float(20 * rank + 12))
        )


def test_a_sending_source_and_its_end(procs: ProcMesh) -> None:
    source = remote(f"{HERE}.sending_source", propagate=scalar_stream)
    with procs.activate():
        pipe = create_pipe(source, 2, max_messages=1)
        a, b, c = pipe.recv(), pipe.recv(), pipe.recv()
        assert float(regency.inspect(a, gpus=1)) == 0.0
        assert float(regency.inspect(b, gpus=1)) == 1.0
        for rank in (0, 1):
            with pytest.raises(regency.RemoteException, match="ended: it has no more values"):
                regency.inspect(c, gpus=rank)


def test_send_values_to_the_source(procs: ProcMesh) -> None:
    echo = remote(f"{HERE}.echo_add", propagate=like_sent)
    with procs.activate():
        pipe = create_pipe(echo)
        for i in range(3):
            pipe.send(torch.full((2,), float(i)) * (procs.rank_tensor("gpus") + 1))
        got = [pipe.recv() for _ in range(3)]
    assert got[0].shape == (2,)
    for rank in range(2):
        values = regency.inspect(got, gpus=rank)
        for i, v in enumerate(values):
            torch.testing.assert_close(v, torch.full((2,), float(i * (rank + 1) + 1 + rank)))


def test_a_failing_source_poisons_every_rank(procs: ProcMesh) -> None:
    source = remote(f"{HERE}.failing_source", propagate=scalar_stream)
    errors = []
    with procs.activate():
        pipe = create_pipe(source)
        first = pipe.recv()
        second = pipe.recv()
        after = second + 1
        fine = torch.ones(1) * 3
        got_fine = regency.inspect(fine, gpus=1)
        got_first = regency.inspect(first, gpus=1)
        for rank in (0, 1):  # a value is delivered only once it is right on every rank
            with pytest.raises(regency.RemoteException, match="the data file is gone") as info:
                regency.inspect(after, gpus=rank)
            errors.append(info.value)
    torch.testing.assert_close(got_fine, torch.full((1,), 3.0))
    torch.testing.assert_close(got_first, torch.ones(2))
    for error in errors:
        assert "failed on rank 1" in str(error)
        assert error.rank == 1


def test_the_source_knows_its_coordinates(procs: ProcMesh) -> None:
    source = remote(
        f"{HERE}.sizes_source", propagate=lambda pipe: iter([torch.empty(2, dtype=torch.int64)])
    )
    with procs.activate():
        got = create_pipe(source).recv()
    assert regency.inspect(got, gpus=1).tolist() == [2, 1]


def pipe_threads() -> list[str]:
    """The names of this worker process's pipe source threads."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("regency-pipe-"))


def test_dropping_the_pipe_stops_its_sources(procs: ProcMesh) -> None:
    endless = remote(f"{HERE}.echo_add", propagate=like_sent)
    threads = remote(pipe_threads, propagate="inspect")

    def everywhere() -> list[list[str]]:
        return [names for _, names in threads.call().get().items()]

    with procs.activate():
        pipe = create_pipe(endless)
        name = f"regency-pipe-{pipe._ref}"
        pipe.send(torch.ones(1))
        echoed = regency.inspect(pipe.recv(), gpus=0)
        during = everywhere()
        del pipe
        deadline = time.monotonic() + 30
        while any(name in names for names in everywhere()):  # each rank's source ends
            assert time.monotonic() < deadline, f"{name} still runs"
            time.sleep(0.1)
    assert all(name in names for names in during)
    torch.testing.assert_close(echoed, torch.full((1,), 2.0))


def test_bad_uses(procs: ProcMesh) -> None:
    with pytest.raises(ValueError, match="require an active device mesh"):
        loader(1, 0)
    with procs.activate():
        with pytest.raises(ValueError, match="Cannot pass references to external generators"):
            create_pipe(remote(f"{HERE}.echo_add", propagate=like_sent), torch.ones(1))
        with pytest.raises(ValueError, match="Must specify explicit callable for pipe"):
            create_pipe(remote(f"{HERE}.echo_add"))
        with pytest.raises(TypeError, match=r"expected fn to be a regency\.remote function"):
            create_pipe(echo_add)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_messages must be a positive int"):
            create_pipe(remote(f"{HERE}.echo_add", propagate=like_sent), max_messages=0)
        pipe = create_pipe(remote(f"{HERE}.echo_add", propagate=like_sent))
        with pytest.raises(ValueError, match="cannot be accessed on controller"):
            _ = pipe.ranks
        with pytest.raises(RuntimeError, match="use yield x"):
            pipe._fake().send(1)


def test_values_belong_to_the_pipes_stream(procs: ProcMesh) -> None:
    other = regency.Stream("other")
    with procs.activate():
        pipe = loader(1, 0)
        with other.activate():
            batch = pipe.recv()  # taken on the pipe's stream, not this one
        assert batch["x"].stream is regency.get_active_stream()
        doubled = batch["x"] * 2
        got = regency.inspect(doubled, gpus=1)
    torch.testing.assert_close(got, torch.full((1, 2), 20.0))
