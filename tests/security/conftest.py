"""Security tests: helpers importable whatever pytest's import mode, and shared fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for folder in (_HERE, _HERE.parent / "faults", _HERE.parent / "multihost"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
