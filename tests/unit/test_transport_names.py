"""Parts sent once per connection and named afterwards: both ends' accounts and what a
receiver refuses (over real connections: ``test_transport_transport.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from regency._transport import frames
from regency._transport.frames import Frame, FrameError
from regency._transport.names import (
    FLAG_NAMED,
    KIND_NAME,
    NAME_BYTES,
    NAMED_BYTES_MAX,
    NAMED_PART_MAX,
    NAMES_MAX,
    Named,
    NamesReceived,
    NamesSent,
)

pytestmark = pytest.mark.timeout(60)

LIMIT = 1 << 30
SECRET = os.urandom(32)


def _decoded(buffers: list[bytes | bytearray | memoryview]) -> Frame:
    return frames.decode(memoryview(b"".join(buffers)))


def _naming(named: Named, payload: bytes = b"message") -> Frame:
    """A frame whose part 1 is ``named``'s name, as a sender makes it."""
    buffers = frames.encode(1, 5, [b"routing", named.name, payload], flags=FLAG_NAMED, limit=LIMIT)
    return _decoded(buffers)


def _through(sent: NamesSent, received: NamesReceived, named: Named) -> Frame:
    """Send a frame naming ``named`` from one account to the other; the frame as received."""
    define = sent.define(named)
    if define is not None:
        buffers, size = define
        assert size == len(b"".join(buffers))
        received.define(_decoded(buffers))
    frame = _naming(named)
    received.resolve(frame)
    return frame


def test_a_part_crosses_once_and_comes_back_whole_every_time() -> None:
    sent, received = NamesSent(), NamesReceived()
    named = Named.of(b"subtree " * 40)
    assert sent.define(named) is not None
    assert sent.define(named) is None, "the receiver holds it now"
    sent = NamesSent()
    for _ in range(3):
        frame = _through(sent, received, named)
        assert bytes(frame.parts[1]) == named.blob
        assert [bytes(p) for p in (frame.parts[0], frame.parts[2])] == [b"routing", b"message"]
        assert not frame.flags & FLAG_NAMED
    assert len(received) == 1
    assert Named.of(named.blob).name == named.name, "equal bytes, one name"


@pytest.mark.parametrize(
    ("count", "size"),
    [(NAMES_MAX + 40, 100), (40, NAMED_PART_MAX)],
    ids=["by-count", "by-bytes"],
)
def test_the_sender_drops_its_oldest_names_and_the_receiver_follows(count: int, size: int) -> None:
    sent, received = NamesSent(), NamesReceived()
    parts = [Named.of(i.to_bytes(4, "little") * (size // 4)) for i in range(count)]
    for named in parts:
        assert bytes(_through(sent, received, named).parts[1]) == named.blob
    assert len(sent) == len(received) < count
    assert len(received) <= NAMES_MAX
    # The newest are held on both sides; the oldest went, and naming one again sends it again.
    assert sent.define(parts[-1]) is None
    with pytest.raises(FrameError, match="never sent"):
        received.resolve(_naming(parts[0]))
    assert bytes(_through(sent, received, parts[0]).parts[1]) == parts[0].blob


def test_a_part_too_large_to_name_is_refused_by_the_sender() -> None:
    with pytest.raises(ValueError, match="at most"):
        Named.of(b"x" * (NAMED_PART_MAX + 1))


def _name_frame(*parts: bytes) -> Frame:
    return _decoded(frames.encode(KIND_NAME, 0, list(parts), limit=LIMIT))


NAME = b"n" * NAME_BYTES


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (lambda: _name_frame(NAME, b"blob"), "3 parts"),
        (lambda: _name_frame(b"short", b"blob", b""), "malformed"),
        (lambda: _name_frame(NAME, b"blob", b"x" * 5), "malformed"),
        (lambda: _name_frame(NAME, b"blob", b"d" * NAME_BYTES), "does not hold"),
        (lambda: _name_frame(NAME, b"x" * (NAMED_PART_MAX + 1), b""), "at most"),
    ],
)
def test_a_malformed_name_frame_is_a_protocol_error(
    frame: Callable[[], Frame], message: str
) -> None:
    with pytest.raises(FrameError, match=message):
        NamesReceived().define(frame())


def test_a_receiver_holds_no_more_than_the_bounds_and_no_name_twice() -> None:
    received = NamesReceived()
    received.define(_name_frame(NAME, b"blob", b""))
    with pytest.raises(FrameError, match="holds already"):
        received.define(_name_frame(NAME, b"other", b""))
    for i in range(NAMES_MAX - 1):
        received.define(_name_frame(i.to_bytes(NAME_BYTES, "little"), b"b", b""))
    with pytest.raises(FrameError, match="past what a connection holds"):
        received.define(_name_frame(b"z" * NAME_BYTES, b"b", b""))
    # With a drop listed, the same definition is within the bounds.
    received.define(_name_frame(b"z" * NAME_BYTES, b"b", NAME))
    big = NamesReceived()
    for i in range(NAMED_BYTES_MAX // NAMED_PART_MAX):
        big.define(_name_frame(i.to_bytes(NAME_BYTES, "little"), b"x" * NAMED_PART_MAX, b""))
    with pytest.raises(FrameError, match="past what a connection holds"):
        big.define(_name_frame(NAME, b"x", b""))


def test_a_frame_naming_nothing_is_a_protocol_error() -> None:
    received = NamesReceived()
    with pytest.raises(FrameError, match="never sent"):
        received.resolve(_naming(Named.of(b"never defined")))
    bare = _decoded(frames.encode(1, 5, [b"only"], flags=FLAG_NAMED, limit=LIMIT))
    with pytest.raises(FrameError, match="no name in part 1"):
        received.resolve(bare)
