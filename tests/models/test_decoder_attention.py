"""The feature map choice and the decoder's joint attention (`feature_map`, `decoder_attention`) through the models:
the joint layer against its formula, cached decoding against teacher forcing, generate() with and without the
cache, and the configuration's errors."""

import math
from unittest import mock

import pytest
import torch
from torch.nn import functional as F

from modeling_scaleformer import ScaleformerConfig, ScaleformerForCausalLM, ScaleformerForConditionalGeneration
from modeling_scaleformer.cache import ScaleformerCache
from modeling_scaleformer.layers import TokenRows
from modeling_scaleformer.modeling_scaleformer import COUNT_ATTENTION, COUNT_BLOCK_ATTENTION
from modeling_scaleformer.ops_naive import naive_kernelized_decay_attention


# the decoder's counting options off: the defaults give the count block 64 heads of 2 channels, a table of its own
# and an output scale, and the remaining counts; here the options are tested one at a time from this bare start
# (the `tiny_config` of this module), and the defaults as one case (DEFAULT_DECODER)
BARE = dict(count_block_heads=None, count_block_head_dim=None, count_block_embeddings=False,
            count_block_embedding_dim=None, count_block_layer_scale=None, remaining_count_max=None)
DEFAULT_DECODER = {name: getattr(ScaleformerConfig(), name) for name in ("decoder_attention", *BARE)}
JOINT = dict(attention_type="kernelized_decay_gated", cross_attention_rpe=True, decoder_attention="joint")
COUNT = dict(JOINT, decoder_attention="count")
DEFAULT_COUNT = dict(decoder_attention="count")  # the default attention type: COUNT_ATTENTION in the first layer
COUNT_BLOCK = dict(decoder_attention="count_block")  # separate layers, a COUNT_BLOCK_ATTENTION block in the first


@pytest.fixture
def tiny_config(tiny_config):
    """The models' tiny configuration with the counting options off (BARE) unless the test sets them."""
    return lambda **overrides: tiny_config(**{**BARE, **overrides})

CONFIGS = [
    pytest.param(dict(JOINT, feature_map="relu"), id="joint-relu"),
    pytest.param(dict(JOINT, feature_map="elu", layer_norm_position="pre"), id="joint-elu-pre"),
    pytest.param(dict(COUNT, feature_map="relu"), id="count-relu"),
    pytest.param(dict(COUNT, feature_map="elu", layer_norm_position="pre"), id="count-elu-pre"),
    pytest.param(DEFAULT_COUNT, id="count-default-type"),
    pytest.param(dict(DEFAULT_COUNT, layer_norm_position="pre"), id="count-default-type-pre"),
    pytest.param(dict(DEFAULT_COUNT, attention_type="softmax"), id="count-softmax"),
    pytest.param(COUNT_BLOCK, id="count-block"),
    pytest.param(dict(COUNT_BLOCK, layer_norm_position="pre"), id="count-block-pre"),
    pytest.param(dict(COUNT_BLOCK, count_block_heads=16), id="count-block-16-heads"),
    pytest.param(dict(COUNT_BLOCK, count_block_heads=3, count_block_head_dim=2), id="count-block-3-heads-of-2"),
    pytest.param(dict(COUNT_BLOCK, count_block_detach=True, count_block_zero_init=True), id="count-block-detach"),
    pytest.param(dict(COUNT_BLOCK, count_block_embeddings=True, count_block_heads=8), id="count-block-own-embeddings"),
    pytest.param(dict(COUNT_BLOCK, count_block_embeddings=True, count_block_heads=8, count_block_layer_scale=0.1),
                 id="count-block-layer-scale"),
    pytest.param(dict(remaining_count_max=2), id="remaining-counts"),
    pytest.param(DEFAULT_DECODER, id="default"),
    pytest.param(dict(COUNT_BLOCK, remaining_count_max=1), id="count-block-remaining-counts"),
    pytest.param(dict(COUNT_BLOCK, count_block_embeddings=True, count_block_heads=8, count_block_layer_scale=0.1,
                      remaining_count_max=3), id="count-block-own-embeddings-remaining-counts"),
    pytest.param(dict(COUNT, decoder_attention="count_block", feature_map="relu"), id="count-block-gated"),
    pytest.param(dict(attention_type="kernelized_decay_gated", feature_map="relu"), id="gated-relu"),
    pytest.param(dict(attention_type="kernelized_decay", cross_attention_rpe=True, feature_map="relu"),
                 id="normalised-relu-cross-rpe"),
]


