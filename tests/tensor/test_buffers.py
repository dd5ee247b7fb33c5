"""The workers' output buffers (`regency._tensor.buffers`): exact copies whatever the source's
layout, tensors of every dtype and size, and the one documented difference (a large one's
storage does not grow)."""

from __future__ import annotations

import pytest
import torch

from regency._tensor import buffers

pytestmark = pytest.mark.timeout(60)

CPU = torch.device("cpu")
LARGE = buffers.NUMPY_FROM // 4 + 3  # float32 elements: over the numpy threshold, odd


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.bool, torch.complex64, torch.int64]
)
@pytest.mark.parametrize("numel", [0, 5, LARGE])
def test_empty_has_the_shape_dtype_and_layout_asked_for(dtype: torch.dtype, numel: int) -> None:
    t = buffers.empty((numel, 2), dtype, CPU)
    assert t.shape == (numel, 2)
    assert t.dtype == dtype
    assert t.is_contiguous()
    t.fill_(1)
    assert bool((t == 1).all())


def sources() -> dict[str, torch.Tensor]:
    base = torch.arange(float(2 * LARGE)).reshape(2, LARGE)
    cplx = torch.complex(base[0], base[1])
    return {
        "contiguous": base,
        "strided": base[:, ::2],
        "transposed": base.t(),
        "conjugate view": cplx.conj(),  # lazily conjugated: its bytes are not its values
        "negative view": torch._neg_view(cplx),
        "small": base[:, :7].contiguous(),
        "bfloat16": base.to(torch.bfloat16),
    }


@pytest.mark.parametrize("name", list(sources()))
def test_copy_is_exact_and_independent(name: str) -> None:
    src = sources()[name]
    want = src.resolve_conj().resolve_neg().clone()
    out = buffers.copy(src)
    assert out.is_contiguous()
    assert not out.is_conj()
    assert not out.is_neg()
    assert torch.equal(out, want)
    out.zero_()
    assert torch.equal(src.resolve_conj().resolve_neg(), want)


def test_copy_into_a_piece_of_a_larger_buffer() -> None:
    src = torch.arange(float(LARGE))
    out = buffers.empty((2 * LARGE,), torch.float32, CPU).zero_()
    buffers.copy_into(out[LARGE:], src)
    assert torch.equal(out[LARGE:], src)
    assert bool((out[:LARGE] == 0).all())


def test_a_large_buffer_shrinks_but_does_not_grow() -> None:
    t = buffers.empty((LARGE,), torch.float32, CPU)
    t.resize_(10)
    assert t.shape == (10,)
    with pytest.raises(RuntimeError, match="not resizable"):
        t.resize_(4 * LARGE)
