"""The blocked linear path of Fourier attention (`ops_fourier_chunk`, through `chunk_fourier_attention`)
against the quadratic reference in float64: cases, blocking, finite differences, memory."""

import functools
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_scaleformer import ops_fourier, ops_fourier_chunk
from modeling_scaleformer.ops_fourier import chunk_fourier_attention, fourier_attention
from modeling_scaleformer.ops_fourier_chunk import ChunkFourierFunction, FourierChunkConfig
from modeling_scaleformer.ops_naive import naive_fourier_attention


F64 = torch.float64


def check_against_naive(assert_matches, fn, q, k, v, params, key_mask, positions, causal, offset, eps=1e-2):
    """fn against the float64 reference: outputs and the gradients of q, k, v, a, b and c."""
    kwargs = dict(
        causal=causal, key_mask=key_mask, query_offset=offset, q_positions=positions[0], k_positions=positions[1],
        eps=eps,
    )
    tolerances = dict(rtol=1e-10, atol=1e-12, grad_rtol=1e-9, grad_atol=1e-11)
    assert_matches(fn, naive_fourier_attention, (q, k, v, *params), "q k v a b c".split(), **kwargs, **tolerances)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_chunk(fourier_case, causal, fourier_inputs, split_case, assert_matches):
    (q, k, v, params, key_mask, positions), offset = split_case(fourier_inputs, fourier_case)
    chunk_4 = functools.partial(chunk_fourier_attention, chunk_size=4)
    check_against_naive(assert_matches, chunk_4, q, k, v, params, key_mask, positions, causal, offset)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_mode_default_chunk(causal, fourier_inputs, assert_matches):
    q, k, v, params, key_mask, _ = fourier_inputs(b=1, h=2, lq=150, lk=140, d=8, dv=6, mask="padding")
    linear = functools.partial(fourier_attention, mode="linear")
    check_against_naive(assert_matches, linear, q, k, v, params, key_mask, (None, None), causal, 3)


def test_linear_memory_has_no_quadratic_buffer(fourier_inputs):
    """At L = 4096 a quadratic path would save L*L floats; the linear path saves O(L (c + D + Dv))."""
    length, d = 4096, 8
    q, k, v, params, _, _ = fourier_inputs(b=1, h=1, lq=length, lk=length, d=d, dv=d, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        inputs = [t.requires_grad_(True) for t in (q, k, v, *params)]
        out = fourier_attention(*inputs, causal=True, mode="linear")
    assert max(saved) <= length * ops_fourier.DEFAULT_CHUNK_SIZE
    assert sum(saved) <= 8 * length * (ops_fourier.DEFAULT_CHUNK_SIZE + 2 * d)  # L * L would be 16.7 M
    assert math.isfinite(out.sum().item())


def eps_between_rows(fourier_loop_sums, q, k, v, params, causal, key_mask, offset, positions):
    """An eps in the widest gap between the middle values of |den| / M, so that the guard acts on some
    rows only, and no row sits near either kink of the guard (|den| = eps M, or den = 0 when guarded)."""
    _, den, big = fourier_loop_sums(q, k, v, params, causal, key_mask, offset, positions)
    ratios = (den.abs() / big)[big > 0].sort().values
    lo, hi = len(ratios) // 4, 3 * len(ratios) // 4
    gaps = ratios[lo + 1 : hi + 1] / ratios[lo:hi]
    i = lo + int(gaps.argmax())
    assert float(gaps.max()) > 1.05 and float(ratios[0]) > 1e-3
    return math.sqrt(float(ratios[i] * ratios[i + 1]))


@pytest.mark.parametrize(
    "causal, npos",
    [pytest.param(False, None, id="bidirectional-token-positions"), pytest.param(True, 2, id="causal-2d-positions")],
)
def test_chunk_gradcheck(monkeypatch, causal, npos, fourier_inputs, fourier_loop_sums):
    """Finite differences of the autograd.Function, in many blocks, with the guard acting on some rows."""
    monkeypatch.setattr(ops_fourier_chunk, "BLOCK_ELEMENTS", 40)  # one chunk per span
    q, k, v, params, _, positions = fourier_inputs(b=1, h=2, lq=6, lk=5, d=2, dv=2, npos=npos)
    key_mask = torch.tensor([[1, 0, 1, 1, 1]])
    eps = eps_between_rows(fourier_loop_sums, q, k, v, params, causal, key_mask, 1, positions)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, *params))
    torch.autograd.gradcheck(
        lambda *x: ChunkFourierFunction.apply(*x, *positions, key_mask, FourierChunkConfig(causal, 1, 2, eps)), inputs
    )


