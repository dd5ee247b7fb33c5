"""A client of the mesh-admin HTTP API: ``regency stacks``, ``top``, ``telemetry sql --live``.

Every request carries the bearer token; whatever keeps the answer from being JSON (no server,
a refused token, an error status) raises :class:`AdminError` with a sentence that says which.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

from regency._errors import RegencyError

_TIMEOUT = 30.0


class AdminError(RegencyError):
    """The admin API could not be reached, refused the token, or answered an error status."""


class AdminClient:
    """The admin API at ``url`` (``http://HOST:PORT``), spoken to with bearer ``token``."""

    def __init__(self, url: str, token: str, timeout: float = _TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._timeout = timeout

    def get(self, path: str) -> Any:
        """The JSON answer to ``GET {url}{path}``."""
        url = self.url + path
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise AdminError(f"{url}: refused: wrong secret (HTTP 401)") from None
            detail = exc.read().decode(errors="replace")
            raise AdminError(f"{url}: HTTP {exc.code}: {detail}") from None
        except (OSError, ValueError) as exc:
            raise AdminError(f"cannot reach the admin API at {url}: {exc}") from None

    def tree(self) -> dict[str, Any]:
        """The whole tree (``/v1/tree``): root → hosts → procs → actors."""
        tree: dict[str, Any] = self.get("/v1/tree")
        return tree

    def query(self, sql: str) -> dict[str, Any]:
        """SQL over the job's tables (``/v1/telemetry/query``): columns, rows, truncated."""
        answer: dict[str, Any] = self.get("/v1/telemetry/query?" + urlencode({"sql": sql}))
        return answer

    def stacks(self, proc_ref: str) -> str:
        """The Python stacks of the proc whose ref is ``proc_ref`` (``/v1/pyspy/{proc}``)."""
        answer = self.get(f"/v1/pyspy/{quote(proc_ref, safe='')}")
        return str(answer.get("stacks", ""))
