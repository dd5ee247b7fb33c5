"""Public names of Monarch 0.7.0's modules (monarch-api.md §1.1-1.5) and monarch.spmd (§1.4)."""

from __future__ import annotations

import os

import pytest
from compat_impl import IMPL, Slice, actor, config, job, optional, rdma, top
from compat_util import CALL_TIMEOUT

# monarch.actor.__all__ of torchmonarch 0.7.0
ACTOR_NAMES = [
    "Accumulator", "Actor", "ActorError", "Channel", "ChannelTransport", "Context", "Endpoint",
    "Extent", "Future", "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcId",
    "ProcMesh", "Uid", "ValueMesh", "as_endpoint", "attach", "attach_to_workers",
    "concurrent_endpoint", "config", "context", "current_actor_name", "current_rank",
    "current_size", "debug_controller", "default_bootstrap_cmd", "enable_transport", "endpoint",
    "get_meter", "get_or_spawn_controller", "returns_future", "run_worker_loop_forever",
    "run_worker_loop_until_shutdown", "send", "shutdown_context", "span",
    "start_worker_loop_forever", "this_host", "this_proc", "traced", "unhandled_fault_hook",
]  # fmt: skip
CONFIG_NAMES = [
    "ChannelTransport", "Encoding", "clear_runtime_config", "configure", "configured",
    "get_global_config", "get_runtime_config", "parametrize_config", "parametrize_config_pointwise",
]  # fmt: skip
JOB_NAMES = [
    "DEFAULT_JOB_PATH", "JobState", "JobTrait", "LocalJob", "MeshAdminConfig", "PortForwarder",
    "ProcessJob", "SlurmJob", "TelemetryConfig", "exec_command", "hosts_from_config", "job_load",
    "job_loads", "load_current_job", "set_current_job", "shell",
]  # fmt: skip
RDMA_NAMES = [
    "RDMAAction", "RDMABuffer", "RDMAReadTransferWarning", "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning", "get_rdma_backend", "is_ibverbs_available", "is_rdma_available",
]  # fmt: skip


# monarch.__all__ of torchmonarch 0.7.0 that needs no tensor engine (its tensor names are
# tests/unit/test_tensor_toplevel.py's), and the ones regency leaves out (monarch-differences.md)
TOP_NAMES = [
    "Extent", "Future", "NDSlice", "Selection", "Shape", "clear_runtime_config", "configure",
    "configured", "get_global_config", "get_runtime_config",
]  # fmt: skip
TOP_NAMES_REGENCY_LACKS = [
    "Simulator", "function_resolvers", "mast_reserve", "set_meta", "world_mesh",
]  # fmt: skip


@pytest.mark.parametrize("name", TOP_NAMES)
def test_top_level_exports(name):
    assert hasattr(top, name)


def test_top_level_names_are_the_submodules_objects():
    assert top.Extent is actor.Extent
    assert top.NDSlice is Slice
    assert top.configure is config.configure
    assert top.get_runtime_config is config.get_runtime_config
    assert top.Shape.unity().ndslice.sizes == []


@pytest.mark.deviation(
    "regency has no simulator, notebook reservations or world_mesh",
    skip="regency",
)
@pytest.mark.parametrize("name", TOP_NAMES_REGENCY_LACKS)
def test_top_level_exports_regency_lacks(name):
    assert hasattr(top, name)


@pytest.mark.parametrize("name", ACTOR_NAMES)
def test_actor_exports(name):
    assert hasattr(actor, name)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_exports(name):
    assert hasattr(config, name)


@pytest.mark.parametrize("name", JOB_NAMES)
def test_job_exports(name):
    assert hasattr(job, name)



@pytest.mark.parametrize("name", RDMA_NAMES)
def test_rdma_exports(name):
    assert hasattr(rdma, name)


def test_telemetry_config_defaults():
    cfg = job.TelemetryConfig()
    assert (cfg.retention_secs, cfg.include_dashboard, cfg.dashboard_port) == (3600, False, 8265)
    assert cfg.snapshot_interval_secs == 30.0
    assert job.MeshAdminConfig().admin_addr is None


def test_enable_telemetry_and_admin_chain():
    j = job.LocalJob()
    assert j.enable_telemetry(job.TelemetryConfig(retention_secs=10)) is j
    assert j.enable_admin(job.MeshAdminConfig()) is j


def test_job_state_service_urls_are_none_without_telemetry():
    state = job.LocalJob().state(cached_path=None)
    assert state.telemetry_url is None
    assert state.dashboard_url is None


def test_default_bootstrap_cmd_with_env():
    cmd = actor.default_bootstrap_cmd()
    extra = cmd.with_env({"COMPAT_X": "1"})
    assert extra.env["COMPAT_X"] == "1"
    assert "COMPAT_X" not in (cmd.env or {})


# --- monarch.spmd (regency's lives on another branch; skipped where absent) -----------------

spmd = optional("spmd")
needs_spmd = pytest.mark.skipif(spmd is None, reason=f"{IMPL}.spmd is not available here")

ENV_KEYS = [
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "WORLD_SIZE",
]


class EnvReader(actor.Actor):
    @actor.endpoint
    def env(self) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in ENV_KEYS}


@needs_spmd
@pytest.mark.timeout(120)
def test_setup_torch_elastic_env(make_procs):
    procs = make_procs(2)
    spmd.setup_torch_elastic_env(procs)
    envs = list(procs.spawn("env", EnvReader).env.call().get(timeout=CALL_TIMEOUT).values())
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["ROLE_NAME"] for e in envs} == {"rank"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1


@needs_spmd
@pytest.mark.timeout(120)
def test_setup_torch_elastic_env_explicit_master(make_procs):
    procs = make_procs(1)
    spmd.setup_torch_elastic_env(procs, master_addr="127.0.0.1", master_port=29512)
    env = procs.spawn("env1", EnvReader).env.call().get(timeout=CALL_TIMEOUT).values()
    env = next(iter(env))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29512")
