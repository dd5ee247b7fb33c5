"""Monarch's API surface in regency (issue 18 item 12): config keys, exported names, signatures.

Expected values were read off torchmonarch 0.7.0 running the same calls.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from regency import config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def clean_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No configure() values and no REGENCY_* variables during the test; restored after."""
    saved = config.get_runtime_config()
    for key in list(os.environ):
        if key.startswith("REGENCY_"):
            monkeypatch.delenv(key)
    config.clear_runtime_config()
    yield
    config.clear_runtime_config()
    config.configure(**saved)


MONARCH_DEFAULTS = {
    "message_delivery_timeout": "30s",
    "mesh_attach_config_timeout": "1m",
    "cleanup_timeout": "3s",
    "stop_actor_timeout": "10s",
    "process_exit_timeout": "10s",
    "supervision_watchdog_timeout": "2m",
    "mesh_orphan_timeout": "1m",
    "message_ack_time_interval": "500ms",
    "codec_max_frame_length": 10 * 1024**3,
    "max_cast_dimension_size": 16,
    "max_cast_fanout": 16,
    "message_ttl_default": 64,
    "enable_log_forwarding": False,
    "mesh_bootstrap_enable_pdeathsig": True,
    "tail_log_lines": 0,
    "mesh_admin_addr": "[::]:1729",
    "tokio_worker_threads": None,
    "rdma_allow_tcp_fallback": True,
    "channel_tcp_congestion": "",
}


@pytest.mark.usefixtures("clean_config")
def test_every_monarch_key_is_known_with_monarchs_default() -> None:
    values = config.get_global_config()
    for key, default in MONARCH_DEFAULTS.items():
        assert values[key] == default, key
    assert values["default_encoding"] is config.Encoding.Multipart
    assert values["default_transport"] is config.ChannelTransport.Unix
    assert len(values) >= 84 + 7


@pytest.mark.usefixtures("clean_config")
@pytest.mark.parametrize(
    ("given", "read_back"),
    [
        ("300s", "5m"),
        ("90s", "1m 30s"),
        ("1.5s", "1s 500ms"),
        ("1500ms", "1s 500ms"),
        ("5 minutes", "5m"),
        ("1h30m", "1h 30m"),
        ("3600s", "1h"),
        ("86400s", "1day"),
        ("2w", "14days"),
        ("0s", "0s"),
        (" 5s", "5s"),
        ("100000h", "11years 4months 27days 3h 45m 36s"),
    ],
)
def test_durations_are_normalised_on_read(given: str, read_back: str) -> None:
    config.configure(message_delivery_timeout=given)
    assert config.get_global_config()["message_delivery_timeout"] == read_back
    assert config.get_runtime_config()["message_delivery_timeout"] == read_back


@pytest.mark.usefixtures("clean_config")
@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("message_delivery_timeout", 5, "'int' object cannot be cast as 'str'"),
        ("message_delivery_timeout", "abc", "Invalid duration format 'abc'"),
        ("message_delivery_timeout", "5", "time unit needed"),
        ("message_delivery_timeout", "", "value was empty"),
        ("message_delivery_timeout", None, "'NoneType' object cannot be cast as 'str'"),
        ("max_cast_dimension_size", "3", "cannot be interpreted as an integer"),
        ("max_cast_dimension_size", -1, "can't convert negative int to unsigned"),
        ("codec_max_frame_length", 1.5, "cannot be interpreted as an integer"),
        ("enable_log_forwarding", 1, "'int' object cannot be cast as 'bool'"),
        ("message_latency_sampling_rate", "0.5", "must be real number"),
        ("channel_tcp_congestion", 5, "cannot be cast as 'str'"),
        ("default_encoding", "Json", "cannot be cast as 'Encoding'"),
        ("cleanup_timeout", True, "'bool' object cannot be cast as 'str'"),
    ],
)
def test_wrong_types_are_type_errors(key: str, value: object, why: str) -> None:
    with pytest.raises(TypeError) as info:
        config.configure(**{key: value})
    assert f"invalid value `{value!r}` for configuration key `{key}`" in str(info.value)
    assert why in str(info.value)
    assert key not in config.get_runtime_config()


