"""Gradients as backward produces them (Monarch's ``monarch.gradient_generator``).

``grad_generator(loss, params)`` yields each parameter's gradient as soon as backward has
computed it, so its communication can start while backward goes on::

    with procs.activate():
        loss = model(x).sum()
        for p, g in zip(params, regency.grad_generator(loss, params)):
            g.reduce_("gpus")              # issued before the rest of backward
            p.grad = g

``grad_function(fn)`` makes a function with a backward of its own; ``GradGenerator`` does the
same as ``grad_generator`` over pytrees; ``gradient_execution_order`` says in which order
backward reaches a list of tensors.
"""

from __future__ import annotations

from regency._tensor.gradients import (
    GradGenerator,
    GradientGenerator,
    grad_function,
    grad_generator,
    gradient_execution_order,
)

__all__ = [
    "GradGenerator",
    "GradientGenerator",
    "grad_function",
    "grad_generator",
    "gradient_execution_order",
]
