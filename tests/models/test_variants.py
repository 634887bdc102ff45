"""Every attention_type through the models: cached decoding, generate(), state size, save/load, remote code."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from modeling_scaleformer import ScaleformerConfig, ScaleformerForCausalLM, ScaleformerForConditionalGeneration
from modeling_scaleformer.ops_registry import ATTENTION_TYPES, ATTENTION_VARIANTS, cross_attention_type


@pytest.fixture
def tiny_config(tiny_config):
    """The shared tiny configuration, with the attention type as first argument."""

    def variant_config(attention_type, **overrides) -> ScaleformerConfig:
        return tiny_config(attention_type=attention_type, **overrides)

    return variant_config


# the names of every variant's own parameters (relative tables, Fourier frequencies, biases, ...)
VARIANT_PARAMETERS = {name for variant in ATTENTION_VARIANTS.values() for name in variant.parameters(2, 8, 3, False)}


def randomise_variant_parameters(model, seed=0):
    """Move the variants' parameters away from their initialisation (zeros, ones, spectra)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1] in VARIANT_PARAMETERS:
                param.add_(0.3 * torch.randn(param.shape, generator=g, dtype=param.dtype))
    return model


TYPES = [pytest.param(t, id=t) for t in ATTENTION_TYPES]


def test_registry_covers_the_config_literal():
    literal = ScaleformerConfig.__annotations__["attention_type"].__args__
    assert set(literal) == set(ATTENTION_TYPES) == set(ATTENTION_VARIANTS)
    for t in ATTENTION_TYPES:
        cross = ATTENTION_VARIANTS[cross_attention_type(t, False)]
        assert cross.cross_summary is not None and cross.cross_step is not None, t


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("attention_type", TYPES)
def test_seq2seq_cached_decoding_equals_teacher_forcing(attention_type, padding, tiny_config, cached_decoding):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(attention_type)).double().eval()
    randomise_variant_parameters(model)
    assert cached_decoding(model, padding).get_seq_length() == 9


CROSS_RPE_TYPES = [pytest.param(t, id=t) for t, v in ATTENTION_VARIANTS.items() if v.cross_attention_rpe]


