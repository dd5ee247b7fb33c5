"""Logging on the workers from the controller: ``log_remote`` and ``set_logging_level_remote``
(``regency.tensor.builtins.log``, also at Monarch's path ``regency.builtins.log``)."""

from __future__ import annotations

import logging
import os

import pytest

from regency.actor import ProcMesh
from regency.builtins.log import log_remote as log_remote_monarch_path
from regency.tensor import remote
from regency.tensor.builtins.log import log_remote, logger, set_logging_level_remote

pytestmark = pytest.mark.timeout(120)


class _Recorder(logging.Handler):
    """Keeps what the builtins' logger emits on a worker."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.levelname, record.getMessage()))


_recorder = _Recorder()


@remote(propagate="inspect")
def _record() -> None:
    logger.addHandler(_recorder)
    _recorder.seen.clear()


@remote
def _seen() -> tuple[int, list[tuple[str, str]]]:
    return int(os.environ["RANK"]), list(_recorder.seen)


def test_log_remote_logs_on_every_worker_at_its_level(procs: ProcMesh) -> None:
    with procs.activate():
        _record()
        set_logging_level_remote(logging.WARNING)
        log_remote("default %s and %d", "str", 42)
        log_remote("info dropped", level=logging.INFO)
        set_logging_level_remote(logging.DEBUG)
        log_remote_monarch_path("debug kept", level=logging.DEBUG)
        set_logging_level_remote(logging.ERROR)
        log_remote("warning dropped")
        log_remote("error kept", level=logging.ERROR)
        seen = sorted(_seen.call().get().values())
    expected = [("WARNING", "default str and 42"), ("DEBUG", "debug kept"), ("ERROR", "error kept")]
    assert [rank for rank, _ in seen] == [0, 1]
    for _, records in seen:
        # the message as logged (regency's actor context may precede it)
        assert [(level, text.rsplit("] ", 1)[-1]) for level, text in records] == expected
    assert logger.level == logging.NOTSET  # the controller's own logger is untouched


def test_log_remote_needs_an_active_mesh() -> None:
    with pytest.raises((TypeError, RuntimeError), match=r"activate\(\)"):
        log_remote("nowhere")
