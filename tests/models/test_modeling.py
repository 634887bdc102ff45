"""The Hugging Face models: cached decoding equals teacher forcing, generation, loss, save/load, errors."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, DynamicCache

from modeling_scaleformer import (
    ScaleformerCache,
    ScaleformerConfig,
    ScaleformerForCausalLM,
    ScaleformerForConditionalGeneration,
    ScaleformerModel,
)
from modeling_scaleformer.modeling_scaleformer import sinusoidal_positions


CONFIGS = [
    pytest.param(dict(), id="default"),
    pytest.param(dict(cross_attention_rpe=True, rpe_shared_across_heads=True), id="cross-rpe-shared"),
    pytest.param(dict(attention_type="kernelized"), id="kernelized"),
    pytest.param(dict(attention_mode="linear", rpe_horizon=1), id="linear-h1"),
    pytest.param(dict(absolute_positions="sinusoidal"), id="sinusoidal"),
    pytest.param(dict(layer_norm_position="post", attention_type="softmax"), id="post-norm-softmax"),
]


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("overrides", CONFIGS)
def test_seq2seq_cached_decoding_equals_teacher_forcing(overrides, padding, tiny_config, cached_decoding):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(**overrides)).double().eval()
    cache = cached_decoding(model, padding)
    assert isinstance(cache, ScaleformerCache) and cache.get_seq_length() == 9


@pytest.mark.parametrize("padding", ["left", "right"])
def test_cached_decoding_on_cross_sums_by_chunks(padding, tiny_config, batch, monkeypatch):
    """The default cross attention's decoding steps on the source's decayed sums by chunks of 2 keys (h = 3: each
    step reads the chunks around its band and the sums before and after them), over a target longer than the source
    by 9 positions, one token at a time, and beam search: teacher forcing's logits, and the tokens of `generate`
    without a cache."""
    import functools

    from modeling_scaleformer import ops_local_softmax, ops_registry
    from modeling_scaleformer.ops_local_softmax import LocalSoftmaxDecayCrossSummary

    monkeypatch.setattr(ops_registry, "local_softmax_decay_cross_summary", functools.partial(
        ops_registry.local_softmax_decay_cross_summary, chunk_size=2))
    steps = []
    windowed = ops_local_softmax._windowed_cross_step
    monkeypatch.setattr(ops_local_softmax, "_windowed_cross_step",
                        lambda *args: steps.append(args[4]) or windowed(*args))  # args[4]: the position
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config()).double().eval()
    src, src_mask = batch(padding=padding)
    tgt, tgt_mask = batch(ls=20, padding=padding, seed=1)
    full = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    cache, logits = None, []
    for t in range(20):  # without autograd, as in generation: with it the step reads every key
        with torch.no_grad():
            out = model(encoder_outputs=encoder_outputs, attention_mask=src_mask, decoder_input_ids=tgt[:, t:t + 1],
                        decoder_attention_mask=tgt_mask[:, :t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits)
    # the decoder layers' cross attention (the count block keeps sums of its own)
    summaries = [layer.cross_summary for layer in cache.layers
                 if isinstance(layer.cross_summary, LocalSoftmaxDecayCrossSummary)]
    assert len(summaries) == 2 and all(s.before.shape[2] == 7 for s in summaries)  # 11 keys: 6 chunks
    # every later step, in each layer (the first token's pass builds the summaries from the whole source)
    assert steps == [t for t in range(1, 20) for _ in summaries]
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9)
    kwargs = dict(attention_mask=src_mask, num_beams=3, max_new_tokens=16, min_new_tokens=16)
    torch.testing.assert_close(model.generate(src, **kwargs), model.generate(src, use_cache=False, **kwargs))


@pytest.mark.parametrize("attention_type", ["local_softmax_decay", "kernelized_rpe"])
def test_a_padded_source_reads_as_the_source_alone(attention_type, tiny_config):
    """Cross attention's relative positions count the source from its first kept token (`first_kept_at_0`): a source
    padded on the left, or on the right, in a batch with a longer one gives the logits of the source alone, in
    teacher forcing and in each cached decoding step, and the same greedy tokens (the relative tables and decay
    rates moved off their initial values, so that positions matter)."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(attention_type=attention_type)).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith((".rel", ".decay")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    source, longer = torch.tensor([[56, 45, 41, 3, 52]]), torch.arange(11, 19)[None]
    target = torch.tensor([[1, 8, 9, 10, 24, 24]])
    alone = model(input_ids=source, decoder_input_ids=target).logits
    kwargs = dict(max_new_tokens=12, min_new_tokens=12)
    tokens = model.generate(source, **kwargs)
    for padding in ("left", "right"):
        pads = torch.zeros(1, 3, dtype=torch.long)
        ids = torch.cat([torch.cat([pads, source] if padding == "left" else [source, pads], 1), longer])
        mask = (torch.arange(8) >= 3) if padding == "left" else (torch.arange(8) < 5)
        mask = torch.stack([mask, torch.ones(8, dtype=torch.bool)]).long()
        batch = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target.expand(2, -1)).logits
        torch.testing.assert_close(batch[:1], alone, rtol=0, atol=1e-9, msg=lambda m: f"{padding}: {m}")
        encoder_outputs, cache = model.get_encoder()(input_ids=ids, attention_mask=mask), None
        for t in range(target.shape[1]):
            with torch.no_grad():
                out = model(encoder_outputs=encoder_outputs, attention_mask=mask,
                            decoder_input_ids=target[:, t:t + 1].expand(2, -1), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            torch.testing.assert_close(out.logits[:1], alone[:, t:t + 1], rtol=0, atol=1e-9)
        assert torch.equal(model.generate(ids, attention_mask=mask, **kwargs)[:1], tokens), padding


@pytest.mark.parametrize("padding", ["left", "right", "gap"])
def test_chunked_cross_attention_far_from_a_padded_source(padding, tiny_config, monkeypatch):
    """A batch whose second source keeps 20 of 220 tokens, padded on the left or the right, or 10 each side of a gap
    of 280 hidden tokens (of 300), and targets as long, decay rates 4 to 2 (float64): most target positions lie
    hundreds of positions from every visible source token, where the chunked path's decayed sums underflow. Its
    teacher-forced logits (`attention_mode="linear"`) equal the quadratic path's at every position, and would not
    without `_rows_beyond_the_keys`."""
    from modeling_scaleformer import ops_local_softmax

    logits = {}
    for mode in ("naive", "linear"):
        torch.manual_seed(0)
        model = ScaleformerForConditionalGeneration(tiny_config(attention_mode=mode, decay_rate_range=(4.0, 2.0)))
        model = model.double().eval()
        g = torch.Generator().manual_seed(0)
        src, tgt = (torch.randint(3, 60, (2, 300 if padding == "gap" else 220), generator=g) for _ in range(2))
        src_mask = torch.ones_like(src)
        src_mask[1, {"left": slice(None, 200), "right": slice(20, None), "gap": slice(10, 290)}[padding]] = 0
        kwargs = dict(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt)
        logits[mode] = model(**kwargs).logits
        if mode == "linear":
            monkeypatch.setattr(ops_local_softmax, "_rows_beyond_the_keys", lambda out, *args, **kwargs: out)
            unfixed = model(**kwargs).logits
    torch.testing.assert_close(logits["linear"], logits["naive"], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(unfixed[1], logits["naive"][1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("overrides", CONFIGS)
def test_causal_lm_cached_decoding_equals_full_forward(overrides, padding, tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config(**overrides)).double().eval()
    ids, mask = batch(ls=12, padding=padding)
    full = model(input_ids=ids, attention_mask=mask).logits
    out = model(input_ids=ids[:, :5], attention_mask=mask[:, :5], use_cache=True)
    logits, cache = [out.logits], out.past_key_values
    for t in range(5, 12):
        out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits)
        cache = out.past_key_values
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9)


def test_cached_decoding_float32(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config()).eval()
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    full = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    enc = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    cache, logits = None, []
    for t in range(9):
        out = model(encoder_outputs=enc, attention_mask=src_mask, decoder_input_ids=tgt[:, t : t + 1], past_key_values=cache)
        cache = out.past_key_values
        logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-4)


GENERATE = [
    pytest.param(dict(do_sample=False), id="greedy"),
    pytest.param(dict(num_beams=3, num_return_sequences=2), id="beam"),
    pytest.param(dict(do_sample=True, top_k=5), id="sample"),
]


@pytest.mark.parametrize("kwargs", GENERATE)
@pytest.mark.parametrize("overrides", CONFIGS[:2])
def test_generate_same_with_and_without_cache(overrides, kwargs, tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(**overrides)).eval()
    src, src_mask = batch()
    results = []
    for use_cache in (True, False):
        torch.manual_seed(1)
        results.append(model.generate(src, attention_mask=src_mask, max_new_tokens=10, use_cache=use_cache, **kwargs))
    assert torch.equal(results[0], results[1])
    assert results[0].shape[0] == src.shape[0] * kwargs.get("num_return_sequences", 1)
    assert len(set(results[0][:, 1:].flatten().tolist())) > 1  # not a degenerate single-token output


@pytest.mark.parametrize("overrides", [pytest.param(dict(), id="default"),
                                       pytest.param(dict(absolute_positions="sinusoidal"), id="sinusoidal")])
@pytest.mark.parametrize("kwargs", GENERATE)
def test_causal_lm_generate_same_with_and_without_cache(kwargs, overrides, tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config(**overrides)).eval()
    ids, mask = batch(padding="left")
    results = []
    for use_cache in (True, False):
        torch.manual_seed(1)
        results.append(model.generate(ids, attention_mask=mask, max_new_tokens=10, use_cache=use_cache, **kwargs))
    assert torch.equal(results[0], results[1])
    if not kwargs.get("do_sample") and "num_beams" not in kwargs:  # a left-padded row continues as the row alone
        row = int(mask.sum(1).argmin())
        alone = model.generate(ids[row, mask[row].bool()][None], max_new_tokens=10, **kwargs)
        assert torch.equal(results[0][row, -10:], alone[0, -10:])


def test_greedy_generate_matches_manual_loop(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config()).eval()
    src, src_mask = batch(b=1, padding="right")
    generated = model.generate(src, attention_mask=src_mask, max_new_tokens=8, do_sample=False, eos_token_id=None)
    decoder = torch.tensor([[model.config.decoder_start_token_id]])
    for _ in range(8):
        logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=decoder).logits
        decoder = torch.cat([decoder, logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, decoder)


def test_continue_generation_from_returned_cache(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config()).eval()
    ids, mask = batch(b=1, padding="right")
    ids, mask = ids[:, :7], mask[:, :7]
    first = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    assert isinstance(first.past_key_values, ScaleformerCache)
    seq = first.sequences
    more = model.generate(
        seq, attention_mask=torch.ones_like(seq), past_key_values=first.past_key_values, max_new_tokens=4, do_sample=False
    )
    straight = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(more, straight)


def test_beam_reordering_of_cache(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config()).double().eval()
    ids, _ = batch(b=3, padding="right")
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    beam_idx = torch.tensor([2, 0, 0])
    cache.reorder_cache(beam_idx)
    nxt = torch.tensor([[5], [6], [7]])
    stepped = model(input_ids=nxt, past_key_values=cache).logits
    expected = model(input_ids=torch.cat([ids[beam_idx], nxt], 1)).logits[:, -1:]
    torch.testing.assert_close(stepped, expected, rtol=0, atol=1e-9)


def test_cache_size_is_constant_during_generation(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config()).eval()
    ids, _ = batch(b=1)
    out = model(input_ids=ids, use_cache=True)
    cache, sizes = out.past_key_values, []
    for t in range(30):
        cache = model(input_ids=torch.tensor([[5 + t % 7]]), past_key_values=cache).past_key_values
        sizes.append(cache.self_attention_nbytes)
    assert len(set(sizes)) == 1 and cache.get_seq_length() == ids.shape[1] + 30


def test_seq2seq_loss_aligned_with_shifted_labels(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config()).eval()
    src, src_mask = batch()
    labels, _ = batch(ls=6, seed=2)
    labels[1, -2:] = -100
    out = model(input_ids=src, attention_mask=src_mask, labels=labels)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    assert decoder_input_ids[0, 0] == model.config.decoder_start_token_id
    assert torch.equal(decoder_input_ids[0, 1:], labels[0, :-1])
    logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=decoder_input_ids).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 60), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    n = int((labels != -100).sum())
    summed = model(input_ids=src, attention_mask=src_mask, labels=labels, num_items_in_batch=2 * n).loss
    torch.testing.assert_close(summed, expected / 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_seq2seq_loss_dtype(dtype):
    """float64 logits give a float64 loss (no rounding to float32); half precision is computed in float32."""
    from modeling_scaleformer.modeling_scaleformer import seq2seq_loss

    logits = torch.randn(2, 5, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(dtype)
    labels = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    labels[0, -2:] = -100
    loss = seq2seq_loss(logits, labels)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    expected = torch.nn.functional.cross_entropy(logits.double().reshape(-1, 11), labels.reshape(-1))
    torch.testing.assert_close(loss.double(), expected, rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=0)


def test_causal_lm_loss_shifts_labels(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config()).eval()
    ids, _ = batch(padding="right")
    out = model(input_ids=ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 60), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)


def test_gradient_accumulation_matches_full_batch(tiny_config, batch):
    """Sum-reduced loss over num_items_in_batch: 4 micro-batches of 1 give the gradient of 1 batch of 4."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config())
    src, src_mask = batch(b=4)
    labels, _ = batch(b=4, ls=7, seed=3)
    labels[0, -3:] = -100
    labels[2, -1:] = -100
    model.zero_grad()
    model(input_ids=src, attention_mask=src_mask, labels=labels).loss.backward()
    full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    n = (labels != -100).sum()
    for i in range(4):
        sl = slice(i, i + 1)
        model(input_ids=src[sl], attention_mask=src_mask[sl], labels=labels[sl], num_items_in_batch=n).loss.backward()
    for a, p in zip(full, model.parameters()):
        torch.testing.assert_close(p.grad, a, rtol=1e-4, atol=1e-6)


def test_every_parameter_is_initialised_and_tied(tiny_config):
    model = ScaleformerForConditionalGeneration(tiny_config(init_std=0.02))
    assert model.lm_head.weight is model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is model.model.shared.weight
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), name
    rel = model.model.encoder.layers[0].self_attn.rel
    assert 0.01 < rel.std().item() < 0.03


def test_save_load_roundtrip_bit_exact_and_auto_classes(tmp_path, tiny_config):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config()).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    for name in ("modeling_scaleformer.py", "configuration_scaleformer.py", "ops_kernelized.py", "cache.py"):
        assert (tmp_path / name).exists(), name
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is ScaleformerForConditionalGeneration
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
    assert type(AutoConfig.from_pretrained(tmp_path)) is ScaleformerConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is ScaleformerModel
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is ScaleformerForCausalLM


REMOTE = """
import sys, torch
# the machine may have the package installed (editable or not): make it unimportable here
sys.modules["modeling_scaleformer"] = None
try:
    import modeling_scaleformer
    raise SystemExit("the package is importable")
except ImportError:
    pass
from transformers import AutoModelForSeq2SeqLM
path, ref = sys.argv[1], sys.argv[2]
model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
src = torch.tensor([[5, 6, 7, 8, 9, 10]])
out = model.generate(src, max_new_tokens=6, do_sample=False)
assert out.tolist() == torch.load(ref).tolist(), (out, torch.load(ref))
print("remote ok")
"""


def test_remote_code_load_without_package(tmp_path, tiny_config):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config()).eval()
    folder = tmp_path / "scaleformer-tiny"
    model.save_pretrained(folder)
    reference = model.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), max_new_tokens=6, do_sample=False)
    torch.save(reference, tmp_path / "ref.pt")
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(REMOTE))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-I", str(script), str(folder), str(tmp_path / "ref.pt")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    # -I: isolated mode, neither PYTHONPATH nor the working directory is on sys.path
    assert result.returncode == 0 and "remote ok" in result.stdout, result.stderr[-3000:]


def test_resize_token_embeddings_keeps_tying(tiny_config):
    model = ScaleformerForConditionalGeneration(tiny_config())
    model.resize_token_embeddings(70)
    assert model.config.vocab_size == 70
    assert model.lm_head.weight.shape[0] == 70
    assert model.lm_head.weight is model.model.shared.weight
    out = model(input_ids=torch.tensor([[65, 66]]), labels=torch.tensor([[69, 2]]))
    assert out.logits.shape[-1] == 70


def test_bf16_forward_and_backward(tiny_config, batch):
    model = ScaleformerForConditionalGeneration(tiny_config()).to(torch.bfloat16)
    src, src_mask = batch()
    labels, _ = batch(ls=5, seed=4)
    out = model(input_ids=src, attention_mask=src_mask, labels=labels)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)


@pytest.mark.parametrize("mode", ["auto", "linear"])
@pytest.mark.parametrize("attention_type", ["local_softmax_decay", "kernelized_decay"])
def test_target_far_longer_than_the_source_trains(attention_type, mode, tiny_config):
    """A 20-token source and a 600-token target, float32: the decoder's late positions lie hundreds of positions from
    every source token, where the cross attention's decayed weights fall below float32's range; every gradient stays
    finite (the default attention's row scale, and the decayed kernel's row sum, had made them inf and NaN), on the
    quadratic path and the linear one."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(attention_type=attention_type, attention_mode=mode))
    g = torch.Generator().manual_seed(0)
    src, labels = torch.randint(3, 60, (1, 20), generator=g), torch.randint(3, 60, (1, 600), generator=g)
    model(input_ids=src, labels=labels).loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)


