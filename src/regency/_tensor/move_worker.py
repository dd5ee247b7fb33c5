"""Worker side of ``Tensor.to_mesh``: this rank's part of one ``Move`` command.

Every rank of a pair sends (or receives) the shard and a one-byte flag saying whether the shard
was computed: a receiver of a poisoned shard then poisons its output instead of waiting for data
that will never come. The point-to-point ops run through :mod:`regency._tensor.collectives` on
a process group of the whole world kept for moves (one per stream), so they never interleave
with a reduction's collectives.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

import torch

from regency._tensor import buffers
from regency._tensor.commands import Ref
from regency._tensor.reduce_worker import world
from regency._tensor.table import TABLE, Poisoned, PoisonedInputError, poison, resolve

if TYPE_CHECKING:
    from regency._tensor import commands as c


def run_move(cmd: c.Move, world_rank: int, tag: str = "") -> None:
    """Do this rank's sends and receive of ``cmd`` (stream ``tag``); a failure poisons the
    output here."""
    rank = cmd.offset + world_rank  # this worker's rank in the pairs
    sends = [dst for src, dst in cmd.pairs if src == rank and dst != rank]
    source = next((src for src, dst in cmd.pairs if dst == rank), None)
    shard: torch.Tensor | None = None
    if sends or source == rank:
        try:
            shard = resolve(Ref(cmd.src))
        except PoisonedInputError as bad:
            if source == rank:
                poison((cmd.out,), bad.poison)
    if source == rank and shard is not None:
        TABLE[cmd.out] = buffers.copy(shard)
    if all(src == dst for src, dst in cmd.pairs):
        return
    try:
        _exchange(cmd, shard, sends, None if source == rank else source, rank, tag)
    except Exception:
        if source is not None and source != rank:
            poison((cmd.out,), Poisoned(cmd.site, world_rank, traceback.format_exc()))


def _exchange(
    cmd: c.Move,
    shard: torch.Tensor | None,
    sends: list[int],
    source: int | None,
    rank: int,
    tag: str,
) -> None:
    from regency._tensor.collectives import exchange

    link = cmd.link
    if link is None:
        group = world().group(range(torch.distributed.get_world_size()), f"to_mesh:{tag}")
    else:
        group = world().link(link.host, link.port, sum(link.sizes), link.name, rank)
    # A poisoned shard sends zeros: its receivers learn from the flag that it failed.
    data = torch.zeros(cmd.size, dtype=cmd.dtype, device=cmd.device) if shard is None else shard
    flag = torch.tensor([shard is not None], dtype=torch.uint8, device=cmd.device)
    outgoing = [pair for dst in sends for pair in ((flag, dst), (data, dst))]
    if source is None:
        exchange(outgoing, [], group)
        return
    into = buffers.empty(cmd.size, cmd.dtype, cmd.device)
    got = torch.zeros(1, dtype=torch.uint8, device=cmd.device)
    exchange(outgoing, [(got, source), (into, source)], group)
    if got.item():
        TABLE[cmd.out] = into
    else:
        poison(
            (cmd.out,),
            Poisoned(
                cmd.site,
                rank - cmd.offset,
                f"to_mesh: the shard sent from {_whose(source, cmd)} had failed to compute"
                " (its own error was reported there)",
            ),
        )


def _whose(rank: int, cmd: c.Move) -> str:
    """Rank ``rank`` of ``cmd``'s pairs, in words."""
    if cmd.link is None:
        return f"world rank {rank}"
    first = cmd.link.sizes[0]
    return f"world rank {rank if rank < first else rank - first} of the other proc mesh"
