"""Pure-data geometry of meshes: Monarch's ``ndslice`` algebra.

* `Slice` maps N-dimensional coordinates to flat *base ranks* (offset + coords . strides).
* `Extent` is labelled sizes, ``{hosts: 2, gpus: 4}``; `Point` is one position in it.
* `Shape` is labels over a `Slice` and carries the mesh operations every mesh type
  delegates to: ``slice``, ``flatten``, ``rename``, ``split``, ``size``, ``sizes``.
* `Selection` parses and evaluates selection expressions such as ``"(*, 1:3) & (0, *)"``.

The package depends only on the standard library. See ``docs/shape.md``.
"""

from ._errors import DimensionNotFoundError as DimensionNotFoundError
from ._extent import Extent as Extent
from ._extent import Point as Point
from ._selection import Selection as Selection
from ._shape import Shape as Shape
from ._slice import Slice as Slice

__all__ = ["DimensionNotFoundError", "Extent", "Point", "Selection", "Shape", "Slice"]

for _cls in (DimensionNotFoundError, Extent, Point, Selection, Shape, Slice):
    _cls.__module__ = __name__
del _cls
