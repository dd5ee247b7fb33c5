"""``regency stacks``: a running controller's proc stacks, from another terminal."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

CONTROLLER = textwrap.dedent(
    """
    import sys, threading
    from regency.actor import Actor, endpoint, this_host
    from regency.observe import start_admin

    class Stuck(Actor):
        def __init__(self):
            self.release = threading.Event()

        @endpoint
        def wait_in_a_recognisable_place(self) -> None:
            self.release.wait(100)

        @endpoint
        def ping(self) -> int:
            return 1

    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="sleepers")
    stuck = procs.spawn("stuck", Stuck)
    stuck.ping.call().get()
    stuck.wait_in_a_recognisable_place.broadcast()
    admin = start_admin()
    print("ready", flush=True)
    sys.stdin.readline()  # the test says when to end
    admin.stop()
    print("stopped", flush=True)
    sys.stdin.readline()
    """
)


class Controller:
    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "controller.py"
        script.write_text(CONTROLLER)
        self.env = {**os.environ, "TMPDIR": str(tmp_path)}
        self.process = subprocess.Popen(
            [sys.executable, str(script)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "ready\n"

    def next_step(self, expected: str) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == expected

    def stacks(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "regency", "stacks", *args],
            env=self.env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    running = Controller(tmp_path)
    try:
        yield running
    finally:
        running.process.kill()
        running.process.communicate()


def test_stacks_of_every_proc_show_the_blocked_endpoint(controller: Controller) -> None:
    done = controller.stacks("--mesh", "sleepers")
    assert done.returncode == 0, done.stderr
    sections = done.stdout.split("=== proc mesh ")[1:]
    assert [s.split(" (running)")[0] for s in sections] == [
        "'sleepers' rank 0 {'gpus': 0}",
        "'sleepers' rank 1 {'gpus': 1}",
    ]
    for section in sections:
        assert "wait_in_a_recognisable_place" in section
        assert "controller.py" in section  # the script's file, not "<dynamic-code>"
        assert "regency-actor-stuck" in section


def test_a_wrong_secret_or_mesh_is_refused_with_the_reason(
    controller: Controller, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(secrets.token_hex(32))
    refused = controller.stacks("--secret-file", str(wrong))
    assert refused.returncode == 2
    assert "refused: wrong secret (HTTP 401)" in refused.stderr
    assert refused.stdout == ""
    unknown = controller.stacks("--mesh", "nosuch")
    assert unknown.returncode == 2
    assert "has no procs of proc mesh 'nosuch'" in unknown.stderr


def test_once_the_admin_api_stops_the_controller_is_not_offered(controller: Controller) -> None:
    controller.next_step("stopped\n")
    done = controller.stacks()
    assert done.returncode == 2
    assert "no running controller of yours serves the admin API" in done.stderr
