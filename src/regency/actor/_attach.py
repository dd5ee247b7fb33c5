"""``attach_to_workers``: the controller's side of serving worker daemons as a host mesh."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from regency import config
from regency._errors import RegencyError
from regency._lowlevel import (
    SERVICE_HOST,
    Attach,
    HostInfo,
    Part,
    PeerLostError,
    Pending,
    PortRef,
    WorkerLease,
    gateway_toward,
    runtime,
)
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.meshes.meshes import HostMesh
from regency._transport import address, tls
from regency._transport.auth import SECRET_ENV, check_secret, wrap_secret
from regency.shape import Extent, Shape

TRUST_ALL = "trust_all_connections"
PrivateKey = bytes | str | Path | None
CA = bytes | str | Path | Literal["trust_all_connections"]
KEY_ENV = tls.KEY_ENV


class AttachError(RegencyError, ConnectionError):
    """A worker could not be attached: unreachable, wrong secret, or serving another controller."""


def secret_from_env() -> bytes:
    """The job secret from ``REGENCY_JOB_SECRET`` (hex).

    Raises ``ValueError`` when it is unset, malformed or shorter than 16 bytes.
    """
    value = os.environ.get(SECRET_ENV)
    if value is None:
        raise ValueError(f"no job secret: {SECRET_ENV} is not set")
    try:
        secret = bytes.fromhex(value.strip())
    except ValueError:
        raise ValueError(f"{SECRET_ENV} must be a hex string") from None
    return check_secret(secret, SECRET_ENV)


class _AttachReply:
    """Port handler for one worker's answer to :class:`Attach`."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.pending = Pending()
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        answer = pickle.loads(parts[0])
        runtime().close_port(self.port, [self.worker])
        error = answer.get("error")
        if error is not None:
            self.pending.set_exception(AttachError(f"cannot attach worker {self.worker}: {error}"))
        else:
            self.pending.set_result(answer)

    def peer_lost(self, addr: str, reason: str) -> None:
        runtime().close_port(self.port)
        self.pending.set_exception(AttachError(f"cannot attach worker {self.worker}: {reason}"))


def _request_attach(worker: str, secret: bytes, timeout: float, via: str | None) -> _AttachReply:
    rt = runtime()
    handler = _AttachReply(worker)
    ref: PortRef = rt.open_port(handler)
    handler.port = ref.port
    rt.expect_new_process(worker)
    rt.transport.prepare_peer(worker, secret, timeout)
    if via is not None:
        # This process and the procs it starts on this machine reach the worker (and every proc
        # behind its port) through the forward; the worker's side cannot dial back, so it is
        # told to ask for reverse connections instead of using a gateway.
        rt.transport.paths.via[worker] = via
    request = Attach(
        rt.address,
        rt.job_id,
        worker,
        gateway_toward(worker) if address.is_tcp(worker) and via is None else None,
        wrap_secret(secret, rt.secret),
        config.get_global_config(),
        ref,
        reverse=via is not None,
    )
    try:
        rt.send_control(worker, SERVICE_HOST, request, wait=False)
    except PeerLostError as exc:
        handler.peer_lost(worker, str(exc))
        return handler
    rt.losses.watch(ref.port, [worker])
    return handler


def _check_security(ca: CA | None, private_key: PrivateKey) -> None:
    """Apply Monarch's ``ca``/``private_key`` to this process's TLS.

    ``None`` or ``"trust_all_connections"`` keeps regency's default: mutual TLS with the
    per-job certificates derived from the job secret (or those ``REGENCY_TLS_{CA,CERT,KEY}``
    name). A CA certificate (PEM bytes, or a path) with ``private_key`` (PEM bytes or a path;
    the key, followed by its certificate unless ``REGENCY_TLS_CERT`` names it) makes every
    TCP connection of this process present that certificate and trust only that CA.
    """
    if ca is None or ca == TRUST_ALL:
        if private_key is not None:
            raise ValueError(
                "private_key= needs ca= (the CA certificate that signed its certificate)"
            )
        return
    key: PrivateKey | str = private_key if private_key is not None else os.environ.get(KEY_ENV)
    if not key:
        raise ValueError(f"ca= needs private_key= (or {KEY_ENV}): the key to present")
    tls.set_user_identity(tls.identity_from(ca, key, None))


def _job_secret(secret: bytes | None, ca: CA | None) -> bytes:
    if secret is not None:
        return check_secret(secret, "attach_to_workers(secret=)")
    try:
        return secret_from_env()
    except ValueError as exc:
        if ca != TRUST_ALL:
            raise
        raise ValueError(
            f"{exc}: regency authenticates every connection with a job secret, and "
            f"ca={TRUST_ALL!r} does not turn that off; give the workers and this controller "
            f"the same {SECRET_ENV} (hex), or pass secret="
        ) from None


