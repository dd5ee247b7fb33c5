"""Worker side of ``Tensor.reduce``: the world setup and the reduce command.

The collectives themselves (``torch.distributed`` groups, gloo/NCCL calls) live in
:mod:`regency._tensor.collectives`; this module only resolves refs and records results.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

from regency._tensor.commands import Ref
from regency._tensor.table import GROUPS, TABLE, Poisoned, PoisonedInputError, poison, resolve

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from regency._tensor import commands as c
    from regency._tensor.collectives import WorldGroups

_world: list[WorldGroups] = []


def world() -> WorldGroups:
    """This process's ``WorldGroups`` (made on first use)."""
    if not _world:
        from regency._tensor.collectives import WorldGroups

        _world.append(WorldGroups())
    return _world[0]


def init_world(cmd: c.InitWorld, rank: int) -> None:
    """Join the world group (idempotent in ``WorldGroups``)."""
    world().init_world(cmd.host, cmd.port, rank, cmd.world_size, cmd.backend)


def run_reduce(cmd: c.Reduce, rank: int) -> None:
    """Reduce ``cmd.src`` over this rank's group; a failure poisons the output."""
    from regency._tensor import collectives

    try:
        tensor = resolve(Ref(cmd.src))
    except PoisonedInputError as bad:
        poison((cmd.out,), bad.poison)
        return
    try:
        group = group_for(cmd.groups, rank)
        run = collectives.reduce_ if cmd.inplace else collectives.reduce
        TABLE[cmd.out] = run(tensor, cmd.reduction, group, cmd.scatter)
    except Exception:
        poison((cmd.out,), Poisoned(cmd.site, rank, traceback.format_exc()))


def group_for(groups: tuple[tuple[int, ...], ...], rank: int) -> ProcessGroup:
    """The process group of the one of ``groups`` that has ``rank``."""
    group: ProcessGroup = world().group(next(g for g in groups if rank in g))
    return group


GROUPS.append(group_for)
