"""The Triton kernels of the default attention's band: run through Triton's interpreter on CPU at small shapes
(float64, against the quadratic reference and the PyTorch band, forward and gradients), and on CUDA at real
shapes (`gpu` marker, skipped without a device)."""

import functools
import os

import pytest
import torch


if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    # Triton's own library functions (tl.sum among them) are interpreted only if TRITON_INTERPRET=1 was set
    # when Triton was first imported; test_triton_interpreted.py runs this file in a fresh process that sets it
    pytest.skip("run by test_triton_interpreted.py with TRITON_INTERPRET=1", allow_module_level=True)
pytest.importorskip("triton")
pytest.importorskip("numpy")

from modeling_scaleformer import ops_decay, ops_decay_triton, ops_local_softmax  # noqa: E402
from modeling_scaleformer.ops_local_softmax import chunk_local_softmax_decay_attention  # noqa: E402
from modeling_scaleformer.ops_local_softmax_triton import TritonLocalSoftmaxBand  # noqa: E402
from modeling_scaleformer.ops_naive import naive_local_softmax_decay_attention  # noqa: E402


F64 = torch.float64
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])


def with_triton(monkeypatch):
    """The op as it runs on CUDA: the Triton band, and the tails by the Triton kernels in chunks of 16 positions
    (so that short inputs span several)."""
    monkeypatch.setattr(ops_local_softmax, "_band_function", lambda device: TritonLocalSoftmaxBand)
    monkeypatch.setattr(ops_decay_triton, "CHUNK", 16)
    choose = ops_decay._tail_kernel
    monkeypatch.setattr(ops_decay, "_tail_kernel", lambda device, dim: choose(torch.device("cuda"), dim))


@CAUSAL
@pytest.mark.parametrize("chunk", [1, 4, 32], ids=["chunks-of-1", "chunks-of-4", "chunks-of-32"])
def test_triton_paths_in_the_op(decay_case, causal, chunk, decay_inputs, split_case, check_decay_op, monkeypatch):
    """The whole op on its Triton paths (the band by query blocks of at least 16, the tails by chunks of 16)
    against the float64 reference, over the decay cases: length 1, L < h, Lq != Lk both ways, offsets, padding,
    shared and absent tables."""
    with_triton(monkeypatch)
    inputs, offset = split_case(decay_inputs, decay_case)
    fn = functools.partial(chunk_local_softmax_decay_attention, chunk_size=chunk)
    check_decay_op(fn, naive_local_softmax_decay_attention, inputs, causal, offset)


@CAUSAL
@pytest.mark.parametrize("case", [
    dict(lq=40, lk=40, horizon=16), dict(lq=70, lk=33, horizon=3, offset=5), dict(lq=9, lk=50, horizon=16, offset=30),
], ids=["h16", "lq>lk", "lq<lk-h16"])
def test_triton_band_against_the_pytorch_band(case, causal, decay_inputs, split_case):
    """The kernels against `_LocalSoftmaxBand` on its own inputs, tails with rows of zeros included: outputs,
    and the gradients of q, k, [m v, m], the table and the tails."""
    case = dict(case, mask="padding")
    (q, k, v, rel, _, key_mask, horizon), offset = split_case(decay_inputs, case)
    b, heads, lq, d = q.shape
    rows = b * heads
    gen = torch.Generator().manual_seed(3)
    vm = torch.cat([v * key_mask[:, None, :, None], key_mask[:, None, :, None].expand(-1, heads, -1, -1)], -1)
    tail = torch.rand(rows, lq, v.shape[-1] + 1, dtype=F64, generator=gen)
    tail[::2, :7] = 0.0
    leaves = [x.reshape(rows, x.shape[2], -1).clone().requires_grad_() for x in (q, k, vm)]
    leaves += [rel.repeat(b, 1, 1).clone().requires_grad_(), tail.requires_grad_()]
    band = ops_local_softmax._band(lq, horizon, offset, causal, 16, q.device)
    expected = ops_local_softmax._LocalSoftmaxBand.apply(*leaves, band)
    got = TritonLocalSoftmaxBand.apply(*leaves, band)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
    upstream = torch.randn(expected.shape, dtype=F64, generator=gen)
    for name, g, e in zip("q k vm rel tail".split(), torch.autograd.grad(got, leaves, upstream),
                          torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12, msg=lambda m: f"grad {name}: {m}")