def randomised(model, seed=0):
    """Move the relative tables and decay rates away from their initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith((".rel", ".decay", ".count_layer_scale")):
                param.add_(0.3 * torch.randn(param.shape, generator=g, dtype=param.dtype))
    return model


def test_joint_decoder_layer_is_one_gated_sum_over_both_sources(tiny_config, batch):
    """out = x + o_proj(RMSNorm(A_self + A_cross) * silu(g_proj(x))) (post-norm: then the layer norm), with A_self
    the causal attention of the queries on the decoder's keys and A_cross their attention on the encoder's keys,
    both with the configured feature map, then the feed-forward block."""
    torch.manual_seed(0)
    config = tiny_config(**JOINT, feature_map="relu")
    model = randomised(ScaleformerForConditionalGeneration(config).double().eval())
    layer = model.model.decoder.layers[1]
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    encoder = torch.randn(3, 11, 16, dtype=torch.float64)
    _, mask = batch(b=3, ls=9, padding="right")
    _, encoder_mask = batch(b=3, ls=11, padding="left")
    attn, cross = layer.self_attn, layer.encoder_attn

    def heads(t):
        return t.view(t.shape[0], t.shape[1], 2, 8).transpose(1, 2)

    q = heads(attn.q_proj(x))
    own = naive_kernelized_decay_attention(
        q, heads(attn.k_proj(x)), heads(attn.v_proj(x)), attn.rel, F.softplus(attn.decay), causal=True,
        key_mask=mask, feature_map="relu",
    )
    source = naive_kernelized_decay_attention(
        q, heads(cross.k_proj(encoder)), heads(cross.v_proj(encoder)), cross.rel, F.softplus(cross.decay),
        key_mask=encoder_mask, feature_map="relu",
    )
    total = own + source
    normed = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + config.layer_norm_eps) * attn.out_norm.weight
    out = attn.o_proj(normed.transpose(1, 2).reshape(3, 9, 16) * F.silu(attn.g_proj(x)))
    hidden = layer.self_attn_layer_norm(x + out)
    expected = layer.ffn_layer_norm(hidden + layer.ffn(hidden))
    got = layer(x, encoder, key_mask=mask, encoder_key_mask=encoder_mask)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert (source.abs().amax() > 1e-3) and (own.abs().amax() > 1e-3)  # both sums take part


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
@pytest.mark.parametrize("overrides", [dict(COUNT, feature_map="relu"), DEFAULT_COUNT], ids=["gated", "default-type"])
def test_count_layer_reads_the_source_tokens_as_written_ones_with_the_opposite_sign(
    overrides, layer_norm_position, tiny_config
):
    """The first layer of `decoder_attention="count"`: A_cross is the attention of the queries on the source states
    through self_attn's key and value projections, negated (the encoder output is not read), with relu features;
    the other layers are joint layers with a gated attention type and separate ones with the default type."""
    torch.manual_seed(0)
    config = tiny_config(**overrides, layer_norm_position=layer_norm_position)
    model = randomised(ScaleformerForConditionalGeneration(config).double().eval())
    layer, second = model.model.decoder.layers[:2]
    assert layer.count and layer.joint and not second.count
    assert second.joint == (config.attention_type == "kernelized_decay_gated")
    x, source, encoder = (torch.randn(2, n, 16, dtype=torch.float64) for n in (7, 10, 10))
    attn, cross = layer.self_attn, layer.encoder_attn
    norm = (lambda t: t) if layer_norm_position == "post" else layer.self_attn_layer_norm
    xn, sn = norm(x), norm(source)

    def heads(t):
        return t.view(t.shape[0], t.shape[1], 2, 8).transpose(1, 2)

    q = heads(attn.q_proj(xn))
    # the gated type's relative tables; the count attention of the default type has none (decay from distance 0)
    rel, cross_rel = (getattr(m, "rel", None) for m in (attn, cross))
    horizon = config.rpe_horizon if rel is not None else 0
    own = naive_kernelized_decay_attention(q, heads(attn.k_proj(xn)), heads(attn.v_proj(xn)), rel,
                                           F.softplus(attn.decay), causal=True, feature_map="relu", horizon=horizon)
    read = naive_kernelized_decay_attention(q, heads(attn.k_proj(sn)), heads(attn.v_proj(sn)), cross_rel,
                                            F.softplus(cross.decay), feature_map="relu", horizon=horizon)
    out = attn.finish(own - read, xn)
    expected = x + out
    expected = layer.self_attn_layer_norm(expected) if layer_norm_position == "post" else expected
    expected = (layer.ffn_layer_norm(expected + layer.ffn(expected)) if layer_norm_position == "post"
                else expected + layer.ffn(layer.ffn_layer_norm(expected)))
    got = layer(x, encoder, source)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer(x, encoder + 1.0, source), got, rtol=0, atol=0)  # the encoder output is unused


def test_count_layer_sum_is_zero_once_every_source_token_is_written(tiny_config):
    """Without relative terms (phi(rel) = 0 under relu) and without decay, the first layer's sum at the last written
    token is exactly 0 when the written tokens are the source tokens in any order: equal weights, opposite values."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(**COUNT, feature_map="relu")).double().eval()
    layer = model.model.decoder.layers[0]
    with torch.no_grad():
        for attn in (layer.self_attn, layer.encoder_attn):
            attn.rel.fill_(-10.0)
            attn.decay.fill_(-40.0)  # softplus: about 4e-18 per position
    source = torch.randn(2, 9, 16, dtype=torch.float64)
    written = source[:, torch.randperm(9)]
    q = layer.self_attn.query(written)
    total = layer.self_attn.read(q, written) + layer.encoder_attn.read(
        q, source, projections=(layer.self_attn.k_proj, lambda t: -layer.self_attn.v_proj(t))
    )
    assert total[:, :, -1].abs().max() < 1e-12
    assert total[:, :, :-1].abs().max() > 1e-2  # before the end, some source tokens are not written yet


def test_count_needs_the_source_embeddings(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(**COUNT)).eval()
    src, src_mask = batch()
    tgt, _ = batch(ls=5, padding="right", seed=1)
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    expected = model(encoder_outputs=encoder_outputs, attention_mask=src_mask, decoder_input_ids=tgt).logits
    # a plain tuple loses them: the input ids give them again, and without those the error names what is missing
    as_tuple = (encoder_outputs.last_hidden_state,)
    got = model(input_ids=src, encoder_outputs=as_tuple, attention_mask=src_mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="`decoder_attention='count'` needs `source_embeddings`"):
        model(encoder_outputs=as_tuple, attention_mask=src_mask, decoder_input_ids=tgt)
    assert ScaleformerForConditionalGeneration(tiny_config(**JOINT)).get_encoder()(input_ids=src).source_embeddings is None


