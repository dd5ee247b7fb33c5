"""Another local user at a regency listener: online guesses of the secret, or a churning flood.

Run by the security tests as a second uid with the system's Python (``/usr/bin/python3 -I``),
so it uses the standard library only; its one argument is a JSON object, and it prints one JSON
object with what it saw.

``{"mode": "guess", ...}``: ``count`` wrong proofs, ``parallel`` at a time, each on a fresh
connection from the next of ``sources`` (``[""]``: whatever address the kernel picks), each
waiting ``wait`` seconds for the verdict. Prints how many were ``refused`` (the listener's
refusal), ``hung up`` (closed without a word), ``held`` (no answer within ``wait``), ``closed``
(closed before the greeting), ``answered`` (anything else) and the seconds it took.

``{"mode": "flood", ...}``: for ``seconds``, ``parallel`` threads open connections that never
authenticate (the route preamble, if any, then nothing), keeping at most ``keep`` open in all by
closing their oldest; at most ``limit`` in all. Prints how many it opened.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
import threading
import time


def _connect(spec: dict, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in spec["host"] else socket.AF_INET)
    sock.settimeout(spec.get("wait", 5.0))
    if source:
        sock.bind((source, 0))
    sock.connect((spec["host"], spec["port"]))
    sock.sendall(bytes.fromhex(spec.get("preamble", "")))
    return sock


def _guess(spec: dict, source: str) -> str:
    try:
        sock = _connect(spec, source)
    except OSError:
        return "closed"
    with sock:
        hello = b""
        try:
            while len(hello) < spec["hello_len"]:
                chunk = sock.recv(spec["hello_len"] - len(hello))
                if not chunk:
                    return "closed"
                hello += chunk
            sock.sendall(os.urandom(64) + b"\0\0" + os.urandom(32))
            answer = sock.recv(32)
        except TimeoutError:
            return "held"
        except OSError:
            return "hung up"
    if not answer:
        return "hung up"
    return "refused" if answer == bytes.fromhex(spec["refused"]) else "answered"


def guess(spec: dict) -> dict:
    sources = spec.get("sources") or [""]
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    todo = iter(range(spec["count"]))

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            outcome = _guess(spec, sources[i % len(sources)])
            with lock:
                counts[outcome] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(spec.get("parallel", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**counts, "seconds": time.monotonic() - started}


def flood(spec: dict) -> dict:
    opened = collections.Counter[str]()
    lock = threading.Lock()
    stop = time.monotonic() + spec["seconds"]
    parallel = spec.get("parallel", 1)

    def work() -> None:
        open_socks: collections.deque[socket.socket] = collections.deque()
        while time.monotonic() < stop:
            with lock:
                if opened["n"] >= spec["limit"]:
                    break
                opened["n"] += 1
            try:
                open_socks.append(_connect(spec, spec.get("source", "")))
            except OSError:
                time.sleep(0.01)
            while len(open_socks) > spec["keep"] // parallel:
                open_socks.popleft().close()
            time.sleep(spec.get("pause", 0.0))
        for sock in open_socks:
            sock.close()

    threads = [threading.Thread(target=work) for _ in range(parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"opened": opened["n"]}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps(guess(spec) if spec["mode"] == "guess" else flood(spec)), flush=True)
