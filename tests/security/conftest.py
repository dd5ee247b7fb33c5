"""Security tests (issue 12): an attacker on the path, at the door, and out of descriptors.

``_attackers.OnPathProxy`` is the on-path attacker: a TCP relay between a dialer and a listener
that records every byte it forwards and can flip or inject bytes. The helpers of this folder,
``tests/faults`` and ``tests/multihost`` (raw worker daemons) are importable from here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
for folder in (_HERE, _HERE.parent / "faults", _HERE.parent / "multihost"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from regency._transport import tls  # noqa: E402


@pytest.fixture
def tls_everywhere() -> Iterator[None]:
    """TLS on loopback too (``REGENCY_TLS=all``), for attackers and workers on 127.0.0.1."""
    tls.force_enabled("all")
    try:
        yield
    finally:
        tls.force_enabled(None)


@pytest.fixture
def tls_off(tls_everywhere: None) -> Iterator[None]:
    """This process's TCP connections without TLS (the control runs of the wire tests)."""
    tls.force_enabled(False)
    try:
        yield
    finally:
        tls.force_enabled(None)