def test_config_rejects_bad_values(tiny_config):
    with pytest.raises(Exception, match="encoder_attention_heads"):
        tiny_config(encoder_attention_heads=3)
    with pytest.raises(Exception, match="rpe_horizon"):
        tiny_config(rpe_horizon=-2)
    with pytest.raises(Exception, match="attention_type"):
        tiny_config(attention_type="softmax_typo")
    with pytest.raises(Exception, match="activation_function"):
        tiny_config(activation_function="swishy")
    with pytest.raises(Exception, match="absolute_positions"):
        tiny_config(absolute_positions="learned")
    with pytest.raises(Exception, match="layer_norm_position"):
        tiny_config(layer_norm_position="sandwich")


def test_config_update_from_string_sets_fields_that_may_be_none(tiny_config):
    config = tiny_config()
    assert config.absolute_positions is None and config.pad_token_id == 0
    config.update_from_string("layer_norm_position=post,absolute_positions=sinusoidal,pad_token_id=none")
    assert (config.layer_norm_position, config.absolute_positions, config.pad_token_id) == ("post", "sinusoidal", None)
    config.update_from_string("absolute_positions=none,pad_token_id=5,dropout=0")
    assert (config.absolute_positions, config.pad_token_id, config.dropout) == (None, 5, 0.0)
    with pytest.raises(Exception, match="absolute_positions"):
        config.update_from_string("absolute_positions=learned")
    with pytest.raises(ValueError, match="key=value"):
        config.update_from_string("rpe_horizon")
    with pytest.raises(ValueError, match="isn't in the original config"):
        config.update_from_string("no_such_field=1")


