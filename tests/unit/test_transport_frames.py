"""Wire framing: ``encode``/``decode`` round trips, the size limit, bad part tables."""

from __future__ import annotations

import struct

import pytest

from regency._transport import frames
from regency._transport.frames import HEADER, FrameError, FrameTooLargeError

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 40


def _join(buffers: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(b) for b in buffers)


def _decode(data: bytes) -> frames.Frame:
    view = memoryview(data)
    (body_len,) = struct.unpack_from("<Q", data)
    assert body_len + 8 == len(data), "length prefix does not count every byte after itself"
    return frames.decode(view)


@pytest.mark.parametrize(
    "parts",
    [
        [],
        [b""],
        [b"body"],
        [b"body", b"", b"x" * 70_000],
        [bytearray(b"abc"), memoryview(b"defg"), b"h"],
        [bytes([i]) * i for i in range(255)],
    ],
    ids=["none", "one-empty", "one", "mixed-sizes", "buffer-types", "max-parts"],
)
def test_round_trip_parts(parts: list[bytes | bytearray | memoryview]) -> None:
    decoded = _decode(_join(frames.encode(3, 17, parts, limit=BIG)))
    assert [bytes(p) for p in decoded.parts] == [bytes(p) for p in parts]
    assert all(isinstance(p, memoryview) for p in decoded.parts)


def test_round_trip_header_fields_at_their_extremes() -> None:
    fields = {"flags": 0xFFFF, "rank": 0xFFFFFFFF, "sender": 2**64 - 1, "seq": 2**64 - 2}
    data = _join(frames.encode(255, 2**64 - 3, [b"p"], limit=BIG, **fields))
    decoded = _decode(data)
    assert (decoded.kind, decoded.dest) == (255, 2**64 - 3)
    assert (decoded.flags, decoded.rank, decoded.sender, decoded.seq) == tuple(fields.values())


def test_encode_does_not_copy_parts() -> None:
    payload = bytearray(b"x" * 100_000)
    buffers = frames.encode(1, 1, [b"env", payload], limit=BIG)
    assert buffers[-1] is payload, "large parts should be handed to sendmsg as they are"


def test_limit_is_inclusive_and_the_error_names_it() -> None:
    overhead = len(_join(frames.encode(1, 1, [b""], limit=BIG)))
    limit = overhead + 1000
    frames.encode(1, 1, [b"x" * 1000], limit=limit)  # exactly the limit: fine
    with pytest.raises(FrameTooLargeError) as info:
        frames.encode(1, 1, [b"x" * 1001], limit=limit)
    assert isinstance(info.value, ValueError)
    assert str(limit) in str(info.value)
    assert str(limit + 1) in str(info.value), "the error should say how big the message was"
    assert "max_frame_bytes" in str(info.value)


def test_too_many_parts() -> None:
    with pytest.raises(FrameTooLargeError, match="255"):
        frames.encode(1, 1, [b""] * 256, limit=BIG)


def test_room_for_parts_a_relay_adds_is_checked_as_the_frame_it_makes() -> None:
    encoder = frames.Encoder([b"x" * 1000], BIG)
    routing = b"r" * 300
    limit = len(_join(frames.encode(1, 1, [routing, b"x" * 1000], limit=BIG)))
    encoder.check_room(1, len(routing), limit)  # exactly the limit: fine
    with pytest.raises(FrameTooLargeError, match=str(limit)):
        encoder.check_room(1, len(routing) + 1, limit)
    with pytest.raises(FrameTooLargeError, match="255"):
        frames.Encoder([b""] * 255, BIG).check_room(1, 0, BIG)


def _raw(nparts: int, sizes: list[int], payload: bytes) -> bytes:
    table = struct.pack(f"<{len(sizes)}Q", *sizes)
    body_len = HEADER.size - 8 + len(table) + len(payload)
    return HEADER.pack(body_len, 1, nparts, 0, 0, 1, 2, 3) + table + payload


@pytest.mark.parametrize(
    "data",
    [
        _raw(1, [100], b"hello"),  # part longer than the frame
        _raw(1, [2], b"hello"),  # bytes left over after the parts
        _raw(2, [5, 1], b"hello"),  # second part runs past the end
        _raw(1, [2**64 - 1], b"hello"),  # absurd length
        _raw(2, [2**64 - 1, 6], b"hello"),  # lengths that wrap around modulo 2**64
        _raw(3, [], b""),  # table longer than the whole frame
        _raw(200, [1], b"x"),  # table longer than the whole frame
    ],
    ids=[
        "part-too-long",
        "left-over",
        "second-past-end",
        "huge",
        "wraps",
        "no-table",
        "short-table",
    ],
)
def test_inconsistent_part_table_is_a_frame_error(data: bytes) -> None:
    with pytest.raises(FrameError):
        _decode(data)


def test_frames_that_differ_in_rank_number_and_second_part_are_the_same_frames() -> None:
    message = frames.Encoder([b"envelope", memoryview(b"payload")], 1 << 20)
    shared = frames.SecondPart(message, b"routing", 16, 1 << 20, 2, 7, 9, flags=0x4000)
    for rank, seq, second in [(0, 1, b"a" * 16), (3, 2**63, b"b" * 16)]:
        [made] = shared.frame(rank, seq, second)
        parts: list[bytes | bytearray | memoryview] = [b"routing", second, b"envelope", b"payload"]
        expected = frames.encode(
            2, 7, parts, flags=0x4000, rank=rank, sender=9, seq=seq, limit=1 << 20
        )
        assert made == b"".join(expected)
        assert shared.size == len(made)
        # Without the flag, the same frame as the general path makes.
        plain, size = message.frame_after(b"routing", 1 << 20, 2, 7, rank, 9, seq, second)
        assert plain == [made[:10] + b"\0\0" + made[12:]]
        assert size == len(made)
        decoded = frames.decode(memoryview(made))
        assert (decoded.kind, decoded.flags, decoded.rank, decoded.dest) == (2, 0x4000, rank, 7)
        assert (decoded.sender, decoded.seq) == (9, seq)
        assert [bytes(p) for p in decoded.parts] == [b"routing", second, b"envelope", b"payload"]
    with pytest.raises(FrameTooLargeError):
        frames.SecondPart(message, b"routing", 16, 64, 2, 7, 9)
