"""Typed reads of settings through their key objects (regency._config_keys)."""

from __future__ import annotations

import pytest

from regency import _config_keys as keys
from regency import config


def test_a_key_reads_as_its_type_from_configure_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert config.value(keys.STOP_TIMEOUT) == 10.0
    monkeypatch.setenv("REGENCY_CAST_FANOUT", "7")
    assert config.value(keys.CAST_FANOUT) == 7
    with config.configured(stop_timeout=2, telemetry="on"):
        assert config.value(keys.STOP_TIMEOUT) == 2.0
        assert isinstance(config.value(keys.STOP_TIMEOUT), float)
        assert config.value(keys.TELEMETRY) is True


def test_monarch_keys_read_typed_and_durations_in_seconds() -> None:
    assert config.value(keys.ENABLE_LOG_FORWARDING) is False
    with config.configured(cleanup_timeout="1m 30s", supervision_watchdog_timeout="7s"):
        assert config.seconds(keys.CLEANUP_TIMEOUT) == 90.0
        assert config.value(keys.HEARTBEAT_TIMEOUT) == 7.0  # fed by Monarch's key


def test_the_key_table_is_regency_s_defaults() -> None:
    assert {k.name: k.default for k in keys.REGENCY_KEYS} == {
        k: config.get_global_config()[k] for k in (k.name for k in keys.REGENCY_KEYS)
    }


def test_a_duration_key_must_be_one_of_monarch_s_durations() -> None:
    with pytest.raises(ValueError, match="'enable_log_forwarding' is not a duration key"):
        keys.Duration("enable_log_forwarding")
    with pytest.raises(KeyError):
        keys.Duration("cleanup_timeuot")
