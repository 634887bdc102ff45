"""Scaleformer models: encoder-decoder and decoder-only transformers with linear relative attention."""

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
    SequenceClassifierOutput,
)
from transformers.utils import logging
from transformers.utils.generic import can_return_tuple

from .cache import ScaleformerCache
from .configuration_scaleformer import ScaleformerConfig
from .layers import (
    ScaleformerAttention, ScaleformerFeedForward, TokenRows, remaining_counts, source_token_counts,
)
from .ops_common import checks_values, compute_dtype
from .ops_registry import decay_spectrum, get_attention_variant, inverse_softplus, rotary_spectrum


logger = logging.get_logger(__name__)


def shift_tokens_right(input_ids: Tensor, pad_token_id: int, decoder_start_token_id: int) -> Tensor:
    """Decoder inputs from labels: prepend the start token, drop the last label, -100 -> pad."""
    if decoder_start_token_id is None or pad_token_id is None:
        raise ValueError("`config.decoder_start_token_id` and `config.pad_token_id` must be set to shift labels")
    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def check_labels(labels: Tensor, vocab_size: int, what: str = "token ids", name: str = "labels") -> None:
    """Raise ValueError naming `name` unless every label is in [0, vocab_size) or -100. Values are read on CPU
    only (`ops_common.checks_values`): on an accelerator the check would wait for the device in every training
    step, and the loss's own kernels reject out-of-range ids there."""
    if not checks_values(labels):
        return
    invalid = (labels >= vocab_size) | ((labels < 0) & (labels != -100))
    if bool(invalid.any()):
        bad = labels[invalid][0].item()
        raise ValueError(f"`{name}` must be {what} in [0, {vocab_size}) or -100 (ignored), found {bad}")


def first_kept_at_0(mask: Tensor, *tensors: Tensor | None) -> list[Tensor | None]:
    """`tensors` (batch, length, ...) rolled along the length, batch row by batch row, so that the first token that
    `mask` (batch, length) keeps sits at position 0 (a row without one stays as it is). Cross attention's relative
    positions (decoder position minus encoder position) then count the source from its first kept token, so that a
    source padded on the left reads as the same source padded on the right, and as the source alone."""
    batch, length = mask.shape
    first = mask.bool().int().argmax(-1)  # 0 for a row without a kept token
    index = (torch.arange(length, device=mask.device) + first[:, None]) % length  # (batch, length)
    return [None if t is None else t.gather(1, index.view(batch, length, *(1,) * (t.dim() - 2)).expand_as(t))
            for t in tensors]


def check_mask(mask: Tensor | None, name: str, batch: int, lengths: tuple[int, ...]) -> None:
    if mask is None:
        return
    if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] not in lengths:
        expected = " or ".join(f"({batch}, {n})" for n in dict.fromkeys(lengths))
        raise ValueError(f"`{name}` must have shape {expected}, got {tuple(mask.shape)}")


