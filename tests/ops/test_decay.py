"""Kernelized attention with a decay beyond the horizon: every fast path against the quadratic reference in
float64, forward and gradients, and the recurrent state against the full causal forward."""

import functools

import pytest
import torch

from modeling_scaleformer import ops_decay
from modeling_scaleformer.ops_decay import (
    KernelizedDecayState,
    chunk_kernelized_decay_attention,
    kernelized_decay_attention,
    kernelized_decay_choose_mode,
    kernelized_decay_initial_state,
    kernelized_decay_prefill_state,
    kernelized_decay_step,
    kernelized_sum_attention,
    kernelized_sum_choose_mode,
    prefix_sums_fit,
)
from modeling_scaleformer.ops_naive import naive_kernelized_decay_attention, naive_kernelized_rpe_scores


F64 = torch.float64


NORMALISE = pytest.mark.parametrize("normalise", [False, True], ids=["sum", "normalised"])
FEATURE_MAP = pytest.mark.parametrize("feature_map", ["elu", "relu"])


@FEATURE_MAP
@NORMALISE
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunk(decay_case, causal, chunk, normalise, feature_map, decay_inputs, split_case, check_decay_op):
    inputs, offset = split_case(decay_inputs, decay_case)
    fn = functools.partial(chunk_kernelized_decay_attention, chunk_size=chunk)
    check_decay_op(fn, naive_kernelized_decay_attention, inputs, causal, offset, normalise=normalise,
                   feature_map=feature_map)


@NORMALISE
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_mode_default_chunk(causal, normalise, decay_inputs, check_decay_op):
    inputs = decay_inputs(b=1, h=2, lq=150, lk=140, d=8, dv=6, horizon=5, mask="padding")
    fn = functools.partial(kernelized_decay_attention, mode="linear")
    check_decay_op(fn, naive_kernelized_decay_attention, inputs, causal, 3, normalise=normalise)


@FEATURE_MAP
@NORMALISE
def test_chunk_gradcheck(normalise, feature_map, decay_inputs):
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=9, lk=8, d=3, dv=2, horizon=1, mask="padding")
    leaves = tuple(t.requires_grad_(True) for t in (q, k, v, rel, decay))
    for causal in (False, True):
        torch.autograd.gradcheck(
            lambda q, k, v, rel, decay: chunk_kernelized_decay_attention(
                q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=1, chunk_size=2,
                normalise=normalise, feature_map=feature_map,
            ),
            leaves,
        )


def test_normalised_with_zero_decay_is_kernelized_rpe(decay_inputs):
    from modeling_scaleformer.ops_naive import naive_kernelized_rpe_attention

    q, k, v, rel, _, key_mask, _ = decay_inputs(lq=20, lk=20, horizon=2, mask="random")
    for causal in (False, True):
        got = chunk_kernelized_decay_attention(q, k, v, rel, torch.zeros(3, dtype=F64), causal=causal,
                                               key_mask=key_mask, chunk_size=4, normalise=True)
        expected = naive_kernelized_rpe_attention(q, k, v, rel, causal=causal, key_mask=key_mask)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_zero_decay_is_the_unnormalised_kernelized_rpe_sum(decay_inputs):
    q, k, v, rel, _, key_mask, _ = decay_inputs(lq=20, lk=20, horizon=2, mask="padding")
    for causal in (False, True):
        got = chunk_kernelized_decay_attention(q, k, v, rel, torch.zeros(3, dtype=F64), causal=causal,
                                               key_mask=key_mask, chunk_size=4)
        expected = naive_kernelized_rpe_scores(q, k, rel, causal=causal, key_mask=key_mask) @ v
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_relu_feature_map_gives_scores_of_zero(decay_inputs):
    """With phi = max(x, 0), a query whose coordinates are all negative gives every key a weight of exactly 0 (elu + 1
    never does), and so does a key whose coordinates are all negative, beyond the horizon's relative term."""
    q, k, v, rel, decay, _, horizon = decay_inputs(b=1, h=2, lq=6, lk=6, horizon=1)
    q[:, :, 2] = -q[:, :, 2].abs() - 0.1
    for feature_map, zero in (("relu", True), ("elu", False)):
        out = chunk_kernelized_decay_attention(q, k, v, rel, decay, causal=True, chunk_size=2, feature_map=feature_map)
        assert bool((out[:, :, 2] == 0).all()) is zero
    scores = naive_kernelized_rpe_scores(q, -k.abs() - 0.1, None, feature_map="relu")
    assert bool((scores == 0).all())


