"""Actor meshes: the user's handle on a mesh of actors of one class (endpoints as attributes),
and the recipe that spawns (and re-spawns) its actors on their procs."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from regency import _hooks, config
from regency._config_keys import CONNECT_TIMEOUT
from regency._errors import RegencyError
from regency._runtime.actors.base.endpoint_def import (
    ArgumentCheck,
    EndpointSpec,
    endpoints_of,
)
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.base.identity import (
    CreatorInstance,
    InstanceBase,
    new_uid,
)
from regency._runtime.actors.base.mesh_trait import MeshTrait, ProcMeshBase
from regency._runtime.actors.control.control import ProcInfo, SpawnActor, StopActor
from regency._runtime.actors.meshes.endpoint import (
    Endpoint,
    NotAnEndpoint,
    YieldsToEndpoint,
)
from regency._runtime.actors.meshes.proc_control import (
    ProcRecipe,
    after,
    new_proc_address,
    open_countdown,
    start_procs,
    stop_procs,
    unique,
)
from regency._runtime.actors.meshes.send_pipeline import SendPipeline
from regency._runtime.actors.observe import tracing
from regency._runtime.actors.supervision.mesh_supervisor import MeshSupervisor
from regency._runtime.actors.supervision.supervision import RestartPolicy
from regency._runtime.kernel import codec, state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.refs import PortRef
from regency.shape import Shape

T = TypeVar("T")

# Mesh attributes Monarch does not have: an endpoint of the same name replaces them on the mesh.
_YIELDING = ("shape", "restarts", "restarted")


class NotOwnedError(RegencyError, RuntimeError, ValueError):
    """Only a mesh's owner (its spawner, through the object it got) may stop it."""


@dataclass(frozen=True, slots=True)
class ActorSpawn:
    """Everything needed to create (and re-create) the actors of one mesh."""

    mesh_id: int
    name: str
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    creator: CreatorInstance
    class_name: str  # module.qualname, known before the proc unpickles the class
    payload: bytes  # pickled by value (cls, args, kwargs, proc_mesh)
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
            elif old.addr not in rt.losses.dead:
                with contextlib.suppress(PeerLostError):
                    rt.send_control(
                        old.addr,
                        wire.SERVICE_PROC,
                        StopActor(self.mesh_id, "restarting", None),
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
        tracker, status = open_countdown(len(fresh), addrs, f"restarting {self.name}")
        for rank, info in fresh:
            supervisor.replaced(rank, info)
            self.send(info.addr, rank, status, supervisor.port)
        if tracker.pending.wait(config.value(CONNECT_TIMEOUT) * 2) and (
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
        proc_mesh: ProcMeshBase | None,
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
        # How this view's endpoints send: the one object they talk to.
        self._pipeline = SendPipeline(cls, name, shape, self._procs, mesh_id, proc_mesh)
        self._endpoint_specs = _endpoint_table(cls)
        for attr in _YIELDING:
            if attr in self._endpoint_specs:
                spec, checker = self._endpoint_specs[attr]
                self.__dict__[attr] = Endpoint(self._pipeline, attr, spec, checker)

    @property
    def _supervisor(self) -> MeshSupervisor | None:
        """Per-rank health and restarts: set on the owner's mesh and its views."""
        return self._pipeline.supervisor

    @_supervisor.setter
    def _supervisor(self, supervisor: MeshSupervisor | None) -> None:
        self._pipeline.supervisor = supervisor

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
            # Kept as an attribute: the next ``mesh.name`` finds it without coming here.
            endpoint = self.__dict__[name] = Endpoint(self._pipeline, name, spec, checker)
            return endpoint
        cls = self.__dict__.get("_class")
        if cls is not None and callable(getattr(cls, name, None)) and not name.startswith("_"):
            return NotAnEndpoint(self._pipeline, name)
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
        addrs = [a for a in unique(self._procs[b].addr for b in self._shape.ranks())]
        live = [a for a in addrs if a not in rt.losses.dead]
        tracker, port = open_countdown(len(live), live, f"stopping {self._name}")
        for addr in live:
            rt.send_control(addr, wire.SERVICE_PROC, StopActor(self._mesh_id, reason, port))
        if replacements:
            # Procs started by restarts belong to this mesh alone: they go with it.
            return after(
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
    proc_mesh: ProcMeshBase | None,
) -> ActorMesh[Any]:
    return ActorMesh(cls, name, shape, procs, mesh_id, proc_mesh, owned=False)


def spawn_actor_mesh(
    proc_mesh: ProcMeshBase,
    shape: Shape,
    proc_list: Sequence[ProcInfo],
    recipe: ProcRecipe,
    name: str,
    cls: type,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    policy: RestartPolicy | None,
    owner: InstanceBase,
) -> tuple[ActorMesh[Any], MeshSupervisor]:
    """Ask every proc of ``shape`` to create its ``cls(*args, **kwargs)`` actor of a new mesh
    ``name``; returns at once, with the mesh and its supervisor (not yet watching)."""
    extent = shape.extent
    # The actor mesh gets its own copy of the proc list: restarts move its ranks.
    procs = list(proc_list)
    payload, carried = codec.dumps_by_value_carrying((cls, args, kwargs, proc_mesh))
    mesh: ActorMesh[Any] = ActorMesh(cls, name, shape, procs, new_uid(), proc_mesh, owned=True)
    if carried:
        # Mesh tensors among the constructor's arguments: each rank gets its own shard, handed
        # over by the tensor engine (which checks the ranks, or raises) before the spawn goes.
        if policy is not None:
            raise ValueError(
                f"spawning {name!r}: a mesh tensor constructor argument cannot be combined "
                "with a restart policy (a restarted actor has no shard to receive)"
            )
        _hooks.tensor.load().before_actor_send(carried, mesh._pipeline, shape.ranks())
    spawn = ActorSpawn(
        mesh._mesh_id,
        name,
        tuple(extent.labels),
        tuple(extent.sizes),
        owner.as_creator(),
        f"{cls.__module__}.{cls.__qualname__}",
        payload,
        recipe,
    )
    supervisor = MeshSupervisor(
        owner,
        spawn.mesh_id,
        name,
        f"{cls.__module__}.{cls.__qualname__}",
        extent,
        shape.ranks(),
        procs,
        policy,
        spawn.respawn,
    )
    if tracing.probe is not None:
        view = shape.ndslice
        tracing.mesh_created(
            spawn.mesh_id,
            f"Python<{cls.__name__}>",
            name,
            extent.labels,
            extent.sizes,
            tracing.entity_id(f"proc:{proc_list[0].addr}") if proc_list else None,
            tracing.region_json(shape.labels, view.offset, view.sizes, view.strides),
        )
    addrs = [proc_list[b].addr for b in shape.ranks()]
    tracker, status = open_countdown(len(addrs), unique(addrs), f"spawning {name}")
    for rank, addr in enumerate(addrs):
        # A dead proc cannot host the rank: its watch fails it (and `initialized`).
        with contextlib.suppress(PeerLostError):
            spawn.send(addr, rank, status, supervisor.port)
    mesh._status = Future._from_pending(tracker.pending)
    mesh._supervisor = supervisor
    supervisor.mesh = mesh
    return mesh, supervisor
