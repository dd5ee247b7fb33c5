"""Mailboxes restore each sender's order and keep what arrives before the actor (issue 16)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from regency._runtime.kernel.mailbox import Mailbox

pytestmark = pytest.mark.timeout(30)


def _attached() -> tuple[Mailbox, list[Any]]:
    box = Mailbox()
    got: list[Any] = []
    box.attach(got.append)
    return box, got


def test_out_of_order_messages_wait_for_the_gap() -> None:
    box, got = _attached()
    box.post(1, 3, "c")
    box.post(1, 2, "b")
    assert got == []
    box.post(1, 1, "a")
    assert got == ["a", "b", "c"]
    box.post(1, 4, "d")
    assert got == ["a", "b", "c", "d"]


def test_senders_are_ordered_independently() -> None:
    box, got = _attached()
    box.post(1, 2, "1b")
    box.post(2, 1, "2a")  # another sender's first message is not held behind sender 1's gap
    box.post(1, 1, "1a")
    assert got == ["2a", "1a", "1b"]


def test_unordered_and_duplicate_messages() -> None:
    box, got = _attached()
    box.post(1, 0, "any")
    box.post(1, 1, "a")
    box.post(1, 1, "a again")  # an old sequence number is dropped
    assert got == ["any", "a"]


def test_messages_before_the_actor_wait_in_order() -> None:
    box = Mailbox()
    box.post(1, 2, "b")
    box.post(1, 1, "a")
    got: list[Any] = []
    box.attach(got.append)
    assert got == ["a", "b"]
    box.post(1, 3, "c")
    assert box.detach() == []
    box.post(1, 4, "d")
    assert got == ["a", "b", "c"]
    assert box.detach() == ["d"]


@pytest.mark.parametrize("seed", range(20))
def test_any_interleaving_comes_out_in_each_senders_order(seed: int) -> None:
    rng = random.Random(seed)
    posts = [(s, q) for s in (1, 2, 3) for q in range(1, 41)]
    rng.shuffle(posts)
    box, got = _attached()
    for sender, seq in posts:
        box.post(sender, seq, (sender, seq))
    assert len(got) == len(posts)
    for sender in (1, 2, 3):
        assert [q for s, q in got if s == sender] == list(range(1, 41))
