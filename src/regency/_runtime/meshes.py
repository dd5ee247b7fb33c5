"""Host, proc and actor meshes: multidimensional arrays of machines, processes and actors.

A mesh object made by ``spawn_procs``/``spawn`` is *owned* by the instance that made it; slices
and copies received in messages are references that can send but not stop.
"""

from __future__ import annotations

import contextlib
import importlib
import pickle
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import cloudpickle

from regency import config
from regency._runtime import context, state, wire
from regency._runtime.bootstrap_command import BootstrapCommand, ProcLaunch, launches_for
from regency._runtime.endpoint import (
    Endpoint,
    NotAnEndpoint,
    Route,
    YieldsToEndpoint,
    current_instance,
)
from regency._runtime.endpoint_def import (
    Actor,
    ArgumentCheck,
    EndpointSpec,
    actor_is_async,
    endpoints_of,
)
from regency._runtime.errors import ActorError
from regency._runtime.future import Future
from regency._runtime.identity import CreatorInstance, InstanceBase, new_uid, set_this_proc_mesh
from regency._runtime.instance import SpawnActor
from regency._runtime.mesh_supervisor import MeshSupervisor
from regency._runtime.mesh_trait import MeshTrait, ProcMeshBase
from regency._runtime.pending import Pending
from regency._runtime.procs import (
    ProcInfo,
    ShutdownHost,
    SpawnProcs,
    StopProcs,
    new_proc_address,
)
from regency._runtime.refs import Part, PortRef
from regency._runtime.supervision import RestartPolicy, stop_reason
from regency._transport.transport import PeerUnreachableError
from regency.shape import Extent, Point, Shape

T = TypeVar("T")

# Endpoint names an actor may not use: Monarch refuses every attribute its ActorMesh has
# (public ones and its private ones alike); regency's own private attributes are refused too.
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
        # Monarch's private ActorMesh attributes
        "_class",
        "_endpoint",
        "_inner",
        "_is_protocol",
        "_labels",
        "_mesh_name",
        "_name",
        "_ndslice",
        "_new_with_shape",
        "_proc_mesh",
        "_shape",
        # regency's
        "_cached_route",
        "_endpoint_specs",
        "_mesh_id",
        "_owned",
        "_procs",
        "_route",
        "_status",
        "_supervisor",
    }
    | {  # the special attributes Monarch's ActorMesh has (``dir()``), ``__len__`` among them
        f"__{name}__"
        for name in (  # noqa: SIM905
            "abstractmethods class class_getitem delattr dict dir doc eq format ge getattr "
            "getattribute getstate gt hash init init_subclass le len lt module ne new "
            "orig_bases parameters reduce reduce_ex repr setattr sizeof slots str "
            "subclasshook weakref"
        ).split()
    }
)
# Mesh attributes Monarch does not have: an endpoint of the same name replaces them on the mesh.
_YIELDING = ("shape", "restarts", "restarted")


class NotOwnedError(RuntimeError, ValueError):
    """Only a mesh's owner (its spawner, through the object it got) may stop it."""


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


class WorkerLease:
    """The worker daemons a host mesh was attached to, shared with its slices: whether they have
    been shut down (then no mesh over them can be used again)."""

    __slots__ = ("shut_down",)

    def __init__(self) -> None:
        self.shut_down = False


