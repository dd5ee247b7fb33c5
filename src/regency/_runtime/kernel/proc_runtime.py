"""The router of a real process: :class:`FrameRouter` over the socket transport and its I/O loop.

Every regency process (the controller and each spawned proc) has exactly one. Unit tests run the
same router over :mod:`regency._runtime.kernel.loopback` instead.
"""

from __future__ import annotations

import socket

from regency import config
from regency._config_keys import (
    CONNECT_TIMEOUT,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    MAX_FRAME_BYTES,
)
from regency._runtime.kernel.router import FrameRouter
from regency._runtime.kernel.seam import FrameSink, LossSink
from regency._transport.io_loop import IOLoop
from regency._transport.transport import Transport


class ProcRuntime(FrameRouter):
    """The router of a real process: over the socket :class:`Transport` and its I/O loop.

    ``gateway``, ``reverse`` and ``via`` say how it reaches other machines' processes (see
    :class:`regency._transport.outbound.Paths`); a ``quiet`` one (a proc, whose host agent
    answers for its liveness) takes no part in heartbeats (see :mod:`regency._transport.
    heartbeat`).
    """

    def __init__(
        self,
        listen_address: str,
        secret: bytes,
        job_id: str,
        handoff: socket.socket | None = None,
        gateway: str | None = None,
        reverse: bool = False,
        via: dict[str, str] | None = None,
        quiet: bool = False,
    ) -> None:
        # The IPs other hosts reach the controller's machine on (set at a proc's start there).
        self.gateway_ips: list[str] = []
        frame_limit = config.value(MAX_FRAME_BYTES)
        self.loop = IOLoop()

        def connect(on_frame: FrameSink, on_peer_lost: LossSink) -> Transport:
            transport = Transport(
                listen_address,
                secret,
                on_frame,
                on_peer_lost,
                frame_limit=frame_limit,
                connect_timeout=config.value(CONNECT_TIMEOUT),
                loop=self.loop,
                heartbeat=_heartbeat_settings,
                quiet=quiet,
                handoff=handoff,
            )
            transport.gateway = gateway
            transport.use_reverse(reverse)
            transport.paths.via.update(via or {})
            # The seam's transport; the host layer also uses its socket-only parts.
            self.transport: Transport = transport
            return transport

        super().__init__(job_id, secret, connect, self.loop, frame_limit)

    def close(self) -> None:
        """Close every connection and stop the I/O thread."""
        super().close()
        self.loop.stop()


def _heartbeat_settings() -> tuple[float, float]:
    return config.value(HEARTBEAT_INTERVAL), config.value(HEARTBEAT_TIMEOUT)
