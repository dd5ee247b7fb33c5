"""A job's admin API: ``enable_admin()`` then ``state()`` serves the tree of the job's hosts."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request

import cloudpickle
import pytest
from _worker_helpers import Failures, Probe, kill_and_check
from netns import NetnsCluster

from regency.actor import Actor, RestartPolicy, endpoint
from regency.job import ProcessJob, attach_to_workers
from regency.observe import admin_token, start_admin

pytestmark = pytest.mark.timeout(120)

# Workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Failing(Actor):
    """Answers its pid; ``explode`` raises without a reply path, which fails the actor."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def explode(self) -> None:
        raise RuntimeError("exploded on purpose")


def test_a_jobs_admin_api_shows_its_hosts_procs_and_actors() -> None:
    job = ProcessJob({"hosts": 2}).enable_admin()
    try:
        state = job.state(cached_path=None)
        assert state.admin_url is not None
        assert state.admin_url.startswith("http://127.0.0.1:")
        assert state.admin_token == admin_token(job.secret)
        procs = state.hosts.spawn_procs(per_host={"gpus": 2})
        procs.spawn("probes", Probe).where.call().get(timeout=30)
        request = urllib.request.Request(
            state.admin_url + "/v1/tree", headers={"Authorization": f"Bearer {state.admin_token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            tree = json.loads(response.read())
        hosts = {host["address"]: host for host in tree["hosts"]}
        assert sorted(hosts) == sorted(h.agent for h in state.hosts._hosts)
        for host in hosts.values():
            assert len(host["procs"]) == 2
            for proc in host["procs"]:
                assert proc["state"] == "running"
                assert proc["address"].startswith(host["address"] + "/")
                (actor,) = proc["actors"]
                assert actor["actor_mesh"] == "probes"
                assert actor["state"] == "running"
                assert actor["messages_handled"] == 1
        procs.stop().get(timeout=30)
    finally:
        kill_and_check(job)
    # kill() stopped the admin server with the job.
    with pytest.raises(OSError):
        urllib.request.urlopen(state.admin_url + "/v1/root", timeout=5)


def test_tree_of_two_namespace_hosts_shows_a_failed_and_a_restarted_actor(
    hosts_and_workers: tuple[NetnsCluster, list[str]], failures: Failures
) -> None:
    cluster, addresses = hosts_and_workers
    hosts = attach_to_workers(addresses[:2], timeout=30)
    admin = start_admin()
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    others = hosts.spawn_procs(per_host={"gpus": 1}, name="others")  # the ones killed
    try:
        failing = procs.spawn("failing", Failing)
        failing.pid.call().get(timeout=60)
        failing.slice(hosts=1).explode.broadcast()
        restarted = others.spawn(
            "restarted", Failing, restart=RestartPolicy(strategy="one_for_one", max_restarts=3)
        )
        os.kill(restarted.slice(hosts=0).pid.call_one().get(timeout=60), signal.SIGKILL)
        restarted.restarted(1).get(timeout=60)
        failures.wait_for(1, timeout=30)  # the exploded actor reached the root
        request = urllib.request.Request(
            admin.url + "/v1/tree", headers={"Authorization": f"Bearer {admin.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            tree = json.loads(response.read())
    finally:
        procs.stop().get(timeout=30)
        others.stop().get(timeout=30)
        admin.stop()
    by_host = {host["address"]: host for host in tree["hosts"]}
    assert sorted(by_host) == sorted(addresses[:2])
    actors = {
        (actor["actor_mesh"], actor["rank"]): (actor, host["address"])
        for host in tree["hosts"]
        for proc in host["procs"]
        for actor in proc["actors"]
    }
    exploded, where = actors[("failing", 1)]
    assert exploded["state"] == "failed"
    assert "exploded on purpose" in exploded["failure"]
    assert where == addresses[1]
    assert actors[("failing", 0)][0]["state"] == "running"
    back, where = actors[("restarted", 0)]
    assert (back["state"], back["restarts"]) == ("running", 1)
    assert where == addresses[0]
    assert cluster.hosts[0].ip in where
