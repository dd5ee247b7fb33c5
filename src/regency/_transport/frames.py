"""Wire framing.

A frame is a fixed binary header, a table of part lengths, then the parts::

    u64 body_len | u8 kind | u8 nparts | u16 flags | u32 rank | u64 dest | u64 sender | u64 seq
    nparts x u64 part length
    part 0 .. part n-1

``body_len`` counts every byte after itself. Parts are opaque to this layer: the runtime puts a
small pickled envelope in the first and pickle protocol 5 out-of-band buffers in the rest, so large
payloads are written straight from the caller's memory with ``sendmsg``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from regency._errors import RegencyError

HEADER: Final = struct.Struct("<QBBHIQQQ")
LENGTH_PREFIX: Final = 8
PART_LEN: Final = struct.Struct("<Q")
MAX_PARTS: Final = 255
KIND_HEARTBEAT: Final = 0  # header only; the transport consumes it (see heartbeat.py)


# The packer of a frame's part-length table, by its number of parts (each precompiled).
_PART_TABLES: Final = [struct.Struct(f"<{n}Q") for n in range(MAX_PARTS + 1)]

_FIXED: Final = HEADER.size - LENGTH_PREFIX  # a frame's length counts its header but this


class FrameError(RegencyError):
    """A peer sent bytes that are not a valid frame (the connection is closed)."""


class FrameTooLargeError(RegencyError, ValueError):
    """A frame exceeds the configured size limit."""


@dataclass(slots=True)
class Frame:
    """One decoded frame; ``parts`` are memoryviews over the received bytes."""

    kind: int
    flags: int
    rank: int
    dest: int
    sender: int
    seq: int
    parts: list[memoryview]


def encode(
    kind: int,
    dest: int,
    parts: list[bytes | bytearray | memoryview],
    *,
    flags: int = 0,
    rank: int = 0,
    sender: int = 0,
    seq: int = 0,
    limit: int,
) -> list[bytes | bytearray | memoryview]:
    """Return the buffers of one frame (header first), ready for ``sendmsg``.

    Raises :class:`FrameTooLargeError` when the frame would exceed ``limit`` bytes.
    """
    return Encoder(parts, limit).frame(kind, dest, flags=flags, rank=rank, sender=sender, seq=seq)


# The header and part table of a frame of one part, and of two, packed at once.
_ONE_PART: Final = struct.Struct("<QBBHIQQQQ")
_TWO_PARTS: Final = struct.Struct("<QBBHIQQQQQ")
ONE_PART_FIXED: Final = _ONE_PART.size  # a one-part frame's bytes besides its part
TWO_PARTS_FIXED: Final = _TWO_PARTS.size  # a two-part frame's bytes besides its parts


def one_part(
    kind: int, dest: int, rank: int, flags: int, part: bytes | bytearray | memoryview, size: int
) -> list[bytes | bytearray | memoryview]:
    """The buffers of a frame of one part of ``size`` bytes (a reply), without an
    :class:`Encoder`; the caller has checked the frame's size (``ONE_PART_FIXED + size``)."""
    head = _ONE_PART.pack(_FIXED + 8 + size, kind, 1, flags, rank, dest, 0, 0, size)
    return [head, part]


def two_parts(
    kind: int, dest: int, rank: int, sender: int, seq: int, first: bytes, second: bytes
) -> list[bytes | bytearray | memoryview]:
    """The buffers of a frame of two ``bytes`` parts (an envelope and a pickle: a call), flags
    0, without an :class:`Encoder`; the caller has checked the frame's size
    (``TWO_PARTS_FIXED`` and the parts' lengths)."""
    n0 = len(first)
    n1 = len(second)
    head = _TWO_PARTS.pack(_FIXED + 16 + n0 + n1, kind, 2, 0, rank, dest, sender, seq, n0, n1)
    return [head, first, second]