def test_joint_decoder_layer_has_one_set_of_queries_norm_gate_and_output(tiny_config):
    separate = ScaleformerForConditionalGeneration(tiny_config(**dict(JOINT, decoder_attention="separate")))
    joint = ScaleformerForConditionalGeneration(tiny_config(**JOINT))
    layer = joint.model.decoder.layers[0]
    assert layer.joint and not separate.model.decoder.layers[0].joint
    assert sorted(name for name, _ in layer.encoder_attn.named_parameters()) == [
        "decay", "k_proj.bias", "k_proj.weight", "rel", "v_proj.bias", "v_proj.weight"
    ]
    assert not hasattr(layer, "encoder_attn_layer_norm")
    saved = sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in joint.parameters())
    # per decoder layer: q_proj, o_proj, g_proj (16 x 16 + 16 each), the output RMSNorm (8) and a layer norm (32)
    assert saved == 2 * (3 * (16 * 16 + 16) + 8 + 32)
    # the encoder, and a decoder-only model, do not change
    assert not any(layer.joint for layer in ScaleformerForCausalLM(tiny_config(**JOINT)).model.layers)


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("overrides", CONFIGS)
def test_cached_decoding_equals_teacher_forcing(overrides, padding, tiny_config, cached_decoding):
    torch.manual_seed(0)
    model = randomised(ScaleformerForConditionalGeneration(tiny_config(**overrides)).double().eval())
    cached_decoding(model, padding)


@pytest.mark.parametrize(
    "mode",
    [dict(JOINT, feature_map="relu"), dict(COUNT, feature_map="relu"), DEFAULT_COUNT, COUNT_BLOCK,
     dict(COUNT_BLOCK, count_block_heads=8), dict(COUNT_BLOCK, count_block_heads=12, count_block_head_dim=2),
     dict(COUNT_BLOCK, count_block_embeddings=True)],
    ids=["joint", "count", "count-default-type", "count-block", "count-block-8-heads", "count-block-12-heads-of-2",
         "count-block-own-embeddings"],
)
@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(num_beams=3, do_sample=False)], ids=["greedy", "beam"])
def test_joint_generate_same_with_and_without_cache(kwargs, mode, tiny_config, batch):
    torch.manual_seed(1)
    model = randomised(ScaleformerForConditionalGeneration(tiny_config(**mode, layer_norm_position="pre")).eval())
    src, src_mask = batch()
    results = [
        model.generate(src, attention_mask=src_mask, max_new_tokens=10, use_cache=use_cache, **kwargs)
        for use_cache in (True, False)
    ]
    assert torch.equal(results[0], results[1])
    assert len(set(results[0][:, 1:].flatten().tolist())) > 1


def test_feature_map_changes_the_model(tiny_config, batch):
    """The same weights under elu + 1 and max(x, 0) give different outputs: the option reaches the ops."""
    torch.manual_seed(0)
    elu = randomised(ScaleformerForConditionalGeneration(tiny_config(**JOINT)).double().eval())
    relu = ScaleformerForConditionalGeneration(tiny_config(**JOINT, feature_map="relu")).double().eval()
    relu.load_state_dict(elu.state_dict())
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    a = elu(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    b = relu(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(dict(attention_type="kernelized_rpe", feature_map="relu"),
                     "`feature_map` 'relu' applies to attention_type", id="relu-on-kernelized-rpe"),
        pytest.param(dict(attention_type="kernelized_decay", cross_attention_rpe=True, decoder_attention="joint"),
                     "`decoder_attention='joint'`.*attention_type 'kernelized_decay'", id="joint-normalised"),
        pytest.param(
            dict(attention_type="kernelized_decay_gated", cross_attention_rpe=False, decoder_attention="joint"),
            "`decoder_attention='joint'`.*cross_attention_rpe", id="joint-without-cross-rpe",
        ),
        pytest.param(dict(attention_type="kernelized_decay_gated", feature_map="softplus"), "feature_map",
                     id="unknown-feature-map"),
        pytest.param(dict(decoder_attention="both"), "decoder_attention", id="unknown-decoder-attention"),
        pytest.param(
            dict(attention_type="kernelized_decay_gated", cross_attention_rpe=False, decoder_attention="count"),
            "`decoder_attention='count'`.*cross_attention_rpe", id="count-gated-without-cross-rpe",
        ),
        pytest.param(
            dict(attention_type="kernelized_decay_gated", cross_attention_rpe=False, decoder_attention="count_block"),
            "`decoder_attention='count_block'`.*cross_attention_rpe", id="count-block-gated-without-cross-rpe",
        ),
        pytest.param(dict(COUNT_BLOCK, count_block_heads=3),
                     r"`count_block_heads` must be a positive divisor of `d_model` \(16\), got 3",
                     id="count-block-3-heads"),
        pytest.param(dict(COUNT_BLOCK, count_block_heads=0),
                     r"`count_block_heads` must be a positive divisor of `d_model` \(16\), got 0",
                     id="count-block-0-heads"),
        pytest.param(dict(COUNT_BLOCK, count_block_heads=2.0), "count_block_heads", id="count-block-float-heads"),
        pytest.param(dict(COUNT_BLOCK, count_block_heads=0, count_block_head_dim=2),
                     r"`count_block_heads` must be positive, got 0", id="count-block-0-heads-of-2"),
        pytest.param(dict(COUNT_BLOCK, count_block_heads=3, count_block_head_dim=0),
                     r"`count_block_head_dim` must be positive, got 0", id="count-block-heads-of-0"),
        pytest.param(dict(DEFAULT_COUNT, count_block_head_dim=4),
                     "`count_block_head_dim` applies to `decoder_attention='count_block'` only, got "
                     "decoder_attention 'count'", id="head-dim-without-count-block"),
        pytest.param(dict(DEFAULT_COUNT, count_block_zero_init=True),
                     "`count_block_zero_init` applies to `decoder_attention='count_block'` only, got "
                     "decoder_attention 'count'", id="zero-init-without-count-block"),
        pytest.param(dict(DEFAULT_COUNT, count_block_detach=True),
                     "`count_block_detach` applies to `decoder_attention='count_block'` only, got "
                     "decoder_attention 'count'", id="detach-without-count-block"),
        pytest.param(dict(COUNT_BLOCK, count_block_detach=True, count_block_embeddings=True),
                     "`count_block_detach=True` reads the block's inputs without gradient: with "
                     "`count_block_embeddings=True`", id="detach-with-own-embeddings"),
        pytest.param(dict(COUNT_BLOCK, count_block_embeddings=True, count_block_embedding_dim=0),
                     r"`count_block_embedding_dim` must be positive, got 0", id="own-embeddings-of-0"),
        pytest.param(dict(COUNT_BLOCK, count_block_embedding_dim=4),
                     "`count_block_embedding_dim` sets the width of the count block's own embedding table: it needs "
                     "`count_block_embeddings=True`", id="embedding-dim-without-own-embeddings"),
        pytest.param(dict(DEFAULT_COUNT, count_block_embedding_dim=4),
                     "`count_block_embedding_dim` applies to `decoder_attention='count_block'` only",
                     id="embedding-dim-without-count-block"),
        pytest.param(dict(DEFAULT_COUNT, count_block_layer_scale=0.25),
                     "`count_block_layer_scale` applies to `decoder_attention='count_block'` only, got "
                     "decoder_attention 'count'", id="layer-scale-without-count-block"),
        *[pytest.param(dict(COUNT_BLOCK, count_block_layer_scale=value),
                       rf"`count_block_layer_scale` must be a positive finite number or None, got {text}",
                       id=f"layer-scale-{text}") for value, text in [(0.0, "0.0"), (-0.1, "-0.1"), (math.inf, "inf"),
                                                                     (math.nan, "nan")]],
        pytest.param(dict(COUNT_BLOCK, count_block_layer_scale=1), "count_block_layer_scale",
                     id="layer-scale-int"),
    ],
)
def test_config_rejects_what_the_options_do_not_cover(overrides, message, tiny_config):
    # huggingface_hub wraps the ValueError of validate_architecture in StrictDataclassClassValidationError
    with pytest.raises(Exception, match=message):
        tiny_config(**overrides)


