"""The models on the Triton paths of the default attention (band, tails, decoding steps) through Triton's
interpreter on CPU, in float64 against the same weights on the PyTorch paths: the loss and every gradient, and
greedy and beam search tokens. Run in a fresh process with TRITON_INTERPRET=1 by tests/ops/test_triton_interpreted.py
(on a GPU, tests/models/test_cuda.py runs the models on the kernels themselves)."""

import os

import pytest
import torch


if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by tests/ops/test_triton_interpreted.py with TRITON_INTERPRET=1", allow_module_level=True)
pytest.importorskip("triton")
pytest.importorskip("numpy")

from modeling_scaleformer import (  # noqa: E402
    ScaleformerForConditionalGeneration,
    ops_decay,
    ops_decay_triton,
    ops_local_softmax,
    ops_local_softmax_triton,
)


def on_triton_paths(monkeypatch) -> set:
    """Every choice of the default attention as on CUDA (chunks of 16 positions in the tails, so that the inputs
    span several); returns the set that collects the names of the kernels' entry points as they are chosen."""
    used = set()

    def chosen(entry):
        used.add(entry.__name__)
        return entry

    monkeypatch.setattr(ops_local_softmax, "_band_function",
                        lambda device: chosen(ops_local_softmax_triton.TritonLocalSoftmaxBand))
    monkeypatch.setattr(ops_local_softmax, "_decode_function",
                        lambda device: chosen(ops_local_softmax_triton.decode_step))
    monkeypatch.setattr(ops_local_softmax, "_cross_decode_function",
                        lambda device: chosen(ops_local_softmax_triton.cross_decode))
    monkeypatch.setattr(ops_decay, "_tail_kernel", lambda device, dim: chosen(ops_decay_triton.decayed_tail))
    monkeypatch.setattr(ops_decay_triton, "CHUNK", 16)
    return used


def models(tiny_config):
    """The tiny model in float64, on its linear paths at any length."""
    torch.manual_seed(0)
    return ScaleformerForConditionalGeneration(tiny_config(attention_mode="linear")).to(torch.float64)


def test_loss_and_gradients_on_triton_paths(tiny_config, batch, monkeypatch):
    """Logits and every parameter's gradient with the band and the tails on their kernels."""
    model = models(tiny_config)
    src, mask = batch(b=3, ls=50, padding="right")
    labels, _ = batch(b=3, ls=16, seed=5)
    results = []
    for triton_paths in (False, True):
        if triton_paths:
            used = on_triton_paths(monkeypatch)
        model.zero_grad()
        out = model(input_ids=src, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    assert used == {"TritonLocalSoftmaxBand", "decayed_tail"}
    (logits, grads), (expected_logits, expected_grads) = results[1], results[0]
    torch.testing.assert_close(logits, expected_logits, rtol=1e-10, atol=1e-10)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-8, atol=1e-10, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kwargs", [dict(), dict(num_beams=3)], ids=["greedy", "beam"])
def test_generate_on_triton_paths(kwargs, tiny_config, batch, monkeypatch):
    """The tokens of greedy and beam search with the decoding steps on their kernels (beam search reorders the
    states between steps)."""
    model = models(tiny_config).eval()
    src, mask = batch(b=3, ls=30, padding="right")
    expected = model.generate(src, attention_mask=mask, max_new_tokens=8, **kwargs)
    used = on_triton_paths(monkeypatch)
    got = model.generate(src, attention_mask=mask, max_new_tokens=8, **kwargs)
    assert used >= {"decode_step", "cross_decode"}
    assert torch.equal(got, expected)
