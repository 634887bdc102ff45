"""Local softmax within the horizon and a decayed kernel beyond it: every fast path against the quadratic
reference in float64, forward and gradients, and the recurrent state against the full causal forward."""

import functools
import math

import pytest
import torch

from modeling_scaleformer import ops_common, ops_local_softmax
from modeling_scaleformer.ops_decay import kernelized_decay_cross_summary
from modeling_scaleformer.ops_local_softmax import (
    LocalSoftmaxDecayCrossSummary,
    LocalSoftmaxDecayState,
    chunk_local_softmax_decay_attention,
    local_softmax_decay_attention,
    local_softmax_decay_cross_step,
    local_softmax_decay_cross_summary,
    local_softmax_decay_initial_state,
    local_softmax_decay_prefill_state,
    local_softmax_decay_step,
)
from modeling_scaleformer.ops_naive import naive_local_softmax_decay_attention


F64 = torch.float64
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])


@CAUSAL
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunk(decay_case, causal, chunk, decay_inputs, split_case, check_decay_op):
    inputs, offset = split_case(decay_inputs, decay_case)
    fn = functools.partial(chunk_local_softmax_decay_attention, chunk_size=chunk)
    check_decay_op(fn, naive_local_softmax_decay_attention, inputs, causal, offset)


@CAUSAL
@pytest.mark.parametrize("budget", [1, 300, 1300], ids=["one-row-one-block", "one-row-3-blocks", "two-rows-all-blocks"])
@pytest.mark.parametrize("shared", [False, True], ids=["per-head-rel", "shared-rel"])
def test_chunk_in_small_steps(causal, budget, shared, decay_inputs, check_decay_op, monkeypatch):
    """The band forward and its hand-written backward cut into groups of rows and of query blocks, the tails
    recomputed by groups of rows: outputs and gradients match whatever the cut (the default budget takes
    these shapes in one step)."""
    monkeypatch.setattr(ops_local_softmax, "BLOCK_ELEMENTS", budget)
    monkeypatch.setattr(ops_common, "BLOCK_ELEMENTS", budget)  # the tails, by groups of rows
    inputs = decay_inputs(b=2, h=3, lq=23, lk=19, d=4, dv=3, horizon=2, shared=shared, mask="padding")
    fn = functools.partial(chunk_local_softmax_decay_attention, chunk_size=3)
    check_decay_op(fn, naive_local_softmax_decay_attention, inputs, causal, 2)


@CAUSAL
def test_linear_mode_default_chunk(causal, decay_inputs, check_decay_op):
    inputs = decay_inputs(b=1, h=2, lq=150, lk=140, d=8, dv=6, horizon=5, mask="padding")
    fn = functools.partial(local_softmax_decay_attention, mode="linear")
    check_decay_op(fn, naive_local_softmax_decay_attention, inputs, causal, 3)


def test_large_logits_stay_finite(decay_inputs, check_decay_op):
    """Band logits far above and far below 0: the row stabiliser keeps every exponential in range."""
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=30, lk=30, horizon=2, mask="padding")
    for scale in (40.0, -40.0):
        inputs = (q * abs(scale), k * scale, v, rel, decay, key_mask, horizon)
        out = chunk_local_softmax_decay_attention(*inputs[:5], key_mask=key_mask, chunk_size=4)
        assert bool(torch.isfinite(out).all())
        fn = functools.partial(chunk_local_softmax_decay_attention, chunk_size=4)
        check_decay_op(fn, naive_local_softmax_decay_attention, inputs, False, 0)


