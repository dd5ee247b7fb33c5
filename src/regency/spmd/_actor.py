"""``SPMDActor``: one per proc, it sets torchrun's environment and runs the training script."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from regency._lowlevel import runtime
from regency.actor import Actor, current_rank, endpoint
from regency.spmd._env import apply_env, check_master, elastic_env, free_port, host_of
from regency.spmd._script import (
    NO_SCRIPT,
    ScriptExit,
    collect_script_objects,
    exit_status,
    keep_if_unsettled,
    release_process_group,
    run_argv,
)


class SPMDActor(Actor):
    """Runs an unmodified torchrun script on every rank of a proc mesh, as Monarch's does.

    Spawn one per proc (``setup_torch_elastic_env`` does), then call ``main``::

        procs = this_host().spawn_procs(per_host={"gpus": 4})
        spmd = procs.spawn("spmd", SPMDActor)
        host, port = spmd.slice(gpus=0).get_host_port.call_one(None).get()
        spmd.main.call(host, port, ["train.py", "--epochs", "2"]).get()

    The last dimension of the mesh is the per-host (local) one: ``LOCAL_RANK`` is the rank's
    coordinate there. The script runs on the actor's thread, in the proc's interpreter, so
    imports it makes (torch) stay loaded for the next ``main`` on that proc.
    """

    @endpoint
    def get_host_port(self, use_ipaddr: bool | None = None) -> tuple[str, int]:
        """Return this proc's host (see ``use_ipaddr``) and a free TCP port there.

        ``use_ipaddr=None`` gives a worker host's IP (the address regency reaches it at) and
        this machine's hostname for local procs; ``True`` always an IP, ``False`` the hostname.
        """
        rt = runtime()
        return host_of(rt.address, use_ipaddr), free_port()

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables (``RANK``, ``LOCAL_RANK``, ... ``MASTER_PORT``) here."""
        check_master(master_addr, master_port)
        apply_env(elastic_env(current_rank(), master_addr, master_port), runtime().address)

    @endpoint
    def main(self, master_addr: str, master_port: int, argv: Sequence[str]) -> bool:
        """Set the environment, then run ``argv`` as ``python argv...`` would; ``True`` when done.

        ``argv`` is ``[script, args...]`` (run with ``runpy.run_path`` as ``__main__``) or
        ``["-m", module, args...]``; an empty one raises ``ValueError``. What the script raises
        reaches the caller as ``ActorError`` with its traceback, and the actor stays up for the
        next ``main``. ``sys.exit(0)`` (or ``None``) counts as success; ``sys.exit(n)`` raises
        ``ScriptExit`` with that status: the rank failed. A process group the script left
        initialized is destroyed when it ends, so the other ranks learn of a failure at once.
        """
        run_as_rank(master_addr, master_port, argv)
        return True


def run_as_rank(
    master_addr: str,
    master_port: int,
    argv: Sequence[str],
    script_ended: Callable[[], None] | None = None,
) -> None:
    """``SPMDActor.main``'s work, on the calling actor's thread (see there).

    ``script_ended`` runs the moment the script returns or raises, before its process group is
    released (which can take a while after a failure).
    """
    if not list(argv):
        raise ValueError(NO_SCRIPT)
    check_master(master_addr, master_port)
    point = current_rank()
    apply_env(elastic_env(point, master_addr, master_port), runtime().address)
    script_globals: dict[str, Any] | None = None
    try:
        script_globals = run_argv(argv)
    except SystemExit as exc:
        code = exit_status(exc)
        if code != 0:
            raise ScriptExit(code, point.rank) from None
    finally:
        if script_ended is not None:
            script_ended()
        settled = release_process_group()
        keep_if_unsettled(settled, script_globals)
        del script_globals  # the script's objects go only now (see release_process_group)
        collect_script_objects()
