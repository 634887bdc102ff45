"""Fourier kernelized attention: the normaliser guard, the recurrent state, the cost model and the input
checks, against the quadratic reference in float64 (the blocked linear path: `test_fourier_chunk.py`)."""

import functools

import pytest
import torch

from modeling_scaleformer import ops_fourier
from modeling_scaleformer.ops_fourier import (
    FourierState,
    chunk_fourier_attention,
    fourier_attention,
    fourier_choose_mode,
    fourier_initial_state,
    fourier_prefill_state,
    fourier_step,
)
from modeling_scaleformer.ops_naive import naive_fourier_attention, naive_kernelized_rpe_attention


F64 = torch.float64


def adversarial_inputs(fourier_inputs, targets):
    """Mixed-sign c tuned so that query row 0 of batch 0 has den = target * M in head h (bidirectional)."""
    q, k, v, (a, b_, c), _, _ = fourier_inputs(b=2, h=len(targets), lq=8, lk=8, d=6, dv=3, seed=3)
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # noqa: E731
    pos = torch.arange(8, dtype=F64)
    for hi, target in enumerate(targets):
        # den(c) = c . w is linear in c, M(c) = |c| . u: move c along w until den = target * M
        angle = b_[hi][None, :] + pos[:, None] * a[hi, :, 0][None, :]  # (Lk, D); query 0 at position 0
        key_angle = pos[:, None] * a[hi, :, 0][None, :]
        prod = phi(q[0, hi, 0])[None, :] * phi(k[0, hi])
        w = (prod * torch.cos(angle[:1] - key_angle)).sum(0)
        u = prod.sum(0)
        ch = c[hi].clone()
        for _ in range(50):
            ch = ch + (target * (ch.abs() @ u) - ch @ w) / (w @ w) * w
        c[hi] = ch
    return q, k, v, (a, b_, c)


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.5, 1.0])
def test_guard_bound_and_exact_where_well_conditioned(eps, fourier_inputs, fourier_loop_sums):
    targets = (0.0, 1e-9, -3e-4, 0.3)
    q, k, v, params = adversarial_inputs(fourier_inputs, targets)
    num, den, big = fourier_loop_sums(q, k, v, params, False, None, 0, (None, None))
    ratio = den[0, :, 0] / big[0, :, 0]
    torch.testing.assert_close(ratio, torch.tensor(targets, dtype=F64), rtol=0, atol=1e-12)
    exact = num / den[..., None]
    bound = v.abs().amax(dim=(2, 3), keepdim=True) / eps
    # the plain formula breaks the bound on these inputs: the guard is needed
    assert bool((exact.abs() > bound).any())
    well = den.abs() >= eps * big
    sign = torch.where(den >= 0, 1.0, -1.0).to(F64)
    guarded = num / (sign * eps * big)[..., None]
    expected = torch.where(well[..., None], exact, guarded)
    assert bool((~well).any()) and (eps == 1.0 or bool(well.any()))
    for mode in ("naive", "linear"):
        out = fourier_attention(q, k, v, *params, eps=eps, mode=mode)
        assert bool((out.abs() <= bound * (1 + 1e-12)).all())
        # den = 0 (head 0) has an arbitrary sign under rounding: compare the rest exactly
        torch.testing.assert_close(out[:, 1:], expected[:, 1:], rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(out[:, :1].abs(), expected[:, :1].abs(), rtol=1e-6, atol=1e-9)
        for causal in (False, True):
            out = fourier_attention(q, k, v, *params, causal=causal, eps=eps, mode=mode)
            assert bool((out.abs() <= bound * (1 + 1e-12)).all())


def test_guard_on_random_mixed_signs(fourier_inputs):
    """Random mixed-sign c over many rows and masks: the bound holds, naive and linear agree."""
    q, k, v, params, key_mask, _ = fourier_inputs(b=4, h=4, lq=40, lk=40, d=3, mask="random", seed=7)
    for causal in (False, True):
        ref = naive_fourier_attention(q, k, v, *params, causal=causal, key_mask=key_mask)
        out = chunk_fourier_attention(q, k, v, *params, causal=causal, key_mask=key_mask, chunk_size=8)
        assert bool((ref.abs() <= v.abs().amax() / 1e-2).all())
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("mode", ["naive", "linear"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_zero_frequency_is_plain_kernelized(mode, causal, fourier_inputs):
    """a = 0, b = 0, c = 1: cos = 1, every score is phi(q).phi(k) > 0, so the op is plain kernelized."""
    q, k, v, _, key_mask, _ = fourier_inputs(b=2, h=3, lq=13, lk=11, mask="random")
    a, b_, c = torch.zeros(3, 5, 1, dtype=F64), torch.zeros(3, 5, dtype=F64), torch.ones(3, 5, dtype=F64)
    for offset in (0, 4):
        out = fourier_attention(q, k, v, a, b_, c, causal=causal, key_mask=key_mask, query_offset=offset, mode=mode)
        ref = naive_kernelized_rpe_attention(q, k, v, None, causal=causal, key_mask=key_mask, query_offset=offset)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("npos", [None, 2], ids=["token-positions", "2d-positions"])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_step_token_by_token_and_in_pieces(npos, mask, fourier_inputs):
    q, k, v, params, key_mask, (pq, pk) = fourier_inputs(b=2, h=2, lq=11, lk=11, npos=npos, mask=mask)
    full = naive_fourier_attention(q, k, v, *params, causal=True, key_mask=key_mask, q_positions=pq, k_positions=pk)
    for pieces in ([1] * 11, [3, 1, 4, 3], [11]):
        state = fourier_initial_state(2, 2, 5, 4, dtype=F64)
        outs, start = [], 0
        for n in pieces:
            sl = slice(start, start + n)
            m = None if key_mask is None else key_mask[:, sl]
            pos = {} if npos is None else dict(q_positions=pq[:, sl], k_positions=pk[:, sl])
            o, state = fourier_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], *params, state, key_mask=m, **pos)
            outs.append(o)
            start += n
        torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-10, atol=1e-12)
        assert state.seen == 11


