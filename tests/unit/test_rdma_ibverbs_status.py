"""Failed ibverbs work completions: which one is the cause, and what it points to."""

from __future__ import annotations

import pytest

from regency.rdma._ibverbs.status import (
    Completion,
    Fault,
    IbvCompletionError,
    WcStatus,
    classify,
    completion_error,
    first_failure,
    needs_owner,
    status_name,
)

pytestmark = pytest.mark.timeout(60)


def ok(i: int) -> Completion:
    return Completion(i, WcStatus.SUCCESS, 0)


def bad(i: int, status: WcStatus, vendor: int = 0) -> Completion:
    return Completion(i, status, vendor)


def test_every_status_has_a_fault_and_a_name() -> None:
    assert classify(WcStatus.SUCCESS) is None
    assert classify(WcStatus.WR_FLUSH_ERR) is Fault.FLUSHED
    for status in (
        WcStatus.REM_ACCESS_ERR,  # the owner deregistered the buffer: its key is invalid
        WcStatus.REM_INV_REQ_ERR,
        WcStatus.REM_OP_ERR,
        WcStatus.REM_INV_RD_REQ_ERR,
        WcStatus.REM_ABORT_ERR,
    ):
        assert classify(status) is Fault.REMOTE, status
    for status in (
        WcStatus.RETRY_EXC_ERR,  # nobody answers: the owner's queue pair (or host) is gone
        WcStatus.RNR_RETRY_EXC_ERR,
        WcStatus.RESP_TIMEOUT_ERR,
        WcStatus.BAD_RESP_ERR,
    ):
        assert classify(status) is Fault.UNREACHABLE, status
    for status in (
        WcStatus.LOC_LEN_ERR,
        WcStatus.LOC_PROT_ERR,
        WcStatus.LOC_ACCESS_ERR,
        WcStatus.LOC_QP_OP_ERR,
        WcStatus.FATAL_ERR,
        WcStatus.GENERAL_ERR,
    ):
        assert classify(status) is Fault.LOCAL, status
    assert classify(99) is Fault.LOCAL  # a status this code does not know
    assert {status_name(s) for s in WcStatus} >= {"IBV_WC_REM_ACCESS_ERR", "IBV_WC_SUCCESS"}
    assert status_name(99) == "unknown work completion status 99"


def test_the_cause_is_the_first_failure_that_is_not_a_flush() -> None:
    batch = [
        ok(0),
        bad(1, WcStatus.WR_FLUSH_ERR),
        bad(2, WcStatus.REM_ACCESS_ERR, 0x88),
        bad(3, WcStatus.WR_FLUSH_ERR),
        bad(4, WcStatus.RETRY_EXC_ERR),
    ]
    assert first_failure(batch) == batch[2]
    assert first_failure([ok(0), ok(1)]) is None
    assert first_failure([]) is None
    only_flushes = [ok(0), bad(1, WcStatus.WR_FLUSH_ERR), bad(2, WcStatus.WR_FLUSH_ERR)]
    assert first_failure(only_flushes) == only_flushes[1]


def test_remote_and_unexplained_failures_are_explained_by_the_owner() -> None:
    assert needs_owner(bad(0, WcStatus.REM_ACCESS_ERR))  # dropped? the owner knows
    assert needs_owner(bad(0, WcStatus.RETRY_EXC_ERR))  # gone? its service tells
    assert needs_owner(bad(0, WcStatus.WR_FLUSH_ERR))  # cause unseen: ask
    assert not needs_owner(bad(0, WcStatus.LOC_PROT_ERR))  # our registration: say so


def test_completion_errors_name_the_operation_and_status() -> None:
    err = completion_error("RDMA READ", bad(3, WcStatus.LOC_PROT_ERR, 0x51))
    assert isinstance(err, IbvCompletionError)
    assert isinstance(err, OSError)  # the engine reports OSErrors as RDMAError
    assert str(err) == "RDMA READ failed: IBV_WC_LOC_PROT_ERR (vendor error 0x51)"
