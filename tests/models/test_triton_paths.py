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

from modeling_scaleformer import ScaleformerForConditionalGeneration  # noqa: E402


def models(tiny_config):
    """The tiny model in float64, on its linear paths at any length."""
    torch.manual_seed(0)
    return ScaleformerForConditionalGeneration(tiny_config(attention_mode="linear")).to(torch.float64)


@pytest.mark.parametrize("checkpointing", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["", "activation-checkpointing"])
def test_loss_and_gradients_on_triton_paths(checkpointing, tiny_config, batch, triton_paths, monkeypatch):
    """Logits and every parameter's gradient with the attention on its kernels; with activation checkpointing, whose
    backward runs every layer's forward again, the kernels' forward included."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    model = models(tiny_config).train()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    src, mask = batch(b=3, ls=50, padding="right")
    labels, _ = batch(b=3, ls=16, seed=5)
    forwards = []
    forward = kernels._forward_body
    monkeypatch.setattr(kernels, "_forward_body", lambda *args: forwards.append(1) or forward(*args))
    results = []
    for on_kernels in (False, True):
        if on_kernels:
            used = triton_paths()
        model.zero_grad()
        out = model(input_ids=src, attention_mask=mask, labels=labels)
        calls = len(forwards)
        out.loss.backward()
        results.append((out.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    assert used == {"local_softmax_decay"}
    assert calls == 6 and len(forwards) == calls * (2 if checkpointing else 1)  # 2 + 2 layers: 6 attentions
    (logits, grads), (expected_logits, expected_grads) = results[1], results[0]
    torch.testing.assert_close(logits, expected_logits, rtol=1e-10, atol=1e-10)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-8, atol=1e-10, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kwargs", [dict(), pytest.param(dict(num_beams=3), marks=pytest.mark.slow)],
                         ids=["greedy", "beam"])
def test_generate_on_triton_paths(kwargs, tiny_config, batch, triton_paths):
    """The tokens of greedy and beam search with the decoding steps on their kernels (beam search reorders the
    states between steps)."""
    model = models(tiny_config).eval()
    src, mask = batch(b=3, ls=30, padding="right")
    expected = model.generate(src, attention_mask=mask, max_new_tokens=6, **kwargs)
    used = triton_paths()
    got = model.generate(src, attention_mask=mask, max_new_tokens=6, **kwargs)
    assert used >= {"decode_step", "cross_decode"}
    assert torch.equal(got, expected)


@pytest.mark.slow  # about a minute through the interpreter; on CUDA the `compiles` tests compile the model
def test_torch_compile_traces_the_kernels_operators(tiny_config, batch, triton_paths, attention_outside_the_graph):
    """`torch.compile(model)` traces every attention layer: the default attention's down to the kernels' operators,
    the count block's (running key sums) as tensor operations; none runs outside the graph, and the compiled loss
    and every gradient equal eager's (AOT autograd, so that the operators' autograd and fake implementations are
    traced)."""
    from modeling_scaleformer.layers import ScaleformerAttention

    model = models(tiny_config)
    src, mask = batch(b=3, ls=50, padding="right")
    labels, _ = batch(b=3, ls=16, seed=5)
    triton_paths()
    results = []
    for compiled in (False, True):
        model.zero_grad()
        torch._dynamo.reset()
        out = (torch.compile(model, backend="aot_eager") if compiled else model)(
            input_ids=src, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    types = {m.attention_type for m in model.modules() if isinstance(m, ScaleformerAttention)}
    assert types == {"local_softmax_decay", "kernelized_sum"} and not attention_outside_the_graph
    (loss, grads), (expected_loss, expected_grads) = results[1], results[0]
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")
