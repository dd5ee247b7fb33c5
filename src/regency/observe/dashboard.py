"""The dashboard: a web page the admin server serves, drawn from the admin API by its script.

The page, its script and its style sheet (``dashboard_static/``) are static files, served
without a token because they hold no data. Every data request of the page carries the bearer
token, which reaches the page in the fragment of the link :func:`dashboard_link` makes
(``/dashboard#token=...``): a browser never sends a fragment to a server, so the token stays out
of request lines, server logs, proxies and ``Referer`` headers. The script keeps it in the tab's
``sessionStorage`` and takes it off the address bar. A strict Content-Security-Policy lets the
page run only its own script and style and connect only to its own origin, and the script makes
every element from text, never from HTML, so actor names and failure texts cannot run code in
the page (and read the token).
"""

from __future__ import annotations

from importlib import resources

_FILES = {
    "/": "index.html",
    "/dashboard": "index.html",
    "/dashboard/dom.js": "dom.js",
    "/dashboard/charts.js": "charts.js",
    "/dashboard/app.js": "app.js",
    "/dashboard/app.css": "app.css",
    "/favicon.ico": "favicon.svg",
    "/dashboard/favicon.svg": "favicon.svg",
}
_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
_loaded: dict[str, bytes] = {}

#: Headers sent with every dashboard file.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def dashboard_link(url: str, token: str) -> str:
    """The dashboard of the admin API at ``url``, with ``token`` in the URL's fragment."""
    return f"{url.rstrip('/')}/dashboard#token={token}"


def dashboard_file(path: str) -> tuple[bytes, str] | None:
    """The body and content type of the dashboard's file at URL ``path``; ``None`` if none."""
    name = _FILES.get(path)
    if name is None:
        return None
    body = _loaded.get(name)
    if body is None:
        body = (resources.files("regency.observe") / "dashboard_static" / name).read_bytes()
        _loaded[name] = body
    return body, _TYPES[name.rpartition(".")[2]]
