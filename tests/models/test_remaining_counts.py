"""The remaining counts of the written tokens (`remaining_count_max`): the counting functions against loops, the
decoder's embedding of them in one call and in cached pieces, generation with and without the cache, save and
load, and the errors."""

import pytest
import torch

from modeling_scaleformer import ScaleformerConfig, ScaleformerForCausalLM, ScaleformerForConditionalGeneration
from modeling_scaleformer.cache import ScaleformerCache
from modeling_scaleformer.layers import remaining_counts, running_token_counts, source_token_counts


@pytest.fixture
def tiny_config(tiny_config):
    """The models' tiny configuration with BART's decoder layers (`decoder_attention="separate"`; the default adds
    the count block), so that the remaining counts are tested alone unless a test sets `decoder_attention`."""
    return lambda **overrides: tiny_config(**{"decoder_attention": "separate", **overrides})


def naive_remaining(source, source_mask, tokens, token_mask):
    """Per kept written position: kept source positions with its id minus kept written positions up to it with its
    id; 0 at the positions that are not kept."""
    out = torch.zeros_like(tokens)
    for b in range(tokens.shape[0]):
        for i in range(tokens.shape[1]):
            if token_mask[b, i]:
                t = tokens[b, i].item()
                in_source = sum(1 for j in range(source.shape[1]) if source_mask[b, j] and source[b, j].item() == t)
                written = sum(1 for j in range(i + 1) if token_mask[b, j] and tokens[b, j].item() == t)
                out[b, i] = in_source - written
    return out


def random_ids(b, length, vocab, seed, padding="random"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, length), generator=g)
    if padding == "none":
        mask = torch.ones(b, length, dtype=torch.long)
    else:
        mask = (torch.rand(b, length, generator=g) > 0.3).long()
    return ids, mask


@pytest.mark.parametrize("length", [1, 2, 7, 40])
@pytest.mark.parametrize("padding", ["none", "random"])
def test_running_token_counts_equal_a_loop(length, padding):
    ids, mask = random_ids(3, length, 5, seed=length, padding=padding)  # 5 ids: many repeats
    counts = running_token_counts(ids, None if padding == "none" else mask)
    expected = torch.zeros_like(ids)
    for b in range(ids.shape[0]):
        for i in range(length):
            if mask[b, i]:
                expected[b, i] = sum(1 for j in range(i + 1) if mask[b, j] and ids[b, j] == ids[b, i])
    torch.testing.assert_close(counts, expected, rtol=0, atol=0)


@pytest.mark.parametrize("pieces", [[12], [1] * 12, [5, 1, 6]])
def test_remaining_counts_in_pieces_equal_the_loop(pieces):
    """The counts carried from piece to piece (as the cache carries them) give the remaining counts of the whole."""
    source, source_mask = random_ids(4, 15, 6, seed=1)
    tokens, token_mask = random_ids(4, 12, 6, seed=2)
    counts = source_token_counts(source, source_mask, vocab_size=6)
    parts, start = [], 0
    for n in pieces:
        remaining, counts = remaining_counts(tokens[:, start : start + n], counts, token_mask[:, start : start + n])
        parts.append(remaining * token_mask[:, start : start + n])
        start += n
    expected = naive_remaining(source, source_mask, tokens, token_mask)
    torch.testing.assert_close(torch.cat(parts, 1), expected, rtol=0, atol=0)
    assert expected.min() < 0 < expected.max()  # over-written and still to write both occur
    final = source_token_counts(source, source_mask, 6) - source_token_counts(tokens, token_mask, 6)
    torch.testing.assert_close(counts, final, rtol=0, atol=0)


def record_buckets(model):
    """The indices that the decoder's `remaining_count_embed` is called with, per call."""
    calls = []
    model.model.decoder.remaining_count_embed.register_forward_hook(lambda m, args, out: calls.append(args[0]))
    return calls