@pytest.mark.usefixtures("clean_config")
def test_unknown_keys_are_value_errors_and_nothing_is_set() -> None:
    with pytest.raises(ValueError, match="invalid configuration key: `nonsense_key`"):
        config.configure(message_delivery_timeout="1m", nonsense_key=1)
    with pytest.raises(ValueError, match="did you mean"):
        config.configure(message_delivery_timout="1m")
    # Legacy allocator keys Monarch 0.7.0 no longer has.
    with pytest.raises(ValueError):
        config.configure(remote_alloc_bootstrap_addr="tcp://x:1")
    assert config.get_runtime_config() == {}


@pytest.mark.usefixtures("clean_config")
def test_other_monarch_values_are_stored() -> None:
    config.configure(
        enable_log_forwarding=True,
        max_cast_fanout=True,  # Monarch takes a bool as an int
        tokio_worker_threads=4,
        message_latency_sampling_rate=1,
        default_encoding=config.Encoding.Json,
        default_transport="tcp",
    )
    values = config.get_global_config()
    assert values["enable_log_forwarding"] is True
    assert values["max_cast_fanout"] == 1
    assert values["tokio_worker_threads"] == 4
    assert values["message_latency_sampling_rate"] == 1.0
    assert values["default_encoding"] is config.Encoding.Json
    assert values["default_transport"] is config.ChannelTransport.TcpWithHostname
    config.configure(tokio_worker_threads=None, default_transport="tcp://127.0.0.1:0")
    assert config.get("tokio_worker_threads") is None
    assert config.get("default_transport") == "tcp://127.0.0.1:0"
    with pytest.raises(ValueError, match="invalid bind spec"):
        config.configure(default_transport="bogus")


@pytest.mark.usefixtures("clean_config")
def test_configured_restores_the_runtime_layer_and_yields_merged_values() -> None:
    config.configure(message_delivery_timeout="300s")
    with config.configured(cleanup_timeout="10s") as values:
        assert values["cleanup_timeout"] == "10s"
        assert values["message_delivery_timeout"] == "5m"
        assert config.get_seconds("cleanup_timeout") == 10.0
    assert config.get("cleanup_timeout") == "3s"
    assert config.get("message_delivery_timeout") == "5m"
    with pytest.raises(ValueError), config.configured(nope=1):
        pass
    assert config.get_runtime_config() == {"message_delivery_timeout": "5m"}


@pytest.mark.usefixtures("clean_config")
@pytest.mark.parametrize(
    ("monarch", "value", "regency", "effect"),
    [
        ("codec_max_frame_length", 4096, "max_frame_bytes", 4096),
        ("max_cast_fanout", 4, "cast_fanout", 4),
        ("max_cast_dimension_size", 2, "cast_fanout", 2),
        ("stop_actor_timeout", "2s", "stop_timeout", 2.0),
        ("process_exit_timeout", "1m", "stop_timeout", 60.0),
        ("server_heartbeat_interval", "250ms", "heartbeat_interval", 0.25),
        ("supervision_watchdog_timeout", "7s", "heartbeat_timeout", 7.0),
    ],
)
def test_monarch_keys_set_regencys_equivalent(
    monarch: str, value: object, regency: str, effect: object
) -> None:
    config.configure(**{monarch: value})
    assert config.get(regency) == effect
    assert type(config.get(regency)) is type(effect)
    # The latest value configured wins, in either direction.
    config.configure(**{regency: config.get_global_config()[regency] * 2})
    assert config.get(regency) == effect * 2  # type: ignore[operator]
    config.configure(**{monarch: value})
    assert config.get(regency) == effect


@pytest.mark.usefixtures("clean_config")
def test_a_proc_configured_from_the_global_config_keeps_regencys_values() -> None:
    """Procs get ``configure(**get_global_config())``: regency's keys must keep their values
    even though the Monarch keys that feed them come along at their defaults."""
    config.configure(cast_fanout=2, stop_timeout=1.5)
    shipped = config.get_global_config()
    config.clear_runtime_config()
    config.configure(**shipped)
    assert config.get("cast_fanout") == 2
    assert config.get("stop_timeout") == 1.5
    assert config.get("max_cast_fanout") == 16


