"""Host, proc and actor meshes: multidimensional arrays of machines, processes and actors.

A mesh object made by ``spawn_procs``/``spawn`` is *owned* by the instance that made it; slices
and copies received in messages are references that can send but not stop.
"""

from __future__ import annotations

import inspect
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import cloudpickle

from regency import config
from regency._runtime import context, state, wire
from regency._runtime.endpoint import Endpoint, current_instance
from regency._runtime.endpoint_def import Actor, ArgumentCheck, EndpointSpec, endpoints_of
from regency._runtime.errors import ActorError
from regency._runtime.future import Future
from regency._runtime.identity import new_uid
from regency._runtime.instance import SpawnActor
from regency._runtime.mesh_trait import MeshTrait
from regency._runtime.pending import Pending
from regency._runtime.proc import Part, PortRef
from regency._runtime.procs import ProcInfo, SpawnProcs, StopProcs
from regency.shape import Extent, Shape

T = TypeVar("T")

_RESERVED = frozenset(
    {
        "stop",
        "slice",
        "initialized",
        "size",
        "sizes",
        "extent",
        "flatten",
        "rename",
        "split",
        "shape",
    }
)


class _Countdown:
    """Port handler completing a pending once ``expected`` messages have arrived."""

    def __init__(self, expected: int, watch: Sequence[str], what: str) -> None:
        self.pending = Pending()
        self._left = expected
        self._errors: list[str] = []
        self._watch = list(watch)
        self._what = what
        self.port = -1
        if expected == 0:
            self.pending.set_result(None)

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        error = pickle.loads(parts[0]) if parts else None
        if error is not None:
            self._errors.append(f"rank {rank}: {error}")
        self._left -= 1
        if self._left == 0:
            self._finish()

    def _finish(self) -> None:
        rt = state.runtime()
        rt.close_port(self.port, self._watch)
        if self._errors:
            self.pending.set_exception(
                ActorError(None, f"{self._what} failed", "\n".join(self._errors))
            )
        else:
            self.pending.set_result(None)

    def peer_lost(self, addr: str, reason: str) -> None:
        self._errors.append(f"{addr}: {reason}")
        self._left = 0
        self._finish()


def _open_countdown(expected: int, watch: Sequence[str], what: str) -> tuple[_Countdown, PortRef]:
    handler = _Countdown(expected, watch, what)
    ref = state.runtime().open_port(handler, watch=watch)
    handler.port = ref.port
    return handler, ref


@dataclass(frozen=True, slots=True)
class HostInfo:
    """A host: the address of its host agent (the controller's process for ``this_host``)."""

    agent: str


class HostMesh(MeshTrait):
    """A mesh of machines; ``spawn_procs`` starts processes on each of them."""

    def __init__(self, shape: Shape, hosts: Sequence[HostInfo]) -> None:
        self._shape = shape
        self._hosts = list(hosts)

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts)

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
    ) -> ProcMesh:
        """Start ``per_host`` processes on every host; returns at once (spawning is async).

        The result's dimensions are the host dimensions followed by ``per_host``'s.
        ``bootstrap`` runs in each new process before any actor (e.g. to set environment
        variables before CUDA starts).
        """
        per_host = dict(per_host or {})
        overlap = sorted(set(per_host) & set(self._shape.labels))
        if overlap:
            raise ValueError(f"per_host dimensions {overlap} overlap the host mesh's dimensions")
        for label, size in per_host.items():
            if not isinstance(size, int) or size <= 0:
                raise ValueError(f"per_host[{label!r}] must be a positive int, got {size!r}")
        rt = state.runtime()
        mesh_name = name or "anon"
        labels = [*self._shape.labels, *per_host]
        sizes = [*self._shape.ndslice.sizes, *per_host.values()]
        shape = Shape.from_extent(Extent(labels, sizes))
        per = 1
        for size in per_host.values():
            per *= size
        procs: list[ProcInfo] = []
        by_agent: dict[str, list[ProcInfo]] = {}
        for host_base in self._shape.ranks():
            host = self._hosts[host_base]
            for local in range(per):
                token = os.urandom(6).hex()
                addr = f"unix:@regency-{rt.job_id}-{mesh_name}-{token}"
                info = ProcInfo(addr, host.agent, len(procs), local)
                procs.append(info)
                by_agent.setdefault(host.agent, []).append(info)
        payload = cloudpickle.dumps(bootstrap) if bootstrap is not None else None
        for agent, infos in by_agent.items():
            rt.send_control(
                agent,
                wire.SERVICE_HOST,
                SpawnProcs(tuple(infos), payload, mesh_name, None, config.get_global_config()),
            )
        hosts = HostMesh(self._shape, self._hosts)
        return ProcMesh(shape, procs, mesh_name, hosts, owned=True)

    def __reduce__(self) -> tuple[Any, ...]:
        return (HostMesh, (self._shape, self._hosts))

    def __repr__(self) -> str:
        return f"HostMesh({self._shape})"


