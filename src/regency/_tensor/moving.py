"""``Tensor.to_mesh`` on the controller: check the meshes, pair the procs, issue one command.

The pairs come from :mod:`regency._tensor.groups` (dims match by name, a dim only the
destination has is a broadcast); the workers move the data point to point
(:mod:`regency._tensor.move_worker`), never through the controller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.engine import View, new_ref
from regency._tensor.meta import TensorMeta
from regency._tensor.reducing import ensure_world

if TYPE_CHECKING:
    from regency._tensor.streams import Stream


def plan_move(
    source: View, src: int, meta: TensorMeta, stream: Stream, mesh: Any
) -> tuple[TensorMeta, int, View]:
    """Issue the copy of ref ``src``'s shards on the procs of ``source`` to the procs of
    ``mesh``, on ``stream``; the output's metadata (contiguous), ref and view.

    ``mesh`` must be a view of the same proc mesh as ``source`` (``TypeError`` ``WRONG_MESH``
    otherwise); shapes that do not match raise ``ValueError``; both before anything is sent.
    """
    from regency._tensor.groups import move_pairs

    root = source.root
    if getattr(mesh, "_procs", None) is not root.procs:
        raise TypeError(
            f"WRONG_MESH: to_mesh({mesh!r}) of a tensor on {source.mesh!r}: both must be views"
            " of one proc mesh (a tensor cannot move between separately spawned proc meshes)"
        )
    dest = View(mesh)
    pairs = move_pairs(source.shape, dest.shape)
    out = new_ref()
    cmd = c.Move(src, out, pairs, meta.shape, meta.dtype, meta.device, sites.capture())
    if all(s == d for s, d in pairs):
        # Every proc keeps its own shard: a local copy, no process group.
        root.append(dest.shape, cmd, stream.key)
    else:
        # Every proc of the world gets the command: the point-to-point group of a stream is
        # made on first use by all the world's ranks (a gloo group's creation waits for all).
        ensure_world(root, meta.device, stream.key)
        root.append(root.everyone, cmd, stream.key)
    return TensorMeta.contiguous(meta.shape, meta.dtype, meta.device), out, dest
