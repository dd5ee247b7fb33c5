"""Whether this process can use ibverbs: pyverbs, a device that opens, an active port.

Probed once per process. The first probe calls ``ibv_fork_init`` before any other verbs call,
so that, on kernels that need it, registered pages are not shared copy-on-write with a child.
Which port and GID are used is decided by :mod:`regency.rdma._ibverbs.port`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, NamedTuple

from regency.rdma._ibverbs.load import IbvUnavailableError, Pyverbs, load
from regency.rdma._ibverbs.port import (
    DEVICE_ENV,
    GidEntry,
    PortCandidate,
    PortChoice,
    choose_port,
    parse_device_spec,
)
from regency.rdma._ibverbs.wire import gid_bytes


def _gid_table(pv: Pyverbs, ctx: Any, port: int, size: int) -> tuple[GidEntry, ...]:
    entries = []
    for index in range(size):
        try:
            gid = gid_bytes(str(ctx.query_gid(port, index)))
        except pv.error:  # an unpopulated entry
            continue
        if not any(gid):
            continue
        try:
            roce_v2 = ctx.query_gid_type(port, index) == pv.enums.IBV_GID_TYPE_SYSFS_ROCE_V2
        except pv.error:  # no type for this entry (InfiniBand): not RoCE v2
            roce_v2 = False
        entries.append(GidEntry(index, gid, roce_v2))
    return tuple(entries)


def _ports_of(pv: Pyverbs, name: str) -> list[PortCandidate]:
    ctx = pv.device.Context(name=name)
    try:
        ports = []
        for port in range(1, ctx.query_device().phys_port_cnt + 1):
            attr = ctx.query_port(port)
            active = attr.state in (pv.enums.IBV_PORT_ACTIVE, pv.enums.IBV_PORT_ACTIVE_DEFER)
            ports.append(
                PortCandidate(
                    name,
                    port,
                    active,
                    attr.link_layer,
                    attr.lid,
                    attr.active_mtu,
                    attr.max_msg_sz,
                    _gid_table(pv, ctx, port, attr.gid_tbl_len) if active else (),
                )
            )
        return ports
    finally:
        ctx.close()


def _probe() -> PortChoice:
    pv = load()
    # Before any other verbs call: on kernels that need it, registered pages are then kept out
    # of a child's copy-on-write. Too late (memory registered by other code already): ignored.
    with contextlib.suppress(pv.error):
        pv.fork.fork_init()
    try:
        spec = parse_device_spec(os.environ.get(DEVICE_ENV, ""))
    except ValueError as exc:
        raise IbvUnavailableError(str(exc), lasting=True) from exc
    try:
        devices = pv.device.get_device_list()
    except pv.error as exc:
        raise IbvUnavailableError(f"no RDMA device found ({exc})", lasting=True) from exc
    candidates: list[PortCandidate] = []
    failures = []
    for dev in devices:
        name = dev.name.decode()
        try:
            candidates.extend(_ports_of(pv, name))
        except pv.error as exc:
            failures.append(f"{name}: {exc}")
    if not candidates:
        why = "; ".join(failures) if failures else "the device list is empty"
        raise IbvUnavailableError(f"no RDMA device could be opened ({why})", lasting=True)
    try:
        return choose_port(candidates, spec)
    except LookupError as exc:
        raise IbvUnavailableError(str(exc), lasting=True) from exc


class Availability(NamedTuple):
    """Whether this process can use ibverbs, and the port it uses or why it cannot."""

    usable: bool
    detail: str


@functools.lru_cache(maxsize=1)
def chosen_port() -> PortChoice | IbvUnavailableError:
    """The port this process uses, or why it has none (probed once)."""
    try:
        return _probe()
    except IbvUnavailableError as exc:
        return exc
    except Exception as exc:  # a device that fails in an unforeseen way is a device we skip
        why = f"probing RDMA devices failed: {type(exc).__name__}: {exc}"
        return IbvUnavailableError(why, lasting=True)


def availability() -> Availability:
    """Probed once per process: pyverbs importable, a device that opens, an active port."""
    found = chosen_port()
    if isinstance(found, IbvUnavailableError):
        return Availability(False, str(found))
    gid = "" if found.gid_index is None else f", GID index {found.gid_index}"
    return Availability(True, f"{found.device}:{found.port}{gid}")
