"""A buffer's NIC registration rides on its registry entry and is closed by the drop itself."""

from __future__ import annotations

import pytest

from regency.rdma._memory import region_of
from regency.rdma._registry import Registry

pytestmark = pytest.mark.timeout(60)


class Resource:
    """Something closeable, like the owner's memory registration with the NIC."""

    def __init__(self, fail: bool = False) -> None:
        self.closed = 0
        self.fail = fail

    def close(self) -> None:
        self.closed += 1
        if self.fail:
            raise OSError("deregistration failed")


def test_the_first_attachment_wins_and_the_drop_closes_it() -> None:
    reg = Registry()
    entry = reg.register(region_of(bytearray(4096)), "<root>")
    first, second = Resource(), Resource()
    assert reg.attach(entry.buffer_id, entry.token, "ibverbs", first) is first
    assert (
        reg.attach(entry.buffer_id, entry.token, "ibverbs", second) is first
    )  # caller closes its own
    assert reg.attach(entry.buffer_id, entry.token + 2, "ibverbs", second) is None  # wrong token
    assert first.closed == 0
    assert reg.drop(entry.buffer_id, entry.token) is True
    assert first.closed == 1  # before drop() returned
    assert reg.attach(entry.buffer_id, entry.token, "ibverbs", second) is None  # dropped
    assert reg.drop(entry.buffer_id, entry.token) is False
    assert (first.closed, second.closed) == (1, 0)


def test_a_failing_close_is_raised_after_the_others_closed() -> None:
    reg = Registry()
    entry = reg.register(region_of(bytearray(64)), "<root>")
    bad, good = Resource(fail=True), Resource()
    reg.attach(entry.buffer_id, entry.token, "a", bad)
    reg.attach(entry.buffer_id, entry.token, "b", good)
    with pytest.raises(OSError, match="deregistration failed"):
        reg.drop(entry.buffer_id, entry.token)
    assert (bad.closed, good.closed) == (1, 1)
    assert reg.lookup(entry.buffer_id, entry.token) is None  # dropped all the same