def test_triton_band_extreme_logits(decay_inputs, monkeypatch):
    """Logits scaled by +-40 and shifted by -2000: finite and equal to the reference."""
    with_triton(monkeypatch)
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=30, lk=30, horizon=2, mask="padding")
    for scale in (40.0, -40.0):
        out = chunk_local_softmax_decay_attention(q * abs(scale), k * scale, v, rel, decay, key_mask=key_mask)
        assert bool(torch.isfinite(out).all())
        torch.testing.assert_close(out, naive_local_softmax_decay_attention(q * abs(scale), k * scale, v, rel, decay,
                                                                            key_mask=key_mask), rtol=1e-9, atol=1e-12)
    shift = -2000.0 * 5**0.5 * q / (q * q).sum(-1, keepdim=True)
    got = chunk_local_softmax_decay_attention(q, k + shift, v, rel, decay, query_offset=2)
    torch.testing.assert_close(got, naive_local_softmax_decay_attention(q, k + shift, v, rel, decay, query_offset=2),
                               rtol=1e-9, atol=1e-12)


# the tails' kernels multiply 16-bit queries and keys as they are; Triton's interpreter gets products of two bfloat16
# tiles wrong (off by about 1e10 where float16's are right), so bfloat16 is tested on a GPU (test_triton_band_on_cuda)
INTERPRETED_BF16 = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                      reason="Triton's interpreter multiplies bfloat16 tiles wrongly")


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=INTERPRETED_BF16), torch.float16],
                         ids=["float32", "bfloat16", "float16"])
def test_triton_band_low_precision(dtype, decay_inputs, monkeypatch):
    """Half precision accumulates in float32: within the precision of the inputs of the float64 reference (the
    tails multiply float16 queries and keys on the tensor cores' 16-bit path)."""
    with_triton(monkeypatch)
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=37, lk=37, horizon=3, mask="padding")
    args = [x.to(dtype) for x in (q, k, v, rel, decay)]
    got = chunk_local_softmax_decay_attention(*args, causal=True, key_mask=key_mask)
    assert got.dtype == dtype
    expected = naive_local_softmax_decay_attention(*[x.to(F64) for x in args], causal=True, key_mask=key_mask)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(got.to(F64), expected, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@CAUSAL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_band_on_cuda(causal, dtype):
    """Real shapes on the GPU (B=2, H=8, L=4096, D=64, h=16): the Triton path the op picks on CUDA against the
    PyTorch band on the same device, outputs and gradients."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4096, 64, device="cuda", generator=gen).to(dtype) for _ in range(3))
    rel = (0.1 * torch.randn(8, 33, 64, device="cuda", generator=gen)).to(dtype)
    decay = torch.full((8,), 0.1, device="cuda").to(dtype)
    assert ops_local_softmax._band_function(q.device) is TritonLocalSoftmaxBand
    outs, grads = [], []
    for force_pytorch in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, rel)]
        band = ops_local_softmax._band_function
        if force_pytorch:
            ops_local_softmax._band_function = lambda device: ops_local_softmax._LocalSoftmaxBand
        try:
            out = chunk_local_softmax_decay_attention(*leaves[:3], leaves[3], decay, causal=causal)
            out.float().square().sum().backward()
        finally:
            ops_local_softmax._band_function = band
        outs.append(out.float())
        grads.append([x.grad.float() for x in leaves])
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0], outs[1], rtol=tol, atol=tol)
    for g, e in zip(*grads):
        torch.testing.assert_close(g, e, rtol=tol, atol=tol * max(1.0, float(e.abs().max())))
