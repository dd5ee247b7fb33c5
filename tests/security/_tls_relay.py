"""The relay attacker of a shared CA: it holds a leaf of the CA both ends trust, terminates TLS
on both sides, relays the secret handshake unchanged and then injects a frame of its own.

It serves one connection: it reads the dialer's route preamble, answers its TLS as a server
with its own leaf, dials the real listener with the same preamble and the same leaf as a client,
copies the three handshake messages across, and, if the listener answered with its proof,
sends the forged frame to the listener ahead of whatever the dialer sends next.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
import tempfile
import threading

from regency._transport import auth, routing, tls

_ADDR_LEN = struct.Struct("<H")


def _context(identity: tls.Identity, server: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=identity.ca_pem.decode())
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(identity.cert_pem.rstrip() + b"\n" + identity.key_pem)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
    return ctx


def _exactly(sock: ssl.SSLSocket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


class TLSRelay:
    """A TLS-terminating relay to ``target`` presenting ``identity`` (another leaf of the CA).

    ``outcome`` says how far it got: ``"relayed"`` (both ends accepted the relayed handshake
    and the forged frame went to the listener), ``"refused by the listener"`` (it answered the
    relayed proof with a refusal or hung up), or what else failed. ``seen`` holds the plaintext
    the dialer sent after the handshake.
    """

    def __init__(
        self, target: tuple[str, int], identity: tls.Identity, forged: bytes, host: str
    ) -> None:
        self.target = target
        self.forged = forged
        self.host = host
        self._server = _context(identity, server=True)
        self._client = _context(identity, server=False)
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self.outcome: str | None = None
        self.done = threading.Event()
        self.seen = bytearray()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def _serve(self) -> None:
        try:
            self.outcome = self._relay()
        except (OSError, ValueError) as exc:
            self.outcome = f"failed: {exc}"
        finally:
            self.done.set()

    def _relay(self) -> str:
        raw, _ = self._listener.accept()
        self._socks.append(raw)
        raw.settimeout(10)
        reader = routing.PreambleReader()
        route = None
        while route is None:
            data = raw.recv(reader.missing())
            if not data:
                return "the dialer hung up before its preamble"
            route = reader.feed(data)
        dialer = self._server.wrap_socket(raw, server_side=True)
        self._socks.append(dialer)
        up = socket.create_connection(self.target, timeout=10)
        self._socks.append(up)
        up.sendall(routing.preamble(route.key, tls=True))
        listener = self._client.wrap_socket(up, server_hostname="user.regency")
        self._socks.append(listener)
        # The handshake, message by message, unchanged.
        dialer.sendall(_exactly(listener, auth.HELLO_LEN))
        head = _exactly(dialer, auth.REPLY_HEAD)
        (addr_len,) = _ADDR_LEN.unpack_from(head, auth.MAC + auth.NONCE)
        listener.sendall(head + _exactly(dialer, addr_len + auth.MAC))
        try:
            answer = _exactly(listener, auth.MAC)
        except ConnectionError:
            answer = b""
        if not answer or answer == auth.REFUSED:
            if answer:
                dialer.sendall(answer)
            return "refused by the listener"
        dialer.sendall(answer)
        listener.sendall(self.forged)
        # Then carry the dialer's frames (reading them on the way) until it goes quiet.
        dialer.settimeout(2)
        with contextlib.suppress(OSError):
            while chunk := dialer.recv(65536):
                self.seen += chunk
                listener.sendall(chunk)
        return "relayed"

    def close(self) -> None:
        self._listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.close()
        self._thread.join(15)
