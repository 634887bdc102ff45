"""Fourier kernelized attention: every fast path against the quadratic reference in float64."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_scaleformer import ops_fourier
from modeling_scaleformer.ops_fourier import (
    FourierState,
    chunk_fourier_attention,
    fourier_attention,
    fourier_choose_mode,
    fourier_initial_state,
    fourier_prefill_state,
    fourier_step,
    naive_fourier_attention,
)
from modeling_scaleformer.ops_naive import naive_kernelized_rpe_attention


F64 = torch.float64


def make_inputs(
    b=2, h=3, lq=9, lk=9, d=5, dv=4, npos=None, mask=None, well_conditioned=False, shared_positions=False,
    dtype=F64, seed=0,
):
    """q, k, v, (a, b, c), key_mask and (q_positions, k_positions); positions None means token index."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, lk, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, lk, dv, generator=g, dtype=dtype)
    n = npos or 1
    if well_conditioned:
        # c > 0 and small frequencies and phases: cos stays near 1, the normaliser far from 0
        freq = 0.05 * torch.rand(h, d, n, generator=g, dtype=dtype)
        phase = 0.1 * torch.randn(h, d, generator=g, dtype=dtype)
        amp = 0.5 + torch.rand(h, d, generator=g, dtype=dtype)
    else:
        freq = 0.5 * torch.randn(h, d, n, generator=g, dtype=dtype)
        phase = torch.randn(h, d, generator=g, dtype=dtype)
        amp = torch.randn(h, d, generator=g, dtype=dtype)  # mixed signs
    positions = (None, None)
    if npos is not None:
        pb = 1 if shared_positions else b
        positions = (
            3 * torch.randn(pb, lq, npos, generator=g, dtype=dtype),
            3 * torch.randn(pb, lk, npos, generator=g, dtype=dtype),
        )
    key_mask = None
    if mask == "padding":
        key_mask = torch.ones(b, lk, dtype=torch.long)
        key_mask[0, : lk // 3] = 0  # left padding
        key_mask[-1, lk - lk // 2 :] = 0  # right padding
    elif mask == "random":
        key_mask = torch.rand(b, lk, generator=g) > 0.4
        key_mask[0, :] = False  # a fully masked batch row
        key_mask[-1, :] = False
        key_mask[-1, -1] = True  # an almost fully masked row
    return q, k, v, (freq, phase, amp), key_mask, positions


def loop_sums(q, k, v, params, causal, key_mask, offset, positions):
    """num (B, H, Lq, Dv), den and M (B, H, Lq) of the plain formula, with Python loops and cos(ph - pk)."""
    a, b_, c = params
    bsz, h, lq, d = q.shape
    lk = k.shape[2]
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # noqa: E731
    pq, pk = positions

    def position(table, row, index, shift):
        if table is None:
            return torch.tensor([float(index + shift)], dtype=q.dtype)
        return table[min(row, table.shape[0] - 1), index]

    num = torch.zeros(bsz, h, lq, v.shape[-1], dtype=q.dtype)
    den = torch.zeros(bsz, h, lq, dtype=q.dtype)
    big = torch.zeros(bsz, h, lq, dtype=q.dtype)
    for bi in range(bsz):
        for hi in range(h):
            for i in range(lq):
                p_i = position(pq, bi, i, offset)
                for j in range(lk):
                    if causal and j > i + offset:
                        continue
                    if key_mask is not None and not key_mask[bi, j]:
                        continue
                    p_j = position(pk, bi, j, 0)
                    prod = phi(q[bi, hi, i]) * phi(k[bi, hi, j])
                    s = (c[hi] * prod * torch.cos(b_[hi] + a[hi] @ p_i - a[hi] @ p_j)).sum()
                    num[bi, hi, i] += s * v[bi, hi, j]
                    den[bi, hi, i] += s
                    big[bi, hi, i] += (c[hi].abs() * prod).sum()
    return num, den, big


LOOP_CASES = [
    pytest.param(dict(lq=1, lk=1), 0, id="L1"),
    pytest.param(dict(lq=7, lk=4), 2, id="Lq>Lk-offset"),
    pytest.param(dict(lq=4, lk=9, mask="random"), 0, id="Lq<Lk-masked-rows"),
    pytest.param(dict(lq=6, lk=6, npos=2, mask="padding"), 0, id="2d-positions"),
]


@pytest.mark.parametrize("case, offset", LOOP_CASES)
def test_naive_matches_loop_formula(case, offset):
    """On well-conditioned inputs (c > 0, small a) the guard is idle and naive is the plain formula."""
    q, k, v, params, key_mask, positions = make_inputs(b=2, h=2, well_conditioned=True, **case)
    for causal in (False, True):
        num, den, big = loop_sums(q, k, v, params, causal, key_mask, offset, positions)
        visible = big > 0
        assert bool((den[visible].abs() >= 1e-2 * big[visible]).all())  # the guard must not act here
        expected = torch.where(visible[..., None], num / torch.where(visible, den, 1.0)[..., None], 0.0)
        got = naive_fourier_attention(
            q, k, v, *params, causal=causal, key_mask=key_mask, query_offset=offset,
            q_positions=positions[0], k_positions=positions[1],
        )
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def adversarial_inputs(targets):
    """Mixed-sign c tuned so that query row 0 of batch 0 has den = target * M in head h (bidirectional)."""
    q, k, v, (a, b_, c), _, _ = make_inputs(b=2, h=len(targets), lq=8, lk=8, d=6, dv=3, seed=3)
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
def test_guard_bound_and_exact_where_well_conditioned(eps):
    targets = (0.0, 1e-9, -3e-4, 0.3)
    q, k, v, params = adversarial_inputs(targets)
    num, den, big = loop_sums(q, k, v, params, False, None, 0, (None, None))
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


def test_guard_on_random_mixed_signs():
    """Random mixed-sign c over many rows and masks: the bound holds, naive and linear agree."""
    q, k, v, params, key_mask, _ = make_inputs(b=4, h=4, lq=40, lk=40, d=3, mask="random", seed=7)
    for causal in (False, True):
        ref = naive_fourier_attention(q, k, v, *params, causal=causal, key_mask=key_mask)
        out = chunk_fourier_attention(q, k, v, *params, causal=causal, key_mask=key_mask, chunk_size=8)
        assert bool((ref.abs() <= v.abs().amax() / 1e-2).all())
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)


CASES = [
    pytest.param(dict(lq=1, lk=1), id="L1"),
    pytest.param(dict(lq=3, lk=3), id="L<chunk"),
    pytest.param(dict(lq=8, lk=8), id="L=2chunks"),
    pytest.param(dict(lq=23, lk=23), id="L-not-multiple-of-chunk"),
    pytest.param(dict(lq=30, lk=11), id="Lq>Lk"),
    pytest.param(dict(lq=7, lk=26), id="Lq<Lk"),
    pytest.param(dict(lq=6, lk=25, offset=13), id="query-offset"),
    pytest.param(dict(lq=5, lk=9, offset=40), id="offset-past-keys"),
    pytest.param(dict(lq=21, lk=21, mask="padding"), id="padding"),
    pytest.param(dict(lq=19, lk=14, mask="random"), id="masked-rows"),
    pytest.param(dict(lq=17, lk=17, npos=2), id="2d-positions"),
    pytest.param(dict(lq=9, lk=14, npos=2, mask="padding", offset=3), id="2d-positions-cross-offset"),
    pytest.param(dict(lq=10, lk=10, npos=3, shared_positions=True), id="3d-positions-shared-by-batch"),
]


def split_case(case):
    case = dict(case)
    offset = case.pop("offset", 0)
    return make_inputs(**case), offset


def check_against_naive(fn, q, k, v, params, key_mask, positions, causal, offset, eps=1e-2):
    inputs = [t.clone().requires_grad_(True) for t in (q, k, v, *params)]
    kwargs = dict(
        causal=causal, key_mask=key_mask, query_offset=offset, q_positions=positions[0], k_positions=positions[1],
        eps=eps,
    )
    out = fn(*inputs, **kwargs)
    ref = naive_fourier_attention(*inputs, **kwargs)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, inputs, upstream)
    ref_grads = torch.autograd.grad(ref, inputs, upstream)
    for name, g, rg in zip("q k v a b c".split(), grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-11, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("case", CASES)
def test_chunk(case, causal):
    (q, k, v, params, key_mask, positions), offset = split_case(case)

    def fn(*args, **kwargs):
        return chunk_fourier_attention(*args, chunk_size=4, **kwargs)

    check_against_naive(fn, q, k, v, params, key_mask, positions, causal, offset)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_linear_mode_default_chunk(causal):
    q, k, v, params, key_mask, _ = make_inputs(b=1, h=2, lq=150, lk=140, d=8, dv=6, mask="padding")

    def fn(*args, **kwargs):
        return fourier_attention(*args, mode="linear", **kwargs)

    check_against_naive(fn, q, k, v, params, key_mask, (None, None), causal, 3)


@pytest.mark.parametrize("mode", ["naive", "linear"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_zero_frequency_is_plain_kernelized(mode, causal):
    """a = 0, b = 0, c = 1: cos = 1, every score is phi(q).phi(k) > 0, so the op is plain kernelized."""
    q, k, v, _, key_mask, _ = make_inputs(b=2, h=3, lq=13, lk=11, mask="random")
    a, b_, c = torch.zeros(3, 5, 1, dtype=F64), torch.zeros(3, 5, dtype=F64), torch.ones(3, 5, dtype=F64)
    for offset in (0, 4):
        out = fourier_attention(q, k, v, a, b_, c, causal=causal, key_mask=key_mask, query_offset=offset, mode=mode)
        ref = naive_kernelized_rpe_attention(q, k, v, None, causal=causal, key_mask=key_mask, query_offset=offset)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("npos", [None, 2], ids=["token-positions", "2d-positions"])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_step_token_by_token_and_in_pieces(npos, mask):
    q, k, v, params, key_mask, (pq, pk) = make_inputs(b=2, h=2, lq=11, lk=11, npos=npos, mask=mask)
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


def test_step_longer_than_a_chunk():
    q, k, v, params, key_mask, _ = make_inputs(b=1, h=2, lq=150, lk=150, d=4, dv=3, mask="padding")
    full = naive_fourier_attention(q, k, v, *params, causal=True, key_mask=key_mask)
    state = fourier_initial_state(1, 2, 4, 3, dtype=F64)
    o1, state = fourier_step(q[:, :, :5], k[:, :, :5], v[:, :, :5], *params, state, key_mask=key_mask[:, :5])
    o2, state = fourier_step(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], *params, state, key_mask=key_mask[:, 5:])
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("npos", [None, 2], ids=["token-positions", "2d-positions"])
@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_prefill_state_then_steps(prompt, npos):
    q, k, v, params, key_mask, (pq, pk) = make_inputs(b=2, h=2, lq=12, lk=12, npos=npos, mask="padding")
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


def test_state_size_is_constant_and_batch_first():
    q, k, v, params, _, _ = make_inputs(b=3, h=2, lq=30, lk=30)
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


def test_auto_mode_follows_choose_mode(monkeypatch):
    q, k, v, params, _, _ = make_inputs(lq=12, lk=12)
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
def test_half_precision(dtype, tolerance, causal):
    """Half q, k, v with float32 parameters (as under autocast) compute in float32.

    The error is that of rounding the inputs and the output. Gradients of `a` sum position-weighted
    terms over all queries and can exceed the float16 range: parameters are kept in float32.
    """
    q, k, v, params, key_mask, _ = make_inputs(
        b=1, h=2, lq=200, lk=200, d=16, dv=16, mask="padding", well_conditioned=True
    )
    half = [t.to(dtype).requires_grad_(True) for t in (q, k, v)] + [
        t.to(torch.float32).requires_grad_(True) for t in params
    ]
    ref_inputs = [t.detach().to(F64).requires_grad_(True) for t in half]  # same rounded inputs
    out = fourier_attention(*half, causal=causal, key_mask=key_mask, mode="linear")
    ref = naive_fourier_attention(*ref_inputs, causal=causal, key_mask=key_mask)
    assert out.dtype == dtype
    torch.testing.assert_close(out.to(F64), ref, rtol=tolerance, atol=tolerance)
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, half, upstream.to(dtype))
    ref_grads = torch.autograd.grad(ref, ref_inputs, upstream)
    for name, x, g, rg in zip("q k v a b c".split(), half, grads, ref_grads):
        assert g.dtype == x.dtype
        scale = rg.abs().max().item()
        torch.testing.assert_close(g.to(F64), rg, rtol=tolerance, atol=tolerance * scale, msg=lambda m: f"{name}: {m}")


def test_linear_memory_has_no_quadratic_buffer():
    """At L = 4096 a quadratic path would save L*L floats; the linear path saves O(L (c + D + Dv))."""
    length, d = 4096, 8
    q, k, v, params, _, _ = make_inputs(b=1, h=1, lq=length, lk=length, d=d, dv=d, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        inputs = [t.requires_grad_(True) for t in (q, k, v, *params)]
        out = fourier_attention(*inputs, causal=True, mode="linear")
    assert max(saved) <= length * ops_fourier.DEFAULT_CHUNK_SIZE
    assert sum(saved) <= 8 * length * (ops_fourier.DEFAULT_CHUNK_SIZE + 2 * d)  # L * L would be 16.7 M
    assert math.isfinite(out.sum().item())


def base_args():
    q, k, v, (a, b_, c), _, _ = make_inputs(b=2, h=3, lq=5, lk=6, d=4, dv=2)
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
def test_bad_inputs_raise(override, name):
    args = base_args()
    args.update(override)
    with pytest.raises(ValueError, match=name):
        fourier_attention(**args)


def test_chunk_size_and_step_and_prefill_reject_bad_inputs():
    args = base_args()
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


def eps_between_rows(q, k, v, params, causal, key_mask, offset, positions):
    """An eps in the widest gap between the middle values of |den| / M, so that the guard acts on some
    rows only, and no row sits near either kink of the guard (|den| = eps M, or den = 0 when guarded)."""
    _, den, big = loop_sums(q, k, v, params, causal, key_mask, offset, positions)
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
def test_chunk_gradcheck(monkeypatch, causal, npos):
    """Finite differences of the autograd.Function, in many blocks, with the guard acting on some rows."""
    monkeypatch.setattr(ops_fourier, "BLOCK_ELEMENTS", 40)  # one chunk per span
    q, k, v, params, _, positions = make_inputs(b=1, h=2, lq=6, lk=5, d=2, dv=2, npos=npos)
    key_mask = torch.tensor([[1, 0, 1, 1, 1]])
    eps = eps_between_rows(q, k, v, params, causal, key_mask, 1, positions)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, *params))
    torch.autograd.gradcheck(
        lambda *x: ops_fourier._ChunkFourier.apply(*x, *positions, key_mask, causal, 1, 2, eps), inputs
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
def test_chunk_in_small_blocks(monkeypatch, block_elements, groups, span_chunks, case, causal):
    """Row groups of heads or batch rows, spans of one or more chunks: blocking must not change results."""
    monkeypatch.setattr(ops_fourier, "BLOCK_ELEMENTS", block_elements)
    plan = ops_fourier._plan(2, 3, 4, 5, 4)
    assert (len(plan.groups), plan.span_chunks) == (groups, span_chunks)
    (q, k, v, params, key_mask, positions), offset = split_case(case)

    def fn(*args, **kwargs):
        return chunk_fourier_attention(*args, chunk_size=4, **kwargs)

    check_against_naive(fn, q, k, v, params, key_mask, positions, causal, offset)


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
def test_temporaries_stay_below_block_elements(monkeypatch, causal):
    """Forward and backward create nothing larger than BLOCK_ELEMENTS but the output and the gradients."""
    limit = 2048
    monkeypatch.setattr(ops_fourier, "BLOCK_ELEMENTS", limit)
    q, k, v, params, key_mask, _ = make_inputs(b=2, h=2, lq=150, lk=130, d=8, dv=6, mask="padding")
    inputs = [t.requires_grad_(True) for t in (q, k, v, *params)]
    upstream = torch.randn(2, 2, 150, 6, dtype=F64)
    with _LargeAllocations(limit) as forward:
        out = chunk_fourier_attention(*inputs, causal=causal, key_mask=key_mask, query_offset=7, chunk_size=16)
    with _LargeAllocations(limit) as backward:
        torch.autograd.grad(out, inputs, upstream)
    assert forward.sizes == [out.numel()]
    assert sorted(backward.sizes) == sorted([q.numel(), k.numel(), v.numel()])


def test_backward_saves_only_the_inputs():
    """What autograd keeps for the backward pass is q, k, v, a, b, c, positions and key mask: O(L (D + Dv))."""
    q, k, v, params, key_mask, positions = make_inputs(b=2, h=3, lq=300, lk=260, d=6, dv=5, npos=2, mask="padding")
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