def test_fast_decay_leaves_only_the_band(decay_inputs):
    """With lambda = 60 the keys beyond the horizon weigh exp(-60) or less: the output is the band alone."""
    q, k, v, rel, _, _, horizon = decay_inputs(lq=30, lk=30, horizon=2)
    got = chunk_kernelized_decay_attention(q, k, v, rel, torch.full((3,), 60.0, dtype=F64), chunk_size=4)
    scores = naive_kernelized_rpe_scores(q, k, rel)
    band = (torch.arange(30)[:, None] - torch.arange(30)[None, :]).abs() <= horizon
    torch.testing.assert_close(got, (scores * band) @ v, rtol=1e-10, atol=1e-12)
    assert (got - scores @ v).abs().max() > 1.0  # without the decay the far keys change the output


@NORMALISE
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype, normalise, decay_inputs, assert_low_precision):
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=70, lk=70, d=8, dv=8, horizon=3,
                                                          mask="padding", dtype=dtype)
    leaves = [t.requires_grad_(True) for t in (q, k, v, rel)]
    kwargs = dict(causal=True, key_mask=key_mask, horizon=horizon, normalise=normalise)

    def call(op, decay_dtype):
        return lambda q, k, v, rel, **kw: op(q, k, v, rel, decay.to(q.dtype), **kw)

    assert_low_precision(call(functools.partial(chunk_kernelized_decay_attention, chunk_size=16), dtype),
                         call(naive_kernelized_decay_attention, F64), leaves, kwargs, tolerance=0.05,
                         names="q k v rel".split())


def test_auto_mode_follows_choose_mode(monkeypatch, decay_inputs):
    q, k, v, rel, decay, _, _ = decay_inputs(lq=12, lk=12)
    calls = []
    monkeypatch.setattr(ops_decay, "kernelized_decay_choose_mode", lambda *a, **kw: calls.append((a, kw)) or "linear")
    monkeypatch.setattr(ops_decay, "chunk_kernelized_decay_attention", lambda *a, **kw: torch.full((2, 3, 12, 4), 7.0))
    out = kernelized_decay_attention(q, k, v, rel, decay, causal=True, mode="auto")
    assert calls == [((12, 12, 5, 4, 3), dict(causal=True, batch_heads=6))] and bool((out == 7.0).all())


def test_choose_mode():
    assert kernelized_decay_choose_mode(64, 64, 64, 64, 16, causal=True) == "naive"
    assert kernelized_decay_choose_mode(96, 96, 64, 64, 16, causal=False, batch_heads=128) == "naive"
    assert kernelized_decay_choose_mode(8192, 8192, 64, 64, 16, causal=True) == "linear"
    assert kernelized_decay_choose_mode(8192, 8192, 64, 64, 16, causal=False) == "linear"
    assert kernelized_decay_choose_mode(1, 100_000, 64, 64, 16, causal=False) == "naive"
    # cross attention of a 128-token target on a 16k source: the tails' pass spans the queries only
    assert kernelized_decay_choose_mode(128, 16384, 64, 64, 16, causal=False, batch_heads=8) == "linear"
    picks = [kernelized_decay_choose_mode(n, n, 64, 64, 16, causal=c) for c in (True, False)
             for n in (2**i for i in range(4, 16))]
    assert picks[:12] == sorted(picks[:12], key=lambda m: m == "linear")
    assert picks[12:] == sorted(picks[12:], key=lambda m: m == "linear")


@FEATURE_MAP
@NORMALISE
@pytest.mark.parametrize("horizon", [0, 1, 3])
@pytest.mark.parametrize("no_rel", [False, True], ids=["rel", "no-rel"])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_step_token_by_token_and_in_pieces(horizon, no_rel, mask, normalise, feature_map, decay_inputs):
    q, k, v, rel, decay, key_mask, _ = decay_inputs(b=2, h=2, lq=13, lk=13, horizon=horizon, mask=mask, no_rel=no_rel)
    full = naive_kernelized_decay_attention(q, k, v, rel, decay, causal=True, key_mask=key_mask, horizon=horizon,
                                            normalise=normalise, feature_map=feature_map)
    for pieces in ([1] * 13, [3, 1, 5, 4], [13]):
        state = kernelized_decay_initial_state(2, 2, 5, 4, horizon, dtype=F64, normalise=normalise)
        outs, start = [], 0
        for n in pieces:
            sl = slice(start, start + n)
            m = None if key_mask is None else key_mask[:, sl]
            o, state = kernelized_decay_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], rel, decay, state, key_mask=m,
                                             horizon=horizon, normalise=normalise, feature_map=feature_map)
            outs.append(o)
            start += n
        torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-10, atol=1e-12)
        assert state.seen == 13
        dv = 4 + int(normalise)
        assert tuple(state.keys.shape) == (2, 2, horizon, 5) and tuple(state.tail.shape) == (2, 2, 6, dv)


