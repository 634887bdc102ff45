"""The Triton kernels of the decayed tails (`ops_decay_triton`): through Triton's interpreter on CPU at small shapes
(float64, against `ops_decay._decayed_prefix` and, inside `kernelized_decay`, against its quadratic reference,
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
from modeling_scaleformer.ops_decay_triton import decayed_prefix, dot_precision  # noqa: E402
from modeling_scaleformer.ops_naive import naive_kernelized_decay_attention  # noqa: E402


F64 = torch.float64
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])


def with_triton(monkeypatch, chunk=16):
    """The op as it runs on CUDA: the tails by the Triton kernels (`_prefix_function` asked for a CUDA device), in
    chunks of `chunk` positions so that short inputs span several."""
    monkeypatch.setattr(ops_decay_triton, "CHUNK", chunk)
    choose = ops_decay._prefix_function
    monkeypatch.setattr(ops_decay, "_prefix_function",
                        lambda device, dim, half_inputs=False: choose(torch.device("cuda"), dim, half_inputs))


@pytest.mark.parametrize("chunk", [16, 32], ids=["chunks-of-16", "chunks-of-32"])
@pytest.mark.parametrize("shape", [(2, 3, 1, 5, 4), (1, 2, 16, 3, 6), (2, 3, 37, 5, 7), (1, 2, 50, 40, 70),
                                   (1, 1, 33, 65, 65)],
                         ids=["length-1", "one-chunk", "partial-last-chunk", "state-blocks", "d64-plus-one"])
@pytest.mark.parametrize("initial", [False, True], ids=["from-zero", "initial-state"])
def test_prefix_against_pytorch(shape, initial, chunk, monkeypatch):
    """`TritonDecayedPrefix` against `_decayed_prefix` (float64): the output and the gradients of x, y, v, the rates
    and the initial state, from one position to several chunks with a partial last one, E and Dv that are not
    powers of two and span several blocks of the state kernels (40 x 70: 1 x 3 programs of 64 x 32)."""
    monkeypatch.setattr(ops_decay_triton, "CHUNK", chunk)
    gen = torch.Generator().manual_seed(sum(shape) + chunk)
    b, heads, length, e, dv = shape
    leaves = [torch.randn(b, heads, length, e, dtype=F64, generator=gen) for _ in range(2)]
    leaves += [torch.randn(b, heads, length, dv, dtype=F64, generator=gen), torch.rand(heads, dtype=F64, generator=gen)]
    leaves += [torch.randn(b, heads, e, dv, dtype=F64, generator=gen)] if initial else []
    leaves = [x.requires_grad_() for x in leaves]
    x, y, v, rate = leaves[:4]
    start = leaves[4] if initial else None
    expected = ops_decay._decayed_prefix(x, y, v, rate, 4, start)
    got = decayed_prefix(x, y, v, rate, 4, start)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
    upstream = torch.randn(expected.shape, dtype=F64, generator=gen)
    names = "x y v rate initial".split()
    for name, g, r in zip(names, torch.autograd.grad(got, leaves, upstream),
                          torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-11, msg=lambda m: f"grad {name}: {m}")


def test_prefix_rate_gradient_on_long_inputs(monkeypatch):
    """The rates' gradient is a sum of local terms: over 200 chunks it still matches the PyTorch path's in
    float32 (a sum of absolute positions times gradients would lose digits)."""
    monkeypatch.setattr(ops_decay_triton, "CHUNK", 16)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.rand(1, 2, 3200, 4, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 3200, 3, generator=gen)
    rate = torch.tensor([0.01, 0.3]).requires_grad_()
    upstream = torch.randn(1, 2, 3200, 3, generator=gen)
    grads = [torch.autograd.grad(f(x, y, v, rate, 16), rate, upstream)[0]
             for f in (decayed_prefix, ops_decay._decayed_prefix)]
    reference = torch.autograd.grad(ops_decay._decayed_prefix(*(t.double() for t in (x, y, v, rate)), 16),
                                    rate, upstream.double())[0].double()
    torch.testing.assert_close(grads[0].double(), reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads[1].double(), reference, rtol=1e-4, atol=1e-4)


def test_prefix_refuses_wide_features():
    """Features wider than the kernels hold are refused with the limit named (`_prefix_function` keeps them on
    PyTorch)."""
    x = torch.zeros(1, 1, 4, ops_decay_triton.MAX_DIM + 1, dtype=F64)
    with pytest.raises(ValueError, match="at most 256 features"):
        decayed_prefix(x, x, x[..., :3], torch.zeros(1, dtype=F64), 4)
    assert ops_decay._prefix_function(torch.device("cuda"), ops_decay_triton.MAX_DIM + 1) is ops_decay._decayed_prefix
    assert ops_decay._prefix_function(torch.device("cpu"), 64) is ops_decay._decayed_prefix


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


@CAUSAL
@pytest.mark.parametrize("normalise", [False, True], ids=["sum", "normalised"])
@pytest.mark.parametrize("case", [
    dict(lq=40, lk=40, horizon=2, mask="padding"), dict(lq=9, lk=33, horizon=2, offset=11),
    dict(lq=5, lk=6, horizon=2, offset=20),
], ids=["long-tails", "cross-offset-both-tails", "queries-past-the-keys"])
def test_kernelized_decay_on_triton(case, causal, normalise, decay_inputs, split_case, check_decay_op, monkeypatch):
    """`kernelized_decay`, whose tails use the same scan, against its float64 reference (the cases that reach
    the tails; the default attention above runs them all)."""
    with_triton(monkeypatch)
    inputs, offset = split_case(decay_inputs, case)
    fn = functools.partial(chunk_kernelized_decay_attention, chunk_size=2)
    check_decay_op(fn, naive_kernelized_decay_attention, inputs, causal, offset, normalise=normalise)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("initial", [False, True], ids=["from-zero", "initial-state"])
def test_prefix_on_cuda(initial):
    """Real shapes on the GPU (the tails of B=4, H=16 rows at 16k tokens, E = 64, Dv = 65): the prefix the op
    picks on CUDA against `_decayed_prefix` on the same device, output and gradients."""
    prefix = ops_decay._prefix_function(torch.device("cuda"), 64)
    assert prefix.func is decayed_prefix
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.rand(1, 64, 16384, 64, device="cuda", generator=gen) / 8 for _ in range(2))
    leaves = [x, y, torch.randn(1, 64, 16384, 65, device="cuda", generator=gen), torch.rand(64, device="cuda")]
    leaves += [torch.randn(1, 64, 64, 65, device="cuda", generator=gen)] if initial else []
    leaves = [t.requires_grad_() for t in leaves]
    start = leaves[4] if initial else None
    got, expected = (f(*leaves[:4], 64, start) for f in (prefix, ops_decay._decayed_prefix))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    upstream = torch.randn(expected.shape, device="cuda", generator=gen)
    for g, r in zip(torch.autograd.grad(got, leaves, upstream), torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * max(1.0, float(r.abs().max())))
