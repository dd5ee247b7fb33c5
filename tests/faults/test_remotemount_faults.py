"""Remote mounts when the client goes away: reads fail with EIO, and no mount is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from _fault_helpers import wait_until

from regency.actor import Actor, endpoint, this_host
from regency.remotemount._fuse import fuse_problem, is_mounted
from regency.remotemount.remotemount import FUSEActor, build_index

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(fuse_problem() is not None, reason=f"no FUSE here: {fuse_problem()}"),
]


class StuckClient(Actor):
    """A mount's client that never answers a block request (it is killed while one waits)."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def read_block(self, block: int) -> tuple[bytes, list[str]]:
        Path(os.environ["STUCK_MARK"]).write_text(str(block))
        threading.Event().wait()
        raise AssertionError("unreachable")


def test_a_read_waiting_on_a_lost_client_fails_with_eio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"w" * (2 * 1024 * 1024))
    mark = tmp_path / "asked"
    monkeypatch.setenv("STUCK_MARK", str(mark))
    client_procs = this_host().spawn_procs(name="stuck_client")
    host_procs = this_host().spawn_procs(name="fuse_host")
    mnt = tmp_path / "mnt"
    try:
        client = client_procs.spawn("client", StuckClient)
        client_pid = client.pid.call_one().get(timeout=30)
        fuse = host_procs.spawn("fuse", FUSEActor, client)
        fuse.mkdir.call(str(mnt)).get(timeout=30)
        fuse.mount.call(str(mnt), build_index(str(source), {})).get(timeout=30)
        outcome: list[BaseException | bytes] = []

        def read() -> None:
            try:
                outcome.append((mnt / "weights.bin").read_bytes())
            except OSError as error:
                outcome.append(error)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert wait_until(mark.exists, timeout=30), "the host never asked the client for a block"
        os.kill(client_pid, signal.SIGKILL)
        reader.join(timeout=30)
        assert not reader.is_alive(), "the read hangs after the client is gone"
        assert isinstance(outcome[0], OSError), outcome
        assert outcome[0].errno == 5  # EIO
    finally:
        host_procs.stop().get(timeout=30)
        client_procs.stop().get(timeout=30)
    assert wait_until(lambda: not is_mounted(str(mnt)), timeout=10), "stale mount after stop"


_CONTROLLER = textwrap.dedent(
    """
    import sys
    from regency.actor import this_host
    from regency.remotemount import remotemount
    handler = remotemount(this_host(), sys.argv[1], sys.argv[2])
    handler.open()
    print("MOUNTED", flush=True)
    sys.stdin.read()
    """
)


def test_controller_death_leaves_no_stale_mount(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("A = 1\n")
    mnt = tmp_path / "mnt"
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER, str(source), str(mnt)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert controller.stdout is not None
        assert controller.stdout.readline().strip() == "MOUNTED"
        assert (mnt / "a.py").read_text() == "A = 1\n"
        controller.kill()  # SIGKILL: no cleanup code of the controller runs
        controller.wait(timeout=10)
        deadline = time.monotonic() + 30
        while is_mounted(str(mnt)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(str(mnt)), "the mount outlived its controller"
    finally:
        if controller.poll() is None:
            controller.kill()
        if _group_alive(controller.pid):  # the controller's procs, should any outlive it
            os.killpg(controller.pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
