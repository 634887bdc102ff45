"""The Triton kernel of the decayed tails' chunk-state scan: through Triton's interpreter on CPU at small shapes
(float64, against `_DecayScan` and, inside `kernelized_decay`, against its quadratic reference, outputs and
gradients; the default attention on its Triton paths is tested in test_local_softmax_triton.py), and on CUDA
at real shapes (`gpu` marker, skipped without a device)."""

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
from modeling_scaleformer.ops_decay_triton import TritonDecayScan  # noqa: E402
from modeling_scaleformer.ops_naive import naive_kernelized_decay_attention  # noqa: E402


F64 = torch.float64
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])


def with_triton(monkeypatch):
    """The op as it runs on CUDA: the Triton scan of its tails."""
    monkeypatch.setattr(ops_decay, "_scan_function", lambda device: TritonDecayScan)


@pytest.mark.parametrize("shape", [(2, 3, 1, 5, 4), (2, 3, 2, 5, 4), (1, 2, 7, 3, 6), (1, 2, 5, 40, 31)],
                         ids=["one-chunk", "two-chunks", "seven-chunks", "two-blocks-of-state"])
@pytest.mark.parametrize("initial", [False, True], ids=["from-zero", "initial-state"])
def test_scan_against_pytorch(shape, initial, monkeypatch):
    """`TritonDecayScan` against `_DecayScan`: the states and the gradients of local, carry and the initial
    state (a state larger than one program's block included)."""
    monkeypatch.setattr(ops_decay_triton, "BLOCK", 256)  # 40 x 31 state elements: 5 programs per row
    gen = torch.Generator().manual_seed(sum(shape))
    b, heads, n, e, dv = shape
    leaves = [torch.randn(shape, dtype=F64, generator=gen), torch.rand(heads, dtype=F64, generator=gen)]
    leaves += [torch.randn(b, heads, e, dv, dtype=F64, generator=gen)] if initial else []
    leaves = [x.requires_grad_() for x in leaves]
    expected = ops_decay._DecayScan.apply(*leaves, *([] if initial else [None]))
    got = TritonDecayScan.apply(*leaves, *([] if initial else [None]))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
    upstream = torch.randn(shape, dtype=F64, generator=gen)
    names = "local carry initial".split()
    for name, g, x in zip(names, torch.autograd.grad(got, leaves, upstream),
                          torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(g, x, rtol=1e-10, atol=1e-12, msg=lambda m: f"grad {name}: {m}")


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
def test_scan_on_cuda(initial):
    """Real shapes on the GPU (the tails of B=4, H=16 rows at 16k tokens, chunks of 64, E = Dv = 65): the
    scan the op picks on CUDA against `_DecayScan` on the same device, states and gradients."""
    assert ops_decay._scan_function(torch.device("cuda")) is TritonDecayScan
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, 64, 256, 65, 65)
    leaves = [0.1 * torch.randn(shape, device="cuda", generator=gen), torch.rand(64, device="cuda", generator=gen)]
    leaves += [torch.randn(1, 64, 65, 65, device="cuda", generator=gen)] if initial else []
    leaves = [x.requires_grad_() for x in leaves]
    extra = [] if initial else [None]
    got, expected = (f.apply(*leaves, *extra) for f in (TritonDecayScan, ops_decay._DecayScan))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(shape, device="cuda", generator=gen)
    for g, x in zip(torch.autograd.grad(got, leaves, upstream), torch.autograd.grad(expected, leaves, upstream)):
        torch.testing.assert_close(g, x, rtol=1e-4, atol=1e-4 * max(1.0, float(x.abs().max())))
