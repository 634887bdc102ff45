"""The Triton kernels of the decayed tails (`ops_decay_triton`): through Triton's interpreter on CPU at small shapes
(float64, against the PyTorch path of `ops_decay.decayed_tail` and, inside `kernelized_decay`, against its quadratic
reference,
outputs and gradients; the default attention on its Triton paths is tested in test_local_softmax_triton.py), and on
CUDA at real shapes (`gpu` marker, skipped without a device)."""

import functools
import os

import pytest
import torch


if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    # interpreted in a fresh process by test_triton_interpreted.py (see test_local_softmax_triton.py)
    pytest.skip("run by test_triton_interpreted.py with TRITON_INTERPRET=1", allow_module_level=True)
pytest.importorskip("triton")
pytest.importorskip("numpy")

from modeling_scaleformer import ops_decay, ops_decay_triton  # noqa: E402
from modeling_scaleformer.ops_decay import chunk_kernelized_decay_attention  # noqa: E402
from modeling_scaleformer.ops_decay_triton import dot_precision  # noqa: E402
from modeling_scaleformer.ops_naive import naive_kernelized_decay_attention  # noqa: E402


F64 = torch.float64


def tail_inputs(b, heads, lq, lk, e, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    xq = torch.randn(b, heads, lq, e, dtype=F64, generator=gen)
    y = torch.randn(b, heads, lk, e, dtype=F64, generator=gen)
    vm = torch.randn(b, heads, lk, dv, dtype=F64, generator=gen)
    return [xq, y, vm, torch.rand(heads, dtype=F64, generator=gen)], gen


TAIL_CASES = [  # (lq, lk, horizon, offset, E, Dv)
    pytest.param((2, 2, 0, 0, 3, 4), id="one-query-sees-one-key"),
    pytest.param((37, 37, 2, 0, 5, 7), id="self-partial-last-chunk"),
    pytest.param((19, 19, 2, 0, 3, 6), id="self-one-chunk"),
    pytest.param((9, 50, 2, 30, 5, 4), id="cross-keys-before-the-span"),
    pytest.param((5, 6, 2, 20, 4, 3), id="queries-past-the-keys"),
    pytest.param((70, 33, 3, 5, 6, 5), id="lq>lk"),
    pytest.param((40, 40, 1, 0, 40, 70), id="state-blocks"),
    pytest.param((33, 33, 0, 0, 65, 65), id="d64-plus-one"),
]


# read reversed in the default run: keys before the span, Lq != Lk and several blocks of the state kernels
REVERSED_TAILS = {"cross-keys-before-the-span", "lq>lk", "state-blocks"}


@pytest.mark.parametrize("case, reverse", [
    pytest.param(*case.values, reverse, id=f"{case.id}-{direction}",
                 marks=() if not reverse or case.id in REVERSED_TAILS else pytest.mark.slow)
    for case in TAIL_CASES + [pytest.param((150, 150, 3, 0, 8, 9, 64), id="chunks-of-64")]
    for reverse, direction in ((False, "causal"), (True, "reversed"))
])
def test_tail_against_pytorch(case, reverse, triton_paths):
    """`decayed_tail` on the Triton kernels against its PyTorch path (float64): the output and the gradients of the
    queries and keys, the values and the rates, over queries that see no key, spans shorter and longer than a
    chunk (of 16 positions, and of the kernels' 64 in one case), keys before the span (an initial state), queries
    past the keys, Lq != Lk both ways, E and Dv that are not powers of two and span several blocks of the state
    kernels (40 x 70: 1 x 3 programs of 64 x 32), read forwards and reversed in place."""
    lq, lk, horizon, offset, e, dv, *chunk = case
    chunk = chunk[0] if chunk else 16
    leaves, gen = tail_inputs(2, 2, lq, lk, e, dv, seed=lq + lk + chunk)  # 4 rows: the interpreter runs each program
    expected_leaves = [x.clone().requires_grad_() for x in leaves]
    leaves = [x.requires_grad_() for x in leaves]
    options = dict(reverse=reverse)
    expected = ops_decay.decayed_tail(*expected_leaves, horizon, offset, 4, **options)
    triton_paths(chunk)
    got = ops_decay.decayed_tail(*leaves, horizon, offset, 4, **options)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
    upstream = torch.randn(expected.shape, dtype=F64, generator=gen)
    for name, g, r in zip("xq y vm rate".split(), torch.autograd.grad(got, leaves, upstream),
                          torch.autograd.grad(expected, expected_leaves, upstream)):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-11, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("case", [(70, 70, 2, 0), (9, 300, 2, 250)], ids=["self", "cross-keys-before-the-span"])
@pytest.mark.parametrize("reverse", [False, True], ids=["causal", "reversed"])
def test_tail_with_16_bit_operands(case, reverse, triton_paths):
    """Queries and keys in float16 (the values in float32, as the op passes them): the kernels multiply 16-bit
    operands and accumulate in float32, within float16's precision of the PyTorch path (which computes in
    float32), the keys before the span (their decayed sum, in float32) included. bfloat16 takes the same code on a
    GPU; Triton's interpreter multiplies bfloat16 tiles wrongly."""
    lq, lk, horizon, offset = case
    e, dv = 8, 9
    leaves, gen = tail_inputs(1, 2, lq, lk, e, dv, seed=7)
    xq, y, vm, rate = leaves
    leaves = [xq.half(), y.half(), vm.float(), rate.float()]
    expected_leaves = [x.clone().requires_grad_() for x in leaves]
    leaves = [x.requires_grad_() for x in leaves]
    options = dict(reverse=reverse)
    expected = ops_decay.decayed_tail(*expected_leaves, horizon, offset, 4, **options)
    triton_paths()
    got = ops_decay.decayed_tail(*leaves, horizon, offset, 4, **options)
    assert got.dtype == torch.float32
    scale = float(expected.detach().abs().max())
    torch.testing.assert_close(got, expected, rtol=5e-3, atol=5e-3 * scale)
    upstream = torch.randn(expected.shape, generator=gen)
    for name, g, r in zip("xq y vm rate".split(), torch.autograd.grad(got, leaves, upstream),
                          torch.autograd.grad(expected, expected_leaves, upstream)):
        assert g.dtype == r.dtype, name
        torch.testing.assert_close(g.float(), r.float(), rtol=1e-2, atol=1e-2 * float(r.abs().max()),
                                   msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("reverse", [False, True], ids=["first-keys", "last-keys"])
def test_keys_before_the_span_from_16_bit_keys(reverse):
    """The decayed sum of the keys before the span (computed in PyTorch beside the kernels) works in the values'
    dtype whatever the keys' dtype: bfloat16 keys give the sum of their float32 copies (a distance of 1,000
    positions is not a bfloat16 number)."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(1, 2, 1200, 4, generator=gen).bfloat16()
    vm = torch.randn(1, 2, 1200, 3, generator=gen)
    rate = torch.tensor([0.001, 0.01])
    got = ops_decay._decayed_before(y, vm, rate, 1100, reverse)
    expected = ops_decay._decayed_before(y.float(), vm, rate, 1100, reverse)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_tail_rate_gradient_on_long_inputs(triton_paths):
    """The rates' gradient is a sum of local terms: over 100 chunks it matches, in float32, the float64 value as
    closely as the PyTorch path's does."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.rand(1, 2, 1600, 4, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 1600, 3, generator=gen)
    rate = torch.tensor([0.01, 0.3]).requires_grad_()
    upstream = torch.randn(1, 2, 1600, 3, generator=gen)

    def rate_grad(*inputs):
        return torch.autograd.grad(ops_decay.decayed_tail(*inputs, 0, 1, 16), inputs[-1], upstream.to(inputs[0].dtype))

    reference = rate_grad(*(t.double() for t in (x, y, v)), rate.double())[0].double()
    pytorch = rate_grad(x, y, v, rate)[0].double()
    triton_paths()
    triton_path = rate_grad(x, y, v, rate)[0].double()
    torch.testing.assert_close(pytorch, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(triton_path, reference, rtol=1e-4, atol=1e-4)


def test_tail_kernel_choice_and_wide_features():
    """The kernels are chosen for CUDA tensors whose features they hold; wider features stay on PyTorch, and the
    kernels refuse them with the limit named."""
    wide = ops_decay_triton.MAX_DIM + 1
    x = torch.zeros(1, 1, 4, wide, dtype=F64)
    with pytest.raises(ValueError, match="at most 256 features"):
        ops_decay_triton.decayed_tail(x, x, x[..., :3], torch.zeros(1, dtype=F64), None, skip=0, lead=0)
    assert ops_decay._tail_kernel(torch.device("cuda"), 64) is ops_decay_triton.decayed_tail
    assert ops_decay._tail_kernel(torch.device("cuda"), wide) is None
    assert ops_decay._tail_kernel(torch.device("cpu"), 64) is None


def test_dot_precision():
    """Products of 16-bit inputs take TF32; float32 ones follow torch's float32 matmul precision (three TF32
    products at "highest"); float64 ones are exact."""
    assert dot_precision(torch.float32, half_inputs=True) == "tf32"
    assert dot_precision(torch.float64, half_inputs=False) == "ieee"
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert dot_precision(torch.float32, half_inputs=False) == "tf32x3"
        torch.set_float32_matmul_precision("high")
        assert dot_precision(torch.float32, half_inputs=False) == "tf32"
    finally:
        torch.set_float32_matmul_precision(previous)


KERNELIZED_DECAY_CASES = {"long-tails": dict(lq=40, lk=40, horizon=2, mask="padding"),
                          "cross-offset-both-tails": dict(lq=9, lk=33, horizon=2, offset=11),
                          "queries-past-the-keys": dict(lq=5, lk=6, horizon=2, offset=20)}
# the default run: each case, both row sums and both directions, in 4 of their 12 pairings
DEFAULT_KERNELIZED_DECAY = {"long-tails-sum-bidirectional", "long-tails-normalised-causal",
                            "cross-offset-both-tails-normalised-bidirectional", "queries-past-the-keys-sum-causal"}


@pytest.mark.parametrize("case, normalise, causal", [
    pytest.param(case, normalise, causal, id=name, marks=() if name in DEFAULT_KERNELIZED_DECAY else pytest.mark.slow)
    for case_name, case in KERNELIZED_DECAY_CASES.items() for normalise, sums in ((False, "sum"), (True, "normalised"))
    for causal, direction in ((False, "bidirectional"), (True, "causal"))
    for name in [f"{case_name}-{sums}-{direction}"]
])
def test_kernelized_decay_on_triton(case, causal, normalise, decay_inputs, split_case, check_decay_op, triton_paths):
    """`kernelized_decay`, whose tails use the same scan, against its float64 reference (the cases that reach
    the tails; the default attention above runs them all)."""
    triton_paths()
    inputs, offset = split_case(decay_inputs, case)
    fn = functools.partial(chunk_kernelized_decay_attention, chunk_size=2)
    check_decay_op(fn, naive_kernelized_decay_attention, inputs, causal, offset, normalise=normalise)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("reverse", [False, True], ids=["causal", "reversed"])
def test_tail_on_cuda(reverse, dtype, monkeypatch):
    """Real shapes on the GPU (the tails of B=4, H=16 rows at 16k tokens, horizon 16, E = 65, Dv = 64, as
    kernelized_decay's with its relative column): the Triton kernels the op picks on CUDA against the PyTorch path
    on the same device (which computes in float32), output and gradients; bfloat16 queries and keys within its
    precision."""
    assert ops_decay._tail_kernel(torch.device("cuda"), 65) is ops_decay_triton.decayed_tail
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.rand(1, 64, 16384, 65, device="cuda", generator=gen).to(dtype) for _ in range(2))
    leaves = [x, y, torch.randn(1, 64, 16384, 64, device="cuda", generator=gen), torch.rand(64, device="cuda")]
    leaves = [t.requires_grad_() for t in leaves]
    got = ops_decay.decayed_tail(*leaves, 16, 0, 64, half_inputs=dtype != torch.float32, reverse=reverse)
    monkeypatch.setattr(ops_decay, "_tail_kernel", lambda device, dim: None)
    expected = ops_decay.decayed_tail(*leaves, 16, 0, 64, reverse=reverse)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol * float(expected.detach().abs().max()))
    upstream = torch.randn(expected.shape, device="cuda", generator=gen)
    for g, r in zip(torch.autograd.grad(got, leaves, upstream), torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(g.float(), r.float(), rtol=tol, atol=tol * max(1.0, float(r.abs().max())))
