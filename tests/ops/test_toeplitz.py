"""Toeplitz (exponentiated relative bias) attention: the FFT path and the recurrent step against the
quadratic reference in float64."""

import functools
import math

import pytest
import torch

from modeling_scaleformer import ops_toeplitz
from modeling_scaleformer.ops_naive import naive_toeplitz_attention
from modeling_scaleformer.ops_toeplitz import (
    ToeplitzState,
    fft_toeplitz_attention,
    toeplitz_attention,
    toeplitz_choose_mode,
    toeplitz_initial_state,
    toeplitz_prefill_state,
    toeplitz_step,
)


F64 = torch.float64


def check_against_naive(assert_matches, fn, q, k, v, bias, key_mask, causal, offset):
    """fn against the float64 reference: outputs and the gradients of q, k, v and bias."""
    # FFT round-off is relative to the largest term of a convolution; float64 leaves ample room
    tolerances = dict(rtol=1e-9, atol=1e-11, grad_rtol=1e-8, grad_atol=1e-10)
    names = ("q", "k", "v", "bias")
    return assert_matches(
        fn, naive_toeplitz_attention, (q, k, v, bias), names, causal=causal, key_mask=key_mask, query_offset=offset,
        **tolerances,
    )


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fft(toeplitz_case, causal, toeplitz_inputs, split_case, assert_matches):
    (q, k, v, bias, key_mask), offset = split_case(toeplitz_inputs, toeplitz_case)
    out, grads = check_against_naive(assert_matches, fft_toeplitz_attention, q, k, v, bias, key_mask, causal, offset)
    if key_mask is not None and not bool(key_mask[0].any()):
        # a batch row with no visible key: exactly 0, and no gradient flows from it
        assert bool((out[0] == 0).all())
        assert bool((grads[0][0] == 0).all()) and bool((grads[1][0] == 0).all())