def test_config_round_trips_the_options(tmp_path):
    config = ScaleformerConfig(**JOINT, feature_map="relu")
    config.save_pretrained(tmp_path)
    loaded = ScaleformerConfig.from_pretrained(tmp_path)
    assert (loaded.feature_map, loaded.decoder_attention) == ("relu", "joint")
    assert (ScaleformerConfig().feature_map, ScaleformerConfig().decoder_attention) == ("elu", "count_block")
    ScaleformerConfig(**dict(BARE, **COUNT_BLOCK, count_block_heads=64)).save_pretrained(tmp_path)
    loaded = ScaleformerConfig.from_pretrained(tmp_path)
    assert (loaded.count_block_heads, loaded.count_block_num_heads, loaded.decoder_attention_heads) == (64, 64, 8)
    default = ScaleformerConfig()
    assert (default.count_block_heads, default.count_block_num_heads, default.count_block_head_width) == (64, 64, 2)
    assert (default.count_block_embeddings, default.count_block_embedding_dim, default.count_block_layer_scale,
            default.remaining_count_max) == (True, 32, 0.1, 3)
    assert (loaded.count_block_head_dim, loaded.count_block_head_width) == (None, 8)  # d_model 512 / 64 heads
    ScaleformerConfig(**dict(BARE, **COUNT_BLOCK, count_block_heads=100, count_block_head_dim=2)).save_pretrained(
        tmp_path)
    loaded = ScaleformerConfig.from_pretrained(tmp_path)
    assert (loaded.count_block_num_heads, loaded.count_block_head_dim, loaded.count_block_head_width) == (100, 2, 2)


def test_other_decoders_take_the_count_blocks_defaults_and_its_off_values(tiny_config, batch):
    """Under another `decoder_attention` the count block's fields may keep their defaults or be off (None, False),
    and with the block and the remaining counts off the model takes `inputs_embeds` like BART."""
    assert not tiny_config(**dict(DEFAULT_DECODER, decoder_attention="separate")).has_count_block
    config = tiny_config(**dict(DEFAULT_DECODER, decoder_attention="separate", count_block_embeddings=False,
                                remaining_count_max=None))
    assert not config.counts_source_ids
    model = ScaleformerForConditionalGeneration(config).double().eval()
    src, src_mask = batch()
    tgt, _ = batch(b=3, ls=5, seed=1)
    embed = model.get_input_embeddings()
    expected = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    got = model(inputs_embeds=embed(src), attention_mask=src_mask, decoder_inputs_embeds=embed(tgt)).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs `input_ids`|`count_block_embeddings=True`|remaining_count_max"):
        ScaleformerForConditionalGeneration(tiny_config(**DEFAULT_DECODER)).eval()(inputs_embeds=embed(src),
                                                                                  decoder_input_ids=tgt)


