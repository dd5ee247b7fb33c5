"""Incremental frame parsing from a non-blocking socket."""

from __future__ import annotations

import struct

from regency._transport.frames import (
    HEADER,
    LENGTH_PREFIX,
    Frame,
    FrameError,
    decode,
)
from regency._transport.tls import SecureSocket, Stream

_CHUNK = 256 * 1024
_LEN = struct.Struct("<Q")
_HEAD = HEADER.size
_MIN_BODY = _HEAD - LENGTH_PREFIX  # a frame's length counts at least its header
# Reads of one large frame in a row over TLS (16 KiB records), before epoll gets its turn.
_TLS_READS = 256


class FrameReader:
    """Accumulates bytes from one socket and cuts them into frames.

    Small frames are copied out of a reused receive buffer; a frame larger than the buffer gets a
    buffer of its own and is received straight into it, so its out-of-band parts are never copied
    again.
    """

    __slots__ = (
        "_big",
        "_big_filled",
        "_buf",
        "_end",
        "_limit",
        "_quick",
        "_recv_into",
        "_sock",
        "_start",
        "_tls",
        "_view",
    )

    def __init__(self, sock: Stream, limit: int) -> None:
        self._sock = sock
        self._recv_into = sock.recv_into
        self._tls = isinstance(sock, SecureSocket)
        self._limit = limit
        self._buf = bytearray(_CHUNK)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._big: bytearray | None = None
        self._big_filled = 0
        # Whether the next read may take the quick path: nothing buffered, no TLS.
        self._quick = not self._tls

    def read(self) -> list[Frame] | None:
        """Read what is available; return complete frames, or ``None`` at end of stream.

        Raises :class:`FrameError` on bytes that cannot be a frame.
        """
        if not self._quick:
            return self._read()
        # The common read: into an empty buffer, exactly one whole frame (a call, a reply).
        # Anything else (part of a frame, several, a bad length) goes on through _cut.
        view = self._view
        try:
            n = self._recv_into(view)
        except (BlockingIOError, InterruptedError):
            return []
        if n >= _HEAD:
            (body_len,) = _LEN.unpack_from(self._buf)
            if n == LENGTH_PREFIX + body_len and n <= self._limit:
                return [decode(memoryview(bytes(view[:n])))]
        elif n == 0:
            return None
        self._end = n
        self._quick = False
        return self._cut()

    def _read(self) -> list[Frame] | None:
        """A read with bytes buffered, a large frame under way, or over TLS."""
        try:
            frames = self._step()
        except (BlockingIOError, InterruptedError):
            return []
        if frames is None or not self._tls:
            return frames
        # OpenSSL hands out one record per read. Read on while it holds decrypted bytes
        # (epoll cannot see those), and through a large frame; otherwise epoll says when the
        # next record is in (a read that would only return "nothing yet" costs a syscall).
        sock = self._sock
        assert isinstance(sock, SecureSocket)
        reads = 1
        while sock.pending() or (self._big is not None and reads < _TLS_READS):
            reads += 1
            try:
                more = self._step()
            except (BlockingIOError, InterruptedError):
                break
            if more is None:  # the end: hand over these frames, the next read sees it again
                break
            frames.extend(more)
        return frames

    def _step(self) -> list[Frame] | None:
        """One receive (``BlockingIOError`` when nothing is there)."""
        if self._big is not None:
            return self._read_big()
        n = self._recv_into(self._view[self._end :])
        if n == 0:
            return None
        self._end += n
        return self._cut()

    def _read_big(self) -> list[Frame] | None:
        big = self._big
        assert big is not None
        n = self._recv_into(memoryview(big)[self._big_filled :])
        if n == 0:
            return None
        self._big_filled += n
        if self._big_filled < len(big):
            return []
        self._big = None
        self._quick = not self._tls
        return [decode(memoryview(big))]

    def _cut(self) -> list[Frame]:
        buf = self._buf
        start = pos = self._start
        end = self._end
        ends: list[int] = []  # where each complete frame of this read ends
        pending = 0  # length of an incomplete frame at ``pos``, once its header is in
        least, most = _MIN_BODY, self._limit - LENGTH_PREFIX
        while end - pos >= _HEAD:
            (body_len,) = _LEN.unpack_from(buf, pos)
            if not least <= body_len <= most:
                raise self._bad_length(body_len)
            total = LENGTH_PREFIX + body_len
            if end - pos < total:
                pending = total
                break
            pos += total
            ends.append(pos - start)
        frames: list[Frame] = []
        if ends:
            # One copy for every complete frame of this read; the frames are views into it.
            chunk = memoryview(bytes(self._view[start:pos]))
            if len(ends) == 1:
                frames.append(decode(chunk))
            else:
                begin = 0
                for stop in ends:
                    frames.append(decode(chunk[begin:stop]))
                    begin = stop
        self._start = pos
        remaining = end - pos
        if remaining == 0:
            self._start = self._end = 0
            self._quick = not self._tls
        elif pending > len(buf):
            self._start_big(pending)
        elif pending > len(buf) - pos or pos > len(buf) // 2:
            buf[:remaining] = buf[pos:end]
            self._start, self._end = 0, remaining
        return frames

    def _bad_length(self, body_len: int) -> FrameError:
        if body_len < _MIN_BODY:
            return FrameError(f"frame length {body_len} is shorter than a header")
        return FrameError(
            f"peer announced a frame of {LENGTH_PREFIX + body_len} bytes, over the limit of "
            f"{self._limit}"
        )

    def _start_big(self, total: int) -> None:
        have = self._end - self._start
        big = bytearray(total)
        big[:have] = self._buf[self._start : self._end]
        self._big = big
        self._big_filled = have
        self._start = self._end = 0
