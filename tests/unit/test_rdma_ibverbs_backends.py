"""When the ibverbs backend is chosen, and what a forced ``ibverbs`` says when it cannot run.

These run on any machine. On one without an RDMA NIC (or without pyverbs) detection is false and
plans between hosts are ``tcp``; the planning rules themselves are checked with both answers.
"""

from __future__ import annotations

import warnings

import pytest

from regency.rdma import RDMABackendError, RDMATcpFallbackWarning, is_ibverbs_available
from regency.rdma._backends import choice as _choice
from regency.rdma._handle import BufferHandle
from regency.rdma._host import HostIdentity, this_host
from regency.rdma._ibverbs.probe import availability

pytestmark = pytest.mark.timeout(60)

OTHER_HOST = HostIdentity("another-boot-id", "pid:[1]", "net:[1]", "node-b")


def handle(*, host: HostIdentity, owner_nic: bool, device: str = "cpu") -> BufferHandle:
    """A handle as a peer receives it (nothing here dials it)."""
    return BufferHandle(
        buffer_id=1,
        token=3,
        nbytes=4096,
        writable=True,
        device=device,
        owner="<root>",
        proc_address="tcp://10.0.0.2:4000",
        pid=4242,
        start_time=1,
        host=host,
        address=0x7F00_0000_0000,
        token_slot=0x7F00_0000_1000,
        tcp_address=f"tcp://10.0.0.2:{5000 + owner_nic}",
        unix_address="unix:@nowhere",
        backend=None,
        ibverbs=owner_nic,
    )


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_choice.BACKEND_ENV, raising=False)


def test_ibverbs_between_hosts_needs_a_nic_on_both_sides() -> None:
    assert _choice.remote_chain(owner_has_nic=True, here_has_nic=True, denied=False) == [
        "ibverbs",
        "tcp",
    ]
    for owner, here, denied in [
        (False, True, False),
        (True, False, False),
        (False, False, False),
        (True, True, True),  # ibverbs failed to reach this owner before
    ]:
        chain = _choice.remote_chain(owner_has_nic=owner, here_has_nic=here, denied=denied)
        assert chain == ["tcp"], (owner, here, denied)


def test_forced_ibverbs_refusals_say_why() -> None:
    assert _choice.ibverbs_refusal(device="cpu", here=None, owner_has_nic=True) is None
    gpu = _choice.ibverbs_refusal(device="cuda:0", here=None, owner_has_nic=True)
    assert gpu is not None
    assert "host memory only" in gpu
    assert "cuda:0" in gpu
    here = _choice.ibverbs_refusal(device="cpu", here="no RDMA device found", owner_has_nic=True)
    assert here == "backend 'ibverbs' is not usable in this process: no RDMA device found"
    owner = _choice.ibverbs_refusal(device="cpu", here=None, owner_has_nic=False)
    assert owner is not None
    assert "owner" in owner


def test_detection_on_this_machine_matches_the_probe() -> None:
    found = availability()
    assert is_ibverbs_available() is found.usable
    assert found.detail  # the port in use, or why there is none
    if not found.usable:
        assert _choice.get_rdma_backend() in ("cma", "tcp")


def test_plans_between_hosts_on_this_machine() -> None:
    usable = is_ibverbs_available()
    with_nic = handle(host=OTHER_HOST, owner_nic=True)
    without_nic = handle(host=OTHER_HOST, owner_nic=False)
    assert _choice.plan(with_nic) == (["ibverbs", "tcp"] if usable else ["tcp"])
    assert _choice.plan(without_nic) == ["tcp"]
    # GPU memory is never registered with the NIC: staged TCP between hosts.
    assert _choice.plan(handle(host=OTHER_HOST, owner_nic=True, device="cuda:0")) == ["tcp"]


@pytest.mark.skipif(is_ibverbs_available(), reason="checks the refusal on a machine without a NIC")
def test_forcing_ibverbs_without_a_nic_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_choice.BACKEND_ENV, "ibverbs")
    with pytest.raises(RDMABackendError, match="not usable in this process") as info:
        _choice.plan(handle(host=OTHER_HOST, owner_nic=True))
    assert availability().detail in str(info.value)
    with pytest.raises(RDMABackendError, match="not usable in this process"):
        _choice.plan(handle(host=this_host(), owner_nic=False))


def test_an_owner_ibverbs_cannot_reach_is_skipped_afterwards() -> None:
    h = handle(host=OTHER_HOST, owner_nic=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _choice.deny_ibverbs(h.tcp_address, "link layers differ", "tcp")
        _choice.deny_ibverbs(h.tcp_address, "link layers differ", "tcp")
    shown = [w for w in seen if issubclass(w.category, RDMATcpFallbackWarning)]
    assert len(shown) <= 1  # once per process (an earlier test may have shown it already)
    if shown:
        assert "'ibverbs' is not available (link layers differ); using 'tcp'" in str(
            shown[0].message
        )
    assert _choice.plan(h) == ["tcp"]


def test_the_backend_variable_accepts_ibverbs() -> None:
    assert _choice.check_backend_name(" IBVerbs ") == "ibverbs"
