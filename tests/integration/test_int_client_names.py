"""Public names for what client libraries read from Monarch's private modules.

``context_or_none()`` stands for ``monarch._src.actor.actor_mesh._context.get()`` (is a runtime
running here?), ``context().actor_instance.children`` for ``actor_instance._children`` (the
meshes this actor spawned, which a test clean-up stops). See ``docs/porting.md``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from regency.actor import Actor, ActorMesh, ProcMesh, context, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


class Spawner(Actor):
    """Spawns a proc mesh of its own and reports what its children are."""

    @endpoint
    def children_after_spawn(self) -> list[str]:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        return [type(child).__name__ for child in context().actor_instance.children]

    @endpoint
    def children_after_stop(self) -> list[str]:
        self.procs.stop().get(timeout=30)
        return [type(child).__name__ for child in context().actor_instance.children]


FRESH = textwrap.dedent(
    """
    from regency.actor import Actor, context_or_none, endpoint, shutdown_context, this_host

    class Probe(Actor):
        @endpoint
        def mine(self) -> str:
            ctx = context_or_none()
            return ctx.actor_instance.name if ctx is not None else "none"

    print(context_or_none())
    host = this_host()
    print(context_or_none().actor_instance.name)
    procs = host.spawn_procs(per_host={"gpus": 2})
    print(list(procs.spawn("probe", Probe).mine.call().get(timeout=60).values()))
    procs.stop().get(timeout=30)
    shutdown_context().get()
    print(context_or_none())
    """
)


def test_context_or_none_tells_whether_a_runtime_runs_without_starting_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=100, check=True
    )
    assert out.stdout.splitlines() == ["None", "root", "['probe', 'probe']", "None"]


def test_children_are_the_live_meshes_this_instance_spawned() -> None:
    me = context().actor_instance
    before = me.children
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        actors = procs.spawn("spawner", Spawner)
        new = [child for child in me.children if not any(child is b for b in before)]
        assert [type(child) for child in new] == [ProcMesh, ActorMesh]
        assert new[0] is procs
        assert new[1] is actors
        # Inside an actor, its own children.
        spawned = actors.children_after_spawn.call().get(timeout=60)
        assert list(spawned.values()) == [["ProcMesh"], ["ProcMesh"]]
        stopped = actors.children_after_stop.call().get(timeout=60)
        assert list(stopped.values()) == [[], []]
        actors.stop().get(timeout=30)
        assert [child for child in me.children if child is actors] == []
    finally:
        procs.stop().get(timeout=30)
    assert not [child for child in me.children if child is procs]
    # A copy: changing it changes nothing.
    me.children.append(procs)
    assert not [child for child in me.children if child is procs]
