"""Runtime settings: ``configure(**kw)``, ``configured(**kw)`` and ``REGENCY_*`` variables.

Precedence, highest first: values set with :func:`configure`, environment variables
(``REGENCY_<KEY>`` in upper case), then defaults. Spawned processes inherit the controller's
effective settings.

Regency's own keys:

==========================  ========  ==========================================================
key                         default   meaning
==========================  ========  ==========================================================
``cast_fanout``             16        children per node of the casting tree
``max_frame_bytes``         10 GiB    largest message a process sends or accepts
``connect_timeout``         30.0      seconds to keep dialing a proc that is starting
``stop_timeout``            10.0      seconds a stopping proc gets before it is killed
``shm_arena_bytes``         1 GiB     shared memory a proc uses for large parts to same-host peers
``heap_keep_bytes``         1 GiB     freed memory a proc's malloc keeps for reuse (glibc), so
                                      large objects it rebuilds from messages land in warm pages;
                                      0 leaves glibc's defaults (``_runtime/host/heap.py``)
``cleanup_timeout``         ``"3s"``  how long an actor's ``__cleanup__`` may take before it
                                      counts as failed (a duration, or a number of seconds); also
                                      how long a stop waits for an actor busy in ``__init__`` or a
                                      handler before it goes on without it
``heartbeat_interval``      1.0       seconds between pings on an idle TCP connection to a
                                      worker host or controller (procs have none: their host
                                      answers for them); also the time between unanswered TCP
                                      keepalive probes
``heartbeat_timeout``       5.0       seconds of silence after which a TCP peer (a stopped
                                      process, a host cut off) is declared lost
``max_procs_per_host``      1024      most processes one request starts on one machine: the
                                      procs per host of ``spawn_procs`` (the product of
                                      ``per_host``'s sizes) and the hosts of a ``ProcessJob``
                                      mesh; a larger request is refused at once
``telemetry``               False     record spans and metrics (``docs/introspection.md``);
                                      procs follow the controller's setting
``telemetry_traces_per_s``  100.0     most new traces a process starts per second (calls and
                                      spans inside a traced one always join its trace)
``telemetry_retention``     3600.0    seconds the local recorder keeps spans and metrics (and
                                      each host the job's telemetry rows)
``telemetry_max_rows``      1000000   most rows the recorder (and each host) keeps per table
``telemetry_db``            ``""``    the recorder's SQLite file (default: this user's
                                      private ``$TMPDIR/regency-<uid>/telemetry/telemetry.db``)
==========================  ========  ==========================================================

Every key of Monarch's ``monarch.config`` is accepted too, with Monarch's types and defaults:
durations are strings such as ``"30s"`` or ``"1m 30s"``, normalised when read (``"300s"`` reads
back ``"5m"``). Those regency has an equivalent for set it as well (the latest value configured
wins): ``codec_max_frame_length`` sets ``max_frame_bytes``; ``max_cast_fanout`` and
``max_cast_dimension_size`` set ``cast_fanout``; ``stop_actor_timeout`` and
``process_exit_timeout`` set ``stop_timeout``; ``server_heartbeat_interval`` sets
``heartbeat_interval``; ``supervision_watchdog_timeout`` sets ``heartbeat_timeout``. The others
(``message_delivery_timeout``, ``enable_log_forwarding``, the ``rdma_*`` keys, ...) are stored
and read back and change nothing else.

Unknown keys raise ``ValueError``; values of the wrong type (or malformed durations) raise
``TypeError``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

from regency import _humantime, _public
from regency._config_keys import (
    BOOL,
    DURATION,
    ENCODING,
    FEEDS,
    FLOAT,
    INT,
    MONARCH_KEYS,
    OPT_INT,
    REGENCY_KEYS,
    STR,
    TRANSPORT,
    ChannelTransport,
    Duration,
    Encoding,
    Key,
)
from regency._errors import RegencyError
from regency._transport import tls

_DEFAULTS: dict[str, Any] = {key.name: key.default for key in REGENCY_KEYS}
_T = TypeVar("_T")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_KEYS = frozenset(_DEFAULTS) | frozenset(MONARCH_KEYS)
# Monarch's durations that also take a number of seconds (regency's older form).
_SECONDS_TOO = frozenset({"cleanup_timeout"})
# Regency's keys where 0 turns the feature off (the others must be positive).
_ZERO_IS_OFF = frozenset({"heap_keep_bytes"})
_U64 = 2**64
_TRANSPORT_SHORTCUTS = {
    "tcp": ChannelTransport.TcpWithHostname,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}
_QUIC = frozenset(
    {
        ChannelTransport.MetaQuicWithHostname,
        ChannelTransport.MetaQuicWithIpV6,
        ChannelTransport.Quic,
    }
)
_ENCRYPTED = frozenset(
    {
        ChannelTransport.Tls,
        ChannelTransport.MetaTlsWithHostname,
        ChannelTransport.MetaTlsWithIpV6,
        ChannelTransport.MetaQuicWithHostname,
        ChannelTransport.MetaQuicWithIpV6,
        ChannelTransport.Quic,
    }
)
_URL_SCHEMES = ("tcp://", "ipc://", "unix:", "metatls://", "tls://", "inproc://")

_runtime: dict[str, Any] = {}  # in the order configured, the latest last
_fed: dict[str, Any] = {}  # regency keys' values from _runtime, after their Monarch sources
_change_numbers = itertools.count(1)  # next() on it is atomic: concurrent changes stay distinct
_changes = 0  # the number of the latest change to _runtime


class _BadValueError(RegencyError):
    """Why a value does not fit its key (becomes the ``TypeError``'s explanation)."""


def _cannot_cast(value: Any, target: str) -> _BadValueError:
    kind = type(value).__name__
    return _BadValueError(f"TypeError: {kind!r} object cannot be cast as {target!r}")


def _type_error(key: str, value: Any, why: str) -> TypeError:
    return TypeError(f"invalid value `{value!r}` for configuration key `{key}` ({why})")


def _coerce_regency(key: str, value: Any) -> Any:
    kind = type(_DEFAULTS[key])
    if kind is bool:
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        if not isinstance(value, bool):
            raise _type_error(key, value, "takes a bool")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise _type_error(key, value, "takes a str")
        return value
    if isinstance(value, str):
        try:
            value = kind(value)
        except ValueError:
            raise _type_error(key, value, f"takes a {kind.__name__}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(key, value, f"takes a {kind.__name__}")
    if kind is int and not isinstance(value, int):
        raise _type_error(key, value, "takes an int")
    if value == 0 and key in _ZERO_IS_OFF:
        return kind(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"config {key!r} must be a positive, finite number, got {value!r}")
    return kind(value)


def _duration(key: str, value: Any) -> str:
    if key in _SECONDS_TOO and not isinstance(value, bool) and isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"config {key!r} must be a positive, finite number, got {value!r}")
        return _humantime.format(round(value * 1e9))
    if not isinstance(value, str):
        raise _cannot_cast(value, "str")
    try:
        return _humantime.format(_humantime.parse(value))
    except ValueError as exc:
        raise _BadValueError(f"ValueError: {exc}") from None


def _integer(value: Any) -> int:
    if not isinstance(value, int):
        raise _BadValueError(
            f"TypeError: {type(value).__name__!r} object cannot be interpreted as an integer"
        )
    if value < 0:
        raise _BadValueError("OverflowError: can't convert negative int to unsigned")
    if value >= _U64:
        raise _BadValueError("OverflowError: int too big to convert")
    return int(value)


def _transport(given: Any) -> ChannelTransport | str:
    if not isinstance(given, (ChannelTransport, str)):
        raise _BadValueError("TypeError: expected ChannelTransport enum, BindSpec, or str")
    value: ChannelTransport | str = given
    if isinstance(value, str):
        if value in _TRANSPORT_SHORTCUTS:
            value = _TRANSPORT_SHORTCUTS[value]
        elif not value.startswith(_URL_SCHEMES):
            raise ValueError(f"invalid str for BindSpec {value!r}: invalid bind spec: {value}")
    quic = value in _QUIC if isinstance(value, ChannelTransport) else False
    encrypted = (
        value in _ENCRYPTED
        if isinstance(value, ChannelTransport)
        else value.startswith(("metatls://", "tls://"))
    )
    if quic:
        raise NotImplementedError(
            f"transport {value} is QUIC, which regency does not implement; its TCP connections "
            "run mutual TLS 1.3 (choose a TLS or TCP transport)"
        )
    if encrypted and not tls.enabled():
        # Accepting it would promise encryption this process does not provide.
        raise NotImplementedError(
            f"transport {value} needs TLS, which is turned off here ({tls.ENABLE_ENV}=0)"
        )
    return value


def _coerce_monarch(key: str, value: Any) -> Any:
    kind = MONARCH_KEYS[key][0]
    if kind == DURATION:
        return _duration(key, value)
    if kind == INT:
        return _integer(value)
    if kind == OPT_INT:
        return None if value is None else _integer(value)
    if kind == FLOAT:
        if not isinstance(value, (int, float)):
            raise _BadValueError(f"TypeError: must be real number, not {type(value).__name__}")
        return float(value)
    if kind == BOOL:
        if not isinstance(value, bool):
            raise _cannot_cast(value, "bool")
        return value
    if kind == STR:
        if not isinstance(value, str):
            raise _cannot_cast(value, "str")
        return value
    if kind == ENCODING:
        if not isinstance(value, Encoding):
            raise _BadValueError(f"{type(value).__name__!r} object cannot be cast as 'Encoding'")
        return value
    assert kind == TRANSPORT
    return _transport(value)


def _coerce(key: str, value: Any) -> Any:
    if key in _DEFAULTS:
        return _coerce_regency(key, value)
    try:
        return _coerce_monarch(key, value)
    except _BadValueError as exc:
        raise _type_error(key, value, str(exc)) from None


def _from_env(key: str, text: str) -> Any:
    """A ``REGENCY_<KEY>`` value (always a string) as the key's type."""
    if key in _DEFAULTS:
        return _coerce(key, text)
    kind = MONARCH_KEYS[key][0]
    value: Any = text
    with contextlib.suppress(ValueError):
        if kind in (INT, OPT_INT):
            value = None if kind == OPT_INT and text.lower() in ("", "none") else int(text)
        elif kind == FLOAT:
            value = float(text)
        elif kind == BOOL:
            value = {"1": True, "true": True, "0": False, "false": False}.get(text.lower(), text)
        elif kind == ENCODING:
            value = Encoding[text]
        elif kind == DURATION and key in _SECONDS_TOO:
            value = float(text)
    return _coerce(key, value)


def _check_keys(kw: dict[str, Any]) -> None:
    for key in kw:
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=3)
            hint = f"did you mean {close}?" if close else "see regency.config.get_global_config()"
            raise ValueError(f"invalid configuration key: `{key}` ({hint})")


