"""Worker-side collectives of the tensor engine, on ``torch.distributed`` only.

One `WorldGroups` per worker process holds the world process group (gloo on CPU, NCCL on CUDA,
or a per-device mix such as ``"cpu:gloo,cuda:nccl"``) and the sub groups that reductions over
mesh views need. A sub group is created by its member ranks only, when one of them first uses
it: the controller sends a reduction only to the procs of the view that reduces, so the other
procs never hear of the group.

`reduce` and `reduce_` run Monarch's reductions (see `regency._tensor.groups` for the shapes):
``stack`` is an all-gather (an all-to-all with ``scatter``), the others an all-reduce (a
reduce-scatter with ``scatter``). What a backend lacks maps onto torch ops: ``avg`` is a sum
then a division (gloo has no average), ``band``/``bor``/``bxor`` on NCCL gather the inputs and
reduce them locally.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from regency._lowlevel import runtime
from regency._tensor import buffers
from regency._tensor.groups import reduce_output_size
from regency._transport import address

_BITWISE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
# The reductions a backend runs itself; the others are composed from torch ops below. avg is
# a sum then a division on NCCL too, so that one integer average (truncating) holds everywhere.
_PORTABLE = frozenset({"sum", "product", "min", "max"})
_NATIVE = {"gloo": _PORTABLE | {"band", "bor", "bxor"}}
# A not-in-place all-reduce of at least _OVERLAP_MIN_BYTES * 2 copies its input in up to
# _OVERLAP_PIECES pieces, each reduced while the next is copied (_copy_all_reduce).
_OVERLAP_PIECES = 2
_OVERLAP_MIN_BYTES = 1 << 20


class WorldGroups:
    """This worker process's world process group and the sub groups of it, by world ranks.

    `group` may be called from several threads at once: each sub group is created once, and
    creating one does not wait for the creation of another (a gloo group's creation blocks until
    all its members join, so one lock around all creations could deadlock ranks that create
    overlapping groups in different orders).
    """

    # TCPStore servers this process opened; the store lives as long as the world it serves.
    _servers: ClassVar[list[TCPStore]] = []

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._world: tuple[str, int, int, int, str] | None = None
        self._store: Store | None = None
        self._groups: dict[tuple[tuple[int, ...], str], dist.ProcessGroup] = {}
        self._creating: dict[tuple[tuple[int, ...], str], threading.Lock] = {}

    @staticmethod
    def open_store() -> tuple[str, int]:
        """Start a TCPStore server on a free port and return ``(host, port)`` to reach it at.

        Called on world rank 0 only. The host is the address the other procs reach this proc by
        (the loopback address for a proc on this machine); the server stays up for the life of
        this process.
        """
        proc = runtime().address
        host = address.tcp_host(proc) if address.is_tcp(proc) else "127.0.0.1"
        server = TCPStore(host, 0, is_master=True, wait_for_workers=False)
        WorldGroups._servers.append(server)
        return host, server.port

    def init_world(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        """Join the world process group through the store at ``host:port``, as ``rank``.

        Blocks until every rank of the world has joined. A second call with the same arguments
        does nothing; one with other arguments, or in a process whose default process group
        something else created, raises ``RuntimeError``.
        """
        wanted = (host, port, rank, world_size, backend)
        with self._lock:
            if self._world == wanted:
                return
            if self._world is not None:
                raise RuntimeError(f"world already set up as {self._world}, not {wanted}")
            if dist.is_initialized():
                raise RuntimeError(
                    "this process already has a torch.distributed default process group that"
                    " regency did not create; the tensor engine cannot set up its own world"
                )
            store = TCPStore(host, port, is_master=False)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
            self._store, self._world = store, wanted

    def group(self, ranks: Sequence[int], tag: str = "") -> dist.ProcessGroup:
        """The process group of world ranks ``ranks``, in that order (group rank ``i`` is
        ``ranks[i]``), created on first use by the member ranks only and then cached.

        This rank must be one of ``ranks``. All ranks of the world in rank order give the world
        group. A different ``tag`` gives a separate group of the same ranks, for a second thread
        of collectives that must not interleave with the first (collectives on one group are
        matched by the order each rank issues them).
        """
        key = (tuple(ranks), tag)
        found = self._groups.get(key)
        if found is not None:
            return found
        if self._world is None:
            raise RuntimeError("init_world must run before a process group is used")
        me, world_size = dist.get_rank(), dist.get_world_size()
        if me not in key[0]:
            raise ValueError(f"rank {me} is not a member of the group of ranks {list(key[0])}")
        if not tag and key[0] == tuple(range(world_size)):
            world = c10d._get_default_group()
            self._groups[key] = world
            return world
        with self._lock:
            creating = self._creating.setdefault(key, threading.Lock())
        with creating:
            found = self._groups.get(key)
            if found is None:
                found = self._new_group(key[0], tag)
                self._groups[key] = found
            return found

    def link(self, host: str, port: int, size: int, name: str, rank: int) -> dist.ProcessGroup:
        """The gloo group ``name`` of ``size`` ranks meeting in the store at ``host:port``, in
        which this process is ``rank``; made on first use (blocking until all ``size`` join),
        then cached. Needs no world: it spans processes of different worlds (two proc meshes).

        Its ranks double as the "world" ranks `exchange` takes for it.
        """
        key = ((), name)
        with self._lock:
            creating = self._creating.setdefault(key, threading.Lock())
        with creating:
            found = self._groups.get(key)
            if found is None:
                store = PrefixStore(f"{name}/", TCPStore(host, port, is_master=False))
                found = dist.ProcessGroup(store, rank, size)
                gloo = dist.ProcessGroupGloo(store, rank, size, c10d.default_pg_timeout)
                found._register_backend(
                    torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo
                )
                found._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
                # What the point-to-point calls read to map "world" ranks onto group ranks.
                c10d._world.pg_group_ranks[found] = {r: r for r in range(size)}
                self._groups[key] = found
            return found

    def _new_group(self, ranks: tuple[int, ...], tag: str) -> dist.ProcessGroup:
        if len(set(ranks)) != len(ranks) or not all(0 <= r < dist.get_world_size() for r in ranks):
            raise ValueError(f"bad process group ranks {list(ranks)}")
        assert self._store is not None
        assert self._world is not None
        # torch's new_group() either needs every world rank to call it, or (with
        # use_local_synchronization) names the group by how many groups this process made
        # before, which differs between ranks that belong to different groups. A name derived
        # from the ranks alone lets exactly the members meet in the store.
        name = c10d.GroupName("regency:" + ",".join(map(str, ranks)) + (f":{tag}" if tag else ""))
        pg, _ = c10d._new_process_group_helper(
            len(ranks),
            ranks.index(dist.get_rank()),
            list(ranks),
            self._world[4],
            self._store,
            name,
            timeout=c10d._get_default_timeout(c10d.Backend(self._world[4])),
        )
        c10d._world.pg_group_ranks[pg] = {world: i for i, world in enumerate(ranks)}
        return pg  # type: ignore[no-any-return]


def _backend_of(t: torch.Tensor, group: dist.ProcessGroup) -> str:
    """The backend that runs ``group``'s collectives on ``t``'s device."""
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name
    per_device = dict(part.split(":") for part in name.split(","))
    return per_device.get(t.device.type, "")


def _check_dtype(t: torch.Tensor, reduction: str) -> None:
    if reduction in _BITWISE and (t.is_floating_point() or t.is_complex()):
        raise TypeError(f"{reduction} needs an integer or bool tensor, not {t.dtype}")
    if reduction == "avg" and t.dtype == torch.bool:
        raise TypeError("avg needs a numeric tensor, not torch.bool")


def _divide_(t: torch.Tensor, n: int) -> torch.Tensor:
    # An integer average truncates toward zero, as C's integer division does.
    if t.is_floating_point() or t.is_complex():
        return t.div_(n)
    return t.div_(n, rounding_mode="trunc")


def _all_gather(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's contiguous ``t``, stacked in group rank order."""
    # gloo splits the output along dim 0 into input-shaped chunks, NCCL only counts elements:
    # flat buffers satisfy both, for a 0-dim input too.
    out = buffers.empty((group.size() * t.numel(),), t.dtype, t.device)
    dist.all_gather_into_tensor(out, t.view(-1), group=group)
    return out.view(group.size(), *t.shape)


