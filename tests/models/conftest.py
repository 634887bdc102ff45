"""Fixtures of the model tests: a tiny Scaleformer configuration and padded batches, as factories."""

import pytest
import torch

from modeling_scaleformer import ScaleformerConfig


def make_tiny_config(**overrides) -> ScaleformerConfig:
    kwargs = dict(
        vocab_size=60, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, rpe_horizon=3, dropout=0.0,
        init_std=0.3,  # large enough that greedy decoding of a random model is not one repeated token
    )
    kwargs.update(overrides)
    return ScaleformerConfig(**kwargs)


def make_batch(vocab=60, b=3, ls=11, padding="left", seed=0):
    """Random ids (b, ls) with row 1 padded by 4 and row 2 by 1 position, on the left or the right."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, ls), generator=g)
    mask = torch.ones(b, ls, dtype=torch.long)
    for row, n in ((1, 4), (2, 1)):
        if row < b:
            mask[row, :n] = 0 if padding == "left" else 1
            mask[row, ls - n :] = 1 if padding == "left" else 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.fixture
def tiny_config():
    """`tiny_config(**overrides)`: a 2+2-layer, d_model 16 configuration without dropout."""
    return make_tiny_config


@pytest.fixture
def batch():
    """`batch(vocab, b, ls, padding, seed)`: random ids and their attention mask, two rows padded."""
    return make_batch


def decode_in_pieces(model, padding: str):
    """Checks that `model` (a seq2seq model in float64) decodes a padded batch of 9 target tokens with its cache, one
    token at a time and in pieces of 4, 1, 3 and 1, to the logits of one forward over the whole target (teacher
    forcing), to 1e-9. Returns the last cache."""
    src, src_mask = make_batch(padding=padding)
    tgt, tgt_mask = make_batch(ls=9, padding=padding, seed=1)
    full = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=src_mask)
    for pieces in ([1] * 9, [4, 1, 3, 1]):
        cache, logits, start = None, [], 0
        for n in pieces:
            out = model(
                encoder_outputs=encoder_outputs, attention_mask=src_mask,
                decoder_input_ids=tgt[:, start : start + n], decoder_attention_mask=tgt_mask[:, : start + n],
                past_key_values=cache, use_cache=True,
            )
            cache, start = out.past_key_values, start + n
            logits.append(out.logits)
        torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-9, msg=lambda m: f"{pieces}: {m}")
    return cache


@pytest.fixture
def cached_decoding():
    """`cached_decoding(model, padding)`: cached decoding in pieces held to teacher forcing (`decode_in_pieces`);
    returns the last cache."""
    return decode_in_pieces


@pytest.fixture
def attention_outside_the_graph(monkeypatch):
    """The list that collects the attention type of every call `ScaleformerAttention` keeps from torch.compile
    (`_attend_eagerly`, run outside the graph)."""
    from modeling_scaleformer.layers import ScaleformerAttention

    calls = []
    attend_eagerly = ScaleformerAttention._attend_eagerly
    monkeypatch.setattr(ScaleformerAttention, "_attend_eagerly", torch.compiler.disable(
        lambda self, *args: calls.append(self.attention_type) or attend_eagerly(self, *args)))
    return calls