@pytest.mark.usefixtures("clean_config")
def test_cleanup_timeout_takes_seconds_too_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config.configure(cleanup_timeout=0.5)
    assert config.get("cleanup_timeout") == "500ms"
    assert config.get_seconds("cleanup_timeout") == 0.5
    config.clear_runtime_config()
    monkeypatch.setenv("REGENCY_CLEANUP_TIMEOUT", "2s")
    monkeypatch.setenv("REGENCY_ENABLE_LOG_FORWARDING", "true")
    monkeypatch.setenv("REGENCY_MESSAGE_DELIVERY_TIMEOUT", "120s")
    assert config.get("cleanup_timeout") == "2s"
    assert config.get("enable_log_forwarding") is True
    assert config.get("message_delivery_timeout") == "2m"


# -- names exported by regency.actor ------------------------------------------------------------

# monarch.actor.__all__ of torchmonarch 0.7.0.
MONARCH_ACTOR_ALL = [
    "Accumulator", "Actor", "ActorError", "Channel", "ChannelTransport", "Context", "Endpoint",
    "Extent", "Future", "HostMesh", "MeshFailure", "Point", "Port", "PortReceiver", "ProcId",
    "ProcMesh", "Uid", "ValueMesh", "as_endpoint", "attach", "attach_to_workers",
    "concurrent_endpoint", "config", "context", "current_actor_name", "current_rank",
    "current_size", "debug_controller", "default_bootstrap_cmd", "enable_transport", "endpoint",
    "get_meter", "get_or_spawn_controller", "returns_future", "run_worker_loop_forever",
    "run_worker_loop_until_shutdown", "send", "shutdown_context", "span",
    "start_worker_loop_forever", "this_host", "this_proc", "traced", "unhandled_fault_hook",
]  # fmt: skip


def test_every_monarch_actor_name_exists_in_regency_actor() -> None:
    import regency.actor as actor

    missing = [name for name in MONARCH_ACTOR_ALL if not hasattr(actor, name)]
    assert missing == []
    assert set(MONARCH_ACTOR_ALL) <= set(actor.__all__)
    assert set(MONARCH_ACTOR_ALL) <= set(dir(actor))
    assert actor.hosts_from_config is not None  # Monarch's reference lists it here too
    assert actor.config.prefix_python_logs_with_actor is True


def test_monarchs_telemetry_helpers_are_telemetrys() -> None:
    import regency.actor as actor
    import regency.observe.telemetry as telemetry

    assert actor.span is telemetry.span
    assert actor.traced is telemetry.traced
    assert actor.get_meter() is telemetry.get_meter()  # one meter per process, as in Monarch


def test_attach_through_a_gateway_is_not_implemented() -> None:
    from regency.actor import attach

    with pytest.raises(NotImplementedError, match="remote gateway"):
        attach("tcp://127.0.0.1:1")


def test_channel_transport_has_monarchs_members() -> None:
    from regency.actor import ChannelTransport

    assert {m.name for m in ChannelTransport} == {
        "Local", "MetaQuicWithHostname", "MetaQuicWithIpV6", "MetaTlsWithHostname",
        "MetaTlsWithIpV6", "Quic", "TcpWithHostname", "TcpWithLocalhost", "Tls", "Unix",
    }  # fmt: skip
    assert config.ChannelTransport is ChannelTransport


