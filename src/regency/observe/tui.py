"""``regency top``: a controller's hosts, procs and actors in the terminal, from its admin API.

A `textual <https://textual.textualize.io>`_ app (the ``tui`` extra) over an
:class:`~regency.observe.admin_client.AdminClient`: the tree with each node's state, refreshed
every ``interval`` seconds, the selected node's details beside it, and keys to show the stacks
of the selected proc (or of an actor's proc), to hide or show stopped and failed nodes, and to
refresh now. Every text from the mesh is shown as text (``rich.text.Text``), never parsed as
markup. Requests run on worker threads, so a slow answer never freezes the screen.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Static, Tree
from textual.widgets.tree import TreeNode

from regency.observe.admin_client import AdminClient, AdminError

Node = dict[str, Any]
ENDED = frozenset({"stopped", "failed"})
_STYLES = {"running": "green", "failed": "bold red", "stopped": "dim", "unknown": "yellow"}


def _state(value: str | None) -> Text:
    name = value or "unknown"
    return Text(name, style=_STYLES.get(name, "yellow"))


def _point(point: dict[str, Any] | None) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in (point or {}).items()) + "}" if point else ""


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def _count(n: Any) -> str:
    return "-" if n is None else str(n)


def host_label(host: Node) -> Text:
    """A host's line in the tree."""
    return Text.assemble("host ", (str(host["address"]), "bold"))


def proc_label(proc: Node) -> Text:
    """A proc's line: its state, mesh, rank and point (and how it ended)."""
    label = Text.assemble(
        _state(proc.get("state")),
        "  proc mesh ",
        (str(proc.get("proc_mesh")), "bold"),
        f" rank {proc.get('rank')} {_point(proc.get('point'))}",
    )
    if proc.get("reason"):
        label.append(f"  {proc['reason']}", style="red")
    return label


def actor_label(actor: Node) -> Text:
    """An actor's line: mesh[rank], state, counts, and the failure's last line."""
    label = Text.assemble(
        (str(actor.get("actor_mesh")), "bold"),
        f"[{actor.get('rank')}] {_point(actor.get('point'))}  ",
        _state(actor.get("state")),
        f"  restarts {_count(actor.get('restarts'))}"
        f"  handled {_count(actor.get('messages_handled'))}"
        f"  mailbox {_count(actor.get('mailbox_depth'))}",
    )
    if actor.get("failure"):
        label.append(f"  {_last_line(str(actor['failure']))}", style="red")
    return label


def details(node: Node) -> Text:
    """Every field of the selected node, one a line, the failure text in full."""
    text = Text()
    text.append(f"{node.get('kind', 'node')} {node.get('ref')}\n", style="bold")
    for key, value in node.items():
        if key in ("hosts", "procs", "actors", "ref", "kind") or value is None:
            continue
        shown = _point(value) if key == "point" else str(value)
        style = "red" if key in ("failure", "reason") else ""
        text.append(f"{key}: ", style="dim")
        text.append(_state(value) if key == "state" else Text(shown, style=style))
        text.append("\n")
    for key in ("hosts", "procs", "actors"):
        if key in node:
            text.append(f"{key}: ", style="dim")
            text.append(f"{len(node[key])}\n")
    return text


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def summary(tree: Node) -> str:
    """Counts of hosts, and of procs and actors by state."""
    procs = [p for h in tree.get("hosts", []) for p in h.get("procs", [])]
    actors = [a for p in procs for a in p.get("actors", [])]

    def tally(nodes: list[Node], what: str) -> str:
        counts: dict[str, int] = {}
        for node in nodes:
            state = node.get("state") or "unknown"
            counts[state] = counts.get(state, 0) + 1
        inner = ", ".join(f"{n} {state}" for state, n in counts.items())
        return _plural(len(nodes), what) + (f" ({inner})" if inner else "")

    hosts = _plural(len(tree.get("hosts", [])), "host")
    return f"{hosts} · {tally(procs, 'proc')} · {tally(actors, 'actor')}"


