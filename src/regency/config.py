"""Runtime settings: ``configure(**kw)``, ``configured(**kw)`` and ``REGENCY_*`` variables.

Precedence, highest first: values set with :func:`configure`, environment variables
(``REGENCY_<KEY>`` in upper case), then defaults. Spawned processes inherit the controller's
effective settings.

=======================  ===========  ==========================================================
key                      default      meaning
=======================  ===========  ==========================================================
``cast_fanout``          16           children per node of the casting tree
``max_frame_bytes``      10 GiB       largest message a process sends or accepts
``connect_timeout``      30.0         seconds to keep dialing a proc that is starting
``stop_timeout``         10.0         seconds a stopping proc gets before it is killed
``shm_arena_bytes``      1 GiB        shared memory a proc uses for large parts to same-host peers
``cleanup_timeout``      3.0          seconds an actor's ``__cleanup__`` may take before it counts
                                      as failed; also how long a stop waits for an actor busy
                                      in ``__init__`` or a handler before it goes on without it
``heartbeat_interval``   1.0          seconds between heartbeats on an idle TCP connection (to
                                      worker hosts and their procs); also the TCP keepalive period
``heartbeat_timeout``    5.0          seconds of silence after which a TCP peer (a stopped
                                      process, a host cut off) is declared lost
=======================  ===========  ==========================================================
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

_DEFAULTS: dict[str, Any] = {
    "cast_fanout": 16,
    "max_frame_bytes": 10 * 1024**3,
    "connect_timeout": 30.0,
    "stop_timeout": 10.0,
    "shm_arena_bytes": 1024**3,
    "cleanup_timeout": 3.0,
    "heartbeat_interval": 1.0,
    "heartbeat_timeout": 5.0,
}
_runtime: dict[str, Any] = {}


def _coerce(key: str, value: Any) -> Any:
    default = _DEFAULTS[key]
    kind = type(default)
    if isinstance(value, str):
        try:
            value = kind(value)
        except ValueError:
            raise TypeError(f"config {key!r} takes a {kind.__name__}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"config {key!r} takes a {kind.__name__}, got {value!r}")
    if kind is int and not isinstance(value, int):
        raise TypeError(f"config {key!r} takes an int, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"config {key!r} must be a positive, finite number, got {value!r}")
    return kind(value)


def _check_keys(kw: dict[str, Any]) -> None:
    unknown = sorted(set(kw) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known keys: {sorted(_DEFAULTS)}")


def configure(**kw: Any) -> None:
    """Set runtime values, e.g. ``configure(cast_fanout=2)``.

    Unknown keys raise ``ValueError``; values of the wrong type raise ``TypeError``.
    """
    _check_keys(kw)
    for key, value in kw.items():
        _runtime[key] = _coerce(key, value)


@contextlib.contextmanager
def configured(**kw: Any) -> Iterator[dict[str, Any]]:
    """Apply ``kw`` inside a ``with`` block and restore the previous values afterwards."""
    saved = dict(_runtime)
    configure(**kw)
    try:
        yield get_global_config()
    finally:
        _runtime.clear()
        _runtime.update(saved)


def get(key: str) -> Any:
    """The effective value of one key."""
    if key in _runtime:
        return _runtime[key]
    env = os.environ.get(f"REGENCY_{key.upper()}")
    if env is not None:
        return _coerce(key, env)
    return _DEFAULTS[key]


def get_global_config() -> dict[str, Any]:
    """Every key's effective value (runtime over environment over defaults)."""
    return {key: get(key) for key in _DEFAULTS}


def get_runtime_config() -> dict[str, Any]:
    """Only the values set with :func:`configure`."""
    return dict(_runtime)


def clear_runtime_config() -> None:
    """Forget every value set with :func:`configure`."""
    _runtime.clear()


__all__ = [
    "clear_runtime_config",
    "configure",
    "configured",
    "get",
    "get_global_config",
    "get_runtime_config",
]