def test_bad_inputs_raise_clear_errors(tiny_config, batch):
    model = ScaleformerForConditionalGeneration(tiny_config()).eval()
    src, src_mask = batch()
    with pytest.raises(TypeError, match="past_key_values"):
        model(input_ids=src, decoder_input_ids=src[:, :2], past_key_values=DynamicCache())
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=src, attention_mask=src_mask[:, :-1], decoder_input_ids=src[:, :2])
    with pytest.raises(ValueError, match="labels"):
        model(input_ids=src, labels=torch.tensor([[1, 2, 60]] * 3))
    with pytest.raises(ValueError, match="labels"):
        model(input_ids=src, labels=torch.tensor([[1, -5, 3]] * 3))
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=src, decoder_input_ids=src[:, :2], output_attentions=True)
    with pytest.raises(ValueError, match=r"Encoder's `input_ids` must have shape \(batch, length\), got \(11,\)"):
        model(input_ids=src[0], decoder_input_ids=src[:, :2])
    with pytest.raises(ValueError, match=r"ScaleformerDecoder's `input_ids` must have shape \(batch, length\)"):
        model(input_ids=src, decoder_input_ids=src[:, :2, None])
    with pytest.raises(ValueError, match=r"`inputs_embeds` must have shape \(batch, length, 16\), got \(3, 11, 8\)"):
        model.get_encoder()(inputs_embeds=torch.randn(3, 11, 8))
    for rows in (1, 4):  # the decoder's batch against the source's 3 rows
        with pytest.raises(ValueError, match=f"batch size {rows}, the source .* 3: they must match"):
            model(input_ids=src, decoder_input_ids=src[:1, :2].expand(rows, -1))


