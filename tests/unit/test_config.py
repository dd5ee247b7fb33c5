"""``regency.config``: configure/configured, REGENCY_* variables, precedence and validation."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import pytest

from regency import config

pytestmark = pytest.mark.timeout(60)

DEFAULTS = {
    "cast_fanout": 16,
    "max_frame_bytes": 10 * 1024**3,
    "connect_timeout": 30.0,
    "stop_timeout": 10.0,
    "shm_arena_bytes": 1024**3,
    "heap_keep_bytes": 1024**3,
    "cleanup_timeout": "3s",
    "heartbeat_interval": 1.0,
    "heartbeat_timeout": 5.0,
}


@pytest.fixture(autouse=True)
def clean_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from no configure() values and no REGENCY_* variables, and leaves the
    process's settings (shared with any runtime in this process) as it found them."""
    saved = config.get_runtime_config()
    for key in list(os.environ):
        if key.startswith("REGENCY_"):
            monkeypatch.delenv(key)
    config.clear_runtime_config()
    yield
    config.clear_runtime_config()
    config.configure(**saved)


def test_defaults() -> None:
    values = config.get_global_config()
    assert {key: values[key] for key in DEFAULTS} == DEFAULTS
    assert config.get_runtime_config() == {}


def test_configure_sets_and_clear_forgets() -> None:
    config.configure(cast_fanout=2, stop_timeout=1.5)
    assert config.get("cast_fanout") == 2
    assert config.get("stop_timeout") == 1.5
    assert config.get_runtime_config() == {"cast_fanout": 2, "stop_timeout": 1.5}
    config.clear_runtime_config()
    assert config.get("cast_fanout") == 16


def test_values_take_the_type_of_the_default() -> None:
    config.configure(connect_timeout=5, max_frame_bytes="4096")
    assert config.get("connect_timeout") == 5.0
    assert type(config.get("connect_timeout")) is float
    assert config.get("max_frame_bytes") == 4096
    assert type(config.get("max_frame_bytes")) is int


def test_configured_restores_on_exit_and_on_error() -> None:
    config.configure(cast_fanout=3)
    with config.configured(cast_fanout=4, stop_timeout=2) as values:
        assert values["cast_fanout"] == 4
        assert values["stop_timeout"] == 2.0
        assert config.get("cast_fanout") == 4
    assert config.get("cast_fanout") == 3
    assert config.get("stop_timeout") == 10.0
    with pytest.raises(RuntimeError), config.configured(cast_fanout=5):
        raise RuntimeError("inside")
    assert config.get_runtime_config() == {"cast_fanout": 3}


def test_configured_with_a_bad_key_changes_nothing() -> None:
    config.configure(cast_fanout=3)
    with pytest.raises(ValueError), config.configured(cast_fanout=4, nope=1):
        pass
    assert config.get_runtime_config() == {"cast_fanout": 3}


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_CAST_FANOUT", "7")
    monkeypatch.setenv("REGENCY_CONNECT_TIMEOUT", "2.5")
    assert config.get("cast_fanout") == 7
    assert config.get("connect_timeout") == 2.5
    assert config.get_global_config()["cast_fanout"] == 7
    assert config.get_runtime_config() == {}


def test_precedence_configure_over_environment_over_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert config.get("cast_fanout") == 16
    monkeypatch.setenv("REGENCY_CAST_FANOUT", "7")
    assert config.get("cast_fanout") == 7
    config.configure(cast_fanout=3)
    assert config.get("cast_fanout") == 3
    with config.configured(cast_fanout=2):
        assert config.get("cast_fanout") == 2
    assert config.get("cast_fanout") == 3
    config.clear_runtime_config()
    assert config.get("cast_fanout") == 7
    monkeypatch.delenv("REGENCY_CAST_FANOUT")
    assert config.get("cast_fanout") == 16


@pytest.mark.parametrize("kw", [{"nope": 1}, {"cast_fanout": 2, "castfanout": 2}, {"": 1}])
def test_unknown_key_is_a_value_error_naming_it(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError) as info:
        config.configure(**kw)
    bad = next(k for k in kw if k not in DEFAULTS)
    assert f"invalid configuration key: `{bad}`" in str(info.value)
    assert config.get_runtime_config() == {}, "a rejected call must not half-apply"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cast_fanout", True),
        ("cast_fanout", None),
        ("cast_fanout", [4]),
        ("cast_fanout", "four"),
        ("cast_fanout", b"4"),
        ("connect_timeout", "soon"),
        ("connect_timeout", False),
        ("max_frame_bytes", 2.5),
        ("cast_fanout", 2.5),
    ],
)
def test_bad_type_is_a_type_error(key: str, value: object) -> None:
    with pytest.raises(TypeError) as info:
        config.configure(**{key: value})
    assert f"for configuration key `{key}`" in str(info.value)
    assert config.get_runtime_config() == {}


@pytest.mark.parametrize(
    ("key", "value"),
    [("cast_fanout", 0), ("cast_fanout", -1), ("stop_timeout", 0.0), ("max_frame_bytes", -5)],
)
def test_non_positive_is_a_value_error(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        config.configure(**{key: value})


def test_heap_keep_bytes_takes_zero_to_turn_it_off_but_not_a_negative() -> None:
    config.configure(heap_keep_bytes=0)
    assert config.get("heap_keep_bytes") == 0
    with pytest.raises(ValueError, match="heap_keep_bytes"):
        config.configure(heap_keep_bytes=-1)
    assert config.get("heap_keep_bytes") == 0


@pytest.mark.parametrize("value", [math.nan, "nan"])
def test_nan_timeout_is_rejected(value: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        config.configure(connect_timeout=value)


def test_bad_environment_variable_is_reported_with_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REGENCY_CAST_FANOUT", "many")
    with pytest.raises(TypeError, match="cast_fanout"):
        config.get("cast_fanout")
    config.configure(cast_fanout=4)  # a configured value wins without reading the variable
    assert config.get("cast_fanout") == 4
