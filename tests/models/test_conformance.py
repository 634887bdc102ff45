"""transformers' common-model contract: output flags from the config, hidden states as BART's, checkpointing."""

import pytest
import torch
from transformers import BartConfig, BartForCausalLM, BartForConditionalGeneration

from modeling_scaleformer import (
    ScaleformerForCausalLM,
    ScaleformerForConditionalGeneration,
    ScaleformerForSequenceClassification,
    ScaleformerModel,
)


MODEL_CLASSES = [
    ScaleformerModel, ScaleformerForConditionalGeneration, ScaleformerForCausalLM, ScaleformerForSequenceClassification,
]
# (attribute of the output, stack it comes from) for the hidden states each class returns
HIDDEN_STATES = {
    ScaleformerModel: [("encoder_hidden_states", "encoder"), ("decoder_hidden_states", "decoder")],
    ScaleformerForConditionalGeneration: [("encoder_hidden_states", "encoder"), ("decoder_hidden_states", "decoder")],
    ScaleformerForCausalLM: [("hidden_states", "decoder")],
    ScaleformerForSequenceClassification: [("hidden_states", "encoder")],
}


def inputs_for(batch, model_class, labels: bool = False) -> dict:
    src, src_mask = batch()
    tgt, tgt_mask = batch(ls=5, seed=4, padding="right")
    if model_class is ScaleformerForCausalLM:
        return dict(input_ids=src, attention_mask=src_mask, **(dict(labels=src.masked_fill(src_mask == 0, -100)) if labels else {}))
    if model_class is ScaleformerForSequenceClassification:
        return dict(input_ids=src, attention_mask=src_mask, **(dict(labels=torch.tensor([1, 0, 1])) if labels else {}))
    if model_class is ScaleformerModel:
        return dict(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    return dict(input_ids=src, attention_mask=src_mask, **(dict(labels=tgt.masked_fill(tgt_mask == 0, -100)) if labels else dict(decoder_input_ids=tgt)))


def build(tiny_config, model_class, **overrides):
    torch.manual_seed(0)
    config = tiny_config(encoder_layers=3, decoder_layers=2, num_labels=2, **overrides)
    return model_class(config).to(torch.float64)


def bart_like(model_class):
    """A BART of the same depth and width, for the count and shapes of its hidden states."""
    config = BartConfig(
        vocab_size=60, d_model=16, encoder_layers=3, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )
    if model_class is ScaleformerForCausalLM:
        return BartForCausalLM(config).eval()
    return BartForConditionalGeneration(config).eval()


@pytest.mark.parametrize("model_class", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_output_hidden_states_from_config(model_class, tiny_config, batch):
    model = build(tiny_config, model_class).eval()
    inputs = inputs_for(batch, model_class)
    assert all(getattr(model(**inputs), name) is None for name, _ in HIDDEN_STATES[model_class])
    model.config.output_hidden_states = True
    from_config = model(**inputs)
    from_argument = model(**inputs, output_hidden_states=True)
    for name, stack in HIDDEN_STATES[model_class]:
        hidden = getattr(from_config, name)
        layers = model.config.encoder_layers if stack == "encoder" else model.config.decoder_layers
        length = inputs["input_ids" if stack == "encoder" or model_class is ScaleformerForCausalLM else "decoder_input_ids"].shape[1]
        assert hidden is not None and len(hidden) == layers + 1  # the embeddings, then one per layer
        assert all(h.shape == (3, length, 16) for h in hidden)
        for a, b in zip(hidden, getattr(from_argument, name)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the argument wins over the config
    assert all(getattr(model(**inputs, output_hidden_states=False), name) is None for name, _ in HIDDEN_STATES[model_class])


@pytest.mark.parametrize("model_class", [ScaleformerForConditionalGeneration, ScaleformerForCausalLM], ids=lambda c: c.__name__)
def test_hidden_states_count_and_shapes_as_bart(model_class, tiny_config, batch):
    model, bart = build(tiny_config, model_class).eval(), bart_like(model_class)
    model.config.output_hidden_states = bart.config.output_hidden_states = True
    inputs = {k: v for k, v in inputs_for(batch, model_class).items() if k != "attention_mask"}
    ours, theirs = model(**inputs), bart(**inputs)
    for name, _ in HIDDEN_STATES[model_class]:
        assert [h.shape for h in getattr(ours, name)] == [h.shape for h in getattr(theirs, name)]


@pytest.mark.parametrize("model_class", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_return_dict_and_output_attentions_from_config(model_class, tiny_config, batch):
    model = build(tiny_config, model_class).eval()
    inputs = inputs_for(batch, model_class)
    expected = model(**inputs)
    model.config.return_dict = False
    as_tuple = model(**inputs)
    assert isinstance(as_tuple, tuple)
    first = expected.logits if hasattr(expected, "logits") else expected.last_hidden_state
    torch.testing.assert_close(as_tuple[0], first, rtol=0, atol=0)
    assert not isinstance(model(**inputs, return_dict=True), tuple)
    model.config.return_dict = True
    model.config.output_attentions = True
    with pytest.raises(ValueError, match="output_attentions"):
        model(**inputs)
    model(**inputs, output_attentions=False)  # the argument wins over the config


@pytest.mark.parametrize("model_class", [ScaleformerModel, ScaleformerForConditionalGeneration, ScaleformerForCausalLM], ids=lambda c: c.__name__)
def test_use_cache_from_config(model_class, tiny_config, batch):
    model = build(tiny_config, model_class).eval()
    inputs = inputs_for(batch, model_class)
    assert model(**inputs).past_key_values is not None
    model.config.use_cache = False
    assert model(**inputs).past_key_values is None
    assert model(**inputs, use_cache=True).past_key_values is not None


@pytest.mark.parametrize("model_class", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_retain_grad_hidden_states(model_class, tiny_config, batch):
    model = build(tiny_config, model_class)
    model.config.output_hidden_states = True
    outputs = model(**inputs_for(batch, model_class))
    hidden = [getattr(outputs, name)[0] for name, _ in HIDDEN_STATES[model_class]]
    for h in hidden:
        h.retain_grad()
    first = outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state
    (first * torch.randn(first.shape, generator=torch.Generator().manual_seed(0), dtype=first.dtype)).sum().backward()
    assert all(h.grad is not None and h.grad.abs().sum() > 0 for h in hidden)


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize(
    "model_class",
    [ScaleformerForConditionalGeneration, ScaleformerForCausalLM, ScaleformerForSequenceClassification],
    ids=lambda c: c.__name__,
)
def test_gradient_checkpointing_gives_same_gradients(model_class, use_reentrant, tiny_config, batch):
    model = build(tiny_config, model_class).train()  # checkpointing acts in training mode only; dropout is 0
    inputs = inputs_for(batch, model_class, labels=True)
    model(**inputs).loss.backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
    assert all(layer.gradient_checkpointing for layer in model.modules() if hasattr(layer, "self_attn"))
    model(**inputs).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, plain[name], rtol=0, atol=1e-6, msg=name)


def test_causal_lm_loss_honours_shift_labels(tiny_config, batch):
    model = build(tiny_config, ScaleformerForCausalLM).eval()
    ids, mask = batch(padding="right")
    labels = ids.masked_fill(mask == 0, -100)
    shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    from_labels = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, shift_labels=shifted).loss, from_labels)
    # pre-shifted targets win over `labels`: other targets give another loss
    other = shifted.roll(1, dims=1)
    assert not torch.allclose(model(input_ids=ids, attention_mask=mask, labels=labels, shift_labels=other).loss, from_labels)
    with pytest.raises(ValueError, match="`shift_labels`"):
        model(input_ids=ids, shift_labels=torch.full_like(ids, 10_000))


def test_classifier_starts_from_an_encoder_decoder_checkpoint(tiny_config, batch, tmp_path):
    """The classifier's encoder has the encoder-decoder's parameter names: its weights load from that checkpoint,
    and the encoder computes what the encoder-decoder's does."""
    seq2seq = build(tiny_config, ScaleformerForConditionalGeneration).eval()
    seq2seq.save_pretrained(tmp_path)
    classifier = ScaleformerForSequenceClassification.from_pretrained(tmp_path, num_labels=2).to(torch.float64).eval()
    for name, param in seq2seq.model.encoder.state_dict().items():
        torch.testing.assert_close(classifier.model.encoder.state_dict()[name], param, rtol=0, atol=0)
    src, src_mask = batch()
    expected = seq2seq.get_encoder()(input_ids=src, attention_mask=src_mask).last_hidden_state
    got = classifier.model(input_ids=src, attention_mask=src_mask).last_hidden_state
    # equal weights, but loaded ones sit at other memory alignments, where BLAS may add in another order: a few ulps
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)
    assert classifier.get_input_embeddings().weight is classifier.model.encoder.embed_tokens.weight


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_matches_eager_and_leaves_the_ops_alone(backend, tiny_config, batch, monkeypatch):
    """`torch.compile(model)` (not fullgraph) gives eager's logits and loss, and runs the attention ops eagerly on
    CPU rather than tracing them (their Python loops over blocks and chunks would be compiled once per shape; on
    CUDA the default attention's kernels are operators that it traces to, tests/models/test_triton_paths.py).
    The default run takes Dynamo's graphs and their graph breaks through AOTAutograd (20 s on 2 cores); `-m slow`
    compiles them with Inductor, the default backend (80 s, most of it in its C++ compiler)."""
    from modeling_scaleformer import ops_local_softmax

    compiling = []
    chunk = ops_local_softmax.chunk_local_softmax_decay_attention

    def recorded(*args, **kwargs):
        compiling.append(torch.compiler.is_compiling())
        return chunk(*args, **kwargs)

    monkeypatch.setattr(ops_local_softmax, "chunk_local_softmax_decay_attention", recorded)
    model = build(tiny_config, ScaleformerForConditionalGeneration, attention_mode="linear").eval()
    inputs = inputs_for(batch, ScaleformerForConditionalGeneration, labels=True)
    eager = model(**inputs)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)(**inputs)
    torch.testing.assert_close(compiled.logits, eager.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=1e-10, atol=1e-10)
    assert compiling and not any(compiling), compiling
