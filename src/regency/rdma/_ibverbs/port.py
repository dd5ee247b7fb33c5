"""Which RDMA port and GID this process uses, and what two connected ports agree on.

Every process picks one port: the first active one (devices in the order libibverbs lists them,
ports in ascending order), or the one named by ``REGENCY_RDMA_IBV_DEVICE`` as ``device``,
``device:port`` or ``device:port:gid_index``. On a RoCE port (Ethernet link layer) packets need
a GID: a RoCE v2 GID that holds an IPv4 address is preferred (it routes across subnets), then any
other RoCE v2 GID, then RoCE v1. On InfiniBand the port's LID is enough inside a subnet and the
GID (index 0) is used across subnets.

Two ends agree on the smaller of their path MTUs, chunk at the smaller maximum message size,
and a reader keeps at most as many RDMA READs in flight as the owner accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from regency.rdma._ibverbs.wire import LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND, QpInfo

DEVICE_ENV = "REGENCY_RDMA_IBV_DEVICE"
_IPV4_MAPPED = bytes(10) + b"\xff\xff"
_LINK_LOCAL = b"\xfe\x80"


class GidEntry(NamedTuple):
    """One populated entry of a port's GID table."""

    gid_index: int
    gid: bytes
    roce_v2: bool
    """The entry's type is RoCE v2 (``IBV_GID_TYPE_SYSFS_ROCE_V2``)."""


class PortCandidate(NamedTuple):
    """A port as the device reports it."""

    device: str
    port: int
    active: bool
    link_layer: int
    lid: int
    mtu: int
    """The active MTU, an ``enum ibv_mtu`` value."""
    max_msg: int
    gids: tuple[GidEntry, ...]


class PortChoice(NamedTuple):
    """The port this process uses, with the GID it sends from (if any)."""

    device: str
    port: int
    link_layer: int
    lid: int
    mtu: int
    max_msg: int
    gid_index: int | None
    gid: bytes


class DeviceSpec(NamedTuple):
    """What ``REGENCY_RDMA_IBV_DEVICE`` asks for; ``None`` fields are chosen automatically."""

    device: str | None = None
    port: int | None = None
    gid_index: int | None = None


class Route(NamedTuple):
    """How this end addresses the other: the address vector of a reliable connection."""

    dlid: int
    is_global: bool
    sgid_index: int
    dgid: bytes


def parse_device_spec(text: str) -> DeviceSpec:
    """Parse ``device[:port[:gid_index]]``; an empty text asks for nothing in particular."""
    text = text.strip()
    if not text:
        return DeviceSpec()
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ValueError(f"{DEVICE_ENV} must be device[:port[:gid_index]], got {text!r}")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(
            f"{DEVICE_ENV}: port and GID index must be integers, got {text!r}"
        ) from None
    if numbers and numbers[0] < 1:
        raise ValueError(f"{DEVICE_ENV}: ports are numbered from 1, got {numbers[0]}")
    if len(numbers) == 2 and numbers[1] < 0:
        raise ValueError(f"{DEVICE_ENV}: a GID index is at least 0, got {numbers[1]}")
    port = numbers[0] if numbers else None
    gid_index = numbers[1] if len(numbers) == 2 else None
    return DeviceSpec(parts[0], port, gid_index)


def _gid_rank(link_layer: int, entry: GidEntry) -> int:
    if link_layer == LINK_LAYER_INFINIBAND:
        return 0 if entry.gid_index == 0 else 1
    if entry.roce_v2 and entry.gid.startswith(_IPV4_MAPPED):
        return 0
    if entry.roce_v2 and not entry.gid.startswith(_LINK_LOCAL):
        return 1
    if entry.roce_v2:
        return 2
    return 3


def choose_gid(
    link_layer: int, gids: Sequence[GidEntry], wanted: int | None = None
) -> GidEntry | None:
    """The GID to send from: ``wanted`` if it is populated, else the best by the rules above."""
    usable = [g for g in gids if any(g.gid)]
    if wanted is not None:
        return next((g for g in usable if g.gid_index == wanted), None)
    if not usable:
        return None
    return min(usable, key=lambda g: (_gid_rank(link_layer, g), g.gid_index))


