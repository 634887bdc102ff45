"""Fixtures of the op tests: random inputs of each op family, the loop references, the cases shared by
`test_naive.py` and the fast-path tests, and the comparison of a path with its reference.

The loop references compute each formula with Python loops over (batch, head, query, key) and share no
code with the package.
"""

import math

import pytest
import torch


F64 = torch.float64


def make_key_mask(batch: int, length: int, kind: str | None, generator: torch.Generator):
    """None, "padding" (left padding in the first row, right padding in the last) or "random" (with a
    fully masked first row and a last row that sees only its last key)."""
    if kind is None:
        return None
    if kind == "padding":
        key_mask = torch.ones(batch, length, dtype=torch.long)
        key_mask[0, : length // 3] = 0  # left padding
        key_mask[-1, length - length // 2 :] = 0  # right padding
        return key_mask
    if kind == "random":
        key_mask = torch.rand(batch, length, generator=generator) > 0.4
        key_mask[0, :] = False  # a fully masked batch row
        key_mask[-1, :] = False
        key_mask[-1, -1] = True  # an almost fully masked row: one key, the last
        return key_mask
    raise ValueError(f"unknown mask kind {kind!r}")


def _qkv(b, h, lq, lk, d, dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, lk, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, lk, dv, generator=g, dtype=dtype)
    return g, q, k, v


def make_kernelized_inputs(b=2, h=3, lq=9, lk=9, d=5, dv=4, horizon=3, shared=False, mask=None, dtype=F64, seed=0):
    """q, k, v, rel (None when horizon is None; (2h+1, d) when shared) and key_mask."""
    g, q, k, v = _qkv(b, h, lq, lk, d, dv, dtype, seed)
    rel = None
    if horizon is not None:
        shape = (2 * horizon + 1, d) if shared else (h, 2 * horizon + 1, d)
        rel = torch.randn(*shape, generator=g, dtype=dtype)
    return q, k, v, rel, make_key_mask(b, lk, mask, g)


def make_fourier_inputs(
    b=2, h=3, lq=9, lk=9, d=5, dv=4, npos=None, mask=None, well_conditioned=False, shared_positions=False,
    dtype=F64, seed=0,
):
    """q, k, v, (a, b, c), key_mask and (q_positions, k_positions); positions None means token index."""
    g, q, k, v = _qkv(b, h, lq, lk, d, dv, dtype, seed)
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
    return q, k, v, (freq, phase, amp), make_key_mask(b, lk, mask, g), positions


def make_toeplitz_inputs(b=2, h=3, lq=9, lk=9, d=5, dv=4, horizon=3, mask=None, dtype=F64, seed=0):
    """q, k, v, bias (h, 2 horizon + 1) and key_mask."""
    g, q, k, v = _qkv(b, h, lq, lk, d, dv, dtype, seed)
    bias = torch.randn(h, 2 * horizon + 1, generator=g, dtype=dtype)
    return q, k, v, bias, make_key_mask(b, lk, mask, g)


def make_softmax_inputs(b=2, h=3, lq=9, lk=9, d=5, dv=4, horizon=3, shared=False, mask=None, dtype=F64, seed=0):
    """q, k, v, {"rel", "u", "bias"} (the parameters of every softmax variant) and key_mask."""
    g, q, k, v = _qkv(b, h, lq, lk, d, dv, dtype, seed)
    rows = 2 * horizon + 1
    params = {
        "rel": torch.randn(*((rows, d) if shared else (h, rows, d)), generator=g, dtype=dtype),
        "u": torch.randn(h, d, generator=g, dtype=dtype),
        "bias": torch.randn(h, rows, generator=g, dtype=dtype),
    }
    return q, k, v, params, make_key_mask(b, lk, mask, g)


def _phi(x):
    return torch.where(x > 0, x + 1, torch.exp(x))


def _hidden(bi, i, j, causal, key_mask, offset):
    """Whether key j is hidden from query i (position i + offset) of batch row bi."""
    return (causal and j > i + offset) or (key_mask is not None and not key_mask[bi, j])


def kernelized_loop(q, k, v, rel, causal, key_mask, offset):
    """Kernelized attention with clipped relative positions, with Python loops."""
    b, h, lq, _ = q.shape
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                num, den = torch.zeros(v.shape[-1], dtype=q.dtype), 0.0
                for j in range(k.shape[2]):
                    if _hidden(bi, i, j, causal, key_mask, offset):
                        continue
                    s = _phi(q[bi, hi, i]) @ _phi(k[bi, hi, j])
                    if rel is not None:
                        hz = (rel.shape[-2] - 1) // 2
                        r = min(max(i + offset - j, -hz), hz) + hz
                        table = rel if rel.dim() == 2 else rel[hi]
                        s = s + _phi(q[bi, hi, i]) @ _phi(table[r])
                    num, den = num + s * v[bi, hi, j], den + s
                out[bi, hi, i] = num / den if den > 0 else 0.0
    return out


def toeplitz_loop(q, k, v, bias, causal, key_mask, offset):
    """Kernelized attention times exp(bias[j - p_i + h]) (offsets clipped to +-h), with Python loops."""
    b, h, lq, _ = q.shape
    m = (bias.shape[-1] - 1) // 2
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                p = i + offset
                num, den = torch.zeros(v.shape[-1], dtype=q.dtype), 0.0
                for j in range(k.shape[2]):
                    if _hidden(bi, i, j, causal, key_mask, offset):
                        continue
                    r = min(max(j - p, -m), m) + m
                    s = math.exp(bias[hi, r].item()) * (_phi(q[bi, hi, i]) @ _phi(k[bi, hi, j]))
                    num, den = num + s * v[bi, hi, j], den + s
                out[bi, hi, i] = num / den if den > 0 else 0.0
    return out


def fourier_loop_sums(q, k, v, params, causal, key_mask, offset, positions):
    """num (B, H, Lq, Dv), den and M (B, H, Lq) of the plain formula, with Python loops and cos(ph - pk)."""
    a, b_, c = params
    bsz, h, lq, _ = q.shape
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
                for j in range(k.shape[2]):
                    if _hidden(bi, i, j, causal, key_mask, offset):
                        continue
                    p_j = position(pk, bi, j, 0)
                    prod = _phi(q[bi, hi, i]) * _phi(k[bi, hi, j])
                    s = (c[hi] * prod * torch.cos(b_[hi] + a[hi] @ p_i - a[hi] @ p_j)).sum()
                    num[bi, hi, i] += s * v[bi, hi, j]
                    den[bi, hi, i] += s
                    big[bi, hi, i] += (c[hi].abs() * prod).sum()
    return num, den, big


def softmax_loop(variant, q, k, v, params, causal, key_mask, offset):
    """Each softmax formula with Python loops over (b, h, i, j); differentiable."""
    b, h, lq, d = q.shape
    rows = []
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                scores, values = [], []
                for j in range(k.shape[2]):
                    if _hidden(bi, i, j, causal, key_mask, offset):
                        continue
                    qi, kj = q[bi, hi, i], k[bi, hi, j]
                    if variant == "softmax":
                        s = qi @ kj
                    else:
                        rel = params["rel"] if params["rel"].dim() == 2 else params["rel"][hi]
                        horizon = (rel.shape[0] - 1) // 2
                        r = min(max(i + offset - j, -horizon), horizon) + horizon
                        if variant == "shaw_softmax":
                            s = qi @ (kj + rel[r])
                        else:
                            s = (qi + params["u"][hi]) @ kj + qi @ rel[r] + params["bias"][hi, r]
                    scores.append(s / math.sqrt(d))
                    values.append(v[bi, hi, j])
                if not scores:
                    rows.append(v[bi, hi, 0] * 0.0)  # 0, kept in the graph: its gradient is 0
                    continue
                s = torch.stack(scores)
                e = torch.exp(s - s.max())
                rows.append((e / e.sum()) @ torch.stack(values))
    return torch.stack(rows).view(b, h, lq, v.shape[-1])


def split_case(make_inputs, case):
    """(inputs, query_offset) of a case: keyword arguments of `make_inputs` plus an optional "offset"."""
    case = dict(case)
    offset = case.pop("offset", 0)
    return make_inputs(**case), offset


def assert_matches(fn, ref_fn, tensors, names, *, rtol, atol, grad_rtol, grad_atol, upstream=None, allow_unused=False,
                   **kwargs):
    """`fn(*tensors, **kwargs)` against `ref_fn` on the same leaves (copies of `tensors`): the outputs, then
    the gradient of every leaf for one random upstream gradient (global generator unless `upstream` is
    given). Returns fn's output and grads."""
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves, **kwargs)
    ref = ref_fn(*leaves, **kwargs)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    if upstream is None:
        upstream = torch.randn_like(ref)
    unused = dict(allow_unused=True, materialize_grads=True) if allow_unused else {}
    grads = torch.autograd.grad(out, leaves, upstream, **unused)
    ref_grads = torch.autograd.grad(ref, leaves, upstream, **unused)
    for name, g, rg in zip(names, grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=grad_rtol, atol=grad_atol, msg=lambda m: f"grad {name}: {m}")
    return out, grads


def assert_low_precision(fn, ref_fn, leaves, kwargs, *, tolerance, names=None):
    """`fn` on low-precision leaves against `ref_fn` in float64 on the same rounded values.

    The output keeps the dtype of the first leaf and each gradient that of its leaf; outputs agree to
    `tolerance`, each gradient to `tolerance` times its largest entry. Returns fn's output and the
    reference output.
    """
    ref_leaves = [t.detach().to(F64).requires_grad_(True) for t in leaves]  # same rounded inputs
    out = fn(*leaves, **kwargs)
    ref = ref_fn(*ref_leaves, **kwargs)
    assert out.dtype == leaves[0].dtype
    torch.testing.assert_close(out.to(F64), ref, rtol=tolerance, atol=tolerance)
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, leaves, upstream.to(out.dtype))
    ref_grads = torch.autograd.grad(ref, ref_leaves, upstream)
    for name, x, g, rg in zip(names or [str(i) for i in range(len(leaves))], leaves, grads, ref_grads):
        assert g.dtype == x.dtype
        scale = rg.abs().max().item()
        torch.testing.assert_close(g.to(F64), rg, rtol=tolerance, atol=tolerance * scale, msg=lambda m: f"{name}: {m}")
    return out, ref


