"""Scaleformer configuration."""

import dataclasses
import math
import types
import typing
from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .ops_registry import ATTENTION_TYPES, ATTENTION_VARIANTS, DEFAULT_DECAY_RATE_RANGE, get_attention_variant


AUTO_MAP = {
    "AutoConfig": "configuration_scaleformer.ScaleformerConfig",
    "AutoModel": "modeling_scaleformer.ScaleformerModel",
    "AutoModelForSeq2SeqLM": "modeling_scaleformer.ScaleformerForConditionalGeneration",
    "AutoModelForCausalLM": "modeling_scaleformer.ScaleformerForCausalLM",
    "AutoModelForSequenceClassification": "modeling_scaleformer.ScaleformerForSequenceClassification",
}


@strict
class ScaleformerConfig(PreTrainedConfig):
    r"""
    Configuration of a Scaleformer encoder-decoder ([`ScaleformerForConditionalGeneration`]) or decoder-only
    ([`ScaleformerForCausalLM`]) model. Names follow BART. By default Scaleformer has no absolute position
    embeddings: positions enter through clipped relative embeddings in attention (`absolute_positions` adds
    sinusoidal ones).

    Args:
        vocab_size (`int`, *optional*, defaults to 8000):
            Vocabulary size.
        d_model (`int`, *optional*, defaults to 512):
            Width of the layers and the embeddings.
        encoder_layers (`int`, *optional*, defaults to 6):
            Number of encoder layers.
        decoder_layers (`int`, *optional*, defaults to 6):
            Number of decoder layers.
        encoder_attention_heads (`int`, *optional*, defaults to 8):
            Attention heads per encoder layer; must divide `d_model`.
        decoder_attention_heads (`int`, *optional*, defaults to 8):
            Attention heads per decoder layer (self and cross attention); must divide `d_model`.
        encoder_ffn_dim (`int`, *optional*, defaults to 2048):
            Hidden width of the encoder feed-forward blocks.
        decoder_ffn_dim (`int`, *optional*, defaults to 2048):
            Hidden width of the decoder feed-forward blocks.
        activation_function (`str`, *optional*, defaults to `"gelu"`):
            Feed-forward activation, a key of `transformers.activations.ACT2FN`.
        dropout (`float`, *optional*, defaults to 0.1):
            Dropout on embeddings and on the output of every attention and feed-forward block.
        attention_dropout (`float`, *optional*, defaults to 0.0):
            Probability of hiding each key from attention during training (the remaining keys are
            renormalised, as dropping a column of the attention matrix would).
        activation_dropout (`float`, *optional*, defaults to 0.0):
            Dropout after the feed-forward activation.
        init_std (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal initialisation of weights and relative embeddings.
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            Epsilon of the layer norms.
        layer_norm_position (`str`, *optional*, defaults to `"post"`):
            `"post"`: every block computes LayerNorm(x + f(x)) (the original Transformer and BART), and the
            stack's extra layer norm is applied to the embeddings instead (BART's `layernorm_embedding`); it
            learned faster per CPU-minute at the shipped depths. `"pre"`: every block adds f(LayerNorm(x)) to x,
            and each stack ends with a layer norm (stable at any depth).
        attention_type (`str`, *optional*, defaults to `"local_softmax_decay"`):
            The attention of every layer, a key of `ops_registry.ATTENTION_VARIANTS` (whose entries state what
            each variant computes and which of the options below it has):
            `"kernelized_rpe"`: kernelized attention with clipped relative positions, linear;
            `"kernelized"`: plain kernelized attention (no position information at all), linear;
            `"kernelized_decay"`: kernelized_rpe's scores times a learned per-head geometric decay beyond
            the horizon, row-normalised, linear;
            `"kernelized_decay_gated"`: the same decayed scores without a row normaliser, then a per-head
            RMSNorm and a SiLU output gate, linear;
            `"kernelized_gated"`: phi(q_i).phi(k_j) times the learned per-head decay from distance 0 (no relative
            table), without a row normaliser, then the same RMSNorm and gate (retention with a feature map), linear;
            `"kernelized_sum"`: phi(q_i).phi(k_j) with no decay and no position information, without a row
            normaliser, then the same RMSNorm and gate: every key keeps its weight at any distance, linear;
            `"local_softmax_decay"` (default): softmax over the 2h+1 nearest keys (Shaw's relative keys) and,
            beyond the horizon, kernelized scores with a learned per-head geometric decay, under one row
            normaliser, linear;
            `"fourier"`: kernelized attention with a learned cosine relative-position kernel, linear;
            `"toeplitz"`: kernelized attention times exp(b_{j-i}) (clipped at `rpe_horizon`), by FFT;
            `"xl_relative"`: Transformer-XL relative softmax attention, quadratic;
            `"shaw_softmax"`: softmax attention with clipped relative keys (Shaw et al.), quadratic;
            `"softmax"`: plain softmax attention (no position information), quadratic.
            Cross-attention uses the family's variant without positions (`"kernelized"` or `"softmax"`)
            unless `cross_attention_rpe` is set.
        attention_mode (`str`, *optional*, defaults to `"auto"`):
            Algorithm for full-sequence attention: `"linear"` (O(L), or O(L log L) for `"toeplitz"`),
            `"naive"` (quadratic) or `"auto"` (the cheaper per call; on CUDA, the default attention's Triton
            kernels at any length). Results are equal up to rounding. The softmax variants accept `"auto"` (fused
            SDPA) and `"naive"`.
        rpe_horizon (`int`, *optional*, defaults to 16):
            Horizon h of the relative variants (`"kernelized_rpe"`, the three decay types, `"toeplitz"`,
            `"xl_relative"`, `"shaw_softmax"`): relative positions are clipped to [-h, h], giving 2h+1 learned
            entries.
        rpe_shared_across_heads (`bool`, *optional*, defaults to `False`):
            One relative table shared by the heads of a layer instead of one per head (`"kernelized_rpe"`,
            the three decay types and `"shaw_softmax"`).
        cross_attention_rpe (`bool`, *optional*):
            Whether cross-attention uses the self-attention variant itself, with its relative positions and decay
            where it has them (decoder position minus encoder position); with `"kernelized_rpe"`, the decay types
            and `"kernelized_sum"` only. `None` (default) turns it on for exactly those types. Encoder positions
            count from the first token the source's attention mask keeps, so that a source padded on either side
            reads as the source alone; decoder positions count every decoder input, padding included, so that
            decoder inputs padded on the left (a prefix given to `generate`) do not read as the inputs alone.
        decay_rate_range (`tuple[float, float]`, *optional*, defaults to `(0.25, 0.00390625)`):
            The decay types (`"kernelized_decay"`, `"kernelized_decay_gated"`, `"kernelized_gated"`,
            `"local_softmax_decay"`): the initial decay rates per position beyond the horizon of the fastest and
            the slowest head, spread geometrically over the heads (1/4 to 1/256: half-lives from under 3 to 177 positions). The rates
            are learned from there.
        feature_map (`str`, *optional*, defaults to `"elu"`):
            The feature map phi of the kernelized scores of `"kernelized_decay"`, `"kernelized_decay_gated"`,
            `"kernelized_gated"` and `"kernelized_sum"` (and of their cross attention with `cross_attention_rpe`):
            `"elu"`, phi(x) = elu(x) + 1, every score positive; `"relu"`, phi(x) = max(x, 0), so that a query can
            give a key no weight at all. The other types take `"elu"` only.
        decoder_attention (`str`, *optional*, defaults to `"count_block"`):
            How a decoder layer of an encoder-decoder reads its own tokens and the encoder's. `"separate"`: a
            self-attention block, then a cross-attention block, each with its own queries and output (BART).
            `"joint"`: one attention block whose queries read the decoder's keys (causal, `attention_type`) and
            the encoder's (cross attention with relative positions), the two sums added before one output norm,
            gate and projection; a count over the source and a count over what has been written then meet in
            one sum. `"joint"` needs an attention type without a row normaliser (`"kernelized_decay_gated"`,
            `"kernelized_gated"`, `"kernelized_sum"`) and `cross_attention_rpe`. `"count"`: the first decoder layer is joint, and its
            source part reads the source tokens themselves (their embeddings, prepared as the decoder's) instead
            of the encoder output, with the written tokens' key and value projections, the values negated: per
            symbol, that sum is the number written minus the number in the source, at any length (up to the relative terms and the
            decay, which see the two parts at different positions). With an attention type without a row
            normaliser (and `cross_attention_rpe`) the other layers are joint; with one that has a row
            normaliser (the default) they are separate, and the first layer's attention is `"kernelized_gated"`
            with `feature_map="relu"` and decay rates from 1e-4 to 1e-5 (`modeling_scaleformer.COUNT_ATTENTION`).
            `"count_block"`: the decoder layers are separate, and the first also has a count block before its
            self-attention: the same count over the source tokens and the written ones, in an attention block of its
            own, so that no layer gives up its attention to the encoder's output; for a type with a row normaliser
            its attention is `"kernelized_sum"` with `feature_map="relu"`
            (`modeling_scaleformer.COUNT_BLOCK_ATTENTION`): no decay at all, so that the sum is the difference of
            the counts at any length. `"count_block"` is the default, with 64 heads of 2 channels, a token table of
            its own of 32 channels and a learned output scale started at 0.1 (the `count_block_*` defaults); with
            `remaining_count_max=3` (its default too) it makes the model extrapolate on copying and sorting. The
            `count_block_*` fields apply to `"count_block"` only; under another `decoder_attention` they keep their
            defaults or are off (`None`, `False`). Decoder-only models ignore the field (they have no cross
            attention).
        count_block_heads (`int`, *optional*, defaults to 64):
            The number of heads of the count block (`decoder_attention="count_block"`); `None` gives it
            `decoder_attention_heads`. More, narrower heads keep more symbols' counts apart: each head's sum is
            normalised on its own, so that one symbol's count is mixed only with the others of its head. It must
            divide `d_model` unless `count_block_head_dim` is set.
        count_block_head_dim (`int`, *optional*, defaults to 2):
            The width of each of the count block's heads (`decoder_attention="count_block"`); `None` gives
            `d_model // count_block_heads`. When set, the block projects `d_model` to `count_block_heads *
            count_block_head_dim` channels and back, so that many narrow heads need not take the whole width: 64
            heads of 2 channels are a block of 128 channels at any `d_model`.
        count_block_embeddings (`bool`, *optional*, defaults to `True`):
            Whether the count block (`decoder_attention="count_block"`) reads the written and the source tokens
            through a token embedding table of its own (`count_embed_tokens` of the first decoder layer, then a
            layer norm) instead of the shared embeddings, without absolute positions. Tokens that the rest of the
            model embeds close together (neighbouring symbols, related words) then keep keys of their own, so that
            one token's count does not leak into another's. The model then needs `input_ids` (and
            `decoder_input_ids`), not embeddings: set it to `False`, and `remaining_count_max=None`, to pass
            `inputs_embeds`.
        count_block_embedding_dim (`int`, *optional*, defaults to 32):
            The width of the count block's own embedding table (`count_block_embeddings=True`; ignored without
            it); `None` gives `d_model`. When set, the table holds that many channels per token, started at unit
            scale, and a linear map without bias (`count_embed_proj` of the first decoder layer) takes them to
            `d_model`: each token then has that many free parameters of its own instead of `d_model`, enough to
            keep a few symbols' keys apart without room to memorise many words.
        count_block_zero_init (`bool`, *optional*, defaults to `False`):
            Whether the count block's output projection (`decoder_attention="count_block"`) starts at zero, so that
            the block starts as the identity and its counts enter the model only as training makes use of them
            (the projection's gradient is not zero: its input, the normalised sums, is not).
        count_block_detach (`bool`, *optional*, defaults to `False`):
            Whether the count block (`decoder_attention="count_block"`) reads the written and the source tokens'
            states without passing gradients back to them: only the block's own parameters learn from its output,
            and the shared embeddings and the layers below are shaped by the rest of the model alone. It cannot be
            combined with `count_block_embeddings` (the block's own table would then get no gradient at all).
        count_block_layer_scale (`float`, *optional*, defaults to 0.1):
            The start value of a learned scale per channel on the count block's output (`count_layer_scale` of the
            first decoder layer, LayerScale as in Touvron et al. 2021), for `decoder_attention="count_block"`;
            `None`: no scale. A small start (0.1) lets the block's counts into the residual stream
            gently, so that the layers above learn the text first and the counts as far as they pay.
        remaining_count_max (`int`, *optional*, defaults to 3):
            `None`: off. K: the decoder adds to each written token's embedding a learned vector
            (`remaining_count_embed` of the decoder, K + 2 of them) for how many more times the token occurs in
            the source than it has been written so far, itself included, clamped to [-1, K]: exact counts of the
            token ids, which tell the decoder whether a token still has copies to write at any length. The
            counts per token id are the decoder's generation state (vocab_size integers per sequence, whatever
            the number of tokens). The model then needs `input_ids` and `decoder_input_ids`, not embeddings (set
            it to `None`, and `count_block_embeddings=False`, to pass `inputs_embeds`). Decoder-only models ignore
            the field (they have no source).
        absolute_positions (`str`, *optional*):
            `None` (default): no absolute positions, the model sees order only through its attention.
            `"sinusoidal"`: fixed sine/cosine position encodings (Vaswani et al.) added to the token embeddings
            of every stack, scaled so that each coordinate has standard deviation `init_std`, like the
            embeddings at initialisation. Positions count the tokens that the attention mask keeps (padding
            does not move them) and have no upper limit.
        use_cache (`bool`, *optional*, defaults to `True`):
            Whether forward returns the recurrent state for generation.
        pad_token_id (`int`, *optional*, defaults to 0):
            Padding token id.
        bos_token_id (`int`, *optional*, defaults to 1):
            Beginning-of-sequence token id.
        eos_token_id (`int`, *optional*, defaults to 2):
            End-of-sequence token id.
        decoder_start_token_id (`int`, *optional*, defaults to 1):
            First decoder input of encoder-decoder models.
        is_encoder_decoder (`bool`, *optional*, defaults to `True`):
            Encoder-decoder (`True`) or decoder-only (`False`).
        tie_word_embeddings (`bool`, *optional*, defaults to `True`):
            Share the input embeddings with the output projection.

    Example:

    ```python
    >>> from modeling_scaleformer import ScaleformerConfig, ScaleformerForConditionalGeneration
    >>> config = ScaleformerConfig(d_model=256, encoder_layers=3, decoder_layers=3, rpe_horizon=16)
    >>> model = ScaleformerForConditionalGeneration(config)
    ```
    """

    model_type = "scaleformer"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 8000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "gelu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    layer_norm_position: Literal["pre", "post"] = "post"
    attention_type: Literal[ATTENTION_TYPES] = "local_softmax_decay"
    attention_mode: Literal["auto", "linear", "naive"] = "auto"
    rpe_horizon: int = 16
    rpe_shared_across_heads: bool = False
    cross_attention_rpe: bool | None = None
    decay_rate_range: tuple[float, float] | list[float] = DEFAULT_DECAY_RATE_RANGE
    feature_map: Literal["elu", "relu"] = "elu"
    decoder_attention: Literal["separate", "joint", "count", "count_block"] = "count_block"
    count_block_heads: int | None = 64
    count_block_head_dim: int | None = 2
    count_block_embeddings: bool = True
    count_block_embedding_dim: int | None = 32
    count_block_zero_init: bool = False
    count_block_detach: bool = False
    count_block_layer_scale: float | None = 0.1
    remaining_count_max: int | None = 3
    absolute_positions: Literal["sinusoidal"] | None = None
    use_cache: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    is_encoder_decoder: bool = True
    is_decoder: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        if self.cross_attention_rpe is None and self.attention_type in ATTENTION_VARIANTS:
            self.cross_attention_rpe = ATTENTION_VARIANTS[self.attention_type].cross_attention_rpe
        super().__post_init__(**kwargs)
        # every saved folder can be loaded by each Auto class with trust_remote_code=True
        self.auto_map = {**AUTO_MAP, **(getattr(self, "auto_map", None) or {})}

    @property
    def joint_decoder_layers(self) -> bool:
        """Whether the decoder layers other than a count layer read the source and the written tokens in one
        attention: with `decoder_attention="joint"`, and with `"count"` for an attention type without a row
        normaliser."""
        if self.decoder_attention == "joint":
            return True
        return self.decoder_attention == "count" and not get_attention_variant(self.attention_type).normalised

    @property
    def counts_source(self) -> bool:
        """Whether the decoder reads the source tokens' embeddings (`decoder_attention` `"count"` or
        `"count_block"` in an encoder-decoder)."""
        return self.is_encoder_decoder and self.decoder_attention in ("count", "count_block")

    @property
    def has_count_block(self) -> bool:
        """Whether the first decoder layer has a count block (`decoder_attention="count_block"` in an
        encoder-decoder), whose generation state is one more cache slot after the layers'."""
        return self.is_encoder_decoder and self.decoder_attention == "count_block"

    @property
    def counts_source_ids(self) -> bool:
        """Whether the decoder reads the source and the written token ids (in an encoder-decoder: the count block
        through its own embedding table, `count_block_embeddings`, or `remaining_count_max`): the encoder then
        passes on the source ids, and the model needs ids, not embeddings."""
        return self.count_block_reads_ids or self.counts_remaining

    @property
    def count_block_reads_ids(self) -> bool:
        """Whether the count block reads the token ids through its own embedding table (`count_block_embeddings` in
        an encoder-decoder)."""
        return self.has_count_block and self.count_block_embeddings

    @property
    def counts_source_embeddings(self) -> bool:
        """Whether the decoder reads the source tokens' embeddings (`decoder_attention` `"count"`, or `"count_block"`
        without `count_block_embeddings`, in an encoder-decoder)."""
        return self.counts_source and not self.count_block_reads_ids

    @property
    def counts_remaining(self) -> bool:
        """Whether the decoder embeds the remaining counts of the written tokens (`remaining_count_max` in an
        encoder-decoder)."""
        return self.is_encoder_decoder and self.remaining_count_max is not None

    @property
    def source_ids_reason(self) -> str:
        """The settings that make the decoder read token ids (`counts_source_ids`), for error messages."""
        names = ["`count_block_embeddings=True`"] if self.count_block_reads_ids else []
        names += [f"`remaining_count_max={self.remaining_count_max}`"] if self.counts_remaining else []
        return " and ".join(names)

    @property
    def count_block_num_heads(self) -> int:
        """The number of heads of the count block: `count_block_heads`, or `decoder_attention_heads` when it is
        `None`."""
        return self.decoder_attention_heads if self.count_block_heads is None else self.count_block_heads

    @property
    def count_block_head_width(self) -> int:
        """The width of each head of the count block: `count_block_head_dim`, or `d_model // count_block_num_heads`
        when it is `None`."""
        if self.count_block_head_dim is None:
            return self.d_model // self.count_block_num_heads
        return self.count_block_head_dim

    @property
    def count_block_cache_index(self) -> int | None:
        """The cache slot of the count block's generation state, the one after the decoder layers' (None without a
        count block)."""
        return self.decoder_layers if self.has_count_block else None

    def update_from_string(self, update_str: str):
        """
        Update fields from `"key=value,key=value"`, as [`PreTrainedConfig.update_from_string`] does, and also the
        fields that may be `None`: `none` sets such a field to `None`, and a field that is `None` now reads its
        value as an int, a float or else a string (`absolute_positions=sinusoidal`, `pad_token_id=3`).
        """
        hints = {field.name: field.type for field in dataclasses.fields(self)}
        rest = []
        for item in update_str.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"expected comma-separated key=value pairs, got {item!r} in {update_str!r}")
            hint = hints.get(key)
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            optional = union and type(None) in typing.get_args(hint)
            if optional and (getattr(self, key) is None or value.lower() == "none"):
                setattr(self, key, _read_value(value))
            else:
                rest.append(item)
        if rest:
            super().update_from_string(",".join(rest))

    def validate_architecture(self):
        """Raise ValueError, naming the field, for values no model can be built from."""
        for name in ("encoder_attention_heads", "decoder_attention_heads", "count_block_heads"):
            heads = getattr(self, name)
            if name == "count_block_heads" and self.count_block_head_dim is not None:  # any number of heads
                if heads is not None and heads < 1:
                    raise ValueError(f"`{name}` must be positive, got {heads}")
            elif heads is not None and (heads < 1 or self.d_model % heads != 0):  # None: count_block_heads unset
                raise ValueError(f"`{name}` must be a positive divisor of `d_model` ({self.d_model}), got {heads}")
        for name in ("count_block_head_dim", "count_block_embedding_dim"):  # None: unset
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")
        scale = self.count_block_layer_scale
        if scale is not None and not 0 < scale < math.inf:  # the field's type is checked before
            raise ValueError(f"`count_block_layer_scale` must be a positive finite number or None, got {scale!r}")
        if self.remaining_count_max is not None and self.remaining_count_max < 1:  # the field's type is checked before
            raise ValueError(f"`remaining_count_max` must be a positive int or None, got {self.remaining_count_max!r}")
        for name in ("vocab_size", "d_model", "encoder_ffn_dim", "decoder_ffn_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")
        for name in ("encoder_layers", "decoder_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}")
        if self.decoder_layers < 1 or (self.is_encoder_decoder and self.encoder_layers < 1):
            raise ValueError(
                "`decoder_layers` (and `encoder_layers` for an encoder-decoder) must be >= 1, got "
                f"{self.encoder_layers} and {self.decoder_layers}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1), got {getattr(self, name)}")
        if self.rpe_horizon < 0:
            raise ValueError(f"`rpe_horizon` must be >= 0, got {self.rpe_horizon}")
        rates = self.decay_rate_range
        if not (isinstance(rates, (list, tuple)) and len(rates) == 2 and all(
            isinstance(r, (int, float)) and not isinstance(r, bool) for r in rates
        ) and rates[0] >= rates[1] > 0):
            raise ValueError(
                f"`decay_rate_range` must be (fastest, slowest) with fastest >= slowest > 0, got {rates!r}"
            )
        variant = get_attention_variant(self.attention_type)
        if self.rpe_shared_across_heads and not variant.rpe_shareable:
            allowed = [name for name, v in ATTENTION_VARIANTS.items() if v.rpe_shareable]
            raise ValueError(
                f"`rpe_shared_across_heads` applies to attention_type {allowed} only, got attention_type "
                f"{self.attention_type!r}"
            )
        if self.cross_attention_rpe and not variant.cross_attention_rpe:
            allowed = [name for name, v in ATTENTION_VARIANTS.items() if v.cross_attention_rpe]
            raise ValueError(
                f"`cross_attention_rpe` requires attention_type {allowed}, got {self.attention_type!r}"
            )
        if self.feature_map not in variant.feature_maps:
            allowed = [name for name, v in ATTENTION_VARIANTS.items() if self.feature_map in v.feature_maps]
            raise ValueError(
                f"`feature_map` {self.feature_map!r} applies to attention_type {allowed} only, got attention_type "
                f"{self.attention_type!r} (whose feature maps are {variant.feature_maps})"
            )
        if self.joint_decoder_layers and (variant.normalised or not self.cross_attention_rpe):
            allowed = [name for name, v in ATTENTION_VARIANTS.items() if not v.normalised and v.cross_attention_rpe]
            raise ValueError(
                f"`decoder_attention={self.decoder_attention!r}` adds the decoder's and the encoder's unnormalised "
                f"sums: it needs attention_type in {allowed} with `cross_attention_rpe=True`, got attention_type "
                f"{self.attention_type!r} and cross_attention_rpe {self.cross_attention_rpe}"
            )
        if self.decoder_attention == "count_block" and not variant.normalised and not self.cross_attention_rpe:
            raise ValueError(
                "`decoder_attention='count_block'` with an attention type without a row normaliser reads the source "
                f"with that type's cross attention: it needs `cross_attention_rpe=True`, got attention_type "
                f"{self.attention_type!r} and cross_attention_rpe {self.cross_attention_rpe}"
            )
        # the count block's fields at their defaults, None or False (unset) go with any `decoder_attention`
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        for name in ("count_block_head_dim", "count_block_embeddings", "count_block_embedding_dim",
                     "count_block_zero_init", "count_block_detach", "count_block_layer_scale"):
            if getattr(self, name) not in (None, False, defaults[name]) and self.decoder_attention != "count_block":
                raise ValueError(
                    f"`{name}` applies to `decoder_attention='count_block'` only, got decoder_attention "
                    f"{self.decoder_attention!r}"
                )
        if self.count_block_embedding_dim not in (None, defaults["count_block_embedding_dim"]) and (
                not self.count_block_embeddings):
            raise ValueError(
                "`count_block_embedding_dim` sets the width of the count block's own embedding table: it needs "
                f"`count_block_embeddings=True`, got count_block_embeddings {self.count_block_embeddings}"
            )
        if self.count_block_detach and self.count_block_embeddings:
            raise ValueError(
                "`count_block_detach=True` reads the block's inputs without gradient: with "
                "`count_block_embeddings=True` the block's own embedding table would never learn; set one of them to "
                "False"
            )
        if self.attention_mode not in variant.modes:
            raise ValueError(
                f"`attention_mode` {self.attention_mode!r} does not exist for attention_type {self.attention_type!r}: "
                f"use one of {tuple(variant.modes)}"
            )
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"`activation_function` must be one of {sorted(ACT2FN)}, got {self.activation_function!r}"
            )
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"`pad_token_id` must be in [0, vocab_size), got {self.pad_token_id}")


def _read_value(text: str):
    """`none` as None, then an int, a float, or the text itself."""
    if text.lower() == "none":
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


__all__ = ["ScaleformerConfig"]
