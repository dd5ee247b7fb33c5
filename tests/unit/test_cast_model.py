"""The cast model's arithmetic (``benchmarks/cast_model.py``): trees and critical paths of
known shape. No benchmark runs here: the model is pure arithmetic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cast_model import ROOT, Costs, Shape, build_tree, depth, plan, simulate

pytestmark = pytest.mark.timeout(30)

# Distinct powers of ten so that each sum names the costs it is made of.
COSTS = Costs(
    prepare=1e-6,
    send=10e-6,
    recv=100e-6,
    forward=1e-3,
    deliver=10e-3,
    merge=0.0,
    assemble=0.0,
    ack=0.0,
    tls=0.0,
    route=0.0,
    link_local=0.0,
    link_tls=100e-3,
)


def test_plan_splits_like_the_runtime() -> None:
    assert plan(list(range(5)), 2) == [(0, [1, 2]), (3, [4])]
    assert plan(list(range(3)), 16) == [(0, []), (1, []), (2, [])]


def test_tree_of_17_with_fanout_16_has_one_head_and_depth_2() -> None:
    children = build_tree(17, 16)
    assert children[ROOT] == [0, *range(2, 17)]
    assert children[0] == [1]
    assert depth(children) == 2
    assert depth(build_tree(16, 16)) == 1
    assert depth(build_tree(8192, 16)) == 4


def test_flat_cast_critical_path_is_the_last_send_then_one_hop() -> None:
    # Two hosts, one proc each, fan-out 16: the controller sends two frames one after the other.
    out = simulate(Shape(hosts=2, per_host=1), COSTS)
    expected = 1e-6 + 2 * 10e-6 + 100e-3 + 100e-6 + 10e-3
    assert out.delivered == pytest.approx(expected)
    assert out.depth == 1
    assert out.controller_frames == 2
    # The gather: host 0's reply (sent one frame earlier) crosses back first; the controller
    # receives it (recv) and host 1's, queued behind it, then (recv).
    first_back = 1e-6 + 10e-6 + 100e-3 + 100e-6 + 10e-3 + 10e-6 + 100e-3
    assert out.gathered == pytest.approx(first_back + 2 * 100e-6)
    # The controller's CPU: prepare, two frames out, two replies in.
    assert out.controller_cpu == pytest.approx(1e-6 + 2 * 10e-6 + 2 * 100e-6)


def test_relayed_cast_pays_forward_at_the_head() -> None:
    # Three hosts, fan-out 2: the controller sends to 0 (with 1 attached) and to 2; head 0
    # receives, forwards to 1 (send + forward), then delivers; 1 receives and delivers.
    out = simulate(Shape(hosts=3, per_host=1, fanout=2), COSTS)
    head_out = 1e-6 + 10e-6 + 100e-3 + 100e-6 + 10e-6 + 1e-3
    assert out.delivered == pytest.approx(head_out + 100e-3 + 100e-6 + 10e-3)
    assert out.depth == 2
    assert out.controller_frames == 2


def test_shared_cores_serialise_what_a_cluster_runs_in_parallel() -> None:
    shape = {"hosts": 8, "per_host": 1, "fanout": 2}
    cluster = simulate(Shape(**shape), COSTS)  # type: ignore[arg-type]
    one_core = simulate(Shape(**shape, mode="machine", cores=1), COSTS)  # type: ignore[arg-type]
    # One core runs the 8 deliveries one after the other: at least 8 x deliver.
    assert one_core.delivered >= 8 * 10e-3
    assert cluster.delivered < one_core.delivered


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": 0, "per_host": 1}, "needs >= 1 host"),
        ({"hosts": 1, "per_host": 1, "fanout": 1}, "fan-out must be >= 2"),
        ({"hosts": 1, "per_host": 1, "mode": "rack"}, "mode is 'cluster' or 'machine'"),
    ],
)
def test_bad_shapes_are_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Shape(**kwargs)  # type: ignore[arg-type]


def test_a_frame_between_hosts_costs_tls_at_both_ends_and_none_within_a_host() -> None:
    costs = Costs(**{**COSTS.__dict__, "tls": 1.0})
    # The controller is a machine of its own: its frame to the host and the reply cross.
    across = simulate(Shape(hosts=1, per_host=1), costs)
    plain = simulate(Shape(hosts=1, per_host=1), COSTS)
    assert across.delivered - plain.delivered == pytest.approx(2.0)  # sent, then received
    assert across.gathered - plain.gathered == pytest.approx(4.0)  # and the reply's two ends


def test_frames_pay_per_destination_they_carry_and_replies_per_value() -> None:
    # Fan-out 2 over 5 procs: the controller's frames carry 3 and 2 destinations; the replies
    # coming back carry 3 and 2 values. route and assemble are charged per destination/value.
    costs = Costs(**{**COSTS.__dict__, "route": 1.0, "assemble": 10.0})
    plain = simulate(Shape(hosts=5, per_host=1, fanout=2), COSTS)
    out = simulate(Shape(hosts=5, per_host=1, fanout=2), costs)
    assert out.controller_cpu - plain.controller_cpu == pytest.approx(5 * 1.0 + 5 * 10.0)
