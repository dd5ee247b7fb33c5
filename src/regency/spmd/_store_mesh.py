"""``host_mesh_from_store``: a host mesh out of a torchrun job, met through its store.

Monarch's ``monarch._src.spmd.host_mesh.host_mesh_from_store``. Every rank calls it. Each
host's local rank 0 starts a worker daemon (:mod:`regency.spmd._store_worker`), waits until it
listens and publishes its address in the store; global rank 0 reads every address and
attaches to the workers as a ``HostMesh``.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
from typing import IO, Protocol

from regency._lowlevel import share_secret
from regency._transport.auth import SECRET_ENV
from regency.actor import HostMesh
from regency.actor._attach import attach_to_workers, secret_from_env

log = logging.getLogger(__name__)

_LISTENING = "regency worker listening on "
_TRANSPORTS = ("ipc", "tcp", "metatls", "metatls-hostname")
_SECRET_KEY = "regency/spmd/secret"


class StoreLike(Protocol):
    """What :func:`host_mesh_from_store` uses of a ``torch.distributed.Store``."""

    def set(self, key: str, value: str | bytes) -> None:
        """Publish ``value`` under ``key`` to every rank."""

    def get(self, key: str) -> bytes:
        """The value under ``key``, waiting (up to the store's timeout) until it is set."""


def _topology(value: int | None, env_name: str) -> int:
    """A torchelastic topology value: the argument given, else the environment's."""
    if value is not None:
        return value
    found = os.environ.get(env_name)
    if found is None:
        raise RuntimeError(
            f"host_mesh_from_store needs the {env_name} environment variable (torchrun sets "
            "RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE) or the matching argument"
        )
    try:
        return int(found)
    except ValueError:
        raise ValueError(f"{env_name} must be an integer, not {found!r}") from None


def _worker_key(name: str, group_rank: int) -> str:
    return f"regency/spmd/{name}/workers/{group_rank}"


def _listen_address(transport: str, port: int, name: str) -> str:
    if transport == "ipc":
        return "ipc://" + os.path.join(tempfile.mkdtemp(prefix="regency-worker-"), name)
    return f"tcp://*:{port}"


def _job_secret(store: StoreLike, secret: bytes | None, rank: int) -> bytes:
    """The secret the workers and the controller share.

    ``secret``, else ``REGENCY_JOB_SECRET``, else one global rank 0 makes and publishes.
    """
    if secret is not None:
        return secret
    if os.environ.get(SECRET_ENV):
        return secret_from_env()
    if rank == 0:
        made = secrets.token_bytes(32)
        store.set(_SECRET_KEY, made.hex())
        return made
    return bytes.fromhex(store.get(_SECRET_KEY).decode())


def _drain(stream: IO[bytes], name: str, child: subprocess.Popen[bytes]) -> None:
    """Read the worker's remaining output and reap it, logging how it ended."""
    for line in stream:
        log.debug("worker %s: %s", name, line.decode(errors="replace").rstrip())
    code = child.wait()
    log.log(
        logging.INFO if code == 0 else logging.WARNING,
        "worker %s (pid %d) exited with code %d",
        name,
        child.pid,
        code,
    )


def _start_worker(address: str, name: str, secret: bytes, timeout: float) -> str:
    """Start a worker daemon listening at ``address``; return the address it serves.

    One that does not listen within ``timeout`` seconds is killed.
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        SECRET_ENV: secret.hex(),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "regency.spmd._store_worker", address],
        env=env,
        stdin=subprocess.PIPE,  # never written: it closes when this process ends, however
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert child.stdout is not None
    deadline = threading.Timer(timeout, child.kill)
    deadline.start()
    seen: list[str] = []
    for raw in child.stdout:
        line = raw.decode(errors="replace").rstrip()
        if line.startswith(_LISTENING):
            deadline.cancel()
            served = line[len(_LISTENING) :].strip()
            # The thread holds the worker's handle, and so its standard input, for as long as
            # this process lives.
            threading.Thread(
                target=_drain, args=(child.stdout, name, child), name=f"worker-{name}", daemon=True
            ).start()
            log.info("worker %s (pid %d) serves %s", name, child.pid, served)
            return served
        seen.append(line)
    code = child.wait()
    deadline.cancel()
    output = "\n".join(seen[-20:])
    raise RuntimeError(
        f"host_mesh_from_store: worker {name} ended (exit code {code}) without listening on "
        f"{address} within {timeout:g} s; its output:\n{output}"
    )


def host_mesh_from_store(
    store: StoreLike,
    *,
    monarch_port: int = 0,
    name: str = "monarch_worker",
    transport: str = "ipc",
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    local_world_size: int | None = None,
    secret: bytes | None = None,
    timeout: float = 30.0,
) -> HostMesh | None:
    """Build a host mesh from a torchrun-style job: one host per node, met through ``store``.

    Call it on every rank (it is collective). Each node's local rank 0 starts a worker daemon
    there (it ends with that rank's process, taking its procs with it) and publishes the
    worker's address in ``store``, a ``torch.distributed.Store`` (or anything with ``set(key,
    value)`` and a waiting ``get(key) -> bytes``). Global rank 0 attaches to every worker and
    returns the :class:`~regency.actor.HostMesh` (dimension ``hosts``, ranked by node); the
    other ranks return ``None``.

    The topology comes from ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``
    unless given as arguments; ``WORLD_SIZE`` must be a multiple of ``LOCAL_WORLD_SIZE``.
    ``transport`` is ``"ipc"`` (a unix socket: one node only; the default) or ``"tcp"`` (mutual
    TLS on every interface, port ``monarch_port``; 0 picks a free one); ``"metatls"`` and
    ``"metatls-hostname"`` mean ``"tcp"``, as regency's TCP is always TLS. ``name`` names the
    mesh; the worker of node ``g`` is ``f"{name}_{g}"``.

    Regency's additions: the job ``secret`` every connection proves (default:
    ``REGENCY_JOB_SECRET``, hex; without one, global rank 0 makes one and publishes it in the
    store, which then must be reachable only by the job, as torch.distributed already assumes),
    which also becomes the secret of this process's own controller on every rank, so that every
    rank can call the actors global rank 0 spawns (as torchstore's clients do: call it before
    anything else of regency runs in the process, or ``RuntimeError``),
    and ``timeout``, the seconds a worker has to listen (else ``RuntimeError`` with its output)
    and global rank 0 waits for the workers to answer (``regency.job.AttachError`` names those
    that did not).
    """
    if transport not in _TRANSPORTS:
        raise ValueError(f"unsupported transport {transport!r}; expected one of {_TRANSPORTS}")
    if not 0 <= monarch_port < 65536:
        raise ValueError(f"monarch_port must be a TCP port (0 to 65535), not {monarch_port!r}")
    the_rank = _topology(rank, "RANK")
    the_local_rank = _topology(local_rank, "LOCAL_RANK")
    the_world_size = _topology(world_size, "WORLD_SIZE")
    the_local_world_size = _topology(local_world_size, "LOCAL_WORLD_SIZE")
    if the_local_world_size <= 0 or the_world_size % the_local_world_size != 0:
        raise ValueError(
            f"WORLD_SIZE ({the_world_size}) must be a multiple of LOCAL_WORLD_SIZE "
            f"({the_local_world_size})"
        )
    if not 0 <= the_rank < the_world_size or not 0 <= the_local_rank < the_local_world_size:
        raise ValueError(
            f"RANK ({the_rank}) and LOCAL_RANK ({the_local_rank}) must lie within WORLD_SIZE "
            f"({the_world_size}) and LOCAL_WORLD_SIZE ({the_local_world_size})"
        )
    hosts = the_world_size // the_local_world_size
    group_rank = the_rank // the_local_world_size
    key = _job_secret(store, secret, the_rank)
    share_secret(key)
    if the_local_rank == 0:
        worker = f"{name}_{group_rank}"
        served = _start_worker(
            _listen_address(transport, monarch_port, worker), worker, key, timeout
        )
        store.set(_worker_key(name, group_rank), served)
    if the_rank != 0:
        return None
    workers = [store.get(_worker_key(name, g)).decode() for g in range(hosts)]
    return attach_to_workers(workers, secret=key, name=name, timeout=timeout)