def test_uid_and_proc_id_read_and_write_monarchs_form() -> None:
    from regency.actor import ProcId, Uid

    uid = Uid.from_string("local<Gq3tHs98kpP>")
    assert (uid.label, uid.instance_value, uid.is_instance) == ("local", 17410749405437304489, True)
    assert str(uid) == "local<Gq3tHs98kpP>"
    assert Uid.from_string(str(uid)) == uid
    assert [str(Uid.instance_from_value(n)) for n in (5, 57, 58, 2**64 - 1)] == [
        "<6>",
        "<Z>",
        "<21>",
        "<JPwcyDCgEup>",
    ]
    single = Uid.from_string("local")
    assert (single.label, single.is_singleton, single.instance_value) == ("local", True, None)
    anonymous = Uid.anonymous()
    assert anonymous.label is None
    assert anonymous.is_instance
    with pytest.raises(TypeError, match="cannot create"):
        Uid()
    proc = ProcId(uid)
    assert (str(proc), proc.label, proc.uid) == ("local<Gq3tHs98kpP>", "local", uid)
    assert ProcId.from_string("x<1>") == ProcId(Uid.from_string("x<1>"))
    with pytest.raises(TypeError, match="cannot be cast as 'Uid'"):
        ProcId("x")  # type: ignore[arg-type]


def test_default_bootstrap_cmd_and_with_env() -> None:
    import sys

    from regency.actor import BootstrapCommand, default_bootstrap_cmd

    cmd = default_bootstrap_cmd()
    assert isinstance(cmd, BootstrapCommand)
    assert (cmd.program, cmd.arg0, cmd.args, cmd.env, cmd.inherit_env) == (
        sys.executable,
        None,
        ["-m", "regency._runtime.bootstrap"],
        {},
        True,
    )
    more = cmd.with_env({"A": "1", "HOME": None})
    assert more.env == {"A": "1", "HOME": None}
    assert cmd.env == {}
    assert more.environment({"HOME": "/root", "B": "2"}) == {"B": "2", "A": "1"}


def test_returns_future_runs_its_body_when_first_observed() -> None:
    import asyncio
    import threading

    from regency.actor import Future, returns_future

    ran: list[tuple[int, str]] = []

    @returns_future
    async def add_one(x: int) -> int:
        ran.append((x, threading.current_thread().name))
        await asyncio.sleep(0)
        return x + 1

    @returns_future
    async def fails() -> None:
        raise KeyError("k")

    result = add_one(1)
    assert isinstance(result, Future)
    assert ran == [], "calling does not start the body"
    assert result.get(timeout=10) == 2
    assert result.get() == 2
    assert ran == [(1, threading.current_thread().name)], "get() runs it on this thread"

    async def main() -> int:
        return await add_one(41)

    assert asyncio.run(main()) == 42
    with pytest.raises(KeyError):
        fails().get(timeout=10)
    add_one(7)  # never observed: never runs
    assert [x for x, _ in ran] == [1, 41]


def test_returns_future_get_timeout_cancels_the_body() -> None:
    import asyncio

    from regency.actor import returns_future

    cancelled: list[bool] = []

    @returns_future
    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    fut = slow()
    with pytest.raises(TimeoutError, match="did not finish in time"):
        fut.get(timeout=0.1)
    assert cancelled == [True]
    with pytest.raises(TimeoutError):
        fut.get()


# -- attach_to_workers / worker loops: Monarch's parameters ---------------------------------------


def test_attach_checks_monarchs_ca_and_private_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from regency.actor import attach_to_workers

    monkeypatch.delenv("REGENCY_TLS_KEY", raising=False)
    with pytest.raises(ValueError, match="needs private_key"):
        attach_to_workers(workers=["tcp://127.0.0.1:1"], ca=b"PEM")
    with pytest.raises(ValueError, match="needs ca"):
        attach_to_workers(
            workers=["tcp://127.0.0.1:1"], ca="trust_all_connections", private_key=b"KEY"
        )
    with pytest.raises(ValueError, match="certificate"):
        attach_to_workers(workers=["tcp://127.0.0.1:1"], ca=b"PEM", private_key=b"KEY")


@pytest.mark.usefixtures("clean_config")
def test_trust_all_connections_does_not_turn_authentication_off() -> None:
    from regency.actor import attach_to_workers

    with pytest.raises(ValueError, match="does not turn that off") as info:
        attach_to_workers(workers=["tcp://127.0.0.1:1"], ca="trust_all_connections")
    assert "REGENCY_JOB_SECRET" in str(info.value)


