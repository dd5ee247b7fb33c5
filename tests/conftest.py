"""Suite-wide setup: failures that reach the test process's root are recorded, not fatal.

Regency's default ``unhandled_fault_hook`` ends the controller with exit code 1, which in the
pytest process would end the test run. Tests that check the default run their own controller
in a subprocess; the others can look at ``root_failures``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import regency.actor
from regency.actor import MeshFailure

root_failures: list[MeshFailure] = []


@pytest.fixture(autouse=True, scope="session")
def _record_root_failures() -> Iterator[list[MeshFailure]]:
    previous = regency.actor.unhandled_fault_hook
    regency.actor.unhandled_fault_hook = root_failures.append
    yield root_failures
    regency.actor.unhandled_fault_hook = previous
