"""Bootstrapping the controller: the user's script becomes the root client ``<root>``.

The first use of the API creates this process's runtime, the root client, a proc agent (so
actors can be spawned in the controller's own process) and the local host agent (so procs can be
spawned on this machine). ``shutdown_context`` (also run at exit) stops them all.
"""

from __future__ import annotations

import atexit
import os
import sys

from regency import config
from regency._config_keys import STOP_TIMEOUT
from regency._runtime.actors.base import context
from regency._runtime.actors.control.control import WarmZygote
from regency._runtime.actors.execution.instance import ClientInstance
from regency._runtime.actors.execution.proc_agent import ProcAgent
from regency._runtime.actors.meshes.singletons import SingletonRegistry
from regency._runtime.actors.observe import log_records, tracing
from regency._runtime.actors.supervision import supervision
from regency._runtime.host.host_agent import HostAgent, HostSession
from regency._runtime.kernel import gateways, state, wire
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.service import Service

_host_agent: HostAgent | None = None
_proc_agent: ProcAgent | None = None


def share_secret(secret: bytes) -> None:
    """Make ``secret`` the secret of this process's controller, so that the controllers of
    several processes holding it (the ranks of one torchrun job) reach each other's actors.

    Call it before the runtime starts; once it runs (or another secret was adopted), only that
    secret is accepted (``RuntimeError`` otherwise).
    """
    if not state.adopt_secret(secret):
        raise RuntimeError(
            "regency already runs in this process with a secret of its own; share the "
            "job's secret before anything else of regency starts its runtime"
        )


EXIT_STOP_TIMEOUT = 1.0
"""Seconds each proc gets to stop when the controller's interpreter exits (then it is killed):
Monarch's exit budget (its atexit shutdown waits 1 s), whatever ``stop_timeout`` says."""


def bootstrap_controller() -> None:
    """Create the controller's runtime (called once, lazily, under the state lock)."""
    global _host_agent, _proc_agent
    job_id = os.urandom(4).hex()
    # Another controller's, to join it (a mesh received from it, or a torchrun job's).
    secret = state.adopted_secret() or os.urandom(32)
    runtime = ProcRuntime(f"unix:@regency-{job_id}-controller", secret, job_id)
    context.install_client(ClientInstance(runtime, is_root=True))
    log_records.prefix_records_with_actor()
    state.install(runtime, runtime.address, runtime.address)
    _proc_agent = ProcAgent(runtime)
    _host_agent = HostAgent(
        runtime, HostSession(job_id, runtime.address, runtime.address, secret, None)
    )
    runtime.add_service(wire.SERVICE_PROC, Service("regency-proc-agent", _proc_agent.handle))
    runtime.add_service(wire.SERVICE_HOST, Service("regency-host-agent", _host_agent.handle))
    runtime.add_service(
        wire.SERVICE_SINGLETONS, Service("regency-singletons", SingletonRegistry().handle)
    )
    runtime.post_service(wire.SERVICE_HOST, WarmZygote())
    supervision.install_exit_path()
    atexit.register(_exit_code_after_fatal_failure)
    atexit.register(_shutdown_at_exit)
    tracing.follow_config()


def _exit_code_after_fatal_failure() -> None:
    """Runs after ``shutdown``: a fatal supervision failure ends the process with code 1 even if
    the main thread could only be sent ``KeyboardInterrupt``."""
    code = supervision.fatal_exit_code()
    if code is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _shutdown_at_exit() -> None:
    shutdown(min(EXIT_STOP_TIMEOUT, config.value(STOP_TIMEOUT)), exiting=True)


def shutdown(timeout: float | None = None, exiting: bool = False) -> None:
    """Stop every proc this controller started and close its runtime (idempotent).

    Each proc gets ``timeout`` seconds to stop (default: the ``stop_timeout`` setting).
    ``exiting``: the interpreter is exiting, so the procs end without their exit handlers (see
    ``StopProc``) and the ones killed are not logged (the streams may be closed by now).
    Failures reported from here on are of meshes being stopped: they end nothing.
    """
    global _host_agent, _proc_agent
    runtime = state.existing()
    if runtime is None:
        return
    supervision.shutting_down()
    if timeout is None:
        timeout = config.value(STOP_TIMEOUT)
    if _host_agent is not None:
        _host_agent.shutdown(timeout, exiting)
    if _proc_agent is not None:
        _proc_agent.stop_all(timeout)
    tracing.finish()  # after the procs, whose last batches it records
    runtime.close()
    _host_agent = _proc_agent = None
    gateways.clear()
    state.clear(shut_down=True)
    context.clear_client()
