"""``CoroutineFuture``: what Monarch's ``async`` mesh methods return in regency, usable as a
coroutine (``asyncio.run``, ``await``) and as a ``Future`` (``get``)."""

from __future__ import annotations

import asyncio
import collections.abc
import threading

import pytest

from regency._runtime.actors.base.future import CoroutineFuture
from regency._runtime.kernel.pending import Pending

pytestmark = pytest.mark.timeout(30)


def test_it_is_a_coroutine_for_asyncio_run() -> None:
    done = CoroutineFuture._resolved(5)
    assert isinstance(done, collections.abc.Coroutine)
    assert asyncio.run(done) == 5
    assert done.get(timeout=1) == 5


def test_asyncio_run_waits_for_an_outcome_set_by_another_thread() -> None:
    pending = Pending()
    future = CoroutineFuture._from_pending(pending)
    timer = threading.Timer(0.05, pending.set_result, ("late",))
    timer.start()
    try:
        assert asyncio.run(future) == "late"
    finally:
        timer.cancel()


def test_await_and_get_see_the_same_failure() -> None:
    failed = CoroutineFuture._failed(NotImplementedError("not here"))

    async def awaited() -> None:
        await failed

    with pytest.raises(NotImplementedError, match="not here"):
        asyncio.run(awaited())
    with pytest.raises(NotImplementedError, match="not here"):
        failed.get(timeout=1)
    with pytest.raises(NotImplementedError, match="not here"):
        asyncio.run(CoroutineFuture._failed(NotImplementedError("not here")))


def test_a_cancelled_task_leaves_the_outcome_for_get() -> None:
    pending = Pending()
    future = CoroutineFuture._from_pending(pending)

    async def cancel_it() -> None:
        task = asyncio.ensure_future(future)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    pending.set_result(3)
    assert future.get(timeout=1) == 3
