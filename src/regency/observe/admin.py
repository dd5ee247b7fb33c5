"""The mesh-admin HTTP API: this controller's hosts, procs and actors as JSON, and proc stacks.

Monarch's routes (``/v1/root``, ``/v1/tree``, ``/v1/{ref}``, ``/v1/pyspy/{proc}``), and
``/v1/telemetry/endpoints`` (per-endpoint call statistics for the dashboard) and
``/v1/telemetry/query?sql=...`` (SQL over the whole job's telemetry tables), served by the
controller from a thread of its own while enabled. Every request needs
``Authorization: Bearer TOKEN``; the token is derived from a secret (the job's, or this
controller's), so whoever holds the secret can compute it and nobody else can (401 otherwise).
It listens on loopback unless told otherwise, and refuses a non-loopback address unless
``allow_remote=True``. A running server is named in this user's controller file
(:mod:`regency.observe.rendezvous`), where ``regency stacks`` finds it. The same server serves
the dashboard's page (:mod:`regency.observe.dashboard`), whose data requests carry the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

from regency._lowlevel import find, mesh_tree, runtime, stacks_of
from regency.observe import rendezvous
from regency.observe.dashboard import HEADERS as DASHBOARD_HEADERS
from regency.observe.dashboard import dashboard_file, dashboard_link

log = logging.getLogger("regency.admin")

_TOKEN_LABEL = b"regency mesh admin v1"
_STACKS_TIMEOUT = 10.0
QUERY_ROWS_MAX = 10_000
"""The most rows ``/v1/telemetry/query`` answers (``truncated`` says when there were more)."""


def admin_token(secret: bytes) -> str:
    """The bearer token of the admin API of a controller or job holding ``secret``."""
    return hmac.new(secret, _TOKEN_LABEL, hashlib.sha256).hexdigest()


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"admin address {address!r} is not HOST:PORT (PORT 0: any free port)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AdminServer:
    """A running admin API; ``url`` and ``token`` say how to reach it, ``stop()`` ends it.

    ``dashboard_url`` opens its dashboard; it holds the token (in its fragment), so it admits
    whoever has it, as the token does.
    """

    def __init__(self, server: ThreadingHTTPServer, token: str) -> None:
        self._server = server
        self.token = token
        host, port = str(server.server_address[0]), int(server.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self.dashboard_url = dashboard_link(self.url, token)
        self._thread = threading.Thread(
            target=server.serve_forever, name="regency-admin", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        rendezvous.withdraw("admin")
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __repr__(self) -> str:
        return f"AdminServer({self.url})"


def start_admin(
    address: str = "127.0.0.1:0", *, secret: bytes | None = None, allow_remote: bool = False
) -> AdminServer:
    """Serve the admin API of this controller at ``address`` (``HOST:PORT``; port 0 picks one).

    The bearer token is :func:`admin_token` of ``secret`` (default: this controller's own
    secret). An address that is not loopback raises ``ValueError`` unless ``allow_remote``.
    """
    host, port = _split_address(address)
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(
            f"admin address {address!r} is not a loopback address; pass allow_remote=True to "
            "serve the admin API to other machines"
        )
    token = admin_token(secret if secret is not None else runtime().secret)

    class Handler(_Handler):
        expected = f"Bearer {token}"

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    admin = AdminServer(server, token)
    rendezvous.publish("admin", {"url": admin.url, "token": token})  # for `regency stacks`
    log.info("admin API at %s", admin.url)
    return admin


class _Handler(BaseHTTPRequestHandler):
    expected = ""
    server_version = "regency-admin/1"

    def do_GET(self) -> None:
        page = dashboard_file(self.path.split("?", 1)[0])
        if page is not None:  # static and data-free: its script sends the token for data
            self._send_page(*page)
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), self.expected.encode()):
            self._send(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        parts = [unquote(p) for p in path.split("/") if p]
        if len(parts) < 2 or parts[0] != "v1":
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {path!r}"})
            return
        try:
            if parts[1:] == ["telemetry", "endpoints"]:
                self._telemetry_endpoints()
            elif parts[1:] == ["telemetry", "query"]:
                self._telemetry_query()
            else:
                self._route(parts[1:])
        except Exception as exc:  # an answer, not a dropped connection
            log.exception("admin request %s failed", path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})

    def _route(self, parts: list[str]) -> None:
        tree = mesh_tree()
        if parts == ["tree"]:
            self._send(HTTPStatus.OK, tree)
        elif parts == ["root"]:
            summary = {k: v for k, v in tree.items() if k != "hosts"}
            summary["hosts"] = [_summary(h) for h in tree["hosts"]]
            self._send(HTTPStatus.OK, summary)
        elif len(parts) == 2 and parts[0] == "pyspy":
            node = find(tree, parts[1])
            if node is None or node.get("kind") != "proc":
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no proc {parts[1]!r}"})
                return
            pending = stacks_of([node["address"]], True, _STACKS_TIMEOUT)
            pending.wait(_STACKS_TIMEOUT + 5)
            (text,) = pending.outcome()
            body = {"ref": node["ref"], "address": node["address"], "stacks": text}
            self._send(HTTPStatus.OK, body)
        elif len(parts) == 1:
            node = find(tree, parts[0])
            if node is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no node {parts[0]!r}"})
            else:
                self._send(HTTPStatus.OK, node)
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {'/'.join(parts)!r}"})

    def _telemetry_endpoints(self) -> None:
        from regency.observe.telemetry import endpoints

        query = parse_qs(self.path.partition("?")[2])
        try:
            window = float(query.get("window_s", ["60"])[-1])
            body = endpoints.report(window, runtime().job_id)
        except ValueError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        self._send(HTTPStatus.OK, body)

    def _telemetry_query(self) -> None:
        """``?sql=...``: the job's telemetry tables queried (at most :data:`QUERY_ROWS_MAX`)."""
        from regency.observe.telemetry import query_engine, running
        from regency.observe.telemetry.engine import QueryError

        sql = parse_qs(self.path.partition("?")[2]).get("sql", [""])[-1]
        if not sql.strip():
            self._send(HTTPStatus.BAD_REQUEST, {"error": "give the query as ?sql=..."})
            return
        if not running():
            self._send(HTTPStatus.CONFLICT, {"error": "telemetry is off in this controller"})
            return
        try:
            columns, rows = query_engine().query(sql)
        except QueryError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        body = {
            "columns": columns,
            "rows": [list(row) for row in rows[:QUERY_ROWS_MAX]],
            "truncated": len(rows) > QUERY_ROWS_MAX,
        }
        self._send(HTTPStatus.OK, body)

    def _send(self, status: HTTPStatus, body: Any) -> None:
        data = json.dumps(body, indent=1, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="regency"')
        self.end_headers()
        self.wfile.write(data)

    def _send_page(self, body: bytes, content_type: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in DASHBOARD_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("admin %s: " + format, self.address_string(), *args)


def _summary(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k in ("ref", "kind", "address", "state")}