@FEATURE_MAP
@NORMALISE
@pytest.mark.parametrize("prompt", [1, 2, 3, 9])
def test_prefill_state_then_steps(prompt, normalise, feature_map, decay_inputs):
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=2, h=2, lq=12, lk=12, horizon=3, mask="padding")
    full = naive_kernelized_decay_attention(q, k, v, rel, decay, causal=True, key_mask=key_mask, normalise=normalise,
                                            feature_map=feature_map)
    state = kernelized_decay_prefill_state(k[:, :, :prompt], v[:, :, :prompt], decay, horizon=horizon,
                                           key_mask=key_mask[:, :prompt], normalise=normalise, feature_map=feature_map)
    assert state.seen == prompt
    out, state = kernelized_decay_step(q[:, :, prompt:], k[:, :, prompt:], v[:, :, prompt:], rel, decay, state,
                                       key_mask=key_mask[:, prompt:], normalise=normalise, feature_map=feature_map)
    torch.testing.assert_close(out, full[:, :, prompt:], rtol=1e-10, atol=1e-12)


def test_state_size_is_constant(decay_inputs):
    q, k, v, rel, decay, _, horizon = decay_inputs(b=1, h=2, lq=40, lk=40, horizon=3)
    sizes = set()
    state = kernelized_decay_initial_state(1, 2, 5, 4, horizon, dtype=F64)
    for i in range(40):
        _, state = kernelized_decay_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], rel, decay, state)
        sizes.add(sum(t.numel() for t in state[:3]))
    assert len(sizes) == 1


def test_errors_name_the_argument(decay_inputs):
    q, k, v, rel, decay, _, horizon = decay_inputs()
    with pytest.raises(ValueError, match="`decay` must be a tensor of shape \\(heads,\\)"):
        kernelized_decay_attention(q, k, v, rel, decay[:2])
    with pytest.raises(ValueError, match="`decay` must hold non-negative"):
        kernelized_decay_attention(q, k, v, rel, -decay)
    with pytest.raises(ValueError, match="`decay` must have the dtype of `q`"):
        kernelized_decay_attention(q, k, v, rel, decay.float())
    with pytest.raises(ValueError, match="`horizon` must be given"):
        kernelized_decay_attention(q, k, v, None, decay)
    with pytest.raises(ValueError, match="`horizon` \\(2\\) must match `rel`"):
        kernelized_decay_attention(q, k, v, rel, decay, horizon=2)
    with pytest.raises(ValueError, match="`mode` must be one of"):
        kernelized_decay_attention(q, k, v, rel, decay, mode="fast")
    with pytest.raises(ValueError, match="`feature_map` must be one of \\('elu', 'relu'\\), got 'softplus'"):
        kernelized_decay_attention(q, k, v, rel, decay, feature_map="softplus")
    with pytest.raises(ValueError, match="`state` must be a KernelizedDecayState"):
        kernelized_decay_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], rel, decay, None)
    wrong = kernelized_decay_initial_state(2, 3, 5, 4, horizon + 1, dtype=F64)
    with pytest.raises(ValueError, match="`state` does not fit these inputs"):
        kernelized_decay_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], rel, decay, wrong)
    assert isinstance(wrong, KernelizedDecayState)


@FEATURE_MAP
@NORMALISE
@pytest.mark.parametrize("mask", [None, "random"])
@pytest.mark.parametrize("horizon, no_rel", [(2, False), (0, True)], ids=["rel", "no-rel-horizon-0"])
def test_cross_summary_and_steps_match_the_full_attention(horizon, no_rel, mask, normalise, feature_map, decay_inputs):
    from modeling_scaleformer.ops_decay import kernelized_decay_cross_step, kernelized_decay_cross_summary

    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=2, h=2, lq=12, lk=30, horizon=horizon, mask=mask,
                                                          no_rel=no_rel)
    full = naive_kernelized_decay_attention(q, k, v, rel, decay, key_mask=key_mask, normalise=normalise,
                                            feature_map=feature_map, horizon=horizon)
    summary = kernelized_decay_cross_summary(k, v, key_mask=key_mask)
    steps = [kernelized_decay_cross_step(q[:, :, i:i + 1], rel, decay, summary, query_offset=i, normalise=normalise,
                                         feature_map=feature_map, horizon=horizon)
             for i in range(12)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="`summary` must be a KernelizedDecayCrossSummary"):
        kernelized_decay_cross_step(q, rel, decay, (k, v), query_offset=0)


