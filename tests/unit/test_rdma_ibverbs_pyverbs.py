"""The verbs layer against the real pyverbs: constants, request slots, queue pair attributes.

pyverbs (rdma-core's Python bindings; Debian/Ubuntu ``python3-pyverbs``) is not on PyPI. When
this environment cannot import it but the system's copy is built for this interpreter, the tests
use that copy; without either they skip. Nothing here needs an RDMA device: the objects checked
are the ones the data path hands to ``QP(...)``, ``QP.to_rts`` and ``QP.post_send``, read back
field by field from pyverbs itself. Detection runs in subprocesses so this process's cached
answer is left alone.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regency.rdma._ibverbs import load as _ibv_load
from regency.rdma._ibverbs import plan as _ibv_plan
from regency.rdma._ibverbs import status as _ibv_status
from regency.rdma._ibverbs import verbs as _ibv_verbs
from regency.rdma._ibverbs import wire as _ibv_wire
from regency.rdma._ibverbs.plan import make_wr_id
from regency.rdma._ibverbs.port import DeviceSpec, GidEntry, PortCandidate, choose_port
from regency.rdma._ibverbs.status import WcStatus
from regency.rdma._ibverbs.wire import LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND, QpInfo, gid_text

pytestmark = pytest.mark.timeout(120)

_SYSTEM_DIRS = ("/usr/lib/python3/dist-packages", f"/usr/lib/python3.{sys.version_info[1]}")
ROCE_GID = bytes(10) + b"\xff\xff" + bytes([192, 168, 7, 21])
PEER_GID = bytes(10) + b"\xff\xff" + bytes([192, 168, 7, 22])
IB_GID = bytes.fromhex("fe800000000000000002c90300a1b2c3")


def _system_pyverbs() -> Path | None:
    """The system's pyverbs package if it is built for this interpreter, else ``None``."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for base in _SYSTEM_DIRS:
        candidate = Path(base) / "pyverbs"
        if (candidate / f"device{suffix}").exists():
            return candidate
    return None


