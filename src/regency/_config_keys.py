"""The configuration's key table: regency's keys, Monarch's (torchmonarch 0.7.0), its enums.

Regency's own keys are typed :class:`Key` s; Monarch's keys come with their kinds and defaults.

The runtime reads a setting through its key object, ``config.value(STOP_TIMEOUT)`` (a ``float``)
or ``config.seconds(CLEANUP_TIMEOUT)`` for a Monarch duration, so that a misspelt key is a mypy
error and the value's type is known where it is read.

Every key ``monarch.config`` accepts is accepted by ``regency.config`` with the same type rules
and default. The ones regency has an equivalent for also set that setting (``_FEEDS``); the
others are stored and read back, and change nothing else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar


class Encoding(enum.Enum):
    """Monarch's message encodings (``default_encoding``); regency always uses pickle."""

    Bincode = 0
    Json = 1
    Multipart = 2


class ChannelTransport(enum.Enum):
    """Monarch's channel transports (``enable_transport``, ``default_transport``).

    Regency picks the transport per peer (unix sockets on one machine, TCP across machines), so
    choosing one changes nothing there (TCP runs mutual TLS 1.3 by default); QUIC is refused.
    """

    TcpWithLocalhost = 0
    TcpWithHostname = 1
    MetaTlsWithHostname = 2
    MetaTlsWithIpV6 = 3
    MetaQuicWithHostname = 4
    MetaQuicWithIpV6 = 5
    Quic = 6
    Tls = 7
    Local = 8
    Unix = 9


DURATION = "duration"
INT = "int"
OPT_INT = "optional int"
BOOL = "bool"
FLOAT = "float"
STR = "str"
ENCODING = "Encoding"
TRANSPORT = "transport"

MONARCH_KEYS: dict[str, tuple[str, Any]] = {
    "actor_spawn_max_idle": (DURATION, "30s"),
    "channel_net_rx_buffer_full_check_interval": (DURATION, "5s"),
    "channel_reconnect_timeout": (DURATION, "1m"),
    "channel_tcp_congestion": (STR, ""),
    "channel_tcp_keepalive_idle": (DURATION, "1m"),
    "cleanup_timeout": (DURATION, "3s"),
    "codec_max_frame_length": (INT, 10737418240),
    "default_encoding": (ENCODING, Encoding.Multipart),
    "default_transport": (TRANSPORT, ChannelTransport.Unix),
    "enable_dest_actor_reordering_buffer": (BOOL, True),
    "enable_file_capture": (BOOL, False),
    "enable_log_forwarding": (BOOL, False),
    "enable_otel_metrics": (BOOL, True),
    "enable_otel_tracing": (BOOL, True),
    "enable_recorder_tracing": (BOOL, True),
    "enable_sqlite_tracing": (BOOL, False),
    "enable_unawaited_python_task_traceback": (BOOL, False),
    "file_log_level": (STR, ""),
    "force_file_log": (BOOL, False),
    "forwarder_flush_timeout": (DURATION, "5s"),
    "get_actor_state_max_idle": (DURATION, "30s"),
    "get_proc_state_max_idle": (DURATION, "1m"),
    "host_spawn_ready_timeout": (DURATION, "30s"),
    "max_cast_dimension_size": (INT, 16),
    "max_cast_fanout": (INT, 16),
    "mesh_admin_addr": (STR, "[::]:1729"),
    "mesh_admin_config_dump_bridge_timeout": (DURATION, "5s"),
    "mesh_admin_max_concurrent_resolves": (INT, 2),
    "mesh_admin_pyspy_bridge_timeout": (DURATION, "13s"),
    "mesh_admin_pyspy_client_timeout": (DURATION, "20s"),
    "mesh_admin_pyspy_max_profile_duration": (DURATION, "5m"),
    "mesh_admin_pyspy_timeout": (DURATION, "10s"),
    "mesh_admin_query_child_timeout": (DURATION, "100ms"),
    "mesh_admin_resolve_actor_timeout": (DURATION, "200ms"),
    "mesh_admin_single_host_timeout": (DURATION, "3s"),
    "mesh_admin_tree_timeout": (DURATION, "10s"),
    "mesh_attach_config_timeout": (DURATION, "1m"),
    "mesh_bootstrap_enable_pdeathsig": (BOOL, True),
    "mesh_orphan_timeout": (DURATION, "1m"),
    "mesh_proc_spawn_max_idle": (DURATION, "30s"),
    "mesh_terminate_concurrency": (INT, 16),
    "mesh_terminate_timeout": (DURATION, "10s"),
    "message_ack_every_n_messages": (INT, 1000),
    "message_ack_time_interval": (DURATION, "500ms"),
    "message_delivery_timeout": (DURATION, "30s"),
    "message_latency_sampling_rate": (FLOAT, 0.01),
    "message_ttl_default": (INT, 64),
    "monarch_log_suffix": (STR, ""),
    "otel_metric_export_interval": (DURATION, "1s"),
    "pending_actor_delivery_timeout": (DURATION, "30s"),
    "prefix_with_rank": (BOOL, True),
    "proc_launcher_kind": (STR, ""),
    "proc_stop_max_idle": (DURATION, "30s"),
    "process_exit_timeout": (DURATION, "10s"),
    "process_memory_metric_interval": (DURATION, "5m"),
    "pyspy_bin": (STR, ""),
    "rdma_allow_tcp_fallback": (BOOL, True),
    "rdma_cq_poller_per_device": (BOOL, True),
    "rdma_disable_ibverbs": (BOOL, False),
    "rdma_host_odp": (BOOL, False),
    "rdma_ibverbs_target": (STR, ""),
    "rdma_max_chunk_size_mb": (INT, 64),
    "rdma_max_nics_per_buffer": (OPT_INT, None),
    "rdma_min_stripe_size_kb": (INT, 512),
    "rdma_peer_device_affinity": (STR, ""),
    "rdma_qp_init_timeout": (DURATION, "30s"),
    "rdma_qps_per_cq": (INT, 64),
    "rdma_qps_per_peer": (INT, 4),
    "rdma_runtime_worker_threads": (INT, 4),
    "rdma_tcp_fallback_parallelism": (INT, 1),
    "read_log_buffer": (INT, 100),
    "scuba_log_enter_exit": (BOOL, False),
    "sequencer_max_locked_keys": (INT, 128),
    "server_heartbeat_interval": (DURATION, "1s"),
    "small_write_threshold": (INT, 256),
    "split_max_buffer_age": (DURATION, "50ms"),
    "split_max_buffer_size": (INT, 5),
    "stop_actor_timeout": (DURATION, "10s"),
    "stop_grace_period": (DURATION, "10s"),
    "supervision_watchdog_timeout": (DURATION, "2m"),
    "tail_log_lines": (INT, 0),
    "terminated_snapshot_retention": (INT, 100),
    "tokio_worker_threads": (OPT_INT, None),
    "use_direct_spawn": (BOOL, False),
}