def no_decay_loop(decay_loop, q, k, v, causal, key_mask, offset):
    """The loop reference of the decay ops with rates of 0, no table, horizon 0 and relu features: relu(q_i).relu(k_j)
    v_j summed over the visible keys at any distance."""
    return decay_loop(q, k, v, None, torch.zeros(q.shape[1], dtype=q.dtype), causal, key_mask, offset, 0,
                      feature_map="relu")


SUM_CASES = pytest.mark.parametrize("lq, lk, offset, mask", [
    (1, 1, 0, None), (9, 9, 0, "padding"), (40, 40, 0, "random"), (12, 7, 3, None), (5, 17, 12, "padding"),
], ids=["length-1", "padding", "long-random-mask", "lq-longer", "lk-longer-offset"])


@SUM_CASES
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("mode", ["linear", "naive", "auto"])
def test_kernelized_sum_is_the_plain_sum_at_any_distance(lq, lk, offset, mask, causal, mode, decay_inputs, decay_loop,
                                                         assert_matches):
    """The registry's `kernelized_sum` (the decay op with no table and rates of 0): every visible key keeps the
    weight relu(q).relu(k) at any distance, outputs and gradients in float64."""
    from modeling_scaleformer.ops_registry import ATTENTION_VARIANTS

    if causal and lq != lk and offset == 0:
        pytest.skip("a causal case needs aligned positions")
    variant = ATTENTION_VARIANTS["kernelized_sum"]
    assert variant.parameters(3, 5, 16, False) == {} and not variant.normalised
    q, k, v, _, _, key_mask, _ = decay_inputs(lq=lq, lk=lk, mask=mask, no_rel=True)
    assert_matches(
        lambda q, k, v: variant.attention(q, k, v, {"feature_map": "relu"}, causal=causal, key_mask=key_mask,
                                          query_offset=offset, mode=mode),
        lambda q, k, v: no_decay_loop(decay_loop, q, k, v, causal, key_mask, offset),
        (q, k, v), "qkv", rtol=1e-10, atol=1e-12, grad_rtol=1e-10, grad_atol=1e-12,
    )


@SUM_CASES
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("d, dv, running", [(2, 2, True), (1, 3, True), (12, 16, False)],
                         ids=["head-dim-2", "head-dim-1", "wide-chunked"])
def test_kernelized_sum_linear_paths_match_the_loop(lq, lk, offset, mask, causal, d, dv, running, decay_inputs,
                                                    decay_loop, assert_matches):
    """The linear mode of `kernelized_sum_attention` at head widths on both sides of `prefix_sums_fit` (running
    key sums for narrow heads, the chunked path for wide causal ones), outputs and gradients in float64."""
    if causal and lq != lk and offset == 0:
        pytest.skip("a causal case needs aligned positions")
    assert prefix_sums_fit(d, dv) == running
    q, k, v, _, _, key_mask, _ = decay_inputs(h=2, lq=lq, lk=lk, d=d, dv=dv, mask=mask, no_rel=True)
    assert_matches(
        lambda q, k, v: kernelized_sum_attention(q, k, v, causal=causal, key_mask=key_mask, query_offset=offset,
                                                 mode="linear", feature_map="relu"),
        lambda q, k, v: no_decay_loop(decay_loop, q, k, v, causal, key_mask, offset),
        (q, k, v), "qkv", rtol=1e-10, atol=1e-12, grad_rtol=1e-10, grad_atol=1e-12,
    )


@SUM_CASES
@pytest.mark.parametrize("chunk", [2, 3], ids=["chunks-of-2", "chunks-of-3"])
def test_kernelized_sum_key_sums_by_chunks(lq, lk, offset, mask, chunk, decay_inputs, decay_loop, assert_matches,
                                           monkeypatch):
    """Bidirectional key sums by chunks of KEY_SUM_CHUNK keys (the keys past two chunks; a last chunk padded where
    the keys do not fill it), outputs and gradients against the loop in float64."""
    monkeypatch.setattr(ops_decay, "KEY_SUM_CHUNK", chunk)
    q, k, v, _, _, key_mask, _ = decay_inputs(h=2, lq=lq, lk=lk, d=2, dv=3, mask=mask, no_rel=True)
    assert_matches(
        lambda q, k, v: kernelized_sum_attention(q, k, v, causal=False, key_mask=key_mask, query_offset=offset,
                                                 mode="linear", feature_map="relu"),
        lambda q, k, v: no_decay_loop(decay_loop, q, k, v, False, key_mask, offset),
        (q, k, v), "qkv", rtol=1e-10, atol=1e-12, grad_rtol=1e-10, grad_atol=1e-12,
    )


