"""regency's modules import each other without circles and only downwards.

The graph is read from the source with ``ast``, so every import counts: module level,
function-local and ``if TYPE_CHECKING:`` ones. A lower layer that needs something from a higher
one gets it through a callback the higher one registers or a Protocol it implements.

The layers, lowest first (a module may import its own layer and those below it):

    base      shape, _transport, _humantime, _config_keys, _errors, _public, _hooks, the
              ``regency`` package (the composition root: it registers the hooks' loaders)
    config    regency.config
    kernel    _runtime/kernel/   the per-process router; knows no actors
    actors    _runtime/actors/   its sub-packages, lowest first: base, control, observe,
                                 supervision, execution, meshes
    host      _runtime/host/     controller, bootstrap, zygote, launcher, host agent, worker
    entry     regency._runtime and its ``python -m regency._runtime.bootstrap`` entry
    face      regency._lowlevel  the extension face over the three runtime layers
    public    four tiers, lowest first: observe; actor; rdma, spmd, the tensor engine (tensor
              over _tensor), remotemount; job, gather_mount. No sideways imports inside a tier.
    apps      cli, ``python -m regency``

Where a lower layer must call up, it calls a typed hook of ``regency._hooks`` (a Protocol),
whose loader the ``regency`` package registers: the only upward imports, each function-local.
The packages built on the runtime (rdma, job, spmd, observe, the tensor engine) import nothing of
``regency._runtime`` but through ``regency._lowlevel``, and of ``regency._transport`` only its
face (TRANSPORT_FACE); ``regency.actor``, the runtime's public face, and the CLI may.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "regency"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the innermost package or module that defines it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]
) -> list[str]:
    """The dotted names an import statement loads, relative ones made absolute."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    # ``from pkg import name`` loads the submodule pkg.name when there is one, else pkg itself.
    return [
        f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
        for alias in node.names
    ]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, name, path.name == "__init__.py", modules):
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
                owner = _owner(target, modules)
                if owner is not None and owner != name:
                    graph[name].add(owner)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, imports in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(imports)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert len(graph) > 100
    # module level, function-local and TYPE_CHECKING imports all appear
    assert "regency._runtime.kernel.state" in graph["regency._runtime.kernel.waiting"]
    assert "regency.actor._attach" in graph["regency.actor"]  # function-local (Monarch's names)
    # TYPE_CHECKING
    assert "regency._runtime.actors.base.future" in graph["regency._runtime.actors.base.mesh_trait"]


def test_circles_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    found = circles(import_graph())
    report = "\n".join(f"circle of {len(c)}: {', '.join(c)}" for c in found)
    assert not found, f"import circles in src/{PACKAGE}:\n{report}"


# The public tier, lowest first: each tier a list of groups; a group imports its own tier's
# other groups neither at module level nor lazily (no sideways imports), only tiers below.
PUBLIC_TIERS: list[tuple[str, list[tuple[str, ...]]]] = [
    # below regency.actor, which offers telemetry's and the debugger's names
    ("observe", [("regency.observe",)]),
    ("actor", [("regency.actor",)]),
    (
        "built on actor",
        [
            ("regency.rdma",),
            ("regency.spmd",),
            (
                "regency.tensor",
                "regency._tensor",
                "regency.mesh_controller",
                "regency.random",
                "regency.gradient",
                "regency.gradient_generator",
                "regency.builtins",
                "regency.timer",
            ),
            ("regency.remotemount",),
        ],
    ),
    ("jobs and mounts", [("regency.job",), ("regency.gather_mount",)]),
]
# What of regency._transport the public tier may use: its second face, beside regency._lowlevel
# (addresses, TLS streams, the job secret's checks, deadlines, listeners' admission and rate
# limits), for rdma's own listener, the worker daemon's secret (job, spmd) and peer checks.
TRANSPORT_FACE = frozenset(
    {
        "regency._transport.address",
        "regency._transport.auth",
        "regency._transport.connection",
        "regency._transport.deadline",
        "regency._transport.inbound",
        "regency._transport.io_loop",
        "regency._transport.peer_identity",
        "regency._transport.ratelimit",
        "regency._transport.ratelog",
        "regency._transport.tls",
    }
)
TRANSPORT = "regency._transport"


