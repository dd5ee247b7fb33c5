"""SPMDActor.main: a script or ``-m module`` as ``__main__``, errors, exit statuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from regency.actor import ActorError, ProcMesh, this_host
from regency.spmd import SPMDActor

pytestmark = pytest.mark.timeout(120)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PROBE = str(SCRIPTS / "argv_probe.py")
ADDR, PORT = "127.0.0.1", 29511  # nothing here starts a process group


@pytest.fixture(scope="module")
def spmd() -> Iterator[SPMDActor]:
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield procs.spawn("spmd", SPMDActor)
    finally:
        procs.stop().get(timeout=30)


def test_runs_a_script_as_main_with_its_argv(spmd: SPMDActor, tmp_path: Path) -> None:
    out = tmp_path / "seen-{}.json"
    results = spmd.main.call(ADDR, PORT, [PROBE, str(out), "x", "--flag"]).get(timeout=60)
    assert list(results.values()) == [True, True]
    seen = json.loads(out.read_text())  # both ranks wrote the same path; either one will do
    assert seen["name"] == "__main__"
    assert seen["argv"] == [PROBE, str(out), "x", "--flag"]
    assert seen["path0"] == str(SCRIPTS)  # as `python script` puts the script's folder first


def test_runs_a_module_with_dash_m(spmd: SPMDActor, tmp_path: Path) -> None:
    src = tmp_path / "in.json"
    src.write_text('{"b": 1, "a": [1, 2]}')
    dst = tmp_path / "out.json"
    rank0 = spmd.slice(gpus=0)
    assert rank0.main.call_one(
        ADDR, PORT, ["-m", "json.tool", "--sort-keys", str(src), str(dst)]
    ).get(timeout=60)
    assert json.loads(dst.read_text()) == {"a": [1, 2], "b": 1}
    assert dst.read_text().startswith('{\n    "a"')  # json.tool's own formatting ran


def test_empty_argv_is_a_clear_error(spmd: SPMDActor) -> None:
    with pytest.raises(ActorError, match=r"No script or module specified: .*argv is empty"):
        spmd.main.call(ADDR, PORT, []).get(timeout=60)


def test_missing_script_names_it(spmd: SPMDActor, tmp_path: Path) -> None:
    with pytest.raises(ActorError, match=r"no script .*nope.py"):
        spmd.slice(gpus=0).main.call_one(ADDR, PORT, [str(tmp_path / "nope.py")]).get(timeout=60)


def test_a_raising_script_gives_actor_error_with_traceback_and_the_actor_lives(
    spmd: SPMDActor, tmp_path: Path
) -> None:
    out = tmp_path / "x.json"
    with pytest.raises(ActorError) as info:
        spmd.main.call(ADDR, PORT, [PROBE, str(out), "raise"]).get(timeout=60)
    text = str(info.value)
    assert "RuntimeError: the probe script failed on purpose" in text
    assert "argv_probe.py" in text  # the script's frame is in the traceback
    # The actor lives: the next main runs.
    assert list(spmd.main.call(ADDR, PORT, [PROBE, str(out)]).get(timeout=60).values()) == [
        True,
        True,
    ]


def test_sys_exit_zero_is_success(spmd: SPMDActor, tmp_path: Path) -> None:
    out = str(tmp_path / "x.json")
    assert spmd.slice(gpus=1).main.call_one(ADDR, PORT, [PROBE, out, "exit", "0"]).get(timeout=60)


def test_sys_exit_nonzero_fails_that_rank(spmd: SPMDActor, tmp_path: Path) -> None:
    out = str(tmp_path / "x.json")
    futures = list(spmd.main.stream(ADDR, PORT, [PROBE, out, "exit", "7"]))
    errors = []
    for future in futures:
        with pytest.raises(ActorError) as info:
            future.get(timeout=60)
        errors.append(str(info.value))
    assert sorted(e.split("ScriptExit: ")[1].strip() for e in errors) == [
        "rank 0 exited with status 7 (sys.exit)",
        "rank 1 exited with status 7 (sys.exit)",
    ]
    assert spmd.slice(gpus=1).main.call_one(ADDR, PORT, [PROBE, out]).get(timeout=60)


def test_main_sets_the_environment(spmd: SPMDActor, tmp_path: Path) -> None:
    out = tmp_path / "rRANK.json"
    spmd.main.call("10.9.8.7", 29999, [PROBE, str(out)]).get(timeout=60)
    seen = [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(2)]
    assert [(s["rank"], s["world"], s["master"]) for s in seen] == [
        ("0", "2", "10.9.8.7:29999"),
        ("1", "2", "10.9.8.7:29999"),
    ]


def test_a_slice_is_its_own_world(spmd: SPMDActor, tmp_path: Path) -> None:
    # As in Monarch, the rank is the position in the mesh the call was cast to.
    out = tmp_path / "sRANK.json"
    spmd.slice(gpus=1).main.call_one(ADDR, PORT, [PROBE, str(out)]).get(timeout=60)
    seen = json.loads((tmp_path / "s0.json").read_text())
    assert (seen["rank"], seen["world"]) == ("0", "1")


def test_partial_master_is_an_error(spmd: SPMDActor, tmp_path: Path) -> None:
    with pytest.raises(ActorError, match=r"master_addr.*master_port"):
        spmd.main.call(ADDR, None, [PROBE, str(tmp_path / "x")]).get(timeout=60)
