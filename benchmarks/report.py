"""Render benchmark results as Markdown: the comparison table, the errors, the machine."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import FAULT_METRICS, METRICS, RDMA_BACKENDS, RDMA_OPS, Metric, rdma_key
from harness import SystemResult

BASE = "regency"


def fmt(value: float | None) -> str:
    """Format a figure with three significant digits; None is shown as a dash."""
    if value is None:
        return "—"
    if value == 0 or 0.001 <= abs(value) < 1e6:
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:.3e}"


def ratio(numerator: float | None, denominator: float | None) -> str:
    """Format ``numerator / denominator`` as ``1.23x``, or a dash when either is missing."""
    if numerator is None or not denominator:
        return "—"
    return f"{numerator / denominator:.2f}x"


def metric_row(metric: Metric, results: Sequence[SystemResult], with_ratios: bool) -> str:
    """Return the table row of ``metric`` across ``results``."""
    arrow = "↑" if metric.higher_is_better else "↓"
    values = [r.metrics.get(metric.key) for r in results]
    cells = [f"{metric.label} ({metric.unit}) {arrow}", *(fmt(v) for v in values)]
    if with_ratios:
        cells += [ratio(values[0], v) for v in values[1:]]
    return "| " + " | ".join(cells) + " |"


def has_actor_figures(results: Sequence[SystemResult]) -> bool:
    """Whether any system measured any figure of the main table."""
    return any(m.key in r.metrics for r in results for m in METRICS)


def render_table(results: Sequence[SystemResult]) -> str:
    """Return the Markdown table; with several systems, add ratios of the first to the rest."""
    with_ratios = len(results) > 1
    head = ["figure", *(r.label for r in results)]
    if with_ratios:
        head += [f"{results[0].label}/{r.label.split()[0]}" for r in results[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [metric_row(m, results, with_ratios) for m in METRICS]
    return "\n".join(lines)


# The core issue's targets: (metric key, peer label prefix, bound, "max" or "min" on the ratio).
TARGETS = (
    ("call_one_median_us", "Monarch", 0.2, "max"),
    ("pipelined_calls_per_s", "Monarch", 8.0, "min"),
    ("gather_16_ms", "Monarch", 0.25, "max"),
    ("broadcasts_per_s", "Monarch", 10.0, "min"),
    ("payload_numpy_128mib_gbps", "Ray", 1.0, "min"),
    ("spawn_8_s", "Monarch", 0.5, "max"),
)


# The supervision issue's target: SIGKILL → pending future failing and → __supervise__ running.
FAULT_TARGET_MS = 50.0


def fault_target_row(base: SystemResult) -> str:
    """Return the targets-table row of the supervision issue, met when every trial is in time."""
    m = base.metrics
    keys = ("future", "supervise")
    medians = [m.get(f"fault_{k}_median_ms") for k in keys]
    maxima = [m.get(f"fault_{k}_max_ms") for k in keys]
    label = "SIGKILL → pending future fails and → owner's `__supervise__` runs"
    target = f"≤ {FAULT_TARGET_MS:g} ms (every trial)"
    if None in medians or None in maxima:
        return f"| {label} | {target} | — | not measured |"
    measured = "; ".join(
        f"{name} {fault_value(base, f'fault_{k}_median_ms')} / "
        f"{fault_value(base, f'fault_{k}_max_ms')} ms"
        for name, k in (("future", "future"), ("`__supervise__`", "supervise"))
    )
    if all(v <= FAULT_TARGET_MS for v in maxima):
        met = "yes"
    elif all(v <= FAULT_TARGET_MS for v in medians):
        met = "**no** (medians yes, some trial over)"
    else:
        met = "**no**"
    return f"| {label} | {target} | {measured} (median / max) | {met} |"


def render_targets(results: Sequence[SystemResult]) -> str:
    """Return the table of the core issue's targets, as ratios measured in this run, and the
    supervision issue's absolute target."""
    base = results[0]
    peers = {r.label.split()[0]: r for r in results[1:]}
    labels = {m.key: m.label for m in METRICS}
    lines = ["| figure | target | measured | met |", "|---|---|---|---|"]
    for key, peer_name, bound, kind in TARGETS:
        peer = peers.get(peer_name)
        mine = base.metrics.get(key)
        theirs = peer.metrics.get(key) if peer is not None else None
        if mine is None or not theirs:
            measured, met = "—", "not measured"
        else:
            value = mine / theirs
            measured = f"{value:.2f}x {peer_name}"
            met = "yes" if (value <= bound if kind == "max" else value >= bound) else "**no**"
        sign = "≤" if kind == "max" else "≥"
        lines.append(
            f"| {labels.get(key, key)} | {sign} {bound:g}x {peer_name} | {measured} | {met} |"
        )
    lines.append(fault_target_row(base))
    lines += rdma_target_rows(results)
    return "\n".join(lines)


