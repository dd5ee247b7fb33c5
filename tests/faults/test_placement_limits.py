"""Absurd placement is refused at once, naming the limit (``max_procs_per_host``).

``spawn_procs(per_host={"gpus": 10**9})`` used to run the controller at 100 % CPU, growing
without end and without an error; a ``ProcessJob`` of a billion hosts would start processes
until the machine gave out. Slicing a mesh creates nothing and is not limited.
"""

from __future__ import annotations

import time

import pytest

from regency import config
from regency.actor import Actor, endpoint, this_host
from regency.job import ProcessJob

pytestmark = pytest.mark.timeout(60)

AT_ONCE = 2.0


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value


@pytest.mark.parametrize(
    ("per_host", "count"),
    [({"gpus": 10**9}, 10**9), ({"nodes": 64, "gpus": 64}, 4096)],
    ids=["billion", "product"],
)
def test_spawn_procs_over_the_default_limit_is_refused_at_once(
    per_host: dict[str, int], count: int
) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError) as info:
        this_host().spawn_procs(per_host=per_host)
    assert time.monotonic() - started < AT_ONCE
    assert str(info.value) == (
        f"spawn_procs(per_host={per_host!r}) asks for {count} processes on one host, over the "
        "limit of 1024 (max_procs_per_host; raise it with "
        "regency.config.configure(max_procs_per_host=N) or REGENCY_MAX_PROCS_PER_HOST)"
    )


def test_the_limit_is_configurable_and_a_mesh_within_it_works() -> None:
    with config.configured(max_procs_per_host=2):
        with pytest.raises(
            ValueError, match=r"asks for 3 processes on one host, over the limit of 2 "
        ):
            this_host().spawn_procs(per_host={"gpus": 3})
        procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("within", Echo)
        assert list(mesh.echo.call(7).get(timeout=30).values()) == [7, 7]
        # Slicing builds views of what exists: not limited.
        assert mesh.slice(gpus=1).echo.call_one(8).get(timeout=30) == 8
    finally:
        procs.stop().get(timeout=30)


def test_a_process_job_of_absurd_size_is_refused_before_it_starts_anything() -> None:
    started = time.monotonic()
    with pytest.raises(
        ValueError,
        match=r"ProcessJob mesh 'trainers' of 1000000000 hosts asks for "
        r"1000000000 processes on one host, over the limit of 1024 \(max_procs_per_host",
    ):
        ProcessJob({"trainers": 10**9})
    assert time.monotonic() - started < AT_ONCE
