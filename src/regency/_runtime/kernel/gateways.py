"""The controller's gateways: TCP listeners opened on the interfaces worker hosts reach it on.

The controller opens one the first time it attaches a host on another machine over a given
interface; the host agent hands their IPs to the procs it starts, and RDMA listens on them.
"""

from __future__ import annotations

import threading

from regency._runtime.kernel import state
from regency._transport import address

_gateways: dict[str, str] = {}  # local IP -> the controller's TCP address on it
_lock = threading.Lock()


def gateway_toward(worker: str) -> str:
    """The controller's TCP address that worker host ``worker`` can reach (listening on the
    interface that routes there, from the first call for that interface on)."""
    runtime = state.runtime()
    ip = address.local_ip_toward(worker)
    with _lock:
        gateway = _gateways.get(ip)
        if gateway is None:
            gateway = _gateways[ip] = runtime.transport.listen_tcp(ip)
        return gateway


def gateway_ips() -> list[str]:
    """The local IPs the controller's gateways listen on (empty outside the controller, or
    before it attached a host on another machine)."""
    with _lock:
        return list(_gateways)


def clear() -> None:
    """Forget the gateways (the controller's runtime, which listened on them, is closed)."""
    with _lock:
        _gateways.clear()
