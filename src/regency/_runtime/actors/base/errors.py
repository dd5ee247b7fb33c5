"""Errors a caller sees: :class:`ActorError` for a remote exception, :class:`SupervisionError` for
a mesh that is unhealthy (crashed, stopped or unreachable).

Hierarchy (both under :class:`regency.RegencyError`; the whole tree is drawn in
:mod:`regency._errors`)::

    Exception
    └── RegencyError
        ├── ActorError                          an endpoint raised; the actor lives on
        └── SupervisionError  (+ RuntimeError)  the target actor, proc or host failed or stopped
"""

from __future__ import annotations

import re
import textwrap
import traceback
from typing import Any

from regency._errors import RegencyError

_REMOTE_TRACEBACK = "Traceback of where the remote call failed (most recent call last):"


class ActorError(RegencyError):
    """An exception raised inside a remote endpoint (or actor constructor).

    ``exception`` is the original exception when it could be carried over (else ``None``),
    ``message`` says which call failed (``Actor call {mesh}.{method} failed.``) and
    ``exception_formatted`` is the remote traceback, including its ``__cause__``/``__context__``
    chain, each ``Traceback`` line reading "Traceback of where the remote call failed" as in
    Monarch.
    """

    def __init__(
        self,
        exception: BaseException | None,
        message: str = "A remote actor call has failed.",
        exception_formatted: str | None = None,
    ) -> None:
        self.exception = exception
        self.message = message
        if exception_formatted is None and exception is not None:
            exception_formatted = "".join(
                line.replace("Traceback (most recent call last):", _REMOTE_TRACEBACK)
                for line in traceback.format_exception(exception)
            )
        self.exception_formatted = exception_formatted or ""
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}\n {self.exception_formatted}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_actor_error,
            (_portable(self.exception), self.message, self.exception_formatted),
        )


def _rebuild_actor_error(
    exception: BaseException | None, message: str, formatted: str
) -> ActorError:
    return ActorError(exception, message, formatted)


def _portable(exc: BaseException | None) -> BaseException | None:
    """The exception itself if it survives pickling, else ``None`` (its text is kept anyway)."""
    if exc is None:
        return None
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
    except BaseException:  # a __reduce__ raising SystemExit, a KeyboardInterrupt unpickling
        return None
    return exc


def failed_text(actor: str, reason: str, detail: str = "") -> str:
    """Monarch's account of a failed actor, its reason indented below, then regency's detail."""
    text = f"The actor {actor} and all its descendants have failed:\n{_indent(reason)}"
    return f"{text}\n  ({detail})" if detail else text


def stopped_text(actor: str, reason: str, detail: str = "") -> str:
    """Monarch's account of a stopped actor, then regency's detail."""
    text = f"Supervision event: actor {actor} has status:\n{_indent(f'stopped: {reason}')}"
    return f"{text}\n  ({detail})" if detail else text


def process_failed(reason: str) -> str:
    """How Monarch words a proc's end: "exited with non-zero code 3", "failed: Killed(sig=9)".

    Only the exit status is translated (what the host agent adds after it, such as where the
    proc's output is, is left to the caller's detail, which quotes the whole reason)."""
    exited = re.match(r"exited with code (-?\d+)\b", reason)
    if exited is not None:
        return f"exited with non-zero code {exited.group(1)}"
    killed = re.match(r"killed by signal \w+ \((\d+)\)", reason)
    if killed is not None:
        return f"failed: Killed(sig={killed.group(1)})"
    return f"failed: {reason}"


def _indent(text: str) -> str:
    return textwrap.indent(text, "  ", lambda line: True)


class SupervisionError(RegencyError, RuntimeError):
    """A call could not complete because its target mesh is unhealthy.

    ``endpoint`` names the call (``mesh.method``) when known.
    """

    def __init__(self, message: str, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __reduce__(self) -> tuple[Any, ...]:
        return (SupervisionError, (str(self), self.endpoint))
