"""Pure-data geometry of meshes: Monarch's ``ndslice`` algebra.

* `Slice` maps N-dimensional coordinates to flat *base ranks* (offset + coords . strides).
* `Extent` is labelled sizes, ``{hosts: 2, gpus: 4}``; `Point` is one position in it.
* `Shape` is labels over a `Slice` and carries the mesh operations every mesh type
  delegates to: ``slice``, ``flatten``, ``rename``, ``split``, ``size``, ``sizes``.
* `Selection` parses and evaluates selection expressions such as ``"(*, 1:3) & (0, *)"``.

The package depends only on the standard library. See ``docs/shape.md``.
"""

from regency import _public
from regency.shape._errors import DimensionNotFoundError
from regency.shape._extent import Extent, Point
from regency.shape._selection import Selection
from regency.shape._shape import Shape
from regency.shape._slice import Slice

__all__ = ["DimensionNotFoundError", "Extent", "Point", "Selection", "Shape", "Slice"]

_public.publish(__name__, globals())