def test_count_layer_of_a_normalised_type_is_the_count_attention(tiny_config):
    """With the default attention type, the first decoder layer's attention is `COUNT_ATTENTION` (its decay rates
    initialised in its own range), the other layers and the encoder keep the configured type, and the configuration
    itself is unchanged."""
    config = tiny_config(**DEFAULT_COUNT)
    model = ScaleformerForConditionalGeneration(config).eval()
    decoder = model.model.decoder
    first, second = decoder.layers[0].self_attn, decoder.layers[1].self_attn
    assert (first.attention_type, first.options) == ("kernelized_gated", {"feature_map": "relu"})
    assert decoder.layers[0].encoder_attn.attention_type == "kernelized_gated"
    assert set(first.parameter_specs) == set(decoder.layers[0].encoder_attn.parameter_specs) == {"decay"}
    assert second.attention_type == model.model.encoder.layers[0].self_attn.attention_type == "local_softmax_decay"
    assert not hasattr(decoder.layers[0], "encoder_attn_layer_norm") and hasattr(decoder.layers[1], "encoder_attn_layer_norm")
    rates = F.softplus(first.decay.detach())
    torch.testing.assert_close(rates.max(), torch.tensor(COUNT_ATTENTION["decay_rate_range"][0]))
    torch.testing.assert_close(rates.min(), torch.tensor(COUNT_ATTENTION["decay_rate_range"][1]))
    assert F.softplus(second.decay.detach()).max() > 0.1  # the configured range, (1/4, 1/256)
    assert (config.attention_type, config.feature_map) == ("local_softmax_decay", "elu")


@pytest.mark.parametrize(
    "overrides, first, others",
    [
        pytest.param({}, False, False, id="separate"),
        pytest.param(JOINT, True, True, id="joint"),
        pytest.param(COUNT, True, True, id="count-gated"),
        pytest.param(DEFAULT_COUNT, True, False, id="count-default-type"),
        pytest.param(dict(DEFAULT_COUNT, attention_type="softmax"), True, False, id="count-softmax"),
        pytest.param(COUNT_BLOCK, False, False, id="count-block"),
    ],
)
def test_joint_decoder_layers_names_the_layers_built(overrides, first, others, tiny_config, tmp_path):
    """`config.joint_decoder_layers` says whether the decoder layers after the first are joint; the first is also
    joint when it is a count layer. The property is derived, not saved."""
    config = tiny_config(**overrides)
    layers = ScaleformerForConditionalGeneration(config).model.decoder.layers
    assert len(layers) > 1 and config.joint_decoder_layers == others
    assert [layer.joint for layer in layers] == [first] + [others] * (len(layers) - 1)
    config.save_pretrained(tmp_path)
    assert "joint_decoder_layers" not in ScaleformerConfig.from_pretrained(tmp_path).to_dict()


def counted_then_layer(layer, x, written, source, pre, encoder, source_states=None):
    """The expected output of `layer` (the first decoder layer with a count block) for the input `x`: x plus the
    count block's plain sums, written out (every written token up to i less every source token, weight
    relu(q).relu(k) at any distance, over the block's inputs `written` and `source` after its pre-norm, if any),
    then the layer without its count block."""
    attn = layer.count_attn
    n_heads = attn.num_heads

    def heads(t):
        return t.view(t.shape[0], t.shape[1], n_heads, t.shape[2] // n_heads).transpose(1, 2)

    q = F.relu(heads(attn.q_proj(written)))
    own = (q @ F.relu(heads(attn.k_proj(written))).transpose(-1, -2)).tril() @ heads(attn.v_proj(written))
    read = (q @ F.relu(heads(attn.k_proj(source))).transpose(-1, -2)) @ heads(attn.v_proj(source))
    counted = x + attn.finish(own - read, written)
    counted = counted if pre else layer.count_attn_layer_norm(counted)
    layer.count_attn = None  # the same layer without its count block
    try:
        return layer(counted, encoder, source_states)
    finally:
        layer.count_attn = attn


@pytest.mark.parametrize(
    "count_block_heads, head_dim",
    [(None, None), (8, None), (16, None), (3, 2), (12, 2)],
    ids=["decoder-heads", "8-heads", "16-heads", "3-heads-of-2", "12-heads-of-2"],
)
@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_count_block_is_the_count_sum_before_a_separate_layer(layer_norm_position, count_block_heads, head_dim,
                                                              tiny_config):
    """`decoder_attention="count_block"`: the first layer adds the count sum (queries on the written tokens less the
    source tokens, COUNT_BLOCK_ATTENTION: relu features, no decay, no positions) as one more residual block before its
    own self- and cross-attention, which keep the configured type and read the encoder output; the other layers have
    no count block. With `count_block_heads`, the block's sums are split into that many heads (the layer's own
    blocks keep `decoder_attention_heads`); with `count_block_head_dim` as well, the heads are that wide, the block
    projecting d_model (16) to heads * head_dim channels (6, 24) and back."""
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, layer_norm_position=layer_norm_position, count_block_heads=count_block_heads,
                         count_block_head_dim=head_dim)
    n_heads = count_block_heads or config.decoder_attention_heads
    width = n_heads * (head_dim or 16 // n_heads)
    model = randomised(ScaleformerForConditionalGeneration(config).double().eval())
    layer, second = model.model.decoder.layers[:2]
    assert second.count_attn is None and not layer.count and not layer.joint
    assert layer.count_attn.attention_type == layer.count_source.attention_type == "kernelized_sum"
    assert COUNT_BLOCK_ATTENTION["attention_type"] == "kernelized_sum"
    assert layer.self_attn.attention_type == layer.encoder_attn.attention_type == config.attention_type
    assert (layer.count_attn.layer_idx, layer.count_source.layer_idx) == (config.decoder_layers,) * 2
    assert list(layer.count_source.named_parameters()) == [] and not hasattr(layer.count_attn, "decay")
    x, source, encoder = (torch.randn(2, n, 16, dtype=torch.float64) for n in (7, 10, 10))
    pre = layer_norm_position == "pre"
    norm = layer.count_attn_layer_norm if pre else (lambda t: t)
    assert (layer.count_attn.num_heads, layer.self_attn.num_heads) == (n_heads, config.decoder_attention_heads)
    assert layer.count_attn.q_proj.weight.shape == (width, 16) and layer.count_attn.o_proj.weight.shape == (16, width)
    assert layer.self_attn.q_proj.weight.shape == (16, 16)
    expected = counted_then_layer(layer, x, norm(x), norm(source), pre, encoder, source)
    got = layer(x, encoder, source)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(layer(x, encoder + 1.0, source), got)  # the encoder output is read


def test_count_block_keeps_its_state_in_the_slot_after_the_layers(tiny_config, batch):
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK)
    model = ScaleformerForConditionalGeneration(config).eval()
    src, src_mask = batch()
    out = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=src[:, :3], use_cache=True)
    cache = out.past_key_values
    assert len(cache.layers) == config.decoder_layers + 1
    assert config.has_count_block and not tiny_config(**DEFAULT_COUNT).has_count_block
    assert config.count_block_cache_index == config.decoder_layers
    assert tiny_config(**DEFAULT_COUNT).count_block_cache_index is None
    assert all(layer.self_state is not None and layer.cross_summary is not None for layer in cache.layers)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError, match=r"`past_key_values` must have one layer per decoder layer and one for the count"):
        model(input_ids=src, attention_mask=src_mask, decoder_input_ids=src[:, :3],
              past_key_values=ScaleformerCache(config.decoder_layers))


