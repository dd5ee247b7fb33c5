"""What pure Python allows on this machine: the actor figures with no runtime at all.

Issue 17 asks for the control path "close to what the machine allows". This measures that
floor with the same three shapes as ``figures.py`` (a ``call_one`` round trip, 10k pipelined
calls to one actor, 10k fire-and-forget broadcasts to 4 actors then one call), by the least a
Python remote call can do: the controller pickles ``(call id, method, args)`` into a
length-prefixed frame and writes it to a Unix socket; each actor (``bench_actor``'s behaviour,
as in the other benchmarks) is a forked process whose one thread reads whatever bytes are
there, cuts them into frames, unpickles each, runs the method and pickles its reply into a
frame, writing a read's replies in one ``sendall``. There is no ordering beyond the socket's,
no supervision, no mailbox, no futures beyond a slot per call, no tracing, no security. Three
variants:

* ``threads`` (the shape of regency: blocking sockets, the caller's thread sends, a reader
  thread takes the replies, the caller waits on a condition only when its reply is not in yet);
* ``batched`` (``threads``, but the controller writes up to 64 frames in one ``sendall``, and
  what it holds before it waits: the least a runtime that coalesces its sends pays);
* ``asyncio`` (one event loop per side, uvloop where installed: the echo the issue quotes).

Except in ``batched``, pipelined calls are sent one frame per ``send`` (the runtime does not
know another call is coming); replies to one read go out together. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from bench_actor import BenchBehavior

HEADER = struct.Struct("<I")
R = TypeVar("R")


def frame(obj: object) -> bytes:
    """One length-prefixed pickle."""
    body = pickle.dumps(obj, protocol=5)
    return HEADER.pack(len(body)) + body


def cut(buffer: bytearray) -> list[Any]:
    """Unpickle every whole frame at the front of ``buffer`` and remove them."""
    out = []
    at = 0
    size = len(buffer)
    view = memoryview(buffer)
    while size - at >= 4:
        (length,) = HEADER.unpack_from(buffer, at)
        if size - at - 4 < length:
            break
        out.append(pickle.loads(view[at + 4 : at + 4 + length]))
        at += 4 + length
    view.release()
    del buffer[:at]
    return out


def run_calls(actor: BenchBehavior, buffer: bytearray) -> bytes:
    """Run every whole call at the front of ``buffer``; the frames of their replies."""
    replies = []
    for call_id, method, args in cut(buffer):
        result = getattr(actor, method)(*args)
        if call_id is not None:
            replies.append(frame((call_id, result)))
    return b"".join(replies)


def serve_threads(sock: socket.socket) -> None:
    """The actor process: read, run, reply, one thread."""
    actor = BenchBehavior()
    buffer = bytearray()
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return
        buffer += data
        replies = run_calls(actor, buffer)
        if replies:
            sock.sendall(replies)


class ThreadClient:
    """The controller's side of the ``threads`` variant for one actor."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.results: dict[int, Any] = {}
        self.next_id = 0
        self.ready = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        buffer = bytearray()
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return
            buffer += data
            replies = cut(buffer)
            with self.ready:
                for call_id, result in replies:
                    self.results[call_id] = result
                self.ready.notify_all()

    def call(self, method: str, *args: Any) -> int:
        """Send one call; return its id."""
        call_id = self.next_id
        self.next_id += 1
        self.sock.sendall(frame((call_id, method, args)))
        return call_id

    def cast(self, method: str) -> None:
        """Send one call that wants no reply."""
        self.sock.sendall(frame((None, method, ())))

    def get(self, call_id: int) -> Any:
        """Wait for one reply."""
        results = self.results
        if call_id in results:
            return results.pop(call_id)
        with self.ready:
            while call_id not in results:
                self.ready.wait()
            return results.pop(call_id)


def fork_actors(
    serve: Callable[[socket.socket], None], count: int
) -> list[tuple[socket.socket, int]]:
    """Fork ``count`` actor processes, each serving one end of its own socket pair."""
    pairs: list[tuple[socket.socket, int]] = []
    for _ in range(count):
        pairs.append(fork_actor(serve, [sock for sock, _ in pairs]))
    return pairs


