"""The errors the tensor engine raises on the controller."""

from __future__ import annotations

from typing import Any, Protocol

from regency._errors import RegencyError


class RemoteException(RegencyError):  # noqa: N818 - Monarch's name
    """A command failed on a worker: its text has the controller call site that issued it,
    the worker's traceback and the rank. Raised by a fetch of the failed value (or of anything
    computed from it) and, for errors nobody fetched, when ``activate()`` exits."""

    def __init__(self, message: str, rank: int, site: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.site = site

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in an actor (a poisoned argument), it travels back inside the ActorError.
        return (RemoteException, (str(self), self.rank, self.site))


class Failure(Protocol):
    """What a worker reports of a failed command (``table.Poisoned``)."""

    @property
    def rank(self) -> int:
        """The rank it failed on."""

    @property
    def text(self) -> str:
        """The worker's traceback."""


def remote_text(failure: Failure, site: str) -> str:
    """The text of a ``RemoteException``: the rank, the controller call site ``site`` and the
    worker's traceback."""
    return (
        f"A remote command failed on rank {failure.rank}.\n"
        f"Controller call site:\n  {site}\n"
        f"Worker traceback (rank {failure.rank}):\n{failure.text.rstrip()}"
    )


class DataDependentError(RegencyError, RuntimeError):
    """A value was needed on the controller that only the workers know."""


def data_dependent(what: str) -> DataDependentError:
    """The error for ``.item()``, ``bool(t)``, ``.tolist()`` and data-dependent shapes."""
    return DataDependentError(
        f"{what} needs the data of a mesh tensor, which lives on the workers: the controller "
        "knows only shapes and dtypes. Fetch the value first: regency.inspect(t, **coords) "
        "(or regency.fetch_shard(t, **coords).get()) returns a local torch.Tensor."
    )


def misuse(case: str, detail: str) -> TypeError:
    """A ``TypeError`` naming one of Monarch's misuse cases (``LOCAL_TENSOR``, ``WRONG_MESH``,
    ``DROPPED``, ``WRONG_STREAM``, ``BORROWED``, ``MUTATING_BORROW``)."""
    return TypeError(f"{case}: {detail}")