@pytest.mark.parametrize("embedding_dim", [None, 4], ids=["table-of-d_model", "table-of-4"])
@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_count_block_with_its_own_embeddings(layer_norm_position, embedding_dim, tiny_config):
    """`count_block_embeddings=True`: the count block reads LayerNorm(count_embed_tokens(ids)) of the written and of
    the source tokens in place of the layer's input and the source states; the layer's input enters only through
    the residual. With `count_block_embedding_dim`, the table is that wide and `count_embed_proj` (no bias) maps it
    to d_model before the layer norm."""
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, count_block_embeddings=True, count_block_embedding_dim=embedding_dim,
                         layer_norm_position=layer_norm_position)
    model = randomised(ScaleformerForConditionalGeneration(config).double().eval())
    layer, second = model.model.decoder.layers[:2]
    width = embedding_dim or 16
    assert second.count_embed_tokens is None and layer.count_embed_tokens.weight.shape == (config.vocab_size, width)
    assert (layer.count_embed_proj is None) == (embedding_dim is None)
    if embedding_dim is not None:
        assert layer.count_embed_proj.weight.shape == (16, width) and layer.count_embed_proj.bias is None
    ids, source_ids = torch.randint(3, config.vocab_size, (2, 7)), torch.randint(3, config.vocab_size, (2, 10))
    x, encoder = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 10, 16, dtype=torch.float64)
    pre = layer_norm_position == "pre"
    block_norm = layer.count_attn_layer_norm if pre else (lambda t: t)

    def embedded(t):
        table = layer.count_embed_tokens.weight[t]
        return table if embedding_dim is None else table @ layer.count_embed_proj.weight.T

    written, source = (block_norm(layer.count_embed_layer_norm(embedded(t))) for t in (ids, source_ids))
    expected = counted_then_layer(layer, x, written, source, pre, encoder)
    got = layer(x, encoder, None, token_ids=ids, source_ids=source_ids)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # the shared embeddings of the source (`source_states`) are not read
    torch.testing.assert_close(layer(x, encoder, encoder, token_ids=ids, source_ids=source_ids), got, rtol=0, atol=0)
    assert not torch.allclose(layer(x, encoder, None, token_ids=ids, source_ids=source_ids.flip(1)[:, :9]), got)


