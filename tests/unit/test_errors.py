"""One error tree: every regency error is a RegencyError and keeps its old bases."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import regency
from regency._errors import RegencyError
from regency._private_paths import UnsafePathError
from regency._runtime.actors.base.errors import process_failed
from regency._runtime.actors.base.mesh_trait import EmptySliceError
from regency._runtime.actors.meshes.actor_mesh import NotOwnedError
from regency._runtime.actors.meshes.endpoint import NotAnEndpointError
from regency._runtime.kernel.errors import PeerLostError
from regency._transport.address import AddressError
from regency._transport.auth import AuthenticationError
from regency._transport.certs import TLSSetupError
from regency._transport.connection import ConnectionClosedError
from regency._transport.deadline import DeadlineError, time_left
from regency._transport.frames import FrameError, FrameTooLargeError
from regency._transport.routing import RouteError
from regency._transport.transport import PeerUnreachableError
from regency.actor import ActorError, SupervisionError
from regency.job import AttachError, JobError, SlurmJob, SSHJob
from regency.rdma import (
    RDMABackendError,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMATimeoutError,
)
from regency.shape import DimensionNotFoundError

# Each class with the bases users caught it by before the tree existed (Monarch's for the actor
# errors: ActorError(Exception), SupervisionError(RuntimeError)).
OLD_BASES: list[tuple[type[BaseException], tuple[type[BaseException], ...]]] = [
    (ActorError, (Exception,)),
    (SupervisionError, (RuntimeError,)),
    (JobError, (RuntimeError,)),
    (AttachError, (ConnectionError,)),
    (UnsafePathError, (PermissionError,)),
    (DimensionNotFoundError, (KeyError, ValueError)),
    (EmptySliceError, (IndexError, ValueError)),
    (NotOwnedError, (RuntimeError, ValueError)),
    (NotAnEndpointError, (RuntimeError, AttributeError)),
    (RDMAError, (RuntimeError,)),
    (RDMABufferDroppedError, (RDMAError, RuntimeError)),
    (RDMAOwnerGoneError, (RDMAError, RuntimeError)),
    (RDMABackendError, (RDMAError, RuntimeError)),
    (RDMATimeoutError, (RDMAError, RuntimeError, TimeoutError, DeadlineError)),
    (DeadlineError, (TimeoutError,)),
    (ConnectionClosedError, (ConnectionError,)),
    (PeerUnreachableError, (ConnectionError,)),
    (PeerLostError, (ConnectionError,)),
    (AuthenticationError, (ConnectionError,)),
    (RouteError, (ConnectionError,)),
    (AddressError, (ValueError,)),
    (TLSSetupError, (ValueError,)),
    (FrameTooLargeError, (ValueError,)),
    (FrameError, (Exception,)),
]

# Errors whose bases were plain built-ins before they joined the tree (by dotted name: some live
# in modules that need optional packages only to be used, not to be imported).
JOINED_LATER: dict[str, tuple[type[BaseException], ...]] = {
    "regency._tensor.errors.RemoteException": (Exception,),
    "regency._tensor.errors.DataDependentError": (RuntimeError,),
    "regency.observe.admin_client.AdminError": (Exception,),
    "regency.observe.debug_ranks.RankSpecError": (ValueError,),
    "regency.observe.debug_wire.WireError": (ConnectionError,),
    "regency.rdma._backends.cma.CmaDeniedError": (PermissionError,),
    "regency.rdma._backends.cma.CmaProcessGoneError": (ProcessLookupError,),
    "regency.rdma._backends.cma.CmaBadAddressError": (OSError,),
    "regency.rdma._backends.cuda.CudaIpcUnavailableError": (RuntimeError,),
    "regency.rdma._ibverbs.load.IbvUnavailableError": (RuntimeError,),
    "regency.rdma._ibverbs.status.IbvCompletionError": (OSError,),
    "regency.spmd._script.ScriptExit": (Exception,),
}


def _every_exception_class_regency_defines() -> dict[str, type[BaseException]]:
    """Import every module of the package; its exception classes by the name users see."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(regency.__path__, "regency."):
        if info.name.endswith("__main__"):  # runs the CLI when imported
            continue
        for value in vars(importlib.import_module(info.name)).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and not issubclass(value, Warning)
                and value.__module__.startswith("regency")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


@pytest.mark.timeout(120)
def test_a_sweep_of_every_module_finds_no_error_outside_the_tree() -> None:
    classes = _every_exception_class_regency_defines()
    assert len(classes) > 40  # the sweep really walked the package
    assert sorted(name for name, cls in classes.items() if not issubclass(cls, RegencyError)) == []


@pytest.mark.parametrize(("dotted", "bases"), sorted(JOINED_LATER.items()))
def test_errors_that_joined_the_tree_later_keep_their_old_bases(
    dotted: str, bases: tuple[type[BaseException], ...]
) -> None:
    module, _, name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, RegencyError)
    for base in bases:
        assert issubclass(cls, base)


@pytest.mark.parametrize(("cls", "bases"), OLD_BASES, ids=lambda v: getattr(v, "__name__", ""))
def test_every_error_is_a_regency_error_and_keeps_its_old_bases(
    cls: type[BaseException], bases: tuple[type[BaseException], ...]
) -> None:
    assert issubclass(cls, RegencyError)
    for base in bases:
        assert issubclass(cls, base)


def test_the_root_is_public_where_users_look() -> None:
    assert regency.RegencyError is RegencyError
    assert regency.actor.RegencyError is RegencyError
    assert RegencyError.__module__ == "regency"
    assert not issubclass(RegencyError, RuntimeError)  # ActorError is Monarch's plain Exception


def test_errors_read_and_pickle_as_before() -> None:
    assert str(JobError("sbatch printed 'x', not a job id")) == "sbatch printed 'x', not a job id"
    assert str(DimensionNotFoundError("no dimension 'gpus'")) == "no dimension 'gpus'"
    assert str(ConnectionClosedError("connection closed by the peer")) == (
        "connection closed by the peer"
    )
    errors: list[BaseException] = [
        JobError("squeue failed (1): boom"),
        RDMATimeoutError("read of 4 bytes did not finish within 1 s"),
        SupervisionError("stopped", endpoint="mesh.call"),
        PeerUnreachableError("gone"),
        DimensionNotFoundError("no dimension 'gpus'"),
    ]
    for exc in errors:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert str(back) == str(exc)


def test_a_passed_deadline_raises_the_transports_deadline_error() -> None:
    with pytest.raises(DeadlineError, match="deadline passed"):
        time_left(0.0)


def test_job_backends_raise_job_errors_with_unchanged_texts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(JobError, match="`sbatch` not found: SlurmJob needs the Slurm client"):
        SlurmJob({"hosts": 1}).apply()
    with pytest.raises(RuntimeError, match="SSHJob needs an ssh client"):
        SSHJob(["h1"], ssh_exe="no-such-ssh").apply()


@pytest.mark.parametrize(
    ("reason", "monarch"),
    [
        ("exited with code 3", "exited with non-zero code 3"),
        ("killed by signal SIGKILL (9)", "failed: Killed(sig=9)"),
        # what the host agent adds after the status does not hide it
        ("killed by signal SIGKILL (9); its output is in /tmp/p.log on h", "failed: Killed(sig=9)"),
        ("exited with code 7; its output is in /tmp/p.log on h", "exited with non-zero code 7"),
        ("host lost", "failed: host lost"),
    ],
)
def test_a_procs_end_reads_in_monarchs_words(reason: str, monarch: str) -> None:
    assert process_failed(reason) == monarch
