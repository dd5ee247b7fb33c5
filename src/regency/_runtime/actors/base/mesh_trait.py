"""Operations every mesh shares (host, proc, actor and value meshes): slicing and reshaping."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from regency._errors import RegencyError
from regency.shape import Extent, Shape

if TYPE_CHECKING:
    from regency._runtime.actors.base.future import Future

M = TypeVar("M", bound="MeshTrait")
T = TypeVar("T")


class EmptySliceError(RegencyError, IndexError, ValueError):
    """A mesh slice that selects nothing (``slice(gpus=slice(1, 1))``, or past the end).

    An ``IndexError``, as an int index past the end raises, and a ``ValueError``, which is what
    Monarch raises for it (with the same text: ``empty range 1:1:1``, ``out of range 2:2:1 for
    dimension gpus of size 2``).
    """


def _empty_text(shape: Shape, dims: dict[str, Any]) -> str:
    """Monarch's words for the first dimension of ``dims`` whose selection is empty."""
    sizes = shape.sizes
    for label, given in dims.items():
        if isinstance(given, range):
            chosen = builtins.slice(given.start, given.stop, given.step)
        elif isinstance(given, builtins.slice):
            chosen = given
        else:
            continue
        size = sizes[label]
        selected = range(*chosen.indices(size))
        if not selected:
            where = f"{selected.start}:{selected.stop}:{selected.step}"
            if selected.start >= size:
                return f"out of range {where} for dimension {label} of size {size}"
            return f"empty range {where}"
    return f"the selection {dims} of a mesh with sizes {dict(sizes)} is empty"


class MeshTrait:
    """Named-dimension views: ``slice``, ``flatten``, ``rename``, ``split``, ``size``.

    Every operation returns a new view over the same elements; none of them own anything.
    """

    _shape: Shape

    def _new_with_shape(self: M, shape: Shape) -> M:
        raise NotImplementedError

    @property
    def _labels(self) -> tuple[str, ...]:
        # Private in Monarch too, but its published SPMD example reads it
        # (``dict.fromkeys(proc_mesh._labels, 0)``), so ported programs do.
        return tuple(self._shape.labels)

    def slice(self: M, **dims: Any) -> M:
        """Select by dimension: an int picks one index and drops the dimension, a ``slice``
        (or ``range``) keeps it restricted. ``mesh.slice(**point)`` selects one element.

        An int past the end raises ``IndexError``; a selection with no element raises
        :class:`EmptySliceError` (an ``IndexError`` and a ``ValueError``, as in Monarch)."""
        shape = self._shape.slice(**dims)
        if not len(shape) and len(self._shape):
            raise EmptySliceError(_empty_text(self._shape, dims))
        return self._new_with_shape(shape)

    def flatten(self: M, name: str) -> M:
        """Collapse every dimension into one called ``name`` (dense meshes only)."""
        return self._new_with_shape(self._shape.flatten(name))

    def rename(self: M, **old_to_new: str) -> M:
        """Rename dimensions, e.g. ``rename(gpus="ranks")``."""
        return self._new_with_shape(self._shape.rename(**old_to_new))

    def split(self: M, **kw: Any) -> M:
        """Split dimensions, e.g. ``split(gpus=("dp", "tp"), tp=2)``."""
        return self._new_with_shape(self._shape.split(**kw))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Number of elements, in total or along ``dim`` (one name or several)."""
        return self._shape.size(dim)

    @property
    def sizes(self) -> dict[str, int]:
        """Dimension sizes by name."""
        return dict(self._shape.sizes)

    @property
    def extent(self) -> Extent:
        """The dimensions and their sizes."""
        return self._shape.extent

    @property
    def shape(self) -> Shape:
        """The view's shape over the mesh it was taken from."""
        return self._shape

    def __len__(self) -> int:
        return len(self._shape)


class ProcMeshBase(MeshTrait, abc.ABC):
    """A proc mesh as the layers below the user's mesh objects know it.

    Actor instances name their proc meshes with this type; :class:`regency.actor.ProcMesh`
    implements it.
    """

    @abc.abstractmethod
    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:  # noqa: N803
        """Spawn one actor of ``Class`` in each proc of this mesh, as the actor mesh ``name``."""

    @property
    @abc.abstractmethod
    def initialized(self) -> Future[bool]:
        """Resolves to ``True`` once every proc of the mesh has started."""

    @abc.abstractmethod
    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of the mesh."""
