"""The worker daemon :func:`regency.spmd.host_mesh_from_store` starts on each host.

Run as ``python -m regency.spmd._store_worker ADDRESS``, with the job secret in
``REGENCY_JOB_SECRET`` and its standard input the read end of a pipe whose write end only the
process that started it holds. It serves this machine as a host at ``ADDRESS``; once its
starter is gone (however it ended: the kernel closes the pipe, and the read sees end of file),
it ends itself and every proc it started (its process group, as it leads its own session).
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def _end_with_starter() -> None:
    """Block until the starter's end of standard input closes, then end this process group."""
    while True:
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str]) -> None:
    """Serve at ``argv[0]`` until the process that started this one ends."""
    from regency.actor._worker import run_worker_loop_forever

    if len(argv) != 1:
        sys.exit("usage: python -m regency.spmd._store_worker ADDRESS")
    threading.Thread(target=_end_with_starter, name="starter-watch", daemon=True).start()
    run_worker_loop_forever(address=argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