@pytest.mark.parametrize(
    ("written", "dialed"),
    [
        ("tcp://10.0.0.1:26600", "tcp://10.0.0.1:26600"),
        ("service<2MuAHeDjLCEd>@tcp://10.0.0.1:26600", "tcp://10.0.0.1:26600"),
        ("tcp://worker:4444@tcp://0.0.0.0:4444", "tcp://worker:4444"),
        ("service<2MuAHeDjLCEd>@tcp://worker:4444@tcp://0.0.0.0:4444", "tcp://worker:4444"),
        ("ipc:///tmp/job/hosts_0", "unix:/tmp/job/hosts_0"),
        ("service<x>@ipc:///tmp/job/hosts_0", "unix:/tmp/job/hosts_0"),
    ],
)
def test_worker_addresses_in_monarchs_forms(written: str, dialed: str) -> None:
    from regency.actor._attach import dial_address

    assert dial_address(written) == dialed


@pytest.mark.parametrize(
    ("given", "listen", "advertise"),
    [
        ("tcp://*:4444", "tcp://0.0.0.0:4444", None),
        ("tcp://0.0.0.0:0", "tcp://0.0.0.0:0", None),
        ("tcp://worker:4444@tcp://0.0.0.0:4444", "tcp://0.0.0.0:4444", "tcp://worker:4444"),
        ("service<x>@tcp://127.0.0.1:0", "tcp://127.0.0.1:0", None),
        ("ipc:///tmp/job/hosts_0", "unix:/tmp/job/hosts_0", None),
    ],
)
def test_worker_loop_addresses(given: str, listen: str, advertise: str | None) -> None:
    from regency.actor._worker import _bind_and_advertise

    assert _bind_and_advertise(given) == (listen, advertise)


def test_worker_loops_take_monarchs_parameters() -> None:
    from regency.actor import (
        run_worker_loop_forever,
        run_worker_loop_until_shutdown,
        start_worker_loop_forever,
    )

    for loop in (
        run_worker_loop_forever,
        start_worker_loop_forever,
        run_worker_loop_until_shutdown,
    ):
        with pytest.raises(ValueError, match="needs private_key"):
            loop(address="tcp://127.0.0.1:0", ca=b"PEM")


SEEN: list[tuple[object, object]] = []
ZIPPED: list[tuple[object, object]] = []


@config.parametrize_config(enable_log_forwarding={True, False}, tail_log_lines={0, 5})
def test_parametrize_config_runs_every_combination_inside_configured() -> None:
    SEEN.append((config.get("enable_log_forwarding"), config.get("tail_log_lines")))


@config.parametrize_config_pointwise(cleanup_timeout=["1s", "2s"], max_cast_fanout=[2, 4])
def test_parametrize_config_pointwise_zips() -> None:
    ZIPPED.append((config.get("cleanup_timeout"), config.get("cast_fanout")))


def test_the_sweeps_ran_and_restored() -> None:
    assert sorted(SEEN, key=str) == sorted([(True, 0), (True, 5), (False, 0), (False, 5)], key=str)
    assert ZIPPED == [("1s", 2), ("2s", 4)]
    assert "tail_log_lines" not in config.get_runtime_config()
    with pytest.raises(ValueError, match="same number of values"):
        config.parametrize_config_pointwise(cleanup_timeout=["1s"], max_cast_fanout=[1, 2])


@pytest.mark.usefixtures("clean_config")
@pytest.mark.parametrize("transport", ["tls", "metatls", "metatls-hostname", "tls://host:1"])
def test_tls_transports_are_taken_and_refused_when_tls_is_off(transport: str) -> None:
    from regency._transport import tls
    from regency.actor import ChannelTransport

    config.configure(default_transport=transport)  # TCP runs TLS 1.3: the promise holds
    tls.force_enabled(False)
    try:
        with pytest.raises(NotImplementedError, match="needs TLS"):
            config.configure(default_transport=ChannelTransport.Tls)
    finally:
        tls.force_enabled(None)
    with pytest.raises(NotImplementedError, match="QUIC"):
        config.configure(default_transport=ChannelTransport.Quic)
