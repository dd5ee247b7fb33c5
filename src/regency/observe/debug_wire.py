"""The debugger's wire: JSON lines over a TCP connection, and the handshake that opens it.

Each message is one JSON object on one line (at most :data:`MAX_LINE` bytes; the handshake's
answer at most :data:`HANDSHAKE_LINE`, so a peer that has proved nothing holds little memory).
The server opens with ``{"challenge": NONCE}``; the client answers
``{"proof": HMAC(token, NONCE)}``, where the token is :func:`debug_token` of a secret the
controller holds (its own, or a job secret it attached workers with); the server answers
``{"ok": true}`` or ``{"error": ...}`` and closes. After that the server sends
``{"out": TEXT}`` (print it), ``{"read": PROMPT}`` (read a line and answer
``{"line": TEXT}``) and ``{"bye": TEXT}`` (the session is over).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from typing import Any

from regency._errors import RegencyError

MAX_LINE = 1 << 20
HANDSHAKE_LINE = 1024
_TOKEN_LABEL = b"regency debugger v1"


class WireError(RegencyError, ConnectionError):
    """The peer closed the connection or sent something that is not this protocol."""


def debug_token(secret: bytes) -> str:
    """The token that admits a debugger client to a controller holding ``secret``."""
    return hmac.new(secret, _TOKEN_LABEL, hashlib.sha256).hexdigest()


def proof(token: str, challenge: str) -> str:
    """What a client holding ``token`` answers to ``challenge``."""
    return hmac.new(token.encode(), challenge.encode(), hashlib.sha256).hexdigest()


class LineChannel:
    """JSON objects, one per line, over a connected socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = sock.makefile("rb")

    def send(self, **message: Any) -> None:
        """Send one message (raises ``OSError`` if the peer is gone)."""
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, max_line: int = MAX_LINE) -> dict[str, Any]:
        """The next message, of at most ``max_line`` bytes.

        :class:`WireError` on end of stream or a malformed line.
        """
        try:
            line = self._reader.readline(max_line + 1)
        except OSError as exc:
            raise WireError(f"connection lost: {exc}") from exc
        if not line:
            raise WireError("the peer closed the connection")
        if len(line) > max_line or not line.endswith(b"\n"):
            raise WireError(f"a line longer than {max_line} bytes")
        try:
            message = json.loads(line)
        except ValueError:
            raise WireError("a line that is not JSON") from None
        if not isinstance(message, dict):
            raise WireError("a line that is not a JSON object")
        return message

    def close(self) -> None:
        """Close the connection."""
        self._reader.close()
        self.sock.close()
