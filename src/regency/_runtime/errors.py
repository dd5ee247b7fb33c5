"""Errors a caller sees: :class:`ActorError` for a remote exception, :class:`SupervisionError` for
a mesh that is unhealthy (crashed, stopped or unreachable).

Hierarchy::

    Exception
    ├── ActorError              an endpoint raised; the actor lives on
    └── RuntimeError
        └── SupervisionError    the target actor, proc or host failed or stopped
"""

from __future__ import annotations

import traceback
from typing import Any


class ActorError(Exception):
    """An exception raised inside a remote endpoint (or actor constructor).

    ``exception`` is the original exception when it could be carried over (else ``None``),
    ``message`` says which call failed and ``exception_formatted`` is the remote traceback,
    including its ``__cause__``/``__context__`` chain.
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
            exception_formatted = "".join(traceback.format_exception(exception))
        self.exception_formatted = exception_formatted or ""
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return (
            f"{self.message}\nTraceback of where the remote call failed "
            f"(most recent call last):\n{self.exception_formatted}"
        )

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
    except Exception:
        return None
    return exc


class SupervisionError(RuntimeError):
    """A call could not complete because its target mesh is unhealthy.

    ``endpoint`` names the call (``mesh.method``) when known.
    """

    def __init__(self, message: str, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint

    def __reduce__(self) -> tuple[Any, ...]:
        return (SupervisionError, (str(self), self.endpoint))
