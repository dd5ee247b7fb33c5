"""``attach_to_workers``: the controller's side of serving worker daemons as a host mesh."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Sequence

from regency import config
from regency._runtime import controller, state, wire
from regency._runtime.meshes import HostInfo, HostMesh, WorkerLease
from regency._runtime.pending import Pending
from regency._runtime.proc import Part, PortRef
from regency._runtime.worker import Attach
from regency._transport import address
from regency._transport.auth import wrap_secret
from regency._transport.transport import PeerUnreachableError
from regency.shape import Extent, Shape

SECRET_ENV = "REGENCY_JOB_SECRET"


class AttachError(ConnectionError):
    """A worker could not be attached: unreachable, wrong secret, or serving another controller."""


def secret_from_env() -> bytes:
    """The job secret from ``REGENCY_JOB_SECRET`` (hex); ``ValueError`` when unset or malformed."""
    value = os.environ.get(SECRET_ENV)
    if not value:
        raise ValueError(f"no job secret: {SECRET_ENV} is not set")
    try:
        return bytes.fromhex(value.strip())
    except ValueError:
        raise ValueError(f"{SECRET_ENV} must be a hex string") from None


class _AttachReply:
    """Port handler for one worker's answer to :class:`Attach`."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.pending = Pending()
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        answer = pickle.loads(parts[0])
        state.runtime().close_port(self.port, [self.worker])
        error = answer.get("error")
        if error is not None:
            self.pending.set_exception(AttachError(f"cannot attach worker {self.worker}: {error}"))
        else:
            self.pending.set_result(answer)

    def peer_lost(self, addr: str, reason: str) -> None:
        state.runtime().close_port(self.port)
        self.pending.set_exception(AttachError(f"cannot attach worker {self.worker}: {reason}"))


def _request_attach(worker: str, secret: bytes, timeout: float) -> _AttachReply:
    rt = state.runtime()
    handler = _AttachReply(worker)
    ref: PortRef = rt.open_port(handler)
    handler.port = ref.port
    rt.transport.prepare_peer(worker, secret, timeout)
    request = Attach(
        rt.address,
        rt.job_id,
        worker,
        controller.gateway_toward(worker),
        wrap_secret(secret, rt.secret),
        config.get_global_config(),
        ref,
    )
    try:
        rt.send_control(worker, wire.SERVICE_HOST, request, wait=False)
    except PeerUnreachableError as exc:
        handler.peer_lost(worker, str(exc))
        return handler
    rt.watch(ref.port, [worker])
    return handler


def attach_to_workers(
    workers: Sequence[str],
    *,
    secret: bytes | None = None,
    name: str | None = None,
    timeout: float = 30.0,
) -> HostMesh:
    """Attach this controller to running worker daemons, as a ``HostMesh`` over dim ``hosts``.

    The workers are ranked in the order given. ``secret`` is the job secret the workers hold
    (default: ``REGENCY_JOB_SECRET``, hex). Raises :class:`AttachError` naming each worker that
    did not answer within ``timeout`` seconds, refused this controller's proof of the secret,
    or serves another controller.
    """
    addresses = list(workers)
    what = f"host mesh {name!r}" if name else "host mesh"
    if not addresses:
        raise ValueError(f"attach_to_workers: {what} needs at least one worker address")
    for worker in addresses:
        if not address.is_tcp(worker) or address.route_key(worker):
            raise ValueError(f"worker address {worker!r} is not tcp://HOST:PORT")
    key = secret if secret is not None else secret_from_env()
    deadline = time.monotonic() + timeout
    replies = [_request_attach(worker, key, timeout) for worker in addresses]
    errors = []
    for reply in replies:
        if not reply.pending.wait(max(0.0, deadline - time.monotonic())):
            errors.append(f"cannot attach worker {reply.worker}: no answer within {timeout:g} s")
            continue
        error = reply.pending.error()
        if error is not None:
            errors.append(str(error))
    if errors:
        raise AttachError(f"attaching {what} failed:\n" + "\n".join(errors))
    shape = Shape.from_extent(Extent(["hosts"], [len(addresses)]))
    hosts = [HostInfo(worker) for worker in addresses]
    return HostMesh(shape, hosts, owned=True, lease=WorkerLease())
