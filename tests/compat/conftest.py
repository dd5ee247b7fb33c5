"""Fixtures and markers of the compatibility suite (runs on Monarch and on regency).

Markers:

* ``deviation(reason, skip="monarch")``: Monarch is buggy here (hangs, dies, inconsistent) and
  regency deliberately does better; the scenario asserts regency's behaviour and skips on Monarch.
* ``deviation(reason, skip="regency")``: a documented, deliberate difference; the scenario asserts
  Monarch's behaviour and skips on regency.

Every deviation is listed in docs/monarch-differences.md.

Run against Monarch with ``--confcutdir=tests/compat`` so the project's own ``tests/conftest.py``
(which imports regency) is not loaded: ``make compat-monarch``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# Procs are new interpreters: they must find the scenario modules (actor classes pickle by
# reference to ``test_compat_*``) and the shim they import.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)

from compat_impl import IMPL, actor  # noqa: E402
from compat_util import Failures, root_failures, spawn_procs, stop_quietly  # noqa: E402

DEFAULT_TIMEOUT = 60  # seconds per scenario unless it says otherwise


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "deviation(reason, skip='monarch'|'regency'): documented difference from Monarch",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"compat: COMPAT_IMPL={IMPL}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in item.iter_markers("deviation"):
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
            skip_on = mark.kwargs.get("skip", "monarch")
            assert skip_on in ("monarch", "regency"), skip_on
            assert reason, f"{item.nodeid}: a deviation needs a reason"
            if skip_on == IMPL:
                item.add_marker(pytest.mark.skip(reason=f"documented deviation: {reason}"))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT))


if IMPL == "monarch":
    # Monarch's default hook exits the process; nothing else in this run installs one, and
    # failures can also land between scenarios (module fixtures' teardown).
    actor.unhandled_fault_hook = root_failures.append


@pytest.fixture(autouse=True)
def _record_compat_root_failures() -> Iterator[list[Any]]:
    """Route root failures to ``compat_util.root_failures`` during each scenario.

    Function-scoped on purpose: under ``make test`` the other suites rely on the hook that
    tests/conftest.py installs, so it is restored after every compat scenario. Its name differs
    from that session fixture's so it does not override it: with the override, the hook between
    two scenarios was the default one, and a failure landing there (a dead proc's report after
    its scenario ended) ended the whole test run.
    """
    previous = actor.unhandled_fault_hook
    actor.unhandled_fault_hook = root_failures.append
    yield root_failures
    actor.unhandled_fault_hook = previous


@pytest.fixture(scope="module")
def procs2() -> Iterator[Any]:
    """Two procs shared by the scenarios of one module (scenarios must leave them healthy)."""
    procs = spawn_procs(2)
    try:
        yield procs
    finally:
        stop_quietly(procs)


@pytest.fixture
def make_procs() -> Iterator[Callable[..., Any]]:
    """Procs private to one scenario (for ones that break them); stopped at teardown."""
    made: list[Any] = []

    def factory(gpus: int = 1, **kwargs: Any) -> Any:
        procs = spawn_procs(gpus, **kwargs)
        made.append(procs)
        return procs

    yield factory
    for procs in made:
        stop_quietly(procs)


@pytest.fixture
def failures() -> Iterator[Failures]:
    """The failures that reach the root client during this scenario."""
    return Failures()
