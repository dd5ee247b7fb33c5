"""Log forwarding: procs' stdout, stderr and ``logging`` records reach the controller, prefixed.

Procs on this machine are forwarded here because the tests turn ``enable_log_forwarding`` on
(procs on other hosts are forwarded by default: ``tests/multihost/test_log_forwarding_hosts.py``).
The sink prints through ``sys.stdout``/``sys.stderr`` at the moment each line arrives, so pytest's
``capsys`` sees exactly what a user's terminal would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from regency import config
from regency.actor import Actor, ProcMesh, SupervisionError, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


class Talker(Actor):
    """Writes to stdout, stderr and the logging system on request."""

    @endpoint
    def count(self, n: int) -> None:
        for i in range(n):
            print(f"line {i} of {n}")

    @endpoint
    def both(self, text: str) -> None:
        print(f"out: {text}")
        print(f"err: {text}", file=sys.stderr)
        logging.getLogger("talker").warning("logged: %s", text)

    @endpoint
    def last_words_then_sigkill(self) -> None:
        print("last words before the kill")
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    def log_file(self) -> str:
        return os.environ.get("REGENCY_PROC_LOG", "")


@pytest.fixture
def forwarded() -> Iterator[ProcMesh]:
    with config.configured(enable_log_forwarding=True):
        procs = this_host().spawn_procs(per_host={"gpus": 3}, name="talkers")
    try:
        yield procs
    finally:
        procs.stop().get(timeout=30)


def _prefixed(text: str, mesh: str = "talkers") -> list[tuple[int, str]]:
    """``(rank, line)`` of every forwarded line of ``text``."""
    found = []
    for raw in text.splitlines():
        match = re.fullmatch(rf"\[{mesh} gpus=(\d+) \S+\] (.*)", raw)
        if match:
            found.append((int(match.group(1)), match.group(2)))
    return found


def test_prints_arrive_in_order_with_their_rank_and_stop_flushes_them(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    talkers = forwarded.spawn("t", Talker)
    talkers.count.call(50).get(timeout=30)
    forwarded.stop().get(timeout=30)  # every line is printed by the time stop() returns
    lines = _prefixed(capsys.readouterr().out)
    for rank in range(3):
        assert [text for r, text in lines if r == rank] == [f"line {i} of 50" for i in range(50)]


def test_stderr_and_log_records_go_to_stderr_with_the_actor(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    talkers = forwarded.spawn("t", Talker)
    talkers.slice(gpus=1).both.call_one("hi").get(timeout=30)
    forwarded.stop().get(timeout=30)
    captured = capsys.readouterr()
    assert _prefixed(captured.out) == [(1, "out: hi")]
    err = _prefixed(captured.err)
    assert (1, "err: hi") in err
    (record,) = [text for _, text in err if "logged" in text]
    actor = "<root>.<test_int_log_forwarding.Talker t{'gpus': 1/3}>"
    assert record == f"[actor={actor}] WARNING talker: logged: hi"


def test_the_last_line_before_a_sigkill_is_shown(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    talkers = forwarded.spawn("t", Talker)
    talkers.slice(gpus=2).last_words_then_sigkill.broadcast()
    # The call fails once the proc is known dead, which its host agent reports only after it
    # read the proc's pipes to the end.
    with pytest.raises(SupervisionError) as failure:
        talkers.slice(gpus=2).log_file.call_one().get(timeout=30)
    assert (2, "last words before the kill") in _prefixed(capsys.readouterr().out)
    # The failure names the file that kept the proc's output.
    found = re.search(r"its output is in (\S+\.log) on ", str(failure.value))
    assert found, str(failure.value)
    assert "last words before the kill" in Path(found.group(1)).read_text()


def test_aggregation_prints_similar_lines_once(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    forwarded.logging_option(stream_to_client=True, aggregate_window_sec=30).get(timeout=30)
    talkers = forwarded.spawn("t", Talker)
    talkers.both.call("same").get(timeout=30)
    forwarded.stop().get(timeout=30)  # ends the window early
    out = capsys.readouterr().out
    assert ">>> aggregated logs of talkers" in out
    assert re.search(r"^\[3 similar log lines\] \[talkers gpus=\d \S+\] out: same$", out, re.M)
    assert len(re.findall("out: same", out)) == 1


def test_without_a_window_every_line_streams(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    forwarded.logging_option(stream_to_client=True, aggregate_window_sec=None).get(timeout=30)
    forwarded.spawn("t", Talker).both.call("each").get(timeout=30)
    forwarded.stop().get(timeout=30)
    assert sorted(_prefixed(capsys.readouterr().out)) == [(r, "out: each") for r in range(3)]


def test_not_streamed_lines_are_still_in_the_log_files(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    forwarded.logging_option(stream_to_client=False).get(timeout=30)
    talkers = forwarded.spawn("t", Talker)
    path = Path(talkers.slice(gpus=0).log_file.call_one().get(timeout=30))
    talkers.slice(gpus=0).both.call_one("quiet").get(timeout=30)
    forwarded.stop().get(timeout=30)
    assert "quiet" not in capsys.readouterr().out
    assert path.parent.parent.parent.name == f"regency-{os.geteuid()}"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "out: quiet" in text
    assert "err: quiet" in text


def test_logging_option_runs_under_asyncio_run_as_in_monarch(
    forwarded: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    # Monarch's logging_option is a coroutine: programs hand it to asyncio.run.
    assert asyncio.run(forwarded.logging_option(stream_to_client=False)) is None
    forwarded.spawn("t", Talker).both.call("unseen").get(timeout=30)
    forwarded.stop().get(timeout=30)
    assert "unseen" not in capsys.readouterr().out


def test_logging_option_rejects_bad_values(forwarded: ProcMesh) -> None:
    with pytest.raises(ValueError, match="Invalid logging level"):
        forwarded.logging_option(level=300)
    with pytest.raises(ValueError, match="needs stream_to_client=True"):
        forwarded.logging_option(stream_to_client=False, aggregate_window_sec=3)
    with pytest.raises(ValueError, match="> 0 seconds"):
        forwarded.logging_option(stream_to_client=True, aggregate_window_sec=0)


def test_local_procs_are_not_forwarded_unless_asked(capfd: pytest.CaptureFixture[str]) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="plain")
    try:
        procs.spawn("t", Talker).both.call_one("inherited").get(timeout=30)
    finally:
        procs.stop().get(timeout=30)
    out = capfd.readouterr().out
    assert "out: inherited" in out
    assert "[plain " not in out


def test_an_untrusted_log_directory_means_no_forwarding_not_a_lost_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from regency import _private_paths

    planted = tmp_path / f"regency-{os.geteuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # as another user could leave it: not private, so not trusted
    monkeypatch.setattr(_private_paths.tempfile, "gettempdir", lambda: str(tmp_path))
    with config.configured(enable_log_forwarding=True):
        procs = this_host().spawn_procs(per_host={"gpus": 1}, name="unforwarded")
    try:
        assert procs.spawn("t", Talker).log_file.call_one().get(timeout=30) == ""
    finally:
        procs.stop().get(timeout=30)
    assert "not forwarding the output of" in caplog.text
    assert not any(planted.iterdir())
