"""``regency top`` (the textual TUI) and ``regency dashboard``, over a controller's admin API.

The controller has a failed actor and a restarted one. Headless, textual's pilot presses the
keys; once through tmux, a real terminal shows what a person sees (tmux skips when absent).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _introspect_scenario import FAILURE, build
from _screenshots import keep

from regency.actor import ProcMesh
from regency.observe import AdminServer, start_admin

pytest.importorskip("textual", reason="textual (the tui extra) is missing")

from regency.observe.admin_client import AdminClient
from regency.observe.tui import TopApp

pytestmark = pytest.mark.timeout(240)

SCENARIO = Path(__file__).with_name("_introspect_scenario.py")
WAIT = 60.0


@pytest.fixture
def admin() -> Iterator[AdminServer]:
    server = start_admin()
    yield server
    server.stop()


async def _until(pilot: Any, check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def _labels(app: TopApp) -> dict[str, tuple[str, str]]:
    """Each tree node's ref -> (its label as shown, its state)."""
    out = {}
    stack = [app.query_one("#tree").root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.data is not None:
            out[node.data["ref"]] = (node.label.plain, node.data.get("state"))
    return out


def _text(app: TopApp, widget: str) -> str:
    return str(app.query_one(widget).content)


def test_top_shows_the_failed_actor_and_stacks_of_the_selected_proc(
    admin: AdminServer, make_procs: Callable[..., ProcMesh], tmp_path: Path
) -> None:
    build(make_procs)
    app = TopApp(AdminClient(admin.url, admin.token), interval=0.5)

    async def scenario(pilot: Any) -> None:
        def failed_shown() -> bool:
            return any(
                "failed" in label and "steady[1]" in label for label, _ in _labels(app).values()
            )

        await _until(pilot, failed_shown, "the failed actor")
        (failed,) = [
            lab for lab, state in _labels(app).values() if state == "failed" and "steady" in lab
        ]
        assert FAILURE in failed  # the HTML in it shown as it is
        (restarted,) = [lab for lab, _ in _labels(app).values() if lab.startswith("restarted[0]")]
        assert "running" in restarted
        assert "restarts 1" in restarted
        assert "3 actors (2 running, 1 failed)" in _text(app, "#status")

        # Down from the root: the host, then proc 0 of `workers`; its details show beside.
        await pilot.press("down", "down")
        await _until(pilot, lambda: "proc_mesh: workers" in _text(app, "#details"), "proc details")
        assert "rank: 0" in _text(app, "#details")
        await pilot.press("p")
        await _until(
            pilot, lambda: "regency-actor-steady" in _text(app, "#stacks"), "the proc's stacks"
        )
        assert _text(app, "#stacks").startswith("Stacks of proc mesh workers rank 0")
        # The failed actor's details hold its whole failure text.
        await pilot.press("down", "down", "down")
        await _until(pilot, lambda: "failure: " in _text(app, "#details"), "failure details")
        assert FAILURE in _text(app, "#details")
        keep(Path(app.save_screenshot("tui.svg", str(tmp_path))))

        # h hides the stopped and failed nodes (the failed actor and the SIGKILLed proc).
        await pilot.press("h")
        await _until(pilot, lambda: "hidden" in _text(app, "#status"), "the hidden count")
        assert not [s for _, s in _labels(app).values() if s in ("failed", "stopped")]
        assert "2 stopped/failed hidden" in _text(app, "#status")
        await pilot.press("h")
        await _until(pilot, lambda: "failed" in {s for _, s in _labels(app).values()}, "shown")

        # The admin server goes away: the status line says so, the last tree stays.
        admin.stop()
        await _until(pilot, lambda: "cannot reach" in _text(app, "#status"), "the error")
        assert "(showing the last answer)" in _text(app, "#status")
        assert any(s == "failed" for _, s in _labels(app).values())

    asyncio.run(_run(app, scenario))


async def _run(app: TopApp, scenario: Callable[[Any], Awaitable[None]]) -> None:
    async with app.run_test(size=(180, 45)) as pilot:
        await scenario(pilot)


# ---- through a real terminal --------------------------------------------------------------


class Controller:
    """The scenario in a controller process of its own, found through its controller file."""

    def __init__(self, tmp_path: Path) -> None:
        self.env = {
            **os.environ,
            "TMPDIR": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([str(SCENARIO.parent), os.environ.get("PYTHONPATH", "")]),
        }
        self.process = subprocess.Popen(
            [sys.executable, str(SCENARIO)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("ready "), line
        self.pid = int(line.split()[1])

    def regency(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "regency", *args],
            env=self.env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    process = Controller(tmp_path_factory.mktemp("controller"))
    try:
        yield process
    finally:
        process.close()


class Tmux:
    """A tmux server of this test's own, one session running one command."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        # A socket in the test's temporary directory: no server or socket of the user's touched.
        self.socket = str(Path(env["TMPDIR"]) / f"tmux-{uuid.uuid4().hex[:8]}")
        self.env = env
        self._tmux(
            "new-session", "-d", "-s", "top", "-x", "200", "-y", "50",
            "-e", f"TMPDIR={env['TMPDIR']}", *command,
        )  # fmt: skip

    def _tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-S", self.socket, *args],
            env=self.env,
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "top").stdout

    def keys(self, *keys: str) -> None:
        assert self._tmux("send-keys", "-t", "top", *keys).returncode == 0

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", "top").returncode == 0

    def wait_for(self, pattern: str, what: str) -> str:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{self.screen()}")

    def kill(self) -> None:
        self._tmux("kill-server")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_in_a_terminal_through_tmux(controller: Controller) -> None:
    top = [sys.executable, "-m", "regency", "top", "--pid", str(controller.pid)]
    tmux = Tmux(top, controller.env)
    try:
        screen = tmux.wait_for(r"steady\[1\].*failed", "the failed actor")
        assert re.search(r"steady\[1\].*failed.*endpoint explode raised RuntimeError", screen)
        assert re.search(r"restarted\[0\].*running.*restarts 1", screen)
        assert "3 actors (2 running, 1 failed)" in screen

        # The cursor starts on the controller; five lines down is the failed actor, whose
        # details show its whole failure text (wrapped in the side panel).
        tmux.keys("Down", "Down", "Down", "Down", "Down")
        screen = tmux.wait_for(r"failure: endpoint explode raised", "the failed actor's details")
        assert "<img" in screen.partition("failure: ")[2]

        # Three up is proc 0 of `workers`: p shows its stacks.
        tmux.keys("Up", "Up", "Up")
        tmux.wait_for(r"proc_mesh: workers", "the proc's details")
        tmux.keys("p")
        screen = tmux.wait_for(r"regency-actor-steady", "the proc's stacks")
        assert "Stacks of proc mesh workers rank 0" in screen

        tmux.keys("h")
        screen = tmux.wait_for(r"stopped/failed hidden", "the hidden count")
        assert "steady[1]" not in screen
        tmux.keys("q")
        deadline = time.monotonic() + WAIT
        while tmux.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not tmux.alive(), "q did not end regency top"
    finally:
        tmux.kill()


def test_dashboard_command_prints_a_working_link(controller: Controller) -> None:
    done = controller.regency("dashboard", "--pid", str(controller.pid))
    assert done.returncode == 0, done.stderr
    link = done.stdout.strip()
    base, _, fragment = link.partition("#")
    assert base.startswith("http://127.0.0.1:")
    assert base.endswith("/dashboard")
    token = fragment.removeprefix("token=")
    tree = AdminClient(base.removesuffix("/dashboard"), token).tree()
    assert tree["pid"] == controller.pid
    with urllib.request.urlopen(base, timeout=30) as page:
        assert b"/dashboard/app.js" in page.read()


def test_top_and_dashboard_say_what_is_wrong(controller: Controller, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.hex"
    wrong.write_text(os.urandom(32).hex())
    for command in ("top", "dashboard"):
        done = controller.regency(
            command, "--pid", str(controller.pid), "--secret-file", str(wrong)
        )
        assert done.returncode == 2
        assert f"regency {command}:" in done.stderr
        assert "refused: wrong secret (HTTP 401)" in done.stderr
    done = controller.regency("top", "--pid", "1")
    assert done.returncode == 2
    assert "no running controller 1 serves the admin API" in done.stderr
    done = controller.regency("top", "--pid", str(controller.pid), "--interval", "0")
    assert done.returncode == 2
    assert "--interval must be > 0" in done.stderr