@pytest.mark.parametrize("offset", [0, 2, 9], ids=["aligned", "offset", "queries-past-every-key"])
def test_kernelized_sum_running_sums_follow_the_query_offset(offset, decay_inputs):
    """Causal running sums with queries placed on, after and past every key equal the naive sum in float64; a
    query past every key reads the sum over all of them."""
    q, k, v, _, _, _, _ = decay_inputs(lq=6, lk=5, d=2, dv=3, no_rel=True)
    got = kernelized_sum_attention(q, k, v, causal=True, query_offset=offset, mode="linear")
    torch.testing.assert_close(got, kernelized_sum_attention(q, k, v, causal=True, query_offset=offset, mode="naive"),
                               rtol=1e-10, atol=1e-12)
    sees_every_key = torch.arange(6) + offset >= 4
    every_key = kernelized_sum_attention(q, k, v, causal=False, mode="naive")
    torch.testing.assert_close(got[:, :, sees_every_key], every_key[:, :, sees_every_key], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_kernelized_sum_half_precision_accumulates_in_float32(dtype, causal, decay_inputs, assert_low_precision):
    q, k, v, _, _, key_mask, _ = decay_inputs(b=1, h=4, lq=200, lk=200, d=2, dv=2, mask="padding", no_rel=True,
                                              dtype=dtype)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    assert_low_precision(functools.partial(kernelized_sum_attention, mode="linear"),
                         functools.partial(kernelized_sum_attention, mode="naive"), leaves,
                         dict(causal=causal, key_mask=key_mask), tolerance=0.05, names="q k v".split())


def test_kernelized_sum_choose_mode():
    """Key sums for narrow heads from a few dozen keys on; the chunked path's cost model for wide causal heads;
    short inputs stay quadratic."""
    assert kernelized_sum_choose_mode(96, 96, 2, 2, causal=True, batch_heads=4096) == "linear"
    assert kernelized_sum_choose_mode(64, 96, 2, 2, causal=False, batch_heads=4096) == "linear"
    assert kernelized_sum_choose_mode(8, 8, 2, 2, causal=True) == "naive"
    assert kernelized_sum_choose_mode(96, 96, 64, 64, causal=False, batch_heads=128) == "naive"
    for length in (96, 4096):
        assert kernelized_sum_choose_mode(length, length, 64, 64, causal=True, batch_heads=128) == (
            kernelized_decay_choose_mode(length, length, 64, 64, 0, causal=True, batch_heads=128)
        )


@pytest.mark.parametrize("prompt", [0, 1, 5])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_kernelized_sum_steps_and_cross_steps_match_the_full_sum(prompt, mask, decay_inputs, decay_loop):
    """Prefill then token-by-token steps equal the causal sum; cross summary then steps equal the sum over every
    source key; the state keeps its size."""
    from modeling_scaleformer.ops_registry import ATTENTION_VARIANTS

    variant, params = ATTENTION_VARIANTS["kernelized_sum"], {"feature_map": "relu"}
    q, k, v, _, _, key_mask, _ = decay_inputs(lq=30, lk=30, mask=mask, no_rel=True)
    expected = no_decay_loop(decay_loop, q, k, v, True, key_mask, 0)
    state = variant.prefill_state(k[:, :, :prompt], v[:, :, :prompt], params,
                                  key_mask=None if key_mask is None else key_mask[:, :prompt])
    outs, sizes = [], set()
    for i in range(prompt, 30):
        m = None if key_mask is None else key_mask[:, i:i + 1]
        o, state = variant.step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], params, state, key_mask=m)
        outs.append(o)
        sizes.add(sum(t.numel() for t in state[:3]))
    torch.testing.assert_close(torch.cat(outs, dim=2), expected[:, :, prompt:], rtol=1e-10, atol=1e-12)
    assert len(sizes) == 1

    source_q, _, _, _, _, _, _ = decay_inputs(lq=8, lk=30, no_rel=True, seed=3)
    summary = variant.cross_summary(k, v, params, key_mask=key_mask)
    steps = [variant.cross_step(source_q[:, :, i:i + 1], params, summary, query_offset=i) for i in range(8)]
    torch.testing.assert_close(torch.cat(steps, dim=2), no_decay_loop(decay_loop, source_q, k, v, False, key_mask, 0),
                               rtol=1e-10, atol=1e-12)
