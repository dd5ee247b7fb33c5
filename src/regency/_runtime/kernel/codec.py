"""Message bodies: pickle protocol 5 with out-of-band buffers, cloudpickle for code by value.

``dumps`` returns ``[body, *buffers]``; large buffers (numpy arrays, CPU torch tensors,
memoryviews, and ``bytes``/``bytearray`` values that are top-level arguments or return values) are
not copied into the body but travel as separate parts that ``sendmsg`` writes straight from the
object's memory.

What arrives: a ``bytes`` as ``bytes`` and a ``bytearray`` as ``bytearray`` (each one copy out of
the received part, which frees it; large ones into memory made cheap to fill, ``fill.py``); a
``memoryview`` as a ``memoryview`` straight over the received part (no copy), with the sender's
``format`` and ``shape`` where ``memoryview.cast`` can express them (a native single-character
format and no zero in the shape; otherwise format ``B``, one dimension), read-only if the
sender's view was.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import re
import sys
import threading
import types
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import cloudpickle

from regency._runtime.kernel.fill import bytearray_from, bytes_from

Part = bytes | bytearray | memoryview

OUT_OF_BAND_MIN = 64 * 1024


class _Large:
    """Marks a large ``bytes``/``bytearray`` value so it travels out of band.

    The C pickler writes these types in-band without consulting any hook, so large top-level
    arguments and return values are wrapped before pickling. The receiver rebuilds the value
    with :func:`~regency._runtime.kernel.fill.bytes_from` / ``bytearray_from``: one copy out of
    the received part.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        rebuild = bytes_from if type(self.data) is bytes else bytearray_from
        return (rebuild, (pickle.PickleBuffer(self.data),))


def _memoryview_from_buffer(
    buf: Any, fmt: str, shape: tuple[int, ...], readonly: bool
) -> memoryview:
    view = memoryview(buf)
    if view.readonly and not readonly:  # a part received read-only: the copy is the receiver's
        view = memoryview(bytearray(view))
    if fmt != "B" or len(shape) != 1:
        flat: Any = view.cast("B")  # typeshed types cast() for literal formats only
        view = flat.cast(fmt, shape)
    return view.toreadonly() if readonly else view


def _reduce_memoryview(view: memoryview) -> tuple[Any, ...]:
    data = view if view.c_contiguous else memoryview(view.tobytes())
    fmt, shape = view.format.removeprefix("@"), view.shape or ()
    if len(fmt) != 1 or 0 in shape:  # what memoryview.cast cannot rebuild travels as bytes
        fmt, shape = "B", (view.nbytes,)
    return (_memoryview_from_buffer, (pickle.PickleBuffer(data), fmt, shape, view.readonly))


