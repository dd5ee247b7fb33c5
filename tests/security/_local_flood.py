"""Floods a loopback port as another local user: idle connections, drips, wrong proofs.

:func:`start_flood` runs :data:`_SCRIPT` with the attacker's uid; it prints ``flooding`` once all
its connections are open (or refused), then, when its time is up, one JSON line saying what it
saw: ``opened``, ``refused`` (connect failed), ``cut`` (the server closed them) and
``longest_drip`` (how long the longest dripping connection stayed open, seconds; the drips are
the last connections opened, as a closure is seen only once all are open).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from _attacker import Attacker

_SCRIPT = r"""
import json, resource, select, socket, sys, time
host, port, count, drips, drip_every, hold = sys.argv[1:7]
port, count, drips, hold = int(port), int(count), int(drips), float(hold)
drip_every = float(drip_every)
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
socks, opened_at, refused = [], {}, 0
for i in range(count):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, port))
    except OSError:
        refused += 1
        s.close()
        continue
    s.setblocking(False)
    socks.append(s)
    opened_at[s] = time.monotonic()
print("flooding", flush=True)
dripping = set(socks[len(socks) - drips:])  # the newest: the last to be pushed out
closed_at = {}
start = next_drip = time.monotonic()
poll, by_fd = select.poll(), {s.fileno(): s for s in socks}
for s in socks:
    poll.register(s, select.POLLIN)
while time.monotonic() - start < hold:
    for fd, _ in poll.poll(200):
        s = by_fd[fd]
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if not data:
            closed_at[s] = time.monotonic()
            poll.unregister(s)
    if time.monotonic() >= next_drip:
        next_drip += drip_every
        for s in dripping:
            if s not in closed_at:
                try:
                    s.send(b"G")
                except OSError:
                    closed_at[s] = time.monotonic()
lives = [closed_at.get(s, time.monotonic()) - opened_at[s] for s in dripping]
print(json.dumps({"opened": len(socks), "refused": refused, "cut": len(closed_at),
                  "longest_drip": max(lives, default=0.0)}), flush=True)
"""

_PROOFS = r"""
import json, socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = []
for _ in range(count):
    with socket.create_connection((host, port), timeout=10) as s:
        reader = s.makefile("rb")
        first = reader.readline()
        if not first:
            seen.append("closed")
            continue
        s.sendall(json.dumps({"proof": "0" * 64}).encode() + b"\n")
        seen.append(json.loads(reader.readline() or b'{"error": "closed"}').get("error", "?"))
print(json.dumps(seen), flush=True)
"""


def _python() -> str:
    """A Python the attacker may run (the tests' own may live under root's home)."""
    found = shutil.which("python3", path="/usr/bin:/bin")
    if found is None:
        pytest.skip("no /usr/bin/python3 for the second local user to run")
    return found


class Flood:
    """A running flood; :meth:`result` waits for its report."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "flooding", f"the flood did not start: {line!r}"

    def running_after(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the attacker to finish; whether it still runs."""
        try:
            self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return True
        return False

    def result(self, timeout: float) -> dict[str, Any]:
        """The attacker's report, once its time is up."""
        out, err = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, err
        report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return report

    def kill(self) -> None:
        """End the attacker's process if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate(timeout=10)


def start_flood(
    attacker: Attacker,
    port: int,
    count: int,
    drips: int = 0,
    drip_every: float = 1.0,
    hold: float = 10.0,
) -> Flood:
    """Open ``count`` connections to ``127.0.0.1:port`` as ``attacker`` and keep them ``hold``
    seconds; the first ``drips`` send one byte every ``drip_every`` seconds."""
    argv = ["127.0.0.1", port, count, drips, drip_every, hold]
    process = subprocess.Popen(
        [_python(), "-I", "-c", _SCRIPT, *map(str, argv)],
        user=attacker.name,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        return Flood(process)
    except BaseException:
        process.kill()
        process.communicate(timeout=10)
        raise


def wrong_proofs(attacker: Attacker, port: int, count: int) -> list[str]:
    """Answer the debugger's challenge wrongly ``count`` times as ``attacker``; what it said."""
    done = subprocess.run(
        [_python(), "-I", "-c", _PROOFS, "127.0.0.1", str(port), str(count)],
        user=attacker.name,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: list[str] = json.loads(done.stdout)
    return seen
