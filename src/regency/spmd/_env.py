"""torchrun's environment contract, computed from a rank's position in a mesh."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import Mapping

from regency._transport import address as _address
from regency.shape import Point

ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""The variables ``setup_env`` sets, in torchrun's order."""

TORCH_PRELOAD = (
    "torch,torch.distributed,torch.nn.parallel,torch.optim,torch.utils.data,torch._dynamo"
)
"""What a DDP script imports, for ``REGENCY_ZYGOTE_PRELOAD``: procs forked with these loaded
skip seconds of imports each (``torch._dynamo`` alone, which DDP and the optimizers load, costs
more than a second beyond ``import torch``)."""

_SIOCGIFADDR = 0x8915


def check_master(master_addr: str | None, master_port: int | None) -> None:
    """Refuse an address without a port or a port without an address (``ValueError``)."""
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            "give both master_addr and master_port, or neither (rank 0's host and a free port "
            f"there are used then); got master_addr={master_addr!r}, master_port={master_port!r}"
        )


def elastic_env(point: Point, master_addr: str, master_port: int) -> dict[str, str]:
    """Return torchrun's variables for the rank at ``point`` (the last dimension is local)."""
    sizes = list(point.extent.sizes)
    world = 1
    for size in sizes:
        world *= size
    rank = point.rank
    local_size = sizes[-1] if sizes else 1
    local_rank = rank % local_size
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(rank // local_size),
        "GROUP_WORLD_SIZE": str(world // local_size),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "rank",
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def apply_env(env: Mapping[str, str], proc_address: str) -> None:
    """Set ``env`` in this process; on a TCP host, point gloo at the interface of its address.

    A proc on a worker host (``tcp://IP:PORT/NAME``) may share its hostname with other hosts
    (network namespaces, containers), so gloo's default (the address the hostname resolves to)
    can be wrong; ``GLOO_SOCKET_IFNAME`` names the interface holding the worker's IP instead,
    unless the user set it.
    """
    os.environ.update(env)
    if _address.is_tcp(proc_address) and "GLOO_SOCKET_IFNAME" not in os.environ:
        name = interface_of(_address.tcp_host(proc_address))
        if name is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = name


def host_of(proc_address: str, use_ipaddr: bool | None) -> str:
    """The name other hosts reach this proc's host by.

    ``use_ipaddr=None``: the IP of a worker host's address, else this machine's hostname;
    ``True``: an IP address (the worker's, else the hostname's); ``False``: the hostname.
    """
    if use_ipaddr is not False and _address.is_tcp(proc_address):
        return _address.tcp_host(proc_address)
    name = socket.gethostname()
    if use_ipaddr:
        try:
            return socket.gethostbyname(name)
        except OSError:
            return _address.primary_ip()
    return name


def free_port(host: str = "") -> int:
    """A TCP port that nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def interface_of(ip: str) -> str | None:
    """The network interface holding IPv4 address ``ip`` in this namespace, if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name[:15].encode())
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue
            if socket.inet_ntoa(answer[20:24]) == ip:
                return name
    return None
