"""Shared by the telemetry tests over several hosts: waiting for rows to arrive."""

from __future__ import annotations

import time
from typing import Any

from regency.job import JobState


def rows_when(
    state: JobState, sql: str, least: int = 1, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The rows of ``sql`` once there are at least ``least`` (hosts send rows every interval),
    or what there is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        rows: list[dict[str, Any]] = state.query_engine_client.query(sql)["rows"]
        if len(rows) >= least or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)