# Cases every op is tested on, for the naive reference and the fast paths alike: L = 1, L not a multiple
# of the chunk size, Lq != Lk both ways, query offsets (also past every key), padding, and almost fully
# masked rows.
LENGTH_CASES = [
    pytest.param(dict(lq=1, lk=1), id="L1"),
    pytest.param(dict(lq=23, lk=23), id="L-not-multiple-of-chunk"),
    pytest.param(dict(lq=30, lk=11), id="Lq>Lk"),
    pytest.param(dict(lq=7, lk=26), id="Lq<Lk"),
    pytest.param(dict(lq=6, lk=25, offset=13), id="query-offset"),
    pytest.param(dict(lq=5, lk=9, offset=40), id="offset-past-keys"),
    pytest.param(dict(lq=21, lk=21, mask="padding"), id="padding"),
    pytest.param(dict(lq=19, lk=14, mask="random"), id="masked-rows"),
]
# ops with a clipped relative table: lengths below and at the horizon, horizons 0 and 1
RELATIVE_CASES = LENGTH_CASES + [
    pytest.param(dict(lq=2, lk=2, horizon=4), id="L<h"),
    pytest.param(dict(lq=4, lk=4, horizon=4), id="L=h"),
    pytest.param(dict(lq=13, lk=10, horizon=0), id="horizon-0"),
    pytest.param(dict(lq=13, lk=13, horizon=1), id="horizon-1"),
]
# kernelized RPE also takes a table shared by the heads, or none
KERNELIZED_CASES = RELATIVE_CASES + [
    pytest.param(dict(lq=17, lk=17, shared=True), id="shared-rel"),
    pytest.param(dict(lq=13, lk=13, horizon=None), id="no-rel"),
]
# Fourier attention: lengths below and at two chunks of 4, and positions of 2 and 3 dimensions
FOURIER_CASES = LENGTH_CASES + [
    pytest.param(dict(lq=3, lk=3), id="L<chunk"),
    pytest.param(dict(lq=8, lk=8), id="L=2chunks"),
    pytest.param(dict(lq=17, lk=17, npos=2), id="2d-positions"),
    pytest.param(dict(lq=9, lk=14, npos=2, mask="padding", offset=3), id="2d-positions-cross-offset"),
    pytest.param(dict(lq=10, lk=10, npos=3, shared_positions=True), id="3d-positions-shared-by-batch"),
]


