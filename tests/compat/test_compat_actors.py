"""Actor definition rules, identity and mesh handles (monarch-api.md §1.1)."""

from __future__ import annotations

import io
import logging
import threading

import pytest
from compat_impl import actor
from compat_util import CALL_TIMEOUT

Actor = actor.Actor
endpoint = actor.endpoint


class Named(Actor):
    @endpoint
    def ident(self) -> dict[str, object]:
        inst = actor.context().actor_instance
        return {
            "name": inst.name,
            "rank": str(inst.rank),
            "rank_dict": dict(inst.rank),
            "str": str(inst),
            "creator": str(inst.creator),
            "creator_name": inst.creator.name,
            "class_name": inst.class_name,
            "message_rank": str(actor.context().message_rank),
            "current_actor_name": actor.current_actor_name(),
            "actor_id": str(inst.actor_id),
            "actor_name": inst.actor_id.actor_name,
            "proc_sizes": inst.proc.sizes,
        }

    @endpoint
    def log_line(self, logger_name: str) -> str:
        return _logged(logger_name, "from the actor")

    @endpoint
    def spawn_child(self) -> dict[str, object]:
        child = actor.context().actor_instance.proc.spawn("child", Named)
        return child.ident.call_one().get()


def _logged(logger_name: str, text: str) -> str:
    """What a handler added now to a fresh logger shows for one record."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(logger_name)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.error(text)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


class Mixed(Actor):
    @endpoint
    def a(self) -> None:
        pass

    @endpoint
    async def b(self) -> None:
        pass


class SyncWithAsyncCleanup(Actor):
    @endpoint
    def a(self) -> None:
        pass

    async def __cleanup__(self, exc: Exception | None) -> None:
        pass


class AsyncWithSyncSupervise(Actor):
    @endpoint
    async def a(self) -> int:
        return 1

    def __supervise__(self, failure: object) -> bool:
        return True


class SyncWithAsyncSupervise(Actor):
    @endpoint
    def a(self) -> int:
        return 2

    async def __supervise__(self, failure: object) -> bool:
        return True


class ShapeNamed(Actor):
    @endpoint
    def shape(self) -> str:
        return "shape"

    @endpoint
    def restarts(self) -> str:
        return "restarts"


class CollidesStop(Actor):
    @endpoint
    def stop(self) -> None:
        pass


class CollidesSlice(Actor):
    @endpoint
    def slice(self) -> None:
        pass


class CollidesInitialized(Actor):
    @endpoint
    def initialized(self) -> None:
        pass


class NotAnActor:
    pass


@pytest.fixture(scope="module")
def named(procs2):
    return procs2.spawn("the_name", Named)


# --- identity -------------------------------------------------------------------------------


def test_instance_name_and_rank(named):
    got = named.slice(gpus=1).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["name"] == "the_name"
    assert got["rank"] == "{'gpus': 1/2}"
    assert got["rank_dict"] == {"gpus": 1}


def test_instance_str_is_qualified_chain(named):
    got = named.slice(gpus=1).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["str"] == "<root>.<test_compat_actors.Named the_name{'gpus': 1/2}>"


def test_log_records_in_an_actor_carry_its_name(named):
    got = named.slice(gpus=1).log_line.call_one("compat.in_actor").get(timeout=CALL_TIMEOUT)
    assert got == "[actor=<root>.<test_compat_actors.Named the_name{'gpus': 1/2}>] from the actor\n"


def test_log_records_on_the_client_say_root_unless_switched_off(named):
    assert _logged("compat.client", "HUH") == "[actor=<root>] HUH\n"
    actor.config.prefix_python_logs_with_actor = False
    try:
        assert _logged("compat.client_off", "HUH") == "HUH\n"
    finally:
        actor.config.prefix_python_logs_with_actor = True


def test_instance_creator_is_root(named):
    got = named.slice(gpus=0).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["creator"] == "<root>"
    assert got["creator_name"] == "root"


def test_instance_class_name(named):
    got = named.slice(gpus=0).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["class_name"] == "test_compat_actors.Named"


def test_instance_actor_id_names_the_actor(named):
    got = named.slice(gpus=0).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["actor_name"] == "the_name"
    assert got["actor_id"].startswith("the_name<")
    assert got["current_actor_name"] == got["actor_id"]


def test_actor_ids_differ_per_rank(named):
    vm = named.ident.call().get(timeout=CALL_TIMEOUT)
    assert len({v["actor_id"] for v in vm.values()}) == 2


def test_instance_proc_is_a_singleton(named):
    got = named.slice(gpus=0).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["proc_sizes"] == {}


def test_message_rank_direct_to_singleton_is_empty(named):
    assert named.slice(gpus=1).ident.call_one().get(timeout=CALL_TIMEOUT)["message_rank"] == "{}"


def test_message_rank_within_a_sliced_range(named):
    vm = named.slice(gpus=slice(1, 2)).ident.call().get(timeout=CALL_TIMEOUT)
    got = vm.item(gpus=0)
    assert got["message_rank"] == "{'gpus': 0/1}"
    assert got["rank"] == "{'gpus': 1/2}"


def test_message_rank_whole_mesh(named):
    vm = named.ident.call().get(timeout=CALL_TIMEOUT)
    assert [v["message_rank"] for v in vm.values()] == ["{'gpus': 0/2}", "{'gpus': 1/2}"]


def test_child_identity_chain(named):
    got = named.slice(gpus=0).spawn_child.call_one().get(timeout=CALL_TIMEOUT)
    assert got["name"] == "child"
    assert got["rank"] == "{}"
    assert got["creator_name"] == "the_name"
    assert got["creator"] == "<root>.<test_compat_actors.Named the_name{'gpus': 0/2}>"
    assert got["str"] == (
        "<root>.<test_compat_actors.Named the_name{'gpus': 0/2}>.<test_compat_actors.Named child>"
    )


def test_root_client_identity():
    inst = actor.context().actor_instance
    assert str(inst) == "<root>"
    assert dict(inst.rank) == {}
    assert actor.current_actor_name() == str(inst.actor_id)


def test_current_rank_and_size_on_client():
    assert dict(actor.current_rank()) == {}
    assert dict(actor.current_size()) == {}


# --- spawn validation ---------------------------------------------------------------------


def _spawn(procs, name, cls):
    mesh = procs.spawn(name, cls)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    return mesh


def test_mixed_sync_async_endpoints_refused(procs2):
    with pytest.raises(ValueError, match="mixes both async and sync endpoints") as info:
        _spawn(procs2, "mixed", Mixed)
    assert "sync: ['a']" in str(info.value)
    assert "async: ['b']" in str(info.value)


def test_sync_endpoints_with_async_cleanup_refused(procs2):
    with pytest.raises(ValueError, match="has sync endpoints, but an async __cleanup__"):
        _spawn(procs2, "cleanup", SyncWithAsyncCleanup)


def test_sync_supervise_allowed_with_async_endpoints(procs2):
    mesh = _spawn(procs2, "supsync", AsyncWithSyncSupervise)
    assert list(mesh.a.call().get(timeout=CALL_TIMEOUT).values()) == [1, 1]


def test_async_supervise_refused_with_sync_endpoints(procs2):
    with pytest.raises(ValueError, match="has sync endpoints, but an async __supervise__"):
        _spawn(procs2, "supasync", SyncWithAsyncSupervise)


@pytest.mark.parametrize(
    ("cls", "attr"),
    [(CollidesStop, "stop"), (CollidesSlice, "slice"), (CollidesInitialized, "initialized")],
)
def test_endpoint_colliding_with_mesh_attribute_refused(procs2, cls, attr):
    with pytest.raises(
        ValueError,
        match=f"ActorMesh has an attribute that collides with an endpoint name: attribute={attr}",
    ):
        _spawn(procs2, f"coll{attr}", cls)


def test_endpoints_named_shape_and_restarts_allowed(procs2):
    mesh = _spawn(procs2, "shapenamed", ShapeNamed)
    assert mesh.shape.call().get(timeout=CALL_TIMEOUT).item(gpus=0) == "shape"
    assert mesh.restarts.call().get(timeout=CALL_TIMEOUT).item(gpus=1) == "restarts"


def test_spawn_non_actor_refused(procs2):
    with pytest.raises(ValueError, match=r"must subclass .*Actor to spawn it"):
        _spawn(procs2, "notactor", NotAnActor)


def test_concurrent_endpoint_refuses_sync_method():
    with pytest.raises(ValueError, match="can only wrap async endpoints"):

        class Bad(Actor):
            @actor.concurrent_endpoint
            def a(self) -> None:
                pass


def test_concurrent_endpoint_refuses_stacking_on_endpoint():
    with pytest.raises(ValueError, match="concurrent_endpoint does not wrap @endpoint"):

        class Bad(Actor):
            @actor.concurrent_endpoint
            @endpoint
            async def a(self) -> None:
                pass


# --- mesh handles -------------------------------------------------------------------------


def test_actor_mesh_repr_names_class_and_shape(named):
    text = repr(named)
    assert text.startswith("ActorMesh(class=<class 'test_compat_actors.Named'>, shape={gpus=2})")
    assert str(named) == text
    assert repr(named.slice(gpus=0)).startswith(
        "ActorMesh(class=<class 'test_compat_actors.Named'>, shape={})"
    )


@pytest.mark.deviation("regency's ActorMesh repr omits inner=", skip="regency")
def test_actor_mesh_repr_has_inner(named):
    assert "inner=<class" in repr(named)


def test_actor_mesh_sizes_extent_len(named):
    assert named.sizes == {"gpus": 2}
    assert len(named) == 2
    assert named.extent == actor.Extent(["gpus"], [2])
    assert named.size() == 2
    assert named.size("gpus") == 2


def test_actor_mesh_slice_unknown_dim(named):
    with pytest.raises(TypeError, match="Shape does not have dimension labeled 'hosts'"):
        named.slice(hosts=0)


def test_actor_mesh_slice_out_of_range(named):
    with pytest.raises(IndexError, match="index out of range"):
        named.slice(gpus=2)


def test_actor_mesh_flatten_rename_split(named):
    assert named.flatten("r").sizes == {"r": 2}
    assert named.rename(gpus="g").sizes == {"g": 2}
    assert named.split(gpus=("a", "b"), b=1).sizes == {"a": 2, "b": 1}


def test_renamed_mesh_slice_reaches_the_right_rank(named):
    got = named.rename(gpus="g").slice(g=1).ident.call_one().get(timeout=CALL_TIMEOUT)
    assert got["rank"] == "{'gpus': 1/2}"


def test_flatten_then_slice_rank0_idiom(named):
    one = named.flatten("rank").slice(rank=0)
    assert one.sizes == {}
    assert one.ident.call_one().get(timeout=CALL_TIMEOUT)["rank"] == "{'gpus': 0/2}"


def test_slice_of_slice(named):
    sub = named.slice(gpus=slice(0, 2)).slice(gpus=1)
    assert sub.ident.call_one().get(timeout=CALL_TIMEOUT)["rank"] == "{'gpus': 1/2}"


def test_future_cannot_be_constructed():
    with pytest.raises(TypeError):
        actor.Future()


def test_actor_mesh_pickles_as_a_reference(procs2, named):
    relay = procs2.spawn("relay", Relay)
    got = relay.slice(gpus=0).call_other.call_one(named.slice(gpus=1)).get(timeout=CALL_TIMEOUT)
    assert got == "{'gpus': 1/2}"


class Relay(Actor):
    @endpoint
    def call_other(self, other) -> str:
        return other.ident.call_one().get()["rank"]


def test_log_records_on_other_client_threads_have_no_prefix(named):
    got = []
    thread = threading.Thread(target=lambda: got.append(_logged("compat.thread", "HUH")))
    thread.start()
    thread.join(timeout=CALL_TIMEOUT)
    assert got == ["HUH\n"]
