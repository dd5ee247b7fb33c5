"""monarch.config (monarch-api.md §1.2, keys and defaults §1.10)."""

from __future__ import annotations

import pytest
from compat_impl import actor, config


@pytest.fixture(autouse=True)
def _clean_runtime_layer():
    # configured() restores the runtime layer as it was (other suites set keys at import time)
    with config.configured():
        config.clear_runtime_config()
        yield


@pytest.mark.parametrize(
    ("key", "default"),
    [
        ("codec_max_frame_length", 10 * 1024**3),
        ("message_delivery_timeout", "30s"),
        ("cleanup_timeout", "3s"),
        ("stop_actor_timeout", "10s"),
        ("supervision_watchdog_timeout", "2m"),
        ("enable_log_forwarding", False),
        ("max_cast_dimension_size", 16),
        ("host_spawn_ready_timeout", "30s"),
        ("process_exit_timeout", "10s"),
        ("mesh_proc_spawn_max_idle", "30s"),
        ("actor_spawn_max_idle", "30s"),
        ("message_ttl_default", 64),
        ("small_write_threshold", 256),
        ("message_ack_every_n_messages", 1000),
        ("message_ack_time_interval", "500ms"),
        ("split_max_buffer_size", 5),
        ("enable_file_capture", False),
        ("tail_log_lines", 0),
        ("read_log_buffer", 100),
        ("prefix_with_rank", True),
        ("force_file_log", False),
        ("mesh_terminate_timeout", "10s"),
        ("mesh_orphan_timeout", "1m"),
        ("mesh_bootstrap_enable_pdeathsig", True),
        ("proc_stop_max_idle", "30s"),
        ("get_actor_state_max_idle", "30s"),
        ("rdma_allow_tcp_fallback", True),
        ("rdma_disable_ibverbs", False),
    ],
)
def test_default(key, default):
    assert config.get_global_config()[key] == default


def test_default_encoding_is_multipart():
    assert config.get_global_config()["default_encoding"] == config.Encoding.Multipart


def test_encoding_members():
    members = [config.Encoding.Bincode, config.Encoding.Json, config.Encoding.Multipart]
    assert len({repr(m) for m in members}) == 3


def test_channel_transport_members():
    for name in (
        "TcpWithLocalhost",
        "TcpWithHostname",
        "MetaTlsWithHostname",
        "Tls",
        "Local",
        "Unix",
    ):
        assert hasattr(config.ChannelTransport, name)
    assert config.ChannelTransport is actor.ChannelTransport


def test_unknown_key_is_value_error():
    with pytest.raises(ValueError, match="invalid configuration key: `nope`"):
        config.configure(nope=1)


def test_wrong_type_is_type_error():
    with pytest.raises(TypeError, match=r"invalid value .* for configuration key"):
        config.configure(codec_max_frame_length="x")


def test_int_for_bool_is_type_error():
    with pytest.raises(TypeError, match="'int' object cannot be cast as 'bool'"):
        config.configure(enable_log_forwarding=1)


def test_negative_for_unsigned_is_type_error():
    with pytest.raises(TypeError, match="can't convert negative int to unsigned"):
        config.configure(tail_log_lines=-1)


def test_malformed_duration_is_type_error():
    with pytest.raises(TypeError, match="Invalid duration format 'abc'"):
        config.configure(message_delivery_timeout="abc")


@pytest.mark.parametrize(
    ("given", "read"), [("300s", "5m"), ("90s", "1m 30s"), ("1500ms", "1s 500ms"), ("2m", "2m")]
)
def test_durations_are_normalised_on_read(given, read):
    config.configure(message_delivery_timeout=given)
    assert config.get_global_config()["message_delivery_timeout"] == read
    assert config.get_runtime_config()["message_delivery_timeout"] == read


def test_clear_runtime_config_restores_defaults():
    config.configure(message_delivery_timeout="300s")
    config.clear_runtime_config()
    assert config.get_global_config()["message_delivery_timeout"] == "30s"


def test_configured_sets_and_restores():
    config.configure(tail_log_lines=7)
    with config.configured(tail_log_lines=5) as merged:
        assert config.get_global_config()["tail_log_lines"] == 5
        assert isinstance(merged, dict)
        assert merged["tail_log_lines"] == 5
    assert config.get_global_config()["tail_log_lines"] == 7


def test_configured_restores_after_an_exception():
    with pytest.raises(KeyError), config.configured(tail_log_lines=3):
        raise KeyError("inside")
    assert config.get_global_config()["tail_log_lines"] == 0


def test_configure_several_keys_at_once():
    config.configure(tail_log_lines=2, enable_log_forwarding=True)
    got = config.get_global_config()
    assert (got["tail_log_lines"], got["enable_log_forwarding"]) == (2, True)


@pytest.mark.deviation(
    "regency's get_runtime_config lists only the keys set at runtime", skip="regency"
)
def test_runtime_config_lists_defaults_too():
    assert "message_delivery_timeout" in config.get_runtime_config()


def test_actor_config_prefix_python_logs_with_actor():
    assert actor.config.prefix_python_logs_with_actor is True


def test_parametrize_config_helpers_exist():
    assert callable(config.parametrize_config)
    assert callable(config.parametrize_config_pointwise)
