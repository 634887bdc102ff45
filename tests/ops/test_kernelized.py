"""Kernelized RPE attention: every fast path against the quadratic reference in float64."""

import functools
import math

import pytest
import torch

from modeling_scaleformer import ops_kernelized
from modeling_scaleformer.ops_kernelized import (
    KernelizedRPEState,
    choose_mode,
    chunk_kernelized_rpe_attention,
    kernelized_rpe_attention,
    kernelized_rpe_choose_mode,
    kernelized_rpe_cross_step,
    kernelized_rpe_cross_summary,
    kernelized_rpe_initial_state,
    kernelized_rpe_prefill_state,
    kernelized_rpe_step,
)
from modeling_scaleformer.ops_naive import naive_kernelized_rpe_attention


F64 = torch.float64


def check_against_naive(assert_matches, fn, q, k, v, rel, key_mask, causal, offset):
    """fn against the float64 reference: outputs and the gradients of q, k, v and rel."""
    tensors = (q, k, v) if rel is None else (q, k, v, rel)
    kwargs = dict(causal=causal, key_mask=key_mask, query_offset=offset)
    tolerances = dict(rtol=1e-10, atol=1e-12, grad_rtol=1e-9, grad_atol=1e-11)
    assert_matches(fn, naive_kernelized_rpe_attention, tensors, "q k v rel".split(), **kwargs, **tolerances)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_chunk(kernelized_case, causal, kernelized_inputs, split_case, assert_matches):
    (q, k, v, rel, key_mask), offset = split_case(kernelized_inputs, kernelized_case)
    chunk_4 = functools.partial(chunk_kernelized_rpe_attention, chunk_size=4)
    check_against_naive(assert_matches, chunk_4, q, k, v, rel, key_mask, causal, offset)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_chunk_in_small_blocks(monkeypatch, causal, kernelized_inputs, assert_matches):
    """Many row groups and chunk blocks: the blocking must not change the result."""
    monkeypatch.setattr(ops_kernelized, "BLOCK_ELEMENTS", 200)
    q, k, v, rel, key_mask = kernelized_inputs(b=2, h=3, lq=37, lk=29, mask="padding")
    chunk_4 = functools.partial(chunk_kernelized_rpe_attention, chunk_size=4)
    check_against_naive(assert_matches, chunk_4, q, k, v, rel, key_mask, causal, 5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_mode_default_chunk(causal, kernelized_inputs, assert_matches):
    q, k, v, rel, key_mask = kernelized_inputs(b=1, h=2, lq=150, lk=140, d=8, dv=6, horizon=5, mask="padding")
    linear = functools.partial(kernelized_rpe_attention, mode="linear")
    check_against_naive(assert_matches, linear, q, k, v, rel, key_mask, causal, 3)


def test_chunk_gradcheck(kernelized_inputs):
    q, k, v, rel, key_mask = kernelized_inputs(b=1, h=2, lq=7, lk=6, d=3, dv=2, horizon=2, mask="padding")
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, rel))
    for causal in (False, True):
        torch.autograd.gradcheck(
            lambda *x: chunk_kernelized_rpe_attention(*x, causal=causal, key_mask=key_mask, query_offset=1, chunk_size=2),
            inputs,
        )


def test_auto_mode_follows_choose_mode(monkeypatch, kernelized_inputs):
    q, k, v, rel, _ = kernelized_inputs(lq=12, lk=12)
    calls = []
    monkeypatch.setattr(
        ops_kernelized, "kernelized_rpe_choose_mode", lambda *a, **kw: calls.append((a, kw)) or "linear"
    )
    monkeypatch.setattr(
        ops_kernelized, "chunk_kernelized_rpe_attention", lambda *a, **kw: torch.full((2, 3, 12, 4), 7.0)
    )
    out = kernelized_rpe_attention(q, k, v, rel, causal=True, mode="auto")
    assert calls == [((12, 12, 5, 4, 3), dict(causal=True, batch_heads=6))] and bool((out == 7.0).all())


