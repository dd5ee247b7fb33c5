"""Monarch's ``get_meter()``: an OpenTelemetry meter whose instruments feed regency's telemetry.

Counters, up-down counters, histograms and gauges made from it record into the same metric
points as regency's own metrics: the ``metrics`` table of the local recorder and OTLP export,
from any process (a proc's reach the controller). With telemetry off they record nothing.
Observable (callback) instruments raise ``NotImplementedError``, as in Monarch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from regency._lowlevel import tracing
from regency.observe.telemetry.aggregate import COUNTER, GAUGE, HISTOGRAM, UPDOWN

if TYPE_CHECKING:
    from opentelemetry import metrics

METER_NAME = "monarch"
"""The name of the meter :func:`get_meter` returns (Monarch's): its metrics' ``scope_name``."""

_meter: Any = None


def _record(name: str, kind: str, amount: float, attributes: Any) -> None:
    probe = tracing.probe
    if probe is None:
        return
    if not isinstance(amount, (int, float)) or isinstance(amount, bool):
        raise TypeError(f"metric {name!r} takes a number, got {type(amount).__name__}")
    attrs = dict(attributes) if attributes else None
    probe.records.append((tracing.MEASURE, name, kind, float(amount), attrs, time.time_ns()))


def _classes() -> dict[str, type]:
    """The instrument and meter classes, built on OpenTelemetry's API on first use."""
    from opentelemetry import metrics as api

    class Counter(api.Counter):
        """A monotonic counter."""

        def __init__(self, name: str, unit: str = "", description: str = "") -> None:
            self.name, self.unit, self.description = name, unit, description

        def add(self, amount: float, attributes: Any = None, context: Any = None) -> None:
            """Add ``amount`` (not negative)."""
            if isinstance(amount, (int, float)) and amount < 0:
                raise ValueError(f"counter {self.name!r} only goes up; use an up-down counter")
            _record(self.name, COUNTER, amount, attributes)

    class UpDownCounter(api.UpDownCounter):
        """A counter that may go down."""

        def __init__(self, name: str, unit: str = "", description: str = "") -> None:
            self.name, self.unit, self.description = name, unit, description

        def add(self, amount: float, attributes: Any = None, context: Any = None) -> None:
            """Add ``amount`` (any sign)."""
            _record(self.name, UPDOWN, amount, attributes)

    class Histogram(api.Histogram):
        """A distribution of values (regency's buckets: 0.01 to 100,000, ten per decade)."""

        def __init__(
            self,
            name: str,
            unit: str = "",
            description: str = "",
            explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
        ) -> None:
            self.name, self.unit, self.description = name, unit, description

        def record(self, amount: float, attributes: Any = None, context: Any = None) -> None:
            """Record one value."""
            _record(self.name, HISTOGRAM, amount, attributes)

    class Gauge(api._Gauge):
        """A value set from time to time; a point keeps the last of its interval."""

        def __init__(self, name: str, unit: str = "", description: str = "") -> None:
            self.name, self.unit, self.description = name, unit, description

        def set(self, amount: float, attributes: Any = None, context: Any = None) -> None:
            """Set the value."""
            _record(self.name, GAUGE, amount, attributes)

    def _observable(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("observable instruments are not implemented (as in Monarch)")

    class Meter(api.Meter):
        """regency's meter (``get_meter()``)."""

        def create_counter(self, name: str, unit: str = "", description: str = "") -> Any:
            """A :class:`Counter`."""
            return Counter(name, unit, description)

        def create_up_down_counter(self, name: str, unit: str = "", description: str = "") -> Any:
            """An up-down counter."""
            return UpDownCounter(name, unit, description)

        def create_histogram(
            self,
            name: str,
            unit: str = "",
            description: str = "",
            *,
            explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
        ) -> Any:
            """A histogram."""
            return Histogram(name, unit, description)

        def create_gauge(self, name: str, unit: str = "", description: str = "") -> Any:
            """A gauge."""
            return Gauge(name, unit, description)

        create_observable_counter = _observable
        create_observable_gauge = _observable
        create_observable_up_down_counter = _observable

    classes: dict[str, type] = {
        "Meter": Meter,
        "Counter": Counter,
        "UpDownCounter": UpDownCounter,
        "Histogram": Histogram,
        "Gauge": Gauge,
    }
    for label, cls in classes.items():
        cls.__qualname__ = label  # not "_classes.<locals>.Meter" in reprs and tracebacks
    return classes


def get_meter() -> metrics.Meter:
    """The OpenTelemetry meter of this process (Monarch's ``get_meter``), named ``monarch``.

    Its instruments' rows in the job's metric tables carry ``scope_name`` ``monarch``, as
    Monarch's do (regency's own metrics carry ``regency``).
    """
    global _meter
    if _meter is None:
        try:
            meter_class = _classes()["Meter"]
        except ImportError as exc:
            raise ImportError(
                f"get_meter() needs the OpenTelemetry API ({exc}): pip install 'regency[telemetry]'"
            ) from exc
        _meter = meter_class(METER_NAME)
    meter: metrics.Meter = _meter
    return meter
