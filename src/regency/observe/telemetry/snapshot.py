"""Introspection snapshots: the job's tree of hosts, procs and actors, captured into SQL tables.

Every capture takes the controller's tree (the admin API's ``/v1/tree``: root -> hosts ->
procs -> actors, with each proc's own account of its actors) and writes it as rows of
Monarch's snapshot tables (:data:`~.schema.TABLES`): one ``snapshots`` row, a ``nodes`` row
per node, a ``children`` row per link, and per node kind a ``root_nodes``, ``host_nodes``,
``proc_nodes`` or ``actor_nodes`` row; ``actor_failures`` for a failed actor and
``resolution_errors`` for a proc that did not answer. Node ids are ``root``,
``host:<host agent address>``, the proc's address, and the actor's ``full_name`` (as in the
``actors`` table, so the two join). Regency has no per-sender ordering sessions to show, so
``actor_inbound_orderings`` and ``ordering_sessions`` stay empty.

:class:`PeriodicSnapshots` captures on a period of its own thread (``TelemetryConfig``'s
``snapshot_interval_secs``), the first one period after it starts.
"""

from __future__ import annotations

import getpass
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from regency.observe.telemetry.rows import Row

log = logging.getLogger("regency.telemetry")

Tree = dict[str, Any]
_ENDED = frozenset({"stopped", "failed"})


def snapshot_rows(tree: Tree, at_us: int, started_at_us: int | None = None) -> dict[str, list[Row]]:
    """The snapshot tables' rows of one capture of ``tree`` (``mesh_tree()``'s) at ``at_us``.

    ``started_at_us`` is the root's ``started_at`` (when the captures began); times are
    microseconds since the epoch.
    """
    sid = str(uuid.uuid4())
    rows: dict[str, list[Row]] = {
        "snapshots": [(sid, at_us)],
        "nodes": [(sid, "root", "root", at_us)],
        "children": [],
        "root_nodes": [],
        "host_nodes": [],
        "proc_nodes": [],
        "actor_nodes": [],
        "actor_failures": [],
        "resolution_errors": [],
    }

    def node(node_id: str, kind: str, parent: str, sort_key: int, ended: bool) -> None:
        rows["nodes"].append((sid, node_id, kind, at_us))
        rows["children"].append((sid, parent, node_id, sort_key, False, ended))

    hosts = tree.get("hosts", [])
    rows["root_nodes"].append((sid, "root", len(hosts), started_at_us, _user()))
    for h, host in enumerate(hosts):
        host_id = f"host:{host['address']}"
        procs = host.get("procs", [])
        node(host_id, "host", "root", h, False)
        rows["host_nodes"].append((sid, host_id, host["address"], len(procs)))
        for p, proc in enumerate(procs):
            proc_id = proc["address"]
            node(proc_id, "proc", host_id, p, proc["state"] in _ENDED)
            actors = proc.get("actors", [])
            failed = sum(1 for a in actors if a["state"] == "failed")
            rows["proc_nodes"].append(
                (sid, proc_id, f"{proc['proc_mesh']}-{proc['rank']}", len(actors), None,
                 proc["state"] == "failed", failed)
            )  # fmt: skip
            if proc["state"] == "unknown":
                rows["resolution_errors"].append((sid, proc_id, "unreachable", proc["reason"]))
            for a, actor in enumerate(actors):
                actor_id = actor["full_name"]
                node(actor_id, "actor", proc_id, a, actor["state"] in _ENDED)
                rows["actor_nodes"].append(
                    (sid, actor_id, actor["state"], actor["class"], actor["ref"],
                     actor["messages_handled"], None, None, None, actor["mailbox_depth"], False)
                )  # fmt: skip
                if actor["state"] == "failed":
                    rows["actor_failures"].append(
                        (sid, actor_id, actor["failure"], actor_id, actor["name"], None, False)
                    )
    return rows


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        return None


class PeriodicSnapshots:
    """Captures ``tree()`` into ``sink`` every ``interval`` seconds, on a thread of its own.

    ``tree()`` returns ``None`` when there is nothing to capture now (telemetry is off); ``sink``
    takes the rows of one capture (by table). A capture that fails is logged and the next one
    is tried on time. :meth:`stop` ends the thread.
    """

    def __init__(
        self,
        interval: float,
        tree: Callable[[], Tree | None],
        sink: Callable[[dict[str, list[Row]]], None],
    ) -> None:
        if not interval > 0:
            raise ValueError(f"a snapshot interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self._tree = tree
        self._sink = sink
        self._started_at = time.time_ns() // 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regency-snapshots", daemon=True)
        self._thread.start()

    def capture(self) -> None:
        """Take one snapshot now (unless ``tree()`` has none)."""
        tree = self._tree()
        if tree is not None:
            self._sink(snapshot_rows(tree, time.time_ns() // 1000, self._started_at))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.capture()
            except Exception:
                log.exception("telemetry: a snapshot capture failed")

    def stop(self) -> None:
        """Stop capturing (a capture under way finishes first)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