@pytest.mark.parametrize("attention_type", CROSS_RPE_TYPES)
def test_cross_attention_rpe_cached_decoding_equals_teacher_forcing(attention_type, tiny_config, batch):
    """With `cross_attention_rpe` the decoder's cross attention is the variant itself, relative positions
    included: its summary and steps match the full forward, and the positions change the output."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(attention_type, cross_attention_rpe=True)).double().eval()
    randomise_variant_parameters(model)
    assert model.model.decoder.layers[0].encoder_attn.attention_type == attention_type
    src, src_mask = batch(padding="left")
    tgt, tgt_mask = batch(ls=9, padding="right", seed=1)
    full = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    cache, logits = None, []
    for t in range(9):
        out = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt[:, t : t + 1],
                    decoder_attention_mask=tgt_mask[:, : t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9)
    cross = model.model.decoder.layers[0].encoder_attn
    if not cross.parameter_specs:  # kernelized_sum: no positions to move
        return
    with torch.no_grad():  # the relative table, or the decay rates of a variant without one
        (cross.rel if "rel" in cross.parameter_specs else cross.decay).add_(1.0)
    moved = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    assert (moved - full).abs().max() > 1e-4


@pytest.mark.parametrize("attention_type", TYPES)
def test_unnormalised_variants_get_an_output_norm_and_gate(attention_type, tiny_config, batch):
    model = ScaleformerForConditionalGeneration(tiny_config(attention_type)).double().eval()
    attn = model.model.encoder.layers[0].self_attn
    if ATTENTION_VARIANTS[attention_type].normalised:
        assert attn.out_norm is None and attn.g_proj is None
        return
    assert bool((attn.out_norm.weight == 1).all()) and tuple(attn.g_proj.weight.shape) == (16, 16)
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    before = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    with torch.no_grad():
        attn.out_norm.weight.mul_(2.0)
    after = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert (after - before).abs().max() > 1e-4


def test_decay_rates_are_initialised_from_fast_to_slow(tiny_config):
    attn = ScaleformerForConditionalGeneration(tiny_config("kernelized_decay")).model.decoder.layers[0].self_attn
    torch.testing.assert_close(torch.nn.functional.softplus(attn.decay.detach()), torch.tensor([0.25, 2.0**-8]))
    config = tiny_config("kernelized_decay_gated", decoder_attention_heads=4, decay_rate_range=[0.5, 0.0625])
    attn = ScaleformerForConditionalGeneration(config).model.decoder.layers[0].self_attn
    torch.testing.assert_close(torch.nn.functional.softplus(attn.decay.detach()), torch.tensor([0.5, 0.25, 0.125, 0.0625]))


@pytest.mark.parametrize("rates", [(0.1, 0.2), (0.5, 0.0), [0.5], "fast", (True, 0.1)])
def test_config_rejects_a_bad_decay_rate_range(rates, tiny_config):
    with pytest.raises(Exception, match="decay_rate_range"):
        tiny_config("kernelized_decay", decay_rate_range=rates)


@pytest.mark.parametrize("attention_type", TYPES)
def test_causal_lm_cached_decoding_equals_full_forward(attention_type, tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config(attention_type)).double().eval()
    randomise_variant_parameters(model)
    ids, mask = batch(ls=12, padding="left")
    full = model(input_ids=ids, attention_mask=mask).logits
    out = model(input_ids=ids[:, :5], attention_mask=mask[:, :5], use_cache=True)
    logits, cache = [out.logits], out.past_key_values
    for t in range(5, 12):
        out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache, use_cache=True)
        logits.append(out.logits)
        cache = out.past_key_values
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9)


@pytest.mark.parametrize("attention_type", TYPES)
def test_linear_and_naive_modes_agree_in_the_model(attention_type, tiny_config, batch):
    # the softmax variants have one algorithm: "auto" (SDPA) against "naive"
    modes = ("auto", "naive") if ATTENTION_VARIANTS[attention_type].softmax else ("linear", "naive")
    torch.manual_seed(0)
    models = [ScaleformerForConditionalGeneration(tiny_config(attention_type, attention_mode=m)).double() for m in modes]
    randomise_variant_parameters(models[0])
    models[1].load_state_dict(models[0].state_dict())
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    losses = [m(input_ids=src, attention_mask=src_mask, labels=tgt).loss for m in models]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-10, atol=0)
    grads = [torch.autograd.grad(loss, list(m.parameters())) for loss, m in zip(losses, models)]
    for (name, _), a, b in zip(models[0].named_parameters(), *grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=lambda m: f"{name}: {m}")


GENERATE = [
    pytest.param(dict(do_sample=False), id="greedy"),
    pytest.param(dict(num_beams=3, num_return_sequences=2), id="beam"),
    pytest.param(dict(do_sample=True, top_k=5), id="sample"),
]


@pytest.mark.parametrize("kwargs", GENERATE)
@pytest.mark.parametrize("attention_type", TYPES)
def test_generate_same_with_and_without_cache(attention_type, kwargs, tiny_config, batch):
    torch.manual_seed(0)
    # pre-norm blocks: some random post-norm models greedily repeat one token, which would hide a cache mismatch
    config = tiny_config(attention_type, layer_norm_position="pre")
    model = randomise_variant_parameters(ScaleformerForConditionalGeneration(config).eval())
    src, src_mask = batch()
    results = []
    for use_cache in (True, False):
        torch.manual_seed(1)
        results.append(model.generate(src, attention_mask=src_mask, max_new_tokens=10, use_cache=use_cache, **kwargs))
    assert torch.equal(results[0], results[1])
    assert len(set(results[0][:, 1:].flatten().tolist())) > 1  # not a degenerate single-token output


@pytest.mark.parametrize("attention_type", TYPES)
def test_causal_lm_generate_same_with_and_without_cache(attention_type, tiny_config, batch):
    torch.manual_seed(0)
    model = randomise_variant_parameters(ScaleformerForCausalLM(tiny_config(attention_type)).eval())
    ids, mask = batch(padding="left")
    results = [
        model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, use_cache=use_cache)
        for use_cache in (True, False)
    ]
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("attention_type", TYPES)
def test_state_size_during_generation(attention_type, tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForCausalLM(tiny_config(attention_type)).eval()
    ids, _ = batch(b=1)
    cache = model(input_ids=ids, use_cache=True).past_key_values
    sizes = []
    for t in range(12):
        cache = model(input_ids=torch.tensor([[5 + t % 7]]), past_key_values=cache).past_key_values
        sizes.append(cache.self_attention_nbytes)
    assert cache.get_seq_length() == ids.shape[1] + 12
    if ATTENTION_VARIANTS[attention_type].constant_state:
        assert len(set(sizes)) == 1
    else:  # a key/value cache: one more key and value per layer and token
        assert sizes == sorted(sizes) and sizes[-1] > sizes[0]


def test_toeplitz_with_zero_bias_is_kernelized_attention(tiny_config, batch):
    """At initialisation exp(b) = 1: the Toeplitz model computes what plain kernelized attention does."""
    torch.manual_seed(0)
    toeplitz = ScaleformerForConditionalGeneration(tiny_config("toeplitz")).double().eval()
    plain = ScaleformerForConditionalGeneration(tiny_config("kernelized")).double().eval()
    plain.load_state_dict(toeplitz.state_dict(), strict=False)
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    a = toeplitz(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    b = plain(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    randomise_variant_parameters(toeplitz)
    c = toeplitz(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert (c - b).abs().max() > 1e-3


def test_variant_parameters_are_initialised_as_specified(tiny_config):
    model = ScaleformerForConditionalGeneration(tiny_config("fourier", init_std=0.02))
    attn = model.model.encoder.layers[0].self_attn
    head_dim = 8
    expected = 10000.0 ** (-torch.arange(head_dim, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(attn.frequencies[1, :, 0], expected)
    assert bool((attn.phases == 0).all()) and bool((attn.amplitudes == 1).all())
    xl = ScaleformerForConditionalGeneration(tiny_config("xl_relative", init_std=0.02)).model.decoder.layers[1].self_attn
    assert bool((xl.content_bias == 0).all()) and bool((xl.rel_bias == 0).all()) and 0.01 < xl.rel.std() < 0.03
    assert tuple(xl.rel.shape) == (2, 7, 8)
    cross = ScaleformerForConditionalGeneration(tiny_config("xl_relative")).model.decoder.layers[0].encoder_attn
    assert cross.attention_type == "softmax" and len(list(cross.parameters())) == 8  # projections only


@pytest.mark.parametrize(
    "overrides, field",
    [
        pytest.param(dict(attention_type="fourier", rpe_shared_across_heads=True), "rpe_shared_across_heads", id="shared"),
        pytest.param(dict(attention_type="softmax", cross_attention_rpe=True), "cross_attention_rpe", id="cross-rpe"),
        pytest.param(dict(attention_type="shaw_softmax", attention_mode="linear"), "attention_mode", id="mode"),
    ],
)
def test_config_rejects_options_a_variant_does_not_have(overrides, field, tiny_config):
    # huggingface_hub wraps the ValueError of validate_architecture in StrictDataclassClassValidationError
    with pytest.raises(Exception, match=field):
        tiny_config(**overrides)


REMOTE = """
import json, sys, torch
sys.modules["modeling_scaleformer"] = None  # the package must not be importable here
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
for path, ref, kind in json.loads(sys.argv[1]):
    auto = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForCausalLM
    model = auto.from_pretrained(path, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    out = model.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), max_new_tokens=6, do_sample=False)
    assert out.tolist() == torch.load(ref).tolist(), (path, out, torch.load(ref))
