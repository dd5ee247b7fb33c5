"""The ``regency_dbg>`` prompt: Monarch's ``monarch debug`` commands over the open sessions.

- ``list``: the paused ranks (actor, rank, coordinates, host, function, line);
- ``attach ACTOR RANK``: that rank's ``pdb``; every line goes to it until ``detach``, or until
  it leaves ``pdb`` (``continue``, or its endpoint finished);
- ``cast ACTOR ranks(...) COMMAND``: one ``pdb`` command to several ranks at once (see
  :mod:`regency.observe.debug_ranks`), printing what each answers;
- ``continue``: every paused rank clears its breakpoints and runs on; the client is done;
- ``help``; ``quit`` leaves the ranks paused and ends the client.
"""

from __future__ import annotations

from typing import Protocol

from regency.observe.debug_ranks import RankSpecError, parse_ranks
from regency.observe.debug_sessions import Session, Sessions

BANNER = (
    "************************ REGENCY DEBUGGER ************************\n"
    "Enter 'help' for a list of commands.\n"
    "Enter 'list' to show all active breakpoints.\n\n"
)
PROMPT = "regency_dbg> "
PDB_PROMPT = "(Pdb) "
HELP = """\
Commands:
  list                               the ranks paused in breakpoint()
  attach ACTOR RANK                  talk to that rank's pdb (detach: back here)
  cast ACTOR ranks(SPEC) COMMAND     send one pdb command to several ranks, e.g.
                                       cast trainer ranks(0,1) n
                                       cast trainer ranks(2:7:2) p loss
                                       cast trainer ranks(hosts=1, gpus=0:2) c
                                       cast trainer ranks(:) where
  continue | c                       every paused rank continues; this client ends
  help                               this text
  quit                               leave (the ranks stay paused)
"""
_COLUMNS = ("Actor Name", "Rank", "Coords", "Hostname", "Function", "Line No.")
CAST_TIMEOUT = 30.0
CONTINUE_TIMEOUT = 10.0


class ClientIO(Protocol):
    """The client's terminal, as the prompt sees it."""

    def out(self, text: str) -> None:
        """Show ``text``."""

    def read(self, prompt: str) -> str | None:
        """Show ``prompt`` and read one line; ``None`` once the client is gone."""


def table(sessions: list[Session]) -> str:
    """The ``list`` table."""
    rows = [
        (
            s.info.actor_name,
            str(s.info.rank),
            str(s.info.coords),
            s.info.hostname,
            s.location.function,
            str(s.location.lineno),
        )
        for s in sessions
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+\n"

    def line(cells: tuple[str, ...]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + "|\n"

    return rule + line(_COLUMNS) + rule.replace("-", "=") + "".join(line(r) + rule for r in rows)


def _split_prompt(text: str) -> tuple[str, str]:
    """A rank's output without its trailing ``(Pdb)`` prompt, and the prompt."""
    if text.endswith(PDB_PROMPT):
        return text[: -len(PDB_PROMPT)], PDB_PROMPT
    return text, PDB_PROMPT


class DebugRepl:
    """One client's conversation with the debugger."""

    def __init__(self, sessions: Sessions, io: ClientIO) -> None:
        self._sessions = sessions
        self._io = io

    def run(self) -> None:
        """Serve the client until it quits, continues everything, or goes."""
        self._io.out(BANNER)
        while True:
            line = self._io.read(PROMPT)
            if line is None:
                return
            if not self._command(line.strip()):
                return

    def _command(self, line: str) -> bool:
        """Run one command; False when the client is done."""
        word, _, rest = line.partition(" ")
        if not word:
            return True
        if word in ("quit", "exit", "q"):
            self._io.out("Leaving the debugger; paused ranks stay paused.\n")
            return False
        if word in ("continue", "c"):
            self._continue_all()
            return False
        if word == "list":
            listed = self._sessions.listed()
            self._io.out(table(listed) if listed else "No rank is paused at a breakpoint.\n")
        elif word == "attach":
            self._attach(rest)
        elif word == "cast":
            self._cast(rest)
        elif word in ("help", "h", "?"):
            self._io.out(HELP)
        else:
            self._io.out(f"Unknown command {word!r}; 'help' lists the commands.\n")
        return True

    def _find(self, actor: str, rank_text: str) -> Session | None:
        try:
            rank = int(rank_text)
        except ValueError:
            self._io.out(f"{rank_text!r} is not a rank; usage: attach ACTOR RANK\n")
            return None
        session = self._sessions.find(actor, rank)
        if session is None:
            self._io.out(f"No paused rank {rank} of {actor!r}; 'list' shows them.\n")
        return session

    def _attach(self, rest: str) -> None:
        parts = rest.split()
        if len(parts) != 2:
            self._io.out("usage: attach ACTOR RANK\n")
            return
        session = self._find(*parts)
        if session is None:
            return
        self._io.out(f"Attached to debug session for {session.label}\n")
        self._sessions.wait([session], None)
        while True:
            text, prompt = _split_prompt(self._sessions.take(session))
            self._io.out(text)
            if session.ended is not None:
                self._io.out(f"Detached from debug session for {session.label} ({session.ended})\n")
                return
            line = self._io.read(prompt)
            if line is None:
                return
            if line.strip() == "detach":
                self._io.out(f"Detached from debug session for {session.label}\n")
                return
            self._sessions.send(session, "line", line)
            self._sessions.wait([session], None)

    def _cast(self, rest: str) -> None:
        actor, _, rest = rest.strip().partition(" ")
        spec_text, sep, command = rest.strip().partition(") ")
        if not actor or not sep or not command.strip():
            self._io.out("usage: cast ACTOR ranks(SPEC) COMMAND\n")
            return
        try:
            spec = parse_ranks(spec_text + ")")
        except RankSpecError as exc:
            self._io.out(f"{exc}\n")
            return
        chosen = [
            s
            for s in self._sessions.listed()
            if s.info.actor_name == actor and spec.matches(s.info.rank, s.info.coords)
        ]
        if not chosen:
            self._io.out(f"No paused rank of {actor!r} is in {spec.text}; 'list' shows them.\n")
            return
        self._sessions.wait(chosen, CAST_TIMEOUT)
        for session in chosen:
            self._sessions.take(session)  # what it showed before is not this command's answer
            self._sessions.send(session, "line", command.strip())
        still = self._sessions.wait(chosen, CAST_TIMEOUT)
        for session in chosen:
            text, _ = _split_prompt(self._sessions.take(session))
            prefix = f"[{session.info.actor_name} {session.info.rank}] "
            body = "".join(prefix + line + "\n" for line in text.splitlines())
            if session.ended is not None:
                body += f"{prefix}left pdb ({session.ended})\n"
            self._io.out(body)
        if still:
            ranks = ", ".join(str(s.info.rank) for s in still)
            self._io.out(f"Ranks {ranks} are still running the command after {CAST_TIMEOUT:g} s.\n")

    def _continue_all(self) -> None:
        listed = self._sessions.listed()
        for session in listed:
            self._sessions.send(session, "continue")
        still = self._sessions.wait(listed, CONTINUE_TIMEOUT)
        for session in listed:
            self._sessions.take(session)
        self._io.out(f"Continued {len(listed)} paused rank(s); leaving the debugger.\n")
        if still:
            ranks = ", ".join(f"{s.info.actor_name} {s.info.rank}" for s in still)
            self._io.out(f"Still running (they had breakpoints or long work): {ranks}\n")
