"""Running a read-only FUSE file system in a thread of this process, and taking it down.

The binding is `mfusepy <https://pypi.org/project/mfusepy/>`_ (the ``remotemount`` extra) over
Debian's ``fuse3``. Every mount has a watchdog: a small process in a session of its own (so a
kill of the job's process group spares it) that holds the read end of a pipe whose write end only
the serving process has. When that process ends, however it ends, the pipe reaches end of file
and the watchdog detaches the mount (``fusermount3 -u -z``), so no stale mount outlives its
server. (libfuse's own ``auto_unmount`` left a mount behind after ``ProcessJob.kill()`` in two of
three runs here, so it is not used.)
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import threading
import time
import types
from typing import Any

from regency._errors import RegencyError

MOUNT_START_TIMEOUT_S = 30.0
"""How long a mount may take to come up before it is reported as failed."""


class FuseUnavailableError(RegencyError, RuntimeError):
    """FUSE mounts cannot be served here (no ``/dev/fuse``, no ``fuse3``, no binding)."""


def fuse_problem() -> str | None:
    """Why FUSE mounts cannot work here, or ``None`` when they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (load the fuse module or run the container with it)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian/Ubuntu: apt-get install fuse3)"
    try:
        importlib.import_module("mfusepy")
    except (ImportError, OSError) as error:
        return (
            f"the FUSE binding mfusepy cannot be loaded ({error}); "
            "pip install 'regency[remotemount]'"
        )
    return None


def binding() -> types.ModuleType:
    """The ``mfusepy`` module, or `FuseUnavailableError` saying what is missing."""
    problem = fuse_problem()
    if problem is not None:
        raise FuseUnavailableError(problem)
    return importlib.import_module("mfusepy")


def is_mounted(path: str) -> bool:
    """Whether ``path`` is a mount point in this process's mount namespace."""
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        for line in table:
            point = line.split()[4]
            decoded = point.encode().decode("unicode_escape")
            if decoded == target:
                return True
    return False


def unmount(path: str) -> tuple[str, str]:
    """Unmount the FUSE mount at ``path``: ``(status, detail)``, status as Monarch's ``unmount``.

    ``"ok"``, ``"not_mounted"``, ``"busy"`` (in use; then detached lazily, gone once unused),
    or ``"error"``.
    """
    if not is_mounted(path):
        return "not_mounted", ""
    result = subprocess.run(
        ["fusermount3", "-u", path], capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode == 0:
        return "ok", ""
    detail = result.stderr.strip()
    if "busy" in detail.lower():
        subprocess.run(
            ["fusermount3", "-u", "-z", path], capture_output=True, timeout=30, check=False
        )
        return "busy", detail
    return "error", detail


def prepare_mount_point(path: str) -> None:
    """Create the directory ``path``, first detaching a dead FUSE mount left there."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        subprocess.run(
            ["fusermount3", "-u", "-z", path], capture_output=True, timeout=30, check=False
        )
        os.makedirs(path, exist_ok=True)


class FuseThread:
    """One mount served by a daemon thread of this process until `stop`."""

    def __init__(self, operations: Any, mount_point: str, fsname: str, **options: Any) -> None:
        """``options`` are more libfuse ``-o`` options (``attr_timeout=0``, ``direct_io=True``)."""
        self.mount_point = os.path.abspath(mount_point)
        self._options = options
        self._operations = operations
        self._fsname = fsname
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"fuse {mount_point}", daemon=True)
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._alive_fd: int | None = None

    def start(self) -> None:
        """Mount and return once the kernel answers for the mount point."""
        if not os.path.isdir(self.mount_point):
            raise FileNotFoundError(f"mount point {self.mount_point} is not a directory")
        if is_mounted(self.mount_point):
            raise RuntimeError(f"{self.mount_point} is already mounted; unmount it first")
        self._start_watchdog()
        self._thread.start()
        ready = self._operations.ready
        assert isinstance(ready, threading.Event)
        deadline = time.monotonic() + MOUNT_START_TIMEOUT_S
        while not ready.wait(0.05):
            if not self._thread.is_alive():
                self._stop_watchdog()
                raise RuntimeError(f"FUSE mount at {self.mount_point} failed: {self._error}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"FUSE mount at {self.mount_point} did not come up")

    def _serve(self) -> None:
        fuse = binding()
        try:
            fuse.FUSE(
                self._operations,
                self.mount_point,
                foreground=True,
                ro=True,
                default_permissions=True,
                fsname=self._fsname,
                **self._options,
            )
        except BaseException as error:  # reported by start() or stop()
            self._error = error

    def _start_watchdog(self) -> None:
        read_end, self._alive_fd = os.pipe()  # both ends close-on-exec: no child inherits them
        try:
            self._watchdog = subprocess.Popen(
                ["sh", "-c", 'cat >/dev/null; exec fusermount3 -u -z "$0"', self.mount_point],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_end)

    def _stop_watchdog(self) -> None:
        if self._alive_fd is not None:
            os.close(self._alive_fd)
            self._alive_fd = None
        if self._watchdog is not None:
            self._watchdog.wait(timeout=30)
            self._watchdog = None

    def stop(self, timeout: float = 30.0) -> tuple[str, str]:
        """Unmount and wait for the serving thread to end: ``(status, detail)`` as `unmount`."""
        status = unmount(self.mount_point)
        self._stop_watchdog()
        self._thread.join(timeout)
        return status
