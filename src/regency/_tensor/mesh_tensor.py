"""The controller's mesh tensor: a wrapper tensor subclass holding a ref id, its mesh view.

Any aten op on a mesh tensor becomes a command (``__torch_dispatch__``), also outside
``activate()``; inside ``activate()`` the ``Interceptor`` mode also catches factories. Output
metadata comes from fake-tensor propagation (``meta.propagate``), so shapes are known here and
shape errors raise here, before anything is sent.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from regency._lowlevel import carry
from regency._tensor import access, sites, trees
from regency._tensor import commands as c
from regency._tensor.engine import BIG_DELETE, View, new_ref
from regency._tensor.errors import data_dependent, misuse
from regency._tensor.handoff import arrival
from regency._tensor.meta import OpSignature, TensorMeta, fake_of, propagate
from regency._tensor.moving import plan_move
from regency._tensor.process_group import RemoteProcessGroup
from regency._tensor.reducing import plan_reduce
from regency._tensor.streams import get_active_stream

if TYPE_CHECKING:
    from regency._tensor.streams import Stream

_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_CONSTANT_OPS = frozenset(
    {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}
)
_LOCAL_ACCESSORS = frozenset({_LOCAL_SCALAR, torch.ops.aten.set_.source_Storage_storage_offset})
"""Ops that run locally on a local tensor also inside ``activate()``, as Monarch's: ``.item()``
of a fetched value, and unpickling one (an actor's reply read inside the block)."""
_names: dict[Any, tuple[str, tuple[str, ...]]] = {}


class MeshTensor(torch.Tensor):
    """A tensor with one shard on every proc of a mesh; its data lives on the workers.

    Shape, dtype and strides are known on the controller (the same for every shard). Read values
    with ``regency.inspect(t, **coords)`` / ``regency.fetch_shard``. Autograd, ``nn.Module`` and
    ``torch.optim`` work on mesh tensors as on local ones.
    """

    _ref: int
    _view: View
    _meta: TensorMeta
    _dropped: bool
    _stream: Stream
    _storage: access.Storage | None
    _finalizer: weakref.finalize[Any, Any]
    __torch_function__: ClassVar[Any] = torch._C._disabled_torch_function_impl

    @staticmethod
    def _make(meta: TensorMeta, ref: int, view: View, stream: Stream | None = None) -> MeshTensor:
        t: MeshTensor = torch.Tensor._make_wrapper_subclass(
            MeshTensor, meta.shape, strides=meta.stride, dtype=meta.dtype, device=meta.device
        )
        t._ref = ref
        t._view = view
        t._meta = meta
        t._dropped = False
        t._stream = stream = stream or get_active_stream()
        t._storage = None
        big = math.prod(meta.shape) >= BIG_DELETE
        t._finalizer = weakref.finalize(t, view.root.dropped, view.shape, ref, stream.key, big)
        return t

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch declares it a plain function
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return dispatch(func, args, kwargs or {}, None)

    @property
    def mesh(self) -> Any:
        """The proc mesh (view) this tensor lives on."""
        return self._view.mesh

    def drop(self) -> None:
        """Free this tensor and its aliases (the views of it, or what it is a view of: every
        tensor sharing its storage, as Monarch's ``drop`` does) on the workers now; any later
        use of them raises ``TypeError(DROPPED)``."""
        aliases = list(self._storage.aliases) if self._storage is not None else []
        for t in [self, *(a for a in aliases if isinstance(a, MeshTensor))]:
            if not t._dropped:
                t._dropped = True
                t._finalizer()

    @property
    def dropped(self) -> bool:
        """Whether ``drop()`` was called."""
        return self._dropped

    @property
    def stream(self) -> Stream:
        """The stream this tensor is used on (the one active when it was made)."""
        return self._stream

    def reduce(
        self,
        dims: str | list[str] | tuple[str, ...],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
    ) -> MeshTensor:
        """Reduce across the mesh dims ``dims`` (``stack`` = all-gather, ``scatter=True`` =
        reduce-scatter); a new mesh tensor."""
        return self._reduce((dims, reduction, scatter, mesh), inplace=False)

    def reduce_(
        self,
        dims: str | list[str] | tuple[str, ...],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
    ) -> MeshTensor:
        """``reduce`` in place; returns ``self``."""
        return self._reduce((dims, reduction, scatter, mesh), inplace=True)

    def _reduce(self, spec: tuple[Any, str, bool, Any], inplace: bool) -> MeshTensor:
        if self._dropped:
            raise misuse("DROPPED", f"{self!r} was dropped and cannot be used")
        access.check_access((self,), (self,) if inplace else ())
        meta, out, view = plan_reduce(
            self._view, self._ref, self.shape, self.dtype, self.device, spec, inplace
        )
        return self if inplace else MeshTensor._make(meta, out, view)

    def to_mesh(self, mesh: Any, stream: Stream | None = None) -> MeshTensor:
        """A copy of this tensor on ``mesh`` (a view of this tensor's proc mesh, this tensor's
        own mesh included, or of another proc mesh), whose dims match by name: the proc at
        some coordinates gets the shard at the same coordinates here, a dim only ``mesh`` has
        is a broadcast. The shards move point to point between the workers
        (``torch.distributed``), on this tensor's stream; the copy belongs to ``stream``
        (by default this tensor's), which waits for it before its first use.

        Mismatched dims raise ``ValueError`` before anything is sent.
        """
        return self._move(self._view, mesh, stream)

    def slice_mesh(self, **dims: int | slice) -> MeshSliceTensor:
        """The shards on the sub mesh ``self.mesh.slice(**dims)``, to move with ``.to_mesh``
        (e.g. ``t.slice_mesh(hosts=0).to_mesh(other)``)."""
        return MeshSliceTensor(self, View(self._view.mesh.slice(**dims)))

    def _move(self, source: View, mesh: Any, stream: Stream | None) -> MeshTensor:
        if self._dropped:
            raise misuse("DROPPED", f"{self!r} was dropped and cannot be used")
        if torch.is_grad_enabled() and self.requires_grad:
            raise misuse(
                "REQUIRES_GRAD",
                f"{self!r} requires gradients, but to_mesh does not work with autograd; "
                "move it under torch.no_grad() or move a detached tensor",
            )
        access.check_readable(self)
        meta, out, view = plan_move(source, self._ref, self._meta, self._stream, mesh)
        if stream is None or stream is self._stream:
            return MeshTensor._make(meta, out, view, self._stream)
        # The copy is made on this tensor's stream, then handed to ``stream``, which waits for
        # it: nothing else names the copy, so it can change hands without a borrow.
        mine, event = new_ref(), new_ref()
        view.root.append(view.shape, c.Handover(out, mine, event), self._stream.key)
        view.root.append(view.shape, c.Wait(event), stream.key)
        return MeshTensor._make(meta, mine, view, stream)

    def tolist(self) -> NoReturn:
        """Raises: the data is on the workers."""
        raise data_dependent(".tolist()")

    def numpy(self, *, force: bool = False) -> NoReturn:
        """Raises: the data is on the workers."""
        raise data_dependent(".numpy()")

    def __array__(self, dtype: Any = None) -> NoReturn:
        raise data_dependent("converting to a numpy array")

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"regency.Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"mesh={self._view.mesh!r}, stream={self._stream.name!r}, ref={self._ref})"
        )

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # In an actor call: a slot the receiving rank's shard is handed over in (see
        # actor_calls). Anywhere else there is nothing to pickle: the data is on the workers.
        if self._dropped:
            raise misuse("DROPPED", f"{self!r} was dropped and cannot be used")
        slot = new_ref()
        if not carry((self, slot)):
            raise TypeError(
                f"{self!r} can be pickled only as an argument of an actor endpoint (which "
                "receives its rank's shard); for a shard's value use regency.inspect(t, **coords)"
            )
        return (arrival, (slot, self._stream.key, self.dtype, self.device))


