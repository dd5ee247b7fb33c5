"""The device of this process, its queue pairs and memory registrations, through pyverbs.

A process opens one device context and one protection domain on the port chosen by
:mod:`regency.rdma._ibverbs.probe`; every queue pair and memory registration of the process lives in
that domain, so a buffer's key works on every connection to its owner. Everything here is
closed explicitly; a forked child starts with no device and opens its own.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from regency.rdma._ibverbs.load import (
    IbvUnavailableError,
    Pyverbs,
    close_quietly,
    immortal,
    load,
    track,
)
from regency.rdma._ibverbs.plan import WINDOW, access_flags
from regency.rdma._ibverbs.port import PortChoice, agree_depth, path_mtu, route
from regency.rdma._ibverbs.probe import chosen_port
from regency.rdma._ibverbs.status import Completion
from regency.rdma._ibverbs.wire import QpInfo, gid_text

READ_DEPTH = 16
"""RDMA READs in flight a reader asks for (the owner may accept fewer)."""
_MIN_RNR_TIMER = 12
_ACK_TIMEOUT = 14  # 4.096 us * 2**14 = 67 ms before a retry
_RETRY_COUNT = 7
_RNR_RETRY = 7
_HOP_LIMIT = 64
_WR_RDMA_WRITE = 0  # IBV_WR_RDMA_WRITE
_WR_RDMA_READ = 4  # IBV_WR_RDMA_READ


class Registered:
    """Memory registered with the device: its keys, closed (deregistered) explicitly."""

    __slots__ = ("_mr", "address", "lkey", "nbytes", "rkey")

    def __init__(self, mr: Any, address: int, nbytes: int) -> None:
        self._mr = mr
        self.address = address
        self.nbytes = nbytes
        self.lkey: int = mr.lkey
        self.rkey: int = mr.rkey

    def close(self) -> None:
        """Deregister: the keys stop working as soon as this returns."""
        self._mr.close()


class Device:
    """The opened device context and protection domain of this process."""

    def __init__(self, pv: Pyverbs, choice: PortChoice) -> None:
        self.pv = pv
        self.choice = choice
        ctx = track(pv.device.Context(name=choice.device))
        try:
            attr = ctx.query_device()
            self.pd = track(pv.pd.PD(ctx))
        except BaseException:
            ctx.close()
            raise
        self.ctx = ctx
        self.initiator_depth = agree_depth(READ_DEPTH, attr.max_qp_init_rd_atom)
        self.responder_limit = agree_depth(255, attr.max_qp_rd_atom)
        self.window = max(1, min(WINDOW, attr.max_qp_wr))
        self.cq_depth = max(1, min(2 * WINDOW, attr.max_cqe))

    def register(self, address: int, nbytes: int, *, remote: bool, writable: bool) -> Registered:
        """Register ``nbytes`` at ``address`` (``pyverbs`` errors pass through)."""
        access = access_flags(remote=remote, writable=writable)
        mr = track(self.pv.mr.MR(self.pd, nbytes, access, address=address))
        return Registered(mr, address, nbytes)

    def allocate(self, nbytes: int) -> Registered:
        """A fresh page-aligned buffer of ``nbytes``, registered for local writes."""
        mr = track(self.pv.mr.MR(self.pd, nbytes, access_flags(remote=False, writable=True)))
        return Registered(mr, int(mr.buf), nbytes)

    def endpoint(self, *, remote_access: bool) -> Endpoint:
        """A new reliable-connection queue pair (in the INIT state) with its own CQ."""
        return Endpoint(self, remote_access=remote_access)


_device_lock = threading.Lock()
_device: Device | None = None


def device() -> Device:
    """The device of this process, opened on first use (``IbvUnavailableError`` if none)."""
    global _device
    with _device_lock:
        if _device is None:
            found = chosen_port()
            if isinstance(found, IbvUnavailableError):
                raise IbvUnavailableError(str(found), lasting=True)
            pv = load()
            try:
                _device = Device(pv, found)
            except pv.error as exc:
                why = f"opening RDMA device {found.device} failed: {exc}"
                raise IbvUnavailableError(why, lasting=True) from exc
        return _device


# -- queue pairs --------------------------------------------------------------------------------


class _WrSlot:
    """One send work request and its scatter/gather entry, rewritten for every post.

    ``ibv_post_send`` copies a request into the send queue before it returns, so one request
    object serves a whole queue pair. pyverbs' ``SendWR`` and ``SGE`` allocate C memory that
    they do not free when collected, so slots are made once, kept forever and reused.
    """

    def __init__(self, pv: Pyverbs) -> None:
        self.sge = pv.wr.SGE(0, 0, 0)
        self.wr = pv.wr.SendWR(opcode=_WR_RDMA_READ, num_sge=1, sg=[self.sge])
        self.wr.sg_list = self.sge  # the request reads the entry that ``fill`` rewrites
        immortal(self.sge)
        immortal(self.wr)

    def fill(
        self, wr_id: int, *, write: bool, local: int, length: int, lkey: int, rkey: int, remote: int
    ) -> Any:
        """The request, rewritten for one chunk."""
        self.sge.addr = local
        self.sge.length = length
        self.sge.lkey = lkey
        self.wr.wr_id = wr_id
        self.wr.opcode = _WR_RDMA_WRITE if write else _WR_RDMA_READ
        self.wr.set_wr_rdma(rkey, remote)
        return self.wr


_slots_lock = threading.Lock()
_slots: list[_WrSlot] = []


def _take_slot(pv: Pyverbs) -> _WrSlot:
    with _slots_lock:
        if _slots:
            return _slots.pop()
    return _WrSlot(pv)


def qp_attributes(
    pv: Pyverbs, cq: Any, *, window: int, port: int, remote_access: bool
) -> tuple[Any, Any]:
    """``(QPInitAttr, QPAttr)`` that create a reliable-connection queue pair in INIT.

    Every send request is signalled (one completion each), ``window`` may be outstanding, and
    nothing is ever received. ``remote_access`` lets peers RDMA READ and WRITE through it (the
    owner's side); a reader's queue pair only initiates.
    """
    cap = pv.qp.QPCap(max_send_wr=window, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    init = pv.qp.QPInitAttr(qp_type=pv.enums.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
    attr = pv.qp.QPAttr(port_num=port)
    attr.qp_access_flags = access_flags(remote=remote_access, writable=True)
    attr.pkey_index = 0
    return init, attr


def rts_attributes(
    pv: Pyverbs,
    local: PortChoice,
    theirs: QpInfo,
    *,
    psn: int,
    initiator_depth: int,
    responder_depth: int,
) -> Any:
    """The ``QPAttr`` that takes a queue pair on ``local`` to RTS, connected to ``theirs``.

    pyverbs' ``QP.to_rts`` applies the INIT->RTR attributes (address vector, path MTU, remote
    queue pair number and PSN, RDMA READ depth as responder, RNR timer) and then the RTR->RTS
    ones (ACK timeout, retry counts, own PSN, RDMA READ depth as initiator) from one object.
    """
    try:
        r = route(local, theirs)
    except ValueError as exc:
        raise IbvUnavailableError(f"no route to the other port: {exc}", lasting=True) from exc
    attr = pv.qp.QPAttr(port_num=local.port)
    attr.path_mtu = path_mtu(local.mtu, theirs.mtu)
    attr.dest_qp_num = theirs.qp_num
    attr.rq_psn = theirs.psn
    attr.sq_psn = psn
    attr.max_rd_atomic = initiator_depth
    attr.max_dest_rd_atomic = responder_depth
    attr.min_rnr_timer = _MIN_RNR_TIMER
    attr.timeout = _ACK_TIMEOUT
    attr.retry_cnt = _RETRY_COUNT
    attr.rnr_retry = _RNR_RETRY
    grh = None
    if r.is_global:
        grh = pv.addr.GlobalRoute(
            dgid=pv.addr.GID(gid_text(r.dgid)), sgid_index=r.sgid_index, hop_limit=_HOP_LIMIT
        )
    attr.ah_attr = pv.addr.AHAttr(
        dlid=r.dlid, sl=0, port_num=local.port, is_global=int(r.is_global), gr=grh
    )
    return attr


class Endpoint:
    """A reliable-connection queue pair and its completion queue; closed explicitly."""

    def __init__(self, dev: Device, *, remote_access: bool) -> None:
        pv = dev.pv
        self.dev = dev
        self.psn = int.from_bytes(os.urandom(3), "little")
        self._slot: _WrSlot | None = None
        self.cq = track(pv.cq.CQ(dev.ctx, dev.cq_depth, None, None, 0))
        try:
            init, attr = qp_attributes(
                pv, self.cq, window=dev.window, port=dev.choice.port, remote_access=remote_access
            )
            self.qp = track(pv.qp.QP(dev.pd, init, attr))  # an RC QP comes back in INIT
        except BaseException:
            self.cq.close()
            raise

    def info(self, depth: int) -> QpInfo:
        """What the other end needs to connect to this one; it offers ``depth`` READs in flight."""
        c = self.dev.choice
        return QpInfo(c.link_layer, c.mtu, depth, c.lid, self.qp.qp_num, self.psn, c.max_msg, c.gid)

    def connect(self, theirs: QpInfo, *, initiator_depth: int, responder_depth: int) -> None:
        """Move the queue pair through RTR to RTS, connected to ``theirs``.

        :class:`IbvUnavailableError` if the two ports cannot reach each other; pyverbs errors
        pass through.
        """
        attr = rts_attributes(
            self.dev.pv,
            self.dev.choice,
            theirs,
            psn=self.psn,
            initiator_depth=initiator_depth,
            responder_depth=responder_depth,
        )
        self.qp.to_rts(attr)

    def post(
        self, wr_id: int, *, write: bool, local: int, length: int, lkey: int, rkey: int, remote: int
    ) -> None:
        """Post one signalled RDMA WRITE (``write``) or RDMA READ of ``length`` bytes."""
        if self._slot is None:
            self._slot = _take_slot(self.dev.pv)
        wr = self._slot.fill(
            wr_id, write=write, local=local, length=length, lkey=lkey, rkey=rkey, remote=remote
        )
        self.qp.post_send(wr)

    def poll(self, most: int) -> list[Completion]:
        """Up to ``most`` completions, without waiting."""
        _n, wcs = self.cq.poll(most)
        return [Completion(wc.wr_id, wc.status, wc.vendor_err) for wc in wcs]

    def close(self) -> None:
        """Destroy the queue pair (outstanding requests are flushed) and its CQ; idempotent."""
        close_quietly(self.qp)
        close_quietly(self.cq)
        if self._slot is not None:
            with _slots_lock:
                _slots.append(self._slot)
            self._slot = None


def _after_fork_in_child() -> None:
    global _device, _device_lock, _slots_lock
    _device, _device_lock = None, threading.Lock()
    _slots_lock = threading.Lock()  # the free slots are plain memory: the child may reuse them


os.register_at_fork(after_in_child=_after_fork_in_child)