class TopApp(App[None]):
    """The ``regency top`` screen over the admin API that ``client`` speaks to."""

    TITLE = "regency top"
    CSS = """
    #status { height: auto; padding: 0 1; background: $boost; }
    #main { height: 1fr; }
    #tree { width: 3fr; }
    #side { width: 2fr; border-left: solid $primary; padding: 0 1; }
    #stacks { margin-top: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "stacks", "stacks of proc"),
        Binding("s", "stacks", "stacks of proc", show=False),
        Binding("h", "toggle_ended", "hide/show stopped+failed"),
        Binding("r", "refresh", "refresh"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, client: AdminClient, interval: float = 2.0) -> None:
        super().__init__()
        self._client = client
        self._interval = interval
        self._tree: Node | None = None
        self._shown_key = ""  # what the tree widget shows now, to skip redrawing the same
        self._show_ended = True
        self._hidden = 0
        self._selected: str | None = None
        self._collapsed: set[str] = set()
        self._proc_of: dict[str, Node] = {}  # a proc's or actor's ref -> its proc
        self._error: str | None = None
        self._updated = ""
        self._stacks_ref: str | None = None
        self._fetching = False  # a tree request is on its way

    def compose(self) -> ComposeResult:
        """The status line, the tree and the side panel (details, stacks), the keys."""
        yield Static("connecting…", id="status")
        with Horizontal(id="main"):
            yield Tree[Node]("controller", id="tree")
            with VerticalScroll(id="side"):
                yield Static(id="details")
                yield Static(id="stacks")
        yield Footer()

    def on_mount(self) -> None:
        """Ask for the tree now and every ``interval`` seconds."""
        self.query_one(Tree).focus()
        self.action_refresh()
        self.set_interval(self._interval, self.action_refresh)

    # ---- the tree ---------------------------------------------------------------------

    def action_refresh(self) -> None:
        """Ask the admin API for the tree again, unless the last answer is still to come.

        A slow controller gets one request at a time, and an old answer never replaces a newer.
        """
        if self._fetching:
            return
        self._fetching = True
        self._fetch_tree()

    @work(thread=True, group="tree")
    def _fetch_tree(self) -> None:
        tree: Node | None = None
        error: str | None = "no answer"
        try:
            tree, error = self._client.tree(), None
        except AdminError as exc:
            error = str(exc)
        finally:
            self.call_from_thread(self._got_tree, tree, error)

    def _got_tree(self, tree: Node | None, error: str | None) -> None:
        self._fetching = False
        self._error = error
        if tree is not None:
            self._tree = tree
            self._updated = time.strftime("%H:%M:%S")
            self._draw_tree()
        self._draw_status()

    def action_toggle_ended(self) -> None:
        """Hide or show the stopped and failed procs and actors."""
        self._show_ended = not self._show_ended
        self._draw_tree()
        self._draw_status()

    def _visible(self, node: Node) -> bool:
        return self._show_ended or node.get("state") not in ENDED

    def _draw_tree(self) -> None:
        if self._tree is None:
            return
        key = json.dumps([self._tree, self._show_ended], sort_keys=True)
        if key == self._shown_key:
            return
        self._shown_key = key
        widget: Tree[Node] = self.query_one(Tree)
        widget.clear()
        widget.root.set_label(Text(f"controller pid {self._tree.get('pid')}", style="bold"))
        widget.root.data = self._tree
        self._proc_of, self._hidden = {}, 0
        for host in self._tree.get("hosts", []):
            branch = widget.root.add(host_label(host), data=host, expand=self._open(host))
            for proc in host.get("procs", []):
                self._proc_of[proc["ref"]] = proc
                actors = [a for a in proc.get("actors", []) if self._visible(a)]
                if not self._visible(proc):
                    self._hidden += 1 + len(proc.get("actors", []))
                    continue
                self._hidden += len(proc.get("actors", [])) - len(actors)
                leaf = branch.add(proc_label(proc), data=proc, expand=self._open(proc))
                for actor in actors:
                    self._proc_of[actor["ref"]] = proc
                    leaf.add_leaf(actor_label(actor), data=actor)
        widget.root.expand()
        self._restore_cursor(widget)

    def _open(self, node: Node) -> bool:
        return node["ref"] not in self._collapsed

    def _restore_cursor(self, widget: Tree[Node]) -> None:
        order = _display_order(widget.root)
        line = next(
            (i for i, node in enumerate(order) if (node.data or {}).get("ref") == self._selected),
            0,
        )
        widget.cursor_line = line  # set even when unchanged: the node on that line is new
        data = order[line].data
        if data is not None:
            self._show_details(data)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[Node]) -> None:
        """Show the details of the node under the cursor."""
        if event.node.data is not None:
            self._selected = event.node.data.get("ref")
            self._show_details(event.node.data)

    def on_tree_node_collapsed(self, event: Tree.NodeCollapsed[Node]) -> None:
        """Keep a collapsed node collapsed across refreshes."""
        if event.node.data is not None:
            self._collapsed.add(event.node.data["ref"])

    def on_tree_node_expanded(self, event: Tree.NodeExpanded[Node]) -> None:
        """Keep an expanded node expanded across refreshes."""
        if event.node.data is not None:
            self._collapsed.discard(event.node.data["ref"])

    def _show_details(self, node: Node) -> None:
        self.query_one("#details", Static).update(details(node))

    def _draw_status(self) -> None:
        text = Text()
        if self._tree is not None:
            text.append(
                f"controller pid {self._tree.get('pid')} · job {self._tree.get('job_id')} · "
                f"{self._client.url}\n"
            )
            text.append(summary(self._tree))
            if self._hidden:
                text.append(f" · {self._hidden} stopped/failed hidden (h shows)", style="yellow")
            text.append(f" · updated {self._updated}", style="green")
        if self._error is not None:
            text.append(f"\n{self._error}", style="bold red")
            if self._tree is not None:
                text.append(" (showing the last answer)", style="red")
        self.query_one("#status", Static).update(text)

    # ---- stacks -------------------------------------------------------------------------

    def action_stacks(self) -> None:
        """Show the stacks of the selected proc, or of the selected actor's proc."""
        proc = self._proc_of.get(self._selected or "")
        panel = self.query_one("#stacks", Static)
        if proc is None:
            panel.update(Text("Select a proc or an actor, then press p for its stacks.", "yellow"))
            return
        self._stacks_ref = proc["ref"]
        title = f"Stacks of proc mesh {proc.get('proc_mesh')} rank {proc.get('rank')}\n"
        if proc.get("state") in ENDED:
            reason = f": {proc['reason']}" if proc.get("reason") else ""
            panel.update(Text(f"{title}No stacks: the proc has {proc['state']}{reason}."))
            return
        panel.update(Text(f"{title}Fetching the stacks…", style="dim"))
        self._fetch_stacks(proc["ref"], title)

    @work(thread=True, exclusive=True, group="stacks")
    def _fetch_stacks(self, ref: str, title: str) -> None:
        try:
            text = self._client.stacks(ref)
        except AdminError as exc:
            text = f"Cannot get the stacks: {exc}"
        self.call_from_thread(self._got_stacks, ref, title, text)

    def _got_stacks(self, ref: str, title: str, text: str) -> None:
        if ref == self._stacks_ref:  # not one asked for before the latest
            self.query_one("#stacks", Static).update(Text.assemble((title, "bold"), text))


def _display_order(node: TreeNode[Node]) -> list[TreeNode[Node]]:
    """The nodes in the order the tree shows them (its root shown, collapsed ones closed)."""
    order = [node]
    if node.is_expanded:
        for child in node.children:
            order.extend(_display_order(child))
    return order
