"""A job's telemetry: ``enable_telemetry()`` then ``state()``; procs on every host follow."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from _worker_helpers import Probe

from regency import config
from regency.job import ProcessJob, TelemetryConfig
from regency.observe.telemetry import run_sql, running

pytestmark = pytest.mark.timeout(180)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _wait(what: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_a_jobs_procs_on_every_host_send_their_spans_to_the_controller(tmp_path: Path) -> None:
    db = tmp_path / "telemetry.db"
    job = ProcessJob({"hosts": 2}).enable_telemetry(TelemetryConfig(retention_secs=600))
    with config.configured(
        telemetry_db=str(db), telemetry_traces_per_s=1e6, otel_metric_export_interval="100ms"
    ):
        try:
            state = job.state(cached_path=None)
            assert running()
            assert config.get("telemetry_retention") == 600.0
            procs = state.hosts.spawn_procs(per_host={"gpus": 1})
            probes = procs.spawn("probes", Probe)
            probes.where.call().get(timeout=60)
            agents = sorted(h.agent for h in state.hosts._hosts)

            def handled_on_both_hosts() -> list[str]:
                found = run_sql(
                    "SELECT DISTINCT proc FROM spans WHERE kind = 'handle' "
                    "AND endpoint = 'probes.where'",
                    db,
                )[1]
                procs_seen = sorted(row[0] for row in found)
                return procs_seen if len(procs_seen) == 2 else []

            seen = _wait(handled_on_both_hosts)
            assert [p.rpartition("/")[0] for p in seen] == agents  # one proc under each host
            assert state.telemetry_url is not None
            request = urllib.request.Request(
                state.telemetry_url + "?window_s=120",
                headers={"Authorization": f"Bearer {state.admin_token}"},
            )

            def reported() -> dict[str, Any] | None:
                with urllib.request.urlopen(request, timeout=30) as response:
                    body = json.loads(response.read())
                names = [e["name"] for e in body["endpoints"]]
                return body if "probes.where" in names else None

            body = _wait(reported)
            assert body is not None
            assert body["enabled"] is True
        finally:
            job.kill()
    assert not running()  # the job's kill switched it off
