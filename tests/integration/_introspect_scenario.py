"""The controller the dashboard and TUI tests look at: a failed actor and a restarted one.

``build`` makes proc mesh ``workers`` (2 procs) with actor mesh ``steady``, whose rank 1 fails
in its endpoint, and proc mesh ``standby`` (1 proc) with actor mesh ``restarted``, whose proc is
SIGKILLed and restarted once by its restart policy. The failure text holds HTML, which a page
must show as text. Run as a script, it builds the same in a controller of its own, starts the
admin API, prints ``ready PID`` and waits for a line on stdin.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import regency.actor
from regency.actor import Actor, ProcMesh, RestartPolicy, endpoint, this_host

FAILURE = "worker exploded on purpose <img src=x onerror=alert(1)>"


class Worker(Actor):
    """Answers its pid; ``explode`` raises without a reply path, which fails the actor."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def explode(self) -> None:
        raise RuntimeError(FAILURE)


def build(make_procs: Callable[..., ProcMesh]) -> dict[str, Any]:
    """Spawn the meshes; return them by name."""
    workers = make_procs(2, name="workers")
    steady = workers.spawn("steady", Worker)
    for _ in range(3):
        steady.pid.call().get(timeout=60)
    steady.slice(gpus=1).explode.broadcast()
    standby = make_procs(1, name="standby")
    restarted = standby.spawn(
        "restarted", Worker, restart=RestartPolicy(strategy="one_for_one", max_restarts=3)
    )
    os.kill(restarted.slice(gpus=0).pid.call_one().get(timeout=60), signal.SIGKILL)
    restarted.restarted(1).get(timeout=60)
    return {"workers": workers, "standby": standby, "steady": steady, "restarted": restarted}


def _main() -> None:
    from regency.observe import start_admin

    failures: list[Any] = []
    regency.actor.unhandled_fault_hook = failures.append  # the failed actor is expected
    meshes = build(lambda n, **kw: this_host().spawn_procs(per_host={"gpus": n}, **kw))
    admin = start_admin()
    print("ready", os.getpid(), flush=True)
    sys.stdin.readline()
    admin.stop()
    for name in ("workers", "standby"):
        meshes[name].stop().get(timeout=30)


if __name__ == "__main__":
    _main()
