"""Controller side of actors and tensors (issue 15 part 9): mesh tensors passed to actor
endpoints, and ``endpoint.rref``. The worker side, and why no wait there can hang, is
:mod:`regency._tensor.handoff`.

A mesh tensor pickled into an actor call becomes a slot number (``MeshTensor.__reduce_ex__``
hands it to the send pipeline through ``carry``). Before the message goes out,
:func:`before_actor_send` checks that every receiving rank has a shard (the actors run on the
tensor's own proc mesh, on procs of its view) and queues a ``Publish`` of the shards on the
tensor's stream, to exactly those procs, and sends it: the actor's wait is then only for the
stream's earlier work.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Sequence
from typing import Any

import torch.utils._pytree as pytree

from regency._lowlevel import FLAG_ERROR, Part, PeerLostError, PortRef, runtime
from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.access import check_readable
from regency._tensor.engine import Root, View, new_ref
from regency._tensor.handoff import RREF_KEY, ResultSlot
from regency._tensor.mesh_tensor import MeshTensor
from regency._tensor.meta import TensorMeta, describe, fake_mode, fake_of
from regency._tensor.streams import get_active_stream
from regency.shape import Shape, Slice

_described: dict[tuple[int, Shape], int] = {}
"""(root id, procs) -> how many controller call sites those procs were told of."""


def before_actor_send(carried: Sequence[Any], pipeline: Any, bases: Sequence[int]) -> None:
    """Hand the shards of the mesh tensors ``carried`` (``(tensor, slot)`` pairs, pickled into
    an actor call) to the actors at root ranks ``bases`` of ``pipeline``'s mesh.

    Raises ``ValueError`` if the actors do not run on the tensor's proc mesh, or on a proc
    where it has no shard, and ``TypeError`` for a tensor that may not be read now; nothing is
    sent then.
    """
    route = pipeline.route()
    addrs = dict(zip(route.bases, route.addrs, strict=True))
    groups: dict[tuple[int, str], tuple[Root, list[tuple[int, int]]]] = {}
    for tensor, slot in carried:
        _check_receivers(tensor, pipeline, bases, addrs)
        check_readable(tensor)
        root = tensor._view.root
        key = (id(root), tensor._stream.key)
        groups.setdefault(key, (root, []))[1].append((tensor._ref, slot))
    shape = pipeline.shape if len(bases) == len(pipeline.shape) else _ranks_shape(bases)
    site = sites.capture()
    roots = {}
    for (_, stream), (root, pairs) in groups.items():
        root.append(shape, c.Publish(tuple(pairs), site, _new_sites(root, shape)), stream)
        roots[id(root)] = root
    for root in roots.values():
        root.flush_all()


def _check_receivers(
    tensor: MeshTensor, pipeline: Any, bases: Sequence[int], addrs: dict[int, str]
) -> None:
    root = tensor._view.root
    proc_mesh = pipeline.proc_mesh
    if proc_mesh is None or proc_mesh._procs is not root.procs:
        raise ValueError(
            "Tensors sent to an actor must be located on the same process as the actor. "
            f"However {tensor!r} was passed to actor mesh {pipeline.mesh_name!r}, which runs "
            f"on {proc_mesh!r}, not on the tensor's proc mesh (move it with t.to_mesh(...))"
        )
    held = set(tensor._view.shape.ranks())
    missing = [b for b in bases if b not in held]
    if missing:
        raise ValueError(
            f"{tensor!r} has no shard on the procs of ranks {missing} of its proc mesh, where "
            f"actor mesh {pipeline.mesh_name!r} would receive it"
        )
    moved = [b for b in bases if addrs[b] != root.procs[b].addr]
    if moved:
        raise ValueError(
            f"the actors of ranks {moved} of {pipeline.mesh_name!r} were restarted on other "
            f"processes, where {tensor!r} has no shard"
        )


def _ranks_shape(bases: Sequence[int]) -> Shape:
    """The one proc of a call to a single rank (``call_one``, ``choose``)."""
    if len(bases) != 1:
        raise ValueError(f"a send to ranks {list(bases)} of no one mesh view")
    return Shape([], Slice(bases[0], [], []))


def _new_sites(root: Root, shape: Shape) -> dict[int, str]:
    """Descriptions of the call sites that the procs of ``shape`` were not told of yet (a
    poisoned shard's ``RemoteException`` in the actor names its site)."""
    key = (id(root), shape)
    told = _described.get(key, 0)
    known = sites.count()
    _described[key] = known
    return {site: sites.describe(site) for site in range(told, known)}


def actor_rref(
    pipeline: Any, name: str, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``endpoint.rref(*args, **kwargs)``: see ``Endpoint.rref``."""
    propagate = spec.propagate
    if propagate is None or propagate == "cached":
        raise NotImplementedError(
            "Cached propagation is not implemented for actor endpoints: give the endpoint "
            "@endpoint(propagate=fn), fn computing its results from fake tensors, or "
            'propagate="inspect" for no results'
        )
    if propagate == "mocked":
        raise NotImplementedError("mocked propagation")
    if propagate != "inspect" and not callable(propagate):
        raise ValueError(f"propagate must be a callable or 'inspect', not {propagate!r}")
    if pipeline.proc_mesh is None:
        raise ValueError(f"actor mesh {pipeline.mesh_name!r} runs on no proc mesh")
    view = View(pipeline.proc_mesh._new_with_shape(pipeline.shape))
    stream = get_active_stream()
    described = None if propagate == "inspect" else _propagated(propagate, args, kwargs)
    metas, spec_tree = pytree.tree_flatten(described)
    outs = [new_ref() if isinstance(m, TensorMeta) else None for m in metas]
    slot, site = new_ref(), sites.capture()
    bases = view.shape.ranks()
    # Learned here, not on the I/O thread that forwards failures (the first time it waits).
    ports = {base: view.root.handoff_port(base) for base in bases}
    addrs = pipeline.route().addrs
    replies = _RrefReplies(ports, bases, addrs, slot, site)
    reply = runtime().open_port(replies, watch=sorted(set(addrs)))
    replies.port = reply.port
    try:
        pipeline.post(name, spec.name, args, {**kwargs, RREF_KEY: ResultSlot(slot)}, reply)
    except BaseException:
        runtime().close_port(reply.port)
        raise
    refs = tuple(ref for ref in outs if ref is not None)
    expected = None
    if described is not None:
        expected = tuple((m.shape, m.dtype) for m in metas if isinstance(m, TensorMeta))
    view.root.append(view.shape, c.Collect(slot, refs, expected, site), stream.key)
    results = [
        MeshTensor._make(m, ref, view, stream) if ref is not None else m
        for m, ref in zip(metas, outs, strict=True)
    ]
    return pytree.tree_unflatten(results, spec_tree)


def _propagated(propagate: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What ``propagate`` returns for fake versions of the call's arguments, as metadata."""
    with fake_mode():  # also inside activate(): the fakes are not made on the workers
        fakes = pytree.tree_map_only(MeshTensor, lambda t: fake_of(t._meta), (args, kwargs))
        return describe(propagate(*fakes[0], **fakes[1]))


class _RrefReplies:
    """The replies of an ``rref`` call, on the controller's I/O thread: a rank whose call
    failed (the endpoint raised, the actor had failed or stopped, ...) has the failure
    forwarded to its process's handoff port (``ports``, by root rank), where the stream's
    ``Collect`` waits for it. The port closes once every rank replied or its process is gone
    (which takes the stream waiting there with it)."""

    def __init__(
        self, ports: dict[int, PortRef], bases: list[int], addrs: list[str], slot: int, site: int
    ) -> None:
        self._ports = ports
        self._bases = bases
        self._addrs = addrs
        self._slot = slot
        self._site = site
        self._waiting = set(range(len(bases)))
        self.port = -1
        """This handler's port."""

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """One rank's reply; a failure goes on to that rank's process."""
        if flags & FLAG_ERROR:
            # The error as it came (decoded by the stream there, never on this I/O thread:
            # unpickling a user's exception may import the user's modules).
            base = self._bases[rank]
            head = pickle.dumps((self._slot, self._site, base), protocol=5)
            with contextlib.suppress(PeerLostError):  # gone: so is the stream waiting there
                runtime().send_port(self._ports[base], 0, 0, [head, *parts])
        self._done({rank})

    def peer_lost(self, addr: str, reason: str) -> None:
        """The ranks there will not reply."""
        self._done({i for i, a in enumerate(self._addrs) if a == addr})

    def _done(self, ranks: set[int]) -> None:
        if self._waiting:
            self._waiting -= ranks
            if not self._waiting:
                runtime().close_port(self.port, sorted(set(self._addrs)))
