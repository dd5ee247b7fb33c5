"""The dashboard (``/dashboard`` of the admin server) in a real headless Chromium.

A controller with a failed actor and a restarted one: the page shows both as they are, the
failure text as text, a proc's stacks after a click; the token travels only in the fragment and
in request headers. Needs Debian's ``chromium`` and the ``playwright`` package (dev extra); the
tests skip, saying which is missing, without them.
"""

from __future__ import annotations

import logging
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _introspect_scenario import FAILURE, Worker, build
from _screenshots import keep

from regency import config
from regency.actor import Actor, ProcMesh, endpoint
from regency.observe import AdminServer, start_admin
from regency.observe.telemetry import disable_telemetry, enable_telemetry

pytestmark = pytest.mark.timeout(240)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(
        "Debian's chromium is not installed (scripts/ci_services.sh installs it)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is missing")
expect = sync_api.expect

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 60_000


@pytest.fixture
def page() -> Iterator[Any]:
    """A page of a fresh headless Chromium that records what goes wrong in it.

    Function-scoped and requested after the controller is built: Playwright's sync API runs an
    event loop on this thread while it is open.
    """
    with sync_api.sync_playwright() as driver:
        # Playwright gives each launch a fresh temporary profile (--user-data-dir).
        browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
        page.on("response", lambda answer: _check_status(answer, errors))
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.errors = errors
        page.requested = requested
        yield page
        browser.close()


def _check_status(answer: Any, errors: list[str]) -> None:
    if answer.status >= 400:
        errors.append(f"HTTP {answer.status} for {answer.url}")


@pytest.fixture
def scenario(make_procs: Callable[..., ProcMesh]) -> dict[str, Any]:
    return build(make_procs)


@pytest.fixture
def admin() -> Iterator[AdminServer]:
    server = start_admin()
    yield server
    server.stop()


def test_dashboard_shows_the_failed_and_restarted_actors_and_stacks_on_a_click(
    admin: AdminServer,
    scenario: dict[str, Any],
    page: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="regency.admin")
    page.goto(admin.dashboard_url)

    # The token left the address bar; the page still reads the tree with it.
    assert "token" not in page.url
    failed = page.locator('tr.actor[data-state="failed"]')
    expect(failed).to_have_count(1, timeout=WAIT_MS)
    expect(failed).to_contain_text("steady[1]")
    # The failure text, HTML and all, is shown as text: no element was made from it.
    expect(failed.locator(".failure")).to_contain_text(FAILURE)
    assert page.locator("img").count() == 0
    expect(page.locator("#failures")).to_contain_text(FAILURE)
    expect(page.locator("#failures")).to_contain_text("actor steady[1]")

    running = page.locator('tr.actor[data-state="running"]')
    expect(running).to_have_count(2, timeout=WAIT_MS)  # steady[0] and the restarted one
    restarted = running.filter(has_text="restarted[0]")
    expect(restarted.locator("td.restarts")).to_have_text("1")
    steady = running.filter(has_text="steady[0]")
    assert int(steady.locator("td.handled").inner_text()) >= 3
    expect(steady.locator("td.mailbox")).to_have_text("0")
    # The proc the restart replaced is listed as failed (SIGKILL), next to its replacement.
    expect(page.locator('.proc[data-state="failed"] .reason')).to_contain_text("SIGKILL")
    expect(page.locator("#summary")).to_contain_text("3 actors (2 running, 1 failed)")
    # Telemetry is off in this controller: the charts panel says so instead of breaking.
    expect(page.locator(".telemetry-off")).to_contain_text("Telemetry off")

    # A click on a running proc of `workers` shows its stacks.
    proc = page.locator('.proc[data-state="running"]', has_text="proc mesh workers rank 0")
    proc.locator(".proc-head").click()
    expect(page.locator("#stacks-title")).to_contain_text("proc mesh workers rank 0")
    expect(page.locator("#stacks")).to_contain_text("regency-actor-steady", timeout=WAIT_MS)
    expect(proc).to_have_class(re.compile("selected"))
    keep(_shot(page, tmp_path / "dashboard.png"))

    # Stopped/failed nodes can be hidden, and the summary counts them.
    page.locator("#show-ended").uncheck()
    expect(page.locator('tr.actor[data-state="failed"]')).to_have_count(0)
    expect(page.locator("#summary")).to_contain_text("stopped/failed hidden")
    page.locator("#show-ended").check()
    expect(page.locator('tr.actor[data-state="failed"]')).to_have_count(1)

    assert page.errors == []
    # The token never reached a request line (the page sends it in a header), so no server log
    # has it either.
    assert any("/dashboard" in url for url in page.requested)
    assert not [url for url in page.requested if admin.token in url]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert admin.token not in logged

    # The controller's admin server goes away: the page says so and keeps the last tree.
    admin.stop()
    expect(page.locator("#status")).to_contain_text("cannot reach the controller", timeout=WAIT_MS)
    expect(page.locator("#status")).to_contain_text("showing the last answer")
    expect(page.locator('tr.actor[data-state="failed"]')).to_have_count(1)


class Crasher(Actor):
    """Fails with a message of several lines (the page folds it under its last line)."""

    @endpoint
    def crash(self) -> None:
        raise RuntimeError("the first line of a long story\nand how it ended")


