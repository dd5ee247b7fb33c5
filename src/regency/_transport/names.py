"""Parts a connection sends once and names afterwards.

A sender that puts the same bytes in many frames to one peer (a cast's description of a
subtree, the same for every cast to one view) sends them once per connection: a *name frame*
(:data:`KIND_NAME`) gives the bytes a name, and a frame flagged :data:`FLAG_NAMED` carries that
name in place of its part 1. The receiving end puts the bytes back before anyone above the
transport sees the frame, so a frame reads the same whether its part travelled in full or by name.

The sender decides what the receiver holds: at most :data:`NAMES_MAX` names and
:data:`NAMED_BYTES_MAX` bytes per connection. To make room a name frame lists the names the
receiver drops (the sender's oldest). Both ends follow the one order of the connection's bytes,
so the sender's account is exact; a name frame that breaks the bounds, or a frame naming a part
the receiver does not hold, is a protocol error (the connection closes): only a faulty or
hostile peer sends one. Everything is per connection: a new connection starts with no names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from regency._transport import frames
from regency._transport.frames import Frame, FrameError

KIND_NAME: Final = 254  # a transport-level frame: part 0 a name, part 1 its bytes, part 2 drops
FLAG_NAMED: Final = 0x4000  # part 1 of this frame is a name the connection defined earlier
NAME_BYTES: Final = 16
NAMES_MAX: Final = 256
NAMED_BYTES_MAX: Final = 1 << 20
NAMED_PART_MAX: Final = 64 * 1024  # larger parts always travel in full

_NAME_FRAME_LIMIT: Final = NAMED_PART_MAX + NAMES_MAX * NAME_BYTES + 4096

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Named:
    """Bytes that travel by name once a connection has carried them: ``name`` is a digest of
    ``blob``, so equal bytes get one name whoever makes them."""

    name: bytes
    blob: bytes

    @classmethod
    def of(cls, blob: bytes) -> Named:
        """``blob`` under its digest (at most :data:`NAMED_PART_MAX` bytes)."""
        if len(blob) > NAMED_PART_MAX:
            raise ValueError(f"a named part holds at most {NAMED_PART_MAX} bytes, got {len(blob)}")
        return cls(hashlib.blake2b(blob, digest_size=NAME_BYTES).digest(), blob)


class NamesSent:
    """The names a connection's receiver holds, by the sender's account (used under the
    connection's write lock, in the order its bytes go out)."""

    __slots__ = ("_bytes", "_held")

    def __init__(self) -> None:
        self._held: dict[bytes, int] = {}  # name -> size, oldest first
        self._bytes = 0

    def define(self, named: Named) -> tuple[list[Buffer], int] | None:
        """The buffers and size of the name frame that must go out before a frame naming
        ``named`` (oldest names dropped to make room), or None when the receiver holds it."""
        held = self._held
        if named.name in held:
            return None
        size = len(named.blob)
        drops: list[bytes] = []
        while held and (len(held) >= NAMES_MAX or self._bytes + size > NAMED_BYTES_MAX):
            old = next(iter(held))
            self._bytes -= held.pop(old)
            drops.append(old)
        held[named.name] = size
        self._bytes += size
        buffers = frames.encode(
            KIND_NAME, 0, [named.name, named.blob, b"".join(drops)], limit=_NAME_FRAME_LIMIT
        )
        return buffers, sum(len(b) for b in buffers)

    def ahead(self, named: Named, buffers: Sequence[Buffer]) -> tuple[Sequence[Buffer], int]:
        """``buffers`` preceded by the name frame of ``named`` unless the receiver holds it,
        and how many bytes that added."""
        define = self.define(named)
        if define is None:
            return buffers, 0
        return [*define[0], *buffers], define[1]

    def __len__(self) -> int:
        return len(self._held)


class NamesReceived:
    """The parts a connection's sender named, at the receiving end (used by the one reader of
    the connection, in order)."""

    __slots__ = ("_bytes", "_held")

    def __init__(self) -> None:
        self._held: dict[bytes, bytes] = {}
        self._bytes = 0

    def define(self, frame: Frame) -> None:
        """Take a :data:`KIND_NAME` frame; :class:`FrameError` if it breaks the protocol."""
        if len(frame.parts) != 3:
            raise FrameError(f"a name frame has 3 parts, not {len(frame.parts)}")
        name, blob, drops = frame.parts
        if name.nbytes != NAME_BYTES or drops.nbytes % NAME_BYTES:
            raise FrameError("a name frame's name or list of dropped names is malformed")
        if blob.nbytes > NAMED_PART_MAX:
            raise FrameError(f"a named part of {blob.nbytes} bytes (at most {NAMED_PART_MAX})")
        held = self._held
        for at in range(0, drops.nbytes, NAME_BYTES):
            old = held.pop(bytes(drops[at : at + NAME_BYTES]), None)
            if old is None:
                raise FrameError("a name frame drops a name this connection does not hold")
            self._bytes -= len(old)
        key = bytes(name)
        if key in held:
            raise FrameError("a name frame names a part this connection holds already")
        if len(held) >= NAMES_MAX or self._bytes + blob.nbytes > NAMED_BYTES_MAX:
            raise FrameError("a name frame goes past what a connection holds by name")
        held[key] = bytes(blob)
        self._bytes += blob.nbytes

    def resolve(self, frame: Frame) -> None:
        """Put the named part back into a :data:`FLAG_NAMED` frame (:class:`FrameError` if it
        names none this connection holds)."""
        parts = frame.parts
        if len(parts) < 2 or parts[1].nbytes != NAME_BYTES:
            raise FrameError("a frame flagged as naming a part has no name in part 1")
        blob = self._held.get(bytes(parts[1]))
        if blob is None:
            raise FrameError("a frame names a part this connection was never sent")
        parts[1] = memoryview(blob)
        frame.flags &= ~FLAG_NAMED

    def __len__(self) -> int:
        return len(self._held)