def test_count_block_embeddings_need_token_ids_and_survive_save_and_load(tiny_config, batch, tmp_path):
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, count_block_embeddings=True)
    model = ScaleformerForConditionalGeneration(config).eval()
    src, src_mask = batch()
    tgt, _ = batch(ls=5, seed=1)
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    assert torch.equal(encoder_outputs.source_ids, src) and encoder_outputs.source_embeddings is None
    logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    model.save_pretrained(tmp_path)
    loaded = ScaleformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.count_block_embeddings
    torch.testing.assert_close(loaded(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits, logits,
                               rtol=0, atol=0)
    embeds = model.get_input_embeddings()(src)
    with pytest.raises(ValueError, match="the encoder needs `input_ids`, not `inputs_embeds`"):
        model(inputs_embeds=embeds, attention_mask=src_mask, decoder_input_ids=tgt)
    with pytest.raises(ValueError, match=r"the decoder needs `input_ids` \(`decoder_input_ids`\), not embeddings"):
        model(input_ids=src, attention_mask=src_mask, decoder_inputs_embeds=model.get_input_embeddings()(tgt))
    as_tuple = (encoder_outputs.last_hidden_state,)
    with pytest.raises(ValueError, match="`count_block_embeddings=True` needs `source_ids`"):
        model(encoder_outputs=as_tuple, attention_mask=src_mask, decoder_input_ids=tgt)
    # a plain tuple loses them: the input ids give them again
    torch.testing.assert_close(
        model(input_ids=src, encoder_outputs=as_tuple, attention_mask=src_mask, decoder_input_ids=tgt).logits, logits,
        rtol=0, atol=0)


def test_count_block_narrow_table_starts_at_unit_scale_learns_and_survives_save_and_load(tiny_config, batch, tmp_path):
    """`count_block_embedding_dim`: the narrow table starts at unit scale (its padding row at zero) and its map at
    `init_std / sqrt(width)`, so that their product has the scale of a table of d_model; both learn; trained values
    survive save and load, and resizing the embeddings resizes the narrow table."""
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, count_block_embeddings=True, count_block_embedding_dim=4, vocab_size=400,
                         init_std=0.05)
    model = ScaleformerForConditionalGeneration(config)
    layer = model.model.decoder.layers[0]
    table, proj = layer.count_embed_tokens.weight, layer.count_embed_proj.weight
    assert table[config.pad_token_id].abs().sum() == 0
    assert abs(table.std().item() - 1.0) < 0.1 and abs(proj.std().item() - 0.05 / 2) < 0.01
    assert abs(model.get_input_embeddings().weight.std().item() - 0.05) < 0.01  # the shared table is unchanged
    src, src_mask = batch()
    tgt, _ = batch(ls=5, seed=1)
    model(input_ids=src, attention_mask=src_mask, labels=tgt).loss.backward()
    assert table.grad.abs().sum() > 0 and proj.grad.abs().sum() > 0
    with torch.no_grad():
        proj.normal_()
    model.eval()
    logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    model.save_pretrained(tmp_path)
    loaded = ScaleformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.count_block_embedding_dim == 4
    assert torch.equal(loaded.model.decoder.layers[0].count_embed_proj.weight, proj)
    assert torch.equal(loaded.model.decoder.layers[0].count_embed_tokens.weight, table)
    torch.testing.assert_close(loaded(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits, logits,
                               rtol=0, atol=0)
    model.resize_token_embeddings(410)
    assert model.model.decoder.layers[0].count_embed_tokens.weight.shape == (410, 4)


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_count_block_zero_init_starts_as_the_identity_and_learns(layer_norm_position, tiny_config, batch, tmp_path):
    """`count_block_zero_init=True`: the block's output projection starts at zero, so that the first layer's
    output is that of the layer without the block (post-norm: on the block's layer norm of the input); its
    projection still gets a gradient; trained values survive save and load."""
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, count_block_zero_init=True, layer_norm_position=layer_norm_position)
    model = ScaleformerForConditionalGeneration(config).double()
    layer = model.model.decoder.layers[0]
    assert layer.count_attn.o_proj.weight.abs().sum() == 0 and layer.count_attn.o_proj.bias.abs().sum() == 0
    assert model.model.decoder.layers[1].self_attn.o_proj.weight.abs().sum() > 0
    layer.eval()
    x, encoder = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 10, 16, dtype=torch.float64)
    source = torch.randn(2, 10, 16, dtype=torch.float64)
    got = layer(x, encoder, source)
    count_attn, layer.count_attn = layer.count_attn, None
    block_input = layer.count_attn_layer_norm(x) if layer_norm_position == "post" else x
    torch.testing.assert_close(got, layer(block_input, encoder, None), rtol=1e-12, atol=1e-12)
    layer.count_attn = count_attn
    src, src_mask = batch()
    tgt, _ = batch(ls=5, seed=1)
    model.train()
    model(input_ids=src, attention_mask=src_mask, labels=tgt).loss.backward()
    assert layer.count_attn.o_proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        layer.count_attn.o_proj.weight.normal_()
    model.save_pretrained(tmp_path)
    loaded = ScaleformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.count_block_zero_init
    assert torch.equal(loaded.model.decoder.layers[0].count_attn.o_proj.weight.double(), layer.count_attn.o_proj.weight)
    default = ScaleformerForConditionalGeneration(tiny_config(**COUNT_BLOCK))
    assert default.model.decoder.layers[0].count_attn.o_proj.weight.abs().sum() > 0


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_count_block_layer_scale_scales_the_blocks_output_and_learns(layer_norm_position, tiny_config, batch,
                                                                     tmp_path):
    """`count_block_layer_scale=S`: the block's output is multiplied per channel by `count_layer_scale`, started at
    S: the first layer equals the layer without the scale whose output projection (weights and bias) is multiplied
    by the same channels' scale; the scale gets a gradient; trained values survive save and load."""
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, count_block_layer_scale=0.25, layer_norm_position=layer_norm_position)
    model = ScaleformerForConditionalGeneration(config).double()
    layer = model.model.decoder.layers[0]
    assert torch.equal(layer.count_layer_scale.detach(), torch.full((16,), 0.25, dtype=torch.float64))
    assert all(other.count_layer_scale is None for other in model.model.decoder.layers[1:])
    with torch.no_grad():
        layer.count_layer_scale.uniform_(0.1, 2.0)
    layer.eval()
    x, encoder = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 10, 16, dtype=torch.float64)
    source = torch.randn(2, 10, 16, dtype=torch.float64)
    got = layer(x, encoder, source)
    scale, layer.count_layer_scale = layer.count_layer_scale, None
    with torch.no_grad():
        layer.count_attn.o_proj.weight.mul_(scale[:, None])
        layer.count_attn.o_proj.bias.mul_(scale)
    torch.testing.assert_close(got, layer(x, encoder, source), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, layer(x, encoder, source * 2))  # the block's input matters
    with torch.no_grad():
        layer.count_attn.o_proj.weight.div_(scale[:, None])
        layer.count_attn.o_proj.bias.div_(scale)
    layer.count_layer_scale = scale
    src, src_mask = batch()
    tgt, _ = batch(ls=5, seed=1)
    model.train()
    model(input_ids=src, attention_mask=src_mask, labels=tgt).loss.backward()
    assert layer.count_layer_scale.grad.abs().sum() > 0
    model.save_pretrained(tmp_path)
    loaded = ScaleformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.count_block_layer_scale == 0.25
    assert torch.equal(loaded.model.decoder.layers[0].count_layer_scale.double(), layer.count_layer_scale)
    unscaled = ScaleformerForConditionalGeneration(tiny_config(**COUNT_BLOCK))
    assert unscaled.model.decoder.layers[0].count_layer_scale is None