class Encoder:
    """Frames of the same parts for several destinations: only the header differs.

    Sizes, the size check and the part table are computed once (a cast sends one message to
    many actors).
    """

    __slots__ = ("body_len", "nparts", "parts", "table")

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview], limit: int) -> None:
        nparts = len(parts)
        if nparts > MAX_PARTS:
            _check(nparts, 0, limit)
        sizes = [p.nbytes if type(p) is memoryview else len(p) for p in parts]
        self.body_len = _FIXED + 8 * nparts + sum(sizes)
        if self.body_len + LENGTH_PREFIX > limit:
            _check(nparts, self.body_len + LENGTH_PREFIX, limit)
        self.nparts = nparts
        self.parts = parts
        self.table = _PART_TABLES[nparts].pack(*sizes)

    @property
    def size(self) -> int:
        """Bytes in one encoded frame."""
        return self.body_len + LENGTH_PREFIX

    def check_room(self, parts: int, nbytes: int, limit: int) -> None:
        """Raise :class:`FrameTooLargeError` unless these parts with ``parts`` more of
        ``nbytes`` bytes in all would still make a frame within ``limit`` bytes."""
        _check(self.nparts + parts, self.size + 8 * parts + nbytes, limit)

    def frame(
        self, kind: int, dest: int, *, flags: int = 0, rank: int = 0, sender: int = 0, seq: int = 0
    ) -> list[bytes | bytearray | memoryview]:
        """The buffers of one frame for these header fields."""
        head = HEADER.pack(self.body_len, kind, self.nparts, flags, rank, dest, sender, seq)
        return [head + self.table, *self.parts]

    def frame_after(
        self,
        first: bytes,
        limit: int,
        kind: int,
        dest: int,
        rank: int,
        sender: int,
        seq: int,
        second: bytes | None = None,
    ) -> tuple[list[bytes | bytearray | memoryview], int]:
        """A small frame (no flags) of ``first`` (and ``second``, if given) followed by these
        parts, as one buffer (raising :class:`FrameTooLargeError` unless it fits ``limit``), and
        its size in bytes. One buffer: a stream of such frames is written and coalesced without
        handling each of their parts again."""
        if second is None:
            nparts = self.nparts + 1
            body_len = self.body_len + 8 + len(first)
            lead = _PART_TABLES[1].pack(len(first))
        else:
            nparts = self.nparts + 2
            body_len = self.body_len + 16 + len(first) + len(second)
            lead = _PART_TABLES[2].pack(len(first), len(second))
        if nparts > MAX_PARTS or body_len + LENGTH_PREFIX > limit:
            _check(nparts, body_len + LENGTH_PREFIX, limit)
        head = HEADER.pack(body_len, kind, nparts, 0, rank, dest, sender, seq)
        if second is None:
            frame = b"".join((head, lead, self.table, first, *self.parts))
        else:
            frame = b"".join((head, lead, self.table, first, second, *self.parts))
        return [frame], body_len + LENGTH_PREFIX


class SecondPart:
    """Small frames of one message that differ only in their header's rank and sequence number
    and in a second part of one size (a cast's frames to the heads of its subtrees): what they
    share is packed and joined once."""

    __slots__ = ("_fields", "_middle", "_tail", "size")

    def __init__(
        self,
        encoder: Encoder,
        first: bytes,
        second_size: int,
        limit: int,
        kind: int,
        dest: int,
        sender: int,
        flags: int = 0,
    ) -> None:
        nparts = encoder.nparts + 2
        body_len = encoder.body_len + 16 + len(first) + second_size
        if nparts > MAX_PARTS or body_len + LENGTH_PREFIX > limit:
            _check(nparts, body_len + LENGTH_PREFIX, limit)
        self._fields = (body_len, kind, nparts, flags, dest, sender)
        self._middle = _PART_TABLES[2].pack(len(first), second_size) + encoder.table + first
        self._tail = b"".join(encoder.parts)
        self.size = body_len + LENGTH_PREFIX

    def frame(self, rank: int, seq: int, second: bytes) -> list[bytes | bytearray | memoryview]:
        """One frame, as one buffer, for this rank, sequence number and second part."""
        body_len, kind, nparts, flags, dest, sender = self._fields
        head = HEADER.pack(body_len, kind, nparts, flags, rank, dest, sender, seq)
        return [b"".join((head, self._middle, second, self._tail))]


def _check(nparts: int, size: int, limit: int) -> None:
    """Raise :class:`FrameTooLargeError` if a frame of ``nparts`` parts, ``size`` bytes in all,
    would break the limits."""
    if nparts > MAX_PARTS:
        raise FrameTooLargeError(f"a frame holds at most {MAX_PARTS} parts, got {nparts}")
    if size > limit:
        raise FrameTooLargeError(
            f"message of {size} bytes exceeds the frame size limit of {limit} bytes "
            "(raise it with regency.config.configure(max_frame_bytes=...))"
        )


def decode(frame: memoryview) -> Frame:
    """Decode one whole frame (its length prefix included); the parts are views into it."""
    _, kind, nparts, flags, rank, dest, sender, seq = HEADER.unpack_from(frame)
    offset = HEADER.size + 8 * nparts
    end = frame.nbytes
    if end < offset:
        raise FrameError("frame shorter than its part table")
    parts = []
    for size in _PART_TABLES[nparts].unpack_from(frame, HEADER.size):
        parts.append(frame[offset : offset + size])
        offset += size
    if offset != end:
        raise FrameError("frame part lengths do not add up to the frame length")
    return Frame(kind, flags, rank, dest, sender, seq, parts)
