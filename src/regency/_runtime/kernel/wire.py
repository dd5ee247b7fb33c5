"""Frame kinds, flags and well-known service ids shared by every process of a job."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

# Frame kinds.
KIND_ACTOR: Final = 1  # a message for the actor whose mailbox id is ``dest``
KIND_CAST: Final = 2  # like KIND_ACTOR, plus a routing part listing procs to forward to
KIND_PORT: Final = 3  # a value for the port whose id is ``dest``
KIND_CONTROL: Final = 4  # a request for the service whose id is ``dest``

# An actor message's first part: the reply port's number (0: no reply port), then the pickled
# envelope ``(method, reply port's address or None, labels, sizes, trace context or None, sender)``
# (``sender``: the sending actor's uid while telemetry is on there, else 0).
# Without a trace context the pickle is the same for every call of one endpoint from one process,
# so the sender makes it once and the receiver decodes it once.
ENVELOPE_PORT: Final = struct.Struct("<Q")

# Port message flags.
FLAG_ERROR: Final = 1  # the value is an exception to raise at the receiver
FLAG_GATHER: Final = 2  # the value is several replies merged on the way back
FLAG_BULK: Final = 0x8000  # (any kind) the last part lists parts that wait in shared memory

# Service ids (``dest`` of KIND_CONTROL frames).
SERVICE_PROC: Final = 1  # every proc: spawn/stop actors, stop the proc
SERVICE_HOST: Final = 2  # a host agent: spawn/stop procs on its machine
SERVICE_SUPERVISION: Final = 3  # failure reports for actors owned in this proc
SERVICE_SINGLETONS: Final = 5  # the root's registry of get_or_spawn_controller singletons
SERVICE_BULK: Final = 6  # every proc: a receiver released a shared-memory region
SERVICE_TELEMETRY: Final = 7  # the root, while telemetry is on: procs' spans and metrics
SERVICE_TELEMETRY_ROWS: Final = 8  # a host agent: its host's rows of the job's telemetry tables
SERVICES: Final = frozenset({SERVICE_PROC, SERVICE_HOST, SERVICE_SUPERVISION, SERVICE_SINGLETONS})


@dataclass(frozen=True, slots=True)
class BulkRelease:
    """To ``SERVICE_BULK``: the receiver is done with the shared-memory block at ``offset``."""

    offset: int
