"""``regency.job.shell`` on a real pty of this host; ``regency shell`` in tmux as a person would.

``shell()`` reads the process's stdin and writes its stdout, so each case runs in a fresh Python
process whose stdin and stdout are pipes (or a tmux pane) the test drives.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from regency.job import shell

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC}


def _read_until(stream: int, text: bytes, deadline: float, to_end: bool = False) -> bytes:
    """Read ``stream`` (a pipe's fd) until ``text`` has appeared, or to its end; return it."""
    seen = b""
    while to_end or text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{text!r} never appeared in {seen[-2000:]!r}"
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            chunk = os.read(stream, 65536)
            if not chunk and to_end:
                return seen
            assert chunk, f"output ended before {text!r}: {seen[-2000:]!r}"
            seen += chunk
    return seen


@pytest.mark.timeout(150)
def test_shell_runs_on_a_pty_with_env_and_workdir_and_returns_the_exit_status(tmp_path):
    # Typed as a person would: the next line only once the output of the last one is shown.
    code = textwrap.dedent(f"""
        import sys
        from regency.actor import this_host
        from regency.job import shell
        env = {{"GREETING": "hello", "SHELL": "/bin/bash"}}
        status = shell(this_host(), env=env, workdir={str(tmp_path)!r})
        print(f"STATUS={{status}}", file=sys.stderr)
    """)
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        deadline = time.monotonic() + 120
        child.stdin.write(b'tty; printf "var=%s dir=%s\\n" "$GREETING" "$PWD"\n')
        child.stdin.flush()
        shown = _read_until(child.stdout.fileno(), f"var=hello dir={tmp_path}".encode(), deadline)
        child.stdin.write(b"exit 7\n")  # stdin stays open: its end would hang the shell up
        child.stdin.flush()
        rest = _read_until(child.stdout.fileno(), b"", deadline, to_end=True)
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert child.stderr is not None
        err = child.stderr.read()
    assert "STATUS=7" in err.decode(), err.decode()[-3000:]
    assert b"/dev/pts/" in shown + rest  # a real terminal on the host


@pytest.mark.timeout(150)
def test_end_of_input_hangs_up_the_foreground_job(tmp_path):
    marker = tmp_path / "started"
    read_end, write_end = os.pipe()
    code = (
        "import sys\nfrom regency.actor import this_host\nfrom regency.job import shell\n"
        'print(f\'STATUS={shell(this_host(), env={"SHELL": "/bin/bash"})}\', file=sys.stderr)\n'
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=ENV,
    ) as child:
        os.close(read_end)
        os.write(write_end, f"touch {marker}; sleep 600\n".encode())
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        started = time.monotonic()
        os.close(write_end)
        _, err = child.communicate(timeout=60)
    assert time.monotonic() - started < 20
    assert "STATUS=129" in err.decode()  # the shell was hung up (SIGHUP)


@pytest.mark.timeout(150)
def test_a_stdout_that_cannot_be_written_ends_the_session_with_the_error():
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()
    os.close(out_read)
    code = (
        "from regency.actor import this_host\nfrom regency.job import shell\n"
        "try:\n    shell(this_host(), env={'SHELL': '/bin/bash'})\n"
        "except (BrokenPipeError, ConnectionResetError) as e:\n"
        "    raise SystemExit(f'RAISED {type(e).__name__}')\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=read_end,
        stdout=out_write,
        stderr=subprocess.PIPE,
        env=ENV,
    ) as child:
        os.close(read_end)
        os.close(out_write)
        os.write(write_end, b"echo some output\n")
        try:
            _, err = child.communicate(timeout=120)
        finally:
            os.close(write_end)
    assert "RAISED BrokenPipeError" in err.decode() or "RAISED ConnectionResetError" in err.decode()


def test_shell_refuses_a_mesh_of_several_hosts():
    class TwoHosts:
        def size(self) -> int:
            return 2

    with pytest.raises(ValueError, match="shell requires a singleton HostMesh"):
        shell(TwoHosts())  # type: ignore[arg-type]


class Tmux:
    """A tmux server of its own (``-L``) with one session of a given size."""

    def __init__(self, command: str, columns: int, rows: int) -> None:
        self.name = f"regency-test-{uuid.uuid4().hex[:8]}"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(columns), "-y", str(rows), command)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.name, *args], check=True, capture_output=True, text=True, env=ENV
        ).stdout

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t")

    def resize(self, columns: int, rows: int) -> None:
        self._tmux("resize-window", "-t", "t", "-x", str(columns), "-y", str(rows))

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            assert time.monotonic() < deadline, f"{text!r} never appeared:\n{screen}"
            time.sleep(0.1)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, check=False)


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_regency_shell_in_tmux_as_a_person_uses_it():
    command = (
        f"{sys.executable} -m regency shell --local -e SHELL=/bin/sh -e PS1='remote$ ' "
        "-e GREETING=hi; echo EXIT-STATUS=$?; sleep 60"
    )
    tmux = Tmux(command, 100, 30)
    try:
        tmux.wait_for("remote$")
        tmux.send('echo "say $GREETING"; stty size', "Enter")
        screen = tmux.wait_for("30 100")
        assert "say hi" in screen
        tmux.resize(90, 20)
        tmux.send("stty size", "Enter")
        tmux.wait_for("20 90")
        tmux.send("echo sleep-$((6 * 7)); sleep 600", "Enter")
        tmux.wait_for("sleep-42")
        tmux.send("C-c")  # the interrupt reaches the remote foreground job, not regency
        tmux.send("echo still-$((2 * 21))", "Enter")
        tmux.wait_for("still-42")
        tmux.send("exit 5", "Enter")
        tmux.wait_for("EXIT-STATUS=5")
    finally:
        tmux.kill()


@pytest.mark.timeout(150)
def test_a_shell_the_host_does_not_have_is_refused_by_name():
    code = (
        "from regency.actor import this_host\nfrom regency.job import shell\n"
        "shell(this_host(), env={'SHELL': '/no/such/shell'})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=ENV,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    err = done.stderr.decode()
    assert "FileNotFoundError: no shell '/no/such/shell' to run on this host" in err
