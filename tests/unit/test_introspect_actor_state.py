"""The state the tree (``/v1/tree``, the dashboard, the snapshot tables) gives an actor.

From the proc's own report when it has one, else from what its owner's supervisor knows.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from regency._runtime.actors.base.errors import stopped_text
from regency._runtime.actors.meshes.introspect import _actor_node
from regency.shape import Extent

PROC = "tcp://10.0.0.1:7000/job-w-aaaa"
LIVE = {"state": "running", "failure": None, "messages_handled": 2, "mailbox_depth": 0}


def _supervisor(bad: dict[int, str] | None = None, stopping: bool = False) -> Any:
    return SimpleNamespace(
        bad=bad or {},
        stopping=stopping,
        mesh_id=0xAB,
        generation=0,
        name="w",
        class_name="m.W",
        extent=Extent(["gpus"], [1]),
        restarts=0,
        actor_name=lambda rank: f"<root>.<m.W w{{'gpus': {rank}/1}}>",
    )


@pytest.mark.parametrize(
    ("live", "proc_state", "stopping", "state"),
    [
        (LIVE, "running", False, "running"),
        (None, "running", False, "starting"),  # its proc has not taken the spawn yet
        (None, "unknown", False, "unknown"),
        (None, "stopped", False, "stopped"),
        (LIVE, "running", True, "stopped"),  # its owner stopped the mesh
    ],
)
def test_an_actors_state(live: Any, proc_state: str, stopping: bool, state: str) -> None:
    node = _actor_node(_supervisor(stopping=stopping), 0, 0, live, proc_state, PROC)
    assert node["state"] == state
    assert node["full_name"] == f"{PROC},w-00000000000000ab[0]"


def test_a_mesh_its_owner_stopped_is_stopped_not_failed_by_its_latched_text() -> None:
    latched = stopped_text("<root>.<m.W w{'gpus': 0/1}>", "stopped by client", "w is stopped")
    node = _actor_node(_supervisor({0: latched}, stopping=True), 0, 0, None, "running", PROC)
    assert (node["state"], node["failure"]) == ("stopped", None)