def is_lower_bound(r: SystemResult, key: str) -> bool:
    """Whether ``key`` of ``r`` is a timed-out trial's cap rather than a measured time."""
    value, cap_s = r.metrics.get(key), r.metrics.get("fault_wait_s")
    kind = key.rsplit("_", 2)[0]  # fault_future or fault_supervise
    timeouts = r.metrics.get(f"{kind}_timeouts") or 0
    return bool(timeouts) and value is not None and cap_s is not None and value >= cap_s * 1e3


def fault_value(r: SystemResult, key: str) -> str:
    """Format a fault-detection time; a value that is a timeout's cap reads ``≥ cap``."""
    text = fmt(r.metrics.get(key))
    return f"≥ {text}" if is_lower_bound(r, key) else text


def fault_ratio(base: SystemResult, peer: SystemResult, key: str) -> str:
    """``ratio`` of two fault-detection times, marked when either side is a timeout's cap."""
    mine, theirs = base.metrics.get(key), peer.metrics.get(key)
    if mine is None or not theirs:
        return "—"
    value = mine / theirs
    text = f"{value:.2g}x" if value < 0.1 else f"{value:.2f}x"  # 0.0005x, not 0.00x
    low_base, low_peer = is_lower_bound(base, key), is_lower_bound(peer, key)
    if low_base and low_peer:
        return "—"
    if low_base or low_peer:
        return ("≥ " if low_base else "≤ ") + text
    return text


def trials_cell(r: SystemResult, kind: str) -> str:
    """Return ``trials (timeouts)`` of one kind of fault trial, or a dash."""
    trials = r.metrics.get(f"fault_{kind}_trials")
    if trials is None:
        return "—"
    return f"{trials:.0f} ({r.metrics.get(f'fault_{kind}_timeouts') or 0:.0f} timed out)"


def render_fault_table(results: Sequence[SystemResult]) -> str:
    """Return the fault-detection table, or "" when no system measured it."""
    if not any("fault_future_median_ms" in r.metrics for r in results):
        return ""
    base, peers = results[0], results[1:]
    head = ["figure", *(r.label for r in results)]
    head += [f"{base.label}/{r.label.split()[0]}" for r in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in FAULT_METRICS:
        cells = [f"{metric.label} ({metric.unit}) ↓"]
        cells += [fault_value(r, metric.key) for r in results]
        cells += [fault_ratio(base, r, metric.key) for r in peers]
        lines.append("| " + " | ".join(cells) + " |")
    for kind, label in (("future", "future"), ("supervise", "`__supervise__`")):
        cells = [f"{label} trials", *(trials_cell(r, kind) for r in results)]
        lines.append("| " + " | ".join(cells + [""] * len(peers)) + " |")
    return "\n".join(lines)


def supervise_summary(records: Sequence[str]) -> str:
    """Summarise the owner's records (``"<mesh> at <ms> ms"``) as counts per mesh base name."""
    counts: dict[str, int] = {}
    for record in records:
        name = record.split(" at ", 1)[0].split("-", 1)[0]
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"`{name}` {n} times" for name, n in counts.items()) or "none"


def render_fault_notes(results: Sequence[SystemResult]) -> str:
    """Return one bullet per system: what the pending future raised, what the owner saw."""
    lines = []
    for r in results:
        m = r.metrics
        if "fault_future_median_ms" not in m:
            continue
        types = ", ".join(f"`{t}`" for t in m.get("fault_future_error_types") or []) or "—"
        example = " ".join(str(m.get("fault_future_error_example") or "").split())
        example = example.replace("|", "\\|")
        records = supervise_summary(m.get("fault_supervise_records") or [])
        lines.append(
            f'- **{r.label}**: the future raised {types} (e.g. "{example[:240]}"); '
            f"failures recorded by the owner: {records}."
        )
    return "\n".join(lines)