def test_step_longer_than_a_chunk(fourier_inputs):
    q, k, v, params, key_mask, _ = fourier_inputs(b=1, h=2, lq=150, lk=150, d=4, dv=3, mask="padding")
    full = naive_fourier_attention(q, k, v, *params, causal=True, key_mask=key_mask)
    state = fourier_initial_state(1, 2, 4, 3, dtype=F64)
    o1, state = fourier_step(q[:, :, :5], k[:, :, :5], v[:, :, :5], *params, state, key_mask=key_mask[:, :5])
    o2, state = fourier_step(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], *params, state, key_mask=key_mask[:, 5:])
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("npos", [None, 2], ids=["token-positions", "2d-positions"])
@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_prefill_state_then_steps(prompt, npos, fourier_inputs):
    q, k, v, params, key_mask, (pq, pk) = fourier_inputs(b=2, h=2, lq=12, lk=12, npos=npos, mask="padding")
    full = naive_fourier_attention(q, k, v, *params, causal=True, key_mask=key_mask, q_positions=pq, k_positions=pk)
    state = fourier_prefill_state(
        k[:, :, :prompt], v[:, :, :prompt], params[0], key_mask=key_mask[:, :prompt],
        k_positions=None if pk is None else pk[:, :prompt],
    )
    assert state.seen == prompt
    outs = []
    for t in range(prompt, 12):
        sl = slice(t, t + 1)
        pos = {} if npos is None else dict(q_positions=pq[:, sl], k_positions=pk[:, sl])
        o, state = fourier_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], *params, state, key_mask=key_mask[:, sl], **pos)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), full[:, :, prompt:], rtol=1e-10, atol=1e-12)


