"""``breakpoint()`` in an endpoint, driven from ``regency debug`` in a real terminal (a pty).

Each test runs a controller script in its own process (as a user would) and the debugger client
under ``pexpect``; both get a private ``TMPDIR`` so the client finds exactly that controller.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

pytestmark = pytest.mark.timeout(120)

PROMPT = "regency_dbg> "
PDB = r"\(Pdb\) "

CONTROLLER = textwrap.dedent(
    """
    import sys
    from regency.actor import Actor, endpoint, this_host

    class Debugee(Actor):
        @endpoint
        def work(self, x: int) -> int:
            y = x * 10
            breakpoint()
            z = y + 1
            return z

        @endpoint
        def boom(self) -> int:
            breakpoint()
            raise ValueError("kaboom")

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    debugee = procs.spawn("debugee", Debugee)
    if sys.argv[1] == "work":
        print("results", sorted(debugee.work.call(3).get(timeout=100).values()), flush=True)
    else:
        try:
            debugee.boom.call().get(timeout=100)
        except Exception as exc:
            print("boom raised", type(exc).__name__, flush=True)
    procs.stop().get()
    """
)


class Controller:
    """The controller script, running; its output is read once it has exited."""

    def __init__(self, tmp_path: Path, mode: str) -> None:
        script = tmp_path / "controller.py"
        script.write_text(CONTROLLER)
        self.env = {**os.environ, "TMPDIR": str(tmp_path)}
        self.root = tmp_path / f"regency-{os.getuid()}" / "controllers"
        self.process = subprocess.Popen(
            [sys.executable, str(script), mode],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_for_debugger(self) -> None:
        """Until the controller's file names its debugger server (a rank reached breakpoint())."""
        deadline = time.monotonic() + 60
        while not any('"debug"' in p.read_text() for p in self.root.glob("*.json")):
            assert self.process.poll() is None, self.process.communicate()[0]
            assert time.monotonic() < deadline, "no rank reached breakpoint() in 60 s"
            time.sleep(0.05)

    def address(self) -> tuple[str, int]:
        """The debugger server's address, from the controller's stderr line."""
        for path in self.root.glob("*.json"):
            found = re.search(r'"address": "([\d.]+):(\d+)"', path.read_text())
            if found:
                return found.group(1), int(found.group(2))
        raise AssertionError("no debugger address in the controller file")

    def output(self) -> str:
        """All the controller printed, once it has exited (status 0)."""
        out, _ = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, out
        return out

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def controller(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Controller]:
    running = Controller(tmp_path, request.param)
    try:
        running.wait_for_debugger()
        yield running
    finally:
        running.kill()


def debug_client(controller: Controller, *args: str) -> pexpect.spawn:
    """``regency debug ARGS`` in a pty."""
    return pexpect.spawn(
        sys.executable,
        ["-m", "regency", "debug", *args],
        env=controller.env,
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
    )


def list_until(client: pexpect.spawn, rows: int) -> str:
    """``list`` until it shows ``rows`` paused ranks (each rank registers on its own)."""
    deadline = time.monotonic() + 30
    while True:
        client.sendline("list")
        client.expect_exact(PROMPT)
        table = str(client.before)
        if table.count("| debugee ") == rows:
            return table
        assert time.monotonic() < deadline, table
        time.sleep(0.1)


@pytest.mark.parametrize("controller", ["work"], indirect=True)
def test_attach_print_a_local_step_and_continue(controller: Controller) -> None:
    client = debug_client(controller)
    client.expect_exact("REGENCY DEBUGGER")
    client.expect_exact(PROMPT)
    table = list_until(client, 2)
    assert re.search(r"\| debugee +\| 0 +\| \{'gpus': 0\} .*\| __main__\.work +\| 10 ", table)
    assert re.search(r"\| debugee +\| 1 +\| \{'gpus': 1\} .*\| __main__\.work +\| 10 ", table)

    client.sendline("attach debugee 0")
    client.expect_exact("Attached to debug session for rank 0")
    client.expect(r"controller\.py\(10\)work\(\)")
    client.expect(PDB)
    client.sendline("p y")
    client.expect(r"\r\n30\r\n")
    client.expect(PDB)
    client.sendline("l")
    client.expect(r"10\s+->\s+z = y \+ 1")  # the script's source: its file travelled by name
    client.expect(PDB)
    client.sendline("n")
    client.expect(r"controller\.py\(11\)work\(\)")
    client.expect(PDB)
    client.sendline("p z")
    client.expect(r"\r\n31\r\n")
    client.expect(PDB)
    client.sendline("detach")
    client.expect_exact("Detached from debug session for rank 0")
    client.expect_exact(PROMPT)
    # rank 0 is still paused (at line 11 now); continue resumes every rank
    assert re.search(r"__main__\.work +\| 11 ", list_until(client, 2))
    client.sendline("continue")
    client.expect_exact("Continued 2 paused rank(s)")
    client.expect(pexpect.EOF)
    client.close()
    assert client.exitstatus == 0
    assert "results [31, 31]" in controller.output()


