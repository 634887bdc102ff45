"""Softmax baselines (plain, Shaw, Transformer-XL): SDPA against the quadratic reference in float64, the
key/value cache, and the input checks."""

import pytest
import torch
import torch.nn.functional as F

from modeling_scaleformer import ops_softmax
from modeling_scaleformer.ops_naive import (
    naive_shaw_softmax_attention,
    naive_softmax_attention,
    naive_xl_relative_attention,
)
from modeling_scaleformer.ops_softmax import (
    SoftmaxKVState,
    shaw_softmax_attention,
    softmax_attention,
    softmax_cross_state,
    softmax_cross_step,
    softmax_initial_state,
    softmax_prefill_state,
    softmax_step,
    xl_relative_attention,
)


F64 = torch.float64
VARIANTS = ["softmax", "shaw_softmax", "xl_relative"]
# parameter names of each variant, in the positional order of its functions
PARAMETERS = {"softmax": (), "shaw_softmax": ("rel",), "xl_relative": ("u", "rel", "bias")}
NAIVE = {
    "softmax": naive_softmax_attention,
    "shaw_softmax": naive_shaw_softmax_attention,
    "xl_relative": naive_xl_relative_attention,
}
PUBLIC = {"softmax": softmax_attention, "shaw_softmax": shaw_softmax_attention, "xl_relative": xl_relative_attention}


