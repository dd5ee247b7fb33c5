"""The mesh-admin HTTP API (``regency.observe.start_admin``): the live tree, one node, stacks."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from regency.actor import Actor, ProcMesh, RestartPolicy, endpoint
from regency.observe import AdminServer, admin_token, start_admin

pytestmark = pytest.mark.timeout(120)


class Worker(Actor):
    """Answers its pid; ``explode`` raises without a reply path, which fails the actor."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def explode(self) -> None:
        raise RuntimeError("worker exploded on purpose")


@pytest.fixture
def admin() -> Iterator[AdminServer]:
    server = start_admin()
    yield server
    server.stop()


def _get(admin: AdminServer, path: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(admin.url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _actors(tree: dict[str, Any], mesh: str) -> dict[int, dict[str, Any]]:
    return {
        actor["rank"]: actor
        for host in tree["hosts"]
        for proc in host["procs"]
        for actor in proc["actors"]
        if actor["actor_mesh"] == mesh
    }


def test_no_token_or_a_wrong_one_is_401(admin: AdminServer) -> None:
    assert admin.url.startswith("http://127.0.0.1:")
    status, body = _get(admin, "/v1/tree")
    assert status == 401
    assert "bearer token" in body["error"]
    assert _get(admin, "/v1/tree", token="0" * 64)[0] == 401
    assert _get(admin, "/v1/root", token=admin.token)[0] == 200


def test_a_non_loopback_address_needs_allow_remote() -> None:
    with pytest.raises(ValueError, match="allow_remote=True"):
        start_admin("0.0.0.0:0")
    with pytest.raises(ValueError, match="HOST:PORT"):
        start_admin("localhost")


def test_tree_shows_running_failed_and_restarted_actors_with_counts(
    admin: AdminServer, make_procs: Callable[..., ProcMesh]
) -> None:
    procs = make_procs(2)
    steady = procs.spawn("steady", Worker)
    for _ in range(3):
        steady.pid.call().get(timeout=30)
    steady.slice(gpus=1).explode.broadcast()
    restarted = make_procs(1).spawn(
        "restarted", Worker, restart=RestartPolicy(strategy="one_for_one", max_restarts=3)
    )
    old_pid = restarted.slice(gpus=0).pid.call_one().get(timeout=30)
    os.kill(old_pid, signal.SIGKILL)
    restarted.restarted(1).get(timeout=30)

    status, tree = _get(admin, "/v1/tree", admin.token)
    assert status == 200
    assert tree["pid"] == os.getpid()
    steady_actors = _actors(tree, "steady")
    # Rank 0 handled its three calls; rank 1 failed with the endpoint's error.
    assert steady_actors[0]["messages_handled"] >= 3
    assert steady_actors[0]["mailbox_depth"] == 0
    failed = steady_actors[1]
    assert failed["state"] == "failed"
    assert "worker exploded on purpose" in failed["failure"]
    restarted_actors = _actors(tree, "restarted")
    assert restarted_actors[0]["restarts"] == 1
    assert restarted_actors[0]["state"] == "running"
    killed = [
        proc
        for host in tree["hosts"]
        for proc in host["procs"]
        if proc["state"] == "failed" and "SIGKILL" in (proc["reason"] or "")
    ]
    assert len(killed) == 1

    status, node = _get(admin, f"/v1/{failed['ref']}", admin.token)
    assert status == 200
    assert node == failed
    assert _get(admin, "/v1/actor-000000000000", admin.token)[0] == 404


def test_an_actor_mesh_its_owner_stopped_is_shown_stopped_not_failed(
    admin: AdminServer, make_procs: Callable[..., ProcMesh]
) -> None:
    workers = make_procs(2).spawn("halted", Worker)
    workers.pid.call().get(timeout=30)
    workers.stop().get(timeout=30)
    status, tree = _get(admin, "/v1/tree", admin.token)
    assert status == 200
    halted = _actors(tree, "halted")
    assert [(a["state"], a["failure"]) for a in halted.values()] == [("stopped", None)] * 2


def test_pyspy_route_gives_a_procs_stacks(
    admin: AdminServer, make_procs: Callable[..., ProcMesh]
) -> None:
    procs = make_procs(1)
    procs.spawn("steady", Worker).pid.call_one().get(timeout=30)
    tree = _get(admin, "/v1/tree", admin.token)[1]
    (proc,) = [p for h in tree["hosts"] for p in h["procs"] if p["state"] == "running"]
    status, body = _get(admin, f"/v1/pyspy/{proc['ref']}", admin.token)
    assert status == 200
    assert body["address"] == proc["address"]
    assert "regency-actor-steady" in body["stacks"]
    assert _get(admin, "/v1/pyspy/proc-000000000000", admin.token)[0] == 404


def test_the_token_is_derived_from_the_secret_given() -> None:
    secret = os.urandom(32)
    server = start_admin(secret=secret)
    try:
        assert server.token == admin_token(secret)
        assert server.token != admin_token(os.urandom(32))
    finally:
        server.stop()