def _seconds_of(key: str, value: Any) -> Any:
    if MONARCH_KEYS[key][0] == DURATION:
        return _humantime.parse(value) / 1e9
    return value


def _refeed() -> None:
    """Recompute the regency keys' configured values from ``_runtime``, the latest winning."""
    global _changes
    _fed.clear()
    for key, value in _runtime.items():
        if key in _DEFAULTS:
            _fed[key] = value
            continue
        target = FEEDS.get(key)
        if target is None:
            continue
        fed = _seconds_of(key, value)
        if fed > 0:
            _fed[target] = type(_DEFAULTS[target])(fed)
    _changes = next(_change_numbers)


def changes() -> int:
    """A number that moves whenever the configured values change in this process.

    :func:`configure`, the end of a :func:`configured` block (its undo) and
    :func:`clear_runtime_config` move it. A hot path that caches a value (the casting tree's
    fan-out on every forwarding process) reads this first and :func:`get` again only when it
    moved. Environment variables are not watched: a process reads them as it starts.
    """
    return _changes


def configure(**kw: Any) -> None:
    """Set runtime values, e.g. ``configure(message_delivery_timeout="5m", cast_fanout=2)``.

    Unknown keys raise ``ValueError``; values of the wrong type raise ``TypeError``; nothing is
    set unless every value is valid.
    """
    _check_keys(kw)
    values = {key: _coerce(key, value) for key, value in kw.items()}
    for key, value in values.items():
        _runtime.pop(key, None)
        _runtime[key] = value
    _refeed()


