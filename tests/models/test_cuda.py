"""The models on a CUDA device (`gpu` marker, skipped without one): the same weights give the CPU's outputs and
gradients, generation, bf16 autocast, `torch.compile` against eager, and `Seq2SeqTrainer(bf16=True)`.

Inputs are long enough that the default attention takes its linear path, so that on CUDA the Triton kernels
(the band, the tails) run; the first test checks that they did."""

import pytest
import torch

from modeling_scaleformer import ScaleformerForConditionalGeneration, ops_local_softmax


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICE = "cuda"
LINEAR = dict(attention_mode="linear")  # the chunked path at any length: the one long inputs take


def model_pair(tiny_config, **overrides):
    """The same weights on the CPU and on the device, in eval mode, float32."""
    torch.manual_seed(0)
    cpu = ScaleformerForConditionalGeneration(tiny_config(**{**LINEAR, **overrides})).eval()
    device = ScaleformerForConditionalGeneration(cpu.config).eval()
    device.load_state_dict(cpu.state_dict())
    return cpu, device.to(DEVICE)


def inputs(batch, ls=200, target=40):
    src, mask = batch(b=3, ls=ls, padding="right")
    labels, _ = batch(b=3, ls=target, seed=5)
    return src, mask, labels


def test_forward_and_backward_match_the_cpu(tiny_config, batch, monkeypatch):
    """Logits, loss and every parameter's gradient on the device against the CPU, float32; the attention's Triton
    kernels are the implementation the device ran."""
    used = []
    attention = ops_local_softmax._attention_function
    monkeypatch.setattr(ops_local_softmax, "_attention_function",
                        lambda *args: used.append(attention(*args)) or used[-1])
    cpu, device = model_pair(tiny_config)
    src, mask, labels = inputs(batch)
    expected = cpu(input_ids=src, attention_mask=mask, labels=labels)
    expected.loss.backward()
    used.clear()
    got = device(input_ids=src.to(DEVICE), attention_mask=mask.to(DEVICE), labels=labels.to(DEVICE))
    got.loss.backward()
    assert {f.__name__ for f in used} == {"local_softmax_decay"}
    torch.testing.assert_close(got.logits.cpu(), expected.logits, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(cpu.named_parameters(), device.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kwargs", [dict(), dict(num_beams=3), dict(do_sample=True, top_k=5)],
                         ids=["greedy", "beam", "sampling"])
def test_generate(kwargs, tiny_config, batch, monkeypatch):
    """Greedy and beam search give the CPU's tokens; sampling gives tokens on the device. The decoder's self- and
    cross-attention steps run in the decoding kernels."""
    used = []
    for name in ("_decode_function", "_cross_decode_function"):
        choose = getattr(ops_local_softmax, name)
        monkeypatch.setattr(ops_local_softmax, name,
                            lambda device, choose=choose: used.append(choose(device)) or used[-1])
    cpu, device = model_pair(tiny_config)
    src, mask, _ = inputs(batch)
    torch.manual_seed(1)
    got = device.generate(src.to(DEVICE), attention_mask=mask.to(DEVICE), max_new_tokens=20, **kwargs)
    assert got.device.type == DEVICE
    assert {f.__name__ for f in used} == {"decode_step", "cross_decode"}
    if not kwargs.get("do_sample"):
        expected = cpu.generate(src, attention_mask=mask, max_new_tokens=20, **kwargs)
        assert torch.equal(got.cpu(), expected)


def test_bf16_autocast_training_step(tiny_config, batch):
    """Under CUDA autocast the loss stays within bf16's precision of float32's and every gradient is finite."""
    _, device = model_pair(tiny_config)
    device.train()
    src, mask, labels = (x.to(DEVICE) for x in inputs(batch))
    reference = device(input_ids=src, attention_mask=mask, labels=labels).loss.item()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = device(input_ids=src, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert abs(loss.item() - reference) < 0.05 * abs(reference)
    assert all(bool(torch.isfinite(p.grad).all()) for p in device.parameters() if p.grad is not None)


def test_training_step_never_waits_for_the_device(tiny_config, batch):
    """A forward and backward pass with labels copies nothing back to the host: under
    `torch.cuda.set_sync_debug_mode("error")` any call that waits for the device raises."""
    _, device = model_pair(tiny_config)
    device.train()
    src, mask, labels = (x.to(DEVICE) for x in inputs(batch))
    device(input_ids=src, attention_mask=mask, labels=labels).loss.backward()  # compiles the kernels first
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        device(input_ids=src, attention_mask=mask, labels=labels).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@pytest.mark.compiles
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_matches_eager(mode, tiny_config, batch, attention_outside_the_graph):
    """`torch.compile(model)` (graph breaks allowed; in reduce-overhead mode, replayed as CUDA graphs) gives eager's
    logits, loss and every gradient over three training-mode steps, and traces every attention layer: the default
    attention through its kernels' operators, the count block's running sums as tensor operations; none runs
    outside the graph. One layer each side (every kind of attention layer: encoder, decoder, cross), so that Inductor
    compiles half the graph of two. Inductor's persistent reductions are off: with torch 2.11 and Triton 3.6 on an
    H200, one of its own backward kernels (a fused embedding, layer-norm and loss reduction) failed to compile for
    sm90 (`PassManager::run failed`), and passed without them (benchmarks/README.md)."""
    import torch._inductor.config

    _, device = model_pair(tiny_config, encoder_layers=1, decoder_layers=1)
    device.train()
    src, mask, labels = (x.to(DEVICE) for x in inputs(batch))
    eager = device(input_ids=src, attention_mask=mask, labels=labels)
    expected = torch.autograd.grad(eager.loss, list(device.parameters()))
    attention_outside_the_graph.clear()  # the compiled calls only
    compiled_model = torch.compile(device, mode=mode)
    with torch._inductor.config.patch({"triton.persistent_reductions": False}):  # compiled in the first calls
        for _ in range(3):  # reduce-overhead records its graphs in the second call and replays them from the third
            compiled = compiled_model(input_ids=src, attention_mask=mask, labels=labels)
            grads = torch.autograd.grad(compiled.loss, list(device.parameters()))
    assert not attention_outside_the_graph, attention_outside_the_graph
    torch.testing.assert_close(compiled.logits, eager.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=1e-5, atol=1e-5)
    for (name, _), got, e in zip(device.named_parameters(), grads, expected):
        torch.testing.assert_close(got, e, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.compiles
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16-autocast"])
def test_training_forward_compiles_into_one_graph(dtype, tiny_config, batch):
    """A training-mode forward with labels is one graph for torch.compile on the device, in float32 and under bf16
    autocast: no value check reads the device back, the count block embeds every position, and the kernels'
    operators and their products' precision are traced, so that reduce-overhead replays one CUDA graph a step
    instead of one between each two breaks."""
    _, device = model_pair(tiny_config)
    device.train()
    src, mask, labels = (x.to(DEVICE) for x in inputs(batch))

    def forward():
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            return device(input_ids=src, attention_mask=mask, labels=labels).loss

    torch._dynamo.reset()
    explained = torch._dynamo.explain(forward)()
    assert explained.graph_break_count == 0, [reason.reason for reason in explained.break_reasons]


def test_seq2seq_trainer_bf16(tmp_path, tiny_config):
    """`Seq2SeqTrainer(bf16=True)` on the device learns to copy 200-token inputs: the loss goes down."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(init_std=0.02, **LINEAR))
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(64):
        src = torch.randint(3, 60, (200,), generator=g).tolist()
        rows.append({"input_ids": src, "attention_mask": [1] * 200, "labels": src[:40]})
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, learning_rate=1e-2, max_steps=40, logging_steps=10,
        report_to=[], save_strategy="no", bf16=True,
    )
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    assert next(model.parameters()).device.type == DEVICE
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses[-1] < losses[0] - 0.3, losses