class ProcMesh(MeshTrait):
    """A mesh of processes; ``spawn`` creates one actor in each."""

    def __init__(
        self,
        shape: Shape,
        procs: Sequence[ProcInfo],
        name: str,
        hosts: HostMesh | None,
        owned: bool = False,
    ) -> None:
        self._shape = shape
        self._procs = list(procs)
        self._name = name
        self._hosts = hosts
        self._owned = owned
        self._stopped = False
        self._ready: Future[bool] | None = None

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(shape, self._procs, self._name, self._hosts, owned=False)

    def _addrs(self) -> list[str]:
        return [self._procs[b].addr for b in self._shape.ranks()]

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:  # noqa: N803
        """Create one ``Class(*args, **kwargs)`` actor in every process; returns at once.

        The constructor runs before the actor's first message. A constructor that raises makes
        that actor fail (calls to it raise ``SupervisionError``) rather than raising here.
        """
        if not (isinstance(Class, type) and issubclass(Class, Actor)):
            raise ValueError(f"{Class!r} must be a subclass of regency.actor.Actor")
        specs = endpoints_of(Class)
        kinds = {prop.spec.is_async for prop in specs.values()}
        if len(kinds) > 1:
            raise ValueError(f"{Class.__qualname__} mixes both async and sync endpoints")
        for hook in ("__supervise__", "__cleanup__"):
            fn = getattr(Class, hook, None)
            if fn is not None and kinds and inspect.iscoroutinefunction(fn) not in kinds:
                raise ValueError(
                    f"{Class.__qualname__}.{hook} must be {'async' if True in kinds else 'sync'} "
                    "like its endpoints"
                )
        clash = sorted(set(specs) & _RESERVED)
        if clash:
            raise ValueError(
                f"{Class.__qualname__} endpoint(s) {clash} collide with ActorMesh attributes"
            )
        return self._spawn_owned(name, Class, args, kwargs)  # type: ignore[return-value]

    def _spawn_owned(
        self, name: str, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ActorMesh[Any]:
        if self._stopped:
            mesh: ActorMesh[Any] = ActorMesh(cls, name, self._shape, self._procs, new_uid(), self)
            mesh._status = Future._failed(RuntimeError("`ProcMesh` has already been stopped"))
            return mesh
        rt = state.runtime()
        mesh_id = new_uid()
        addrs = self._addrs()
        tracker, status = _open_countdown(len(addrs), _unique(addrs), f"spawning {name}")
        payload = cloudpickle.dumps((cls, args, kwargs, self))
        creator = str(current_instance())
        extent = self._shape.extent
        labels, sizes = tuple(extent.labels), tuple(extent.sizes)
        for rank, addr in enumerate(addrs):
            request = SpawnActor(mesh_id, name, rank, labels, sizes, creator, payload, status, None)
            rt.send_control(addr, wire.SERVICE_PROC, request)
        mesh = ActorMesh(cls, name, self._shape, self._procs, mesh_id, self, owned=True)
        mesh._status = Future._from_pending(tracker.pending)
        return mesh

    @property
    def initialized(self) -> Future[bool]:
        """Completes with ``True`` once every process is up and its ``bootstrap`` ran."""
        if self._ready is None:
            addrs = self._addrs()
            tracker, port = _open_countdown(len(addrs), _unique(addrs), "proc bootstrap")
            rt = state.runtime()
            for rank, addr in enumerate(addrs):
                rt.send_control(addr, wire.SERVICE_PROC, ("ping", port, rank))
            self._ready = Future._from_pending(tracker.pending, lambda _: True)
        return self._ready

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor and end every process of this mesh (owner only)."""
        if not self._owned:
            raise ValueError("ProcMesh is not owned; must be stopped by an owner")
        if self._stopped:
            return Future._resolved(None)
        self._stopped = True
        rt = state.runtime()
        by_agent: dict[str, list[str]] = {}
        for info in self._procs:
            by_agent.setdefault(info.agent, []).append(info.addr)
        tracker, port = _open_countdown(len(by_agent), [], f"stopping {self._name}")
        for agent, addrs in by_agent.items():
            rt.send_control(agent, wire.SERVICE_HOST, StopProcs(tuple(addrs), reason, port))
        return Future._from_pending(tracker.pending)

    @property
    def host_mesh(self) -> HostMesh:
        """The host of a single-process mesh."""
        if len(self._shape) != 1:
            raise NotImplementedError("host_mesh is only defined for a single-process ProcMesh")
        info = self._procs[self._shape.ranks()[0]]
        return HostMesh(Shape.from_extent(Extent(["hosts"], [1])), [HostInfo(info.agent)])

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcMesh, (self._shape, self._procs, self._name, self._hosts, False))

    def __repr__(self) -> str:
        return f"ProcMesh({self._name}, {self._shape})"

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            self.stop().get()


class Route(NamedTuple):
    """A mesh view's destinations: base ranks, proc addresses, and the cast extent."""

    bases: list[int]
    addrs: list[str]
    ranks: list[int]
    unique: list[str]
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    fanout: int
    envelopes: dict[str, bytes]  # pickled envelopes of messages without a reply port


class ActorMesh(MeshTrait, Generic[T]):
    """A mesh of actors of one class. Reach endpoints as attributes: ``mesh.method.call()``."""

    def __init__(
        self,
        cls: type,
        name: str,
        shape: Shape,
        procs: Sequence[ProcInfo],
        mesh_id: int,
        proc_mesh: ProcMesh | None,
        owned: bool = False,
    ) -> None:
        self._class = cls
        self._name = name
        self._shape = shape
        self._procs = list(procs)
        self._mesh_id = mesh_id
        self._proc_mesh = proc_mesh
        self._owned = owned
        self._status: Future[None] = Future._resolved(None)
        self._endpoint_specs = _endpoint_table(cls)

    def _route(self) -> Route:
        """Where this view's messages go (computed once per view)."""
        route: Route | None = self.__dict__.get("_cached_route")
        if route is None:
            bases = self._shape.ranks()
            addrs = [self._procs[b].addr for b in bases]
            extent = self._shape.extent
            route = Route(
                bases,
                addrs,
                list(range(len(addrs))),
                _unique(addrs),
                tuple(extent.labels),
                tuple(extent.sizes),
                int(config.get("cast_fanout")),
                {},
            )
            self.__dict__["_cached_route"] = route
        return route

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        mesh = ActorMesh[T](
            self._class, self._name, shape, self._procs, self._mesh_id, self._proc_mesh
        )
        mesh._status = self._status
        return mesh

    def __getattr__(self, name: str) -> Any:
        specs = self.__dict__.get("_endpoint_specs")
        if specs is not None and name in specs:
            spec, checker = specs[name]
            return Endpoint(self, name, spec, checker)
        cls = self.__dict__.get("_class")
        if cls is not None and callable(getattr(cls, name, None)) and not name.startswith("_"):
            raise RuntimeError(
                f"{cls.__qualname__}.{name} is not annotated as an endpoint; "
                "decorate it with @endpoint to call it remotely"
            )
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def initialized(self) -> Future[None]:
        """Completes when every actor's constructor has run (raises if one raised)."""
        return self._status

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop this mesh's actors (owner only); later calls raise ``SupervisionError``."""
        if not self._owned:
            raise RuntimeError("ActorMesh is not owned; must be stopped by its owner")
        rt = state.runtime()
        addrs = [self._procs[b].addr for b in self._shape.ranks()]
        tracker, port = _open_countdown(len(addrs), _unique(addrs), f"stopping {self._name}")
        for addr in addrs:
            rt.send_control(addr, wire.SERVICE_PROC, ("stop_actor", self._mesh_id, reason, port))
        return Future._from_pending(tracker.pending)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _actor_mesh_ref,
            (self._class, self._name, self._shape, self._procs, self._mesh_id, self._proc_mesh),
        )

    def __repr__(self) -> str:
        return f"ActorMesh({self._class.__qualname__} {self._name}, {self._shape})"