def test_choose_mode():
    assert choose_mode is kernelized_rpe_choose_mode  # the first name of the cost model stays importable
    # crossovers measured on a 2-core CPU, D = 64: about L = 300 with 8 heads, 250 with 64 batch*heads
    assert choose_mode(256, 256, 64, 64, 16, causal=True, batch_heads=8) == "naive"
    assert choose_mode(384, 384, 64, 64, 16, causal=True, batch_heads=8) == "linear"
    assert choose_mode(256, 256, 64, 64, 16, causal=False, batch_heads=64) == "naive"
    assert choose_mode(384, 384, 64, 64, 16, causal=False, batch_heads=64) == "linear"
    assert choose_mode(64, 64, 64, 64, 16, causal=True) == "naive"
    assert choose_mode(64, 64, 64, 64, 16, causal=False) == "naive"
    assert choose_mode(8192, 8192, 64, 64, 16, causal=True) == "linear"
    assert choose_mode(8192, 8192, 64, 64, 16, causal=False) == "linear"
    assert choose_mode(1, 100_000, 64, 64, 16, causal=False) == "naive"  # one query: O(Lk) either way
    # monotone in length: once linear, stays linear
    picks = [choose_mode(n, n, 64, 64, 16, causal=True) for n in (2**i for i in range(4, 16))]
    assert picks == sorted(picks, key=lambda m: m == "linear")


@pytest.mark.parametrize("horizon", [None, 0, 1, 3], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("mask", [None, "padding"])
def test_step_token_by_token_and_in_chunks(horizon, mask, kernelized_inputs):
    q, k, v, rel, key_mask = kernelized_inputs(b=2, h=2, lq=11, lk=11, horizon=horizon, mask=mask)
    full = naive_kernelized_rpe_attention(q, k, v, rel, causal=True, key_mask=key_mask)
    for pieces in ([1] * 11, [3, 1, 4, 3], [11]):
        state = kernelized_rpe_initial_state(2, 2, 5, 4, horizon or 0, dtype=F64)
        outs, start = [], 0
        for n in pieces:
            sl = slice(start, start + n)
            m = None if key_mask is None else key_mask[:, sl]
            o, state = kernelized_rpe_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], rel, state, key_mask=m, chunk_size=2)
            outs.append(o)
            start += n
        torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-10, atol=1e-12)
        assert state.seen == 11
        assert state.window.shape[2] == max((horizon or 0) - 1, 0)


@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_prefill_state_then_steps(prompt, kernelized_inputs):
    q, k, v, rel, key_mask = kernelized_inputs(b=2, h=2, lq=12, lk=12, horizon=4, mask="padding")
    full = naive_kernelized_rpe_attention(q, k, v, rel, causal=True, key_mask=key_mask)
    state = kernelized_rpe_prefill_state(k[:, :, :prompt], v[:, :, :prompt], horizon=4, key_mask=key_mask[:, :prompt])
    outs = []
    for t in range(prompt, 12):
        sl = slice(t, t + 1)
        o, state = kernelized_rpe_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], rel, state, key_mask=key_mask[:, sl])
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), full[:, :, prompt:], rtol=1e-10, atol=1e-12)


def test_state_size_is_constant(kernelized_inputs):
    q, k, v, rel, _ = kernelized_inputs(b=1, h=2, lq=40, lk=40, horizon=3)
    state = kernelized_rpe_initial_state(1, 2, 5, 4, 3, dtype=F64)
    sizes = set()
    for t in range(40):
        sl = slice(t, t + 1)
        _, state = kernelized_rpe_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], rel, state)
        sizes.add(sum(x.numel() for x in state[:3]))
    assert len(sizes) == 1