# Lowest first. A name stands for that module and everything under it, except those in _EXACT.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "regency",
            "regency.shape",
            "regency._transport",
            "regency._humantime",
            "regency._config_keys",
            "regency._errors",
            "regency._public",
            "regency._private_paths",
            "regency._hooks",
        ),
    ),
    ("config", ("regency.config",)),
    ("kernel", ("regency._runtime.kernel",)),
    # the actor layer's sub-packages, lowest first
    ("actors", ("regency._runtime.actors",)),
    ("actors.base", ("regency._runtime.actors.base",)),
    ("actors.control", ("regency._runtime.actors.control",)),
    ("actors.observe", ("regency._runtime.actors.observe",)),
    ("actors.supervision", ("regency._runtime.actors.supervision",)),
    ("actors.execution", ("regency._runtime.actors.execution",)),
    ("actors.meshes", ("regency._runtime.actors.meshes",)),
    ("host", ("regency._runtime.host",)),
    ("entry", ("regency._runtime", "regency._runtime.bootstrap")),
    ("face", ("regency._lowlevel",)),
    *[(tier, tuple(name for group in groups for name in group)) for tier, groups in PUBLIC_TIERS],
    ("apps", ("regency.cli", "regency.__main__")),
]
# Packages whose name alone is listed: a new module directly in them must be given a layer.
_EXACT = {"regency", "regency._runtime"}
# Built on the runtime: they reach it only through the extension face.
FACE_ONLY = (
    "regency.rdma",
    "regency.job",
    "regency.spmd",
    "regency.tensor",
    "regency._tensor",
    "regency.builtins",
    "regency.timer",
    "regency.random",
    "regency.gradient",
    "regency.gradient_generator",
    "regency.observe",
    "regency.remotemount",
    "regency.gather_mount",
)
RUNTIME = "regency._runtime"
# (importer, imported) pairs allowed against FACE_ONLY, each with its reason. None today.
FACE_EXCEPTIONS: dict[tuple[str, str], str] = {}
# The composition root's hook loaders (regency/__init__.py, for regency._hooks): the only imports
# allowed upwards besides Monarch's top-level tensor names, each function-local, by hook name.
HOOK_LOADERS: dict[str, str] = {
    "tensor": "regency._tensor.api",
    "debugger": "regency.observe.pdb_session",
    "telemetry": "regency.observe.telemetry.switch",
    "boot": "regency._runtime.host.controller",
    "proc_mesh": "regency._runtime.actors.meshes.meshes",
    "fault_hook": "regency.actor",
    "hosts_from_config": "regency.job",
}
# (importer, imported) pairs allowed upwards, each with its reason.
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("regency", "regency.tensor"): "Monarch's top-level tensor names (regency.inspect, ...), "
    "imported by the package's __getattr__ on first use only, so `import regency` stays torch-free",
    **{
        ("regency", target): f"the composition root's loader of the {hook!r} hook "
        "(regency._hooks), imported on first use only, so the runtime never names it"
        for hook, target in HOOK_LOADERS.items()
    },
}


def _within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer ``module`` belongs to (the longest name that covers it)."""
    best: tuple[int, int] | None = None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name if name in _EXACT else _within(module, name)
            if covers and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def group_of(module: str) -> tuple[str, ...] | None:
    """The public group (of PUBLIC_TIERS) ``module`` belongs to, if any."""
    best: tuple[int, tuple[str, ...]] | None = None
    for _, groups in PUBLIC_TIERS:
        for group in groups:
            for name in group:
                if _within(module, name) and (best is None or len(name) > best[0]):
                    best = (len(name), group)
    return None if best is None else best[1]


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the declared layers, as readable lines."""
    found = []
    for module in sorted(graph):
        here = layer_of(module)
        if here is None:
            found.append(f"{module} is in no layer (add it to LAYERS)")
            continue
        for target in sorted(graph[module]):
            there = layer_of(target)
            if there is not None and there > here and (module, target) not in UPWARD_EXCEPTIONS:
                found.append(
                    f"{module} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]}) above it"
                )
            if (
                any(_within(module, p) for p in FACE_ONLY)
                and _within(target, RUNTIME)
                and (module, target) not in FACE_EXCEPTIONS
            ):
                found.append(f"{module} imports {target}: use regency._lowlevel instead")
            if (
                any(_within(module, p) for p in (*FACE_ONLY, "regency.cli"))
                and _within(target, TRANSPORT)
                and target not in TRANSPORT_FACE
            ):
                found.append(f"{module} imports {target}: not in the transport's face")
            mine, theirs = group_of(module), group_of(target)
            if here == there and mine is not None and theirs is not None and mine != theirs:
                found.append(f"{module} imports {target} beside it ({LAYERS[here][0]}): sideways")
    return found


