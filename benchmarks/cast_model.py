"""A discrete-event model of a cast and a gather down regency's casting tree.

The tree is the one ``regency._runtime.kernel.casting.plan`` builds: the sender splits its
destinations (procs in rank order, ``per_host`` consecutive ones on each host) into at most
``fanout`` contiguous groups of near-equal size and sends once to each group's head with the rest
attached; every head does the same with its rest, then delivers to its own actor. For a gather
each head merges its own reply with its children's merged replies and sends one message up.
Casts to more than ``fanout`` destinations are acknowledged (``forwards.py``): every child of a
head acknowledges (a leaf at once, a head once its children did), and so do the root's children
that are heads; acknowledgements leave at most once per ``ACK_DELAY``.

Every process (the controller and each proc) runs its jobs one at a time, FIFO; a job also needs
one of its machine's cores. A frame between hosts costs ``tls`` more CPU at both ends. In
``cluster`` mode every host has its own cores (``per_host + 1``, the controller its own
machine); in ``machine`` mode all processes share ``cores`` (this 2-core machine). Per-hop costs
(:class:`Costs`, seconds) are CPU jobs except the links, which are pure delay.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = -1  # the controller's node id
ACK_DELAY = 0.01  # forwards.ACK_DELAY: acknowledgements leave at most this often per parent


@dataclass(frozen=True)
class Costs:
    """Per-hop costs in seconds: CPU of one job, or the delay of one link."""

    prepare: float  # the controller, once per cast: plan and encode the message
    send: float  # one frame out of a process (encode the routing, write; TLS is in ``tls``)
    recv: float  # one frame into a process (read, decode, route)
    forward: float  # a head, per frame it passes on, besides its ``send`` (plan, keep for ack)
    deliver: float  # a destination's actor runs the message (and, for a call, makes its reply)
    merge: float  # a head or the controller, per child reply it merges
    assemble: float  # per value a merged reply carries, at its receiver (and the ValueMesh's)
    route: float  # per destination a cast frame carries, or value a reply carries, at its sender
    ack: float  # one acknowledgement, at its sender and again at its receiver
    tls: float  # a frame between hosts, at its sender and again at its receiver (TLS records)
    link_local: float  # delay of one hop between processes of one host (unix socket)
    link_tls: float  # delay of one hop between hosts (TCP), besides the CPU of ``tls``


@dataclass(frozen=True)
class Shape:
    """Which cluster: hosts, procs per host, the cast fan-out and how cores are shared."""

    hosts: int
    per_host: int
    fanout: int = 16
    mode: str = "cluster"  # "cluster": cores per host; "machine": ``cores`` shared by everyone
    cores: int = 2

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.per_host < 1:
            raise ValueError(f"a shape needs >= 1 host and proc, not {self.hosts}x{self.per_host}")
        if self.fanout < 2:
            raise ValueError(f"the cast fan-out must be >= 2, not {self.fanout}")
        if self.mode not in ("cluster", "machine"):
            raise ValueError(f"mode is 'cluster' or 'machine', not {self.mode!r}")
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, not {self.cores}")

    @property
    def procs(self) -> int:
        """Destinations of a cast to every proc."""
        return self.hosts * self.per_host

    def host_of(self, node: int) -> int:
        """The host a node runs on (the controller: -1, a machine of its own)."""
        return ROOT if node == ROOT else node // self.per_host


def plan(dests: list[int], fanout: int) -> list[tuple[int, list[int]]]:
    """``casting.plan``: at most ``fanout`` (head, rest) groups of near-equal size, in order."""
    if len(dests) <= fanout:
        return [(d, []) for d in dests]
    base, extra = divmod(len(dests), fanout)
    groups, start = [], 0
    for i in range(fanout):
        size = base + (1 if i < extra else 0)
        groups.append((dests[start], dests[start + 1 : start + size]))
        start += size
    return groups


def build_tree(n: int, fanout: int) -> dict[int, list[int]]:
    """Children of every node of the tree over destinations ``0..n-1`` (root: :data:`ROOT`)."""
    children: dict[int, list[int]] = {ROOT: []}
    todo = [(ROOT, list(range(n)))]
    while todo:
        parent, dests = todo.pop()
        for head, rest in plan(dests, fanout):
            children[parent].append(head)
            children[head] = []
            todo.append((head, rest))
    return children


def depth(children: dict[int, list[int]]) -> int:
    """Hops from the controller to the deepest destination."""
    best, todo = 0, [(ROOT, 0)]
    while todo:
        node, level = todo.pop()
        best = max(best, level)
        todo.extend((child, level + 1) for child in children[node])
    return best


@dataclass
class _Process:
    """One process: its FIFO of jobs and whether one runs."""

    pool: int
    queue: list[tuple[float, Callable[[float], None]]] = field(default_factory=list)
    busy: bool = False


class Simulation:
    """Jobs on processes that run one at a time, each needing a core of its pool; delays."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._procs: dict[int, _Process] = {}
        self._free: dict[int, int] = {}
        self._waiting: dict[int, list[int]] = {}  # pool -> processes ready for a core, FIFO
        self.cpu: dict[int, float] = {}  # node -> the CPU its jobs took

    def _pool(self, node: int) -> int:
        return 0 if self.shape.mode == "machine" else self.shape.host_of(node)

    def _process(self, node: int) -> _Process:
        if node not in self._procs:
            pool = self._pool(node)
            self._procs[node] = _Process(pool)
            if pool not in self._free:
                cores = (
                    self.shape.per_host + 1 if self.shape.mode == "cluster" else self.shape.cores
                )
                self._free[pool], self._waiting[pool] = cores, []
        return self._procs[node]

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` at time ``when``."""
        heapq.heappush(self._events, (when, next(self._seq), action))

    def job(self, node: int, cost: float, then: Callable[[float], None]) -> None:
        """Queue ``cost`` seconds of CPU on ``node``; ``then(finish_time)`` when it ran."""
        process = self._process(node)
        process.queue.append((cost, then))
        if not process.busy and len(process.queue) == 1:
            self._ready(node, process)

    def _ready(self, node: int, process: _Process) -> None:
        process.busy = True
        self._waiting[process.pool].append(node)
        self._dispatch(process.pool)

    def _dispatch(self, pool: int) -> None:
        while self._free[pool] and self._waiting[pool]:
            node = self._waiting[pool].pop(0)
            self._free[pool] -= 1
            cost, then = self._procs[node].queue.pop(0)
            self.cpu[node] = self.cpu.get(node, 0.0) + cost
            self.at(self.now + cost, lambda n=node, t=then: self._finish(n, t))

    def _finish(self, node: int, then: Callable[[float], None]) -> None:
        process = self._procs[node]
        self._free[process.pool] += 1
        process.busy = False
        then(self.now)
        if process.queue and not process.busy:
            self._ready(node, process)
        self._dispatch(process.pool)

    def run(self) -> float:
        """Run every event; the time of the last."""
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action()
        return self.now


@dataclass(frozen=True)
class Outcome:
    """What one modelled cast took: to the last delivery, and (for a call) to the ValueMesh."""

    delivered: float
    gathered: float
    depth: int
    controller_frames: int
    controller_cpu: float  # the controller's CPU for the call, acknowledgements included


def simulate(shape: Shape, costs: Costs) -> Outcome:
    """One ``call`` to every proc of ``shape``: when the last actor ran it, when the controller
    held the ValueMesh (a broadcast's latency is ``delivered``)."""
    children = build_tree(shape.procs, shape.fanout)
    acked = shape.procs > shape.fanout
    sim = Simulation(shape)
    delivered: list[float] = []
    pending = {node: len(kids) + (0 if node == ROOT else 1) for node, kids in children.items()}
    parent = {kid: node for node, kids in children.items() for kid in kids}
    done: list[float] = []

    def link(a: int, b: int) -> float:
        same = shape.host_of(a) == shape.host_of(b)
        return costs.link_local if same else costs.link_tls

    def tls(a: int, b: int) -> float:
        return 0.0 if shape.host_of(a) == shape.host_of(b) else costs.tls

    def send(node: int, kids: list[int], extra: float) -> None:
        for kid in kids:
            cost = costs.send + extra + tls(node, kid) + costs.route * size[kid]
            sim.job(node, cost, lambda t, k=kid: sim.at(t + link(node, k), arrive(k)))

    def arrive(node: int) -> Callable[[], None]:
        def received(_: float) -> None:
            send(node, children[node], costs.forward)
            sim.job(node, costs.deliver, lambda t: (delivered.append(t), reply_part(node)))
            if acked and (children[node] or parent[node] != ROOT):
                wait = ACK_DELAY if not children[node] else ACK_DELAY * depth_below[node]
                sim.at(sim.now + wait, lambda: sim.job(node, costs.ack, lambda _: None))
                sim.at(sim.now + wait, lambda: sim.job(parent[node], costs.ack, lambda _: None))

        up = parent[node]
        return lambda: sim.job(node, costs.recv + tls(up, node), received)

    def reply_part(node: int) -> None:
        pending[node] -= 1
        if pending[node]:
            return
        if node == ROOT:
            done.append(sim.now)
            return
        up, values = parent[node], size[node]
        hop = tls(node, up)
        took = costs.recv + hop + costs.merge + costs.assemble * values
        sim.job(
            node,
            costs.send + hop + costs.route * values,
            lambda t: sim.at(t + link(node, up), lambda: sim.job(up, took, merged(up))),
        )

    def merged(node: int) -> Callable[[float], None]:
        return lambda _: reply_part(node)

    depth_below = _heights(children)
    size = _sizes(children)
    sim.job(ROOT, costs.prepare, lambda _: send(ROOT, children[ROOT], 0.0))
    sim.run()
    return Outcome(max(delivered), done[0], depth(children), len(children[ROOT]), sim.cpu[ROOT])


def _sizes(children: dict[int, list[int]]) -> dict[int, int]:
    """Destinations in each node's subtree, itself included (the controller: all of them)."""
    sizes: dict[int, int] = {}

    def size(node: int) -> int:
        if node not in sizes:
            sizes[node] = (node != ROOT) + sum(map(size, children[node]))
        return sizes[node]

    for node in children:
        size(node)
    return sizes


def _heights(children: dict[int, list[int]]) -> dict[int, int]:
    """Levels below each node (a leaf: 0)."""
    heights: dict[int, int] = {}

    def height(node: int) -> int:
        if node not in heights:
            heights[node] = 1 + max(map(height, children[node])) if children[node] else 0
        return heights[node]

    for node in children:
        height(node)
    return heights
