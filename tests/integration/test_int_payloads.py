"""Payloads of every size round-trip exactly (monarch-api.md §2.7): bytes, numpy arrays and CPU
torch tensors from empty to 64 MiB, a 1 GiB argument, and snapshot semantics for arrays."""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from regency.actor import Actor, ActorError, ActorMesh, ProcMesh, endpoint

pytestmark = pytest.mark.timeout(60)

T = 60.0
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
SIZES = [0, 1, 100 * KiB, 64 * MiB]
SIZE_IDS = ["0B", "1B", "100KiB", "64MiB"]


def _sha(data: Any) -> str:
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


class ExplodesOnPickle:
    def __getstate__(self) -> Any:
        raise RuntimeError("refuses to be pickled")


class ExplodesOnUnpickle:
    def __getstate__(self) -> Any:
        return {"x": 1}

    def __setstate__(self, state: Any) -> None:
        raise RuntimeError("refuses to be unpickled")


class Echo(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def echo(self, value: Any) -> Any:
        self.count += 1
        return value

    @endpoint
    def received(self) -> int:
        return self.count

    @endpoint
    def apply(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    @endpoint
    def unpicklable_result(self) -> Any:
        return threading.Lock()

    @endpoint
    def bytes_digest(self, data: bytes) -> tuple[str, int, str]:
        return type(data).__name__, len(data), _sha(data)

    @endpoint
    def array_digest(self, array: np.ndarray) -> tuple[tuple[int, ...], str, str]:
        return array.shape, str(array.dtype), _sha(np.ascontiguousarray(array))

    @endpoint
    def tensor_digest(self, tensor: Any) -> tuple[tuple[int, ...], str, str]:
        flat = tensor.contiguous().reshape(-1).view(-1)
        raw = flat.numpy().tobytes() if flat.numel() else b""
        return tuple(tensor.shape), str(tensor.dtype), hashlib.sha256(raw).hexdigest()


@pytest.fixture(scope="module")
def echo(procs4: ProcMesh) -> Iterator[ActorMesh[Echo]]:
    mesh = procs4.slice(gpus=slice(1, 2)).spawn("echo", Echo)
    yield mesh
    mesh.stop().get(timeout=T)


def _random_bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_bytes_round_trip(echo: ActorMesh[Echo], size: int) -> None:
    data = _random_bytes(size, seed=size)
    back = echo.echo.call_one(data).get(timeout=T)
    assert type(back) is bytes
    assert back == data
    kind, length, digest = echo.bytes_digest.call_one(data).get(timeout=T)
    assert (kind, length, digest) == ("bytes", size, _sha(data))


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("dtype", ["uint8", "float32", "int64"])
def test_numpy_round_trip(echo: ActorMesh[Echo], size: int, dtype: str) -> None:
    itemsize = np.dtype(dtype).itemsize
    count = size // itemsize if size >= itemsize else size  # 1 B of uint8, 1 element otherwise
    rng = np.random.default_rng(size)
    array = rng.integers(0, 250, size=count, dtype=np.uint8).astype(dtype)
    back = echo.echo.call_one(array).get(timeout=T)
    assert isinstance(back, np.ndarray)
    assert back.dtype == array.dtype
    assert back.shape == array.shape
    assert np.array_equal(back, array)
    shape, remote_dtype, digest = echo.array_digest.call_one(array).get(timeout=T)
    assert (shape, remote_dtype, digest) == (array.shape, dtype, _sha(array))


def test_numpy_multidimensional_and_strided_round_trip(echo: ActorMesh[Echo]) -> None:
    grid = np.arange(512 * 1024, dtype=np.float64).reshape(512, 1024)
    strided = grid[::3, 1::2]  # not contiguous, 1.3 MiB
    for array in (grid, strided, grid.T, np.asfortranarray(grid)):
        back = echo.echo.call_one(array).get(timeout=T)
        assert back.shape == array.shape
        assert np.array_equal(back, array)


def test_nested_payloads_round_trip(echo: ActorMesh[Echo]) -> None:
    big = _random_bytes(3 * MiB, seed=3)
    value = {
        "arrays": [np.full(200_000, 7, dtype=np.int32), np.zeros(0)],
        "blob": big,
        "blobs": (big[:100], bytearray(big[: 128 * KiB])),
        "memo": [big, big],
    }
    back = echo.echo.call_one(value).get(timeout=T)
    assert np.array_equal(back["arrays"][0], value["arrays"][0])
    assert back["arrays"][1].shape == (0,)
    assert back["blob"] == big
    assert back["blobs"] == (big[:100], bytearray(big[: 128 * KiB]))
    assert back["memo"] == [big, big]


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_torch_cpu_tensor_round_trip(echo: ActorMesh[Echo], size: int) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(size)
    for dtype in (torch.uint8, torch.float32):
        itemsize = torch.tensor([], dtype=dtype).element_size()
        count = size // itemsize if size >= itemsize else size
        tensor = torch.randint(0, 250, (count,), generator=gen).to(dtype)
        back = echo.echo.call_one(tensor).get(timeout=T)
        assert back.dtype == tensor.dtype
        assert back.shape == tensor.shape
        assert torch.equal(back, tensor)
    square = torch.arange(64 * 64, dtype=torch.float64).reshape(64, 64)
    assert torch.equal(echo.echo.call_one(square.t()).get(timeout=T), square.t())


def test_array_mutated_after_call_one_returns_does_not_change_what_was_sent(
    echo: ActorMesh[Echo],
) -> None:
    for round_ in range(4):
        array = np.full(16 * MiB // 8, round_, dtype=np.int64)
        expected = _sha(array)
        fut = echo.array_digest.call_one(array)
        array[:] = -1  # mutate right after the send returns
        _, _, digest = fut.get(timeout=T)
        assert digest == expected


def test_bytearray_mutated_after_call_one_returns_does_not_change_what_was_sent(
    echo: ActorMesh[Echo],
) -> None:
    buf = bytearray(_random_bytes(16 * MiB, seed=11))
    expected = _sha(buf)
    fut = echo.echo.call_one(buf)
    buf[:] = bytes(len(buf))
    back = fut.get(timeout=T)
    assert _sha(back) == expected


def test_closures_and_lambdas_travel_by_value(echo: ActorMesh[Echo]) -> None:
    offset = 41

    def add_offset(x: int) -> int:
        return x + offset

    assert echo.apply.call_one(add_offset, 1).get(timeout=T) == 42
    assert echo.apply.call_one(lambda a, b: a * b, 6, 7).get(timeout=T) == 42


def test_argument_that_cannot_be_pickled_fails_at_the_call_site(echo: ActorMesh[Echo]) -> None:
    before = echo.received.call_one().get(timeout=T)
    with pytest.raises(RuntimeError, match="refuses to be pickled"):
        echo.echo.call_one(ExplodesOnPickle())
    # Nothing was sent and nothing is stuck behind the failed send.
    assert echo.echo.call_one("after").get(timeout=T) == "after"
    assert echo.received.call_one().get(timeout=T) == before + 1


def test_argument_that_cannot_be_unpickled_remotely_is_an_actor_error(
    echo: ActorMesh[Echo],
) -> None:
    with pytest.raises(ActorError, match="refuses to be unpickled"):
        echo.echo.call_one(ExplodesOnUnpickle()).get(timeout=T)
    assert echo.echo.call_one("still alive").get(timeout=T) == "still alive"


def test_result_that_cannot_be_pickled_is_an_actor_error(echo: ActorMesh[Echo]) -> None:
    with pytest.raises(ActorError):
        echo.unpicklable_result.call_one().get(timeout=T)
    assert echo.echo.call_one("still alive").get(timeout=T) == "still alive"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_gib_bytes_argument(echo: ActorMesh[Echo]) -> None:
    data = bytes(range(256)) * (GiB // 256)
    data = data[:-1] + b"!"  # not a pure pattern: the last byte must arrive too
    expected = _sha(data)
    kind, length, digest = echo.bytes_digest.call_one(data).get(timeout=300)
    assert kind == "bytes"
    assert length == GiB
    assert digest == expected