class HostMesh(MeshTrait):
    """A mesh of machines; ``spawn_procs`` starts processes on each of them."""

    def __init__(
        self,
        shape: Shape,
        hosts: Sequence[HostInfo],
        owned: bool = False,
        lease: WorkerLease | None = None,
    ) -> None:
        self._shape = shape
        self._hosts = list(hosts)
        self._owned = owned
        self._lease = lease  # None: hosts this mesh cannot shut down (this_host(), references)

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts, lease=self._lease)

    def _agents(self) -> set[str]:
        return {self._hosts[b].agent for b in self._shape.ranks()}

    def _check_up(self) -> None:
        if self._lease is not None and self._lease.shut_down:
            raise RuntimeError("HostMesh has already been shut down")

    @property
    def initialized(self) -> Future[bool]:
        """Completes with ``True`` once the hosts are connected: at once, since regency
        connects (``attach_to_workers``) before it returns the mesh."""
        return Future._resolved(True)

    def stop(self, reason: str = "host mesh stopped") -> Future[None]:
        """Stop the procs the caller spawned on these hosts; the hosts stay up."""
        if not self._owned:
            raise NotOwnedError("cannot stop `HostMesh` that is a reference instead of owned")
        self._check_up()
        return self._stop_procs(reason)

    def _stop_procs(self, reason: str) -> Future[None]:
        owner = current_instance()
        agents = self._agents()
        procs = [m for m in owner.owned if isinstance(m, ProcMesh) and m._agents() & agents]
        futures = [m.stop(reason) for m in procs]
        pending = Pending()

        def wait() -> None:
            errors = []
            for future in futures:
                error = future.exception()
                if error is not None:
                    errors.append(str(error))
            if errors:
                pending.set_exception(
                    ActorError(None, "stopping the host mesh failed", "\n".join(errors))
                )
            else:
                pending.set_result(None)

        threading.Thread(target=wait, name="regency-host-stop", daemon=True).start()
        return Future._from_pending(pending)

    def shutdown(self) -> Future[None]:
        """Stop the caller's procs on these hosts, then end the worker daemons serving them.

        Only the mesh ``attach_to_workers`` (or a job) returned can shut its hosts down; a slice,
        a mesh received in a message and ``this_host()`` raise ``RuntimeError``. Afterwards the
        mesh and its slices cannot be used (``RuntimeError("HostMesh has already been shut
        down")``). ``async with hosts:`` shuts down on exit.
        """
        if not self._owned or self._lease is None:
            raise NotOwnedError("cannot shut down `HostMesh` that is a reference instead of owned")
        self._check_up()
        self._lease.shut_down = True
        stopped = self._stop_procs("host mesh shut down")
        agents = sorted({host.agent for host in self._hosts})
        return _after(stopped, lambda: shutdown_hosts(agents))

    async def __aenter__(self) -> HostMesh:
        self._check_up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._lease is not None and not self._lease.shut_down:
            await self.shutdown()

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: Sequence[dict[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        """Start ``per_host`` processes on every host; returns at once (spawning is async).

        The result's dimensions are the host dimensions followed by ``per_host``'s.
        ``bootstrap`` runs in each new process before any actor (e.g. to set environment
        variables before CUDA starts). ``proc_bind`` (one dict per proc of a host) pins procs:
        ``cpus`` (taskset's list form, ``"0-3,8"``) with ``os.sched_setaffinity``;
        ``cpunodebind``, ``membind`` and ``physcpubind`` through ``numactl`` (which must be
        installed on the host); other keys are ignored. ``bootstrap_command`` (see
        ``default_bootstrap_cmd()``), or a function of each proc's ``Point`` returning one,
        replaces the command procs start with.
        """
        self._check_up()
        per_host = dict(per_host or {})
        host_labels = tuple(self._shape.labels)
        overlap = [label for label in per_host if label in host_labels]
        if overlap:
            raise ValueError(f"per_host labels {overlap} overlap with host labels {host_labels}")
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
        launches = launches_for(shape, per, proc_bind, bootstrap_command)
        procs: list[ProcInfo] = []
        by_agent: dict[str, list[ProcInfo]] = {}
        for host_base in self._shape.ranks():
            host = self._hosts[host_base]
            for local in range(per):
                addr = new_proc_address(host.agent, rt.job_id, mesh_name)
                info = ProcInfo(addr, host.agent, len(procs), local)
                procs.append(info)
                by_agent.setdefault(host.agent, []).append(info)
        recipe = ProcRecipe(
            cloudpickle.dumps(bootstrap) if bootstrap is not None else None,
            mesh_name,
            config.get_global_config(),
            launches,
        )
        for agent, infos in by_agent.items():
            start_procs(agent, infos, recipe)
        hosts = HostMesh(self._shape, self._hosts)
        mesh = ProcMesh(shape, procs, mesh_name, hosts, owned=True, recipe=recipe)
        mesh._owner = current_instance()
        mesh._owner.adopt(mesh)
        return mesh

    def __reduce__(self) -> tuple[Any, ...]:
        return (HostMesh, (self._shape, self._hosts))

    def __repr__(self) -> str:
        return f"HostMesh({self._shape})"


@dataclass(frozen=True, slots=True)
class ProcRecipe:
    """How a proc mesh's procs were started, to start more like them (restarts)."""

    bootstrap: bytes | None
    mesh_name: str
    settings: dict[str, object]
    launches: tuple[ProcLaunch | None, ...] | None = None  # by rank


def start_procs(agent: str, infos: Sequence[ProcInfo], recipe: ProcRecipe) -> None:
    """Ask the host agent at ``agent`` to start ``infos``; their exits are reported back here."""
    rt = state.runtime()
    # The controller's own host agent marks its children dead in this very process.
    events = rt.exit_reports(agent, [i.addr for i in infos]) if agent != rt.address else None
    launches = (
        tuple(recipe.launches[i.rank] for i in infos) if recipe.launches is not None else None
    )
    rt.send_control(
        agent,
        wire.SERVICE_HOST,
        SpawnProcs(
            tuple(infos), recipe.bootstrap, recipe.mesh_name, events, recipe.settings, launches
        ),
    )


class _HostsGone:
    """Port handler completing once every worker asked to shut down is gone (or refused)."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.pending = Pending()
        self._left = set(agents)
        self._errors: list[str] = []
        self.port = -1
        if not agents:
            self.pending.set_result(None)

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        agent, error = pickle.loads(parts[0])
        self._errors.append(f"{agent}: {error}")
        self._gone(agent)

    def peer_lost(self, addr: str, reason: str) -> None:
        self._gone(addr)

    def _gone(self, agent: str) -> None:
        if agent not in self._left:
            return
        self._left.discard(agent)
        if self._left:
            return
        state.runtime().close_port(self.port)
        if self._errors:
            self.pending.set_exception(
                ActorError(None, "shutting down the host mesh failed", "\n".join(self._errors))
            )
        else:
            self.pending.set_result(None)


def shutdown_hosts(agents: Sequence[str]) -> Future[None]:
    """Ask the worker daemons at ``agents`` to stop every proc and exit; done once all are gone."""
    rt = state.runtime()
    handler = _HostsGone(agents)
    ref = rt.open_port(handler)
    handler.port = ref.port
    for agent in agents:
        try:
            rt.send_control(agent, wire.SERVICE_HOST, ShutdownHost(rt.address, ref))
        except PeerUnreachableError:
            handler.peer_lost(agent, "unreachable")
    rt.watch(ref.port, agents)
    return Future._from_pending(handler.pending)


def stop_procs(infos: Sequence[ProcInfo], reason: str) -> Future[None]:
    """Stop procs through their host agents (politely, then by force)."""
    rt = state.runtime()
    by_agent: dict[str, list[str]] = {}
    for info in infos:
        by_agent.setdefault(info.agent, []).append(info.addr)
    tracker, port = _open_countdown(len(by_agent), [], "stopping procs")
    rt.expect_stop([info.addr for info in infos], stop_reason(reason))
    for agent, addrs in by_agent.items():
        try:
            rt.send_control(agent, wire.SERVICE_HOST, StopProcs(tuple(addrs), reason, port))
        except PeerUnreachableError:
            tracker.deliver(0, 0, [])  # a lost host's procs are gone with it
    return Future._from_pending(tracker.pending)


class ProcMesh(ProcMeshBase):
    """A mesh of processes; ``spawn`` creates one actor in each."""

    def __init__(
        self,
        shape: Shape,
        procs: Sequence[ProcInfo],
        name: str,
        hosts: HostMesh | None,
        owned: bool = False,
        recipe: ProcRecipe | None = None,
    ) -> None:
        self._shape = shape
        self._procs = list(procs)
        self._name = name
        self._hosts = hosts
        self._owned = owned
        self._recipe = recipe or ProcRecipe(None, name, config.get_global_config())
        self._stopped = False
        self._ready: Future[bool] | None = None
        # Supervisors of the actor meshes spawned through this object (in this process).
        self._supervisors: list[MeshSupervisor] = []
        self._owner: InstanceBase | None = None

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        mesh = ProcMesh(shape, self._procs, self._name, self._hosts, recipe=self._recipe)
        mesh._supervisors = self._supervisors
        return mesh

    def _addrs(self) -> list[str]:
        return [self._procs[b].addr for b in self._shape.ranks()]

    def _agents(self) -> set[str]:
        return {info.agent for info in self._procs}

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:  # noqa: N803
        """Create one ``Class(*args, **kwargs)`` actor in every process; returns at once.

        The constructor runs before the actor's first message. A constructor that raises makes
        that actor fail (calls to it raise ``SupervisionError``) rather than raising here. On a
        stopped mesh this raises ``RuntimeError("`ProcMesh` has already been stopped")``.
        """
        if not (isinstance(Class, type) and issubclass(Class, Actor)):
            raise ValueError(f"{Class!r} must subclass regency.actor.Actor to spawn it.")
        actor_is_async(Class)
        specs = endpoints_of(Class)
        clash = sorted(set(specs) & _RESERVED)
        if clash:
            raise ValueError(
                "ActorMesh has an attribute that collides with an endpoint name: "
                f"attribute={clash[0]} ({Class.__qualname__} endpoint(s) {clash})"
            )
        policy = kwargs.get("restart")
        if isinstance(policy, RestartPolicy):
            del kwargs["restart"]
        else:
            policy = None
        return self._spawn_owned(name, Class, args, kwargs, policy)  # type: ignore[return-value]

    def _spawn_owned(
        self,
        name: str,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        policy: RestartPolicy | None = None,
        owner: InstanceBase | None = None,
    ) -> ActorMesh[Any]:
        if self._stopped:
            raise RuntimeError("`ProcMesh` has already been stopped")
        owner = owner if owner is not None else current_instance()
        extent = self._shape.extent
        # The actor mesh gets its own copy of the proc list: restarts move its ranks.
        procs = list(self._procs)
        spawn = _ActorSpawn(
            new_uid(),
            name,
            tuple(extent.labels),
            tuple(extent.sizes),
            owner.as_creator(),
            f"{cls.__module__}.{cls.__qualname__}",
            cloudpickle.dumps((cls, args, kwargs, self)),
            self._recipe,
        )
        supervisor = MeshSupervisor(
            owner,
            spawn.mesh_id,
            name,
            f"{cls.__module__}.{cls.__qualname__}",
            extent,
            self._shape.ranks(),
            procs,
            policy,
            spawn.respawn,
        )
        addrs = self._addrs()
        tracker, status = _open_countdown(len(addrs), _unique(addrs), f"spawning {name}")
        for rank, addr in enumerate(addrs):
            # A dead proc cannot host the rank: its watch fails it (and `initialized`).
            with contextlib.suppress(PeerUnreachableError):
                spawn.send(addr, rank, status, supervisor.port)
        mesh: ActorMesh[Any] = ActorMesh(
            cls, name, self._shape, procs, spawn.mesh_id, self, owned=True
        )
        mesh._status = Future._from_pending(tracker.pending)
        mesh._supervisor = supervisor
        supervisor.mesh = mesh
        self._supervisors.append(supervisor)
        owner.adopt(mesh)
        supervisor.start_watching()
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
            raise NotOwnedError("ProcMesh is not owned; must be stopped by an owner")
        if self._stopped:
            return Future._resolved(None)
        self._stopped = True
        if self._owner is not None:
            self._owner.disown(self)
        procs = list(self._procs)
        for supervisor in self._supervisors:
            supervisor.stop(f"stopped due to proc mesh shutdown ({reason})")
            procs.extend(supervisor.replacements)
        return stop_procs(procs, reason)

    # The tensor engine supplies these (see ``_tensor_api``).
    def activate(self) -> contextlib.AbstractContextManager[ProcMesh]:
        """``with procs.activate():`` torch ops in the block run on this mesh's workers."""
        manager: contextlib.AbstractContextManager[ProcMesh] = _tensor_api().activate(self)
        return manager

    def rank_tensor(self, dims: str | Sequence[str]) -> Any:
        """A mesh tensor of each proc's coordinate(s) along ``dims``."""
        return _tensor_api().rank_tensor(self, dims)

    def rank_tensors(self) -> Any:
        """``{dim: rank_tensor(dim)}`` for every dimension."""
        return _tensor_api().rank_tensors(self)

    def process_group(self, dims: str | Sequence[str]) -> Any:
        """This mesh's ``torch.distributed`` group along ``dims``, for remote functions."""
        return _tensor_api().process_group(self, dims)

    @property
    def host_mesh(self) -> HostMesh:
        """The host of a single-process mesh."""
        if len(self._shape) != 1:
            raise NotImplementedError(
                "`ProcMesh.host_mesh` is not yet supported for non-singleton proc meshes."
            )
        info = self._procs[self._shape.ranks()[0]]
        return HostMesh(Shape.unity(), [HostInfo(info.agent)])

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProcMesh, (self._shape, self._procs, self._name, self._hosts, False))

    def __repr__(self) -> str:
        return f"ProcMesh({self._name}, {self._shape})"

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            self.stop().get()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._owned:
            await self.stop()


@dataclass(frozen=True, slots=True)
class _ActorSpawn:
    """Everything needed to create (and re-create) the actors of one mesh."""

    mesh_id: int
    name: str
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    creator: CreatorInstance
    class_name: str  # module.qualname, known before the proc unpickles the class
    payload: bytes  # cloudpickled (cls, args, kwargs, proc_mesh)
    recipe: ProcRecipe

    def send(self, addr: str, rank: int, status: PortRef, owner: PortRef) -> None:
        """Ask the proc at ``addr`` to construct rank ``rank``."""
        request = SpawnActor(
            self.mesh_id,
            self.name,
            rank,
            self.labels,
            self.sizes,
            self.creator,
            self.class_name,
            self.payload,
            status,
            owner,
        )
        state.runtime().send_control(addr, wire.SERVICE_PROC, request)

    def respawn(self, supervisor: MeshSupervisor, ranks: list[int]) -> None:
        """Restart ``ranks``: retire their old actors, start a new proc and actor for each."""
        rt = state.runtime()
        retired: list[ProcInfo] = []
        fresh: list[tuple[int, ProcInfo]] = []
        for rank in ranks:
            old = supervisor.procs[supervisor.bases[rank]]
            if old in supervisor.replacements:
                supervisor.replacements.remove(old)
                retired.append(old)
            elif old.addr not in rt.dead:
                with contextlib.suppress(PeerUnreachableError):
                    rt.send_control(
                        old.addr,
                        wire.SERVICE_PROC,
                        ("stop_actor", self.mesh_id, "restarting", None),
                    )
            addr = new_proc_address(old.agent, rt.job_id, self.recipe.mesh_name, "r-")
            fresh.append((rank, ProcInfo(addr, old.agent, old.rank, old.local_rank)))
        if retired:
            stop_procs(retired, f"restarting {self.name}")
        by_agent: dict[str, list[ProcInfo]] = {}
        for _, info in fresh:
            by_agent.setdefault(info.agent, []).append(info)
        for agent, infos in by_agent.items():
            start_procs(agent, infos, self.recipe)
        addrs = [info.addr for _, info in fresh]
        tracker, status = _open_countdown(len(fresh), addrs, f"restarting {self.name}")
        for rank, info in fresh:
            supervisor.replaced(rank, info)
            self.send(info.addr, rank, status, supervisor.port)
        if tracker.pending.wait(config.get_seconds("connect_timeout") * 2) and (
            tracker.pending.error() is None
        ):
            supervisor.restarted(ranks)
        # Otherwise the new actor or proc failed too, and reported it: the policy decides again.


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
        # Shared with the mesh's views and its supervisor, which moves restarted ranks.
        self._procs = procs if isinstance(procs, list) else list(procs)
        self._mesh_id = mesh_id
        self._proc_mesh = proc_mesh
        self._owned = owned
        self._status: Future[None] = Future._resolved(None)
        self._endpoint_specs = _endpoint_table(cls)
        # Set on the owner's mesh and its views: per-rank health and restarts.
        self._supervisor: MeshSupervisor | None = None
        for attr in _YIELDING:
            if attr in self._endpoint_specs:
                spec, checker = self._endpoint_specs[attr]
                self.__dict__[attr] = Endpoint(self, attr, spec, checker)

    def _route(self) -> Route:
        """Where this view's messages go (computed once per view, again after a restart)."""
        route: Route | None = self.__dict__.get("_cached_route")
        supervisor = self._supervisor
        generation = supervisor.generation if supervisor is not None else 0
        if route is None or route.generation != generation:
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
                generation,
            )
            self.__dict__["_cached_route"] = route
        return route

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        mesh = ActorMesh[T](
            self._class, self._name, shape, self._procs, self._mesh_id, self._proc_mesh
        )
        mesh._status = self._status
        mesh._supervisor = self._supervisor
        return mesh

    def __getattr__(self, name: str) -> Any:
        specs = self.__dict__.get("_endpoint_specs")
        if specs is not None and name in specs:
            spec, checker = specs[name]
            return Endpoint(self, name, spec, checker)
        cls = self.__dict__.get("_class")
        if cls is not None and callable(getattr(cls, name, None)) and not name.startswith("_"):
            return NotAnEndpoint(self, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def initialized(self) -> Future[None]:
        """Completes when every actor's constructor has run (raises if one raised)."""
        return self._status

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop this mesh's actors (owner only); later calls raise ``SupervisionError``."""
        if not self._owned:
            raise NotOwnedError("ActorMesh is not owned; must be stopped by its owner")
        rt = state.runtime()
        if self._supervisor is not None:
            self._supervisor.stop(reason)
            replacements, self._supervisor.replacements = self._supervisor.replacements, []
        else:
            replacements = []
        addrs = [a for a in _unique(self._procs[b].addr for b in self._shape.ranks())]
        live = [a for a in addrs if a not in rt.dead]
        tracker, port = _open_countdown(len(live), live, f"stopping {self._name}")
        for addr in live:
            rt.send_control(addr, wire.SERVICE_PROC, ("stop_actor", self._mesh_id, reason, port))
        if replacements:
            # Procs started by restarts belong to this mesh alone: they go with it.
            return _after(
                Future._from_pending(tracker.pending), lambda: stop_procs(replacements, reason)
            )
        return Future._from_pending(tracker.pending)

    @YieldsToEndpoint
    def restarts(self) -> int:
        """How many restarts this mesh's restart policy has completed (owner only)."""
        return self._supervisor.restarts if self._supervisor is not None else 0

    @YieldsToEndpoint
    def shape(self) -> Shape:
        """The view's shape over the mesh it was taken from."""
        return self._shape

    def restarted(self, count: int = 1) -> Future[int]:
        """Completes once the restart policy has completed ``count`` restarts in all."""
        if self._supervisor is None:
            raise NotOwnedError("restarts are tracked on the owner's mesh only")
        return Future._from_pending(self._supervisor.when_restarted(count))

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _actor_mesh_ref,
            (self._class, self._name, self._shape, self._procs, self._mesh_id, self._proc_mesh),
        )

    def __repr__(self) -> str:
        # Monarch's text up to its ``inner=<Rust class>`` part, which has no meaning here.
        return f"ActorMesh(class={self._class}, shape={self._shape})"


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