@contextlib.contextmanager
def configured(**kw: Any) -> Iterator[dict[str, Any]]:
    """Apply ``kw`` inside a ``with`` block and restore the previous values afterwards.

    Yields every key's effective value (as :func:`get_global_config`).
    """
    saved = dict(_runtime)
    configure(**kw)
    try:
        yield get_global_config()
    finally:
        _runtime.clear()
        _runtime.update(saved)
        _refeed()


def get(key: str) -> Any:
    """The effective value of one key (durations of Monarch's keys as normalised strings)."""
    if key in _fed:
        return _fed[key]
    if key in _runtime:
        return _runtime[key]
    env = os.environ.get(f"REGENCY_{key.upper()}")
    if env is not None:
        return _from_env(key, env)
    if key in _DEFAULTS:
        return _DEFAULTS[key]
    return MONARCH_KEYS[key][1]


def get_seconds(key: str) -> float:
    """The effective value of a duration key, in seconds.

    For example ``cleanup_timeout``, ``stop_timeout`` or ``message_delivery_timeout``.
    """
    value = get(key)
    return float(value) if key in _DEFAULTS else float(_seconds_of(key, value))


def value(key: Key[_T]) -> _T:
    """The effective value of ``key`` (a key object of ``regency._config_keys``), as its type."""
    return cast("_T", get(key.name))


