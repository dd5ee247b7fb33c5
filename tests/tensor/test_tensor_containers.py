"""Remote functions' containers round-trip with their types: named tuples, tuples, lists and
dicts of mesh tensors, through every kind of propagation, ``inspect``, ``fetch_shard`` and
``.call``."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

import regency
from regency.actor import ProcMesh

pytestmark = pytest.mark.timeout(120)


class Pair(NamedTuple):
    """A named tuple of tensors, as a remote function's result."""

    low: torch.Tensor
    high: torch.Tensor


def split_pair(t: torch.Tensor) -> Pair:
    return Pair(t - 1, t + 1)


def pair_propagate(t: torch.Tensor) -> Pair:
    return Pair(torch.empty_like(t), torch.empty_like(t))


def all_kinds(
    t: torch.Tensor,
) -> tuple[Pair, tuple[torch.Tensor, int], list[torch.Tensor], dict[str, torch.Tensor]]:
    return Pair(t - 1, t + 1), (t * 2, 5), [t * 3], {"d": t * 4}


def sum_pair(p: Pair) -> torch.Tensor:
    assert isinstance(p, Pair), type(p)
    return p.low + p.high


def _check_pair(got: object, base: float) -> None:
    assert isinstance(got, Pair)
    torch.testing.assert_close(got.low, torch.full((3,), base - 1))
    torch.testing.assert_close(got.high, torch.full((3,), base + 1))


@pytest.mark.parametrize("propagate", [pair_propagate, None], ids=["callable", "cached"])
def test_named_tuple_result_keeps_its_type(procs: ProcMesh, propagate: object) -> None:
    fn = regency.remote(split_pair, propagate=propagate)  # type: ignore[call-overload]
    with procs.activate():
        got = fn(torch.ones(3) * (procs.rank_tensor("gpus") + 1))
    assert isinstance(got, Pair)
    assert isinstance(got.low, regency.Tensor)
    _check_pair(regency.inspect(got, gpus=0), 1.0)
    _check_pair(regency.fetch_shard(got, gpus=1).result(timeout=60), 2.0)


def test_named_tuple_argument_arrives_as_a_named_tuple(procs: ProcMesh) -> None:
    fn = regency.remote(sum_pair, propagate=lambda p: p.low)
    with procs.activate():
        t = torch.ones(3)
        s = fn(Pair(t, t * 2))
    torch.testing.assert_close(regency.inspect(s, gpus=1), torch.full((3,), 3.0))


def test_every_container_round_trips(procs: ProcMesh) -> None:
    with procs.activate():
        pair, plain, listed, mapped = regency.remote(all_kinds)(torch.ones(3))
    assert isinstance(pair, Pair)
    assert type(plain) is tuple
    assert plain[1] == 5
    assert type(listed) is list
    assert type(mapped) is dict
    got = regency.inspect((pair, plain, listed, mapped), gpus=1)
    _check_pair(got[0], 1.0)
    torch.testing.assert_close(got[1][0], torch.full((3,), 2.0))
    assert got[1][1] == 5
    torch.testing.assert_close(got[2][0], torch.full((3,), 3.0))
    torch.testing.assert_close(got[3]["d"], torch.full((3,), 4.0))


def test_call_returns_named_tuples(procs: ProcMesh) -> None:
    with procs.activate():
        values = regency.remote(split_pair, propagate="inspect").call(torch.ones(3)).get()
    for _, got in values.items():
        _check_pair(got, 1.0)