def _local_reduce(stacked: torch.Tensor, reduction: str) -> torch.Tensor:
    return functools.reduce(_BITWISE[reduction], stacked.unbind(0))


def _all_reduce(t: torch.Tensor, reduction: str, group: dist.ProcessGroup) -> torch.Tensor:
    """Reduce contiguous ``t`` across ``group`` in place; return it."""
    native = _NATIVE.get(_backend_of(t, group), _PORTABLE)
    n = group.size()
    if reduction in native:
        dist.all_reduce(t, op=_OPS[reduction], group=group)
    elif reduction == "avg":
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        _divide_(t, n)
    else:
        # The backend has no bitwise reduction op (NCCL): gather every rank's input and reduce
        # here, a group_size-times larger transfer than an all-reduce but no custom algorithm.
        t.copy_(_local_reduce(_all_gather(t, group), reduction))
    return t


def _copy_all_reduce(t: torch.Tensor, reduction: str, group: dist.ProcessGroup) -> torch.Tensor:
    """The all-reduce of contiguous ``t`` in a new tensor, ``t`` untouched.

    A large tensor is copied in pieces, each piece's all-reduce started (asynchronously) as soon
    as it is copied, so the copy of the next piece overlaps the transfer of the one before: the
    ring starts once a piece is copied, not the whole tensor. Two pieces, not more: every piece
    is one more collective, and on a busy machine each costs CPU and context switches (16 MiB
    over 4 gloo procs on 2 cores, time against ``reduce_``: 2 pieces 1.27x, 4 pieces 1.35x,
    medians of one alternating run; RESULTS.md). Every rank cuts the same pieces (they depend
    on the size only), so the collectives match.
    """
    pieces = min(_OVERLAP_PIECES, t.numel() * t.element_size() // _OVERLAP_MIN_BYTES)
    native = _NATIVE.get(_backend_of(t, group), _PORTABLE)
    if pieces < 2 or (reduction not in native and reduction != "avg"):
        return _all_reduce(buffers.copy(t), reduction, group)
    op = _OPS[reduction] if reduction in native else dist.ReduceOp.SUM
    out = buffers.empty_like(t)
    works = []
    for source, piece in zip(t.view(-1).chunk(pieces), out.view(-1).chunk(pieces), strict=True):
        buffers.copy_into(piece, source)
        works.append(dist.all_reduce(piece, op=op, group=group, async_op=True))
    for work in works:
        work.wait()
    if reduction == "avg":
        _divide_(out, group.size())
    return out


def _reduce_scatter(t: torch.Tensor, reduction: str, group: dist.ProcessGroup) -> torch.Tensor:
    """Reduce contiguous ``t`` of shape ``(n, *r)`` across ``group``; rank ``i`` gets the
    reduction of every rank's ``t[i]``."""
    native = _NATIVE.get(_backend_of(t, group), _PORTABLE)
    out = buffers.empty(t.shape[1:], t.dtype, t.device)
    # Flat buffers: gloo checks (and aborts the process on) the split of dim 0 itself.
    flat_in, flat_out = t.view(-1), out.view(-1)
    if reduction in native:
        dist.reduce_scatter_tensor(flat_out, flat_in, op=_OPS[reduction], group=group)
    elif reduction == "avg":
        dist.reduce_scatter_tensor(flat_out, flat_in, op=dist.ReduceOp.SUM, group=group)
        _divide_(out, group.size())
    else:
        # No bitwise op in the backend (NCCL): an all-to-all brings every rank's t[i] here,
        # then the reduction is local.
        out.copy_(_local_reduce(_all_to_all(t, group), reduction))
    return out


def _all_to_all(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Rank ``i`` gets ``t[i]`` of every rank ``j`` as row ``j``, from contiguous ``t``."""
    out = buffers.empty_like(t)
    dist.all_to_all_single(out.view(-1), t.view(-1), group=group)
    return out


def _run(t: torch.Tensor, reduction: str, group: dist.ProcessGroup, scatter: bool) -> torch.Tensor:
    """The reduction of ``t`` in a new tensor (never ``t`` itself)."""
    n = group.size()
    reduce_output_size(reduction, scatter, t.shape, n)  # raises ValueError for a bad call
    _check_dtype(t, reduction)
    src = t.contiguous()
    if reduction == "stack":
        return _all_to_all(src, group) if scatter else _all_gather(src, group)
    if scatter:
        return _reduce_scatter(src, reduction, group)
    if src is t:  # t keeps its value: the result is a copy
        return _copy_all_reduce(t, reduction, group)
    return _all_reduce(src, reduction, group)


def reduce(
    t: torch.Tensor, reduction: str, group: dist.ProcessGroup, scatter: bool = False
) -> torch.Tensor:
    """Reduce ``t`` across ``group`` with one of Monarch's reductions; return a new tensor.

    ``stack`` gathers every rank's ``t`` in group rank order into a new leading dim; with
    ``scatter`` it is an all-to-all (``t``'s leading dim, of the group's size, is split across
    the ranks: rank ``i`` gets every rank's ``t[i]``). ``sum``, ``avg``, ``product``, ``min``,
    ``max``, ``band``, ``bor``, ``bxor`` reduce element-wise (an integer ``avg`` truncates);
    with ``scatter`` rank ``i`` gets the reduction of every rank's ``t[i]``. A bad reduction or
    scatter raises ``ValueError``, a dtype the reduction does not take ``TypeError``. Every rank
    of ``group`` must make the same call.
    """
    return _run(t, reduction, group, scatter)


def reduce_(
    t: torch.Tensor, reduction: str, group: dist.ProcessGroup, scatter: bool = False
) -> torch.Tensor:
    """`reduce` into ``t`` itself; return ``t``.

    Only the reductions whose output has ``t``'s shape run in place: every one but ``stack``
    without ``scatter``, and ``stack`` only with it (all-to-all); the others raise
    ``ValueError``.
    """
    out_size = reduce_output_size(reduction, scatter, t.shape, group.size())
    if out_size != t.shape:
        raise ValueError(
            f"reduction {reduction!r} with scatter={scatter} makes a tensor of size"
            f" {list(out_size)} from one of size {list(t.shape)}, so it cannot run in place"
        )
    if not scatter and reduction != "stack" and t.is_contiguous():
        _check_dtype(t, reduction)
        return _all_reduce(t, reduction, group)
    return t.copy_(_run(t, reduction, group, scatter))


def send_to(t: torch.Tensor, dst: int, group: dist.ProcessGroup) -> None:
    """Send ``t`` to world rank ``dst`` of ``group``, which receives it with `recv_from`."""
    dist.send(t.contiguous(), dst=dst, group=group)


def recv_from(into: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Receive what world rank ``src`` of ``group`` sends with `send_to` into ``into``, a
    tensor of the sent shape and dtype; return ``into``."""
    if into.is_contiguous():
        dist.recv(into, src=src, group=group)
        return into
    landing = into.contiguous()
    dist.recv(landing, src=src, group=group)
    return into.copy_(landing)


def send_recv(
    t: torch.Tensor, dst: int, into: torch.Tensor, src: int, group: dist.ProcessGroup
) -> torch.Tensor:
    """Send ``t`` to world rank ``dst`` while receiving into ``into`` from world rank ``src``,
    for a rank that is both a source and a destination of one ``to_mesh``; return ``into``.

    The two run as one batch (`exchange`): a blocking send then a blocking receive would
    deadlock ranks that send to each other once a tensor outgrows the transport's buffers.
    """
    exchange([(t, dst)], [(into, src)], group)
    return into


def exchange(
    sends: Sequence[tuple[torch.Tensor, int]],
    recvs: Sequence[tuple[torch.Tensor, int]],
    group: dist.ProcessGroup,
) -> None:
    """Send each ``(tensor, world rank)`` of ``sends`` and receive into each ``(tensor, world
    rank)`` of ``recvs`` (tensors of the sent shapes and dtypes), all as one batch of
    point-to-point ops of ``group``; return when all are done.

    Messages between two ranks match in the order each side lists them. Batching lets a rank
    send and receive at once (a ``to_mesh`` shift, a broadcast to several ranks) without the
    deadlock blocking calls would risk.
    """
    landings = [(into, into if into.is_contiguous() else into.contiguous()) for into, _ in recvs]
    ops = [dist.P2POp(dist.isend, t.contiguous(), dst, group) for t, dst in sends]
    ops += [
        dist.P2POp(dist.irecv, landing, src, group)
        for (_, landing), (_, src) in zip(landings, recvs, strict=True)
    ]
    if not ops:
        return
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for into, landing in landings:
        if landing is not into:
            into.copy_(landing)