def seconds(key: Duration) -> float:
    """The effective value of Monarch's duration ``key``, in seconds."""
    return get_seconds(key.name)


def get_global_config() -> dict[str, Any]:
    """Every key's effective value (runtime over environment over defaults)."""
    # Monarch's keys come first: a process that configure()s this whole dict (a spawned proc)
    # then sets regency's keys last, so they keep the values they have here.
    merged = {key: get(key) for key in MONARCH_KEYS}
    merged.update((key, get(key)) for key in _DEFAULTS)
    return merged


def get_runtime_config() -> dict[str, Any]:
    """Only the values set with :func:`configure`."""
    return dict(_runtime)


def clear_runtime_config() -> None:
    """Forget every value set with :func:`configure`."""
    _runtime.clear()
    _refeed()


def _check_procs_per_host(count: int, what: str) -> None:
    """Refuse a request for more processes on one machine than ``max_procs_per_host``.

    ``count`` is how many it asks for, ``what`` names it in the ``ValueError``.
    """
    limit = get("max_procs_per_host")
    if count > limit:
        raise ValueError(
            f"{what} asks for {count} processes on one host, over the limit of {limit} "
            f"(max_procs_per_host; raise it with regency.config.configure(max_procs_per_host=N) "
            f"or REGENCY_MAX_PROCS_PER_HOST)"
        )


__all__ = [
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
]


# -- pytest helpers that run a test once per set of config values (``monarch.config``'s) ------

_ARG = "_config_overrides"


def _sweep(
    combos: Sequence[dict[str, Any]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import pytest

    ids = ["-".join(f"{k}={v}" for k, v in combo.items()) for combo in combos]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        extra = inspect.Parameter(_ARG, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wrapped: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):

            async def run_async(_config_overrides: dict[str, Any], *a: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return await fn(*a, **kw)

            wrapped = run_async
        else:

            def run(_config_overrides: dict[str, Any], *a: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*a, **kw)

            wrapped = run
        functools.update_wrapper(wrapped, fn)
        wrapped.__signature__ = signature.replace(  # type: ignore[union-attr]
            parameters=[extra, *signature.parameters.values()]
        )
        return pytest.mark.parametrize(_ARG, list(combos), ids=ids)(wrapped)  # type: ignore[no-any-return]

    return decorate


def parametrize_config(
    **options: Iterable[Any],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated test once per combination of the given values (cartesian product).

    Each run is inside ``configured(...)`` with that combination.
    """
    if not options:
        raise ValueError("parametrize_config requires at least one config option")
    keys = list(options)
    product = itertools.product(*map(list, options.values()))
    combos = [dict(zip(keys, values, strict=True)) for values in product]
    return _sweep(combos)


def parametrize_config_pointwise(
    **options: Sequence[Any],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like :func:`parametrize_config`, but taking the i-th value of every option together.

    Every option must have the same number of values.
    """
    if not options:
        raise ValueError("parametrize_config_pointwise requires at least one config option")
    lengths = {key: len(values) for key, values in options.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            "parametrize_config_pointwise requires every option to have the same number of "
            f"values; got lengths {lengths}"
        )
    keys = list(options)
    rows = zip(*options.values(), strict=True)
    return _sweep([dict(zip(keys, values, strict=True)) for values in rows])


_public.publish(__name__, globals())
