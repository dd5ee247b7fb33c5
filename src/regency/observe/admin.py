"""The mesh-admin HTTP API: this controller's hosts, procs and actors as JSON, and proc stacks.

Monarch's routes (``/v1/root``, ``/v1/tree``, ``/v1/{ref}``, ``/v1/pyspy/{proc}``), and
``/v1/telemetry/endpoints`` (per-endpoint call statistics for the dashboard) and
``/v1/telemetry/query?sql=...`` (SQL over the whole job's telemetry tables), served by the
controller from a thread of its own while enabled (:mod:`regency.observe.http_server`, which
bounds what clients without the token can hold). Every request needs
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
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote

from regency._lowlevel import find, mesh_tree, runtime, stacks_of
from regency.observe import rendezvous
from regency.observe.dashboard import HEADERS as DASHBOARD_HEADERS
from regency.observe.dashboard import dashboard_file, dashboard_link
from regency.observe.http_server import HttpServer, Request, Response

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

    def __init__(self, server: HttpServer, token: str) -> None:
        self._server = server
        self.token = token
        host, port = server.address
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self.dashboard_url = dashboard_link(self.url, token)

    def stop(self) -> None:
        """Stop serving and close the listening socket and every connection."""
        rendezvous.withdraw("admin")
        self._server.stop()

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
    admin = AdminServer(HttpServer(host, port, _AdminApp(token), "admin API", log), token)
    rendezvous.publish("admin", {"url": admin.url, "token": token})  # for `regency stacks`
    log.info("admin API at %s", admin.url)
    return admin


class _AdminApp:
    """The routes: the dashboard's files for anybody, the rest for the bearer of the token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "").encode("latin-1")
        return hmac.compare_digest(given, self._expected)

    def public(self, request: Request) -> Response:
        if request.method != "GET":
            return _json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "only GET is served"})
        page = dashboard_file(request.target.split("?", 1)[0])
        if page is not None:  # static and data-free: its script sends the token for data
            body, content_type = page
            return Response(
                HTTPStatus.OK, body, {"Content-Type": content_type, **DASHBOARD_HEADERS}
            )
        return _json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})

    def private(self, request: Request) -> Response:
        target = request.target
        if request.method != "GET" or dashboard_file(target.split("?", 1)[0]) is not None:
            return self.public(request)
        path = target.split("?", 1)[0].rstrip("/")
        parts = [unquote(p) for p in path.split("/") if p]
        if len(parts) < 2 or parts[0] != "v1":
            return _json(HTTPStatus.NOT_FOUND, {"error": f"no route {path!r}"})
        try:
            if parts[1:] == ["telemetry", "endpoints"]:
                return _telemetry_endpoints(target)
            if parts[1:] == ["telemetry", "query"]:
                return _telemetry_query(target)
            return _route(parts[1:])
        except Exception as exc:  # an answer, not a dropped connection
            log.exception("admin request %s failed", path)
            return _json(
                HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"}
            )


def _route(parts: list[str]) -> Response:
    tree = mesh_tree()
    if parts == ["tree"]:
        return _json(HTTPStatus.OK, tree)
    if parts == ["root"]:
        summary = {k: v for k, v in tree.items() if k != "hosts"}
        summary["hosts"] = [_summary(h) for h in tree["hosts"]]
        return _json(HTTPStatus.OK, summary)
    if len(parts) == 2 and parts[0] == "pyspy":
        node = find(tree, parts[1])
        if node is None or node.get("kind") != "proc":
            return _json(HTTPStatus.NOT_FOUND, {"error": f"no proc {parts[1]!r}"})
        pending = stacks_of([node["address"]], True, _STACKS_TIMEOUT)
        pending.wait(_STACKS_TIMEOUT + 5)
        (text,) = pending.outcome()
        return _json(
            HTTPStatus.OK, {"ref": node["ref"], "address": node["address"], "stacks": text}
        )
    if len(parts) == 1:
        node = find(tree, parts[0])
        if node is None:
            return _json(HTTPStatus.NOT_FOUND, {"error": f"no node {parts[0]!r}"})
        return _json(HTTPStatus.OK, node)
    return _json(HTTPStatus.NOT_FOUND, {"error": f"no route {'/'.join(parts)!r}"})


def _telemetry_endpoints(target: str) -> Response:
    from regency.observe.telemetry import endpoints

    query = parse_qs(target.partition("?")[2])
    try:
        window = float(query.get("window_s", ["60"])[-1])
        body = endpoints.report(window, runtime().job_id)
    except ValueError as exc:
        return _json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
    return _json(HTTPStatus.OK, body)


def _telemetry_query(target: str) -> Response:
    """``?sql=...``: the job's telemetry tables queried (at most :data:`QUERY_ROWS_MAX` rows)."""
    from regency.observe.telemetry import query_engine, running
    from regency.observe.telemetry.engine import QueryError

    sql = parse_qs(target.partition("?")[2]).get("sql", [""])[-1]
    if not sql.strip():
        return _json(HTTPStatus.BAD_REQUEST, {"error": "give the query as ?sql=..."})
    if not running():
        return _json(HTTPStatus.CONFLICT, {"error": "telemetry is off in this controller"})
    try:
        columns, rows = query_engine().query(sql)
    except QueryError as exc:
        return _json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
    body = {
        "columns": columns,
        "rows": [list(row) for row in rows[:QUERY_ROWS_MAX]],
        "truncated": len(rows) > QUERY_ROWS_MAX,
    }
    return _json(HTTPStatus.OK, body)


def _json(status: HTTPStatus, body: Any) -> Response:
    headers = {"Content-Type": "application/json"}
    if status == HTTPStatus.UNAUTHORIZED:
        headers["WWW-Authenticate"] = 'Bearer realm="regency"'
    # default=str: telemetry rows may hold values JSON has no type for (timestamps, decimals).
    return Response(status, json.dumps(body, indent=1, default=str).encode(), headers)


def _summary(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k in ("ref", "kind", "address", "state")}