@pytest.mark.parametrize(
    "block_elements, n_blocks", [(100, 30), (1600, 2)], ids=["feature-and-channel-blocks", "row-blocks"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fft_in_many_blocks(monkeypatch, causal, block_elements, n_blocks, toeplitz_inputs, assert_matches):
    """Blocks of rows, key features and value channels must not change the result."""
    monkeypatch.setattr(ops_toeplitz, "FFT_BLOCK_ELEMENTS", block_elements)
    q, k, v, bias, key_mask = toeplitz_inputs(b=1, h=3, lq=17, lk=13, mask="padding")
    n_fft = ops_toeplitz._fft_length(17 + 13 - 1)
    assert len(list(ops_toeplitz._blocks(3, 5, 5, n_fft))) == n_blocks  # rows, features, channels
    check_against_naive(assert_matches, fft_toeplitz_attention, q, k, v, bias, key_mask, causal, 5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_mode(causal, toeplitz_inputs, assert_matches):
    q, k, v, bias, key_mask = toeplitz_inputs(b=1, h=2, lq=150, lk=140, d=8, dv=6, horizon=5, mask="padding")
    linear = functools.partial(toeplitz_attention, mode="linear")
    check_against_naive(assert_matches, linear, q, k, v, bias, key_mask, causal, 3)


def test_fft_gradcheck(toeplitz_inputs):
    q, k, v, bias, key_mask = toeplitz_inputs(b=1, h=2, lq=4, lk=3, d=2, dv=2, horizon=2, mask="padding")
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, bias))
    for causal in (False, True):
        torch.autograd.gradcheck(
            lambda *x: fft_toeplitz_attention(*x, causal=causal, key_mask=key_mask, query_offset=1),
            inputs,
            fast_mode=True,
        )


def test_fft_saves_only_inputs(toeplitz_inputs):
    """The backward pass recomputes spectra: nothing of size N D Dv (or L^2) is kept for it."""
    b, h, length, d, dv = 1, 2, 256, 8, 8
    q, k, v, bias, _ = toeplitz_inputs(b=b, h=h, lq=length, lk=length, d=d, dv=dv, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = fft_toeplitz_attention(*(t.requires_grad_(True) for t in (q, k, v, bias)), causal=True)
    assert max(saved) <= b * h * length * (dv + 1)
    assert math.isfinite(out.sum().item())


def test_auto_mode_follows_choose_mode(monkeypatch, toeplitz_inputs):
    q, k, v, bias, _ = toeplitz_inputs(lq=12, lk=12)
    calls = []
    monkeypatch.setattr(ops_toeplitz, "toeplitz_choose_mode", lambda *a, **kw: calls.append((a, kw)) or "linear")
    monkeypatch.setattr(ops_toeplitz, "fft_toeplitz_attention", lambda *a, **kw: torch.full((2, 3, 12, 4), 7.0))
    out = toeplitz_attention(q, k, v, bias, causal=True, mode="auto")
    assert calls == [((12, 12, 5, 4), dict(causal=True, batch_heads=6))] and bool((out == 7.0).all())


def test_choose_mode():
    # measured on one CPU thread, D = 64, 8 heads, forward + backward: crossover near L = 3000
    assert toeplitz_choose_mode(2048, 2048, 64, 64, causal=True, batch_heads=8) == "naive"
    assert toeplitz_choose_mode(4096, 4096, 64, 64, causal=True, batch_heads=8) == "linear"
    assert toeplitz_choose_mode(2048, 2048, 64, 64, causal=False, batch_heads=8) == "naive"
    assert toeplitz_choose_mode(4096, 4096, 64, 64, causal=False, batch_heads=8) == "linear"
    assert toeplitz_choose_mode(64, 64, 64, 64, causal=True) == "naive"
    assert toeplitz_choose_mode(32768, 32768, 64, 64, causal=True) == "linear"
    assert toeplitz_choose_mode(1, 100_000, 64, 64, causal=False) == "naive"  # one query: O(Lk) either way
    # monotone in length: once linear, stays linear
    picks = [toeplitz_choose_mode(n, n, 64, 64, causal=True, batch_heads=8) for n in (2**i for i in range(4, 16))]
    assert picks == sorted(picks, key=lambda m: m == "linear")


def run_steps(q, k, v, bias, key_mask, pieces, state):
    outs, start = [], state.seen
    for n in pieces:
        sl = slice(start, start + n)
        m = None if key_mask is None else key_mask[:, sl]
        o, state = toeplitz_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], bias, state, key_mask=m)
        outs.append(o)
        start += n
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize("horizon", [0, 1, 3, 15], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("mask", [None, "padding"])
def test_step_token_by_token_and_in_pieces(monkeypatch, horizon, mask, toeplitz_inputs):
    monkeypatch.setattr(ops_toeplitz, "STEP_CHUNK", 2)  # pieces longer than 2 are cut inside the step
    q, k, v, bias, key_mask = toeplitz_inputs(b=2, h=2, lq=11, lk=11, horizon=horizon, mask=mask)
    full = naive_toeplitz_attention(q, k, v, bias, causal=True, key_mask=key_mask)
    for pieces in ([1] * 11, [3, 1, 4, 3], [11]):
        state = toeplitz_initial_state(2, 2, 5, 4, horizon, dtype=F64)
        out, state = run_steps(q, k, v, bias, key_mask, pieces, state)
        torch.testing.assert_close(out, full, rtol=1e-10, atol=1e-12)
        assert state.seen == 11
        assert state.k_window.shape == (2, 2, horizon, 5)
        assert state.v_window.shape == (2, 2, horizon, 5)


@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_prefill_state_then_steps(prompt, toeplitz_inputs):
    q, k, v, bias, key_mask = toeplitz_inputs(b=2, h=2, lq=12, lk=12, horizon=4, mask="padding")
    full = naive_toeplitz_attention(q, k, v, bias, causal=True, key_mask=key_mask)
    state = toeplitz_prefill_state(k[:, :, :prompt], v[:, :, :prompt], 4, key_mask=key_mask[:, :prompt])
    # the same state as stepping through the prompt
    stepped = run_steps(q, k, v, bias, key_mask, [prompt], toeplitz_initial_state(2, 2, 5, 4, 4, dtype=F64))[1]
    assert state.seen == stepped.seen == prompt
    for name in ("kv_far", "k_window", "v_window"):
        torch.testing.assert_close(getattr(state, name), getattr(stepped, name), rtol=1e-12, atol=1e-12)
    out, _ = run_steps(q, k, v, bias, key_mask, [1] * (12 - prompt), state)
    torch.testing.assert_close(out, full[:, :, prompt:], rtol=1e-10, atol=1e-12)


def test_prefill_then_steps_after_full_causal_call(toeplitz_inputs):
    """The generation pattern: full causal call on the prompt, then tokens one at a time."""
    q, k, v, bias, key_mask = toeplitz_inputs(b=2, h=3, lq=20, lk=20, horizon=3, mask="padding")
    full = naive_toeplitz_attention(q, k, v, bias, causal=True, key_mask=key_mask)
    prompt = 14
    head = toeplitz_attention(
        q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], bias, causal=True, key_mask=key_mask[:, :prompt],
        mode="linear",
    )
    state = toeplitz_prefill_state(k[:, :, :prompt], v[:, :, :prompt], 3, key_mask=key_mask[:, :prompt])
    tail, _ = run_steps(q, k, v, bias, key_mask, [1] * (20 - prompt), state)
    torch.testing.assert_close(torch.cat([head, tail], dim=2), full, rtol=1e-10, atol=1e-12)