def dial_address(worker: str) -> str:
    """The ``tcp://HOST:PORT`` to dial for a worker written as Monarch writes them.

    Accepts a ProcAddr (``service<ID>@tcp://host:port``, the proc id is dropped) and the serving
    alias ``dial@bind`` (``dial`` is used).
    """
    head, sep, rest = worker.partition("@")
    if sep and "://" not in head:
        worker, head, sep, rest = rest, *rest.partition("@")
    dial = head if sep and "://" in rest else worker
    return ipc_to_unix(dial)


def ipc_to_unix(given: str) -> str:
    """Monarch's ``ipc://PATH`` (a unix socket, ``ipc://@NAME`` abstract) as ``unix:PATH``."""
    return "unix:" + given[len("ipc://") :] if given.startswith("ipc://") else given


def _forwards(addresses: Sequence[str], forwarded: Mapping[str, str] | None) -> dict[str, str]:
    """``forwarded`` checked against the workers: worker address -> local ``tcp://`` address."""
    found = {}
    for worker, local in (forwarded or {}).items():
        key = dial_address(worker)
        if key not in addresses or not address.is_tcp(key):
            raise ValueError(
                f"forwarded names {worker!r}, which is not one of the tcp:// workers {addresses}"
            )
        if not isinstance(local, str) or not address.is_tcp(local) or address.route_key(local):
            raise ValueError(
                f"forwarded[{worker!r}] must be the tcp://HOST:PORT that forwards to it, "
                f"not {local!r}"
            )
        found[key] = local
    return found


def _resolve(worker: str | Future[str], deadline: float) -> str:
    if isinstance(worker, Future):
        resolved = worker.get(timeout=max(0.0, deadline - time.monotonic()))
        if not isinstance(resolved, str):
            raise TypeError(f"a worker future must resolve to an address string, got {resolved!r}")
        return resolved
    return worker


def attach_to_workers(
    workers: Sequence[str | Future[str]] | None = None,
    *,
    ca: CA | None = None,
    private_key: PrivateKey = None,
    secret: bytes | None = None,
    name: str | None = None,
    timeout: float = 30.0,
    forwarded: Mapping[str, str] | None = None,
) -> HostMesh:
    """Attach this controller to running worker daemons, as a ``HostMesh`` over dim ``hosts``.

    Monarch's form works unchanged: ``attach_to_workers(workers=[...],
    ca="trust_all_connections")``. ``workers`` are ``tcp://HOST:PORT`` addresses (or Monarch's
    ``service<ID>@tcp://...`` and ``dial@bind`` forms), or futures that resolve to one; they are
    ranked in the order given. Every connection is authenticated with the job secret the
    workers hold, ``secret`` (default: ``REGENCY_JOB_SECRET``, hex; at least 16 bytes, or
    ``ValueError``), inside mutual TLS 1.3:
    with ``ca=None`` or ``"trust_all_connections"`` the certificates are the job's own,
    derived from the secret (nothing to set up); a CA certificate (PEM bytes or a path) and
    ``private_key`` (PEM bytes or a path: the key and its certificate) use those instead, as
    ``REGENCY_TLS_{CA,CERT,KEY}`` do. The workers must trust the same CA.

    ``forwarded`` maps a worker's address to the local ``tcp://HOST:PORT`` of a port forward to
    it (what ``kubectl port-forward`` opens): a controller outside a cluster reaches that worker,
    and every proc on it, only through the forward, and nothing on that worker's side needs to
    dial back: the controller opens the connections they would (reverse connections, with TLS
    and the secret handshake end to end). The worker keeps its own address in the mesh, so procs
    in the cluster reach each other directly. Only this process and the procs it starts on its
    own machine afterwards use the forward.

    Unlike Monarch, it returns once every worker answered. Raises :class:`AttachError` naming
    each worker that did not answer within ``timeout`` seconds, refused this controller's proof
    of the secret, or serves another controller.
    """
    _check_security(ca, private_key)
    what = f"host mesh {name!r}" if name else "host mesh"
    if not workers:
        raise ValueError(f"attach_to_workers: {what} needs at least one worker address")
    key = _job_secret(secret, ca)
    deadline = time.monotonic() + timeout
    addresses = [dial_address(_resolve(worker, deadline)) for worker in workers]
    for worker in addresses:
        if worker.startswith("unix:"):
            continue
        if not address.is_tcp(worker) or address.route_key(worker):
            raise ValueError(f"worker address {worker!r} is not tcp://HOST:PORT or ipc://PATH")
    forwards = _forwards(addresses, forwarded)
    replies = [_request_attach(worker, key, timeout, forwards.get(worker)) for worker in addresses]
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
    mesh = HostMesh(shape, hosts, owned=True, lease=WorkerLease())
    mesh.record(name or "hosts")
    return mesh