RDMA_OP_NAMES = {"read": "`read_into`", "write": "`write_from`"}

# The performance issue's RDMA targets: (regency backend, what it is divided by, lower bound).
# "copy" is regency's own in-process np.copyto, "Monarch" Monarch's default backend, and
# "1 GB/s" the absolute target.
RDMA_TARGETS = (("cma", "copy", 0.7), ("cma", "Monarch", 10.0), ("tcp", "1 GB/s", 1.0))


def has_rdma(r: SystemResult) -> bool:
    """Whether ``r`` measured the RDMA figure."""
    return "rdma_copy_gbps" in r.metrics


def rdma_cell(r: SystemResult, backend: str, op: str) -> str:
    """Return one GB/s figure; a forced backend that fell back says which one it used."""
    text = fmt(r.metrics.get(rdma_key(backend, op)))
    used = r.metrics.get(f"rdma_{backend}_used")
    if text != "—" and used and (backend == "default" or used != backend):
        text += f" ({used})"
    return text


def render_rdma_table(results: Sequence[SystemResult]) -> str:
    """Return the RDMA transfers table, or "" when no system measured it."""
    if not any(has_rdma(r) for r in results):
        return ""
    base, peers = results[0], results[1:]
    head = ["64 MiB, GB/s ↑", *(r.label for r in results)]
    head += [f"{base.label}/{r.label.split()[0]}" for r in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, key: str, cells: list[str]) -> None:
        ratios = [ratio(base.metrics.get(key), r.metrics.get(key)) for r in peers]
        lines.append("| " + " | ".join([label, *cells, *ratios]) + " |")

    row(
        "in-process `np.copyto` (baseline)",
        "rdma_copy_gbps",
        [fmt(r.metrics.get("rdma_copy_gbps")) for r in results],
    )
    for backend in ("default", *RDMA_BACKENDS):
        where = "default backend" if backend == "default" else f"`{backend}` forced"
        for op in RDMA_OPS:
            key = rdma_key(backend, op)
            row(
                f"{RDMA_OP_NAMES[op]}, {where}",
                key,
                [rdma_cell(r, backend, op) for r in results],
            )
    return "\n".join(lines)


def rdma_reference(
    results: Sequence[SystemResult], reference: str, op: str
) -> tuple[str, float | None]:
    """Return the label and the GB/s that a regency RDMA figure is held against."""
    base = results[0]
    if reference == "copy":
        return "in-process `np.copyto`", base.metrics.get("rdma_copy_gbps")
    if reference == "1 GB/s":
        return "1 GB/s", 1.0
    peer = next((r for r in results[1:] if r.label.split()[0] == reference), None)
    if peer is None:
        return reference, None
    used = peer.metrics.get("rdma_default_used")
    label = f"{peer.label} default" + (f" ({used})" if used else "")
    return label, peer.metrics.get(rdma_key("default", op))


def rdma_checks(results: Sequence[SystemResult]) -> list[tuple[str, list[str], float, str]]:
    """Return ``(label, [read ratio, write ratio], bound, met)`` for each RDMA target."""
    base = results[0]
    checks = []
    for backend, reference, bound in RDMA_TARGETS:
        values: list[float | None] = []
        label = ""
        for op in RDMA_OPS:
            label, theirs = rdma_reference(results, reference, op)
            mine = base.metrics.get(rdma_key(backend, op))
            values.append(None if mine is None or not theirs else mine / theirs)
        cells = ["—" if v is None else f"{v:.2f}x" for v in values]
        if any(v is None for v in values):
            met = "not measured"
        else:
            met = "yes" if all(v is not None and v >= bound for v in values) else "**no**"
        checks.append((f"{base.label} `{backend}` / {label}", cells, bound, met))
    return checks


def render_rdma_targets(results: Sequence[SystemResult]) -> str:
    """Return the small table of the RDMA figure's ratios against the performance issue's
    targets."""
    lines = [
        "| ratio | `read_into` | `write_from` | target | met |",
        "|---|---|---|---|---|",
    ]
    for label, cells, bound, met in rdma_checks(results):
        lines.append(f"| {label} | {' | '.join(cells)} | ≥ {bound:g}x | {met} |")
    return "\n".join(lines)