_TABLES: dict[type, dict[str, tuple[EndpointSpec, ArgumentCheck]]] = {}


def _endpoint_table(cls: type) -> dict[str, tuple[EndpointSpec, ArgumentCheck]]:
    """Each endpoint's spec and argument checker, computed once per class."""
    table = _TABLES.get(cls)
    if table is None:
        table = {
            name: (
                prop.spec,
                ArgumentCheck(prop.signature, 2 if prop.spec.explicit_port else 1),
            )
            for name, prop in endpoints_of(cls).items()
        }
        _TABLES[cls] = table
    return table


def _actor_mesh_ref(
    cls: type,
    name: str,
    shape: Shape,
    procs: Sequence[ProcInfo],
    mesh_id: int,
    proc_mesh: ProcMesh | None,
) -> ActorMesh[Any]:
    return ActorMesh(cls, name, shape, procs, mesh_id, proc_mesh, owned=False)


def _unique(addrs: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(addrs))


def this_proc_mesh() -> ProcMesh:
    """The singleton proc mesh of the calling process."""
    rt = state.runtime()
    agent = state.host_agent_address()
    info = ProcInfo(rt.address, agent, 0, 0)
    return ProcMesh(Shape.unity(), [info], "this_proc", None, owned=False)


def this_host_mesh() -> HostMesh:
    """The host the calling process runs on."""
    state.runtime()
    return HostMesh(
        Shape.from_extent(Extent(["hosts"], [1])), [HostInfo(state.host_agent_address())]
    )


def current_context() -> context.Context:
    """The running actor's context (the root client's outside any actor)."""
    ctx = context.current_or_none()
    if ctx is not None:
        return ctx
    return context.Context(state.client())
