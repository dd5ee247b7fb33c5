"""Gradients yielded as backward produces them (Monarch's ``grad_generator``), functions with a
backward of their own (``grad_function``) and the order backward reaches tensors in.

``grad_generator(roots, with_respect_to)`` gives the same values as
``torch.autograd.grad(roots, with_respect_to, allow_unused=True)``, one at a time and in that
order, but each as soon as backward has computed it: the program can issue work on an early
gradient (a reduce, a send) while the rest of backward is still being issued, so the workers
overlap the two (pipelining). Backward runs in a helper thread in lockstep with the consumer:
the thread issues backward's ops until the gradient asked for next is complete, then waits
while the consumer runs; the two never issue commands at the same time.
"""

from __future__ import annotations

import contextvars
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any, cast

import torch
import torch.utils._pytree as pytree
from torch.autograd.graph import GradientEdge, get_gradient_edge

from regency._errors import RegencyError
from regency._tensor import sites
from regency._tensor.engine import View, active_view
from regency._tensor.mesh_tensor import Interceptor, MeshTensor

TensorOrEdge = torch.Tensor | GradientEdge


class _CancelledError(RegencyError):
    """Raised in a hook to abandon a backward whose generator was closed."""


class _Lockstep:
    """What the backward thread and the consumer share (the generator itself is not shared,
    so an abandoned generator can be collected and its thread told to stop)."""

    def __init__(self, count: int) -> None:
        self.found: dict[int, torch.Tensor | None] = {}
        self.wanted = 0
        self.count = count
        self.done = False
        self.error: BaseException | None = None
        self.cancelled = False
        self.to_consumer: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.to_backward: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def offer(self, index: int, grad: torch.Tensor) -> None:
        """Backward computed ``grad`` for ``with_respect_to[index]``: hand over if it is the
        one wanted next, and wait until the consumer asks for more."""
        if self.cancelled:
            raise _CancelledError
        self.found.setdefault(index, grad)
        if self.wanted in self.found:
            self.to_consumer.put(None)
            self.to_backward.get()
            if self.cancelled:
                raise _CancelledError

    def cancel(self) -> None:
        """Stop a backward waiting in a hook (the generator was closed or collected)."""
        if self.thread is not None and not self.done:
            self.cancelled = True
            self.to_backward.put(None)


class GradientGenerator:
    """An iterator over the gradients of ``with_respect_to`` (in that order) as backward from
    ``roots`` computes them; an unused input yields ``None``. ``close()`` (or dropping it)
    abandons the rest of backward."""

    def __init__(
        self,
        roots: Sequence[TensorOrEdge],
        with_respect_to: Sequence[TensorOrEdge],
        grad_roots: Sequence[torch.Tensor | None] = (),
    ) -> None:
        if not roots:
            raise ValueError("grad_generator needs at least one root to differentiate")
        if grad_roots and len(grad_roots) != len(roots):
            raise ValueError(
                f"grad_roots has {len(grad_roots)} gradients for {len(roots)} roots; "
                "give one per root (None for a scalar root) or none"
            )
        for x in (*roots, *with_respect_to):
            if not isinstance(x, (torch.Tensor, GradientEdge)):
                raise TypeError(
                    f"grad_generator takes tensors or GradientEdges, not {type(x).__name__}"
                )
        self._roots = list(roots)
        self._inputs = list(with_respect_to)
        self._grad_roots = list(grad_roots) or None
        self._view = active_view() or _view_of(self._roots)
        self._site = sites.capture()  # backward's commands are this call's
        self._state = _Lockstep(len(self._inputs))
        weakref.finalize(self, self._state.cancel)

    def __iter__(self) -> GradientGenerator:
        return self

    def __next__(self) -> torch.Tensor | None:
        state = self._state
        index = state.wanted
        if index >= state.count:
            raise StopIteration
        if state.cancelled:
            raise RuntimeError("this grad_generator was closed")
        while index not in state.found and not state.done:
            if state.thread is None:
                # The consumer's context variables (its actor, if it runs in one), so backward's
                # sends come from the same sender and keep their order with the consumer's.
                state.thread = threading.Thread(
                    target=contextvars.copy_context().run,
                    args=(
                        _run_backward,
                        state,
                        self._roots,
                        self._inputs,
                        self._grad_roots,
                        self._view,
                        self._site,
                    ),
                    name="regency-grad-generator",
                    daemon=True,
                )
                state.thread.start()
            else:
                state.to_backward.put(None)
            state.to_consumer.get()
        if index not in state.found and state.error is not None:
            raise state.error
        state.wanted = index + 1
        return state.found.pop(index, None)

    def close(self) -> None:
        """Abandon the gradients not yet yielded (the backward thread stops)."""
        self._state.cancel()
        self._state.wanted = self._state.count


def _view_of(roots: list[TensorOrEdge]) -> View | None:
    for r in roots:
        if isinstance(r, MeshTensor):
            return r._view
    return None


def _run_backward(
    state: _Lockstep,
    roots: list[TensorOrEdge],
    inputs: list[TensorOrEdge],
    grad_roots: list[torch.Tensor | None] | None,
    view: View | None,
    site: int,
) -> None:
    """The backward thread: ``torch.autograd.grad`` with a hook per input that offers its
    gradient; the values hooks did not see (edges of nodes that never run) come from its
    result."""
    try:
        with ExitStack() as hooks:
            hooks.enter_context(sites.standing_in(site))
            if view is not None:
                hooks.enter_context(Interceptor(view))
            for index, x in enumerate(inputs):
                tensor = _hookable(x)
                if tensor is not None:
                    handle = tensor.register_hook(_offer_hook(state, index))  # type: ignore[no-untyped-call]
                    hooks.callback(handle.remove)
            grads = torch.autograd.grad(
                cast(Any, roots), cast(Any, inputs), grad_roots, allow_unused=True
            )
        for index, grad in enumerate(grads):
            state.found.setdefault(index, grad)
    except _CancelledError:
        pass
    except BaseException as exc:
        state.error = exc
    finally:
        state.done = True
        if not state.cancelled:
            state.to_consumer.put(None)


