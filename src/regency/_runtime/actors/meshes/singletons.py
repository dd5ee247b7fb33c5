"""``get_or_spawn_controller``: named singleton actors living in the root controller's process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from regency._runtime.actors.base import context
from regency._runtime.actors.base.errors import SupervisionError
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.base.identity import InstanceBase, new_uid
from regency._runtime.actors.control.control import GetSingleton
from regency._runtime.actors.meshes.meshes import ProcMesh, this_proc_mesh
from regency._runtime.actors.supervision.supervision import MeshFailure
from regency._runtime.kernel import codec, state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef


class _Reply:
    def __init__(self) -> None:
        self.pending = Pending()
        self.port = -1
        self._watch: list[str] = []

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        self.pending.set_raw(parts, bool(flags & wire.FLAG_ERROR))
        state.runtime().close_port(self.port)

    def peer_lost(self, addr: str, reason: str) -> None:
        self.pending.set_exception(
            SupervisionError(f"get_or_spawn_controller: the root controller is gone: {reason}")
        )


class SingletonRegistry(InstanceBase):
    """The root's registry: spawns each named controller once, on the root's own proc.

    It owns the controllers it spawns: a controller's failure is recorded here (later lookups
    of that name raise ``SupervisionError``) and handled, not escalated to the fault hook.
    """

    def __init__(self) -> None:
        super().__init__()
        # It acts for the root, so the controllers it spawns name the root as their creator.
        self.uid = new_uid()
        self.name = "root"
        self.class_name = None
        self.rank = context.empty_point()
        self.creator = None
        self.proc_id = state.runtime().address
        self._meshes: dict[str, Any] = {}
        self._failures: dict[str, MeshFailure] = {}
        self._lock = threading.Lock()

    @property
    def proc_mesh(self) -> ProcMesh:
        """The root's own proc, where the controllers run."""
        return this_proc_mesh()

    def supervise(self, notice: Any) -> None:
        """Record a controller's failure (a restart notice needs nothing)."""
        if isinstance(notice, MeshFailure) and not notice.restarting:
            with self._lock:
                self._failures.setdefault(notice.mesh_name, notice)

    def handle(self, request: GetSingleton) -> None:
        """Service entry point: a :class:`GetSingleton`."""
        name, payload, reply = request.name, request.payload, request.reply
        runtime = state.runtime()
        try:
            with self._lock:
                failure = self._failures.get(name)
            if failure is not None:
                raise SupervisionError(
                    f"get_or_spawn_controller({name!r}): the controller has failed: "
                    f"{failure.report()}"
                )
            mesh = self._meshes.get(name)
            if mesh is None:
                cls, args, kwargs = codec.loads([payload])
                mesh = this_proc_mesh()._spawn_owned(name, cls, args, kwargs, owner=self)
                self._meshes[name] = mesh
            parts = codec.dumps(mesh)
            flags = 0
        except Exception as exc:
            parts = codec.dumps(exc)
            flags = wire.FLAG_ERROR
        with contextlib.suppress(PeerLostError):
            runtime.send_port(reply, 0, flags, parts)


def get_or_spawn_controller(name: str, Class: type, *args: Any, **kwargs: Any) -> Future[Any]:  # noqa: N803
    """The actor mesh of the singleton ``name``, spawning ``Class(*args, **kwargs)`` on first use.

    The singleton lives in the root controller's process; concurrent first calls from anywhere
    in the job get the same actor.
    """
    runtime = state.runtime()
    handler = _Reply()
    ref: PortRef = runtime.open_port(handler)
    handler.port = ref.port
    payload = codec.dumps_by_value((Class, args, kwargs))
    try:
        runtime.send_control(
            state.root_address(), wire.SERVICE_SINGLETONS, GetSingleton(name, payload, ref)
        )
    except PeerLostError as exc:
        handler.peer_lost(state.root_address(), str(exc))
    return Future._from_pending(handler.pending)