@pytest.fixture(scope="module")
def pythonpath(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``PYTHONPATH`` entry under which pyverbs imports (empty if it already does)."""
    if importlib.util.find_spec("pyverbs") is not None:
        yield ""
        return
    found = _system_pyverbs()
    if found is None:
        pytest.skip("pyverbs is not installed (rdma-core's Python bindings, python3-pyverbs)")
    shim = tmp_path_factory.mktemp("pyverbs-path")
    (shim / "pyverbs").symlink_to(found, target_is_directory=True)
    yield str(shim)


@pytest.fixture(scope="module")
def pv(pythonpath: str) -> Iterator[_ibv_load.Pyverbs]:
    if pythonpath:
        sys.path.insert(0, pythonpath)
    try:
        yield _ibv_load.load()
    finally:
        if pythonpath:
            sys.path.remove(pythonpath)


def test_the_numbers_in_pure_modules_are_pyverbs_numbers(pv: _ibv_load.Pyverbs) -> None:
    e = pv.enums
    for status in WcStatus:
        assert getattr(e, f"IBV_WC_{status.name}") == status.value, status
    assert _ibv_plan.ACCESS_LOCAL_WRITE == e.IBV_ACCESS_LOCAL_WRITE
    assert _ibv_plan.ACCESS_REMOTE_WRITE == e.IBV_ACCESS_REMOTE_WRITE
    assert _ibv_plan.ACCESS_REMOTE_READ == e.IBV_ACCESS_REMOTE_READ
    assert _ibv_verbs._WR_RDMA_READ == e.IBV_WR_RDMA_READ
    assert _ibv_verbs._WR_RDMA_WRITE == e.IBV_WR_RDMA_WRITE
    assert _ibv_wire.LINK_LAYER_INFINIBAND == e.IBV_LINK_LAYER_INFINIBAND
    assert _ibv_wire.LINK_LAYER_ETHERNET == e.IBV_LINK_LAYER_ETHERNET
    assert (_ibv_wire.MTU_MIN, _ibv_wire.MTU_MAX) == (e.IBV_MTU_256, e.IBV_MTU_4096)
    assert _ibv_status.status_name(e.IBV_WC_REM_ACCESS_ERR) == "IBV_WC_REM_ACCESS_ERR"


@pytest.mark.parametrize("gid", [ROCE_GID, IB_GID, bytes(16)], ids=["roce", "ib", "zero"])
def test_gid_text_is_what_pyverbs_parses_and_prints(pv: _ibv_load.Pyverbs, gid: bytes) -> None:
    parsed = pv.addr.GID(gid_text(gid))
    assert str(parsed) == gid_text(gid)
    assert _ibv_wire.gid_bytes(str(parsed)) == gid


def test_a_work_request_slot_is_rewritten_for_every_chunk(pv: _ibv_load.Pyverbs) -> None:
    slot = _ibv_verbs._WrSlot(pv)
    e = pv.enums
    wr = slot.fill(
        make_wr_id(3, 7),
        write=False,
        local=0x1000,
        length=4096,
        lkey=0x11,
        rkey=0x22,
        remote=0x9000,
    )
    assert (wr.wr_id, wr.opcode, wr.num_sge) == (make_wr_id(3, 7), e.IBV_WR_RDMA_READ, 1)
    assert wr.send_flags == e.IBV_SEND_SIGNALED
    assert (slot.sge.addr, slot.sge.length, slot.sge.lkey) == (0x1000, 4096, 0x11)
    again = slot.fill(
        make_wr_id(4, 0), write=True, local=0x2000, length=1 << 20, lkey=0x33, rkey=0x44, remote=0
    )
    assert again is wr  # one request object per slot, rewritten in place
    assert (wr.wr_id, wr.opcode) == (make_wr_id(4, 0), e.IBV_WR_RDMA_WRITE)
    assert (slot.sge.addr, slot.sge.length, slot.sge.lkey) == (0x2000, 1 << 20, 0x33)


@pytest.mark.parametrize("remote_access", [True, False], ids=["owner", "reader"])
def test_queue_pairs_are_created_reliable_and_signalled(
    pv: _ibv_load.Pyverbs, remote_access: bool
) -> None:
    e = pv.enums
    init, attr = _ibv_verbs.qp_attributes(pv, None, window=16, port=2, remote_access=remote_access)
    assert init.qp_type == e.IBV_QPT_RC
    assert (init.max_send_wr, init.max_recv_wr, init.sq_sig_all) == (16, 1, 1)
    assert (init.max_send_sge, init.max_recv_sge) == (1, 1)
    assert attr.port_num == 2
    expected = e.IBV_ACCESS_LOCAL_WRITE
    if remote_access:
        expected |= e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    assert attr.qp_access_flags == expected


def _port(layer: int, lid: int, gids: tuple[GidEntry, ...]) -> Any:
    return choose_port([PortCandidate("dev0", 1, True, layer, lid, 5, 1 << 30, gids)], DeviceSpec())


def test_connection_attributes_for_roce(pv: _ibv_load.Pyverbs) -> None:
    local = _port(LINK_LAYER_ETHERNET, 0, (GidEntry(3, ROCE_GID, True),))
    theirs = QpInfo(LINK_LAYER_ETHERNET, 3, 8, 0, 0x00ABCD, 0x123456, 1 << 30, PEER_GID)
    attr = _ibv_verbs.rts_attributes(
        pv, local, theirs, psn=0x654321, initiator_depth=8, responder_depth=1
    )
    assert attr.path_mtu == pv.enums.IBV_MTU_1024  # the smaller of 4096 and 1024
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (0x00ABCD, 0x123456, 0x654321)
    assert (attr.max_rd_atomic, attr.max_dest_rd_atomic) == (8, 1)
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer) == (14, 7, 7, 12)
    ah = attr.ah_attr
    assert (ah.is_global, ah.port_num, ah.dlid) == (1, 1, 0)
    assert (ah.dgid, ah.sgid_index, ah.hop_limit) == (gid_text(PEER_GID), 3, 64)


def test_connection_attributes_for_infiniband(pv: _ibv_load.Pyverbs) -> None:
    local = _port(LINK_LAYER_INFINIBAND, 12, (GidEntry(0, IB_GID, False),))
    theirs = QpInfo(LINK_LAYER_INFINIBAND, 5, 16, 34, 0x77, 0, 1 << 31, IB_GID[:8] + bytes(8))
    attr = _ibv_verbs.rts_attributes(
        pv, local, theirs, psn=1, initiator_depth=16, responder_depth=1
    )
    ah = attr.ah_attr
    assert (ah.is_global, ah.dlid, ah.port_num) == (0, 34, 1)  # same subnet: the LID is enough
    assert attr.path_mtu == pv.enums.IBV_MTU_4096
    mismatched = theirs._replace(link_layer=LINK_LAYER_ETHERNET, gid=PEER_GID)
    with pytest.raises(_ibv_load.IbvUnavailableError, match="link layers differ") as info:
        _ibv_verbs.rts_attributes(
            pv, local, mismatched, psn=1, initiator_depth=1, responder_depth=1
        )
    assert info.value.lasting


_DETECT = """
import json, sys
blocked = sys.argv[1] == "blocked"
if blocked:
    sys.modules["pyverbs"] = None  # what Python does for a package that is not installed
from regency.rdma import is_ibverbs_available
from regency.rdma._ibverbs import load as _ibv_load
from regency.rdma._ibverbs import probe as _ibv_probe
from regency.rdma._ibverbs import verbs as _ibv_verbs
found = _ibv_probe.availability()
try:
    _ibv_verbs.device()
    refused = None
except _ibv_load.IbvUnavailableError as exc:
    refused = [str(exc), exc.lasting]
where = None if blocked else __import__("pyverbs").__file__
print(json.dumps([found.usable, found.detail, is_ibverbs_available(), refused, where]))
"""


def _detect(pythonpath: str, mode: str) -> list[Any]:
    env = dict(os.environ)
    env.pop("REGENCY_RDMA_IBV_DEVICE", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", _DETECT, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    result: list[Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_without_pyverbs_nothing_is_detected(pythonpath: str) -> None:
    usable, detail, available, refused, _ = _detect(pythonpath, "blocked")
    assert (usable, available) == (False, False)
    assert detail.startswith("pyverbs is not importable here")
    assert "python3-pyverbs" in detail
    assert refused == [detail, True]


def test_with_pyverbs_detection_opens_the_devices(pythonpath: str) -> None:
    usable, detail, available, refused, where = _detect(pythonpath, "real")
    assert where is not None
    assert available is usable
    if usable:  # a machine with an RDMA NIC: the port in use, and the device opens
        assert refused is None
        assert ":" in detail
    else:  # this project's CI: pyverbs present, no device
        assert "RDMA" in detail
        assert refused == [detail, True]


def test_a_bad_device_choice_is_reported(pythonpath: str) -> None:
    env = {**os.environ, "REGENCY_RDMA_IBV_DEVICE": "mlx5_0:zero"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from regency.rdma._ibverbs.probe import availability as a; print(a())",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    assert "port and GID index must be integers" in done.stdout


def test_pyverbs_errors_become_the_backends_errors(pv: _ibv_load.Pyverbs) -> None:
    missing = "regency-no-such-rdma-device"
    with pytest.raises(_ibv_load.IbvUnavailableError, match=r"^opening it failed: ") as info:
        with _ibv_load.verbs_errors("opening it failed", lasting=False):
            pv.device.Context(name=missing)  # a real pyverbs failure on any machine
    assert isinstance(info.value.__cause__, pv.error)
    assert info.value.lasting is False
    with pytest.raises(_ibv_status.IbvCompletionError, match=r"^posting failed: "):
        with _ibv_load.data_path_errors("posting failed"):
            pv.device.Context(name=missing)
    with pytest.raises(KeyError):  # anything that is not a pyverbs error passes through
        with _ibv_load.verbs_errors("x", lasting=True):
            raise KeyError("not a verbs error")
