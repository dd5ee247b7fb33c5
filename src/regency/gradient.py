"""Monarch's ``monarch.gradient``: the iterator behind ``grad_generator``.

``GradientGenerator(roots, with_respect_to, grad_roots=())`` (docs/tensors.md).
"""

from __future__ import annotations

from regency._tensor.gradients import GradientGenerator

__all__ = ["GradientGenerator"]