def test_trainer_loss_goes_down(tmp_path, tiny_config):
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(init_std=0.02))
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(64):
        src = torch.randint(3, 60, (8,), generator=g).tolist()
        rows.append({"input_ids": src, "attention_mask": [1] * 8, "labels": src})  # learn to copy
    data = Dataset.from_list(rows)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, learning_rate=1e-2, max_steps=40,
        logging_steps=10, report_to=[], use_cpu=True, save_strategy="no", gradient_accumulation_steps=2,
    )
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.3, losses


def test_autocast_bf16_training_step(tiny_config, batch):
    """Under CPU autocast the projections are bf16 while the relative tables stay float32."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(cross_attention_rpe=True))
    src, src_mask = batch()
    labels, _ = batch(ls=5, seed=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=src, attention_mask=src_mask, labels=labels)
    out.loss.backward()
    reference = model(input_ids=src, attention_mask=src_mask, labels=labels).loss
    assert torch.isfinite(out.loss) and abs(out.loss.item() - reference.item()) < 0.05
    assert model.model.encoder.layers[0].self_attn.rel.grad is not None


def test_sinusoidal_positions_values():
    positions = torch.arange(4096).view(1, -1)
    encoding = sinusoidal_positions(positions, 7, std=0.02, dtype=torch.float64)[0]
    assert encoding.shape == (4096, 7)
    scale = 0.02 * 2**0.5
    torch.testing.assert_close(encoding[:, 0], torch.sin(positions[0].double()) * scale)
    torch.testing.assert_close(encoding[:, 1], torch.cos(positions[0].double()) * scale)
    torch.testing.assert_close(encoding[:, 4], torch.sin(positions[0].double() / 10000 ** (4 / 7)) * scale)
    # the fast coordinates have standard deviation std over many positions
    torch.testing.assert_close(encoding[:, :2].std(0), torch.full((2,), 0.02, dtype=torch.float64), rtol=0.01, atol=0)
    half = sinusoidal_positions(positions, 8, std=0.02, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16


def test_sinusoidal_positions_ignore_padding_and_change_the_output(tiny_config, batch):
    """A row with its source padded on the left and its target on the right gives the logits of the same row alone;
    the encodings are really added. (Cross attention's decoder positions count every decoder input: a target padded
    on the left would not read as the target alone.)"""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(absolute_positions="sinusoidal")).double().eval()
    src, src_mask = batch(padding="left")
    tgt, tgt_mask = batch(ls=9, padding="right", seed=1)
    full = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    for row in range(src.shape[0]):
        s_keep, t_keep = src_mask[row].bool(), tgt_mask[row].bool()
        alone = model(input_ids=src[row, s_keep][None], decoder_input_ids=tgt[row, t_keep][None]).logits[0]
        torch.testing.assert_close(full[row, t_keep], alone, rtol=0, atol=1e-9)
    plain = ScaleformerForConditionalGeneration(tiny_config()).double().eval()
    plain.load_state_dict(model.state_dict())
    other = plain(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    assert (other - full).abs().max() > 1e-3


@pytest.mark.parametrize("mask", [None, "new", "all"])
def test_sinusoidal_cached_decoding_positions_without_padding(mask, tiny_config, batch):
    """Without a decoder mask, or with one over the new tokens only, positions continue from the cache length."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(absolute_positions="sinusoidal")).double().eval()
    src, _ = batch(padding="right", b=2)
    tgt, _ = batch(ls=9, padding="right", seed=1, b=2)
    tgt = tgt.clamp(min=3)  # no padding id
    full = model(input_ids=src, decoder_input_ids=tgt).logits
    cache, logits, start = None, [], 0
    for n in [4, 1, 3, 1]:
        step_mask = {None: None, "new": torch.ones(2, n, dtype=torch.long),
                     "all": torch.ones(2, start + n, dtype=torch.long)}[mask]
        out = model(input_ids=src, decoder_input_ids=tgt[:, start : start + n], decoder_attention_mask=step_mask,
                    past_key_values=cache, use_cache=True)
        cache, start = out.past_key_values, start + n
        logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_layer_norm_position_by_hand(position, tiny_config, batch):
    """A one-layer encoder computed from its modules: pre-norm ends with the stack's norm, post-norm starts
    with it and normalises after every residual addition."""
    torch.manual_seed(0)
    config = tiny_config(encoder_layers=1, layer_norm_position=position)
    model = ScaleformerModel(config).double().eval()
    for norm in model.modules():  # norms that are not the identity at initialisation
        if isinstance(norm, torch.nn.LayerNorm):
            torch.nn.init.normal_(norm.weight, 1.0, 0.3)
            torch.nn.init.normal_(norm.bias, 0.0, 0.3)
    encoder = model.get_encoder()
    layer = encoder.layers[0]
    src, src_mask = batch()
    x = encoder.embed_tokens(src)
    if position == "pre":
        x = x + layer.self_attn(layer.self_attn_layer_norm(x), key_mask=src_mask)
        x = x + layer.ffn(layer.ffn_layer_norm(x))
        expected = encoder.layer_norm(x)
    else:
        x = encoder.layer_norm(x)
        x = layer.self_attn_layer_norm(x + layer.self_attn(x, key_mask=src_mask))
        expected = layer.ffn_layer_norm(x + layer.ffn(x))
    out = encoder(input_ids=src, attention_mask=src_mask).last_hidden_state
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
