"""Errors and warnings of :mod:`regency.rdma`.

Bad arguments (a destination too small, a source too large, a read-only registration written
to, an unsupported memory object) raise built-in ``ValueError`` or ``TypeError`` at once, before
anything moves. Everything that goes wrong during a transfer fails its ``Future`` with an
:class:`RDMAError`::

    RegencyError + RuntimeError
     └── RDMAError
          ├── RDMABufferDroppedError     the registration was dropped (before or during)
          ├── RDMAOwnerGoneError         the owner's process is dead or unreachable
          ├── RDMABackendError           the requested backend cannot serve this transfer
          └── RDMATimeoutError ──────┐   the transfer did not finish within its timeout
    RegencyError + TimeoutError      │
     └── DeadlineError ──────────────┘   the transport's error for a passed deadline

Warnings::

    RuntimeWarning
     ├── RDMAFallbackWarning             a faster backend was refused; a slower one is used
     │    └── RDMATcpFallbackWarning     ... and that slower one is TCP
     ├── RDMAReadTransferWarning         Monarch's names for its once-per-process GPU-transfer
     └── RDMAWriteTransferWarning        warnings; exported so Monarch filters still import

(:class:`regency.RegencyError` is the root of all of regency's errors; :mod:`regency._errors`
draws the whole tree.) Inside a transfer the backends raise the transport's own errors
(``DeadlineError``, ``ConnectionClosedError``); the engine turns each into one of these before
a ``Future`` fails with it.
"""

from __future__ import annotations

from regency._errors import RegencyError
from regency._transport.deadline import DeadlineError


class RDMAError(RegencyError, RuntimeError):
    """A one-sided transfer failed; the destination's contents are unspecified."""


class RDMABufferDroppedError(RDMAError):
    """The buffer's registration was dropped before or while the transfer ran."""


class RDMAOwnerGoneError(RDMAError):
    """The process that owns the buffer is dead or can no longer be reached."""


class RDMABackendError(RDMAError):
    """The backend asked for (by keyword or ``REGENCY_RDMA_BACKEND``) cannot do this transfer."""


class RDMATimeoutError(RDMAError, DeadlineError):
    """The transfer did not finish within its ``timeout``; it is abandoned, not retried."""


class RDMAFallbackWarning(RuntimeWarning):
    """A faster backend was refused (e.g. cross-memory attach by the kernel); emitted once."""


class RDMATcpFallbackWarning(RDMAFallbackWarning):
    """Transfers that would use a faster path go over TCP instead; emitted once."""


class RDMAReadTransferWarning(RuntimeWarning):
    """Monarch's once-per-process read-transfer warning; regency defines it for filters only."""


class RDMAWriteTransferWarning(RuntimeWarning):
    """Monarch's once-per-process write-transfer warning; regency defines it for filters only."""