@pytest.fixture(params=KERNELIZED_CASES)
def kernelized_case(request):
    """A case of `make_kernelized_inputs` keyword arguments, with an optional "offset"."""
    return request.param


@pytest.fixture(params=RELATIVE_CASES)
def toeplitz_case(request):
    """A case of `make_toeplitz_inputs` keyword arguments, with an optional "offset"."""
    return request.param


@pytest.fixture(params=FOURIER_CASES)
def fourier_case(request):
    """A case of `make_fourier_inputs` keyword arguments, with an optional "offset"."""
    return request.param


def _factory(name: str, function, doc: str):
    """A fixture named `name` that returns `function` (a factory or helper, called by the tests)."""

    def fixture():
        return function

    fixture.__doc__ = doc
    return pytest.fixture(name=name)(fixture)


kernelized_inputs = _factory("kernelized_inputs", make_kernelized_inputs, make_kernelized_inputs.__doc__)
fourier_inputs = _factory("fourier_inputs", make_fourier_inputs, make_fourier_inputs.__doc__)
toeplitz_inputs = _factory("toeplitz_inputs", make_toeplitz_inputs, make_toeplitz_inputs.__doc__)
softmax_inputs = _factory("softmax_inputs", make_softmax_inputs, make_softmax_inputs.__doc__)
kernelized_reference = _factory("kernelized_loop", kernelized_loop, kernelized_loop.__doc__)
toeplitz_reference = _factory("toeplitz_loop", toeplitz_loop, toeplitz_loop.__doc__)
fourier_reference = _factory("fourier_loop_sums", fourier_loop_sums, fourier_loop_sums.__doc__)
softmax_reference = _factory("softmax_loop", softmax_loop, softmax_loop.__doc__)
case_splitter = _factory("split_case", split_case, split_case.__doc__)
comparison = _factory("assert_matches", assert_matches, assert_matches.__doc__)
precision = _factory("assert_low_precision", assert_low_precision, assert_low_precision.__doc__)