def rdma_target_rows(results: Sequence[SystemResult]) -> list[str]:
    """Return the targets-table rows of the performance issue's RDMA targets."""
    if not has_rdma(results[0]) and "rdma" not in results[0].errors:
        return []  # not part of this run
    rows = []
    for label, cells, bound, met in rdma_checks(results):
        measured = "—" if cells == ["—", "—"] else f"{cells[0]} / {cells[1]} (read / write)"
        target = f"≥ {bound:g}x (read and write)"
        rows.append(f"| RDMA 64 MiB, {label} | {target} | {measured} | {met} |")
    return rows


def render_rdma_notes(results: Sequence[SystemResult]) -> str:
    """Return one bullet per system: what it moved, its backend, fallbacks, or why not run."""
    lines = []
    for r in results:
        m = r.metrics
        if "rdma" in r.not_applicable:
            lines.append(f"- **{r.label}**: not run. {r.not_applicable['rdma']}.")
            continue
        if not has_rdma(r):
            continue
        notes = [
            f"{m.get('rdma_memory', '?')}; `get_rdma_backend()` in the controller says "
            f"`{m.get('rdma_system_backend', '?')}`",
            f"median of {m.get('rdma_reps', 0):.0f} after one warm-up",
        ]
        for backend in m.get("rdma_backends") or []:
            used = m.get(f"rdma_{backend}_used")
            if backend != "default" and used and used != backend:
                notes.append(f"`{backend}` forced, but the transfers used `{used}`")
            drop_error = m.get(f"rdma_{backend}_drop_error")
            if drop_error:
                notes.append(f"dropping the `{backend}` buffer failed: {drop_error}")
        lines.append(f"- **{r.label}**: " + "; ".join(notes) + ".")
    return "\n".join(lines)


MULTIHOST_LEGEND = (
    "regency only (`multihost_bench.py`). **Worker hosts**: when the benchmark runs as root and"
    " `ip netns` works, 2 network namespaces (`tests/multihost/netns.py`: each its own address"
    " on a Linux bridge, one worker daemon each, attached with `attach_to_workers`), else 2"
    " `ProcessJob` worker daemons on this machine (127.0.0.1); the table's heading and note"
    " say which were used. **Calls**: 4 procs with one benchmark actor each, either on the 2"
    " worker hosts (2 procs each, reached over TCP through each worker's port) or on"
    " `this_host()` (unix sockets): `call_one` round trips to one actor (on the second host;"
    " 200 warmup, then 2,000, each timed alone: median and nearest-rank p99) and"
    " `call().get()` gathering all 4 (20 warmup, then the median of 200). **Slurm**: from"
    ' `SlurmJob({"hosts": 2}).state()` until an actor on a fresh proc there answers'
    " `call_one`, when `scripts/slurm_cluster.sh status` finds a cluster. **Host loss**: 2"
    " fresh worker hosts attached with `heartbeat_timeout` configured; an actor on host 1 is in"
    " a 60 s call when the benchmark cuts that host off: on namespace hosts its link goes down"
    " (`ip link set … down`: silent, no socket error), on `ProcessJob` hosts its worker,"
    " zygote and procs are SIGSTOPped; the time runs from the cut until the pending future"
    " raises (detection is expected between `heartbeat_timeout` and `heartbeat_timeout` +"
    " `heartbeat_interval`, 1 s by default)."
)

HOSTS_HEADING = {"netns": "2 namespace hosts (TCP)", "process": "2 ProcessJob hosts (TCP)"}
LOSS_HOW = {"netns": "link cut (`ip link set … down`)", "process": "SIGSTOP"}


