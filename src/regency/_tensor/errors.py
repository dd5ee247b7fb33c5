"""The errors the tensor engine raises on the controller."""

from __future__ import annotations


class RemoteException(Exception):  # noqa: N818 - Monarch's name
    """A command failed on a worker: its text has the controller call site that issued it,
    the worker's traceback and the rank. Raised by a fetch of the failed value (or of anything
    computed from it) and, for errors nobody fetched, when ``activate()`` exits."""

    def __init__(self, message: str, rank: int, site: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.site = site


class DataDependentError(RuntimeError):
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
