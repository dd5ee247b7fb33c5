"""Pipes (Monarch's ``monarch.common.pipe``): a data source on every worker, such as a data
loader, whose values become mesh tensors on the controller with ``pipe.recv()``.

The source runs on each worker (``pipe_worker``); its propagation, a generator run here on
fake values, says what each value looks like, so ``recv()`` returns mesh tensors at once and
the workers fill them in, in order with the other ops of the stream::

    @remote_generator("mypkg.loader.batches")
    def batches(pipe, batch_size: int):          # the propagation: what each value looks like
        while True:
            yield {"input": torch.empty(batch_size, 16), "target": torch.empty(batch_size)}

    with procs.activate():
        loader = batches(32)                     # starts mypkg.loader.batches on every worker
        batch = loader.recv()                    # mesh tensors, filled by each rank's source
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils._pytree as pytree

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.access import check_access
from regency._tensor.engine import active_view, new_ref
from regency._tensor.mesh_tensor import MeshTensor, _Walk, build, common_view, refs_replaced
from regency._tensor.meta import describe, fake_mode, fake_of
from regency._tensor.remote import Remote, remote
from regency._tensor.streams import get_active_stream
from regency.shape import Point

DEFAULT_MAX_MESSAGES = 50
"""Values that may wait in each direction of a pipe (Monarch's default)."""


class FakePipe:
    """What a pipe's propagation gets as its first argument on the controller: ``recv()``
    returns (fakes of) what the controller sent with ``pipe.send``, in order."""

    def __init__(self) -> None:
        self._sent: deque[Any] = deque()

    def send(self, obj: Any) -> None:
        """Raises: a propagation describes values by yielding them."""
        raise RuntimeError(
            "Rather than p.send(x) use yield x to simulate a pipe worker sending data."
        )

    def recv(self) -> Any:
        """A fake of the next value the controller sent (``None`` when none is waiting)."""
        return self._sent.popleft() if self._sent else None

    @property
    def ranks(self) -> dict[str, int]:
        """Raises: a worker's coordinates are known on the worker only."""
        raise ValueError("cannot be accessed on controller")

    @property
    def sizes(self) -> dict[str, int]:
        """Raises: known on the worker only."""
        raise ValueError("cannot be accessed on controller")


class Pipe(FakePipe):
    """A data source running on every proc of the active mesh (``create_pipe``,
    ``remote_generator``): ``recv()`` gives its next value as mesh tensors, ``send(obj)`` hands
    mesh values to it, both on the stream the pipe was made on. Dropping the pipe stops the
    sources."""

    def __init__(
        self, fn: Remote[..., Any], max_messages: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        super().__init__()
        view = active_view()
        if view is None:
            raise ValueError(
                "Remote generators require an active device mesh (use `with mesh.activate():`)"
            )
        if not isinstance(fn, Remote):
            raise TypeError("expected fn to be a regency.remote function.")
        if not callable(fn._propagate):
            raise ValueError("Must specify explicit callable for pipe")
        if any(isinstance(x, MeshTensor) for x in pytree.tree_leaves((args, kwargs))):
            raise ValueError("Cannot pass references to external generators")
        if not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
        with fake_mode():
            self._described: Iterator[Any] = iter(fn._propagate(self._fake(), *args, **kwargs))
        self._view = view
        self._ref = new_ref()
        shape = view.shape
        coords = {
            rank: dict(Point(i, shape.extent).items()) for i, rank in enumerate(shape.ranks())
        }
        sizes = dict(shape.extent.items())
        self._stream = get_active_stream()
        view.send(c.CreatePipe(self._ref, fn._ref, args, kwargs, max_messages, coords, sizes))
        weakref.finalize(self, view.root.dropped, shape, self._ref, self._stream.key)

    def _fake(self) -> FakePipe:
        """The propagation's pipe: it shares this pipe's queue of sent fakes."""
        fake = FakePipe()
        fake._sent = self._sent
        return fake

    @property
    def mesh(self) -> Any:
        """The proc mesh (view) the sources run on."""
        return self._view.mesh

    def recv(self) -> Any:
        """The sources' next value, as mesh tensors (non-tensor leaves as the propagation
        yields them); a source that failed or ended poisons them."""
        try:
            with fake_mode():
                fake = next(self._described)
        except StopIteration:
            raise RuntimeError(
                "this pipe's propagation ended: it describes no more values to receive"
            ) from None
        outs: list[int] = []
        with self._stream.activate():  # the pipe's values belong to its stream
            result = build(describe(fake), None, [], self._view, outs)
            self._view.send(c.PipeRecv(self._ref, tuple(outs), sites.capture()))
        return result

    def send(self, obj: Any) -> None:
        """Hand a copy of ``obj`` (mesh tensors of the pipe's mesh, and Python values) to every
        rank's source, which gets its shard from ``pipe.recv()`` on the worker."""
        walk = _Walk(constants=False)
        encoded, _ = walk.encode(obj, None)
        view = common_view(walk.tensors, self._view)
        if not view.same(self._view):
            raise ValueError(
                f"Pipe is defined on mesh {self._view.mesh!r} but inputs are defined on mesh "
                f"{view.mesh!r}"
            )
        with self._stream.activate():
            check_access(walk.tensors, ())
            with fake_mode():
                fakes = {t._ref: fake_of(t._meta) for t in walk.tensors}
                self._sent.append(refs_replaced(encoded, fakes.__getitem__))
            self._view.send(c.PipeSend(self._ref, encoded, sites.capture()))

    def __repr__(self) -> str:
        return f"<regency Pipe {self._ref} on {self._view.mesh!r}>"


def create_pipe(
    fn: Remote[..., Any], *args: Any, max_messages: int = DEFAULT_MAX_MESSAGES, **kwargs: Any
) -> Pipe:
    """Start ``fn`` (a remote function with a callable ``propagate``, which gets a
    ``FakePipe`` and yields what each value looks like) as a pipe on every proc of the active
    mesh: on each worker ``fn(pipe, *args, **kwargs)`` sends values with ``pipe.send`` or
    yields them. ``args`` are plain Python values (no mesh tensors: use ``pipe.send``)."""
    return Pipe(fn, max_messages, args, kwargs)


def remote_generator(
    path: str, max_messages: int = DEFAULT_MAX_MESSAGES
) -> Callable[[Callable[..., Any]], Callable[..., Pipe]]:
    """Decorate a propagation (a generator over a ``FakePipe`` and the arguments) to make a
    pipe factory for the worker-side source at ``path`` (``"pkg.mod.fn"``): calling it inside
    ``activate()`` starts the source on every proc and returns the ``Pipe``."""

    def wrapper(annotation: Callable[..., Any]) -> Callable[..., Pipe]:
        fn = remote(path, propagate=annotation)

        def start(*args: Any, **kwargs: Any) -> Pipe:
            return create_pipe(fn, *args, max_messages=max_messages, **kwargs)

        start.__name__ = getattr(annotation, "__name__", path)
        start.__doc__ = getattr(annotation, "__doc__", None)
        return start

    return wrapper
