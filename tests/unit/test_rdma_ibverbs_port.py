"""Choosing the RDMA port and GID, and what two connected ports agree on."""

from __future__ import annotations

import ipaddress

import pytest

from regency.rdma._ibverbs.port import (
    DeviceSpec,
    GidEntry,
    PortCandidate,
    PortChoice,
    agree_depth,
    choose_gid,
    choose_port,
    parse_device_spec,
    path_mtu,
    route,
    spec_text,
)
from regency.rdma._ibverbs.wire import LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND, QpInfo

pytestmark = pytest.mark.timeout(60)

ETH, IB = LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND


def gid(text: str) -> bytes:
    return ipaddress.IPv6Address(text).packed


# The GID table of a ConnectX RoCE port with an IPv4 and a global IPv6 address (the kernel
# keeps one RoCE v1 and one RoCE v2 entry per address).
CONNECTX_ROCE = (
    GidEntry(0, gid("fe80::268a:7ff:fe11:2233"), False),
    GidEntry(1, gid("fe80::268a:7ff:fe11:2233"), True),
    GidEntry(2, gid("::ffff:192.168.7.21"), False),
    GidEntry(3, gid("::ffff:192.168.7.21"), True),
    GidEntry(4, gid("2001:db8::21"), False),
    GidEntry(5, gid("2001:db8::21"), True),
)
# Soft-RoCE (rdma_rxe) has RoCE v2 entries only; a port whose netdev has no IPv4 address.
RXE_NO_IPV4 = (
    GidEntry(0, gid("fe80::5054:ff:fe12:3456"), True),
    GidEntry(1, gid("2001:db8::7"), True),
)
IB_GIDS = (GidEntry(0, gid("fe80::2:c903:a1:b2c3"), False),)


def port(
    device: str = "mlx5_0",
    number: int = 1,
    *,
    active: bool = True,
    layer: int = ETH,
    lid: int = 0,
    gids: tuple[GidEntry, ...] = CONNECTX_ROCE,
) -> PortCandidate:
    return PortCandidate(device, number, active, layer, lid, 5, 1 << 30, gids)


def test_device_spec_parsing() -> None:
    assert parse_device_spec("") == DeviceSpec()
    assert parse_device_spec("  ") == DeviceSpec()
    assert parse_device_spec("mlx5_1") == DeviceSpec("mlx5_1")
    assert parse_device_spec("mlx5_1:2") == DeviceSpec("mlx5_1", 2)
    assert parse_device_spec("rxe0:1:3") == DeviceSpec("rxe0", 1, 3)
    for bad in ("mlx5_0:x", "mlx5_0:0", ":1", "a:1:2:3", "mlx5_0:1:-1"):
        with pytest.raises(ValueError, match="REGENCY_RDMA_IBV_DEVICE"):
            parse_device_spec(bad)
    assert spec_text(DeviceSpec()) == "any port"
    assert spec_text(DeviceSpec("rxe0", 1, 3)) == "rxe0:1:3"


def test_roce_prefers_a_v2_gid_with_an_ipv4_address() -> None:
    chosen = choose_gid(ETH, CONNECTX_ROCE)
    assert chosen is not None
    assert chosen.gid_index == 3
    chosen = choose_gid(ETH, RXE_NO_IPV4)
    assert chosen is not None
    assert chosen.gid_index == 1  # routable v2 before link-local v2
    only_v1 = tuple(g for g in CONNECTX_ROCE if not g.roce_v2)
    chosen = choose_gid(ETH, only_v1)
    assert chosen is not None
    assert chosen.gid_index == 0


def test_infiniband_uses_gid_zero_and_wanted_indexes_are_honoured() -> None:
    chosen = choose_gid(IB, IB_GIDS)
    assert chosen is not None
    assert chosen.gid_index == 0
    chosen = choose_gid(ETH, CONNECTX_ROCE, wanted=4)
    assert chosen is not None
    assert chosen.gid_index == 4
    assert choose_gid(ETH, CONNECTX_ROCE, wanted=9) is None
    assert choose_gid(ETH, (GidEntry(0, bytes(16), True),)) is None  # all-zero entries