# queries at positions 5..27, keys 0..18: spans of keys only, of both, and of queries only
OFFSET_CASE = dict(lq=23, lk=19, mask="padding", npos=2, shared_positions=True, offset=5)


@pytest.mark.parametrize(
    "block_elements, groups, span_chunks, case",
    [
        pytest.param(1, 6, 1, OFFSET_CASE, id="one-row-one-chunk"),
        pytest.param(120, 4, 1, OFFSET_CASE, id="heads-split"),
        pytest.param(200, 2, 1, OFFSET_CASE, id="one-batch-row"),
        pytest.param(1000, 1, 3, OFFSET_CASE, id="chunks-per-span"),
        pytest.param(1000, 1, 3, dict(lq=9, lk=11, mask="random", offset=30), id="offset-past-keys"),
    ],
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_chunk_in_small_blocks(
    monkeypatch, block_elements, groups, span_chunks, case, causal, fourier_inputs, split_case, assert_matches
):
    """Row groups of heads or batch rows, spans of one or more chunks: blocking must not change results."""
    monkeypatch.setattr(ops_fourier_chunk, "BLOCK_ELEMENTS", block_elements)
    plan = ops_fourier_chunk._plan(2, 3, 4, 5, 4)
    assert (len(plan.groups), plan.span_chunks) == (groups, span_chunks)
    (q, k, v, params, key_mask, positions), offset = split_case(fourier_inputs, case)
    chunk_4 = functools.partial(chunk_fourier_attention, chunk_size=4)
    check_against_naive(assert_matches, chunk_4, q, k, v, params, key_mask, positions, causal, offset)


class _LargeAllocations(TorchDispatchMode):
    """Records the size of every new tensor (not a view or an in-place result) above `limit` elements."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.sizes = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if all(r.alias_info is None for r in func._schema.returns):
            leaves = out if isinstance(out, (tuple, list)) else [out]
            self.sizes += [t.numel() for t in leaves if isinstance(t, torch.Tensor) and t.numel() > self.limit]
        return out


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_temporaries_stay_below_block_elements(monkeypatch, causal, fourier_inputs):
    """Forward and backward create nothing larger than BLOCK_ELEMENTS but the output and the gradients."""
    limit = 2048
    monkeypatch.setattr(ops_fourier_chunk, "BLOCK_ELEMENTS", limit)
    q, k, v, params, key_mask, _ = fourier_inputs(b=2, h=2, lq=150, lk=130, d=8, dv=6, mask="padding")
    inputs = [t.requires_grad_(True) for t in (q, k, v, *params)]
    upstream = torch.randn(2, 2, 150, 6, dtype=F64)
    with _LargeAllocations(limit) as forward:
        out = chunk_fourier_attention(*inputs, causal=causal, key_mask=key_mask, query_offset=7, chunk_size=16)
    with _LargeAllocations(limit) as backward:
        torch.autograd.grad(out, inputs, upstream)
    assert forward.sizes == [out.numel()]
    assert sorted(backward.sizes) == sorted([q.numel(), k.numel(), v.numel()])


def test_backward_saves_only_the_inputs(fourier_inputs):
    """What autograd keeps for the backward pass is q, k, v, a, b, c, positions and key mask: O(L (D + Dv))."""
    q, k, v, params, key_mask, positions = fourier_inputs(b=2, h=3, lq=300, lk=260, d=6, dv=5, npos=2, mask="padding")
    inputs = [t.requires_grad_(True) for t in (q, k, v, *params)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        for causal in (False, True):
            chunk_fourier_attention(
                *inputs, causal=causal, key_mask=key_mask, q_positions=positions[0], k_positions=positions[1],
                chunk_size=8,
            )
    expected = [*inputs, *positions, key_mask]
    assert len(saved) == 2 * len(expected)
    for got, want in zip(saved, expected * 2):
        assert got.data_ptr() == want.data_ptr() and got.shape == want.shape
