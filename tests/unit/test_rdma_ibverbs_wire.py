"""The ibverbs connection messages: queue pair info and remote keys, and GID text."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regency.rdma._ibverbs.wire import (
    KEY_BYTES,
    LINK_LAYER_ETHERNET,
    LINK_LAYER_INFINIBAND,
    QP_INFO_BYTES,
    VERSION,
    QpInfo,
    RemoteKey,
    gid_bytes,
    gid_text,
)

pytestmark = pytest.mark.timeout(60)

# A RoCE v2 GID holding 10.0.0.1, and an InfiniBand port GID (default subnet prefix + GUID).
ROCE_GID = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
IB_GID = bytes.fromhex("fe80000000000000" + "0002c90300a1b2c3")

ROCE = QpInfo(LINK_LAYER_ETHERNET, 5, 16, 0, 0x1A2B, 0xABCDE, 1 << 30, ROCE_GID)
IB = QpInfo(LINK_LAYER_INFINIBAND, 4, 1, 7, 0xFFFFFF, 0, (1 << 32) - 1, IB_GID)


@pytest.mark.parametrize("info", [ROCE, IB], ids=["roce", "infiniband"])
def test_queue_pair_info_round_trips(info: QpInfo) -> None:
    data = info.pack()
    assert len(data) == QP_INFO_BYTES == 34
    assert data[0] == VERSION
    assert QpInfo.unpack(data) == info


@given(
    st.sampled_from([LINK_LAYER_INFINIBAND, LINK_LAYER_ETHERNET]),
    st.integers(1, 5),
    st.integers(1, 255),
    st.integers(1, 0xFFFF),
    st.integers(1, (1 << 24) - 1),
    st.integers(0, (1 << 24) - 1),
    st.integers(1, (1 << 32) - 1),
    st.binary(min_size=16, max_size=16).filter(any),
)
def test_every_valid_queue_pair_info_round_trips(
    layer: int, mtu: int, depth: int, lid: int, qpn: int, psn: int, max_msg: int, gid: bytes
) -> None:
    info = QpInfo(layer, mtu, depth, lid, qpn, psn, max_msg, gid)
    assert QpInfo.unpack(info.pack()) == info


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"link_layer": 0}, "link layer"),
        ({"mtu": 0}, "MTU"),
        ({"mtu": 6}, "MTU"),
        ({"depth": 0}, "depth"),
        ({"depth": 256}, "depth"),
        ({"lid": 1 << 16}, "LID"),
        ({"qp_num": 0}, "queue pair number"),
        ({"qp_num": 1 << 24}, "queue pair number"),
        ({"psn": 1 << 24}, "sequence number"),
        ({"max_msg": 0}, "message size"),
        ({"gid": bytes(15)}, "16 bytes"),
        ({"gid": bytes(16)}, "RoCE port needs a GID"),
    ],
)
def test_out_of_range_fields_are_refused_before_sending(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises((ValueError, struct.error), match=message):
        ROCE._replace(**change).pack()


def test_an_infiniband_port_needs_a_lid_or_a_gid() -> None:
    assert QpInfo.unpack(IB._replace(gid=bytes(16)).pack()).lid == 7  # LID only: fine
    assert QpInfo.unpack(IB._replace(lid=0).pack()).lid == 0  # GID only: fine
    with pytest.raises(ValueError, match="LID or a GID"):
        IB._replace(lid=0, gid=bytes(16)).pack()


def test_received_queue_pair_info_is_validated() -> None:
    good = ROCE.pack()
    with pytest.raises(ValueError, match="expected 34"):
        QpInfo.unpack(good[:-1])
    with pytest.raises(ValueError, match="version 2"):
        QpInfo.unpack(bytes([2]) + good[1:])
    # A peer that sends a zero queue pair number (the SMI's) is refused on receipt.
    bad = struct.pack("<BBBBHIII16s", VERSION, LINK_LAYER_ETHERNET, 5, 16, 0, 0, 1, 4096, ROCE_GID)
    with pytest.raises(ValueError, match="queue pair number"):
        QpInfo.unpack(bad)


def test_remote_key_round_trips_and_must_describe_the_buffer() -> None:
    key = RemoteKey(0xDEADBEEF, 0x7F00_1234_5000, 64 << 20)
    data = key.pack()
    assert len(data) == KEY_BYTES == 20
    assert RemoteKey.unpack(data) == key
    key.check_covers(0x7F00_1234_5000, 64 << 20)
    with pytest.raises(ValueError, match="registered 67108864 bytes"):
        key.check_covers(0x7F00_1234_5000, 1 << 20)
    with pytest.raises(ValueError, match="at 0x7f0012345000"):
        key.check_covers(0x7F00_1234_6000, 64 << 20)
    with pytest.raises(ValueError, match="expected 20"):
        RemoteKey.unpack(data + b"\0")
    with pytest.raises(ValueError, match="invalid remote key"):
        RemoteKey(1 << 32, 0, 1).pack()
    with pytest.raises(ValueError, match="invalid remote key"):
        RemoteKey(1, 0, 0).pack()


def test_gid_text_is_the_form_pyverbs_prints() -> None:
    assert gid_text(ROCE_GID) == "0000:0000:0000:0000:0000:ffff:0a00:0001"
    assert gid_text(IB_GID) == "fe80:0000:0000:0000:0002:c903:00a1:b2c3"
    assert gid_bytes("fe80:0000:0000:0000:0002:c903:00a1:b2c3") == IB_GID


@given(st.binary(min_size=16, max_size=16))
def test_gid_text_round_trips(gid: bytes) -> None:
    assert gid_bytes(gid_text(gid)) == gid


@pytest.mark.parametrize("text", ["fe80::1", "fe80:0:0:0:0:0:0:1", "", "zzzz" + ":0000" * 7])
def test_gid_text_rejects_other_forms(text: str) -> None:
    with pytest.raises(ValueError):
        gid_bytes(text)