class MeshSliceTensor:
    """The shards of a mesh tensor on a sub mesh of its mesh (``t.slice_mesh(**dims)``): they
    can only be moved, with `to_mesh`, as in Monarch."""

    def __init__(self, tensor: MeshTensor, view: View) -> None:
        self.tensor = tensor
        self._view = view

    @property
    def mesh(self) -> Any:
        """The sub mesh whose shards this names."""
        return self._view.mesh

    def to_mesh(self, mesh: Any, stream: Stream | None = None) -> MeshTensor:
        """A mesh tensor on ``mesh`` made of these shards (see `MeshTensor.to_mesh`)."""
        return self.tensor._move(self._view, mesh, stream)

    def __repr__(self) -> str:
        return f"MeshSliceTensor({self.tensor!r}, mesh={self._view.mesh!r})"


class Interceptor(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's base is untyped
    """Active inside ``activate()``: every op, factories included, runs on ``view``."""

    def __init__(self, view: View) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.view = view

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in a dynamo-disable shim when this is true,
        # ~20-40 us on every op; nothing is compiled on the controller, so no shim.
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in _LOCAL_ACCESSORS and not isinstance(args[0], MeshTensor):
            return func(*args, **(kwargs or {}))
        return dispatch(func, args, kwargs or {}, self.view)


class _Walk:
    """One pass over an op's arguments: refs for the command, a key for the cache."""

    __slots__ = ("constants", "names", "tensors")

    def __init__(self, constants: bool) -> None:
        self.tensors: list[MeshTensor] = []
        self.names: list[str | None] = []
        self.constants = constants

    def encode(self, obj: Any, name: str | None) -> tuple[Any, Any]:
        if isinstance(obj, MeshTensor):
            if obj._dropped:
                raise misuse("DROPPED", f"{obj!r} was dropped and cannot be used")
            self.tensors.append(obj)
            self.names.append(name)
            return c.Ref(obj._ref), obj._meta
        if isinstance(obj, torch.Tensor):
            if obj.dim() == 0 or self.constants:
                return obj, ("constant", TensorMeta.of(obj))
            raise misuse(
                "LOCAL_TENSOR",
                f"a local torch.Tensor of shape {tuple(obj.shape)} is used with mesh tensors; "
                "create it inside `with mesh.activate():` so it lives on the workers",
            )
        if isinstance(obj, RemoteProcessGroup):
            ref = obj._group_ref()
            return ref, ref
        if isinstance(obj, (list, tuple)):
            pairs = [self.encode(x, name) for x in obj]
            return trees.same_kind(obj, [p[0] for p in pairs]), tuple(p[1] for p in pairs)
        if isinstance(obj, dict):
            pairs2 = {k: self.encode(v, k) for k, v in obj.items()}
            return {k: p[0] for k, p in pairs2.items()}, tuple((k, p[1]) for k, p in pairs2.items())
        registration = trees.registered(obj)
        if registration is not None:  # a user class registered with torch's pytree
            keys: list[Any] = []
            node = trees.Node.of(obj, registration, lambda x: _encoded(self.encode(x, name), keys))
            return node, (node.kind, node.context, tuple(keys))
        return obj, obj


def _encoded(pair: tuple[Any, Any], keys: list[Any]) -> Any:
    keys.append(pair[1])
    return pair[0]


def fake_args(obj: Any, metas: dict[int, TensorMeta]) -> Any:
    """Arguments for propagation: each ``Ref`` replaced by a fake tensor (under fake mode)."""
    return refs_replaced(obj, lambda ref: fake_of(metas[ref]))


def refs_replaced(obj: Any, value_of: Callable[[int], Any]) -> Any:
    """``obj`` (lists, tuples and dicts of leaves) with each ``Ref`` replaced by
    ``value_of(its id)``."""
    if isinstance(obj, c.Ref):
        return value_of(obj.id)
    if isinstance(obj, (list, tuple)):
        return trees.same_kind(obj, [refs_replaced(x, value_of) for x in obj])
    if isinstance(obj, dict):
        return {k: refs_replaced(v, value_of) for k, v in obj.items()}
    if isinstance(obj, trees.Node):
        return obj.rebuilt(lambda x: refs_replaced(x, value_of))
    return obj


def common_view(tensors: list[MeshTensor], active: View | None) -> View:
    """The one view all ``tensors`` live on (the active one for factories)."""
    view = tensors[0]._view if tensors else active
    if view is None:
        raise RuntimeError("no mesh is active: use `with procs.activate():`")
    for t in tensors:
        if not t._view.same(view):
            raise misuse(
                "WRONG_MESH",
                f"{t!r} lives on mesh {t._view.mesh!r}, but this op runs on {view.mesh!r}; "
                "move it with .to_mesh() or compute on one mesh",
            )
    return view


def _op_names(func: Any) -> tuple[str, tuple[str, ...]]:
    found = _names.get(func)
    if found is None:
        found = (func.name(), tuple(a.name for a in func._schema.arguments))
        _names[func] = found
    return found


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], active: View | None) -> Any:
    """Issue ``func`` as a command on the workers and return mesh tensors with its metadata."""
    if func is _LOCAL_SCALAR:
        raise data_dependent(".item() (or bool(t), or a Python number from a tensor)")
    if func.namespace == "profiler":  # record_function markers (torch.optim): controller-local
        return func(*args, **kwargs)
    name, arg_names = _op_names(func)
    walk = _Walk(constants=func in _CONSTANT_OPS)
    enc_args, key_args, enc_kwargs, key_kwargs = [], [], {}, []
    for i, arg in enumerate(args):
        enc, key = walk.encode(arg, arg_names[i] if i < len(arg_names) else None)
        enc_args.append(enc)
        key_args.append(key)
    for k, arg in kwargs.items():
        enc, key = walk.encode(arg, k)
        enc_kwargs[k] = enc
        key_kwargs.append((k, key))
    view = common_view(walk.tensors, active)
    metas = {t._ref: t._meta for t in walk.tensors}
    fargs, fkwargs = tuple(enc_args), enc_kwargs
    described, signature = propagate(
        func,
        (func, tuple(key_args), tuple(key_kwargs)),
        lambda: func(*fake_args(fargs, metas), **fake_args(fkwargs, metas)),
        lambda: walk.names,
    )
    access.check_access(walk.tensors, [walk.tensors[i] for i in signature.mutates])
    outs: list[int] = []
    result = build(described, signature, walk.tensors, view, outs)
    access.track_views(access.view_sources(func, walk.names), walk.tensors, result)
    mutates = tuple(walk.tensors[i]._ref for i in signature.mutates)
    view.send(c.CallOp(name, fargs, fkwargs, tuple(outs), mutates, sites.capture()))
    return result


