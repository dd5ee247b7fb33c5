"""``kubectl port-forward`` for a controller outside the cluster: one forward per pod.

Each forward is a ``kubectl port-forward --namespace NS pod/NAME :PORT --address 127.0.0.1``
process: kubectl listens on a free local port, prints ``Forwarding from 127.0.0.1:LOCAL ->
PORT`` and carries each connection to the pod's port through the API server. The controller then
attaches with ``attach_to_workers(forwarded={pod address: local address})``: it reaches the pod
and every proc on it only through the forward, and the pod's side reaches the controller over
reverse connections through the same forward (see :mod:`regency._transport.reverse`).

kubectl prints a line for every connection it handles: a thread reads them from the start (so
its pipe never fills and stalls it, and no line is missed whatever arrives with the announcing
one), keeping the last few for error messages.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import re
import shutil
import subprocess
import threading
import weakref
from collections.abc import Sequence

from regency.job._errors import JobError

START_TIMEOUT = 30.0  # seconds kubectl gets to announce its local port
_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) ->")
_KEEP_LINES = 20
_STOP_TIMEOUT = 5.0


def port_forward_command(
    kubectl: str | Sequence[str],
    namespace: str,
    pod: str,
    port: int,
    kubeconfig: str | None = None,
) -> list[str]:
    """The argv of ``kubectl port-forward`` from a free local port to ``pod``'s ``port``."""
    argv = [kubectl] if isinstance(kubectl, str) else list(kubectl)
    argv += ["port-forward", "--namespace", namespace, f"pod/{pod}", f":{port}"]
    argv += ["--address", "127.0.0.1"]
    if kubeconfig is not None:
        argv += ["--kubeconfig", kubeconfig]
    return argv


class PortForward:
    """One running ``kubectl port-forward``, and the local ``tcp://`` address it listens on.

    Raises :class:`JobError` (with kubectl's output) when kubectl cannot be run, exits, or does
    not announce its port within ``timeout`` seconds.
    """

    def __init__(self, argv: Sequence[str], pod: str, timeout: float = START_TIMEOUT) -> None:
        self.pod = pod
        self.argv = list(argv)
        if shutil.which(self.argv[0]) is None:
            raise JobError(
                f"cannot forward a port to pod {pod}: {self.argv[0]!r} is not on PATH "
                "(KubernetesJob(port_forward=True) runs `kubectl port-forward`; install kubectl "
                "or pass kubectl=...)"
            )
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self._local: str | None = None
        self._announced = threading.Event()  # the port is known, or kubectl's output ended
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._drain, name="regency-port-forward", daemon=True).start()
        try:
            self.local = self._wait_for_port(timeout)
        except BaseException:
            self.stop()
            raise
        _running.add(self)

    def _wait_for_port(self, timeout: float) -> str:
        if not self._announced.wait(timeout):
            raise JobError(
                f"kubectl port-forward to pod {self.pod} did not start within "
                f"{timeout:g} s; its output: {self._output()}"
            )
        if self._local is not None:
            return self._local
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(_STOP_TIMEOUT)
        raise JobError(
            f"kubectl port-forward to pod {self.pod} exited with status "
            f"{self._proc.returncode} before forwarding; its output: {self._output()}"
        )

    def _output(self) -> str:
        return " | ".join(self.lines) or "(none)"

    def _drain(self) -> None:
        """Read kubectl's lines for as long as it runs.

        The first that announces the local port sets it; all are kept for error messages.
        """
        out = self._proc.stdout
        assert out is not None
        with contextlib.suppress(OSError, ValueError):
            for line in out:
                self.lines.append(line.rstrip())
                if self._local is None:
                    found = _FORWARDING.search(line)
                    if found:
                        self._local = f"tcp://127.0.0.1:{found.group(1)}"
                        self._announced.set()
        self._announced.set()  # the output ended (kubectl exited) before or after announcing

    def alive(self) -> bool:
        """Whether kubectl still runs."""
        return self._proc.poll() is None

    def stop(self) -> None:
        """End kubectl (``SIGTERM``, then ``SIGKILL``) and wait for it."""
        _running.discard(self)
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            with contextlib.suppress(OSError):
                self._proc.stdout.close()


# The forwards of this process, ended when it exits: they forward for this controller only.
_running: weakref.WeakSet[PortForward] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for forward in list(_running):
        forward.stop()
