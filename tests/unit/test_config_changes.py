"""``config.changes()`` moves on every change, so the casting tree's cached fan-out follows
``configure()``, a ``configured()`` block and its undo, and ``clear_runtime_config()``."""

from __future__ import annotations

import pytest

from regency import config
from regency._runtime.kernel import casting


@pytest.fixture(autouse=True)
def _clean() -> object:
    saved = config.get_runtime_config()
    yield
    config.clear_runtime_config()
    config.configure(**saved)


def test_every_change_moves_the_counter() -> None:
    seen = [config.changes()]
    config.configure(cast_fanout=3)
    seen.append(config.changes())
    with config.configured(stop_timeout=2):
        seen.append(config.changes())
    seen.append(config.changes())
    config.clear_runtime_config()
    seen.append(config.changes())
    assert len(set(seen)) == len(seen)


def test_a_refused_configure_changes_nothing() -> None:
    before = config.changes()
    with pytest.raises(ValueError):
        config.configure(nope=1)
    with pytest.raises(TypeError):
        config.configure(cast_fanout="many")
    assert config.changes() == before


def test_the_cached_fanout_sees_a_temporary_change_and_its_undo() -> None:
    config.configure(cast_fanout=3)
    assert casting.fanout() == 3
    with config.configured(cast_fanout=2):
        assert casting.fanout() == 2
        # Monarch's key feeds the same setting.
        config.configure(max_cast_fanout=5)
        assert casting.fanout() == 5
    assert casting.fanout() == 3
    config.clear_runtime_config()
    assert casting.fanout() == config.get("cast_fanout")
