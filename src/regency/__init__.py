"""Regency: a pure-Python single controller for distributed PyTorch.

The public API lives in subpackages: :mod:`regency.actor` (actors, meshes, messaging),
:mod:`regency.shape` (the ndslice algebra), :mod:`regency.spmd` (torchrun's environment and
SPMD launch) and :mod:`regency.config` (settings). :class:`RegencyError` is the root of every
error regency raises (the tree is drawn in :mod:`regency._errors`).
"""

from regency import _public
from regency._errors import RegencyError

__version__ = "0.1.0"

__all__ = ["RegencyError", "__version__"]

_public.publish(__name__, globals())