# Monarch key -> the regency key it sets (converted: durations to seconds).
FEEDS: dict[str, str] = {
    "codec_max_frame_length": "max_frame_bytes",
    "max_cast_fanout": "cast_fanout",
    "max_cast_dimension_size": "cast_fanout",
    "stop_actor_timeout": "stop_timeout",
    "process_exit_timeout": "stop_timeout",
    "server_heartbeat_interval": "heartbeat_interval",
    "supervision_watchdog_timeout": "heartbeat_timeout",
}


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Key(Generic[_T]):
    """A setting read as ``_T`` with ``regency.config.value(key)``."""

    name: str
    default: _T


@dataclass(frozen=True, slots=True)
class Duration:
    """A Monarch duration setting (``"30s"``), read in seconds with ``regency.config.seconds``."""

    name: str

    def __post_init__(self) -> None:
        if MONARCH_KEYS[self.name][0] != DURATION:
            raise ValueError(f"{self.name!r} is not a duration key")


def _monarch(name: str) -> Key[Any]:
    """Monarch's key ``name`` with its default, for a typed read."""
    return Key(name, MONARCH_KEYS[name][1])


# Regency's own keys and their defaults (documented in regency.config).
CAST_FANOUT: Key[int] = Key("cast_fanout", 16)
MAX_FRAME_BYTES: Key[int] = Key("max_frame_bytes", 10 * 1024**3)
CONNECT_TIMEOUT: Key[float] = Key("connect_timeout", 30.0)
STOP_TIMEOUT: Key[float] = Key("stop_timeout", 10.0)
SHM_ARENA_BYTES: Key[int] = Key("shm_arena_bytes", 1024**3)
HEAP_KEEP_BYTES: Key[int] = Key("heap_keep_bytes", 1024**3)
HEARTBEAT_INTERVAL: Key[float] = Key("heartbeat_interval", 1.0)
HEARTBEAT_TIMEOUT: Key[float] = Key("heartbeat_timeout", 5.0)
MAX_PROCS_PER_HOST: Key[int] = Key("max_procs_per_host", 1024)
TELEMETRY: Key[bool] = Key("telemetry", False)
TELEMETRY_TRACES_PER_S: Key[float] = Key("telemetry_traces_per_s", 100.0)
TELEMETRY_RETENTION: Key[float] = Key("telemetry_retention", 3600.0)
TELEMETRY_MAX_ROWS: Key[int] = Key("telemetry_max_rows", 1_000_000)
TELEMETRY_DB: Key[str] = Key("telemetry_db", "")

REGENCY_KEYS: tuple[Key[Any], ...] = (
    CAST_FANOUT,
    MAX_FRAME_BYTES,
    CONNECT_TIMEOUT,
    STOP_TIMEOUT,
    SHM_ARENA_BYTES,
    HEAP_KEEP_BYTES,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    MAX_PROCS_PER_HOST,
    TELEMETRY,
    TELEMETRY_TRACES_PER_S,
    TELEMETRY_RETENTION,
    TELEMETRY_MAX_ROWS,
    TELEMETRY_DB,
)

# Monarch's keys that change what regency does.
ENABLE_LOG_FORWARDING: Key[bool] = _monarch("enable_log_forwarding")
ENABLE_OTEL_TRACING: Key[bool] = _monarch("enable_otel_tracing")
ENABLE_OTEL_METRICS: Key[bool] = _monarch("enable_otel_metrics")
CLEANUP_TIMEOUT = Duration("cleanup_timeout")
OTEL_METRIC_EXPORT_INTERVAL = Duration("otel_metric_export_interval")
