"""Monarch's ``monarch.builtins.log`` path: see :mod:`regency.tensor.builtins.log`.

Every other name (``logger``) is looked up there on each access (PEP 562), so this module
never holds a second reference that could go stale: a test that patches ``logger`` here and
deletes the patch afterwards sees the one logger again.
"""

from __future__ import annotations

from typing import Any

from regency.tensor.builtins import log as _log
from regency.tensor.builtins.log import log_remote, set_logging_level_remote

__all__ = ["log_remote", "set_logging_level_remote"]


def __getattr__(name: str) -> Any:
    return getattr(_log, name)