def _unique(addrs: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(addrs))


def _after(first: Future[None], then: Callable[[], Future[None]]) -> Future[None]:
    """A future for ``then()``'s outcome, started once ``first`` completes."""
    pending = Pending()

    def chain(_: Pending) -> None:
        second = then()
        second._pending.add_done_callback(
            lambda p: (
                pending.set_exception(p.error())  # type: ignore[arg-type]
                if p.error() is not None
                else pending.set_result(None)
            )
        )

    first._pending.add_done_callback(chain)
    return Future._from_pending(pending)


def _tensor_api() -> Any:
    # The tensor engine is a layer above the runtime (built on regency.actor) and needs torch:
    # loaded on first use by name, like a plugin, so the runtime never imports it.
    return importlib.import_module("regency._tensor.api")


def this_proc_mesh() -> ProcMesh:
    """The singleton proc mesh of the calling process."""
    rt = state.runtime()
    agent = state.host_agent_address()
    info = ProcInfo(rt.address, agent, 0, 0)
    return ProcMesh(Shape.unity(), [info], "this_proc", None, owned=False)


set_this_proc_mesh(this_proc_mesh)


def this_host_mesh() -> HostMesh:
    """The host the calling process runs on, as a 0-dimensional mesh (as in Monarch)."""
    state.runtime()
    return HostMesh(Shape.unity(), [HostInfo(state.host_agent_address())], owned=True)


def current_context() -> context.Context:
    """The running actor's context (the root client's outside any actor)."""
    ctx = context.current_or_none()
    if ctx is not None:
        return ctx
    return context.Context(context.client())