def test_the_first_active_port_is_chosen() -> None:
    ports = [port("mlx5_0", 1, active=False), port("mlx5_1", 1), port("mlx5_1", 2)]
    choice = choose_port(ports, DeviceSpec())
    assert (choice.device, choice.port, choice.gid_index) == ("mlx5_1", 1, 3)
    assert choice.gid == gid("::ffff:192.168.7.21")
    assert choose_port(ports, DeviceSpec("mlx5_1", 2)).port == 2
    assert choose_port(ports, DeviceSpec("mlx5_1", 2, 5)).gid_index == 5


def test_infiniband_port_with_a_lid() -> None:
    choice = choose_port([port("mlx5_0", layer=IB, lid=12, gids=IB_GIDS)], DeviceSpec())
    assert (choice.lid, choice.gid_index, choice.link_layer) == (12, 0, IB)


def test_why_no_port_is_usable() -> None:
    with pytest.raises(LookupError, match="mlx5_0:1 is not active"):
        choose_port([port(active=False)], DeviceSpec())
    with pytest.raises(LookupError, match="RoCE port without a GID"):
        choose_port([port(gids=())], DeviceSpec())
    with pytest.raises(LookupError, match="neither a LID nor a GID"):
        choose_port([port(layer=IB, gids=())], DeviceSpec())
    with pytest.raises(LookupError, match="no populated GID at index 7"):
        choose_port([port()], DeviceSpec("mlx5_0", 1, 7))
    with pytest.raises(LookupError, match=r"matches mlx5_9 \(ports found: mlx5_0:1\)"):
        choose_port([port()], DeviceSpec("mlx5_9"))
    with pytest.raises(LookupError, match="ports found: none"):
        choose_port([], DeviceSpec())


def choice_of(candidate: PortCandidate) -> PortChoice:
    return choose_port([candidate], DeviceSpec())


def remote(layer: int, lid: int, the_gid: bytes, mtu: int = 5) -> QpInfo:
    return QpInfo(layer, mtu, 16, lid, 0x123, 0x456, 1 << 30, the_gid)


def test_roce_always_routes_with_a_global_header() -> None:
    local = choice_of(port())
    r = route(local, remote(ETH, 0, gid("::ffff:192.168.7.22")))
    assert r.is_global
    assert (r.dlid, r.sgid_index) == (0, 3)
    assert r.dgid == gid("::ffff:192.168.7.22")


def test_infiniband_routes_by_lid_inside_a_subnet_and_by_gid_across() -> None:
    local = choice_of(port(layer=IB, lid=12, gids=IB_GIDS))
    same_subnet = route(local, remote(IB, 34, gid("fe80::2:c903:a1:ffff")))
    assert not same_subnet.is_global
    assert same_subnet.dlid == 34
    other_subnet = route(local, remote(IB, 34, gid("fec0::2:c903:a1:ffff")))
    assert other_subnet.is_global
    assert (other_subnet.dlid, other_subnet.sgid_index) == (34, 0)


def test_ports_that_cannot_talk_are_refused() -> None:
    roce = choice_of(port())
    with pytest.raises(ValueError, match="link layers differ"):
        route(roce, remote(IB, 5, gid("fe80::1")))
    ib_without_gid = PortChoice("mlx5_0", 1, IB, 12, 5, 1 << 30, None, bytes(16))
    with pytest.raises(ValueError, match="no GID"):
        route(ib_without_gid, remote(IB, 0, gid("fe80::1")))


def test_mtu_and_read_depth_agreement() -> None:
    assert path_mtu(5, 3) == 3  # IBV_MTU_4096 with IBV_MTU_1024: 1024
    assert path_mtu(1, 5) == 1
    assert agree_depth(16, 8) == 8
    assert agree_depth(16, 0) == 1  # never zero
    assert agree_depth(300, 1000) == 255