@pytest.fixture
def charted(make_procs: Callable[..., ProcMesh], tmp_path: Path) -> Iterator[None]:
    """Telemetry on, and five calls to ``charted.pid`` (before the page: see ``page``)."""
    with config.configured(
        telemetry_db=str(tmp_path / "telemetry.db"), otel_metric_export_interval="100ms"
    ):
        enable_telemetry()
        try:
            workers = make_procs(2, name="charted").spawn("charted", Worker)
            for _ in range(5):
                workers.pid.call().get()
            procs = make_procs(1, name="crashing")
            procs.spawn("crasher", Crasher).crash.broadcast()  # a failure of several lines
            yield
        finally:
            disable_telemetry()


def test_dashboard_charts_each_endpoint_from_telemetry(
    admin: AdminServer, charted: None, page: Any, tmp_path: Path
) -> None:
    page.goto(admin.dashboard_url)
    card = page.locator('.endpoint[data-endpoint="charted.pid"]')
    expect(card).to_contain_text("5 calls", timeout=WAIT_MS)
    expect(card.locator("svg")).to_have_count(2)  # latency and calls per second
    keep(_shot(page, tmp_path / "dashboard-telemetry.png"))

    # A traceback the user opened stays open when the page redraws the failures.
    details = page.locator("#failures details").first
    details.locator("summary").click()
    expect(details).to_have_attribute("open", "")
    page.evaluate("document.querySelector('#failures details').dataset.drawn = 'before'")
    page.locator("#refresh").click()
    page.wait_for_function(
        "() => { const d = document.querySelector('#failures details');"
        " return d && d.dataset.drawn === undefined; }",
        timeout=WAIT_MS,
    )
    expect(page.locator("#failures details").first).to_have_attribute("open", "")
    assert page.errors == []


def test_the_sql_panel_shows_the_rows_of_a_query_over_the_jobs_tables(
    admin: AdminServer, charted: None, page: Any
) -> None:
    page.goto(admin.dashboard_url)
    received = (  # this test's mesh: the newest named so (the controller serves every test)
        "SELECT msg.endpoint, COUNT(*) AS received FROM messages msg "
        "JOIN actors a ON msg.to_actor_id = a.id WHERE a.mesh_id = (SELECT id FROM meshes "
        "WHERE given_name = 'charted' ORDER BY timestamp_us DESC LIMIT 1) GROUP BY msg.endpoint"
    )
    page.fill("#sql-input", received)
    table = page.locator("#sql-result table.sql")
    deadline_rows = ["endpoint", "received", "pid", "10"]  # 5 calls to a mesh of 2

    def shown() -> bool:
        page.locator("#sql-form button").click()
        page.wait_for_function(
            "() => document.getElementById('sql-status').textContent !== 'running…'"
        )
        return table.count() == 1 and table.inner_text().split() == deadline_rows

    assert any(shown() for _ in range(50)), page.locator("#sql-status").inner_text()
    expect(page.locator("#sql-status")).to_have_text("1 row")
    page.fill("#sql-input", "SELECT nope FROM meshes")
    page.locator("#sql-form button").click()
    expect(page.locator("#sql-status")).to_contain_text("No field named nope", timeout=WAIT_MS)
    expect(table).to_have_count(0)
    assert [e for e in page.errors if "telemetry/query" not in e] == []  # the 400 is expected


def test_without_the_token_the_page_asks_for_it_and_shows_no_data(
    admin: AdminServer, page: Any, tmp_path: Path
) -> None:
    page.goto(admin.url + "/dashboard")
    expect(page.locator("#token-form")).to_be_visible()
    expect(page.locator("#tree .host")).to_have_count(0)

    page.locator("#token-input").fill("0" * 64)
    page.locator("#token-form button").click()
    expect(page.locator("#token-why")).to_contain_text("refused this token (HTTP 401)")
    keep(_shot(page, tmp_path / "dashboard-token.png"))

    page.locator("#token-input").fill(admin.token)
    page.locator("#token-form button").click()
    expect(page.locator("#token-form")).to_be_hidden()
    expect(page.locator("#controller")).to_contain_text("controller pid", timeout=WAIT_MS)
    assert page.errors
    assert all(error.startswith("HTTP 401 for") for error in page.errors), page.errors


def test_the_page_is_served_without_a_token_with_a_strict_policy(admin: AdminServer) -> None:
    with urllib.request.urlopen(admin.url + "/dashboard", timeout=30) as response:
        html = response.read().decode()
        headers = response.headers
    assert '<script src="/dashboard/app.js"' in html
    assert admin.token not in html
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "connect-src 'self'" in policy
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["X-Content-Type-Options"] == "nosniff"
    for script in ("dom.js", "charts.js", "app.js"):
        with urllib.request.urlopen(f"{admin.url}/dashboard/{script}", timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/javascript")
            assert b"innerHTML" not in response.read()  # elements are made from text only
    # The data stays behind the token.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(admin.url + "/v1/tree", timeout=30)
    assert refused.value.code == 401
    assert admin.dashboard_url == f"{admin.url}/dashboard#token={admin.token}"


def _shot(page: Any, path: Path) -> Path:
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path