def _tensor_from_buffer(buf: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    view = memoryview(buf)
    if view.readonly:
        view = memoryview(bytearray(view))
    flat = torch.frombuffer(view, dtype=torch.uint8) if view.nbytes else torch.empty(0)
    return flat.view(getattr(torch, dtype)).reshape(shape)


def _reduce_tensor(obj: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is None or type(obj) is not torch.Tensor:
        return NotImplemented
    if obj.device.type != "cpu" or obj.requires_grad or obj.is_sparse or obj.is_quantized:
        return NotImplemented
    if obj.numel() * obj.element_size() < OUT_OF_BAND_MIN:
        return NotImplemented
    flat = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    dtype = str(obj.dtype).removeprefix("torch.")
    return (_tensor_from_buffer, (pickle.PickleBuffer(flat), dtype, tuple(obj.shape)))


_DYNAMIC_CODE = "<dynamic-code>"


def _code_with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    return code.replace(co_filename=filename)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is memoryview:
            return _reduce_memoryview(obj)
        if type(obj).__module__ == "torch":
            reduced = _reduce_tensor(obj)
            if reduced is not NotImplemented:
                return reduced
        elif type(obj) is types.CodeType and obj.co_filename != _DYNAMIC_CODE:
            # cloudpickle names code it ships by value "<dynamic-code>"; keep the real file so
            # tracebacks, stacks and pdb in a proc show (and can list) the script's source.
            return (_code_with_filename, (obj.replace(co_filename=_DYNAMIC_CODE), obj.co_filename))
        return super().reducer_override(obj)


def dumps_by_value(obj: Any) -> bytes:
    """Pickle ``obj`` (classes and functions of ``__main__`` by value) into one ``bytes``."""
    out = io.BytesIO()
    _Pickler(out, protocol=5).dump(obj)
    return out.getvalue()


def dumps_by_value_carrying(obj: Any) -> tuple[bytes, list[Any]]:
    """:func:`dumps_by_value`, and the objects :func:`carry` was called with while pickling."""
    carried: list[Any] = []
    return _carrying_into(carried, dumps_by_value, obj), carried


def _wrap_large(value: Any, wrapped: dict[int, _Large] | None = None) -> Any:
    """``value`` marked to travel out of band if it is a large ``bytes``/``bytearray``.

    ``wrapped`` keeps one marker per object, so that an object passed twice arrives as one
    object, as pickle's memo makes it for everything else.
    """
    if type(value) not in _WRAPPED or len(value) < OUT_OF_BAND_MIN:
        return value
    if wrapped is None:
        return _Large(value)
    marker = wrapped.get(id(value))
    if marker is None:
        marker = wrapped[id(value)] = _Large(value)
    return marker


_WRAPPED = (bytes, bytearray)


_carrying = threading.local()
T = TypeVar("T")


def carry(obj: Any) -> bool:
    """Hand ``obj`` to whoever pickles or unpickles a message on this thread now.

    For values that travel as references their own layer resolves (a mesh tensor: a ref on the
    way out, a placeholder on the way in), called from their ``__reduce_ex__`` or from the
    function their pickle calls back: :func:`dumps_call_carrying` and :func:`loads_carrying`
    return what was carried. ``False`` when neither is running on this thread.
    """
    carried: list[Any] | None = getattr(_carrying, "objects", None)
    if carried is None:
        return False
    carried.append(obj)
    return True


def dumps_call_carrying(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[Part], list[Any]]:
    """:func:`dumps_call`, and the objects :func:`carry` was called with while pickling."""
    if _is_plain_call(args, kwargs):  # no value of a plain call can carry anything
        return [pickle.dumps((args, kwargs), protocol=5)], []
    carried: list[Any] = []
    return _carrying_into(carried, _dumps_call_values, args, kwargs), carried


def _carrying_into(carried: list[Any], work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``, with what :func:`carry` is called with on this thread meanwhile
    appended to ``carried``."""
    outer = getattr(_carrying, "objects", None)
    _carrying.objects = carried
    try:
        return work(*args)
    finally:
        _carrying.objects = outer


def dumps_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Part]:
    """Pickle a call's arguments, large top-level ``bytes``/``bytearray`` ones out of band."""
    if _is_plain_call(args, kwargs):
        return [pickle.dumps((args, kwargs), protocol=5)]
    return _dumps_call_values(args, kwargs)


def _dumps_call_values(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Part]:
    """:func:`dumps_call` of arguments known not to be plain."""
    for value in (*args, *kwargs.values()):
        if type(value) in _WRAPPED:
            wrapped: dict[int, _Large] = {}
            args = tuple(_wrap_large(a, wrapped) for a in args)
            kwargs = {k: _wrap_large(v, wrapped) for k, v in kwargs.items()}
            break
    return dumps((args, kwargs))


_PLAIN = frozenset({int, float, str, bool, type(None)})


def _is_plain(obj: Any) -> bool:
    """Scalars, and tuples/dicts of scalars one level deep: nothing cloudpickle would change.

    Written with plain loops: it runs for every message.
    """
    kind = type(obj)
    if kind in _PLAIN:
        return True
    if kind is not tuple:
        return False
    for item in obj:
        item_kind = type(item)
        if item_kind in _PLAIN:
            continue
        if item_kind is tuple:
            for x in item:
                if type(x) not in _PLAIN:
                    return False
        elif item_kind is dict:
            for key, value in item.items():
                if type(key) is not str or type(value) not in _PLAIN:
                    return False
        else:
            return False
    return True


def _is_plain_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """:func:`_is_plain` of ``(args, kwargs)``, without building the pair (every call)."""
    for value in args:
        if type(value) not in _PLAIN:
            return False
    if kwargs:
        for value in kwargs.values():
            if type(value) not in _PLAIN:
                return False
    return True


def dumps(obj: Any) -> list[Part]:
    """Pickle ``obj``; return the body followed by its out-of-band buffers."""
    if _is_plain(obj):  # the common small message: skip building a cloudpickle pickler
        return [pickle.dumps(obj, protocol=5)]
    buffers: list[Part] = []

    def take(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OUT_OF_BAND_MIN:
            return True
        buffers.append(view)
        return False

    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=take).dump(_wrap_large(obj))
    return [out.getbuffer(), *buffers]


# STACK_GLOBAL, the only opcode by which a protocol 4+ pickle names a module (and may import it).
_NAMES_A_MODULE = re.compile(pickle.STACK_GLOBAL)
# Imports run by unpickling, one thread at a time: several actor threads of a new proc unpickling
# their first messages at once would otherwise import the same package (torch) concurrently, and
# packages with circular imports then fail half-initialized or with a _DeadlockError.
_importing = threading.RLock()


def loads(parts: Sequence[Part]) -> Any:
    """Inverse of :func:`dumps`."""
    body = parts[0]
    if _NAMES_A_MODULE.search(body) is None:  # the common small message: no lock
        return pickle.loads(body, buffers=parts[1:])
    return _loads_importing(parts)


def loads_reply(parts: Sequence[Part]) -> Any:
    """:func:`loads` for a reply a caller is given: a ``KeyboardInterrupt`` or ``SystemExit``
    that unpickling it raises (the value's own ``__reduce__``) becomes a
    ``pickle.UnpicklingError`` naming it, so it fails that one call instead of interrupting or
    ending the caller."""
    try:
        return loads(parts)
    except Exception:
        raise
    except BaseException as exc:
        raise pickle.UnpicklingError(
            f"the reply could not be unpickled: unpickling it raised {type(exc).__name__}: {exc}"
        ) from exc


def carried_in(parts: Sequence[Part]) -> list[Any]:
    """The objects :func:`carry` was called with while unpickling ``parts``, as far as
    unpickling gets (it may fail again): what a message that will not run stood for, to be
    released. Nothing is decoded when the pickle names no module (nothing can be carried)."""
    if _NAMES_A_MODULE.search(parts[0]) is None:
        return []
    carried: list[Any] = []
    # A SystemExit or KeyboardInterrupt from a __reduce__ too: the message will not run, and
    # what was carried before it failed is all there is.
    with contextlib.suppress(BaseException):
        _carrying_into(carried, _loads_importing, parts)
    return carried


def loads_carrying(parts: Sequence[Part]) -> tuple[Any, list[Any]]:
    """:func:`loads`, and the objects :func:`carry` was called with while unpickling.

    Whatever the carried objects stand for must be waited for after this returns, never while
    unpickling: that may hold the import lock, which another thread of the process needs to
    decode the very message that would end the wait.
    """
    body = parts[0]
    if _NAMES_A_MODULE.search(body) is None:  # nothing named, nothing called back
        return pickle.loads(body, buffers=parts[1:]), []
    carried: list[Any] = []
    return _carrying_into(carried, _loads_importing, parts), carried


_load_guards: list[Callable[[], AbstractContextManager[Any]]] = []


def guard_loads(guard: Callable[[], AbstractContextManager[Any]]) -> None:
    """Unpickle every pickle that names modules inside ``guard()`` from now on: the tensor
    engine's, so that a message's tensors are rebuilt as local tensors also when they are read
    inside ``activate()`` (whose interception would make every torch op a remote one)."""
    _load_guards[:] = [guard]


def _loads_importing(parts: Sequence[Part]) -> Any:
    """Unpickle ``parts``, whose pickle names modules, one such thread at a time
    (``_importing``)."""
    with _importing:
        if _load_guards:
            with _load_guards[0]():
                return pickle.loads(parts[0], buffers=parts[1:])
        return pickle.loads(parts[0], buffers=parts[1:])
