"""Messages over the frame size limit fail at the call site with a clear error; nothing breaks.

The limit is set with ``regency.config.configure(max_frame_bytes=...)`` before the controller
starts, so it applies to the controller and, inherited, to every proc. The controller runs in a
subprocess so the small limit does not leak into other tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _fault_helpers import Controller, kill_all, wait_gone, write_script

pytestmark = pytest.mark.timeout(60)

LIMIT = 1 << 20

SCRIPT = f"""
import numpy as np
from regency import config

LIMIT = {LIMIT}
config.configure(max_frame_bytes=LIMIT)

from regency.actor import Actor, endpoint, shutdown_context, this_host


class Echo(Actor):
    @endpoint
    def echo(self, value):
        return value

    @endpoint
    def big(self, n: int) -> bytes:
        return b"x" * n

    @endpoint
    def limit(self) -> int:
        return config.get("max_frame_bytes")

    @endpoint
    def length(self, value) -> int:
        return len(value)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def attempt(make):
    stage = "call"
    try:
        future = make()
        stage = "get"
        value = future.get(timeout=5)
    except Exception as exc:
        return {{"stage": stage, "error": type(exc).__name__,
                "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}}
    if hasattr(value, "values"):
        value = sorted(value.values())
    return {{"stage": "done", "value": value if not isinstance(value, bytes) else len(value)}}


def mesh(name, n):
    procs = this_host().spawn_procs(per_host={{"gpus": n}}, name=name)
    return procs.spawn(name, Echo)


one, many, replies = mesh("one", 1), mesh("many", 2), mesh("replies", 1)
with config.configured(cast_fanout=2):
    # Sends to all three go down a casting tree (a view reads the fan-out on its first send).
    tree = mesh("tree", 3)
    tree_pids = tree.pid.call().get(timeout=30)
pids = list(tree_pids.values())
for m in (one, many, replies):
    pids.extend(m.pid.call().get(timeout=30).values())
emit("PIDS", pids)

result = {{}}
result["limits"] = sorted(
    v for m in (one, many, replies) for v in m.limit.call().get(timeout=30).values()
)
result["call_one"] = attempt(lambda: one.echo.call_one(b"x" * (2 * LIMIT)))
result["call_one_after"] = attempt(lambda: one.echo.call_one("still here"))
result["call"] = attempt(lambda: many.echo.call(np.zeros(2 * LIMIT, dtype=np.uint8)))
result["call_after"] = attempt(lambda: many.echo.call("still here"))
result["just_under"] = attempt(lambda: replies.echo.call_one(b"x" * (LIMIT - 4096)))
result["reply"] = attempt(lambda: replies.big.call_one(2 * LIMIT))
result["reply_after"] = attempt(lambda: replies.echo.call_one("still here"))
# Down a casting tree a frame also carries its subtree's routing: messages a little under the
# limit, either refused at the call site or sent, and the mesh answering after each.
sweep = result["tree_sweep"] = []
for size in range(LIMIT - 4096, LIMIT, 64):
    outcome = attempt(lambda: tree.length.call(np.zeros(size, dtype=np.uint8)))
    after = attempt(lambda: tree.echo.call("still here"))
    sweep.append((size, outcome["stage"], outcome.get("error"), after))
    if after["stage"] != "done":
        break
emit("RESULT", result)
shutdown_context()
"""


@pytest.fixture(scope="module")
def oversize(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], str]]:
    controller = Controller(write_script(tmp_path_factory.mktemp("oversize"), SCRIPT))
    pids: list[int] = []
    try:
        pids.extend(controller.expect("PIDS", 60))
        result = controller.expect("RESULT", 60)
        assert controller.wait(30) == 0, controller.describe()
        assert not wait_gone(pids, 10)
        yield result, controller.describe()
    finally:
        controller.close()
        kill_all(pids)


def _too_large_at_call_site(outcome: dict[str, Any], context: str) -> None:
    assert outcome["stage"] == "call", (
        f"expected the call itself to raise, got {outcome}\n{context}"
    )
    assert outcome["error"].startswith("FrameTooLarge")
    assert "ValueError" in outcome["mro"]
    assert str(LIMIT) in outcome["message"], f"the error does not name the limit: {outcome}"
    assert "max_frame_bytes" in outcome["message"]


def test_procs_inherit_the_limit(oversize: tuple[dict[str, Any], str]) -> None:
    result, _ = oversize
    assert result["limits"] == [LIMIT] * 4


def test_cast_just_under_the_limit_is_sent_or_refused_at_the_call_site(
    oversize: tuple[dict[str, Any], str],
) -> None:
    result, context = oversize
    sweep = result["tree_sweep"]
    stages = {stage for _, stage, _, _ in sweep}
    assert stages == {"done", "call"}, f"the sweep should cross the limit: {sweep}\n{context}"
    refused = [error for _, stage, error, _ in sweep if stage == "call"]
    assert set(refused) == {"FrameTooLargeError"}, sweep
    for size, _, _, after in sweep:
        assert after == {"stage": "done", "value": ["still here"] * 3}, (
            f"after a cast of {size} bytes, the next call to the mesh gave {after}\n{context}"
        )


def test_oversize_call_one_raises_at_the_call_site(oversize: tuple[dict[str, Any], str]) -> None:
    result, context = oversize
    _too_large_at_call_site(result["call_one"], context)


def test_oversize_call_with_out_of_band_array_raises_at_the_call_site(
    oversize: tuple[dict[str, Any], str],
) -> None:
    result, context = oversize
    _too_large_at_call_site(result["call"], context)


def test_message_just_under_the_limit_goes_through(oversize: tuple[dict[str, Any], str]) -> None:
    result, context = oversize
    assert result["just_under"] == {"stage": "done", "value": LIMIT - 4096}, context


def test_oversize_reply_fails_the_call_with_an_actor_error(
    oversize: tuple[dict[str, Any], str],
) -> None:
    result, context = oversize
    reply = result["reply"]
    assert reply["stage"] == "get", f"{reply}\n{context}"
    assert reply["error"] == "ActorError"
    assert str(LIMIT) in reply["message"], f"the error does not name the limit: {reply}"
    assert result["reply_after"] == {"stage": "done", "value": "still here"}, context


@pytest.mark.parametrize("adverb", ["call_one", "call"])
def test_actor_still_answers_after_an_oversize_send(
    oversize: tuple[dict[str, Any], str], adverb: str
) -> None:
    result, context = oversize
    expected: Any = "still here" if adverb == "call_one" else ["still here"] * 2
    after = result[f"{adverb}_after"]
    assert after == {"stage": "done", "value": expected}, (
        f"after a {adverb} that failed with FrameTooLarge, the next call to the same actor "
        f"gave {after}\n{context}"
    )