def _hookable(x: TensorOrEdge) -> torch.Tensor | None:
    """The tensor whose hook sees ``x``'s gradient: itself, or a leaf edge's variable."""
    if isinstance(x, torch.Tensor):
        return x if x.requires_grad else None
    variable = getattr(x.node, "variable", None)
    return variable if isinstance(variable, torch.Tensor) else None


def _offer_hook(state: _Lockstep, index: int) -> Callable[[torch.Tensor], None]:
    def hook(grad: torch.Tensor) -> None:
        state.offer(index, grad)

    return hook


def grad_generator(
    roots: torch.Tensor | Sequence[TensorOrEdge] = (),
    with_respect_to: Sequence[TensorOrEdge] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> GradientGenerator:
    """Yield the gradient of each of ``with_respect_to`` (tensors or
    ``torch.autograd.graph.GradientEdge``) of ``roots``, in the order given, each as soon as
    backward has computed it (Monarch's ``monarch.grad_generator``).

    ``grad_roots`` are the gradients of the roots (none for scalar roots). An input the roots
    do not depend on yields ``None``. List the inputs in the order backward reaches them
    (``gradient_execution_order``) to have each one early.
    """
    listed = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    return GradientGenerator(listed, list(with_respect_to), list(grad_roots))


class GradGenerator:
    """Gradients of pytrees of tensors, built up in forward order and yielded in reverse:
    ``g.grad(tree)`` once per group (e.g. a layer's parameters, in forward order),
    ``g.root(loss)``, then ``for grads in g:`` yields each group's gradients as a tree of the
    same shape, the last group first, each as soon as backward has reached it."""

    def __init__(self) -> None:
        self.roots: list[TensorOrEdge] = []
        self.grad_roots: list[torch.Tensor | None] = []
        self.with_respect_to: list[TensorOrEdge] = []
        self._groups: list[tuple[int, pytree.TreeSpec]] = []

    def grad(self, tree: Any) -> None:
        """Ask for the gradients of the tensors of ``tree``."""
        leaves, spec = pytree.tree_flatten(tree)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        if len(tensors) != len(leaves):
            raise TypeError("GradGenerator.grad takes a tree whose leaves are all tensors")
        self._groups.append((len(tensors), spec))
        self.with_respect_to.extend(tensors)

    def root(self, r: TensorOrEdge, grad: torch.Tensor | None = None) -> None:
        """Differentiate ``r`` (with gradient ``grad``; none for a scalar)."""
        self.roots.append(r)
        self.grad_roots.append(grad)

    def __iter__(self) -> Iterator[Any]:
        grads = GradientGenerator(
            self.roots,
            list(reversed(self.with_respect_to)),
            self.grad_roots if any(g is not None for g in self.grad_roots) else (),
        )
        for count, spec in reversed(self._groups):
            got = [next(grads) for _ in range(count)]
            yield pytree.tree_unflatten(got[::-1], spec)


class _GradFunction(torch.autograd.Function):
    """Runs ``fn`` (returning its result and a backward continuation) without recording its
    ops; autograd calls the continuation with the result's gradients."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., Any], *args: Any) -> Any:
        result, backward = fn(*args)
        if not callable(backward):
            raise TypeError(
                "a grad_function must return (result, backward), backward being a callable "
                f"from the result's gradients to the inputs'; got {type(backward).__name__}"
            )
        ctx.continuation = backward
        return result

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        out = ctx.continuation(*grads)
        return (None, *(out if isinstance(out, tuple) else (out,)))


def grad_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``fn`` a differentiable function with a backward of its own (Monarch's
    ``monarch.grad_function``): ``fn(*args)`` returns ``(result, backward)``, where
    ``backward(*result_grads)`` returns the gradients of ``args`` (a tuple, one per argument,
    ``None`` for an argument without one). ``fn``'s own ops are not recorded: e.g. a
    ``to_mesh`` whose backward moves the gradient back."""

    def apply(*args: Any) -> Any:
        return _GradFunction.apply(fn, *args)  # type: ignore[no-untyped-call]

    apply.__name__ = getattr(fn, "__name__", "grad_function")
    apply.__doc__ = getattr(fn, "__doc__", None)
    return apply


def gradient_execution_order(
    roots: Sequence[TensorOrEdge], with_respect_to: Sequence[TensorOrEdge]
) -> list[int]:
    """The indices of ``with_respect_to`` in the order backward from ``roots`` would complete
    their gradients (the reverse of the order the forward pass first used them)."""
    edges = [_edge(x) for x in with_respect_to]
    keys = [(e.node, e.output_nr) for e in edges]
    first_use: dict[Any, float] = dict.fromkeys(keys, math.inf)
    pending = [_edge(r).node for r in roots]
    seen: set[Any] = set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        for edge in node.next_functions:
            if edge[0] is None:
                continue
            pending.append(edge[0])
            if edge in first_use:
                first_use[edge] = min(first_use[edge], node._sequence_nr())
    return sorted(range(len(keys)), key=lambda i: first_use[keys[i]], reverse=True)


def _edge(x: TensorOrEdge) -> GradientEdge:
    return x if isinstance(x, GradientEdge) else get_gradient_edge(x)