def test_state_size_is_constant_and_batch_first(fourier_inputs):
    q, k, v, params, _, _ = fourier_inputs(b=3, h=2, lq=30, lk=30)
    state = fourier_initial_state(3, 2, 5, 4, dtype=F64)
    sizes = set()
    for t in range(20):
        sl = slice(t, t + 1)
        _, state = fourier_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], *params, state)
        sizes.add(sum(x.numel() for x in state[:3]))
    assert len(sizes) == 1
    assert all(x.shape[0] == 3 for x in state[:3])
    # reordering the batch of the state (beam search) equals running the reordered batch
    order = torch.tensor([2, 0, 0])
    reordered = FourierState(*(x.index_select(0, order) for x in state[:3]), state.seen)
    sl = slice(20, 30)
    out, _ = fourier_step(q[order][:, :, sl], k[order][:, :, sl], v[order][:, :, sl], *params, reordered)
    full = naive_fourier_attention(q[order], k[order], v[order], *params, causal=True)
    torch.testing.assert_close(out, full[:, :, sl], rtol=1e-10, atol=1e-12)


def test_auto_mode_follows_choose_mode(monkeypatch, fourier_inputs):
    q, k, v, params, _, _ = fourier_inputs(lq=12, lk=12)
    calls = []
    monkeypatch.setattr(ops_fourier, "fourier_choose_mode", lambda *a, **kw: calls.append((a, kw)) or "linear")
    monkeypatch.setattr(ops_fourier, "chunk_fourier_attention", lambda *a, **kw: torch.full((2, 3, 12, 4), 7.0))
    out = fourier_attention(q, k, v, *params, causal=True, mode="auto")
    assert calls == [((12, 12, 5, 4), dict(causal=True, batch_heads=6))] and bool((out == 7.0).all())


def test_choose_mode():
    # crossovers measured on a 2-core CPU, D = Dv = 64, forward + backward: bidirectional near 100,
    # causal near 200 - 250, for 8 and 64 batch*heads
    for bh in (8, 64):
        assert fourier_choose_mode(64, 64, 64, 64, causal=False, batch_heads=bh) == "naive"
        assert fourier_choose_mode(192, 192, 64, 64, causal=False, batch_heads=bh) == "linear"
        assert fourier_choose_mode(160, 160, 64, 64, causal=True, batch_heads=bh) == "naive"
        assert fourier_choose_mode(320, 320, 64, 64, causal=True, batch_heads=bh) == "linear"
    assert fourier_choose_mode(8192, 8192, 64, 64, causal=True) == "linear"
    assert fourier_choose_mode(1, 100_000, 64, 64, causal=False) == "naive"  # one query: O(Lk) either way
    for causal in (False, True):
        picks = [fourier_choose_mode(n, n, 64, 64, causal=causal, batch_heads=8) for n in (2**i for i in range(3, 15))]
        assert picks == sorted(picks, key=lambda m: m == "linear")