@pytest.mark.parametrize("controller", ["work"], indirect=True)
def test_cast_sends_one_command_to_the_chosen_ranks(controller: Controller) -> None:
    client = debug_client(controller)
    client.expect_exact(PROMPT)
    list_until(client, 2)
    client.sendline("cast debugee ranks(0,1) p x * 7")
    client.expect_exact(PROMPT)
    answers = str(client.before)
    assert "[debugee 0] 21" in answers
    assert "[debugee 1] 21" in answers
    client.sendline("cast debugee ranks(gpus=1) c")
    client.expect_exact(PROMPT)
    assert "[debugee 1] left pdb (continued)" in str(client.before)
    table = list_until(client, 1)
    assert "| debugee    | 0 " in table
    client.sendline("cast debugee ranks(5) p x")
    client.expect_exact("No paused rank of 'debugee' is in ranks(5)")
    client.sendline("cast debugee ranks(0 p x")
    client.expect_exact(PROMPT)
    client.sendline("attach debugee 1")
    client.expect_exact("No paused rank 1 of 'debugee'")
    client.sendline("continue")
    client.expect(pexpect.EOF)
    assert "results [31, 31]" in controller.output()


@pytest.mark.parametrize("controller", ["boom"], indirect=True)
def test_an_endpoint_that_raises_after_continue_pauses_post_mortem(
    controller: Controller,
) -> None:
    client = debug_client(controller)
    client.expect_exact(PROMPT)
    list_until(client, 2)
    client.sendline("cast debugee ranks(:) c")
    client.expect_exact(PROMPT)
    deadline = time.monotonic() + 30
    while True:  # each rank raises and pauses again, where it raised
        client.sendline("attach debugee 1")
        index = client.expect(["post-mortem: the endpoint raised", "No paused rank 1"])
        if index == 0:
            break
        assert time.monotonic() < deadline
        client.expect_exact(PROMPT)
    client.expect(r"controller\.py\(16\)boom\(\)")
    client.expect(PDB)
    client.sendline("p 6 * 7")
    client.expect(r"\r\n42\r\n")
    client.expect(PDB)
    client.sendline("c")
    client.expect_exact("Detached from debug session for rank 1")
    client.expect_exact(PROMPT)
    list_until(client, 1)
    client.sendline("continue")
    client.expect(pexpect.EOF)
    assert "boom raised ActorError" in controller.output()


@pytest.mark.parametrize("controller", ["work"], indirect=True)
def test_a_wrong_secret_is_refused_and_the_right_client_still_gets_in(
    controller: Controller, tmp_path: Path
) -> None:
    host, port = controller.address()
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(secrets.token_hex(32))
    wrong.chmod(0o600)
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "regency",
            "debug",
            "--port",
            str(port),
            "--secret-file",
            str(wrong),
        ],
        env=controller.env,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 1
    assert "refused: authentication failed: wrong or missing secret" in refused.stderr
    assert "regency_dbg>" not in refused.stdout

    with socket.create_connection((host, port), timeout=10) as garbage:
        garbage.recv(4096)  # the challenge
        garbage.sendall(b"\x00\xff\xfe not json at all\n")
        assert b"authentication failed" in garbage.recv(4096)

    client = debug_client(controller)
    client.expect_exact(PROMPT)
    list_until(client, 2)
    client.sendline("continue")
    client.expect(pexpect.EOF)
    assert "results [31, 31]" in controller.output()


@pytest.mark.parametrize("controller", ["work"], indirect=True)
def test_a_second_client_is_told_who_is_attached(controller: Controller) -> None:
    first = debug_client(controller)
    first.expect_exact(PROMPT)
    second = debug_client(controller)
    second.expect_exact("another regency debug client")
    second.expect(pexpect.EOF)
    second.close()
    assert second.exitstatus == 1
    list_until(first, 2)
    first.sendline("continue")
    first.expect(pexpect.EOF)
    assert "results [31, 31]" in controller.output()


def test_without_a_paused_rank_the_client_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "regency", "debug"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "no running controller of yours serves the debugger" in done.stderr


def test_pythonbreakpoint_0_turns_breakpoint_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    running = Controller(tmp_path, "work")
    try:
        assert "results [31, 31]" in running.output()
        assert not list(running.root.glob("*.json"))
    finally:
        running.kill()


def test_debug_controller_is_monarchs_singleton_broker(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from regency.actor import debug_controller
        broker = debug_controller()
        assert broker is debug_controller()
        print("sessions", broker.list.call_one().get())
        print("address", broker.server_address.call_one().get())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "sessions []" in done.stdout
    assert re.search(r"address 127\.0\.0\.1:\d+", done.stdout)
    assert not list(tmp_path.glob("regency-*/controllers/*.json"))  # withdrawn at exit