def render_multihost_table(results: Sequence[SystemResult]) -> str:
    """Return the "Multi-host" table of regency's figures ("" when none was measured)."""
    r = next((r for r in results if r.key == "regency"), None)
    if r is None or not any(k.startswith(("mh_", "host_loss_")) for k in r.metrics):
        return ""
    m = r.metrics
    heading = HOSTS_HEADING.get(str(m.get("mh_hosts")), "2 worker hosts (TCP)")
    lines = [
        f"| figure | this host (unix sockets) | {heading} |",
        "|---|---:|---:|",
    ]
    for label, key in (
        ("call_one median (µs)", "call_one_median_us"),
        ("call_one p99 (µs)", "call_one_p99_us"),
        (f"call + gather, {m.get('mh_procs', 4):.0f} procs, median (ms)", "gather_median_ms"),
    ):
        lines.append(
            f"| {label} | {fmt(m.get(f'mh_local_{key}'))} | {fmt(m.get(f'mh_tcp_{key}'))} |"
        )
    if m.get("mh_hosts_note"):
        lines += ["", f"Worker hosts: {m['mh_hosts_note']}."]
    lines += ["", "| figure | value | note |", "|---|---:|---|"]
    slurm = m.get("mh_slurm_first_reply_s")
    note = m.get("mh_slurm_note") or r.errors.get("multihost_slurm", "not run")
    lines.append(f"| `SlurmJob.state()` to first reply (s) | {fmt(slurm)} | {note} |")
    if "host_loss_median_ms" in m:
        timeout = m.get("host_loss_heartbeat_timeout_s")
        trials = m.get("host_loss_trials", 0)
        kind = m.get("host_loss_hosts")
        how = f"{HOSTS_HEADING[kind][2:-6]}, {LOSS_HOW[kind]}; " if kind in LOSS_HOW else ""
        lines.append(
            f"| host loss detected, median (ms) | {fmt(m.get('host_loss_median_ms'))} |"
            f" {how}heartbeat_timeout = {timeout:g} s; {trials:.0f} trials |"
        )
        lines.append(
            f"| host loss detected, max (ms) | {fmt(m.get('host_loss_max_ms'))} |"
            f" {how}heartbeat_timeout = {timeout:g} s |"
        )
    else:
        why = r.errors.get("host_loss", "not run")
        lines.append(f"| host loss detected (ms) | - | {why} |")
    return "\n".join(lines)


def render_errors(results: Sequence[SystemResult]) -> str:
    """Return a bullet list of the failed figures, one bullet per system and distinct error."""
    items = []
    for r in results:
        by_error: dict[str, list[str]] = {}
        for figure, error in r.errors.items():
            by_error.setdefault(error, []).append(f"`{figure}`")
        items += [f"- **{r.label}**, {', '.join(figs)}: {err}" for err, figs in by_error.items()]
    return "\n".join(items)


def cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Describe the machine the benchmarks ran on."""
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def render_versions(results: Sequence[SystemResult]) -> str:
    """Return one bullet per system with the versions its program reported."""
    lines = []
    for r in results:
        found = r.meta.get("versions")
        text = (
            ", ".join(f"{k} {v}" for k, v in found.items())
            if found
            else "not reported (its program did not start)"
        )
        lines.append(f"- {r.label}: {text}")
    return "\n".join(lines)


def render_commands(results: Sequence[SystemResult]) -> str:
    """Return the command line each system's program ran with (timing flags omitted)."""
    return "\n".join(f"    {command}" for r in results for command in r.commands)


LEGEND = (
    "↓: lower is better, ↑: higher is better. A ratio is the regency figure divided by the"
    " peer's: on ↓ rows a ratio below 1.00x means regency is faster, on ↑ rows above 1.00x."
    " A dash is a figure that was not measured; the reason is listed below the table."
    " GB is 1e9 bytes, MiB is 2^20 bytes. What each figure measures: benchmarks/README.md."
)


FAULT_LEGEND = (
    "The `fault_detect` figure (`fault_bench.py`, `ray_fault_bench.py`): an actor is blocked in"
    " a 60 s call when its process gets SIGKILL. *Future*: from `os.kill` until the caller's"
    " pending `call_one(...).get()` raises [Ray: `ray.get(ref)`]. *`__supervise__`*: until"
    " `__supervise__` runs in the actor that spawned the victim's procs, by its own wall clock."
    " Ray has no `__supervise__`; its row is the owner actor (the victim's creator) learning of"
    " the death through its own `ray.get` of the victim's pending call raising. The time is that"
    " of the call for the victim's mesh; every failure the owner was given is counted below"
    " (Monarch also reports its proc mesh's internal `logger` mesh). Fresh procs every"
    " trial; Monarch gets 3 trials of each kind (about 10 s each), the others 10. A trial that"
    " waited 30 s in vain counts as 30 s, shown as a lower bound (≥)."
)


