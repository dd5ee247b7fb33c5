"""Remote functions: ``@regency.remote`` / ``remote("pkg.mod.fn", propagate=...)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.access import check_access
from regency._tensor.engine import View, active_view
from regency._tensor.fetching import mapped, rank_at, remote_exception
from regency._tensor.functions import FunctionRef
from regency._tensor.mesh_tensor import MeshTensor, _Walk, build, common_view, refs_replaced
from regency._tensor.meta import describe, fake_mode, fake_of
from regency._tensor.streams import get_active_stream
from regency.actor import Future, ValueMesh

P = ParamSpec("P")
R = TypeVar("R")

Propagator = Callable[..., Any] | str | None

_NEEDS_MESH = "Remote functions require an active device mesh, use `with mesh.activate():`"
_ADVERB_NEEDS_MESH = (
    "Calling a 'remote' monarch function requires an active proc_mesh "
    "(`with proc_mesh.activate():`)"
)


class Remote(Generic[P, R]):
    """A function that runs on the workers of the active mesh, one call per shard.

    Calling it inside ``activate()`` (or with mesh tensor arguments) issues a command and
    returns mesh tensors at once; ``call``/``call_one`` run it and return its values.
    """

    def __init__(self, fn: Callable[P, R] | str, propagate: Propagator) -> None:
        if propagate not in (None, "inspect", "cached") and not callable(propagate):
            raise ValueError(f"propagate must be a callable, 'inspect' or None, not {propagate!r}")
        self._ref = FunctionRef.of(fn)
        if callable(fn):
            self._regency_local = fn
        self._propagate = propagate
        self._cache: dict[Any, Any] = {}
        self.__name__ = getattr(fn, "__name__", str(fn))
        self.__doc__ = getattr(fn, "__doc__", None)

    def _encode(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[_Walk, Any, Any, Any, View]:
        walk = _Walk(constants=False)
        pairs = [walk.encode(a, None) for a in args]
        enc_args = tuple(p[0] for p in pairs)
        key_args = tuple(p[1] for p in pairs)
        enc_kwargs: dict[str, Any] = {}
        key_kwargs = []
        for k, v in kwargs.items():
            enc_kwargs[k], key = walk.encode(v, None)
            key_kwargs.append((k, key))
        active = active_view()
        if active is None and not walk.tensors:
            raise TypeError(f"{self.__name__}: {_NEEDS_MESH}")
        view = common_view(walk.tensors, active)
        return walk, tuple(enc_args), enc_kwargs, (tuple(key_args), tuple(key_kwargs)), view

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        walk, enc_args, enc_kwargs, key, view = self._encode(args, kwargs)
        described, mutated = self._outputs(walk, enc_args, enc_kwargs, key, view)
        check_access(walk.tensors, mutated)
        outs: list[int] = []
        result = build(described, None, walk.tensors, view, outs)
        mutates = tuple(t._ref for t in mutated)
        cmd = c.CallFunction(self._ref, enc_args, enc_kwargs, tuple(outs), mutates, sites.capture())
        view.send(cmd)
        return result  # type: ignore[no-any-return]

    def _outputs(
        self, walk: _Walk, enc_args: Any, enc_kwargs: Any, key: Any, view: View
    ) -> tuple[Any, list[MeshTensor]]:
        """What the call returns (``TensorMeta`` leaves) and the inputs it writes: those a
        ``propagate`` callable writes in place, as Monarch tells them (by their fakes'
        version counters); other kinds of propagation cannot tell, so none."""
        if self._propagate == "inspect":
            return None, []
        if callable(self._propagate):
            with fake_mode():
                fakes = {t._ref: fake_of(t._meta) for t in walk.tensors}
                versions = {ref: fake._version for ref, fake in fakes.items()}
                fake = self._propagate(
                    *refs_replaced(enc_args, fakes.__getitem__),
                    **refs_replaced(enc_kwargs, fakes.__getitem__),
                )
            written = {ref for ref, fake in fakes.items() if fake._version != versions[ref]}
            return describe(fake), [t for t in walk.tensors if t._ref in written]
        return self._cached(enc_args, enc_kwargs, key, view), []

    def _cached(self, enc_args: Any, enc_kwargs: Any, key: Any, view: View) -> Any:
        try:
            return self._cache[key]
        except KeyError:
            pass
        except TypeError:
            key = None
        # Monarch's cached propagation: run once on the first shard, keep the result pattern.
        view.root.flush_all()
        first = view.shape.ranks()[0]
        worker = view.root.worker_at(first, get_active_stream().key)
        ok, found = worker.probe.call_one(self._ref, enc_args, enc_kwargs).get()
        if not ok:
            raise remote_exception(found)
        if key is not None:
            self._cache[key] = found
        return found

    def _target(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, View]:
        """The encoded arguments and the active view the adverb runs over (Monarch's: the
        active mesh, which must be within the arguments' mesh)."""
        active = active_view()
        if active is None:
            raise ValueError(_ADVERB_NEEDS_MESH)
        walk, enc_args, enc_kwargs, _, view = self._encode(args, kwargs)
        if not (active.root is view.root and set(active.shape.ranks()) <= set(view.shape.ranks())):
            raise ValueError(
                f"The current mesh {active.mesh!r} is not a subset of the mesh on which the "
                f"tensors being used are defined {view.mesh!r}"
            )
        check_access(walk.tensors, ())
        view.root.flush_all()
        return enc_args, enc_kwargs, active

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Run on every proc of the active mesh; a ``ValueMesh`` of the results (``ValueError``
        with no mesh active)."""
        enc_args, enc_kwargs, view = self._target(args, kwargs)
        workers = view.root.workers_of(view.shape, get_active_stream().key)
        return mapped(workers.run.call(self._ref, enc_args, enc_kwargs))

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Run on the one proc of the active mesh (a mesh of another size raises)."""
        enc_args, enc_kwargs, view = self._target(args, kwargs)
        workers = view.root.workers_of(view.shape, get_active_stream().key)
        return mapped(workers.run.call_one(self._ref, enc_args, enc_kwargs))

    def call_on_shard(self, shard: dict[str, int] | None, *args: Any, **kwargs: Any) -> Future[R]:
        """Run on one shard of the mesh (``call_on_shard_and_fetch``)."""
        enc_args, enc_kwargs, view = self._target(args, kwargs)
        worker = view.root.worker_at(rank_at(view.shape, shard, {}), get_active_stream().key)
        return mapped(worker.run.call_one(self._ref, enc_args, enc_kwargs))

    def __repr__(self) -> str:
        return f"<regency.remote {self._ref.path or self.__name__}>"


@overload
def remote(function: Callable[P, R], *, propagate: Propagator = None) -> Remote[P, R]: ...
@overload
def remote(function: str, *, propagate: Propagator = None) -> Remote[..., Any]: ...
@overload
def remote(
    function: None = None, *, propagate: Propagator = None
) -> Callable[[Callable[P, R]], Remote[P, R]]: ...
def remote(
    function: Callable[..., Any] | str | None = None, *, propagate: Propagator = None
) -> Any:
    """Make ``function`` (a callable, or an import path string) a remote function.

    ``propagate`` says what it returns, for shapes known on the controller: a callable run on
    fake inputs; ``"inspect"`` (no results are kept); ``None`` (run once on one shard and cache
    the output pattern per input metadata). Also usable as ``@remote(propagate=...)``.
    """
    if function is None:
        return lambda fn: Remote(fn, propagate)
    return Remote(function, propagate)


def call_on_shard_and_fetch(
    fn: Remote[..., Any] | Callable[..., Any] | str,
    *args: Any,
    shard: dict[str, int] | None = None,
    **kwargs: Any,
) -> Future[Any]:
    """Run ``fn`` on one shard of the active mesh and fetch its result."""
    target = fn if isinstance(fn, Remote) else Remote(fn, "inspect")
    return target.call_on_shard(shard, *args, **kwargs)