@pytest.mark.parametrize(
    "dtype, tolerance", [(torch.bfloat16, 2e-2), (torch.float16, 3e-3)], ids=["bf16", "fp16"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_half_precision(dtype, tolerance, causal, fourier_inputs, assert_low_precision):
    """Half q, k, v with float32 parameters (as under autocast) compute in float32.

    The error is that of rounding the inputs and the output. Gradients of `a` sum position-weighted
    terms over all queries and can exceed the float16 range: parameters are kept in float32.
    """
    q, k, v, params, key_mask, _ = fourier_inputs(
        b=1, h=2, lq=200, lk=200, d=16, dv=16, mask="padding", well_conditioned=True
    )
    half = [t.to(dtype).requires_grad_(True) for t in (q, k, v)] + [
        t.to(torch.float32).requires_grad_(True) for t in params
    ]
    out, _ = assert_low_precision(
        functools.partial(fourier_attention, mode="linear"), naive_fourier_attention, half,
        dict(causal=causal, key_mask=key_mask), tolerance=tolerance, names="q k v a b c".split(),
    )
    assert out.dtype == dtype


def base_args(fourier_inputs):
    q, k, v, (a, b_, c), _, _ = fourier_inputs(b=2, h=3, lq=5, lk=6, d=4, dv=2)
    return dict(q=q, k=k, v=v, a=a, b=b_, c=c)


BAD = [
    pytest.param(dict(a=torch.randn(3, 4, dtype=F64)), "`a`", id="a-2d"),
    pytest.param(dict(a=torch.randn(2, 4, 1, dtype=F64)), "`a`", id="a-heads"),
    pytest.param(dict(a=torch.randn(3, 5, 1, dtype=F64)), "`a`", id="a-dim"),
    pytest.param(dict(a=torch.ones(3, 4, 1, dtype=torch.long)), "`a`", id="a-int"),
    pytest.param(dict(b=torch.randn(3, 5, dtype=F64)), "`b`", id="b-shape"),
    pytest.param(dict(c=torch.randn(4, dtype=F64)), "`c`", id="c-shape"),
    pytest.param(dict(q_positions=torch.randn(2, 5, 2, dtype=F64)), "`q_positions`", id="q-positions-n"),
    pytest.param(dict(k_positions=torch.randn(2, 5, 1, dtype=F64)), "`k_positions`", id="k-positions-length"),
    pytest.param(dict(k_positions=torch.randn(3, 6, 1, dtype=F64)), "`k_positions`", id="k-positions-batch"),
    pytest.param(
        dict(a=torch.randn(3, 4, 2, dtype=F64), k_positions=torch.randn(2, 6, 2, dtype=F64)),
        "`q_positions`", id="positions-missing-for-n2",
    ),
    pytest.param(dict(eps=0.0), "`eps`", id="eps-0"),
    pytest.param(dict(eps=-1e-2), "`eps`", id="eps-negative"),
    pytest.param(dict(eps=1.5), "`eps`", id="eps-above-1"),
    pytest.param(dict(eps=float("nan")), "`eps`", id="eps-nan"),
    pytest.param(dict(eps=True), "`eps`", id="eps-bool"),
    pytest.param(dict(key_mask=torch.ones(2, 5)), "`key_mask`", id="mask-shape"),
    pytest.param(dict(query_offset=-1), "`query_offset`", id="offset"),
    pytest.param(dict(mode="fast"), "`mode`", id="mode"),
]


@pytest.mark.parametrize("override, name", BAD)
def test_bad_inputs_raise(override, name, fourier_inputs):
    args = base_args(fourier_inputs)
    args.update(override)
    with pytest.raises(ValueError, match=name):
        fourier_attention(**args)


def test_chunk_size_and_step_and_prefill_reject_bad_inputs(fourier_inputs):
    args = base_args(fourier_inputs)
    with pytest.raises(ValueError, match="`chunk_size`"):
        chunk_fourier_attention(**args, chunk_size=0)
    q, k, v = (args[x][:, :, :1] for x in "qkv")
    state = fourier_initial_state(2, 3, 4, 2, dtype=F64)
    with pytest.raises(ValueError, match="`state`"):
        fourier_step(q, k, v, args["a"], args["b"], args["c"], fourier_initial_state(2, 3, 4, 3, dtype=F64))
    with pytest.raises(ValueError, match="`state`"):
        fourier_step(q, k, v, args["a"], args["b"], args["c"], (1, 2, 3))
    with pytest.raises(ValueError, match="`eps`"):
        fourier_step(q, k, v, args["a"], args["b"], args["c"], state, eps=2.0)
    with pytest.raises(ValueError, match="`q_positions`"):
        fourier_step(q, k, v, args["a"], args["b"], args["c"], state, q_positions=torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match="`a`"):
        fourier_prefill_state(args["k"], args["v"], torch.randn(3, 4))
    with pytest.raises(ValueError, match="`k_positions`"):
        fourier_prefill_state(args["k"], args["v"], torch.randn(3, 4, 2, dtype=F64))