def decay_loop(q, k, v, rel, decay, causal, key_mask, offset, horizon, normalise=False, feature_map="elu"):
    """Kernelized RPE scores times exp(-decay[h] max(|p_i - j| - horizon, 0)), summed, divided by the sum of
    the weights when `normalise`, with Python loops; phi is elu + 1 or, with `feature_map="relu"`, max(x, 0)."""
    phi = {"elu": _phi, "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x))}[feature_map]
    b, h, lq, _ = q.shape
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                den = 0.0
                for j in range(k.shape[2]):
                    if _hidden(bi, i, j, causal, key_mask, offset):
                        continue
                    s = phi(q[bi, hi, i]) @ phi(k[bi, hi, j])
                    t = i + offset - j
                    if rel is not None:
                        table = rel if rel.dim() == 2 else rel[hi]
                        s = s + phi(q[bi, hi, i]) @ phi(table[min(max(t, -horizon), horizon) + horizon])
                    w = s * math.exp(-decay[hi].item() * max(abs(t) - horizon, 0))
                    out[bi, hi, i] += w * v[bi, hi, j]
                    den += w
                if normalise and den > 0:
                    out[bi, hi, i] /= den
    return out


def make_decay_inputs(b=2, h=3, lq=9, lk=9, d=5, dv=4, horizon=3, shared=False, mask=None, no_rel=False,
                      dtype=F64, seed=0):
    """q, k, v, rel (None when no_rel), decay rates (H,) in [0.05, 1), key_mask and the horizon."""
    q, k, v, rel, key_mask = make_kernelized_inputs(b, h, lq, lk, d, dv, horizon, shared, mask, dtype, seed)
    decay = 0.05 + 0.95 * torch.rand(h, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    return q, k, v, None if no_rel else rel, decay, key_mask, horizon


# decay attention: the relative cases with long enough sequences to reach the tails on both sides
DECAY_CASES = RELATIVE_CASES + [
    pytest.param(dict(lq=17, lk=17, shared=True), id="shared-rel"),
    pytest.param(dict(lq=13, lk=13, no_rel=True), id="no-rel"),
    pytest.param(dict(lq=12, lk=7, horizon=0, no_rel=True, offset=3), id="no-rel-horizon-0-cross"),
    pytest.param(dict(lq=1, lk=1, horizon=0, no_rel=True), id="no-rel-horizon-0-length-1"),
    pytest.param(dict(lq=40, lk=40, horizon=2, mask="padding"), id="long-tails"),
    pytest.param(dict(lq=9, lk=33, horizon=2, offset=11), id="cross-offset-both-tails"),
    pytest.param(dict(lq=5, lk=6, horizon=2, offset=20), id="queries-past-the-keys"),
]


@pytest.fixture(params=DECAY_CASES)
def decay_case(request):
    """A case of `make_decay_inputs` keyword arguments, with an optional "offset"."""
    return request.param


def check_decay_op(fn, reference, inputs, causal, offset, **options):
    """`fn` against `reference` (two ops of the decay calling convention: q, k, v, rel, decay, then keywords) on
    `make_decay_inputs` inputs: the outputs and the gradients of q, k, v, the decay rates and the table when there
    is one, at float64 tolerances. `options` go to both ops."""
    q, k, v, rel, decay, key_mask, horizon = inputs
    tensors, names = ((q, k, v, decay), "q k v decay") if rel is None else ((q, k, v, decay, rel), "q k v decay rel")

    def call(op):
        def run(q, k, v, decay, rel=None):
            return op(q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=offset, horizon=horizon,
                      **options)
        return run

    assert_matches(call(fn), call(reference), tensors, names.split(), allow_unused=True, rtol=1e-10, atol=1e-12,
                   grad_rtol=1e-9, grad_atol=1e-11)


decay_inputs = _factory("decay_inputs", make_decay_inputs, make_decay_inputs.__doc__)
decay_checker = _factory("check_decay_op", check_decay_op, check_decay_op.__doc__)
decay_reference = _factory("decay_loop", decay_loop, decay_loop.__doc__)


# rows without a visible key in their band: past every key, past a padded row's last visible key, before its first,
# inside gaps of hidden keys; `lost` where the fast head's chunked sums of the PyTorch path underflow even in float64
BEYOND_THE_KEYS = dict(
    past_the_keys=dict(lq=250, lk=10, lost=True), past_the_keys_causal=dict(lq=250, lk=10, causal=True, lost=True),
    offset=dict(lq=12, lk=30, offset=250, lost=True),
    last_keys_hidden=dict(lq=220, lk=20, mask="last-keys-hidden", lost=True),
    last_keys_hidden_causal=dict(lq=220, lk=20, causal=True, mask="last-keys-hidden", lost=True),
    right_padding=dict(lq=250, lk=240, mask="right-padding", lost=True),
    right_padding_causal=dict(lq=250, lk=240, causal=True, mask="right-padding", lost=True),
    left_padding=dict(lq=240, lk=250, offset=3, mask="left-padding", lost=True),
    left_padding_causal=dict(lq=240, lk=250, causal=True, mask="left-padding"),
    both_paddings=dict(lq=250, lk=250, mask="both-paddings", lost=True),
    a_batch_row_without_keys=dict(lq=30, lk=20, offset=4, mask="hidden-row"),
    length_1=dict(lq=1, lk=1, offset=300, lost=True), length_1_hidden=dict(lq=1, lk=1, offset=6, mask="hidden-row"),
    length_1_right_padding=dict(lq=1, lk=240, offset=239, mask="right-padding", lost=True),
    gap=dict(lq=400, lk=400, mask="gap", lost=True), gap_causal=dict(lq=400, lk=400, causal=True, mask="gap", lost=True),
    gaps_and_paddings=dict(lq=250, lk=240, offset=5, mask="gaps-and-paddings"),
    gaps_and_paddings_causal=dict(lq=250, lk=240, offset=5, causal=True, mask="gaps-and-paddings"),
)


def make_beyond_the_keys_inputs(name: str, rates: tuple[float, float] = (0.3, 4.0)):
    """(args, kwargs, lost) of the `BEYOND_THE_KEYS` case `name` in float64: B = 2, H = 2, D = 4, h = 3, the decay
    `rates` of the two heads; the second batch row's keys hidden by the case's `mask` (padding leaves it 20 keys)."""
    case = BEYOND_THE_KEYS[name]
    gen = torch.Generator().manual_seed(0)
    lq, lk = case["lq"], case["lk"]
    q = torch.randn(2, 2, lq, 4, dtype=F64, generator=gen)
    k, v = (torch.randn(2, 2, lk, 4, dtype=F64, generator=gen) for _ in range(2))
    rel, decay = torch.randn(2, 7, 4, dtype=F64, generator=gen), torch.tensor(rates, dtype=F64)
    key_mask = torch.ones(2, lk, dtype=torch.long)
    hidden = {"last-keys-hidden": [slice(lk // 2, None)], "hidden-row": [slice(None)], "right-padding": [slice(20, None)],
              "left-padding": [slice(None, -20)], "both-paddings": [slice(None, 200)], "gap": [slice(20, 380)],
              # gaps of 6 (too short to leave a band of 2h + 1 = 7 keys without a visible one, unless causal), 40, 1
              # and 70 hidden keys, between paddings of 10 and 20
              "gaps-and-paddings": [slice(None, 10), slice(20, 26), slice(60, 100), slice(120, 121), slice(150, 220),
                                    slice(-20, None)]}
    for keys in hidden.get(case.get("mask"), []):
        key_mask[1, keys] = 0
    if case.get("mask") == "both-paddings":
        key_mask[0, 20:] = 0
    kwargs = dict(causal=case.get("causal", False), key_mask=key_mask if "mask" in case else None,
                  query_offset=case.get("offset", 0))
    return [x.clone().requires_grad_() for x in (q, k, v, rel, decay)], kwargs, case.get("lost", False)


@pytest.fixture(params=list(BEYOND_THE_KEYS), ids=list(BEYOND_THE_KEYS))
def beyond_the_keys_case(request):
    """The name of a `BEYOND_THE_KEYS` case (`beyond_the_keys_inputs`)."""
    return request.param


beyond_the_keys_inputs = _factory("beyond_the_keys_inputs", make_beyond_the_keys_inputs,
                                  make_beyond_the_keys_inputs.__doc__)


def decay_gradient_terms(args, kwargs, upstream) -> torch.Tensor:
    """The sum of the magnitudes of the terms of each head's rate gradient (H,), in float64: with p_ij the weights
    of `naive_local_softmax_decay_attention(*args, **kwargs)` over their row's sum, o_i the output and g_i
    `upstream`, d(loss)/d(lambda) = -sum_ij (|p_i - j| - h)+ p_ij g_i.(v_j - o_i). The terms cancel where a row lies
    far from its keys (their distances are all large and sum_j p_ij (v_j - o_i) = 0); no float32 sum of them is
    sure to come closer to the total than float32's epsilon times this sum."""
    from modeling_scaleformer.ops_naive import naive_local_softmax_decay_weights

    q, k, v, rel, decay = (x.detach().double() for x in args)
    with torch.no_grad():
        weights = naive_local_softmax_decay_weights(q, k, rel, decay, **kwargs)
        total = weights.sum(-1, keepdim=True)
        shares = torch.where(total > 0, weights / total, 0.0)
        out = shares @ v
        h, offset = (rel.shape[-2] - 1) // 2, kwargs.get("query_offset", 0)
        rows, keys = torch.arange(q.shape[2]) + offset, torch.arange(k.shape[2])
        beyond = ((rows[:, None] - keys[None, :]).abs() - h).clamp(min=0).double()
        per_pair = upstream.double() @ v.transpose(-1, -2)
        per_row = (upstream.double() * out).sum(-1, keepdim=True)
        return (beyond * shares * (per_pair.abs() + per_row.abs())).sum((0, 2, 3))


decay_gradient_terms_fixture = _factory("decay_gradient_terms", decay_gradient_terms, decay_gradient_terms.__doc__)
