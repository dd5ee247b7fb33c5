"""What a failed ibverbs work completion means, and which error a transfer reports for it.

A work completion carries an ``ibv_wc_status`` (``enum ibv_wc_status`` of
``<infiniband/verbs.h>``; pyverbs exposes the same numbers as ``pyverbs.enums.IBV_WC_*``). After
the first failure the queue pair is in the error state and every later request of the transfer
completes as *flushed*, so the first failure that is not a flush is the cause. A cause on the
owner's side (its key refused the access: usually a dropped buffer) or on the path to it (no
answer: usually a dead owner) is only a hint; the client then asks the owner's transfer service,
which knows whether the buffer was dropped or its process is gone. A local cause is reported as
it is.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

from regency._errors import RegencyError


class WcStatus(enum.IntEnum):
    """``enum ibv_wc_status``."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21
    TM_ERR = 22


class Fault(enum.Enum):
    """Where a failed completion points."""

    FLUSHED = "flushed"
    """Cancelled because an earlier request of the queue pair failed."""
    REMOTE = "remote"
    """The owner's side refused the access (an invalidated key, a range outside its region)."""
    UNREACHABLE = "unreachable"
    """The owner's side did not answer (its process or queue pair is gone, or the path is down)."""
    LOCAL = "local"
    """Something on this side: the local registration, queue pair or device."""


_REMOTE = frozenset(
    {
        WcStatus.REM_INV_REQ_ERR,
        WcStatus.REM_ACCESS_ERR,
        WcStatus.REM_OP_ERR,
        WcStatus.REM_INV_RD_REQ_ERR,
        WcStatus.REM_ABORT_ERR,
    }
)
_UNREACHABLE = frozenset(
    {
        WcStatus.RETRY_EXC_ERR,
        WcStatus.RNR_RETRY_EXC_ERR,
        WcStatus.RESP_TIMEOUT_ERR,
        WcStatus.BAD_RESP_ERR,
    }
)


class Completion(NamedTuple):
    """The parts of a work completion a transfer looks at."""

    wr_id: int
    status: int
    vendor_err: int


class IbvCompletionError(RegencyError, OSError):
    """A work request failed for a reason the owner's service did not explain."""


def status_name(status: int) -> str:
    """``IBV_WC_REM_ACCESS_ERR`` and the like; unknown numbers are shown as such."""
    try:
        return f"IBV_WC_{WcStatus(status).name}"
    except ValueError:
        return f"unknown work completion status {status}"


def classify(status: int) -> Fault | None:
    """Where a completion's status points; ``None`` for success."""
    if status == WcStatus.SUCCESS:
        return None
    if status == WcStatus.WR_FLUSH_ERR:
        return Fault.FLUSHED
    if status in _REMOTE:
        return Fault.REMOTE
    if status in _UNREACHABLE:
        return Fault.UNREACHABLE
    return Fault.LOCAL


def first_failure(completions: Iterable[Completion]) -> Completion | None:
    """The completion that caused a failure: the first that failed and was not flushed.

    If every failure is a flush (the cause was polled earlier, or never reported), the first
    flush; ``None`` if nothing failed.
    """
    flushed: Completion | None = None
    for c in completions:
        fault = classify(c.status)
        if fault is None:
            continue
        if fault is not Fault.FLUSHED:
            return c
        if flushed is None:
            flushed = c
    return flushed


def needs_owner(completion: Completion) -> bool:
    """Whether only the owner's service can tell what this failure means (dropped or gone)."""
    return classify(completion.status) in (Fault.REMOTE, Fault.UNREACHABLE, Fault.FLUSHED)


def completion_error(operation: str, completion: Completion) -> IbvCompletionError:
    """The error for a failed completion, e.g. ``RDMA READ failed: IBV_WC_LOC_PROT_ERR ...``."""
    return IbvCompletionError(
        f"{operation} failed: {status_name(completion.status)} "
        f"(vendor error {completion.vendor_err:#x})"
    )
