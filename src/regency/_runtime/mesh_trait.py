"""Operations every mesh shares (host, proc, actor and value meshes): slicing and reshaping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from regency.shape import Extent, Shape

M = TypeVar("M", bound="MeshTrait")


class MeshTrait:
    """Named-dimension views: ``slice``, ``flatten``, ``rename``, ``split``, ``size``.

    Every operation returns a new view over the same elements; none of them own anything.
    """

    _shape: Shape

    def _new_with_shape(self: M, shape: Shape) -> M:
        raise NotImplementedError

    def slice(self: M, **dims: Any) -> M:
        """Select by dimension: an int picks one index and drops the dimension, a ``slice``
        (or ``range``) keeps it restricted. ``mesh.slice(**point)`` selects one element."""
        return self._new_with_shape(self._shape.slice(**dims))

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
