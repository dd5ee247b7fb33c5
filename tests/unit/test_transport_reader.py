"""``FrameReader`` over a real socket pair: how a byte stream is cut into frames."""

from __future__ import annotations

import random
import select
import socket
import struct
from collections.abc import Iterator

import pytest

from regency._transport import frames
from regency._transport.frames import HEADER, Frame, FrameError
from regency._transport.reader import FrameReader

pytestmark = pytest.mark.timeout(60)

LIMIT = 1 << 30
CHUNK = 256 * 1024  # the reader's receive buffer


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    writer, reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader.setblocking(False)
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    yield writer, reader
    writer.close()
    reader.close()


def encode(payload: bytes, seq: int = 0, extra: bytes | None = None) -> bytes:
    parts = [payload] if extra is None else [payload, extra]
    return b"".join(bytes(b) for b in frames.encode(1, 7, parts, seq=seq, limit=LIMIT))


def drain(reader: FrameReader, sock: socket.socket) -> list[Frame]:
    """Read until the socket has nothing more to give right now."""
    got: list[Frame] = []
    while True:
        batch = reader.read()
        assert batch is not None, "unexpected end of stream"
        got.extend(batch)
        if not batch and not select.select([sock], [], [], 0)[0]:
            return got


def test_many_small_frames_from_one_recv(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    stream = b"".join(encode(b"m%d" % i, seq=i) for i in range(500))
    assert len(stream) < CHUNK
    writer.sendall(stream)
    reader = FrameReader(sock, LIMIT)
    got = reader.read()  # a single read call
    assert got is not None
    assert [f.seq for f in got] == list(range(500))
    assert [bytes(f.parts[0]) for f in got] == [b"m%d" % i for i in range(500)]
    assert reader.read() == []


def test_frame_split_across_many_recvs(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    data = encode(b"split me " * 20, seq=9, extra=b"second part")
    reader = FrameReader(sock, LIMIT)
    for i in range(len(data) - 1):
        writer.sendall(data[i : i + 1])
        assert reader.read() == [], f"a frame came out after {i + 1} of {len(data)} bytes"
    writer.sendall(data[-1:])
    (got,) = reader.read() or [None]
    assert got is not None
    assert got.seq == 9
    assert [bytes(p) for p in got.parts] == [b"split me " * 20, b"second part"]


@pytest.mark.parametrize("size", [CHUNK - 200, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 8 << 20])
def test_large_frame_received_in_pieces(
    pair: tuple[socket.socket, socket.socket], size: int
) -> None:
    writer, sock = pair
    payload = random.Random(size).randbytes(size)
    # A small frame first, so the big one does not start at the head of the buffer, and one after
    # it, so the bytes following the big frame are not swallowed by it.
    data = encode(b"before", seq=1) + encode(payload, seq=2) + encode(b"after", seq=3)
    reader = FrameReader(sock, LIMIT)
    got: list[Frame] = []
    reads = 0
    for start in range(0, len(data), 48 * 1024):
        writer.sendall(data[start : start + 48 * 1024])
        got.extend(drain(reader, sock))
        reads += 1
    assert reads > 1
    assert [f.seq for f in got] == [1, 2, 3]
    assert bytes(got[1].parts[0]) == payload
    assert bytes(got[2].parts[0]) == b"after"


def test_random_stream_in_random_pieces(pair: tuple[socket.socket, socket.socket]) -> None:
    rng = random.Random(1234)
    writer, sock = pair
    payloads = []
    for _ in range(1500):
        kind = rng.random()
        if kind < 0.02:
            size = rng.randrange(CHUNK - 100, 2 * CHUNK)
        elif kind < 0.1:
            size = rng.randrange(10_000, 100_000)
        else:
            size = rng.randrange(0, 600)
        payloads.append(rng.randbytes(size))
    data = b"".join(encode(p, seq=i) for i, p in enumerate(payloads))
    reader = FrameReader(sock, LIMIT)
    got: list[Frame] = []
    pos = 0
    while pos < len(data):
        step = rng.choice([1, 7, 43, 1000, 4096, 65536, 200_000])
        writer.sendall(data[pos : pos + step])
        pos += step
        got.extend(drain(reader, sock))
    assert [f.seq for f in got] == list(range(len(payloads)))
    for frame, payload in zip(got, payloads):
        assert bytes(frame.parts[0]) == payload


def test_frames_stay_valid_after_later_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    # The reader reuses its receive buffer; frames it returned must not change under the caller.
    writer, sock = pair
    reader = FrameReader(sock, LIMIT)
    writer.sendall(encode(b"A" * 1000, seq=1))
    first = drain(reader, sock)
    for i in range(300):
        writer.sendall(encode(bytes([i % 256]) * 1000, seq=i + 2))
        drain(reader, sock)
    assert bytes(first[0].parts[0]) == b"A" * 1000


def test_end_of_stream(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    reader = FrameReader(sock, LIMIT)
    writer.sendall(encode(b"last"))
    writer.shutdown(socket.SHUT_WR)
    got = reader.read()
    assert got is not None
    assert [bytes(f.parts[0]) for f in got] == [b"last"]
    assert reader.read() is None


@pytest.mark.parametrize("size", [100, 2 * CHUNK])
def test_end_of_stream_inside_a_frame(pair: tuple[socket.socket, socket.socket], size: int) -> None:
    writer, sock = pair
    reader = FrameReader(sock, LIMIT)
    data = encode(b"x" * size)
    writer.sendall(data[: len(data) // 2])
    writer.shutdown(socket.SHUT_WR)
    results = [reader.read() for _ in range(4)]
    assert None in results, "a truncated frame then EOF must end the stream"
    assert all(r in ([], None) for r in results), "no partial frame may come out"


def test_announced_length_over_the_limit(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    data = encode(b"x" * 1000)
    reader = FrameReader(sock, len(data) - 1)
    writer.sendall(data[: HEADER.size])  # only the header: rejected before the body arrives
    with pytest.raises(FrameError, match="limit"):
        reader.read()


def test_a_whole_frame_over_the_limit_in_one_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # One whole frame per read is the reader's quick case: it checks the limit all the same.
    writer, sock = pair
    data = encode(b"x" * 1000)
    writer.sendall(data)
    with pytest.raises(FrameError, match="limit"):
        FrameReader(sock, len(data) - 1).read()


def test_announced_length_at_the_limit(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    data = encode(b"x" * 1000)
    reader = FrameReader(sock, len(data))
    writer.sendall(data)
    got = reader.read()
    assert got is not None
    assert len(got) == 1


def test_announced_length_shorter_than_a_header(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    writer.sendall(struct.pack("<Q", 5) + b"\0" * (HEADER.size - 8))
    with pytest.raises(FrameError):
        FrameReader(sock, LIMIT).read()


def test_huge_announced_length(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    writer.sendall(struct.pack("<Q", 2**64 - 1) + b"\0" * (HEADER.size - 8))
    with pytest.raises(FrameError):
        FrameReader(sock, LIMIT).read()


def raw_frame(sizes: list[int], payload: bytes) -> bytes:
    """A frame whose part table says ``sizes`` whatever ``payload`` holds."""
    table = struct.pack(f"<{len(sizes)}Q", *sizes)
    body_len = HEADER.size - 8 + len(table) + len(payload)
    return HEADER.pack(body_len, 1, len(sizes), 0, 0, 7, 0, 3) + table + payload


def test_one_frame_and_a_half_in_one_read(pair: tuple[socket.socket, socket.socket]) -> None:
    # The quick case (one whole frame per read) must not take a frame and a half for one.
    writer, sock = pair
    first, second = encode(b"one", seq=1, extra=b"two"), encode(b"three" * 50, seq=2)
    reader = FrameReader(sock, LIMIT)
    writer.sendall(first + second[:30])
    got = reader.read()
    assert got is not None
    assert [(f.seq, [bytes(p) for p in f.parts]) for f in got] == [(1, [b"one", b"two"])]
    writer.sendall(second[30:])
    (rest,) = reader.read() or [None]
    assert rest is not None
    assert (rest.seq, bytes(rest.parts[0])) == (2, b"three" * 50)
    # Back to one whole frame per read.
    writer.sendall(encode(b"four", seq=3))
    assert [f.seq for f in reader.read() or []] == [3]


def test_part_lengths_that_do_not_add_up(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    writer.sendall(raw_frame([3, 4], b"abcdefgh"))  # 7 bytes of parts announced, 8 sent
    with pytest.raises(FrameError, match="do not add up"):
        FrameReader(sock, LIMIT).read()


def test_part_table_longer_than_the_frame(pair: tuple[socket.socket, socket.socket]) -> None:
    writer, sock = pair
    data = raw_frame([1, 1, 1], b"abc")
    # Same length prefix, but the frame claims more parts than its bytes can hold a table for.
    data = data[:9] + bytes([200]) + data[10:]
    writer.sendall(data)
    with pytest.raises(FrameError, match="shorter than its part table"):
        FrameReader(sock, LIMIT).read()


def test_a_whole_frame_of_the_buffer_size_in_one_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    writer, sock = pair
    payload = b"y" * (CHUNK - len(encode(b"")))
    data = encode(payload, seq=5)
    assert len(data) == CHUNK
    writer.sendall(data)
    got = drain(FrameReader(sock, LIMIT), sock)
    assert [(f.seq, bytes(f.parts[0])) for f in got] == [(5, payload)]
