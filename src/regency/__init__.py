"""Regency: a pure-Python single controller for distributed PyTorch.

The public API lives in subpackages: :mod:`regency.actor` (actors, meshes, messaging),
:mod:`regency.shape` (the ndslice algebra), :mod:`regency.spmd` (torchrun's environment and
SPMD launch) and :mod:`regency.config` (settings).
"""

__version__ = "0.1.0"
