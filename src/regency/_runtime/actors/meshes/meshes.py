"""Host and proc meshes: multidimensional arrays of machines and processes (actor meshes are in
:mod:`.actor_mesh`, the requests to host agents in :mod:`.proc_control`).

A mesh object made by ``spawn_procs``/``spawn`` is *owned* by the instance that made it; slices
and copies received in messages are references that can send but not stop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from regency import _hooks, config
from regency._runtime.actors.base import context
from regency._runtime.actors.base.endpoint_def import (
    Actor,
    actor_is_async,
    endpoints_of,
)
from regency._runtime.actors.base.errors import ActorError
from regency._runtime.actors.base.future import CoroutineFuture, Future
from regency._runtime.actors.base.identity import (
    InstanceBase,
)
from regency._runtime.actors.base.mesh_trait import MeshTrait, ProcMeshBase
from regency._runtime.actors.base.value_mesh import ValueMesh
from regency._runtime.actors.control.bootstrap_command import (
    BootstrapCommand,
    inherited_python,
    launches_for,
    python_bootstrap_cmd,
)
from regency._runtime.actors.control.control import PingProc, ProcInfo
from regency._runtime.actors.meshes.actor_mesh import ActorMesh, NotOwnedError, spawn_actor_mesh
from regency._runtime.actors.meshes.joining import carry_secret
from regency._runtime.actors.meshes.mesh_table import mesh_table
from regency._runtime.actors.meshes.proc_control import (
    ProcRecipe,
    after,
    new_proc_address,
    open_countdown,
    shutdown_hosts,
    start_procs,
    stop_procs,
    unique,
)
from regency._runtime.actors.observe import tracing
from regency._runtime.actors.observe.log_sink import LogSink, flushed_after, set_logging_option
from regency._runtime.actors.observe.stacks import gather_stacks
from regency._runtime.actors.supervision.mesh_supervisor import MeshSupervisor
from regency._runtime.actors.supervision.supervision import RestartPolicy
from regency._runtime.kernel import codec, state, wire
from regency._runtime.kernel.pending import Pending
from regency.shape import Extent, Point, Shape, Slice

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
        "_endpoint_specs",
        "_mesh_id",
        "_owned",
        "_pipeline",
        "_procs",
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


# The host meshes recorded in the job's tables by this process (their ids).
_recorded_hosts: set[int] = set()
_recorded_lock = threading.Lock()


class HostMesh(MeshTrait):
    """A mesh of machines; ``spawn_procs`` starts processes on each of them."""

    def __init__(
        self,
        shape: Shape,
        hosts: Sequence[HostInfo],
        owned: bool = False,
        lease: WorkerLease | None = None,
        python: str | None = None,
    ) -> None:
        self._shape = shape
        self._hosts = list(hosts)
        self._owned = owned
        self._lease = lease  # None: hosts this mesh cannot shut down (this_host(), references)
        self._python = python  # the interpreter procs start with (None: the default command)

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts, lease=self._lease, python=self._python)

    @property
    def is_fake_in_process(self) -> bool:
        """Whether the hosts are simulated inside this process: never in regency (nor in any
        host mesh Monarch's public API makes)."""
        return False

    @property
    def stream_logs(self) -> bool:
        """Monarch's flag for streaming the procs' output to the client from the start: off,
        as in Monarch; ``ProcMesh.logging_option`` decides (observability.md)."""
        return False

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """This mesh, whose ``spawn_procs`` start procs with ``python_executable`` (a path on
        the hosts) running ``-m regency._runtime.bootstrap``; regency must be importable by it.
        Those procs start theirs (``this_host().spawn_procs(...)``) with it too. A
        ``bootstrap_command`` given to ``spawn_procs`` still replaces the whole command."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError(
                f"python_executable must be a non-empty path, got {python_executable!r}"
            )
        return HostMesh(
            self._shape, self._hosts, self._owned, self._lease, python=python_executable
        )

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
        """Stop the procs the caller spawned through this mesh (or its slices); the hosts stay
        up, and so do the procs spawned through another mesh over the same hosts."""
        if not self._owned:
            raise NotOwnedError("cannot stop `HostMesh` that is a reference instead of owned")
        self._check_up()
        return self._stop_procs(reason)

    def _stop_procs(self, reason: str) -> Future[None]:
        owner = context.current_instance()
        agents = self._agents()
        procs = [
            m
            for m in owner.owned
            if isinstance(m, ProcMesh)
            and m._hosts is not None
            and m._hosts._lease is self._lease  # spawned through this mesh (None: this_host())
            and m._agents() & agents
        ]
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
        return after(stopped, lambda: shutdown_hosts(agents))

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
        config._check_procs_per_host(per, f"spawn_procs(per_host={per_host!r})")
        if bootstrap_command is None and self._python is not None:
            bootstrap_command = python_bootstrap_cmd(self._python)
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
        sink = LogSink(mesh_name, shape.extent)
        tracing.follow_config()  # the procs take this process's settings: so must it
        recipe = ProcRecipe(
            codec.dumps_by_value(bootstrap) if bootstrap is not None else None,
            mesh_name,
            config.get_global_config(),
            launches,
            sink.port,
            tuple(host.agent for host in self._hosts),
        )
        for agent, infos in by_agent.items():
            start_procs(agent, infos, recipe)
        if tracing.probe is not None:
            self._record_procs(mesh_name, shape, procs)
        hosts = HostMesh(self._shape, self._hosts, lease=self._lease)
        mesh = ProcMesh(shape, procs, mesh_name, hosts, owned=True, recipe=recipe)
        mesh._log_sink = sink
        mesh._owner = context.current_instance()
        mesh._owner.adopt(mesh)
        return mesh

    def record(self, name: str) -> None:
        """Record this host mesh as ``name`` and its hosts' agents in the job's tables while
        telemetry is on (once per host mesh and process)."""
        probe = tracing.probe
        if probe is None or not self._hosts:
            return
        mesh_id = tracing.entity_id(f"host:{self._hosts[0].agent}")
        with _recorded_lock:
            if mesh_id in _recorded_hosts:
                return
            _recorded_hosts.add(mesh_id)
        labels, sizes = self._shape.labels, self._shape.ndslice.sizes
        tracing.mesh_created(mesh_id, "Host", name, labels, sizes, None, None)
        for rank, base in enumerate(self._shape.ranks()):
            agent = self._hosts[base].agent
            probe.records.append((tracing.HOST, agent))
            uid = tracing.entity_id(f"agent:{agent}")
            probe.actor(uid, mesh_id, rank, f"{agent},host_agent[0]", f"<{name} host agent>")

    def _record_procs(self, name: str, shape: Shape, procs: list[ProcInfo]) -> None:
        """Record a new proc mesh and its procs' agents in the job's tables."""
        probe = tracing.probe
        if probe is None or not procs:
            return
        # The host mesh, unless it was recorded already (attach_to_workers names the job's).
        local = self._hosts[0].agent == state.host_agent_address()
        self.record("this_host" if local and self._lease is None else "hosts")
        mesh_id = tracing.entity_id(f"proc:{procs[0].addr}")
        view = self._shape.ndslice
        parent = tracing.entity_id(f"host:{self._hosts[0].agent}") if self._hosts else None
        tracing.mesh_created(
            mesh_id,
            "Proc",
            name,
            shape.labels,
            shape.ndslice.sizes,
            parent,
            tracing.region_json(self._shape.labels, view.offset, view.sizes, view.strides),
        )
        for info in procs:
            uid = tracing.entity_id(f"agent:{info.addr}")
            probe.actor(uid, mesh_id, info.rank, f"{info.addr},agent[0]", f"<{name} proc agent>")
        for agent in {info.agent for info in procs}:  # the hosts that keep these procs' rows
            probe.records.append((tracing.HOST, agent))

    def __reduce__(self) -> tuple[Any, ...]:
        return (HostMesh, (self._shape, self._hosts, False, None, self._python))

    def __repr__(self) -> str:
        return f"HostMesh({self._shape})"


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
        # Shared with the mesh's views: the tensor engine knows a view's root mesh by it.
        self._procs = procs if isinstance(procs, list) else list(procs)
        self._name = name
        self._hosts = hosts
        self._owned = owned
        self._recipe = recipe or ProcRecipe(None, name, config.get_global_config())
        self._stopped = False
        self._ready: Future[bool] | None = None
        # Supervisors of the actor meshes spawned through this object (in this process).
        self._supervisors: list[MeshSupervisor] = []
        self._owner: InstanceBase | None = None
        self._log_sink: LogSink | None = None  # where its procs' forwarded output is printed

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        mesh = ProcMesh(shape, self._procs, self._name, self._hosts, recipe=self._recipe)
        mesh._supervisors = self._supervisors
        mesh._log_sink = self._log_sink
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
        owner = owner if owner is not None else context.current_instance()
        mesh, supervisor = spawn_actor_mesh(
            self, self._shape, self._procs, self._recipe, name, cls, args, kwargs, policy, owner
        )
        self._supervisors.append(supervisor)
        owner.adopt(mesh)
        supervisor.start_watching()
        return mesh

    @property
    def initialized(self) -> Future[bool]:
        """Completes with ``True`` once every process is up and its ``bootstrap`` ran."""
        if self._ready is None:
            addrs = self._addrs()
            tracker, port = open_countdown(len(addrs), unique(addrs), "proc bootstrap")
            rt = state.runtime()
            for rank, addr in enumerate(addrs):
                rt.send_control(addr, wire.SERVICE_PROC, PingProc(port, rank))
            self._ready = Future._from_pending(tracker.pending, lambda _: True)
        return self._ready

    def stacks(self, *, pyspy: bool = True, timeout: float = 10.0) -> Future[ValueMesh[str]]:
        """Every thread's Python stack in each process, as text per rank (all threads):
        ``py-spy dump``'s with ``pyspy`` where installed, else ``sys._current_frames()``'s; a
        rank that is gone or silent for ``timeout`` seconds gets a line saying so."""
        if timeout <= 0:
            raise ValueError(f"stacks(timeout=...) must be > 0 seconds, got {timeout!r}")
        return gather_stacks(self._shape, self._addrs(), pyspy, timeout)

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
        stopped = stop_procs(procs, reason)
        return stopped if self._log_sink is None else flushed_after(stopped, self._log_sink)

    def logging_option(
        self,
        stream_to_client: bool = False,
        aggregate_window_sec: float | None = None,
        level: int = logging.INFO,
    ) -> CoroutineFuture[None]:
        """How this mesh's forwarded output is shown (Monarch's signature and defaults):
        printed here (``stream_to_client``), gathered for ``aggregate_window_sec`` seconds into
        ``[N similar log lines]`` groups (``None``: every line at once), and the procs' root
        logger level. Output is forwarded from procs on other hosts, and from this machine's
        too with ``configure(enable_log_forwarding=True)`` before the mesh is spawned.

        The options apply when this is called; the result can be awaited, passed to
        ``asyncio.run`` (Monarch's method is a coroutine) or read with ``get()``."""
        set_logging_option(
            self._log_sink, self._addrs(), stream_to_client, aggregate_window_sec, level
        )
        return CoroutineFuture._resolved(None)

    def to_table(self) -> str:
        """The mesh drawn as a table, as Monarch draws it (1 to 3 dimensions): each cell is
        ``<host>.gpu[<proc on that host>]``, hosts numbered in the order the mesh has them."""
        hosts: dict[str, int] = {}
        for info in self._procs:
            hosts.setdefault(info.agent, len(hosts))
        cells = []
        for base in self._shape.ranks():
            info = self._procs[base]
            cells.append(f"{hosts[info.agent]}.gpu[{info.local_rank}]")
        return mesh_table(self._shape.labels, self._shape.ndslice.sizes, cells)

    def sync_workspace(
        self, workspace: Any, conda: bool = False, auto_reload: bool = False
    ) -> CoroutineFuture[None]:
        """Not for a proc mesh, as in Monarch: awaiting it (or ``get()``) raises
        ``NotImplementedError``; ship code to hosts with ``regency.job.sync_workspace``."""
        return CoroutineFuture._failed(
            NotImplementedError(
                "sync_workspace is not implemented for ProcMesh. Use HostMesh.sync_workspace "
                "instead (in regency: regency.job.sync_workspace(host_mesh, local_dir))"
            )
        )

    # The tensor engine supplies these (see ``_tensor_api``).
    def activate(self) -> contextlib.AbstractContextManager[ProcMesh]:
        """``with procs.activate():`` torch ops in the block run on this mesh's workers."""
        manager: contextlib.AbstractContextManager[ProcMesh] = _hooks.tensor.load().activate(self)
        return manager

    def rank_tensor(self, dims: str | Sequence[str]) -> Any:
        """A mesh tensor of each proc's coordinate(s) along ``dims``."""
        return _hooks.tensor.load().rank_tensor(self, dims)

    def rank_tensors(self) -> Any:
        """``{dim: rank_tensor(dim)}`` for every dimension."""
        return _hooks.tensor.load().rank_tensors(self)

    def process_group(self, dims: str | Sequence[str]) -> Any:
        """This mesh's ``torch.distributed`` group along ``dims``, for remote functions."""
        return _hooks.tensor.load().process_group(self, dims)

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


def this_proc_mesh() -> ProcMesh:
    """The singleton proc mesh of the calling process."""
    rt = state.runtime()
    agent = state.host_agent_address()
    info = ProcInfo(rt.address, agent, 0, 0)
    return ProcMesh(Shape.unity(), [info], "this_proc", None, owned=False)


carry_secret(HostMesh, ProcMesh, ActorMesh)


def this_host_mesh() -> HostMesh:
    """The host the calling process runs on, as a 0-dimensional mesh (as in Monarch).

    In a proc it is the point of the host mesh the proc was spawned through, over that mesh's
    hosts (as in Monarch), so ``_new_with_shape`` can select by the host's rank in it.
    """
    state.runtime()
    agent = state.host_agent_address()
    agents = state.host_mesh_agents()
    python = inherited_python()
    if agent not in agents:
        return HostMesh(Shape.unity(), [HostInfo(agent)], owned=True, python=python)
    here = Shape([], Slice(offset=agents.index(agent), sizes=[], strides=[]))
    return HostMesh(here, [HostInfo(a) for a in agents], owned=True, python=python)


def current_context() -> context.Context:
    """The running actor's context (the root client's outside any actor)."""
    ctx = context.current_or_none()
    if ctx is not None:
        return ctx
    return context.Context(context.client())