def build(
    described: Any,
    signature: OpSignature | None,
    inputs: list[MeshTensor],
    view: View,
    outs: list[int],
) -> Any:
    """Mesh tensors for the ``TensorMeta`` leaves of ``described`` (refs appended to ``outs``);
    a result the schema says is a written input is that input object itself."""
    returns = signature.returns if signature is not None else ()
    if isinstance(described, tuple) and signature is not None:
        return tuple(_leaf(x, i, returns, inputs, view, outs) for i, x in enumerate(described))
    return _leaf(described, 0, returns, inputs, view, outs)


def _leaf(
    obj: Any,
    index: int | None,
    returns: tuple[int | None, ...],
    inputs: list[MeshTensor],
    view: View,
    outs: list[int],
) -> Any:
    # A module function, not a closure: a recursive closure is a reference cycle, which kept
    # every op's inputs alive (and their shards on the workers) until the next collection.
    if isinstance(obj, TensorMeta):
        alias = returns[index] if index is not None and index < len(returns) else None
        if alias is not None:
            same = inputs[alias]
            outs.append(same._ref)
            return same
        ref = new_ref()
        outs.append(ref)
        return MeshTensor._make(obj, ref, view)
    if isinstance(obj, (list, tuple)):
        return trees.same_kind(obj, [_leaf(x, None, returns, inputs, view, outs) for x in obj])
    if isinstance(obj, dict):
        return {k: _leaf(v, None, returns, inputs, view, outs) for k, v in obj.items()}
    if isinstance(obj, trees.Node):
        return obj.rebuilt(lambda x: _leaf(x, None, returns, inputs, view, outs))
    return obj
