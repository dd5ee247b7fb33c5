"""RestartBudget: OTP's restart intensity (max restarts within a period) and the backoff."""

from __future__ import annotations

import pytest

from regency._runtime.actors.supervision.supervision import RestartBudget, RestartPolicy

pytestmark = pytest.mark.timeout(30)


def test_more_than_max_restarts_within_the_window_is_refused() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=3, within_s=60.0))
    assert [budget.admit(t) for t in (0.0, 1.0, 2.0)] == [0.0, 0.0, 0.0]
    assert budget.admit(3.0) is None
    assert budget.admit(59.9) is None  # a refusal is not counted, the first is still in
    # Restarts leave the window ``within_s`` after they happened (at 60.0 the first is out).
    assert budget.admit(60.0) == 0.0
    assert budget.admit(60.5) is None
    assert budget.admit(61.0) == 0.0
    assert "3 restarts within 60 s" in budget.exceeded_text()


def test_no_restarts_allowed() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=0))
    assert budget.admit(0.0) is None
    assert budget.admit(1000.0) is None


def test_backoff_doubles_per_restart_in_the_window_up_to_its_cap() -> None:
    policy = RestartPolicy(max_restarts=10, within_s=100.0, backoff_s=0.5, max_backoff_s=3.0)
    budget = RestartBudget(policy)
    assert [budget.admit(float(t)) for t in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    # Once the old restarts leave the window the streak, and so the delay, starts again.
    assert budget.admit(1000.0) == 0.5


def test_a_quiet_period_resets_the_count() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=2, within_s=10.0))
    for start in (0.0, 100.0, 200.0):
        assert budget.admit(start) is not None
        assert budget.admit(start + 1) is not None
        assert budget.admit(start + 2) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"strategy": "rest_for_one"},
        {"max_restarts": -1},
        {"max_restarts": 1.5},
        {"within_s": -1.0},
        {"backoff_s": float("nan")},
    ],
)
def test_invalid_policies_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="RestartPolicy"):
        RestartPolicy(**bad)  # type: ignore[arg-type]