def test_state_size_is_constant(toeplitz_inputs):
    q, k, v, bias, _ = toeplitz_inputs(b=1, h=2, lq=40, lk=40, horizon=3)
    state = toeplitz_initial_state(1, 2, 5, 4, 3, dtype=F64)
    sizes = set()
    for t in range(40):
        _, state = run_steps(q, k, v, bias, None, [1], state)
        sizes.add(tuple(x.numel() for x in state[:3]))
        assert state.seen == t + 1
    assert sizes == {(2 * 5 * 5, 2 * 3 * 5, 2 * 3 * 5)}
    assert toeplitz_prefill_state(k, v, 3).kv_far.numel() == 2 * 5 * 5
    assert all(x.shape[0] == 1 for x in state[:3])  # batch first, for reordering


@pytest.mark.parametrize(
    "dtype, tolerance", [(torch.bfloat16, 2e-2), (torch.float16, 3e-3)], ids=["bf16", "fp16"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_half_precision(dtype, tolerance, causal, toeplitz_inputs, assert_low_precision):
    """Half precision is computed in float32: the error is that of rounding the inputs and output."""
    q, k, v, bias, key_mask = toeplitz_inputs(b=1, h=2, lq=300, lk=300, d=16, dv=16, horizon=8, mask="padding")
    half = [t.to(dtype).requires_grad_(True) for t in (q, k, v, bias)]
    assert_low_precision(
        functools.partial(toeplitz_attention, mode="linear"), naive_toeplitz_attention, half,
        dict(causal=causal, key_mask=key_mask), tolerance=tolerance, names=("q", "k", "v", "bias"),
    )


@pytest.mark.parametrize("causal, tolerance", [(False, 1e-6), (True, 1e-3)], ids=["bidirectional", "causal"])
def test_float32_tolerance(causal, tolerance, toeplitz_inputs):
    """FFT round-off in float32 is relative to the largest sums of the sequence.

    Measured at L = 512 (bias of std 1, padding): about 1e-7 bidirectional; causal rows that see few
    keys next to late rows that see many reach 2e-4 (and grow about linearly with L).
    """
    q, k, v, bias, key_mask = toeplitz_inputs(b=2, h=2, lq=512, lk=512, d=16, dv=16, horizon=8, mask="padding")
    ref_inputs = [t.requires_grad_(True) for t in (q, k, v, bias)]
    inputs = [t.detach().float().requires_grad_(True) for t in ref_inputs]
    out = fft_toeplitz_attention(*inputs, causal=causal, key_mask=key_mask)
    ref = naive_toeplitz_attention(*ref_inputs, causal=causal, key_mask=key_mask)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.to(F64), ref, rtol=tolerance, atol=tolerance)
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, inputs, upstream.float())
    ref_grads = torch.autograd.grad(ref, ref_inputs, upstream)
    for g, rg in zip(grads, ref_grads):
        scale = rg.abs().max().item()
        torch.testing.assert_close(g.to(F64), rg, rtol=tolerance, atol=tolerance * scale)