RDMA_LEGEND = (
    "The `rdma` figure (`rdma_bench.py`): an owner actor on a fresh proc holds 64 MiB of random"
    " bytes and registers them as an `RDMABuffer`; the controller, another process, times"
    " `buf.read_into(local).get()` and `buf.write_from(local).get()` of the whole buffer: one"
    " untimed warm-up, then the median of 15 (`--quick`: 3), in GB/s (1e9 bytes/s). What arrived"
    " is checked against a SHA-256 of the owner's bytes after the timed reads and after the"
    " timed writes. The baseline is `np.copyto` of 64 MiB within one process (median of as"
    " many), taken by each system's program just before its transfers, so that row also shows"
    " how busy the machine was for each. regency runs each backend forced in turn"
    " (`RDMABuffer(data, backend=...)`) and none forced (*default*, the backend it picked in"
    " brackets); Monarch runs its default, which on a machine without an RDMA NIC is its TCP"
    " fallback. Ray has no equivalent of `RDMABuffer`."
)


def render_header(doc: dict[str, Any], results: Sequence[SystemResult]) -> str:
    """Return the title, the date and duration, and the machine."""
    m = doc["machine"]
    walls = ", ".join(f"{r.label} {r.wall_s:.0f} s" for r in results)
    quick = "\n\n**Quick mode: reduced iteration counts.**" if doc["quick"] else ""
    load = doc.get("load")
    load_line = (
        "\n- 1-minute load average (every process on the machine, the benchmark's included):"
        f" {load['start']:.2f} at the start, peak {load['peak']:.2f}, {load['end']:.2f} at the"
        " end. Other work running alongside slows every system and moves the ratios."
        if load
        else ""
    )
    return f"""# Peer benchmarks: regency vs torchmonarch vs Ray

Generated by `{doc["command"]}` on {doc["date"]} UTC. The whole run took
{doc["total_s"]:.0f} s ({walls}; the rest is the venv check).{quick}

## Machine

- {m["nproc"]} CPUs ({m["cpu"]}), {m["memory_gib"]} GiB memory, Linux {m["kernel"]}
- Everything on localhost; one system at a time, each in its own interpreter and venv.{load_line}"""


SETUP = """The peer venvs come from `bash benchmarks/setup_peers.sh` (it skips a venv that exists):

    python3 -m venv .bench-venvs/monarch
    .bench-venvs/monarch/bin/python -m pip install torch==2.13.0 torchmonarch==0.7.0 numpy
    python3 -m venv .bench-venvs/ray
    .bench-venvs/ray/bin/python -m pip install ray==2.60.0 numpy"""


def render_results_md(doc: dict[str, Any], results: Sequence[SystemResult]) -> str:
    """Return the whole RESULTS.md for a peer run described by ``doc``."""
    sections = [
        render_header(doc, results),
        "## Versions\n\n" + render_versions(results),
        "## Commands\n\n" + SETUP + "\n\nEach system's program, run by `benchmarks/harness.py`"
        " (which adds `--figures` and `--progress` and enforces a timeout per figure):\n\n"
        + render_commands(results),
        "## Results\n\n" + LEGEND + "\n\n" + render_table(results),
        "## Fault detection\n\n"
        + FAULT_LEGEND
        + "\n\n"
        + (render_fault_table(results) or "Not measured in this run.")
        + "\n\n"
        + render_fault_notes(results),
        "## RDMA transfers, 64 MiB\n\n"
        + RDMA_LEGEND
        + "\n\n"
        + (
            render_rdma_table(results)
            + "\n\nAgainst the performance issue's targets:\n\n"
            + render_rdma_targets(results)
            if render_rdma_table(results)
            else "Not measured in this run."
        )
        + "\n\n"
        + render_rdma_notes(results),
        "## Multi-host\n\n"
        + MULTIHOST_LEGEND
        + "\n\n"
        + (render_multihost_table(results) or "Not measured in this run."),
        "## Targets of the core, supervision and performance issues\n\nRatios from this same"
        " run. The peers' figures move by 20-35% between runs on this machine (see "
        "benchmarks/README.md), so a ratio near its bound can land on either side. The "
        "supervision row is an absolute target, met when every trial of both kinds is within "
        "it; the RDMA rows are met when both `read_into` and `write_from` are.\n\n"
        + render_targets(results),
        "## Failed or missing figures\n\n" + (render_errors(results) or "None."),
    ]
    return "\n\n".join(sections) + "\n"
