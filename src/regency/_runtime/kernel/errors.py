"""The kernel's errors: what the layers above see of the transport's failures.

The transport (:mod:`regency._transport`) raises its own ``PeerUnreachableError``; the router
translates it at this edge, so the actor and host layers (and :mod:`regency._lowlevel`'s users)
catch :class:`PeerLostError` and never import the transport's errors.
"""

from __future__ import annotations

from regency._errors import RegencyError


class PeerLostError(RegencyError, ConnectionError):
    """A process this one sends to is gone or cannot be reached; the text says why."""