@pytest.mark.parametrize("padding", ["left", "right"])
def test_decoder_embeds_the_clamped_remaining_counts(padding, tiny_config, batch):
    """One call and cached pieces embed clamp(remaining, -1, K) + 1 at every kept written position, the remaining
    counts of the loop (ids drawn from few values, so that counts above K and below 0 occur)."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(remaining_count_max=2)).double().eval()
    src, src_mask = batch(vocab=8, ls=14, padding=padding)
    tgt, tgt_mask = batch(vocab=8, ls=9, padding=padding, seed=1)
    expected = naive_remaining(src, src_mask, tgt, tgt_mask).clamp(-1, 2) + 1
    assert {0, 3} <= set(expected[tgt_mask.bool()].tolist())
    calls = record_buckets(model)
    full = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    torch.testing.assert_close(calls[0][tgt_mask.bool()], expected[tgt_mask.bool()], rtol=0, atol=0)
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    cache, logits, start = None, [], 0
    for n in (3, 1, 5):
        out = model(
            encoder_outputs=encoder_outputs, attention_mask=src_mask, decoder_input_ids=tgt[:, start : start + n],
            decoder_attention_mask=tgt_mask[:, : start + n], past_key_values=cache, use_cache=True,
        )
        cache, start = out.past_key_values, start + n
        logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9)
    pieces = torch.cat(calls[1:], 1)
    torch.testing.assert_close(pieces[tgt_mask.bool()], expected[tgt_mask.bool()], rtol=0, atol=0)
    # the cache holds the counts per token id after the last token: vocab_size integers per row
    assert cache.layers[0].token_counts.shape == (src.shape[0], 60)
    assert cache.nbytes >= src.shape[0] * 60 * 8


def test_remaining_count_embeddings_change_the_output(tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(remaining_count_max=2)).double().eval()
    src, src_mask = batch(vocab=8, ls=14)
    tgt, _ = batch(vocab=8, ls=9, padding="right", seed=1)
    assert (naive_remaining(src, src_mask, tgt, torch.ones_like(tgt)) < 0).any()
    before = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    with torch.no_grad():
        model.model.decoder.remaining_count_embed.weight[0].normal_()  # over-written tokens only
    after = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize(
    "overrides",
    [dict(remaining_count_max=2),
     dict(decoder_attention="count_block", count_block_embeddings=True, count_block_heads=8,
          count_block_layer_scale=0.1, remaining_count_max=3)],
    ids=["remaining-counts", "with-count-block"],
)
@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(num_beams=3, do_sample=False)], ids=["greedy", "beam"])
def test_generate_same_with_and_without_cache(kwargs, overrides, tiny_config, batch):
    """Beam search reorders the counts with the rest of the cache."""
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(**overrides, layer_norm_position="pre")).eval()
    src, src_mask = batch(vocab=12)
    results = [
        model.generate(src, attention_mask=src_mask, max_new_tokens=10, use_cache=use_cache, **kwargs)
        for use_cache in (True, False)
    ]
    assert torch.equal(results[0], results[1])
    assert len(set(results[0][:, 1:].flatten().tolist())) > 1


def test_cache_reorders_and_resets_the_counts():
    cache = ScaleformerCache(2)
    counts = torch.arange(12).view(3, 4)
    cache.layers[0].token_counts = counts
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.layers[0].token_counts, counts[[2, 2, 0]])
    assert cache.nbytes == 12 * 8
    cache.layers[0].reset()
    assert cache.layers[0].token_counts is None


def test_save_and_load_keep_the_remaining_count_embeddings(tmp_path, tiny_config, batch):
    torch.manual_seed(0)
    model = ScaleformerForConditionalGeneration(tiny_config(remaining_count_max=3)).eval()
    model.save_pretrained(tmp_path)
    loaded = ScaleformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.remaining_count_max == 3
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    a = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    b = loaded(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(a, b)


def test_errors(tiny_config, batch):
    model = ScaleformerForConditionalGeneration(tiny_config(remaining_count_max=2)).eval()
    src, src_mask = batch()
    tgt, _ = batch(ls=9, padding="right", seed=1)
    with pytest.raises(ValueError, match="`remaining_count_max=2`: the decoder reads the source token ids, so the "
                                         "encoder needs `input_ids`"):
        model(inputs_embeds=model.model.shared(src), attention_mask=src_mask, decoder_input_ids=tgt)
    with pytest.raises(ValueError, match=r"the decoder needs `input_ids` \(`decoder_input_ids`\), not embeddings"):
        model(input_ids=src, attention_mask=src_mask, decoder_inputs_embeds=model.model.shared(tgt))
    encoder = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    with pytest.raises(ValueError, match="`remaining_count_max=2` needs `source_ids`"):
        model.model.decoder(input_ids=tgt, encoder_hidden_states=encoder.last_hidden_state,
                            encoder_attention_mask=src_mask)
    # huggingface_hub wraps the config's ValueError and TypeError in its own errors
    for value in (0, -1):
        with pytest.raises(Exception, match="`remaining_count_max` must be a positive int or None"):
            ScaleformerConfig(remaining_count_max=value)
    with pytest.raises(Exception, match="remaining_count_max"):
        ScaleformerConfig(remaining_count_max=1.5)
    # a decoder-only model has no source: it ignores the field
    assert ScaleformerForCausalLM(tiny_config(remaining_count_max=2)).model.remaining_count_embed is None