BAD = [
    pytest.param(dict(q=torch.randn(2, 3, 4)), "`q`", id="q-3d"),
    pytest.param(dict(k=torch.randn(2, 3, 5, 6)), "`k`", id="k-dim"),
    pytest.param(dict(v=torch.randn(2, 3, 6, 4)), "`v`", id="v-length"),
    pytest.param(dict(bias=torch.randn(7)), "`bias`", id="bias-1d"),
    pytest.param(dict(bias=torch.randn(2, 3, 7)), "`bias`", id="bias-3d"),
    pytest.param(dict(bias=torch.randn(3, 6)), "`bias`", id="bias-even"),
    pytest.param(dict(bias=torch.randn(4, 7)), "`bias`", id="bias-heads"),
    pytest.param(dict(bias=torch.randn(3, 7, dtype=F64)), "`bias`", id="bias-dtype"),
    pytest.param(dict(bias=[0.0] * 7), "`bias`", id="bias-list"),
    pytest.param(dict(key_mask=torch.ones(2, 4)), "`key_mask`", id="mask-shape"),
    pytest.param(dict(key_mask=torch.full((2, 5), 2)), "`key_mask`", id="mask-values"),
    pytest.param(dict(query_offset=-1), "`query_offset`", id="offset"),
    pytest.param(dict(mode="fast"), "`mode`", id="mode"),
]


@pytest.mark.parametrize("override, name", BAD)
def test_bad_inputs_raise(override, name):
    args = dict(
        q=torch.randn(2, 3, 5, 5), k=torch.randn(2, 3, 5, 5), v=torch.randn(2, 3, 5, 4), bias=torch.randn(3, 7)
    )
    args.update(override)
    kwargs = {key: args.pop(key) for key in ("key_mask", "query_offset", "mode") if key in args}
    with pytest.raises(ValueError, match=name):
        toeplitz_attention(args["q"], args["k"], args["v"], args["bias"], **kwargs)
    if "mode" not in kwargs:
        with pytest.raises(ValueError, match=name):
            fft_toeplitz_attention(args["q"], args["k"], args["v"], args["bias"], **kwargs)


def test_step_rejects_bad_inputs(toeplitz_inputs):
    q, k, v, bias, _ = toeplitz_inputs(b=1, h=2, lq=1, lk=1, horizon=3)
    with pytest.raises(ValueError, match="`state`"):
        toeplitz_step(q, k, v, bias, toeplitz_initial_state(1, 2, 5, 4, 5, dtype=F64))  # other horizon
    with pytest.raises(ValueError, match="`state`"):
        toeplitz_step(q, k, v, bias, (1, 2, 3))
    with pytest.raises(ValueError, match="`bias`"):
        toeplitz_step(q, k, v, bias[:, :6], toeplitz_initial_state(1, 2, 5, 4, 3, dtype=F64))
    with pytest.raises(ValueError, match="`horizon`"):
        toeplitz_initial_state(1, 2, 5, 4, -1, dtype=F64)
    with pytest.raises(ValueError, match="`horizon`"):
        toeplitz_prefill_state(k, v, 1.5)
    assert isinstance(toeplitz_initial_state(1, 2, 5, 4, 3, dtype=F64), ToeplitzState)
