"""``show``: one shard displayed with torchshow (Monarch's ``monarch.show``)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from regency._tensor.api import no_mesh
from regency._tensor.fetching import inspect

_MISSING = (
    "regency.show displays tensors with torchshow, which is not installed here: "
    "pip install torchshow (or regency[show])"
)


def show(obj: Any, shard: Mapping[str, int] | None = None, **coords: int) -> object:
    """Fetch one shard of ``obj`` (as `inspect` does) and return ``torchshow.show`` of it.

    torchshow (an optional dependency, the ``show`` extra) is looked up first, so without it
    the call raises ``ImportError`` naming the fix before anything is fetched.
    """
    try:
        torchshow = importlib.import_module("torchshow")
    except ImportError as e:
        raise ImportError(_MISSING) from e
    value = inspect(obj, shard, **coords)
    with no_mesh.activate():
        return torchshow.show(value)