def compare(assert_matches, fn, ref_fn, variant, q, k, v, params, key_mask, causal, offset, rtol=1e-10, atol=1e-12):
    """Outputs and gradients of q, k, v and every parameter, with random upstream gradients."""
    names = ("q", "k", "v") + PARAMETERS[variant]
    tensors = (q, k, v, *(params[n] for n in PARAMETERS[variant]))
    # a fully masked output does not depend on q: its gradient is 0, not missing
    upstream = torch.randn(q.shape[:3] + v.shape[-1:], generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    assert_matches(
        fn, ref_fn, tensors, names, causal=causal, key_mask=key_mask, query_offset=offset,
        rtol=rtol, atol=atol, grad_rtol=rtol * 10, grad_atol=atol * 10, upstream=upstream, allow_unused=True,
    )


CASES = [
    pytest.param(dict(lq=1, lk=1), id="L1"),
    pytest.param(dict(lq=3, lk=3, horizon=5), id="L<h"),
    pytest.param(dict(lq=14, lk=6), id="Lq>Lk"),
    pytest.param(dict(lq=5, lk=15), id="Lq<Lk"),
    pytest.param(dict(lq=6, lk=17, offset=9), id="query-offset"),
    pytest.param(dict(lq=4, lk=9, offset=30), id="offset-past-keys"),
    pytest.param(dict(lq=12, lk=12, mask="padding"), id="padding"),
    pytest.param(dict(lq=11, lk=9, mask="random", offset=2), id="masked-rows"),
    pytest.param(dict(lq=10, lk=10, shared=True), id="shared-rel"),
    pytest.param(dict(lq=8, lk=11, horizon=0, mask="padding"), id="horizon-0"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES)
def test_sdpa(case, variant, causal, softmax_inputs, split_case, assert_matches):
    (q, k, v, params, key_mask), offset = split_case(softmax_inputs, case)

    def sdpa(*leaves, **kwargs):
        return PUBLIC[variant](*leaves, mode="sdpa", **kwargs)

    compare(assert_matches, sdpa, NAIVE[variant], variant, q, k, v, params, key_mask, causal, offset)


@pytest.mark.parametrize("mode", ["naive", "sdpa"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_fully_masked_row_is_zero_with_finite_grads(variant, mode, softmax_inputs):
    q, k, v, params, _ = softmax_inputs(b=3, h=2, lq=5, lk=6)
    key_mask = torch.ones(3, 6, dtype=torch.bool)
    key_mask[1] = False  # every query of batch row 1 sees nothing
    key_mask[2, 1:] = False  # causal: queries of row 2 see only key 0
    names = PARAMETERS[variant]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, *(params[n] for n in names))]
    for causal in (False, True):
        out = PUBLIC[variant](*leaves, causal=causal, key_mask=key_mask, mode=mode)
        assert bool((out[1] == 0).all()) and bool(torch.isfinite(out).all())
        torch.testing.assert_close(out[2], v[2, :, :1].expand(2, 5, -1), rtol=1e-12, atol=1e-12)
        grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
        for g in grads:
            assert bool(torch.isfinite(g).all())
        assert bool((grads[0][1] == 0).all())  # the queries of an empty row get no gradient


def math_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """SDPA written as its documentation states it: NaN for a row whose mask hides every key."""
    scores = q @ k.transpose(-1, -2) * scale
    if is_causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("variant", VARIANTS)
def test_sdpa_backend_returning_nan_for_empty_rows(monkeypatch, variant, softmax_inputs, split_case, assert_matches):
    """Backends differ on all-masked rows (this CPU build gives 0, others NaN): no such row reaches SDPA."""
    monkeypatch.setattr(ops_softmax.F, "scaled_dot_product_attention", math_sdpa)
    (q, k, v, params, key_mask), offset = split_case(softmax_inputs, dict(lq=7, lk=6, mask="random"))
    for causal in (False, True):
        compare(
            assert_matches, lambda *x, **kw: PUBLIC[variant](*x, mode="sdpa", **kw), NAIVE[variant],
            variant, q, k, v, params, key_mask, causal, offset,
        )


@pytest.mark.parametrize("variant", VARIANTS)
def test_auto_is_sdpa(monkeypatch, variant, softmax_inputs):
    calls, sdpa = [], F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("scale"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(ops_softmax.F, "scaled_dot_product_attention", counting)
    q, k, v, params, key_mask = softmax_inputs(d=4, mask="padding")
    args = [params[n] for n in PARAMETERS[variant]]
    PUBLIC[variant](q, k, v, *args, key_mask=key_mask, causal=True)
    PUBLIC[variant](q, k, v, *args, mode="naive")
    assert calls == [0.5]  # only "auto" ran SDPA, with its own scale 1/sqrt(d)


def run_steps(variant, q, k, v, params, key_mask, pieces, state):
    extra = {n: params[n] for n in PARAMETERS[variant]}
    outs, start = [], state.seen
    for n in pieces:
        sl = slice(start, start + n)
        m = None if key_mask is None else key_mask[:, sl]
        o, state = softmax_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], state, key_mask=m, variant=variant, **extra)
        outs.append(o)
        start += n
    return torch.cat(outs, dim=2), state


@pytest.mark.parametrize("mask", [None, "padding"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_step_token_by_token_and_in_pieces(variant, mask, softmax_inputs):
    q, k, v, params, key_mask = softmax_inputs(b=2, h=2, lq=11, lk=11, horizon=3, mask=mask)
    full = NAIVE[variant](q, k, v, *(params[n] for n in PARAMETERS[variant]), causal=True, key_mask=key_mask)
    for pieces in ([1] * 11, [3, 1, 4, 3], [11]):
        out, state = run_steps(variant, q, k, v, params, key_mask, pieces, softmax_initial_state(2, 2, 5, 4, dtype=F64))
        torch.testing.assert_close(out, full, rtol=1e-10, atol=1e-12)
        assert state.seen == 11 and tuple(state.k.shape) == (2, 2, 11, 5) and tuple(state.v.shape) == (2, 2, 11, 4)
        assert state.key_mask.dtype == torch.bool and tuple(state.key_mask.shape) == (2, 11)


@pytest.mark.parametrize("prompt", [1, 6])
@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_state_then_steps(variant, prompt, softmax_inputs):
    q, k, v, params, key_mask = softmax_inputs(b=2, h=2, lq=10, lk=10, horizon=2, mask="padding")
    full = NAIVE[variant](q, k, v, *(params[n] for n in PARAMETERS[variant]), causal=True, key_mask=key_mask)
    state = softmax_prefill_state(k[:, :, :prompt], v[:, :, :prompt], key_mask=key_mask[:, :prompt])
    assert state.seen == prompt
    out, _ = run_steps(variant, q, k, v, params, key_mask, [1] * (10 - prompt), state)
    torch.testing.assert_close(out, full[:, :, prompt:], rtol=1e-10, atol=1e-12)


def test_state_reorders_on_batch(softmax_inputs):
    """Beam search reorders every tensor field on dim 0; stepping on goes on from the chosen rows."""
    q, k, v, params, key_mask = softmax_inputs(b=3, h=2, lq=6, lk=6, mask="padding")
    _, state = run_steps("xl_relative", q, k, v, params, key_mask, [4], softmax_initial_state(3, 2, 5, 4, dtype=F64))
    order = torch.tensor([2, 2, 0])
    state = SoftmaxKVState(*(t.index_select(0, order) for t in state[:3]), seen=state.seen)
    q, k, v, key_mask = q[order], k[order], v[order], key_mask[order]
    out, _ = run_steps("xl_relative", q, k, v, params, key_mask, [1, 1], state)
    u, rel, bias = params["u"], params["rel"], params["bias"]
    full = naive_xl_relative_attention(q, k, v, u, rel, bias, causal=True, key_mask=key_mask)
    torch.testing.assert_close(out, full[:, :, 4:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask", [None, "padding", "random"])
def test_cross_step(mask, softmax_inputs):
    q, k, v, _, key_mask = softmax_inputs(b=2, h=2, lq=7, lk=12, mask=mask)
    state = softmax_cross_state(k, v, key_mask=key_mask)
    full = naive_softmax_attention(q, k, v, key_mask=key_mask)
    for t in range(7):
        step = softmax_cross_step(q[:, :, t : t + 1], state)
        torch.testing.assert_close(step, full[:, :, t : t + 1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(softmax_cross_step(q, state), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16(variant, causal, softmax_inputs, assert_low_precision):
    """bf16 runs the softmax in float32: the error is that of rounding the output (and gradients).

    Against float64 on the same rounded inputs. bf16 keeps 8 significant bits (relative step 2^-8 =
    0.004): tolerance 2e-2 on outputs of size O(1), and 2e-2 of the largest entry on each gradient.
    """
    dtype, tolerance = torch.bfloat16, 2e-2
    q, k, v, params, key_mask = softmax_inputs(b=1, h=2, lq=48, lk=48, d=16, dv=16, horizon=8, mask="padding")
    names = PARAMETERS[variant]
    half = [t.to(dtype).requires_grad_(True) for t in (q, k, v, *(params[n] for n in names))]
    kwargs = dict(causal=causal, key_mask=key_mask)
    out, ref = assert_low_precision(PUBLIC[variant], NAIVE[variant], half, kwargs, tolerance=tolerance)
    assert out.dtype == dtype
    naive_half = NAIVE[variant](*half, **kwargs)
    assert naive_half.dtype == dtype
    torch.testing.assert_close(naive_half.to(F64), ref, rtol=tolerance, atol=tolerance)


def good_args(softmax_inputs):
    q, k, v, params, _ = softmax_inputs(b=2, h=3, lq=5, lk=5, d=5, dv=4, horizon=3, dtype=torch.float32)
    return dict(q=q, k=k, v=v, **params)


BAD = [
    pytest.param(VARIANTS, dict(q=torch.randn(2, 3, 4)), "`q`", id="q-3d"),
    pytest.param(VARIANTS, dict(k=torch.randn(2, 3, 5, 6)), "`k`", id="k-dim"),
    pytest.param(VARIANTS, dict(v=torch.randn(2, 3, 6, 4)), "`v`", id="v-length"),
    pytest.param(VARIANTS, dict(v=torch.randn(2, 3, 5, 4, dtype=F64)), "dtype", id="mixed-dtype"),
    pytest.param(VARIANTS, dict(key_mask=torch.ones(2, 4)), "`key_mask`", id="mask-shape"),
    pytest.param(VARIANTS, dict(key_mask=torch.full((2, 5), 2)), "`key_mask`", id="mask-values"),
    pytest.param(VARIANTS, dict(query_offset=-1), "`query_offset`", id="offset"),
    pytest.param(VARIANTS, dict(mode="linear"), "`mode`", id="mode-linear"),
    pytest.param(["shaw_softmax", "xl_relative"], dict(rel=torch.randn(3, 6, 5)), "`rel`", id="rel-even"),
    pytest.param(["shaw_softmax", "xl_relative"], dict(rel=torch.randn(4, 7, 5)), "`rel`", id="rel-heads"),
    pytest.param(["shaw_softmax", "xl_relative"], dict(rel=torch.randn(3, 7, 5, dtype=F64)), "`rel`", id="rel-dtype"),
    pytest.param(["shaw_softmax", "xl_relative"], dict(rel=None), "`rel`", id="rel-none"),
    pytest.param(["xl_relative"], dict(u=torch.randn(3, 4)), "`u`", id="u-shape"),
    pytest.param(["xl_relative"], dict(u=torch.randn(3, 5, dtype=F64)), "`u`", id="u-dtype"),
    pytest.param(["xl_relative"], dict(bias=torch.randn(3, 5)), "`bias`", id="bias-rows"),
    pytest.param(["xl_relative"], dict(bias=torch.randn(7)), "`bias`", id="bias-heads"),
    pytest.param(["xl_relative"], dict(bias=None), "`bias`", id="bias-none"),
]


@pytest.mark.parametrize("variants, override, name", BAD)
def test_bad_inputs_raise(variants, override, name, softmax_inputs):
    for variant in variants:
        args = good_args(softmax_inputs)
        args.update(override)
        kwargs = {key: args.pop(key) for key in ("key_mask", "query_offset", "mode") if key in args}
        positional = [args[n] for n in ("q", "k", "v") + PARAMETERS[variant]]
        with pytest.raises(ValueError, match=name):
            PUBLIC[variant](*positional, **kwargs)


STEP_BAD = [
    pytest.param(dict(variant="kernelized"), "`variant`", id="variant"),
    pytest.param(dict(variant="softmax", params=("rel",)), "`rel`", id="rel-unused"),
    pytest.param(dict(variant="shaw_softmax"), "`rel`", id="rel-missing"),
    pytest.param(dict(variant="shaw_softmax", params=("rel", "u")), "`u`", id="u-unused"),
    pytest.param(dict(variant="xl_relative", params=("rel", "bias")), "`u`", id="u-missing"),
    pytest.param(dict(variant="xl_relative", params=("rel", "u")), "`bias`", id="bias-missing"),
    pytest.param(dict(state=(1, 2, 3)), "`state`", id="state-type"),
    pytest.param(dict(state=softmax_initial_state(2, 3, 6, 4, dtype=torch.float32)), "`state`", id="state-dim"),
    pytest.param(dict(state=softmax_initial_state(2, 3, 5, 4, dtype=F64)), "`state`", id="state-dtype"),
    pytest.param(dict(state=softmax_initial_state(1, 3, 5, 4, dtype=torch.float32)), "`state`", id="state-batch"),
    pytest.param(dict(k_length=2), "`q` and `k`", id="new-lengths"),
    pytest.param(dict(key_mask=torch.ones(2, 2)), "`key_mask`", id="mask-shape"),
]


@pytest.mark.parametrize("override, name", STEP_BAD)
def test_step_bad_inputs_raise(override, name, softmax_inputs):
    args = good_args(softmax_inputs)
    q, k, v = (args[n][:, :, :1] for n in "qkv")
    override = dict(override)
    if "k_length" in override:
        length = override.pop("k_length")
        k, v = args["k"][:, :, :length], args["v"][:, :, :length]
    state = override.pop("state", softmax_initial_state(2, 3, 5, 4, dtype=torch.float32))
    extra = {n: args[n] for n in override.pop("params", ())}
    extra.update(override)
    with pytest.raises(ValueError, match=name):
        softmax_step(q, k, v, state, **extra)


def test_state_constructors_reject_bad_inputs():
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)
    for fn in (softmax_prefill_state, softmax_cross_state):
        with pytest.raises(ValueError, match="`k`"):
            fn(k[0], v)
        with pytest.raises(ValueError, match="`v`"):
            fn(k, v[:, :, :4])
        with pytest.raises(ValueError, match="`key_mask`"):
            fn(k, v, key_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="`state`"):
        softmax_cross_step(torch.randn(2, 3, 1, 4), (k, v))
    state = softmax_initial_state(2, 3, 4, 6, dtype=torch.bfloat16)
    assert isinstance(state, SoftmaxKVState) and state.seen == 0 and state.k.dtype == torch.bfloat16
