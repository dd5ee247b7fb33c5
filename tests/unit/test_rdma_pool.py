"""The rdma connection pool's lease: back to the pool after an exchange, closed after a failure."""

from __future__ import annotations

import pytest

from regency.rdma._pool import ConnectionPool


class _Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_finished_exchange_gives_the_connection_back() -> None:
    pool: ConnectionPool[_Conn] = ConnectionPool()
    with pool.lease("t", lambda: _Conn("a")) as first:
        pass
    with pool.lease("t", lambda: _Conn("b")) as second:
        assert second is first
    assert not first.closed


def test_a_failed_exchange_closes_the_connection() -> None:
    pool: ConnectionPool[_Conn] = ConnectionPool()
    with pytest.raises(OSError), pool.lease("t", lambda: _Conn("a")) as conn:
        raise OSError("half done")
    assert conn.closed
    with pool.lease("t", lambda: _Conn("b")) as fresh:
        assert fresh.name == "b"


def test_an_idle_connection_that_is_not_usable_is_closed_and_skipped() -> None:
    pool: ConnectionPool[_Conn] = ConnectionPool()
    stale, good = _Conn("stale"), _Conn("good")
    pool.give("t", good)
    pool.give("t", stale)
    with pool.lease("t", lambda: _Conn("new"), lambda c: c is not stale) as conn:
        assert conn is good
    assert stale.closed
    dialed = pool.take("u", lambda: _Conn("new"), lambda c: False)
    assert dialed.name == "new"  # a new connection is not checked
