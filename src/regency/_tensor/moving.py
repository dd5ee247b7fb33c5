"""``Tensor.to_mesh`` on the controller: check the meshes, pair the procs, issue the commands.

The pairs come from :mod:`regency._tensor.groups` (dims match by name, a dim only the
destination has is a broadcast); the workers move the data point to point
(:mod:`regency._tensor.move_worker`), never through the controller. Within one proc mesh the
moves use its ``torch.distributed`` world; between two proc meshes, a link group spanning both
(gloo), made on their first move.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.engine import Root, View, new_ref
from regency._tensor.meta import TensorMeta
from regency._tensor.reducing import ensure_world
from regency.actor import ProcMesh

if TYPE_CHECKING:
    from regency._tensor.streams import Stream

_links: dict[tuple[int, int, str], tuple[c.Link, dict[int, int]]] = {}
"""(root ids in either order, stream) -> the link and each root's first rank in it."""
_link_ids = itertools.count()


def plan_move(
    source: View, src: int, meta: TensorMeta, stream: Stream, mesh: Any
) -> tuple[TensorMeta, int, View]:
    """Issue the copy of ref ``src``'s shards on the procs of ``source`` to the procs of
    ``mesh`` (a view of the same or of another proc mesh), on ``stream``; the output's
    metadata (contiguous), ref and view.

    Shapes that do not match raise ``ValueError``, something other than a proc mesh
    ``TypeError``, and a CUDA tensor between two proc meshes ``NotImplementedError``, all
    before anything is sent.
    """
    from regency._tensor.groups import move_pairs

    if not isinstance(mesh, ProcMesh):
        raise TypeError(f"to_mesh needs a proc mesh (or a view of one), not {mesh!r}")
    root = source.root
    if mesh._procs is root.procs:
        dest = View(mesh)
        pairs = move_pairs(source.shape, dest.shape)
        out = new_ref()
        cmd = c.Move(src, out, pairs, meta.shape, meta.dtype, meta.device, sites.capture())
        if all(s == d for s, d in pairs):
            # Every proc keeps its own shard: a local copy, no process group.
            root.append(dest.shape, cmd, stream.key)
        else:
            # Every proc of the world gets the command: the point-to-point group of a stream
            # is made on first use by all the world's ranks (a gloo group's creation waits for
            # all of them).
            ensure_world(root, meta.device, stream.key)
            root.append(root.everyone, cmd, stream.key)
    else:
        pairs = move_pairs(source.shape, mesh._shape)  # before the other mesh gets workers
        if meta.device.type != "cpu":
            raise NotImplementedError(
                f"to_mesh of a {meta.device.type} tensor to another proc mesh is not built "
                "(only CPU tensors move between proc meshes, over gloo)"
            )
        dest = View(mesh)
        out = _between(root, dest.root, pairs, (src, meta), stream)
    return TensorMeta.contiguous(meta.shape, meta.dtype, meta.device), out, dest


def _between(
    root: Root,
    other: Root,
    pairs: tuple[tuple[int, int], ...],
    value: tuple[int, TensorMeta],
    stream: Stream,
) -> int:
    """Send the ``Move`` of ``pairs`` (world ranks of ``root``, then of ``other``) to every
    proc of both meshes, in their link's ranks; the output's ref."""
    src, meta = value
    link, offsets = _link(root, other, stream.key)
    ours, theirs = offsets[id(root)], offsets[id(other)]
    linked = tuple((ours + s, theirs + d) for s, d in pairs)
    out = new_ref()
    site = sites.capture()
    for mesh, offset in ((root, ours), (other, theirs)):
        cmd = c.Move(src, out, linked, meta.shape, meta.dtype, meta.device, site, link, offset)
        mesh.append(mesh.everyone, cmd, stream.key)
        # At once: the other mesh's procs wait in the move for this one's.
        mesh.flush()
    return out


def _link(root: Root, other: Root, stream: str) -> tuple[c.Link, dict[int, int]]:
    """The link group of ``root`` and ``other`` for ``stream`` (its store opened on world rank
    0 of ``root`` on first use) and each root's first rank in it."""
    found = _links.get((id(root), id(other), stream)) or _links.get((id(other), id(root), stream))
    if found is None:
        root.flush_all()
        host, port = root.worker_at(0).open_store.call_one().get()
        name = f"regency-link:{next(_link_ids)}:{stream}"
        found = (
            c.Link(host, port, (root.size, other.size), name),
            {id(root): 0, id(other): root.size},
        )
        _links[(id(root), id(other), stream)] = found
    return found