def _why_unusable(c: PortCandidate, wanted_gid: int | None) -> str | None:
    where = f"{c.device}:{c.port}"
    if not c.active:
        return f"{where} is not active"
    if c.link_layer not in (LINK_LAYER_INFINIBAND, LINK_LAYER_ETHERNET):
        return f"{where} has unknown link layer {c.link_layer}"
    gid = choose_gid(c.link_layer, c.gids, wanted_gid)
    if wanted_gid is not None and gid is None:
        return f"{where} has no populated GID at index {wanted_gid}"
    if c.link_layer == LINK_LAYER_ETHERNET and gid is None:
        return f"{where} is a RoCE port without a GID"
    if c.link_layer == LINK_LAYER_INFINIBAND and c.lid == 0 and gid is None:
        return f"{where} has neither a LID nor a GID"
    return None


def choose_port(candidates: Sequence[PortCandidate], spec: DeviceSpec) -> PortChoice:
    """The first usable port that ``spec`` allows (``LookupError`` saying why there is none)."""
    wanted = [
        c
        for c in candidates
        if (spec.device is None or c.device == spec.device)
        and (spec.port is None or c.port == spec.port)
    ]
    if not wanted:
        seen = ", ".join(f"{c.device}:{c.port}" for c in candidates) or "none"
        raise LookupError(f"no RDMA port matches {spec_text(spec)} (ports found: {seen})")
    reasons = []
    for c in wanted:
        why = _why_unusable(c, spec.gid_index)
        if why is not None:
            reasons.append(why)
            continue
        gid = choose_gid(c.link_layer, c.gids, spec.gid_index)
        return PortChoice(
            c.device,
            c.port,
            c.link_layer,
            c.lid,
            c.mtu,
            c.max_msg,
            None if gid is None else gid.gid_index,
            bytes(16) if gid is None else gid.gid,
        )
    raise LookupError("no usable RDMA port: " + "; ".join(reasons))


def spec_text(spec: DeviceSpec) -> str:
    """``spec`` as a user would write it, or ``any port`` when it asks for nothing."""
    if spec.device is None:
        return "any port"
    parts = [spec.device]
    if spec.port is not None:
        parts.append(str(spec.port))
    if spec.gid_index is not None:
        parts.append(str(spec.gid_index))
    return ":".join(parts)


def route(local: PortChoice, remote: QpInfo) -> Route:
    """The address vector from ``local`` to ``remote`` (``ValueError`` if they cannot talk)."""
    if local.link_layer != remote.link_layer:
        raise ValueError(
            f"link layers differ: this port is {_layer(local.link_layer)}, the owner's is "
            f"{_layer(remote.link_layer)}"
        )
    same_subnet = remote.gid[:8] == local.gid[:8]
    needs_grh = (
        local.link_layer == LINK_LAYER_ETHERNET
        or remote.lid == 0
        or (any(remote.gid) and any(local.gid) and not same_subnet)
    )
    if not needs_grh:
        return Route(remote.lid, False, 0, bytes(16))
    if local.gid_index is None:
        raise ValueError(f"{local.device}:{local.port} has no GID to route to the owner's port")
    if not any(remote.gid):
        raise ValueError("the owner's port has no GID to route to")
    return Route(
        0 if local.link_layer == LINK_LAYER_ETHERNET else remote.lid,
        True,
        local.gid_index,
        remote.gid,
    )


def _layer(link_layer: int) -> str:
    return {LINK_LAYER_INFINIBAND: "InfiniBand", LINK_LAYER_ETHERNET: "Ethernet (RoCE)"}.get(
        link_layer, f"link layer {link_layer}"
    )


def path_mtu(local_mtu: int, remote_mtu: int) -> int:
    """The path MTU two ports share (``enum ibv_mtu`` grows with the size)."""
    return min(local_mtu, remote_mtu)


def agree_depth(asked: int, limit: int) -> int:
    """RDMA READs in flight: what was asked for, at most ``limit``, and at least one."""
    return max(1, min(asked, limit, 255))