def test_layers_catch_an_import_upwards_sideways_and_past_the_faces() -> None:
    graph = {
        "regency._runtime.kernel.router": {"regency._runtime.actors.execution.instance"},
        "regency._runtime.actors.execution.instance": {"regency._runtime.kernel.router"},
        "regency._runtime.actors.base.identity": {"regency._runtime.actors.meshes.meshes"},
        "regency.rdma._engine": {"regency._runtime.kernel.state", "regency._lowlevel"},
        "regency._runtime.stray": set(),
        "regency.job._exec": {"regency.actor"},
        "regency.actor": {"regency.job"},
        "regency.spmd._launch": {"regency.rdma", "regency._transport.framing", "regency.tensor"},
    }
    assert violations(graph) == [
        "regency._runtime.actors.base.identity (actors.base) imports"
        " regency._runtime.actors.meshes.meshes (actors.meshes) above it",
        "regency._runtime.kernel.router (kernel) imports"
        " regency._runtime.actors.execution.instance (actors.execution) above it",
        "regency._runtime.stray is in no layer (add it to LAYERS)",
        "regency.actor (actor) imports regency.job (jobs and mounts) above it",
        "regency.rdma._engine imports regency._runtime.kernel.state: use regency._lowlevel instead",
        "regency.spmd._launch imports regency._transport.framing: not in the transport's face",
        "regency.spmd._launch imports regency.rdma beside it (built on actor): sideways",
        "regency.spmd._launch imports regency.tensor beside it (built on actor): sideways",
    ]


def test_every_import_follows_the_layers() -> None:
    found = violations(import_graph())
    assert not found, "imports against the layers:\n" + "\n".join(found)


def _hook_names() -> set[str]:
    """The hooks ``regency._hooks`` declares (its module-level ``Hook`` instances), by name."""
    tree = ast.parse((SRC / PACKAGE / "_hooks.py").read_text(encoding="utf-8"))
    return {
        node.target.id
        for node in tree.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(node.annotation, ast.Subscript)
        and isinstance(node.annotation.value, ast.Name)
        and node.annotation.value.id == "Hook"
    }


def test_the_composition_root_registers_every_hook_and_imports_up_only_in_its_loaders() -> None:
    tree = ast.parse((SRC / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    registered = {
        node.func.value.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "register"
        and isinstance(node.func.value, ast.Attribute)
        and isinstance(node.func.value.value, ast.Name)
        and node.func.value.value.id == "_hooks"
    }
    assert registered == _hook_names() == set(HOOK_LOADERS)
    # the loaders' imports run on first use only: none at module level
    top_level = {
        alias.name
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
        if isinstance(node, ast.Import)
    } | {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert not top_level & set(HOOK_LOADERS.values())


def test_each_runtime_layer_calls_up_through_the_typed_hooks() -> None:
    graph = import_graph()
    callers = {m for m in graph if _within(m, RUNTIME) and "regency._hooks" in graph[m]}
    assert {
        "regency._runtime.kernel.state",  # boot
        "regency._runtime.actors.base.identity",  # proc_mesh
        "regency._runtime.actors.supervision.supervision",  # fault_hook
        "regency._runtime.actors.meshes.send_pipeline",  # tensor
        "regency._runtime.actors.observe.breakpoints",  # debugger
        "regency._runtime.host.worker_daemon",  # telemetry
    } <= callers
