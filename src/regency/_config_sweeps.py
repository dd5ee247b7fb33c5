"""pytest helpers that run a test once per set of config values (``monarch.config``'s)."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

_ARG = "_config_overrides"


def _sweep(
    combos: Sequence[dict[str, Any]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import pytest

    from regency.config import configured

    ids = ["-".join(f"{k}={v}" for k, v in combo.items()) for combo in combos]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        extra = inspect.Parameter(_ARG, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wrapped: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):

            async def run_async(_config_overrides: dict[str, Any], *a: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return await fn(*a, **kw)

            wrapped = run_async
        else:

            def run(_config_overrides: dict[str, Any], *a: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*a, **kw)

            wrapped = run
        functools.update_wrapper(wrapped, fn)
        wrapped.__signature__ = signature.replace(  # type: ignore[union-attr]
            parameters=[extra, *signature.parameters.values()]
        )
        return pytest.mark.parametrize(_ARG, list(combos), ids=ids)(wrapped)  # type: ignore[no-any-return]

    return decorate


def parametrize_config(
    **options: Iterable[Any],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated test once per combination of the given values (cartesian product).

    Each run is inside ``configured(...)`` with that combination.
    """
    if not options:
        raise ValueError("parametrize_config requires at least one config option")
    keys = list(options)
    product = itertools.product(*map(list, options.values()))
    combos = [dict(zip(keys, values, strict=True)) for values in product]
    return _sweep(combos)


def parametrize_config_pointwise(
    **options: Sequence[Any],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like :func:`parametrize_config`, but taking the i-th value of every option together.

    Every option must have the same number of values.
    """
    if not options:
        raise ValueError("parametrize_config_pointwise requires at least one config option")
    lengths = {key: len(values) for key, values in options.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            "parametrize_config_pointwise requires every option to have the same number of "
            f"values; got lengths {lengths}"
        )
    keys = list(options)
    rows = zip(*options.values(), strict=True)
    return _sweep([dict(zip(keys, values, strict=True)) for values in rows])