def sinusoidal_positions(positions: Tensor, dim: int, std: float, dtype: torch.dtype) -> Tensor:
    """Sine/cosine encodings (Vaswani et al.) of integer `positions` (B, L) -> (B, L, dim): coordinate 2i is
    sin(p / 10000^(2i/dim)), 2i+1 the cosine of the same angle; scaled so that each coordinate has standard
    deviation `std` over positions. Computed in float32 (float64 for float64 `dtype`), returned in `dtype`."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inverse = 10000.0 ** (-torch.arange(0, dim, 2, dtype=work, device=positions.device) / dim)
    angles = positions.to(work)[..., None] * inverse
    encoding = torch.empty(*positions.shape, dim, dtype=work, device=positions.device)
    encoding[..., 0::2] = torch.sin(angles)
    encoding[..., 1::2] = torch.cos(angles[..., : dim // 2])
    return (encoding * (std * math.sqrt(2.0))).to(dtype)


def check_no_attention_outputs(kwargs: dict, config: ScaleformerConfig) -> None:
    """`output_attentions` (the argument, or `config.output_attentions` when it is None) must be off."""
    output_attentions = kwargs.get("output_attentions")
    if output_attentions is None:
        output_attentions = config.output_attentions
    if output_attentions:
        raise ValueError(
            "`output_attentions=True` (or `config.output_attentions=True`) is not supported: linear attention "
            "never forms the attention matrix"
        )


@dataclass
class ScaleformerEncoderOutput(BaseModelOutput):
    """`BaseModelOutput` plus `source_embeddings` (B, L, d_model): the encoder's input embeddings, before
    positions, which the first decoder layer reads with `config.decoder_attention` `"count"` or `"count_block"`
    (None otherwise); with `config.count_block_embeddings`, `source_ids` (B, L) instead: the source token ids,
    which the count block embeds with its own table."""

    source_embeddings: torch.FloatTensor | None = None
    source_ids: torch.LongTensor | None = None


class ScaleformerLayer(GradientCheckpointingLayer):
    """A block of sublayers, each wrapped in a residual connection with dropout and a layer norm: pre-norm
    (`config.layer_norm_position="pre"`) normalises a sublayer's input, x + dropout(f(norm(x))); post-norm
    normalises the sum, norm(x + dropout(f(x))), as BART does."""

    def __init__(self, config: ScaleformerConfig):
        super().__init__()
        self.dropout = nn.Dropout(config.dropout)
        self.post_norm = config.layer_norm_position == "post"

    def norm_input(self, hidden_states: Tensor, norm: nn.LayerNorm) -> Tensor:
        return hidden_states if self.post_norm else norm(hidden_states)

    def norm_output(self, hidden_states: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(hidden_states) if self.post_norm else hidden_states


class ScaleformerEncoderLayer(ScaleformerLayer):
    """Bidirectional self-attention, then feed-forward."""

    def __init__(self, config: ScaleformerConfig, layer_idx: int):
        super().__init__(config)
        self.self_attn = ScaleformerAttention(config, config.encoder_attention_heads, is_causal=False, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = ScaleformerFeedForward(config, config.encoder_ffn_dim)
        self.ffn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None = None) -> Tensor:
        # self-attention
        residual = hidden_states
        hidden_states = self.self_attn(self.norm_input(hidden_states, self.self_attn_layer_norm), key_mask=key_mask)
        hidden_states = self.norm_output(residual + self.dropout(hidden_states), self.self_attn_layer_norm)

        # feed-forward
        residual = hidden_states
        hidden_states = self.ffn(self.norm_input(hidden_states, self.ffn_layer_norm))
        return self.norm_output(residual + self.dropout(hidden_states), self.ffn_layer_norm)


# the attention of the count layer (`decoder_attention="count"`) when `attention_type` has a row normaliser:
# unnormalised sums without relative terms, a feature map that can give a key no weight, and almost no decay
# (half-lives of 6,900 to 69,000 positions, the layer's only position information), so that the sum over the
# source and the sum over the written tokens keep their counts
COUNT_ATTENTION = {
    "attention_type": "kernelized_gated",
    "feature_map": "relu",
    "decay_rate_range": (1e-4, 1e-5),
    "cross_attention_rpe": True,
}
# the attention of the count block (`decoder_attention="count_block"`) when `attention_type` has a row normaliser:
# the same sums with no decay at all, so that they are the counts at any length
COUNT_BLOCK_ATTENTION = {
    "attention_type": "kernelized_sum",
    "feature_map": "relu",
    "cross_attention_rpe": True,
}


def count_attention_config(config: ScaleformerConfig, attention: dict[str, object]) -> ScaleformerConfig:
    """The configuration of a count sum's attention: `config` itself for an attention type without a row
    normaliser, else a copy with the fields of `attention` (`COUNT_ATTENTION` or `COUNT_BLOCK_ATTENTION`)."""
    if not get_attention_variant(config.attention_type).normalised:
        return config
    count_config = copy.copy(config)
    for name, value in attention.items():
        setattr(count_config, name, value)
    return count_config


def one_sum(
    attention: ScaleformerAttention, source_attention: ScaleformerAttention, hidden_states: Tensor,
    source: Tensor | None, *, counting: bool, key_mask: Tensor | None, encoder_key_mask: Tensor | None,
    past_key_values: ScaleformerCache | None, query_offset: int,
) -> Tensor:
    """The queries of `attention` on the written tokens `hidden_states` (causal, with `attention`'s keys) and on
    `source` (with `source_attention`'s variant), the two unnormalised sums added before `attention`'s output
    norm, gate and projection. With `counting`, `source` holds source tokens read as written ones: `attention`'s
    key projection and its value projection negated. `source` is None once the cache holds its summary."""
    q = attention.query(hidden_states)
    projections = (attention.k_proj, lambda x: -attention.v_proj(x)) if counting else None
    attended = attention.read(q, hidden_states, key_mask, past_key_values) + source_attention.read(
        q, source, encoder_key_mask, past_key_values, query_offset, projections
    )
    return attention.finish(attended, hidden_states)


class ScaleformerDecoderLayer(ScaleformerLayer):
    """Causal self-attention, cross-attention (encoder-decoder only), then feed-forward.

    With `config.decoder_attention="joint"` (encoder-decoder only), self- and cross-attention are one
    attention: the queries of `self_attn` read the decoder's own keys and the encoder's (`encoder_attn`, which
    then has only key and value projections and its relative positions), and the two unnormalised sums are
    added before the one output norm, gate and projection. Counts over the source and over what has been
    written meet in one sum, so that their difference is kept at any length.

    With `config.decoder_attention="count"`, the first layer is joint and its source part reads `source_states`
    (the source token embeddings, prepared as the decoder's own) through `self_attn`'s key projection and its
    value projection negated: a source token and the same token written get the same key and opposite values,
    so that the sum holds, per token, the number written minus the number in the source (weighted by the
    relative terms and the decay, if any, which differ between the two parts only in the positions). When
    `attention_type` has a row normaliser, that layer's attention is `COUNT_ATTENTION` and the other layers
    are separate.

    With `config.decoder_attention="count_block"`, every layer is separate and the first has one more block
    before its self-attention, `count_attn` with `count_source`: the same sum as the count layer's, in a block of
    its own (`COUNT_BLOCK_ATTENTION`, the sum without decay, for a type with a row normaliser), whose generation
    state is the cache slot after the layers'. With `config.count_block_embeddings`, the block reads the written
    and the source tokens (`token_ids`, `source_ids`) through its own embedding table `count_embed_tokens` (a
    narrower one mapped to `d_model` by `count_embed_proj` with `config.count_block_embedding_dim`) and a layer
    norm, in place of the layer's input and `source_states`. With `config.count_block_zero_init` the
    block's output projection starts at zero (its `zero_init`, read by `_init_weights`). With
    `config.count_block_head_dim` its heads are that wide, whatever `d_model`; with `config.count_block_detach` it
    reads its inputs detached, so that they get no gradient from it; with `config.count_block_layer_scale` its
    output is multiplied by `count_layer_scale`, a learned scale per channel started at that value.
    """

    def __init__(self, config: ScaleformerConfig, layer_idx: int):
        super().__init__(config)
        heads = config.decoder_attention_heads
        self.count = config.is_encoder_decoder and config.decoder_attention == "count" and layer_idx == 0
        self.joint = self.count or (config.is_encoder_decoder and config.joint_decoder_layers)
        attention_config = count_attention_config(config, COUNT_ATTENTION) if self.count else config
        self.self_attn = ScaleformerAttention(attention_config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = None
        if config.is_encoder_decoder:
            self.encoder_attn = ScaleformerAttention(
                attention_config, heads, is_causal=False, is_cross_attention=True, layer_idx=layer_idx,
                keys_only=self.joint, own_keys=not self.count,
            )
        if config.is_encoder_decoder and not self.joint:
            self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.count_attn = self.count_source = self.count_embed_tokens = self.count_embed_proj = None
        self.count_layer_scale = None
        if config.has_count_block and layer_idx == 0:
            count_config = count_attention_config(config, COUNT_BLOCK_ATTENTION)
            slot = config.count_block_cache_index
            count_heads = dict(num_heads=config.count_block_num_heads, head_dim=config.count_block_head_width)
            self.count_attn = ScaleformerAttention(count_config, **count_heads, is_causal=True, layer_idx=slot)
            self.count_source = ScaleformerAttention(
                count_config, **count_heads, is_causal=False, is_cross_attention=True, layer_idx=slot, keys_only=True,
                own_keys=False,
            )
            self.count_attn.o_proj.zero_init = config.count_block_zero_init  # read by `_init_weights`
            self.count_detach = config.count_block_detach
            self.count_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.count_block_layer_scale is not None:  # started at that value by `_init_weights`
                self.count_layer_scale = nn.Parameter(torch.full((config.d_model,), config.count_block_layer_scale))
            if config.count_block_embeddings:
                width = config.count_block_embedding_dim or config.d_model
                self.count_embed_tokens = nn.Embedding(config.vocab_size, width, config.pad_token_id)
                if config.count_block_embedding_dim is not None:  # a narrow table, at unit scale, then d_model
                    self.count_embed_tokens.init_std = 1.0  # read by `_init_weights`
                    self.count_embed_proj = nn.Linear(width, config.d_model, bias=False)
                    self.count_embed_proj.init_std = config.init_std / math.sqrt(width)
                self.count_embed_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = ScaleformerFeedForward(config, config.decoder_ffn_dim)
        self.ffn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        source_states: Tensor | None = None,
        key_mask: Tensor | None = None,
        encoder_key_mask: Tensor | None = None,
        past_key_values: ScaleformerCache | None = None,
        query_offset: int = 0,
        token_ids: Tensor | None = None,
        source_ids: Tensor | None = None,
    ) -> Tensor:
        reads = dict(key_mask=key_mask, encoder_key_mask=encoder_key_mask, past_key_values=past_key_values,
                     query_offset=query_offset)
        # the count block (`decoder_attention="count_block"`), before the layer's own attention blocks
        if self.count_attn is not None:
            residual = hidden_states
            if self.count_embed_tokens is not None:  # the block's own embeddings of the written and source tokens
                written, source = self.count_token_inputs(token_ids, source_ids)
            else:
                written, source = hidden_states, source_states  # source: None once the cache holds its summary
                if self.count_detach:  # only the block's own parameters learn from its output
                    written, source = written.detach(), None if source is None else source.detach()
                written = self.norm_input(written, self.count_attn_layer_norm)
                source = None if source is None else self.norm_input(source, self.count_attn_layer_norm)
            hidden_states = one_sum(self.count_attn, self.count_source, written, source, counting=True, **reads)
            if self.count_layer_scale is not None:
                hidden_states = hidden_states * self.count_layer_scale
            hidden_states = self.norm_output(residual + self.dropout(hidden_states), self.count_attn_layer_norm)

        # causal self-attention, continuing the cached state when there is one
        residual = hidden_states
        hidden_states = self.norm_input(hidden_states, self.self_attn_layer_norm)
        if self.joint:  # the same queries on the decoder's keys and on the encoder's, one sum
            source = encoder_hidden_states
            if self.count:  # the source tokens as written ones, with the opposite sign
                source = None if source_states is None else self.norm_input(source_states, self.self_attn_layer_norm)
            hidden_states = one_sum(
                self.self_attn, self.encoder_attn, hidden_states, source, counting=self.count, **reads
            )
        else:
            hidden_states = self.self_attn(hidden_states, key_mask=key_mask, past_key_values=past_key_values)
        hidden_states = self.norm_output(residual + self.dropout(hidden_states), self.self_attn_layer_norm)

        # cross-attention over the encoder output
        if self.encoder_attn is not None and not self.joint:
            residual = hidden_states
            hidden_states = self.encoder_attn(
                self.norm_input(hidden_states, self.encoder_attn_layer_norm),
                key_value_states=encoder_hidden_states,
                key_mask=encoder_key_mask,
                past_key_values=past_key_values,
                query_offset=query_offset,
            )
            hidden_states = self.norm_output(residual + self.dropout(hidden_states), self.encoder_attn_layer_norm)

        # feed-forward
        residual = hidden_states
        hidden_states = self.ffn(self.norm_input(hidden_states, self.ffn_layer_norm))
        return self.norm_output(residual + self.dropout(hidden_states), self.ffn_layer_norm)

    def count_token_inputs(
        self, token_ids: Tensor, source_ids: Tensor | None
    ) -> tuple[Tensor | TokenRows, Tensor | TokenRows | None]:
        """The count block's inputs from its own embeddings (`config.count_block_embeddings`) of the written tokens
        `token_ids` and the source tokens `source_ids` (None once the cache holds their summary). They depend on
        the token id alone, so on CPU they are kept as one row per distinct id of the batch (`TokenRows`) and each
        of the block's projections costs those rows instead of every position; on CUDA, where `torch.unique`
        would wait for the device in every step, they are embedded per position."""
        if token_ids.is_cuda:
            written, source = (
                None if ids is None else self.norm_input(self.count_embed(ids), self.count_attn_layer_norm)
                for ids in (token_ids, source_ids)
            )
            return written, source
        ids = token_ids.reshape(-1)
        if source_ids is not None:
            ids = torch.cat([ids, source_ids.reshape(-1)])
        distinct, index = torch.unique(ids, return_inverse=True)
        rows = self.norm_input(self.count_embed(distinct), self.count_attn_layer_norm)
        written = TokenRows(rows, index[: token_ids.numel()].view(token_ids.shape))
        source = None if source_ids is None else TokenRows(rows, index[token_ids.numel():].view(source_ids.shape))
        return written, source

    def count_embed(self, ids: Tensor) -> Tensor:
        """The count block's own embeddings (`config.count_block_embeddings`) of the token ids `ids`: its table,
        mapped to `d_model` when the table is narrower (`config.count_block_embedding_dim`), then a layer norm."""
        embeddings = self.count_embed_tokens(ids)
        if self.count_embed_proj is not None:
            embeddings = self.count_embed_proj(embeddings)
        return self.count_embed_layer_norm(embeddings)


class ScaleformerPreTrainedModel(PreTrainedModel):
    config: ScaleformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["ScaleformerEncoderLayer", "ScaleformerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _is_stateful = True
    _can_compile_fullgraph = False

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """[`PreTrainedModel.resize_token_embeddings`], and the count block's own embedding table
        (`config.count_block_embeddings`) to the same number of tokens."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        for module in self.modules():
            if isinstance(module, ScaleformerDecoderLayer) and module.count_embed_tokens is not None:
                module.count_embed_tokens = self._get_resized_embeddings(
                    module.count_embed_tokens, embeddings.num_embeddings, mean_resizing=mean_resizing
                )
        return embeddings

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # the model builds its own ScaleformerCache in forward; key/value caches do not apply
        return False

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, nn.Linear) and getattr(module, "zero_init", False):  # `count_block_zero_init`
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        std = getattr(module, "init_std", None)  # `count_block_embedding_dim`: the narrow table and its map
        if isinstance(module, (nn.Embedding, nn.Linear)) and std is not None:
            loaded = getattr(module.weight, "_is_hf_initialized", False)  # a slice below would lose the flag
            init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None and not loaded:
                init.zeros_(module.weight[module.padding_idx])
        if isinstance(module, ScaleformerDecoderLayer) and module.count_layer_scale is not None:
            init.constant_(module.count_layer_scale, self.config.count_block_layer_scale)
        if isinstance(module, ScaleformerAttention):
            if module.out_norm is not None:
                init.ones_(module.out_norm.weight)
            for name, spec in module.parameter_specs.items():
                param = getattr(module, name)
                if spec.init == "normal":
                    init.normal_(param, mean=0.0, std=self.config.init_std)
                elif spec.init == "zeros":
                    init.zeros_(param)
                elif spec.init == "ones":
                    init.ones_(param)
                elif spec.init == "decay_rates":
                    rates = decay_spectrum(param.shape[0], module.decay_rate_range, param.dtype)
                    init.copy_(param, inverse_softplus(rates))
                else:  # "frequencies": the rotary spectrum along the head dimension
                    spectrum = rotary_spectrum(param.shape[1], param.dtype)
                    init.copy_(param, spectrum[None, :, None].expand(param.shape))


class ScaleformerStack(ScaleformerPreTrainedModel):
    """Token embeddings (absolute positions only if configured), a stack of layers and one more layer norm: on
    the output for pre-norm layers, on the embeddings for post-norm layers (as BART's `layernorm_embedding`)."""

    def __init__(self, config: ScaleformerConfig, layer_class: type[nn.Module], num_layers: int):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([layer_class(config, i) for i in range(num_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def _embed(self, input_ids: Tensor | None, inputs_embeds: Tensor | None, kwargs: dict) -> Tensor:
        check_no_attention_outputs(kwargs, self.config)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of `input_ids` and `inputs_embeds` to the {type(self).__name__}")
        if input_ids is not None and input_ids.dim() != 2:
            raise ValueError(f"the {type(self).__name__}'s `input_ids` must have shape (batch, length), got "
                             f"{tuple(input_ids.shape)}")
        if inputs_embeds is not None and (inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.d_model):
            raise ValueError(f"the {type(self).__name__}'s `inputs_embeds` must have shape (batch, length, "
                             f"{self.config.d_model}), got {tuple(inputs_embeds.shape)}")
        return self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds

    def _add_positions(self, inputs_embeds: Tensor, mask: Tensor | None, past_length: int = 0) -> Tensor:
        """The embeddings plus sinusoidal absolute positions (`config.absolute_positions`), else unchanged.

        A token's position is the number of kept tokens before it (`mask`, which covers the new tokens or the
        past and the new ones); without a mask, past_length, past_length + 1, ... Padding takes position 0."""
        if self.config.absolute_positions is None:
            return inputs_embeds
        batch, length = inputs_embeds.shape[:2]
        if mask is None:
            positions = torch.arange(past_length, past_length + length, device=inputs_embeds.device)
            positions = positions.expand(batch, length)
        else:
            kept = mask.long().cumsum(-1) - 1
            if mask.shape[1] == length:  # the new tokens only: the past is taken to be unpadded
                kept = kept + past_length
            positions = kept[:, -length:].clamp(min=0)
        encoding = sinusoidal_positions(positions, inputs_embeds.shape[-1], self.config.init_std, inputs_embeds.dtype)
        return inputs_embeds + encoding

    def _layer_input(self, inputs_embeds: Tensor) -> Tensor:
        """What the first layer reads: the embeddings normalised (post-norm) or as they are (pre-norm), after
        dropout."""
        post_norm = self.config.layer_norm_position == "post"
        return self.dropout(self.layer_norm(inputs_embeds) if post_norm else inputs_embeds)

    def _run_layers(self, inputs_embeds: Tensor, output_hidden_states: bool | None, *layer_args, **layer_kwargs):
        """(last hidden state, all hidden states or None): embeddings dropout, layers, final norm (pre-norm); or
        embeddings norm, dropout, layers (post-norm). `output_hidden_states=None` reads
        `config.output_hidden_states`.

        Tensors that need gradients (`layer_args`) reach the layers positionally: reentrant gradient checkpointing
        treats only positional arguments as inputs of the checkpointed function."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        post_norm = self.config.layer_norm_position == "post"
        hidden_states = self._layer_input(inputs_embeds)
        all_hidden = [] if output_hidden_states else None
        for layer in self.layers:
            if all_hidden is not None:
                all_hidden.append(hidden_states)
            hidden_states = layer(hidden_states, *layer_args, **layer_kwargs)
        if not post_norm:
            hidden_states = self.layer_norm(hidden_states)
        if all_hidden is not None:
            all_hidden.append(hidden_states)
        return hidden_states, None if all_hidden is None else tuple(all_hidden)


class ScaleformerEncoder(ScaleformerStack):
    """Bidirectional stack over the source."""

    def __init__(self, config: ScaleformerConfig):
        super().__init__(config, ScaleformerEncoderLayer, config.encoder_layers)

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> ScaleformerEncoderOutput:
        inputs_embeds = self._embed(input_ids, inputs_embeds, kwargs)
        check_mask(attention_mask, "attention_mask", inputs_embeds.shape[0], (inputs_embeds.shape[1],))
        own_embeddings = self.config.counts_source_ids  # the model checks that the decoder gets the ids it needs
        source_embeddings = inputs_embeds if self.config.counts_source_embeddings else None
        inputs_embeds = self._add_positions(inputs_embeds, attention_mask)
        hidden_states, all_hidden = self._run_layers(inputs_embeds, output_hidden_states, key_mask=attention_mask)
        return ScaleformerEncoderOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden, source_embeddings=source_embeddings,
            source_ids=input_ids if own_embeddings else None,
        )


class ScaleformerDecoder(ScaleformerStack):
    """Causal stack with constant-size generation state, and cross-attention in an encoder-decoder."""

    def __init__(self, config: ScaleformerConfig):
        super().__init__(config, ScaleformerDecoderLayer, config.decoder_layers)
        self.remaining_count_embed = None
        if config.counts_remaining:  # one vector per remaining count in [-1, remaining_count_max]
            self.remaining_count_embed = nn.Embedding(config.remaining_count_max + 2, config.d_model)

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        past_key_values: ScaleformerCache | None = None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        source_embeddings: Tensor | None = None,
        source_ids: Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        source_embeddings (`torch.FloatTensor` of shape `(batch_size, source_length, d_model)`, *optional*):
            The encoder's input embeddings (`ScaleformerEncoderOutput.source_embeddings`), read by the first
            layer with `config.decoder_attention` `"count"` or `"count_block"` until the cache holds their summary.
        source_ids (`torch.LongTensor` of shape `(batch_size, source_length)`, *optional*):
            The source token ids (`ScaleformerEncoderOutput.source_ids`), read in their place with
            `config.count_block_embeddings`, and read with `config.remaining_count_max` until the cache holds their
            counts.
        """
        own_embeddings = self.config.counts_source_ids
        if own_embeddings and input_ids is None:
            raise ValueError(
                f"{self.config.source_ids_reason}: the decoder reads the ids of the tokens it writes, so the decoder "
                "needs `input_ids` (`decoder_input_ids`), not embeddings; unset it to pass embeddings"
            )
        inputs_embeds = self._embed(input_ids, inputs_embeds, kwargs)
        batch, length = inputs_embeds.shape[:2]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training and use_cache:
            logger.warning_once("`use_cache=True` is incompatible with gradient checkpointing: setting `use_cache=False`")
            use_cache = False
        if past_key_values is not None and not isinstance(past_key_values, ScaleformerCache):
            raise TypeError(
                f"`past_key_values` must be a ScaleformerCache (or None), got {type(past_key_values).__name__}: "
                "Scaleformer keeps a constant-size recurrent state, not keys and values"
            )
        count_slot = self.config.count_block_cache_index
        count_block = count_slot is not None
        slots = len(self.layers) + count_block
        if past_key_values is None and use_cache:
            past_key_values = ScaleformerCache(slots)
        if past_key_values is not None and len(past_key_values.layers) != slots:
            raise ValueError(
                "`past_key_values` must have one layer per decoder layer"
                f"{' and one for the count block' if count_block else ''} ({slots}), got {len(past_key_values.layers)}"
            )
        past_length = 0 if past_key_values is None else past_key_values.get_seq_length()
        check_mask(attention_mask, "attention_mask", batch, (length, past_length + length))
        inputs_embeds = self._add_positions(inputs_embeds, attention_mask, past_length)
        if attention_mask is not None:
            attention_mask = attention_mask[:, -length:]  # a mask covering past + new tokens
        source_states = count_source_ids = None
        if self.config.is_encoder_decoder:
            if encoder_hidden_states is None:
                raise ValueError("`encoder_hidden_states` is required by an encoder-decoder decoder")
            if encoder_hidden_states.shape[0] != batch:
                raise ValueError(
                    f"the decoder inputs (`decoder_input_ids` or `decoder_inputs_embeds`) have batch size {batch}, the "
                    f"source (`encoder_hidden_states`, from `input_ids`) {encoder_hidden_states.shape[0]}: they must "
                    "match"
                )
            check_mask(encoder_attention_mask, "encoder_attention_mask", batch, (encoder_hidden_states.shape[1],))
            summarised = past_key_values is not None and past_key_values.layers[count_slot or 0].cross_summary is not None
            counted = past_key_values is not None and past_key_values.layers[0].token_counts is not None
            block_ids = self.config.count_block_reads_ids and not summarised
            if block_ids or (self.config.counts_remaining and not counted):
                if source_ids is None or source_ids.shape != encoder_hidden_states.shape[:2]:
                    raise ValueError(
                        f"{self.config.source_ids_reason} needs `source_ids` (batch, source_length), the source token "
                        "ids (`ScaleformerEncoderOutput.source_ids`, from the encoder's `input_ids`), got "
                        f"{None if source_ids is None else tuple(source_ids.shape)} for encoder states of shape "
                        f"{tuple(encoder_hidden_states.shape)}"
                    )
                count_source_ids = source_ids if block_ids else None
            if self.config.counts_source_embeddings and not summarised:
                if source_embeddings is None or source_embeddings.shape[:2] != encoder_hidden_states.shape[:2]:
                    raise ValueError(
                        f"`decoder_attention={self.config.decoder_attention!r}` needs `source_embeddings` (batch, "
                        "source_length, d_model), the encoder's input embeddings "
                        "(`ScaleformerEncoderOutput.source_embeddings`), got "
                        f"{None if source_embeddings is None else tuple(source_embeddings.shape)} for encoder states "
                        f"of shape {tuple(encoder_hidden_states.shape)}"
                    )
                source_states = self._layer_input(self._add_positions(source_embeddings, encoder_attention_mask))
            if self.remaining_count_embed is not None:
                remaining = self._remaining_counts(
                    input_ids, attention_mask, source_ids, encoder_attention_mask, past_key_values
                )
                inputs_embeds = inputs_embeds + self.remaining_count_embed(
                    remaining.clamp(-1, self.config.remaining_count_max) + 1
                )

        if self.config.is_encoder_decoder and encoder_attention_mask is not None and not summarised:
            # what the cache summarises, or every call reads, of the source: its first kept token at position 0
            encoder_hidden_states, source_states, count_source_ids, encoder_attention_mask = first_kept_at_0(
                encoder_attention_mask, encoder_hidden_states, source_states, count_source_ids, encoder_attention_mask
            )
        hidden_states, all_hidden = self._run_layers(
            inputs_embeds,
            output_hidden_states,
            encoder_hidden_states,
            source_states,
            key_mask=attention_mask,
            encoder_key_mask=encoder_attention_mask,
            past_key_values=past_key_values,
            query_offset=past_length,
            **({"token_ids": input_ids, "source_ids": count_source_ids} if own_embeddings else {}),
        )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=all_hidden,
        )

    def _remaining_counts(
        self, token_ids: Tensor, token_mask: Tensor | None, source_ids: Tensor | None, source_mask: Tensor | None,
        past_key_values: ScaleformerCache | None,
    ) -> Tensor:
        """(B, L) how many more times each written token occurs in the source than it has been written up to and
        including it (`config.remaining_count_max`): from the source ids, or from the counts per token id that the
        cache holds after the tokens before; the cache then holds the counts after these tokens."""
        slot = None if past_key_values is None else past_key_values.layers[0]
        counts = None if slot is None else slot.token_counts
        if counts is None:
            counts = source_token_counts(source_ids, source_mask, self.config.vocab_size)
        remaining, counts = remaining_counts(token_ids, counts, token_mask)
        if slot is not None:
            slot.token_counts = counts
        return remaining


class ScaleformerModel(ScaleformerPreTrainedModel):
    """The bare encoder-decoder: returns decoder hidden states."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: ScaleformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = ScaleformerEncoder(config)
        self.decoder = ScaleformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = self.shared
        self.decoder.embed_tokens = self.shared

    def get_encoder(self):
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: ScaleformerCache | None = None,
        inputs_embeds: Tensor | None = None,
        decoder_inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            if input_ids is None:
                raise ValueError("Pass `decoder_input_ids`, `decoder_inputs_embeds` or `labels` (or `input_ids` to shift)")
            decoder_input_ids = shift_tokens_right(input_ids, self.config.pad_token_id, self.config.decoder_start_token_id)
        if encoder_outputs is None and input_ids is None and self.config.counts_source_ids:
            raise ValueError(
                f"{self.config.source_ids_reason}: the decoder reads the source token ids, so the encoder needs "
                "`input_ids`, not `inputs_embeds`; unset it to pass embeddings"
            )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_hidden_states=output_hidden_states,
                return_dict=True,  # `return_dict` applies to the outermost call only
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
            )
        source_embeddings = getattr(encoder_outputs, "source_embeddings", None)
        source_ids = getattr(encoder_outputs, "source_ids", None)
        if self.config.counts_source_ids:
            source_ids = input_ids if source_ids is None else source_ids
        if source_embeddings is None and self.config.counts_source_embeddings:
            source_embeddings = self.shared(input_ids) if input_ids is not None else inputs_embeds
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            source_embeddings=source_embeddings,
            source_ids=source_ids,
            return_dict=True,  # `return_dict` applies to the outermost call only
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
        )


def seq2seq_loss(logits: Tensor, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Cross-entropy of logits[:, i] against labels[:, i] (no shift), -100 ignored.

    Summed and divided by `num_items_in_batch` when given (so that gradient accumulation gives the
    loss of the whole batch), else averaged over the non-ignored labels. Computed in float32 at least
    (half-precision logits are upcast; float64 stays float64).
    """
    logits = logits.to(compute_dtype(logits.dtype))
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device), ignore_index=-100, reduction="sum"
    )
    return divide_by_items(total, labels, num_items_in_batch)


def divide_by_items(total: Tensor, labels: Tensor, num_items_in_batch: int | Tensor | None) -> Tensor:
    """A summed loss over `num_items_in_batch`, or over the labels that are not -100 when it is None."""
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
    if isinstance(num_items_in_batch, Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class ScaleformerForConditionalGeneration(ScaleformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder with a language-modelling head, for translation and summarisation."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: ScaleformerConfig):
        super().__init__(config)
        self.model = ScaleformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_encoder(self):
        return self.model.encoder

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: ScaleformerCache | None = None,
        inputs_embeds: Tensor | None = None,
        decoder_inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*):
            Target token ids; `labels[:, i]` is the target of `logits[:, i]`, -100 is ignored. When
            `decoder_input_ids` are not given they are `labels` shifted right behind
            `config.decoder_start_token_id`.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            check_labels(labels, self.config.vocab_size)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=True,  # `return_dict` applies to the outermost call only
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None if labels is None else seq2seq_loss(logits, labels, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: Tensor) -> Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


class ScaleformerForCausalLM(ScaleformerPreTrainedModel, GenerationMixin):
    """Decoder-only language model; `labels = input_ids` are shifted inside, as in run_clm.py."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: ScaleformerConfig):
        config = copy.deepcopy(config)
        config.is_decoder = True
        config.is_encoder_decoder = False
        super().__init__(config)
        self.model = ScaleformerDecoder(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        past_key_values: ScaleformerCache | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithCrossAttentions:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, length)`, *optional*):
            Usually `input_ids`: the model shifts them so that position i predicts token i + 1; -100 is ignored.
        logits_to_keep (`int`, *optional*, defaults to 0):
            Compute logits for the last `logits_to_keep` positions only (0: all).
        shift_labels (`torch.LongTensor` of shape `(batch_size, length)`, *optional*, keyword only):
            Targets already shifted, `shift_labels[:, i]` the target of `logits[:, i]` (as transformers'
            causal LM loss takes them under sequence parallelism); when given, the loss uses them instead of
            `labels`.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        shift_labels = kwargs.pop("shift_labels", None)
        if labels is not None:
            check_labels(labels, self.config.vocab_size)
        if shift_labels is not None:
            check_labels(shift_labels, self.config.vocab_size, name="shift_labels")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=True,  # `return_dict` applies to the outermost call only
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)
        loss = None
        if shift_labels is not None:
            loss = seq2seq_loss(logits, shift_labels, num_items_in_batch)
        elif labels is not None:
            loss = seq2seq_loss(logits[:, :-1], labels[:, 1:], num_items_in_batch)
        return CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
        )


def masked_mean(hidden_states: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Mean of `hidden_states` (B, L, D) over the positions where `attention_mask` (B, L) is nonzero -> (B, D).

    Padded positions get weight zero whatever they hold, so a padded sequence pools like the unpadded one.
    Without a mask every position counts. A row that keeps no position is refused on CPU (`checks_values`).
    """
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    keep = attention_mask.bool()
    counts = keep.sum(dim=1, keepdim=True)  # (B, 1)
    if checks_values(counts) and bool((counts == 0).any()):
        row = int((counts[:, 0] == 0).nonzero()[0, 0])
        raise ValueError(f"`attention_mask` must keep at least one position per sequence, row {row} keeps none")
    summed = hidden_states.masked_fill(~keep[..., None], 0.0).sum(dim=1)
    return summed / counts.to(hidden_states.dtype)


def sequence_classification_loss(
    logits: Tensor, labels: Tensor, problem_type: str, num_items_in_batch: int | Tensor | None = None
) -> Tensor:
    """Loss of `logits` (B, num_labels) for `problem_type`, computed in at least float32.

    `"single_label_classification"`: cross-entropy against class ids `labels` (B,), -100 ignored; averaged
    over the non-ignored labels, or summed and divided by `num_items_in_batch` when given (gradient
    accumulation). `"regression"`: mean squared error against `labels` (B,) or (B, num_labels).
    `"multi_label_classification"`: binary cross-entropy with logits against `labels` (B, num_labels) in [0, 1].
    """
    batch, num_labels = logits.shape
    logits = logits.to(compute_dtype(logits.dtype))
    labels = labels.to(logits.device)
    if problem_type == "single_label_classification":
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool or labels.shape != (batch,):
            raise ValueError(
                f"`labels` for single-label classification must be integer class ids of shape ({batch},), "
                f"got dtype {labels.dtype} and shape {tuple(labels.shape)}"
            )
        check_labels(labels, num_labels, "class ids")
        total = F.cross_entropy(logits, labels.long(), ignore_index=-100, reduction="sum")
        return divide_by_items(total, labels, num_items_in_batch)
    if problem_type == "regression":
        if labels.dim() not in (1, 2) or labels.shape[0] != batch or labels.numel() != batch * num_labels:
            raise ValueError(
                f"`labels` for regression must have shape ({batch},) or ({batch}, {num_labels}), "
                f"got {tuple(labels.shape)}"
            )
        return F.mse_loss(logits, labels.reshape(batch, num_labels).to(logits.dtype))
    if labels.shape != (batch, num_labels):
        raise ValueError(
            f"`labels` for multi-label classification must have shape ({batch}, {num_labels}), "
            f"got {tuple(labels.shape)}"
        )
    labels = labels.to(logits.dtype)
    if checks_values(labels) and bool(((labels < 0) | (labels > 1)).any()):
        raise ValueError("`labels` for multi-label classification must lie in [0, 1]")
    return F.binary_cross_entropy_with_logits(logits, labels)


class ScaleformerEncoderModel(ScaleformerPreTrainedModel):
    """The bare encoder with its embedding table, laid out as in [`ScaleformerModel`] (`shared`, `encoder`), so that
    the encoder of an encoder-decoder checkpoint loads into it, as into T5's `T5EncoderModel`."""

    _tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}

    def __init__(self, config: ScaleformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = ScaleformerEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = self.shared

    def get_encoder(self):
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        return self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,  # `return_dict` applies to the outermost call only
            **kwargs,
        )


class ScaleformerForSequenceClassification(ScaleformerPreTrainedModel):
    """Encoder-only classifier: the bidirectional encoder, a masked mean over the sequence, dropout and a linear head.

    The pooled vector is the mean of the encoder's final (layer-normed) hidden states over the positions that
    `attention_mask` keeps, so the logits of a sequence do not depend on how much padding it has or on which
    side. The head applies `config.dropout` and a linear map to `config.num_labels` logits.

    The model is the encoder stack whatever `config.is_encoder_decoder` says: it is built from
    `encoder_layers`, `encoder_attention_heads` and `encoder_ffn_dim`, the `decoder_*` fields are not read, and a
    decoder-only config (as saved by [`ScaleformerForCausalLM`]) gives the same model as the encoder-decoder config
    with the same encoder fields. `encoder_layers` must then be at least 1. The encoder is a
    [`ScaleformerEncoderModel`] with the parameter names of [`ScaleformerModel`]'s (`model.shared`,
    `model.encoder.*`), so `from_pretrained` on an encoder-decoder checkpoint starts the classifier from its encoder.

    The loss follows `config.problem_type` as in BERT; when it is `None`, it is inferred per call (the config
    is not changed): `"regression"` (mean squared error) if `num_labels == 1`, `"single_label_classification"`
    (cross-entropy) for `torch.long` or `torch.int` labels, `"multi_label_classification"` (binary
    cross-entropy with logits) otherwise.

    Example:

    ```python
    >>> import torch
    >>> from modeling_scaleformer import ScaleformerConfig, ScaleformerForSequenceClassification
    >>> config = ScaleformerConfig(vocab_size=16, d_model=64, encoder_layers=2, num_labels=10)
    >>> model = ScaleformerForSequenceClassification(config)
    >>> out = model(input_ids=torch.tensor([[2, 7, 8, 5]]), labels=torch.tensor([8]))
    >>> out.logits.shape
    torch.Size([1, 10])
    ```
    """

    def __init__(self, config: ScaleformerConfig):
        if config.encoder_layers < 1:
            raise ValueError(
                f"`encoder_layers` must be >= 1 for ScaleformerForSequenceClassification, which runs the encoder "
                f"stack also for a decoder-only config, got {config.encoder_layers}"
            )
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ScaleformerEncoderModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.shared

    def set_input_embeddings(self, value):
        self.model.set_input_embeddings(value)

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Token ids; pass these or `inputs_embeds`.
        attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
            1 for tokens, 0 for padding (either side). Padding is hidden from attention and left out of the mean;
            every row must keep at least one position. Without a mask every position counts.
        inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, d_model)`, *optional*):
            Embeddings to use instead of looking up `input_ids`.
        labels (`torch.Tensor`, *optional*):
            Class ids of shape `(batch_size,)` in `[0, config.num_labels)` (-100 ignored) for single-label
            classification; targets of shape `(batch_size,)` or `(batch_size, 1)` for regression; multi-hot
            targets in [0, 1] of shape `(batch_size, config.num_labels)` for multi-label classification.
        output_hidden_states (`bool`, *optional*):
            Whether to return the embeddings and the output of every encoder layer.

        Returns:
            [`~modeling_outputs.SequenceClassifierOutput`]: `logits` of shape `(batch_size, config.num_labels)`,
            `loss` when `labels` are given.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,  # `return_dict` applies to the outermost call only
            **kwargs,
        )
        pooled = masked_mean(outputs.last_hidden_state, attention_mask)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            problem_type = self.config.problem_type
            if problem_type is None:
                if self.num_labels == 1:
                    problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem_type = "single_label_classification"
                else:
                    problem_type = "multi_label_classification"
            loss = sequence_classification_loss(logits, labels, problem_type, num_items_in_batch)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


__all__ = [
    "ScaleformerEncoderModel",
    "ScaleformerForCausalLM",
    "ScaleformerForConditionalGeneration",
    "ScaleformerModel",
    "ScaleformerPreTrainedModel",
    "ScaleformerForSequenceClassification",
]
