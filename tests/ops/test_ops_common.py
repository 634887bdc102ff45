"""The helpers every op shares: the relative index convention, the Toeplitz table order, visible keys, the
normalisers and checkpointing by groups of rows, against their definitions written as loops or plain autograd."""

import pytest
import torch

from modeling_scaleformer import ops_common
from modeling_scaleformer.ops_common import (
    check_key_mask,
    checks_values,
    grouped_rows,
    guarded_normalise,
    normalise,
    relative_index,
    rows_by_distance,
    visible_keys,
)


@pytest.mark.parametrize("horizon", [0, 1, 3])
def test_relative_index_and_toeplitz_rows(horizon):
    """Row h + t of a table is distance p_i - j = t, clipped; the Toeplitz bias holds offset j - p_i = r - h."""
    queries, keys = torch.arange(4) + 5, torch.arange(11)
    index = relative_index(queries, keys, horizon)
    bias = torch.randn(2, 2 * horizon + 1, dtype=torch.float64)
    by_distance = rows_by_distance(bias)
    for i, p in enumerate(queries.tolist()):
        for j in keys.tolist():
            assert index[i, j] == min(max(p - j, -horizon), horizon) + horizon
            offset_row = min(max(j - p, -horizon), horizon) + horizon
            assert torch.equal(by_distance[:, index[i, j]], bias[:, offset_row])


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
def test_visible_keys(causal, masked):
    lq, lk, offset = 5, 9, 2
    key_mask = torch.tensor([[1, 0, 1, 1, 0, 1, 1, 1, 1], [0] * 9]) if masked else None
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=offset, device="cpu")
    assert keep.dtype == torch.bool and keep.dim() == 4
    keep = keep.expand(2, 1, lq, lk)
    for b in range(2):
        for i in range(lq):
            for j in range(lk):
                expected = not (causal and j > i + offset) and (key_mask is None or bool(key_mask[b, j]))
                assert bool(keep[b, 0, i, j]) == expected


def test_normalisers_give_zero_rows_without_keys():
    num = torch.tensor([[2.0, 4.0], [3.0, 3.0], [1.0, 1.0]], dtype=torch.float64)
    den = torch.tensor([[2.0], [0.0], [-0.001]], dtype=torch.float64)
    torch.testing.assert_close(normalise(num, den), torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]], dtype=num.dtype))
    visible = torch.tensor([[True], [False], [True]])
    torch.testing.assert_close(normalise(num, den, visible)[2], num[2] / -0.001)
    # the guard: |den| >= eps M keeps den, otherwise sign(den) eps M; M == 0 gives 0
    big = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
    out = guarded_normalise(num, den, big, 0.01)
    torch.testing.assert_close(out, torch.stack([num[0] / 2.0, torch.zeros(2, dtype=num.dtype), num[2] / -0.01]))


@pytest.mark.parametrize("budget", [1, 60, 1 << 20], ids=["one-row", "three-rows", "all-rows"])
def test_grouped_rows_matches_autograd(budget, monkeypatch):
    """Outputs and gradients of every input that wants one, whatever the groups; `y` wants none. With one row
    per group, rows 4 and 5 return a constant, which has no gradient to give."""
    monkeypatch.setattr(ops_common, "BLOCK_ELEMENTS", budget)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 4, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(7, 4, dtype=torch.float64, generator=gen)
    rate = torch.rand(7, dtype=torch.float64, generator=gen).requires_grad_()

    def fn(x, y, rate):
        out = torch.tanh(x) @ y[..., None] * torch.exp(-rate)[:, None, None]
        return out.detach() if out.shape[0] and bool((y[:, 0] > 10).all()) else out

    y[4:6, 0] = 11.0  # with one row per group, rows 4 and 5 return a constant
    got = grouped_rows(fn, 20, x, y, rate)
    expected = fn(x, y, rate)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    grad = torch.randn_like(expected)
    got_grads = torch.autograd.grad(got, (x, rate), grad)
    if budget == 1:
        expected = torch.cat([fn(x[r:r + 1], y[r:r + 1], rate[r:r + 1]) for r in range(7)])
    expected_grads = torch.autograd.grad(expected, (x, rate), grad)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=0)
    if budget == 1:
        assert float(got_grads[0][4:6].abs().sum()) == 0.0


def test_values_are_checked_on_cpu_only():
    """A key mask of 2s is refused on CPU; on another device only its shape is checked (no device sync)."""
    with pytest.raises(ValueError, match="`key_mask` must hold only 0 and 1"):
        check_key_mask(torch.full((2, 3), 2.0), 2, 3)
    meta = torch.full((2, 3), 2.0, device="meta")
    assert checks_values(torch.zeros(1)) and not checks_values(meta)
    check_key_mask(meta, 2, 3)
    with pytest.raises(ValueError, match="must have shape"):
        check_key_mask(meta, 2, 4)


def test_compute_dtype_is_looked_up():
    """float32 for half precision and the input dtype otherwise, as torch.promote_types gives it; for the floating
    dtypes without an operation for the dispatcher (each costs the host time in every call of an op)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorded(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append(func)
            return func(*args, **(kwargs or {}))

    floating = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    with Recorded() as recorded:
        dtypes = [ops_common.compute_dtype(dtype) for dtype in floating]
    assert dtypes == [torch.promote_types(dtype, torch.float32) for dtype in floating]
    assert dtypes == [torch.float32, torch.float32, torch.float32, torch.float64]
    assert recorded.calls == []
    assert ops_common.compute_dtype(torch.int64) == torch.float32
