"""Message bodies: pickle protocol 5, large buffers out of band, code by value with cloudpickle."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from regency._runtime.kernel import codec

pytestmark = pytest.mark.timeout(60)

OOB = codec.OUT_OF_BAND_MIN


def round_trip(obj: object) -> tuple[object, list[codec.Part]]:
    parts = codec.dumps(obj)
    # What a receiver gets: read-only views over received bytes.
    received = [memoryview(bytes(p)) for p in parts]
    return codec.loads(received), parts


def test_out_of_band_threshold_is_64_kib() -> None:
    assert OOB == 64 * 1024


@pytest.mark.parametrize("shape", [(1024, 1024), (OOB,), (3, 5, 8192)])
def test_numpy_arrays_travel_out_of_band(shape: tuple[int, ...]) -> None:
    array = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)
    back, parts = round_trip(array)
    assert len(parts) == 2, "the array's memory should be its own part"
    assert len(parts[0]) < 1024, f"the body should stay small, got {len(parts[0])} bytes"
    assert memoryview(parts[1]).nbytes == array.nbytes
    assert isinstance(back, np.ndarray)
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


def test_out_of_band_part_is_not_a_copy() -> None:
    array = np.zeros(1 << 20, dtype=np.float32)
    parts = codec.dumps(array)
    view = memoryview(parts[1])
    array[0] = 42.0  # the part must see writes made before the bytes leave
    assert np.frombuffer(view, dtype=np.float32)[0] == 42.0


def test_small_array_stays_in_band() -> None:
    array = np.ones(OOB // 8 - 64, dtype=np.float64)
    back, parts = round_trip(array)
    assert len(parts) == 1
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("order", ["F", "sliced"])
def test_non_c_contiguous_arrays_round_trip(order: str) -> None:
    base = np.arange(512 * 512, dtype=np.int32).reshape(512, 512)
    array = np.asfortranarray(base) if order == "F" else base[::2, ::3]
    back, _ = round_trip(array)
    np.testing.assert_array_equal(back, array)


def test_several_arrays_in_one_message() -> None:
    message = {
        "a": np.ones(OOB, dtype=np.uint8),
        "b": [np.zeros(2 * OOB, dtype=np.int8), np.full(OOB, 3, dtype=np.int8)],
    }
    back, parts = round_trip(message)
    assert len(parts) == 4
    assert isinstance(back, dict)
    np.testing.assert_array_equal(back["a"], message["a"])
    np.testing.assert_array_equal(back["b"][1], message["b"][1])


@pytest.mark.parametrize(("size", "nparts"), [(OOB - 1, 1), (OOB, 2), (4 << 20, 2)])
def test_large_bytes_arguments_travel_out_of_band(size: int, nparts: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    parts = codec.dumps_call((data, 1), {"blob": data})
    back = codec.loads([memoryview(bytes(p)) for p in parts])
    assert len(parts) == nparts, "the object passed twice travels once"
    assert len(parts[0]) < 1024 or nparts == 1
    (back_args, back_kwargs) = back  # type: ignore[misc]
    assert back_args == (data, 1)
    assert back_kwargs == {"blob": data}
    assert type(back_args[0]) is bytes
    assert back_kwargs["blob"] is back_args[0]


def test_large_bytes_return_value_travels_out_of_band() -> None:
    data = b"r" * (1 << 20)
    back, parts = round_trip(data)
    assert len(parts) == 2
    assert back == data
    assert type(back) is bytes


def test_large_bytearray_travels_out_of_band() -> None:
    # The codec's docstring lists bytearrays with numpy arrays as buffers that are not copied.
    data = bytearray(b"q" * (1 << 20))
    back, parts = round_trip(data)
    assert len(parts) == 2
    assert back == data
    assert isinstance(back, bytearray)


def test_lambda_and_closure_by_value() -> None:
    offset = 17
    back, _ = round_trip(lambda x: x + offset)
    assert callable(back)
    assert back(1) == 18


def test_local_class_by_value() -> None:
    class Local:
        def __init__(self, value: int) -> None:
            self.value = value

        def doubled(self) -> int:
            return 2 * self.value

    back, _ = round_trip(Local(21))
    assert back.doubled() == 42  # type: ignore[attr-defined]
    assert type(back).__name__ == "Local"


def test_main_module_code_travels_to_another_process(tmp_path: pytest.TempPathFactory) -> None:
    # Code defined in a script's __main__ cannot be imported elsewhere; it must go by value.
    script = (
        "import sys\n"
        "from regency._runtime.kernel import codec\n"
        "def square(x):\n"
        "    return x * x\n"
        "class Point:\n"
        "    def __init__(self, x): self.x = x\n"
        "parts = codec.dumps((square, Point(3)))\n"
        "sys.stdout.buffer.write(b''.join(bytes(p) for p in parts))\n"
    )
    body = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, check=True, timeout=30
    ).stdout
    fn, point = codec.loads([body])
    assert fn(7) == 49
    assert point.x == 3


def test_code_by_value_keeps_its_file_name(tmp_path: Path) -> None:
    # Tracebacks, stacks and pdb in a proc name (and list) the script a class came from.
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "from regency._runtime.kernel import codec\n"
        "class Trainer:\n"
        "    def step(self):\n"
        "        return [lambda: 0][0]\n"
        "sys.stdout.buffer.write(codec.dumps_by_value(Trainer))\n"
    )
    body = subprocess.run(
        [sys.executable, str(script)], capture_output=True, check=True, timeout=30
    ).stdout
    trainer = pickle.loads(body)
    step = trainer.step
    assert step.__code__.co_filename == str(script)
    assert step.__code__.co_firstlineno == 4
    assert trainer().step().__code__.co_filename == str(script)  # nested code too


def test_plain_pickle_can_read_bodies_without_buffers() -> None:
    parts = codec.dumps({"k": [1, 2.5, "s", None]})
    assert pickle.loads(parts[0]) == {"k": [1, 2.5, "s", None]}


def test_torch_tensor_out_of_band() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(1 << 18, dtype=torch.float32).reshape(512, 512)
    back, parts = round_trip(tensor)
    assert len(parts) == 2
    assert torch.equal(back, tensor)


MEMORYVIEWS = {
    "bytes": lambda: memoryview(b"abc"),
    "bytearray-large": lambda: memoryview(bytearray(range(256)) * (OOB // 256 + 1)),
    "int32-2d": lambda: memoryview(np.arange(12, dtype=np.int32).reshape(3, 4)),
    "int16-strided": lambda: memoryview(np.arange(40, dtype=np.int16))[::3],
    "float64-fortran": lambda: memoryview(np.asfortranarray(np.arange(6.0).reshape(2, 3))),
    "float64-0d": lambda: memoryview(np.array(2.5)),
    "empty": lambda: memoryview(b""),
}


@pytest.mark.parametrize("make", MEMORYVIEWS.values(), ids=MEMORYVIEWS.keys())
def test_memoryviews_arrive_as_memoryviews_with_format_shape_and_readonly(make: Any) -> None:
    view = make()
    back, _ = round_trip(view)
    assert type(back) is memoryview
    assert (back.format, back.shape, back.readonly) == (view.format, view.shape, view.readonly)
    assert back.tolist() == view.tolist()


def test_memoryview_formats_cast_cannot_rebuild_arrive_as_unsigned_bytes() -> None:
    records = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
    records["a"] = [1, 2, 3]
    view = memoryview(records)
    back, _ = round_trip(view)
    assert (back.format, back.shape) == ("B", (view.nbytes,))
    assert back.tobytes() == view.tobytes()
    empty_ints, _ = round_trip(memoryview(np.zeros(0, dtype=np.int32)))
    assert (empty_ints.format, empty_ints.shape, empty_ints.nbytes) == ("B", (0,), 0)


def test_a_writable_memoryview_arrives_writable_over_the_receivers_own_copy() -> None:
    source = bytearray(b"x" * OOB)
    back, _ = round_trip(memoryview(source))
    assert not back.readonly
    back[0] = ord("y")  # the part was received read-only: the view is over a copy
    assert source[0] == ord("x")


@pytest.mark.parametrize(("size", "nparts"), [(OOB - 1, 1), (OOB, 2), (1 << 20, 2)])
def test_memoryviews_travel_out_of_band_from_64_kib(size: int, nparts: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"m" * (size % 256)
    back, parts = round_trip({"nested": [memoryview(data)]})
    assert len(parts) == nparts
    assert len(parts[0]) < 1024 or nparts == 1
    assert bytes(back["nested"][0]) == data  # type: ignore[index]


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_empty_bytes_and_bytearrays_keep_their_type(kind: type) -> None:
    back, parts = round_trip(kind())
    assert type(back) is kind
    assert back == kind()
    assert len(parts) == 1


def test_a_bytearray_passed_twice_arrives_as_one_object() -> None:
    data = bytearray(b"b" * OOB)
    parts = codec.dumps_call((data, data), {})
    (args, _) = codec.loads([memoryview(bytes(p)) for p in parts])
    assert len(parts) == 2, "one out-of-band part for the one object"
    assert type(args[0]) is bytearray
    assert args[0] is args[1]
    assert args[0] == data


class Ticket:
    """A value that travels as a reference: it announces itself to whoever (un)pickles it."""

    def __init__(self, number: int) -> None:
        self.number = number

    def __reduce__(self) -> tuple[object, ...]:
        assert codec.carry(("sent", self.number))
        return (_arrive, (self.number,))


def _arrive(number: int) -> Ticket:
    ticket = Ticket(number)
    assert codec.carry(("arrived", number))
    return ticket


def test_values_that_travel_as_references_are_handed_to_both_ends() -> None:
    args, kwargs = (Ticket(1), [Ticket(2)]), {"k": Ticket(3), "plain": 4}
    parts, carried = codec.dumps_call_carrying(args, kwargs)
    assert carried == [("sent", 1), ("sent", 2), ("sent", 3)]
    (back_args, back_kwargs), arrived = codec.loads_carrying([bytes(p) for p in parts])
    assert arrived == [("arrived", 1), ("arrived", 2), ("arrived", 3)]
    assert [t.number for t in (back_args[0], *back_args[1], back_kwargs["k"])] == [1, 2, 3]
    # A plain call carries nothing, and outside these calls nothing collects.
    assert codec.dumps_call_carrying((1, "a"), {"b": 2.0})[1] == []
    assert codec.loads_carrying(codec.dumps_call((1,), {}))[1] == []
    assert codec.carry("nobody listens") is False
    with pytest.raises(AssertionError):
        pickle.dumps(Ticket(5))  # its __reduce__ insists on being carried


def _refuse(number: int) -> None:
    raise ValueError(f"ticket {number} cannot arrive")


class BadTicket:
    """Unpickles by raising (after the tickets before it arrived)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_refuse, (9,))


def test_what_a_message_that_will_not_run_carried_is_found_as_far_as_it_decodes() -> None:
    parts, _ = codec.dumps_call_carrying((Ticket(1), BadTicket(), Ticket(2)), {})
    raw = [bytes(p) for p in parts]
    with pytest.raises(ValueError, match="ticket 9"):
        codec.loads_carrying(raw)
    # The ticket before the failure arrived; nothing is raised, nothing else collects after.
    assert codec.carried_in(raw) == [("arrived", 1)]
    assert codec.carry("nobody listens") is False
    assert codec.carried_in(codec.dumps_call((1, "a"), {})) == []