@pytest.mark.parametrize("horizon", [None, 0, 1, 3], ids=lambda h: f"h{h}")
def test_cross_step(horizon, kernelized_inputs):
    q, k, v, rel, key_mask = kernelized_inputs(b=2, h=2, lq=9, lk=13, horizon=horizon, mask="padding")
    summary = kernelized_rpe_cross_summary(k, v, key_mask=key_mask, relative=rel is not None)
    for offset in (0, 4, 20):
        full = naive_kernelized_rpe_attention(q, k, v, rel, key_mask=key_mask, query_offset=offset)
        for t in range(9):
            got = kernelized_rpe_cross_step(q[:, :, t : t + 1], rel, summary, query_offset=offset + t)
            torch.testing.assert_close(got, full[:, :, t : t + 1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "dtype, tolerance", [(torch.bfloat16, 2e-2), (torch.float16, 3e-3)], ids=["bf16", "fp16"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_half_precision(dtype, tolerance, causal, kernelized_inputs, assert_low_precision):
    """Half precision accumulates in float32: the error is that of rounding the inputs and output."""
    q, k, v, rel, key_mask = kernelized_inputs(b=1, h=2, lq=300, lk=300, d=16, dv=16, horizon=8, mask="padding")
    half = [t.to(dtype).requires_grad_(True) for t in (q, k, v, rel)]
    assert_low_precision(
        functools.partial(kernelized_rpe_attention, mode="linear"), naive_kernelized_rpe_attention, half,
        dict(causal=causal, key_mask=key_mask), tolerance=tolerance, names="q k v rel".split(),
    )


def test_linear_memory_has_no_quadratic_buffer(kernelized_inputs):
    """At L = 4096 a quadratic path would need B*H*L*L floats; the saved tensors are the inputs only."""
    q, k, v, rel, _ = kernelized_inputs(b=1, h=1, lq=4096, lk=4096, d=8, dv=8, horizon=4, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = kernelized_rpe_attention(*(t.requires_grad_(True) for t in (q, k, v, rel)), causal=True, mode="linear")
    assert max(saved) <= 4096 * 9
    assert math.isfinite(out.sum().item())


BAD = [
    pytest.param(dict(q=torch.randn(2, 3, 4)), "`q`", id="q-3d"),
    pytest.param(dict(k=torch.randn(2, 3, 5, 6)), "`k`", id="k-dim"),
    pytest.param(dict(v=torch.randn(2, 3, 6, 4)), "`v`", id="v-length"),
    pytest.param(dict(q=torch.randint(0, 3, (2, 3, 5, 5))), "`q`", id="q-int"),
    pytest.param(dict(v=torch.randn(2, 3, 5, 4, dtype=F64)), "dtype", id="mixed-dtype"),
    pytest.param(dict(rel=torch.randn(3, 6, 5)), "`rel`", id="rel-even"),
    pytest.param(dict(rel=torch.randn(4, 7, 5)), "`rel`", id="rel-heads"),
    pytest.param(dict(key_mask=torch.ones(2, 4)), "`key_mask`", id="mask-shape"),
    pytest.param(dict(key_mask=torch.full((2, 5), 2)), "`key_mask`", id="mask-values"),
    pytest.param(dict(query_offset=-1), "`query_offset`", id="offset"),
    pytest.param(dict(mode="fast"), "`mode`", id="mode"),
]


@pytest.mark.parametrize("override, name", BAD)
def test_bad_inputs_raise(override, name):
    args = dict(
        q=torch.randn(2, 3, 5, 5), k=torch.randn(2, 3, 5, 5), v=torch.randn(2, 3, 5, 4), rel=torch.randn(3, 7, 5)
    )
    args.update(override)
    kwargs = {key: args.pop(key) for key in ("key_mask", "query_offset", "mode") if key in args}
    with pytest.raises(ValueError, match=name):
        kernelized_rpe_attention(args["q"], args["k"], args["v"], args["rel"], **kwargs)


def test_step_rejects_wrong_state(kernelized_inputs):
    q, k, v, rel, _ = kernelized_inputs(b=1, h=2, lq=1, lk=1, horizon=3)
    with pytest.raises(ValueError, match="`state`"):
        kernelized_rpe_step(q, k, v, rel, kernelized_rpe_initial_state(1, 2, 5, 4, 5, dtype=F64))
    with pytest.raises(ValueError, match="`state`"):
        kernelized_rpe_step(q, k, v, rel, (1, 2, 3))
    assert isinstance(kernelized_rpe_initial_state(1, 2, 5, 4, 3, dtype=F64), KernelizedRPEState)