print("remote ok")
"""


# every attention type with its defaults, and the options that change the decoder layer or the ops
SAVED = [(t, t, {}) for t in ATTENTION_TYPES] + [
    ("joint-relu", "kernelized_decay_gated",
     dict(cross_attention_rpe=True, decoder_attention="joint", feature_map="relu")),
    ("count-relu", "kernelized_decay_gated",
     dict(cross_attention_rpe=True, decoder_attention="count", feature_map="relu")),
    ("count-default-type", "local_softmax_decay", dict(decoder_attention="count")),
]


def test_save_load_and_remote_code_for_every_attention_type(tmp_path, tiny_config):
    jobs = []
    for label, attention_type, overrides in SAVED:
        for kind, cls, auto in (
            ("seq2seq", ScaleformerForConditionalGeneration, AutoModelForSeq2SeqLM),
            ("causal", ScaleformerForCausalLM, AutoModelForCausalLM),
        ):
            torch.manual_seed(0)
            model = randomise_variant_parameters(cls(tiny_config(attention_type, **overrides)).eval())
            folder = tmp_path / f"{label}-{kind}"
            model.save_pretrained(folder)
            loaded = auto.from_pretrained(folder).eval()
            assert loaded.config.attention_type == attention_type
            assert list(model.state_dict()) == list(loaded.state_dict()), label
            for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
                assert torch.equal(a, b), (label, n)
            reference = model.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), max_new_tokens=6, do_sample=False)
            torch.save(reference, tmp_path / f"{label}-{kind}.pt")
            jobs.append((str(folder), str(tmp_path / f"{label}-{kind}.pt"), kind))
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(REMOTE))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-I", str(script), json.dumps(jobs)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0 and "remote ok" in result.stdout, result.stderr[-3000:]