def test_resize_token_embeddings_resizes_the_count_block_table(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(**COUNT_BLOCK, count_block_embeddings=True)).eval()
    table = model.model.decoder.layers[0].count_embed_tokens
    before = table.weight.detach().clone()
    model.resize_token_embeddings(70)
    table = model.model.decoder.layers[0].count_embed_tokens
    assert table.num_embeddings == model.get_input_embeddings().num_embeddings == model.config.vocab_size == 70
    torch.testing.assert_close(table.weight[: before.shape[0]], before, rtol=0, atol=0)
    src, src_mask = batch()
    src[0, 0] = 69  # a new token reaches the count block
    out = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=torch.tensor([[1, 69]] * src.shape[0]))
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_count_block_detach_passes_no_gradient_to_its_inputs(layer_norm_position, tiny_config):
    """`count_block_detach=True`: the first layer's output is unchanged, the source states (read only by the block)
    get no gradient, the layer's input gets only the gradient of the layer without the block's inputs (its
    residual and the blocks after), and the block's own parameters still learn."""
    torch.manual_seed(0)
    plain = randomised(ScaleformerForConditionalGeneration(
        tiny_config(**COUNT_BLOCK, layer_norm_position=layer_norm_position)).double().eval())
    detached = ScaleformerForConditionalGeneration(
        tiny_config(**COUNT_BLOCK, count_block_detach=True, layer_norm_position=layer_norm_position)).double().eval()
    detached.load_state_dict(plain.state_dict())
    encoder = torch.randn(2, 10, 16, dtype=torch.float64)
    x0, source0 = torch.randn(2, 7, 16, dtype=torch.float64), torch.randn(2, 10, 16, dtype=torch.float64)
    grads = {}
    for name, model in (("plain", plain), ("detached", detached)):
        x, source = x0.clone().requires_grad_(), source0.clone().requires_grad_()
        out = model.model.decoder.layers[0](x, encoder, source)
        out.pow(2).sum().backward()
        grads[name] = (out.detach(), x.grad, source.grad, model.model.decoder.layers[0].count_attn.q_proj.weight.grad)
    torch.testing.assert_close(grads["detached"][0], grads["plain"][0], rtol=0, atol=0)
    assert grads["detached"][2] is None and grads["plain"][2].abs().sum() > 0
    assert grads["detached"][3].abs().sum() > 0
    # the input's gradient: the same layer with the block's inputs as constants
    layer = plain.model.decoder.layers[0]
    x = x0.clone().requires_grad_()
    pre = layer_norm_position == "pre"
    norm = layer.count_attn_layer_norm if pre else (lambda t: t)
    with torch.no_grad():
        written, read = norm(x0), norm(source0)
    counted_then_layer(layer, x, written, read, pre, encoder, source0).pow(2).sum().backward()
    torch.testing.assert_close(grads["detached"][1], x.grad, rtol=1e-10, atol=1e-12)
    assert (grads["detached"][1] - grads["plain"][1]).abs().max() > 1e-6


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_count_block_own_embeddings_per_distinct_token_equal_per_position(layer_norm_position, tiny_config):
    """With its own table, the count block's inputs depend on the token id alone: kept as one row per distinct id
    (`TokenRows`) they give the same block, outputs and gradients, as the same embeddings per position
    (float64; repeated ids in the written and the source tokens, a padded source, a one-token target)."""
    torch.manual_seed(0)
    config = tiny_config(**COUNT_BLOCK, count_block_embeddings=True, count_block_heads=3, count_block_head_dim=2,
                         count_block_embedding_dim=4, count_block_layer_scale=0.5,
                         layer_norm_position=layer_norm_position)
    layer = randomised(ScaleformerForConditionalGeneration(config).double()).model.decoder.layers[0]
    encoder_mask = torch.ones(2, 9, dtype=torch.long)
    encoder_mask[1, 6:] = 0
    for target_length in (7, 1):
        x = torch.randn(2, target_length, 16, dtype=torch.float64)
        encoder = torch.randn(2, 9, 16, dtype=torch.float64)
        token_ids = torch.randint(4, 9, (2, target_length))
        source_ids = torch.randint(4, 9, (2, 9))
        written, source = layer.count_token_inputs(token_ids, source_ids)
        assert isinstance(written, TokenRows) and written.rows.shape[0] <= 5  # one row per distinct id

        def per_position(token_ids, source_ids):
            return tuple(layer.norm_input(layer.count_embed(ids), layer.count_attn_layer_norm)
                         for ids in (token_ids, source_ids))

        outputs, grads = [], []
        for inputs in (None, per_position):
            layer.zero_grad()
            with mock.patch.object(layer, "count_token_inputs", inputs or layer.count_token_inputs):
                out = layer(x, encoder, None, encoder_key_mask=encoder_mask, token_ids=token_ids,
                            source_ids=source_ids)
            out.pow(2).sum().backward()
            outputs.append(out)
            grads.append({name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None})
        torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)
        assert grads[0].keys() == grads[1].keys() and "count_embed_tokens.weight" in grads[0]
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-10, atol=1e-12, msg=name)
