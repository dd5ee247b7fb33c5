"""Each public package's exported names are its contract, and each says where it lives.

The lists below are the contract: a name added to or removed from a package's ``__all__``
must be added or removed here too. Every exported class and function names its public home
as ``__module__`` (Trio's ``fixup_module_metadata``; :mod:`regency._public`), so ``repr()``,
tracebacks and docs show ``regency.actor.Actor``, and pickling by reference finds it there.
"""

from __future__ import annotations

import importlib
import pickle
import sys
import types

import pytest

from regency._public import is_private

EXPORTS: dict[str, list[str]] = {
    "regency": [
        "RegencyError",
        "__version__",
    ],
    "regency.actor": [
        "Accumulator",
        "Actor",
        "ActorError",
        "ActorMesh",
        "BootstrapCommand",
        "Channel",
        "ChannelTransport",
        "Context",
        "Endpoint",
        "Extent",
        "Future",
        "HostMesh",
        "MeshFailure",
        "MeshRestarted",
        "Point",
        "Port",
        "PortReceiver",
        "ProcId",
        "ProcMesh",
        "RegencyError",
        "RestartPolicy",
        "SupervisionError",
        "Uid",
        "UndeliverableMessageEnvelope",
        "ValueMesh",
        "as_endpoint",
        "attach",
        "attach_to_workers",
        "concurrent_endpoint",
        "config",
        "context",
        "context_or_none",
        "current_actor_name",
        "current_rank",
        "current_size",
        "debug_controller",
        "default_bootstrap_cmd",
        "enable_transport",
        "endpoint",
        "get_meter",
        "get_or_spawn_controller",
        "hosts_from_config",
        "returns_future",
        "run_worker_loop_forever",
        "run_worker_loop_until_shutdown",
        "send",
        "shutdown_context",
        "span",
        "start_worker_loop_forever",
        "this_host",
        "this_proc",
        "traced",
        "unhandled_fault_hook",
    ],
    "regency.config": [
        "ChannelTransport",
        "Encoding",
        "clear_runtime_config",
        "configure",
        "configured",
        "get",
        "get_global_config",
        "get_runtime_config",
        "get_seconds",
        "parametrize_config",
        "parametrize_config_pointwise",
    ],
    "regency.job": [
        "AttachError",
        "CommandResult",
        "DEFAULT_JOB_PATH",
        "ImageSpec",
        "JobError",
        "JobState",
        "JobTrait",
        "KubernetesJob",
        "LocalJob",
        "MeshAdminConfig",
        "PortForwarder",
        "ProcessJob",
        "SSHJob",
        "SlurmJob",
        "TelemetryConfig",
        "Workspace",
        "attach_to_workers",
        "exec_command",
        "hosts_from_config",
        "job_load",
        "job_loads",
        "load_current_job",
        "run_worker_loop_forever",
        "run_worker_loop_until_shutdown",
        "set_current_job",
        "shell",
        "start_worker_loop_forever",
        "sync_workspace",
        "worker_command",
        "worker_env",
    ],
    "regency.job.spmd": ["SPMDJob", "TorchrunCommand", "parse_torchrun", "serve"],
    "regency.observe": [
        "AdminServer",
        "admin_token",
        "start_admin",
    ],
    "regency.gather_mount": ["GatherMount", "gather_mount"],
    "regency.remotemount": ["MountHandler", "remotemount"],
    "regency.rdma": [
        "RDMAAction",
        "RDMABackendError",
        "RDMABuffer",
        "RDMABufferDroppedError",
        "RDMAError",
        "RDMAFallbackWarning",
        "RDMAOwnerGoneError",
        "RDMAReadTransferWarning",
        "RDMATcpFallbackWarning",
        "RDMATimeoutError",
        "RDMAWriteTransferWarning",
        "get_rdma_backend",
        "is_ibverbs_available",
        "is_rdma_available",
    ],
    "regency.shape": [
        "DimensionNotFoundError",
        "Extent",
        "Point",
        "Selection",
        "Shape",
        "Slice",
    ],
    "regency.spmd": [
        "SPMDActor",
        "ScriptExit",
        "TORCH_PRELOAD",
        "host_mesh_from_store",
        "setup_torch_elastic_env",
        "setup_torch_elastic_env_async",
    ],
}

# Exported on purpose under another name than the object's own (so pickle cannot find it by
# this name, and its ``__module__`` is left alone).
ALIASES = {("regency.actor", "unhandled_fault_hook")}


def _exports(package: str) -> list[tuple[str, object]]:
    module = importlib.import_module(package)
    return [(name, getattr(module, name)) for name in module.__all__]


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_each_public_package_exports_exactly_its_listed_names(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(EXPORTS[package])
    for name in module.__all__:
        assert hasattr(module, name), name


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_every_exported_class_and_function_names_a_public_home(package: str) -> None:
    for name, obj in _exports(package):
        if not isinstance(obj, type | types.FunctionType) or (package, name) in ALIASES:
            continue
        home = obj.__module__
        assert not is_private(home), f"{package}.{name} says it lives in {home}"
        # The home is this package, or another public one that exports the same object
        # (regency.actor re-exports regency.shape's Extent and Point, regency.job's loops).
        assert getattr(sys.modules[home], obj.__name__) is obj, f"{home}.{obj.__name__}"
        assert obj.__name__ == name
        assert pickle.loads(pickle.dumps(obj)) is obj


def test_repr_shows_the_public_path() -> None:
    import regency.actor
    import regency.rdma

    assert repr(regency.actor.Actor) == "<class 'regency.actor.Actor'>"
    assert repr(regency.rdma.RDMABuffer) == "<class 'regency.rdma.RDMABuffer'>"
    assert repr(regency.RegencyError) == "<class 'regency.RegencyError'>"
