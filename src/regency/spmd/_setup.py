"""``setup_torch_elastic_env``: torchrun's variables in every proc of a mesh."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from regency.shape import Point
from regency.spmd._actor import SPMDActor
from regency.spmd._env import check_master

if TYPE_CHECKING:
    from regency.actor import ProcMesh

_ACTOR_NAME = "_SPMDActor"


def rank0(actors: Any) -> SPMDActor:
    """The view of ``actors`` (an actor mesh) holding only rank 0."""
    extent = actors.extent
    if not extent.labels:
        return actors  # type: ignore[no-any-return]
    return actors.slice(**dict(Point(0, extent)))  # type: ignore[no-any-return]


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: bool | None = None,
) -> None:
    """Set torchrun's environment variables in every proc of ``proc_mesh``.

    Each proc gets ``RANK`` (its flat rank), ``LOCAL_RANK`` (its coordinate on the mesh's last
    dimension), ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_RANK``,
    ``ROLE_WORLD_SIZE``, ``ROLE_NAME="rank"``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``. Without ``master_addr`` and ``master_port`` the master is rank 0's host
    with a free port there (``use_ipaddr`` as in ``SPMDActor.get_host_port``); giving only one of
    them raises ``ValueError``. Spawns an ``SPMDActor`` mesh on ``proc_mesh`` and returns once
    every proc has its variables; ``torch.distributed.init_process_group()`` then works there
    with its defaults (``init_method="env://"``).
    """
    check_master(master_addr, master_port)
    actors = proc_mesh.spawn(_ACTOR_NAME, SPMDActor)
    if master_addr is None or master_port is None:
        master_addr, master_port = rank0(actors).get_host_port.call_one(use_ipaddr).get()
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: bool | None = None,
) -> None:
    """``setup_torch_elastic_env`` for asyncio code: awaits instead of blocking the loop."""
    check_master(master_addr, master_port)
    actors = proc_mesh.spawn(_ACTOR_NAME, SPMDActor)
    if master_addr is None or master_port is None:
        master_addr, master_port = await rank0(actors).get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)