@pytest.mark.parametrize("mode", ["naive", "linear"])
@pytest.mark.parametrize("lk, visible", [(20, 20), (600, 20)], ids=["short-source", "keys-hidden-after-20"])
def test_rows_far_from_their_keys(mode, lk, visible, monkeypatch):
    """float32 attention of 600 queries whose visible keys are the first 20 (cross attention on a short source, and
    keys hidden by the mask; rates 0.25 and 0.02): far from the keys each decayed weight falls below float32's range,
    while the row, a ratio, does not, and exp(-m) on the underflowed weights had made the gradients inf and NaN. The
    quadratic path sums each row's weights relative to its largest decay and keeps the float64 reference's output and
    gradients at every row; so does the chunked path, whose rows past the last visible key it computes from the
    keys' summary (`_rows_beyond_the_keys`, without which its decayed sums underflow and it loses hundreds of the
    fast head's rows). Every gradient stays finite."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 600, 8, dtype=F64, generator=gen)
    k, v = (torch.randn(1, 2, lk, 8, dtype=F64, generator=gen) for _ in range(2))
    rel, decay = 0.1 * torch.randn(2, 7, 8, dtype=F64, generator=gen), torch.tensor([0.25, 0.02], dtype=F64)
    key_mask = (torch.arange(lk) < visible).long()[None]
    args = [x.float().requires_grad_() for x in (q, k, v, rel, decay)]
    wide = [x.detach().double().requires_grad_() for x in args]
    expected = naive_local_softmax_decay_attention(*wide, key_mask=key_mask)
    upstream = torch.randn(expected.shape, dtype=F64, generator=gen)
    got = local_softmax_decay_attention(*args, key_mask=key_mask, mode=mode)
    grads = torch.autograd.grad(got, args, upstream.float())
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)
    for name, g, e in zip("q k v rel decay".split(), grads, torch.autograd.grad(expected, wide, upstream)):
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4 * max(1.0, float(e.abs().max())),
                                   msg=lambda m: f"grad {name}: {m}")
    if mode == "linear":
        monkeypatch.setattr(ops_local_softmax, "_rows_beyond_the_keys", lambda out, *args, **kwargs: out)
        got = local_softmax_decay_attention(*args, key_mask=key_mask, mode=mode)
        lost = got[0, 0].abs().sum(-1) == 0  # rows of the fast head that the chunked sums lose
        assert 100 < int(lost.sum()) < 600 and not bool(lost[:100].any())


def test_rows_beyond_the_keys(beyond_the_keys_case, beyond_the_keys_inputs, monkeypatch):
    """Rows past every key, past a padded row's last visible key, before its first (without causality), inside gaps of
    hidden keys: the chunked path (chunks of 4) against the float64 reference, output and gradients. Where rows lie
    200 positions or more from their keys (`lost`), the fast head's chunked sums underflow even in float64: without
    `_rows_beyond_the_keys` those rows would be lost."""
    args, kwargs, lost = beyond_the_keys_inputs(beyond_the_keys_case)
    got = chunk_local_softmax_decay_attention(*args, **kwargs, chunk_size=4)
    expected = naive_local_softmax_decay_attention(*args, **kwargs)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    upstream = torch.randn(expected.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    for name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, args, upstream),
                          torch.autograd.grad(expected, args, upstream)):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11, msg=lambda m: f"grad {name}: {m}")
    monkeypatch.setattr(ops_local_softmax, "_rows_beyond_the_keys", lambda out, *args, **kwargs: out)
    kept = chunk_local_softmax_decay_attention(*args, **kwargs, chunk_size=4)
    assert torch.allclose(kept, expected, rtol=1e-6, atol=1e-8) != lost


@pytest.mark.parametrize("name", ["past_the_keys", "last_keys_hidden", "right_padding", "left_padding"])
def test_rows_beyond_the_keys_without_reading_the_mask(name, beyond_the_keys_inputs, monkeypatch):
    """Where a padded row's edges are not read on the host (`_edges_on_host`: CUDA), the rows past every key are still
    replaced, from each batch row's last visible key, and the rows past a padded row's last key within the keys'
    length, or before its first, keep the chunked sums: 220 keys hidden by padding lose rows, 10 do not."""
    monkeypatch.setattr(ops_local_softmax, "_edges_on_host", lambda device: False)
    args, kwargs, _ = beyond_the_keys_inputs(name)
    got = chunk_local_softmax_decay_attention(*args, **kwargs, chunk_size=4)
    expected = naive_local_softmax_decay_attention(*args, **kwargs)
    lk, offset, h = args[1].shape[2], kwargs["query_offset"], 3
    past = max(lk + h - offset, 0)  # rows past every key
    torch.testing.assert_close(got[:, :, past:], expected[:, :, past:], rtol=1e-10, atol=1e-12)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-8) != name.endswith("padding")


@pytest.mark.parametrize("scale", [10.0, 65536.0], ids=["upstream-x10", "loss-scale"])
def test_gradients_stay_finite_inside_a_gap(scale):
    """float32, rate 5, keys hidden over 38 to 48 positions: rows inside the gap have no visible key in their band and
    a weight beyond it near float32's smallest normal number, which exp(-m) had turned into inf and NaN gradients
    for an upstream gradient of a few units (`ops_common.tails_above_floor`). Every gradient is finite, loss
    scaling included, and every row keeps the float64 reference (those inside the gap from the keys' sums at its
    edges, `_rows_beyond_the_keys`)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 4, dtype=F64, generator=gen) for _ in range(3))
    rel, decay = torch.randn(1, 5, 4, dtype=F64, generator=gen), torch.tensor([5.0], dtype=F64)
    upstream = scale * torch.randn(1, 1, 64, 4, dtype=F64, generator=gen)
    for gap in range(38, 50, 2):
        key_mask = torch.ones(1, 64)
        key_mask[:, 10:10 + gap] = 0
        args = [x.float().requires_grad_() for x in (q, k, v, rel, decay)]
        got = local_softmax_decay_attention(*args, key_mask=key_mask, mode="linear")
        assert all(bool(torch.isfinite(g).all()) for g in torch.autograd.grad(got, args, upstream.float()))
        expected = naive_local_softmax_decay_attention(q, k, v, rel, decay, key_mask=key_mask)
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_gradients_stay_finite_on_a_tail_near_the_smallest_normal(dtype):
    """One query between two visible keys, its band key hidden (h = 0), its weight beyond the band 1.5 times the
    dtype's smallest normal number: the chunked path gives it no weight beyond the band, with finite gradients."""
    tiny = torch.finfo(dtype).tiny
    decay = torch.tensor([-math.log(1.5 * tiny / 2)], dtype=dtype, requires_grad=True)
    q, k = torch.zeros(1, 1, 1, 1, dtype=dtype, requires_grad=True), torch.zeros(1, 1, 3, 1, dtype=dtype)
    v = torch.tensor([1.0, 0.0, -1.0], dtype=dtype).view(1, 1, 3, 1).requires_grad_()
    k.requires_grad_()
    out = chunk_local_softmax_decay_attention(q, k, v, None, decay, key_mask=torch.tensor([[1, 0, 1]]),
                                              query_offset=1, horizon=0)
    grads = torch.autograd.grad(out, (q, k, v, decay), torch.full_like(out, 10.0))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def test_step_gradients_stay_finite_far_past_the_visible_keys():
    """float32 decoding steps under autograd, rate 5, only the first token visible: the hidden tokens' rows lie up to
    60 positions past it, their weight beyond the band below float32's range. The visible token's row keeps the full
    forward's value and every gradient is finite."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 60, 4, generator=gen).requires_grad_() for _ in range(3))
    rel, decay = torch.randn(1, 5, 4, generator=gen).requires_grad_(), torch.tensor([5.0], requires_grad=True)
    key_mask = torch.zeros(1, 60, dtype=torch.long)
    key_mask[:, 0] = 1
    state = local_softmax_decay_initial_state(1, 1, 4, 4, 2, dtype=torch.float32)
    out, _ = local_softmax_decay_step(q, k, v, rel, decay, state, key_mask=key_mask)
    full = naive_local_softmax_decay_attention(q, k, v, rel, decay, causal=True, key_mask=key_mask)
    torch.testing.assert_close(out[:, :, :1], full[:, :, :1])
    grads = torch.autograd.grad(out, (q, k, v, rel, decay), torch.randn(out.shape, generator=gen))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def test_softmax_rows_are_shift_invariant(decay_inputs):
    """Band logits shifted by -2000 (exp underflows to 0): the row is still the softmax, not 0/0, on every path."""
    q, k, v, rel, decay, _, horizon = decay_inputs(b=1, h=2, lq=1, lk=4, horizon=3)
    shift = -2000.0 * 5**0.5 * q / (q * q).sum(-1, keepdim=True)  # q.shift = -2000 sqrt(D)
    expected = naive_local_softmax_decay_attention(q, k, v, rel, decay, query_offset=2)
    for op in (naive_local_softmax_decay_attention, chunk_local_softmax_decay_attention):
        got = op(q, k + shift, v, rel, decay, query_offset=2)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    state = local_softmax_decay_prefill_state(k[:, :, :2] + shift, v[:, :, :2], decay, horizon=horizon)
    got, _ = local_softmax_decay_step(q, k[:, :, 2:3] + shift, v[:, :, 2:3], rel, decay, state)
    torch.testing.assert_close(got, naive_local_softmax_decay_attention(q, k[:, :, :3], v[:, :, :3], rel, decay,
                                                                        query_offset=2), rtol=1e-9, atol=1e-12)


def test_chunk_gradcheck(decay_inputs):
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=9, lk=8, d=3, dv=2, horizon=1, mask="padding")
    leaves = tuple(t.requires_grad_(True) for t in (q, k, v, rel, decay))
    for causal in (False, True):
        torch.autograd.gradcheck(
            lambda q, k, v, rel, decay: chunk_local_softmax_decay_attention(
                q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=1, chunk_size=2
            ),
            leaves,
        )


def test_reference_is_the_formula(decay_inputs):
    """The reference against the weights written out pair by pair (no stabiliser)."""
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=7, lk=11, horizon=2, mask="random")
    for causal, offset in ((False, 0), (True, 4), (False, -3)):
        expected = torch.zeros(1, 2, 7, 4, dtype=F64)
        for hi in range(2):
            for i in range(7):
                num, den = torch.zeros(4, dtype=F64), 0.0
                for j in range(11):
                    t = i + offset - j
                    if key_mask[0, j] == 0 or (causal and t < 0):
                        continue
                    if abs(t) <= horizon:
                        w = torch.exp(q[0, hi, i] @ (k[0, hi, j] + rel[hi, t + horizon]) / math.sqrt(5))
                    else:
                        phi_q = torch.nn.functional.elu(q[0, hi, i]) + 1
                        phi_k = torch.nn.functional.elu(k[0, hi, j]) + 1
                        w = phi_q @ phi_k / 5 * math.exp(-decay[hi].item() * (abs(t) - horizon))
                    num, den = num + w * v[0, hi, j], den + w
                if den > 0:
                    expected[0, hi, i] = num / den
        got = naive_local_softmax_decay_attention(q, k, v, rel, decay, causal=causal, key_mask=key_mask,
                                                  query_offset=offset)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_fast_decay_leaves_the_shaw_softmax_band(decay_inputs):
    """With lambda = 60 the keys beyond the horizon weigh exp(-60) or less: the output is Shaw's softmax
    attention over the 2h+1 nearest keys, and without the decay the far keys change it."""
    q, k, v, rel, _, _, horizon = decay_inputs(lq=30, lk=30, horizon=2)
    band = (torch.arange(30)[:, None] - torch.arange(30)[None, :]).abs() <= horizon
    logits = q @ k.transpose(-1, -2)
    r = (torch.arange(30)[:, None] - torch.arange(30)[None, :]).clamp(-horizon, horizon) + horizon
    logits = (logits + (q @ rel.transpose(-1, -2)).gather(-1, r.expand(2, 3, 30, 30))) / math.sqrt(5)
    expected = torch.softmax(logits.masked_fill(~band, float("-inf")), -1) @ v
    got = chunk_local_softmax_decay_attention(q, k, v, rel, torch.full((3,), 60.0, dtype=F64), chunk_size=4)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    slow = chunk_local_softmax_decay_attention(q, k, v, rel, torch.zeros(3, dtype=F64), chunk_size=4)
    assert (slow - expected).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype, decay_inputs, assert_low_precision):
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=70, lk=70, d=8, dv=8, horizon=3,
                                                          mask="padding", dtype=dtype)
    leaves = [t.requires_grad_(True) for t in (q, k, v, rel)]
    kwargs = dict(causal=True, key_mask=key_mask, horizon=horizon)

    def call(op):
        return lambda q, k, v, rel, **kw: op(q, k, v, rel, decay.to(q.dtype), **kw)

    assert_low_precision(call(functools.partial(chunk_local_softmax_decay_attention, chunk_size=16)),
                         call(naive_local_softmax_decay_attention), leaves, kwargs, tolerance=0.05,
                         names="q k v rel".split())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, F64])
def test_the_band_gets_the_inputs_as_they_are(dtype, decay_inputs, monkeypatch):
    """The band gets q and k in the inputs' dtype (it converts them itself, and returns their gradients in it) and
    [m v, m] in the compute dtype."""
    seen = []
    band_function = ops_local_softmax._LocalSoftmaxBand

    class Recording(band_function):
        @staticmethod
        def forward(ctx, q, k, vm, table, tail, band):
            seen.append((q.dtype, k.dtype, vm.dtype))
            return band_function.forward(ctx, q, k, vm, table, tail, band)

    monkeypatch.setattr(ops_local_softmax, "_LocalSoftmaxBand", Recording)
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=20, lk=20, d=8, dv=8, horizon=3, dtype=dtype)
    chunk_local_softmax_decay_attention(q, k, v, rel, decay.to(dtype), chunk_size=4)
    half = dtype in (torch.float16, torch.bfloat16)
    assert seen == [(dtype, dtype, torch.float32 if half else dtype)]


@pytest.mark.parametrize("horizon", [0, 1, 3])
@pytest.mark.parametrize("no_rel", [False, True], ids=["rel", "no-rel"])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_step_token_by_token_and_in_pieces(horizon, no_rel, mask, decay_inputs):
    q, k, v, rel, decay, key_mask, _ = decay_inputs(b=2, h=2, lq=13, lk=13, horizon=horizon, mask=mask, no_rel=no_rel)
    full = naive_local_softmax_decay_attention(q, k, v, rel, decay, causal=True, key_mask=key_mask, horizon=horizon)
    for pieces in ([1] * 13, [3, 1, 5, 4], [13]):
        state = local_softmax_decay_initial_state(2, 2, 5, 4, horizon, dtype=F64)
        outs, start = [], 0
        for n in pieces:
            sl = slice(start, start + n)
            m = None if key_mask is None else key_mask[:, sl]
            o, state = local_softmax_decay_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], rel, decay, state, key_mask=m,
                                                horizon=horizon)
            outs.append(o)
            start += n
        torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-10, atol=1e-12)
        assert state.seen == 13
        assert tuple(state.keys.shape) == (2, 2, horizon, 5) and tuple(state.tail.shape) == (2, 2, 5, 5)


@pytest.mark.parametrize("prompt", [1, 2, 3, 9])
def test_prefill_state_then_steps(prompt, decay_inputs):
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=2, h=2, lq=12, lk=12, horizon=3, mask="padding")
    full = naive_local_softmax_decay_attention(q, k, v, rel, decay, causal=True, key_mask=key_mask)
    state = local_softmax_decay_prefill_state(k[:, :, :prompt], v[:, :, :prompt], decay, horizon=horizon,
                                              key_mask=key_mask[:, :prompt])
    assert state.seen == prompt
    out, state = local_softmax_decay_step(q[:, :, prompt:], k[:, :, prompt:], v[:, :, prompt:], rel, decay, state,
                                          key_mask=key_mask[:, prompt:])
    torch.testing.assert_close(out, full[:, :, prompt:], rtol=1e-10, atol=1e-12)


def test_state_size_is_constant(decay_inputs):
    q, k, v, rel, decay, _, horizon = decay_inputs(b=1, h=2, lq=40, lk=40, horizon=3)
    sizes = set()
    state = local_softmax_decay_initial_state(1, 2, 5, 4, horizon, dtype=F64)
    for i in range(40):
        _, state = local_softmax_decay_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], rel, decay, state)
        sizes.add(sum(t.numel() for t in state[:3]))
    assert len(sizes) == 1


@pytest.mark.parametrize("summarise", ["keys", "chunks"])
@pytest.mark.parametrize("mask", [None, "random"])
def test_cross_summary_and_steps_match_the_full_attention(mask, summarise, decay_inputs):
    """One query at a time on the keys and values (`kernelized_decay_cross_summary`, every key read) and on their
    decayed sums by chunks of 4 (`local_softmax_decay_cross_summary`): the rows of the full attention."""
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=2, h=2, lq=12, lk=30, horizon=2, mask=mask)
    full = naive_local_softmax_decay_attention(q, k, v, rel, decay, key_mask=key_mask)
    if summarise == "keys":
        summary = kernelized_decay_cross_summary(k, v, key_mask=key_mask)
    else:
        summary = local_softmax_decay_cross_summary(k, v, decay, key_mask=key_mask, chunk_size=4)
        assert isinstance(summary, LocalSoftmaxDecayCrossSummary) and summary.before.shape[2] == 9
    steps = [local_softmax_decay_cross_step(q[:, :, i:i + 1], rel, decay, summary, query_offset=i) for i in range(12)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="`summary` must be a LocalSoftmaxDecayCrossSummary or a Kernelized"):
        local_softmax_decay_cross_step(q, rel, decay, (k, v), query_offset=0)


@pytest.mark.parametrize("lk, horizon, chunk", [(1, 3, 4), (13, 0, 1), (13, 3, 4), (40, 3, 4), (40, 9, 4), (40, 3, 16)],
                         ids=["length-1", "h0-chunks-of-1", "lk13", "lk40", "h-wider-than-a-chunk", "chunks-of-16"])
@pytest.mark.parametrize("mask", [None, "right", "left", "hidden-row", "holes"])
def test_windowed_cross_step(lk, horizon, chunk, mask, monkeypatch):
    """The decoding step on the decayed sums by chunks (`_windowed_cross_step`) against the float64 reference at every
    position from 0 to past the keys and 200 and 400 positions beyond (rates 0.3 and 4: there the weights of the
    fast head fall below float64's range, and the rows read `past`), with right and left padding, a batch row without
    keys, and holes; the reference's weights are never computed (they would raise). At a position inside the keys,
    keys and values outside the window of chunks around the band are replaced by NaN: the step does not read them."""
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 2, lk, 4, dtype=F64, generator=gen)
    v = torch.randn(2, 2, lk, 3, dtype=F64, generator=gen)
    rel, decay = torch.randn(2, 2 * horizon + 1, 4, dtype=F64, generator=gen), torch.tensor([0.3, 4.0], dtype=F64)
    key_mask = torch.ones(2, lk)
    if mask == "right":
        key_mask[1, lk // 2 + 1:] = 0
    elif mask == "left":
        key_mask[0, :lk // 2] = 0
    elif mask == "hidden-row":
        key_mask[1] = 0
    elif mask == "holes":
        key_mask = (torch.rand(2, lk, generator=gen) > 0.3).double()
    summary = local_softmax_decay_cross_summary(k, v, decay, key_mask=key_mask if mask else None, chunk_size=chunk)
    positions = [*range(lk + horizon + 3), lk + 200, lk + 400]
    queries = torch.randn(2, 2, len(positions), 4, dtype=F64, generator=gen)
    expected = [naive_local_softmax_decay_attention(queries[:, :, i:i + 1], k, v, rel, decay, query_offset=p,
                                                    key_mask=key_mask if mask else None)
                for i, p in enumerate(positions)]

    def refuse(*args, **kwargs):
        raise AssertionError("the step computed every key's weight")

    monkeypatch.setattr(ops_local_softmax, "naive_local_softmax_decay_weights", refuse)
    for i, p in enumerate(positions):
        got = local_softmax_decay_cross_step(queries[:, :, i:i + 1], rel, decay, summary, query_offset=p)
        torch.testing.assert_close(got, expected[i], rtol=1e-10, atol=1e-12, msg=lambda m: f"position {p}: {m}")
    if lk == 40:
        p = 20
        lo, hi = (p - horizon) // chunk * chunk, -(-(p + horizon + 1) // chunk) * chunk
        poisoned = summary._replace(keys=summary.keys.clone(), values=summary.values.clone())
        for t in (poisoned.keys, poisoned.values):
            t[:, :, :lo] = float("nan")
            t[:, :, hi:] = float("nan")
        got = local_softmax_decay_cross_step(queries[:, :, p:p + 1], rel, decay, poisoned, query_offset=p)
        torch.testing.assert_close(got, expected[p], rtol=1e-10, atol=1e-12)


def test_errors_name_the_argument(decay_inputs):
    q, k, v, rel, decay, _, horizon = decay_inputs()
    with pytest.raises(ValueError, match="`decay` must be a tensor of shape \\(heads,\\)"):
        local_softmax_decay_attention(q, k, v, rel, decay[:2])
    with pytest.raises(ValueError, match="`decay` must hold non-negative"):
        local_softmax_decay_attention(q, k, v, rel, -decay)
    with pytest.raises(ValueError, match="`horizon` must be given"):
        local_softmax_decay_attention(q, k, v, None, decay)
    with pytest.raises(ValueError, match="`mode` must be one of"):
        local_softmax_decay_attention(q, k, v, rel, decay, mode="fast")
    with pytest.raises(ValueError, match="`state` must be a LocalSoftmaxDecayState"):
        local_softmax_decay_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], rel, decay, None)
    wrong = local_softmax_decay_initial_state(2, 3, 5, 4, horizon + 1, dtype=F64)
    with pytest.raises(ValueError, match="`state` does not fit these inputs"):
        local_softmax_decay_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], rel, decay, wrong)
    assert isinstance(wrong, LocalSoftmaxDecayState)
    with pytest.raises(ValueError, match="`chunk_size` must be a positive int, got 0"):
        local_softmax_decay_cross_summary(k, v, decay, chunk_size=0)
    with pytest.raises(ValueError, match="`decay` must be a tensor of shape \\(heads,\\)"):
        local_softmax_decay_cross_summary(k, v, decay[:2])