def fork_actor(
    serve: Callable[[socket.socket], None], inherited: list[socket.socket]
) -> tuple[socket.socket, int]:
    """Fork one actor process serving one end of a socket pair; the child closes the
    controller's ends of the earlier pairs, so that closing one reaches its actor as EOF."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        for sock in inherited:
            sock.close()
        try:
            serve(theirs)
        finally:
            os._exit(0)
    theirs.close()
    return ours, pid


class BatchingClient(ThreadClient):
    """:class:`ThreadClient` that writes up to :data:`BATCH` frames in one ``sendall``, and
    what it holds before it waits: the least a runtime that coalesces its sends pays."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.out: list[bytes] = []

    def call(self, method: str, *args: Any) -> int:
        """Queue one call; return its id."""
        call_id = self.next_id
        self.next_id += 1
        self._queue(frame((call_id, method, args)))
        return call_id

    def cast(self, method: str) -> None:
        """Queue one call that wants no reply."""
        self._queue(frame((None, method, ())))

    def _queue(self, data: bytes) -> None:
        self.out.append(data)
        if len(self.out) >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Write what is queued."""
        if self.out:
            self.sock.sendall(b"".join(self.out))
            self.out = []

    def get(self, call_id: int) -> Any:
        """Write what is queued, then wait for one reply."""
        self.flush()
        return super().get(call_id)


BATCH = 64


def figures_threads(round_trips: int, pipelined: int, broadcasts: int) -> dict[str, float]:
    """The three figures, ``threads`` variant."""
    return figures_with(ThreadClient, round_trips, pipelined, broadcasts)


def figures_batched(round_trips: int, pipelined: int, broadcasts: int) -> dict[str, float]:
    """The three figures, ``batched`` variant."""
    return figures_with(BatchingClient, round_trips, pipelined, broadcasts)


def figures_with(
    client: type[ThreadClient], round_trips: int, pipelined: int, broadcasts: int
) -> dict[str, float]:
    """The three figures with controller sides of class ``client``, actors in threads."""
    pairs = fork_actors(serve_threads, 4)
    clients = [client(sock) for sock, _ in pairs]
    one = clients[0]
    for _ in range(500):
        one.get(one.call("ping"))
    samples = []
    for _ in range(round_trips):
        start = time.perf_counter()
        one.get(one.call("ping"))
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    ids = [one.call("ping") for _ in range(pipelined)]
    for call_id in ids:
        one.get(call_id)
    pipelined_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(broadcasts):
        for client in clients:
            client.cast("incr")
    totals = [client.get(client.call("total")) for client in clients]
    broadcast_seconds = time.perf_counter() - start
    if totals != [broadcasts] * 4:
        raise AssertionError(f"broadcasts lost: {totals}")
    for sock, pid in pairs:
        sock.shutdown(socket.SHUT_RDWR)  # close() alone does not end the reader's recv
        sock.close()
        os.waitpid(pid, 0)
    return summarize(samples, pipelined / pipelined_seconds, broadcasts / broadcast_seconds)


def serve_asyncio(sock: socket.socket) -> None:
    """The actor process of the ``asyncio`` variant."""

    async def run() -> None:
        actor = BenchBehavior()
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        buffer = bytearray()
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            buffer += data
            replies = run_calls(actor, buffer)
            if replies:
                writer.write(replies)
                await writer.drain()

    run_loop(run())


def run_loop(main: Coroutine[Any, Any, R]) -> R:
    """Run ``main`` on uvloop's event loop where installed, else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: R = uvloop.run(main)
    return result


class AsyncClient:
    """The controller's side of the ``asyncio`` variant for one actor."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        buffer = bytearray()
        while True:
            data = await self.reader.read(1 << 16)
            if not data:
                return
            buffer += data
            for call_id, result in cut(buffer):
                self.waiting.pop(call_id).set_result(result)

    def call(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """Send one call; return the future of its reply."""
        call_id = self.next_id
        self.next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = future
        self.writer.write(frame((call_id, method, args)))
        return future

    def cast(self, method: str) -> None:
        """Send one call that wants no reply."""
        self.writer.write(frame((None, method, ())))


def figures_asyncio(round_trips: int, pipelined: int, broadcasts: int) -> dict[str, float]:
    """The three figures, ``asyncio`` variant."""
    pairs = fork_actors(serve_asyncio, 4)

    async def run() -> dict[str, float]:
        clients = []
        for sock, _ in pairs:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            clients.append(AsyncClient(reader, writer))
        one = clients[0]
        for _ in range(500):
            await one.call("ping")
        samples = []
        for _ in range(round_trips):
            start = time.perf_counter()
            await one.call("ping")
            samples.append(time.perf_counter() - start)
        start = time.perf_counter()
        await asyncio.gather(*[one.call("ping") for _ in range(pipelined)])
        pipelined_seconds = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(broadcasts):
            for client in clients:
                client.cast("incr")
        totals = await asyncio.gather(*[client.call("total") for client in clients])
        broadcast_seconds = time.perf_counter() - start
        if totals != [broadcasts] * 4:
            raise AssertionError(f"broadcasts lost: {totals}")
        for client in clients:
            client.writer.close()
        return summarize(samples, pipelined / pipelined_seconds, broadcasts / broadcast_seconds)

    try:
        return run_loop(run())
    finally:
        for sock, pid in pairs:
            sock.close()
            os.waitpid(pid, 0)


def summarize(
    samples: list[float], pipelined_rate: float, broadcast_rate: float
) -> dict[str, float]:
    """The figures under the names ``actor_bench.py`` uses."""
    ordered = sorted(samples)
    return {
        "call_one_median_us": statistics.median(samples) * 1e6,
        "call_one_p99_us": ordered[int(len(ordered) * 0.99)] * 1e6,
        "pipelined_calls_per_s": pipelined_rate,
        "broadcasts_per_s": broadcast_rate,
    }


def main() -> None:
    """Parse the command line, run each variant ``--rounds`` times, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--pipelined", type=int, default=10_000)
    parser.add_argument("--broadcasts", type=int, default=10_000)
    parser.add_argument(
        "--variant", choices=("threads", "batched", "asyncio", "all"), default="all"
    )
    args = parser.parse_args()
    variants = {
        "threads": figures_threads,
        "batched": figures_batched,
        "asyncio": figures_asyncio,
    }
    if args.variant != "all":
        variants = {args.variant: variants[args.variant]}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            rounds[name].append(run(args.round_trips, args.pipelined, args.broadcasts))
            print(name, rounds[name][-1], file=sys.stderr, flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rounds.items()
    }
    print(json.dumps({"rounds": rounds, "medians": medians, "load": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
