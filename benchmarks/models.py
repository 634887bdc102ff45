"""The models the benchmarks compare: Scaleformer of any attention_type, BART and T5 at one size, and the
long-input baselines LED and LongT5 at the same size.

`bench_generate.py` and `bench_train.py` name them `scaleformer`, `scaleformer:TYPE`, `bart` and `t5`
(`MODEL_NAMES`, `model_configs`, `build_model`); `bench_train.py` also accepts `led` and `longt5`
(`TRAIN_MODEL_NAMES`). `bench_quality.py` and `bench_extrapolation.py` add Scaleformer ablations such as
`scaleformer+cross_rpe` (`parse_model_name`; `bench_quality.py` also accepts `led` and `longt5`) and build every
model with the special ids of `examples/data/train_tokenizer.py` (`build_seq2seq`, `collate`). `bench_listops.py`
builds its encoder-only classifier itself.

* `led`: `LEDForConditionalGeneration` (Longformer-Encoder-Decoder): local attention of `LED_ATTENTION_WINDOW`
  (512) tokens in every encoder layer, no global tokens; LED pads the source to a multiple of the window itself,
  so its encoder position table is the longest source rounded up to the window (`led_encoder_table_size`).
* `longt5`: `LongT5ForConditionalGeneration`, `encoder_attention_type="transient-global"`, local radius 127 and
  global blocks of 16 tokens (transformers' defaults), relative attention buckets like T5's.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LEDConfig,
    LEDForConditionalGeneration,
    LongT5Config,
    LongT5ForConditionalGeneration,
    PreTrainedConfig,
    PreTrainedModel,
    T5Config,
    T5ForConditionalGeneration,
)

from modeling_scaleformer import ScaleformerConfig, ScaleformerForConditionalGeneration
from modeling_scaleformer.ops_registry import ATTENTION_TYPES, ATTENTION_VARIANTS, DECAY_TYPES


# the attention type of `scaleformer` in the quality and extrapolation benchmarks, whose names spell out the recipe:
# `scaleformer` alone is the first configuration (kernelized_rpe, pre-norm, cross attention without positions), so
# that every recorded row keeps its meaning; ScaleformerConfig's default is `DEFAULT_CONFIG_MODEL` there. The speed
# benchmarks' `scaleformer` is ScaleformerConfig's default (`model_configs`).
DEFAULT_ATTENTION_TYPE = "kernelized_rpe"
DEFAULT_CONFIG_MODEL = ("scaleformer:local_softmax_decay+cross_rpe+count_block64x2+count_embeddings32+layer_scale0.1"
                        "+remaining3+post_ln")  # ScaleformerConfig's default, by name
SPEED_ATTENTION_TYPE = ScaleformerConfig().attention_type  # the type of `scaleformer` in the speed benchmarks
BASELINES = ("bart", "t5")
LONG_BASELINES = ("led", "longt5")  # opt-in: local (windowed) encoder attention, linear in source length
ALL_BASELINES = (*BASELINES, *LONG_BASELINES)
MODEL_NAMES = ("scaleformer", *(f"scaleformer:{t}" for t in ATTENTION_TYPES), *BASELINES)
TRAIN_MODEL_NAMES = (*MODEL_NAMES, *LONG_BASELINES)  # what bench_train.py accepts
DEFAULT_MODELS = ("scaleformer", "bart")
MODEL_CLASSES = {
    "scaleformer": ScaleformerForConditionalGeneration,
    "bart": BartForConditionalGeneration,
    "t5": T5ForConditionalGeneration,
    "led": LEDForConditionalGeneration,
    "longt5": LongT5ForConditionalGeneration,
}
LED_ATTENTION_WINDOW = 512  # per encoder layer; LED pads sources to a multiple of it
LONGT5_LOCAL_RADIUS, LONGT5_GLOBAL_BLOCK_SIZE = 127, 16  # transformers' defaults
DTYPE = torch.float32
FIRST_PLAIN_ID = 4  # ids below are special tokens of some model: random inputs start here
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # build_seq2seq's special ids (train_tokenizer.py's); BOS starts decoding
BART_DEFAULT_POSITIONS = 1024


class ModelSize(NamedTuple):
    vocab_size: int
    d_model: int
    layers: int  # encoder and decoder each
    heads: int
    ffn_dim: int


MODEL_SIZE = ModelSize(vocab_size=32000, d_model=512, layers=6, heads=8, ffn_dim=2048)


# ------------------------------------------------------------------ names: scaleformer, scaleformer:TYPE, bart, t5


def add_models_argument(parser: argparse.ArgumentParser, baselines: Sequence[str] = BASELINES) -> None:
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="models to compare, in this order: scaleformer (ScaleformerConfig's default, "
                        f"attention_type {SPEED_ATTENTION_TYPE}), scaleformer:TYPE (another attention type) with TYPE in {', '.join(ATTENTION_TYPES)}, "
                        f"{', '.join(baselines)} (default: {' '.join(DEFAULT_MODELS)})")


def check_models(parser: argparse.ArgumentParser, names: list[str] | None,
                 accepted: Sequence[str] = MODEL_NAMES) -> list[str]:
    """`--models` in order, repeats dropped and `scaleformer:SPEED_ATTENTION_TYPE` read as `scaleformer`; an unknown
    name (one not in `accepted`) is a parser error that lists the accepted ones."""
    if names is None:
        return list(DEFAULT_MODELS)
    unknown = [name for name in names if name not in accepted]
    if unknown:
        parser.error(f"--models: unknown model(s) {', '.join(map(repr, unknown))}; accepted: "
                     f"{', '.join(accepted)}")
    return list(dict.fromkeys("scaleformer" if name == f"scaleformer:{SPEED_ATTENTION_TYPE}" else name
                              for name in names))


def reference_model(names: Sequence[str]) -> str:
    """The model the others are compared with: the first Scaleformer model, else the first model."""
    return next((name for name in names if name.startswith("scaleformer")), names[0])


def attention_type_of(name: str) -> str | None:
    """The attention_type of a speed benchmark's Scaleformer model name, None for a baseline."""
    kind, _, attention_type = name.partition(":")
    return (attention_type or SPEED_ATTENTION_TYPE) if kind == "scaleformer" else None


def grows_with_position(name: str) -> bool:
    """Whether the model's self-attention cache gains one token a step: the baselines and the softmax types.
    They are also the models whose attention is quadratic in length."""
    attention_type = attention_type_of(name)
    return attention_type is None or not ATTENTION_VARIANTS[attention_type].constant_state


def quadratic_in_length(name: str) -> bool:
    """Whether the model's encoder attention is quadratic in source length: BART, T5 and the softmax types; not LED
    and LongT5 (local attention, linear in length), whose decoding cache nonetheless grows with position."""
    return grows_with_position(name) and name not in LONG_BASELINES


# ----------------------------------------------------------------------------------------------- building


def config_shape(size: ModelSize) -> dict:
    """The config fields of `size` under BART's (and Scaleformer's) names."""
    return dict(
        vocab_size=size.vocab_size, d_model=size.d_model, encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn_dim, decoder_ffn_dim=size.ffn_dim,
    )


def model_configs(size: ModelSize, bart_max_position_embeddings: int,
                  models: Sequence[str] = DEFAULT_MODELS, *, longest_source: int | None = None,
                  longest_target: int | None = None) -> dict[str, PreTrainedConfig]:
    """Configs of one size for `models` (names of `TRAIN_MODEL_NAMES`), by default Scaleformer and BART.

    `scaleformer` is ScaleformerConfig's default at this size (local_softmax_decay, horizon 16, relative positions in
    cross attention, post-norm blocks; rows recorded before 2026-11-23 ran kernelized_rpe with pre-norm blocks);
    `scaleformer:TYPE` changes the attention type only.

    T5, LED and LongT5 take Scaleformer's dropout and special ids; T5's and LongT5's relative attention buckets keep
    their defaults. LED's encoder position table fits `longest_source` tokens padded to its window
    (`led_encoder_table_size`), its decoder table `longest_target` tokens (`bart_table_size`); either defaults
    to `bart_max_position_embeddings`.
    """
    shape = config_shape(size)
    scaleformer = ScaleformerConfig(**shape)
    configs: dict[str, PreTrainedConfig] = {}
    for name in models:
        kind, _, attention_type = name.partition(":")
        if name == "scaleformer":
            configs[name] = scaleformer
        elif kind == "scaleformer" and attention_type in ATTENTION_TYPES:
            configs[name] = ScaleformerConfig(**shape, attention_type=attention_type)
        elif name == "bart":
            # no forced end-of-sequence: decoding runs to the requested length, as for Scaleformer
            configs[name] = BartConfig(**shape, max_position_embeddings=bart_max_position_embeddings,
                                       forced_eos_token_id=None)
        elif name in ("t5", "longt5"):
            long = dict(encoder_attention_type="transient-global", local_radius=LONGT5_LOCAL_RADIUS,
                        global_block_size=LONGT5_GLOBAL_BLOCK_SIZE) if name == "longt5" else {}
            configs[name] = (LongT5Config if name == "longt5" else T5Config)(
                vocab_size=size.vocab_size, d_model=size.d_model, d_kv=size.d_model // size.heads, d_ff=size.ffn_dim,
                num_layers=size.layers, num_decoder_layers=size.layers, num_heads=size.heads,
                dropout_rate=scaleformer.dropout, tie_word_embeddings=True,
                pad_token_id=scaleformer.pad_token_id, bos_token_id=scaleformer.bos_token_id,
                eos_token_id=scaleformer.eos_token_id, decoder_start_token_id=scaleformer.decoder_start_token_id,
                **long,
            )
        elif name == "led":
            configs[name] = LEDConfig(
                **shape, dropout=scaleformer.dropout, attention_window=[LED_ATTENTION_WINDOW] * size.layers,
                max_encoder_position_embeddings=led_encoder_table_size(longest_source or bart_max_position_embeddings),
                max_decoder_position_embeddings=bart_table_size(longest_target or bart_max_position_embeddings),
                pad_token_id=scaleformer.pad_token_id, bos_token_id=scaleformer.bos_token_id,
                eos_token_id=scaleformer.eos_token_id, decoder_start_token_id=scaleformer.decoder_start_token_id,
                forced_eos_token_id=None,
            )
        else:
            raise ValueError(f"`models` takes names of {', '.join(TRAIN_MODEL_NAMES)}, got {name!r}")
    return configs


def build_model(name: str, config: PreTrainedConfig, seed: int) -> PreTrainedModel:
    """Random weights from `torch.manual_seed(seed)`, fp32; the class follows the name (`scaleformer:TYPE`
    builds a Scaleformer)."""
    kind = name.partition(":")[0]
    if kind not in MODEL_CLASSES:
        raise ValueError(f"`name` must be scaleformer, scaleformer:TYPE, bart, t5, led or longt5, got {name!r}")
    torch.manual_seed(seed)
    return MODEL_CLASSES[kind](config).to(DTYPE)


def count_parameters(model: PreTrainedModel) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_model(name: str, model: PreTrainedModel, bart_positions_note: str, *, decoding: bool) -> str:
    """One header line: parameters and what decides the model's cost in length (with `decoding`, in its cache)."""
    config = model.config
    text = f"{name}: {count_parameters(model) / 1e6:.1f} M parameters, "
    if name.startswith("scaleformer"):
        text += (f"attention_type {config.attention_type}, rpe_horizon {config.rpe_horizon}, attention_mode "
                 f"{config.attention_mode}, decoder_attention {config.decoder_attention}, remaining_count_max "
                 f"{config.remaining_count_max}")
        if decoding:
            return text + ("; self-attention state grows with position (keys and values)" if grows_with_position(name)
                           else "; self-attention state of constant size")
        return text + ("; softmax attention: quadratic in length" if grows_with_position(name) else "")
    if name == "led":
        windows = sorted(set(config.attention_window))
        return text + (f"attention implementation {config._attn_implementation}, encoder attention window "
                       f"{'/'.join(map(str, windows))} per layer (local, no global tokens: linear in length; sources "
                       f"padded to a multiple of the window), max_encoder_position_embeddings "
                       f"{config.max_encoder_position_embeddings} (the longest source rounded up to the window), "
                       f"max_decoder_position_embeddings {config.max_decoder_position_embeddings}; decoder and "
                       "cross-attention full")
    if name == "longt5":
        return text + (f"encoder_attention_type {config.encoder_attention_type}, local_radius {config.local_radius}, "
                       f"global_block_size {config.global_block_size} (transformers' defaults: linear in length), "
                       f"relative attention {config.relative_attention_num_buckets} buckets, max distance "
                       f"{config.relative_attention_max_distance}; decoder and cross-attention full")
    if name == "t5":
        cost = "every step attends over the whole history" if decoding else "quadratic in length"
        return text + (f"attention implementation {config._attn_implementation}, relative attention "
                       f"{config.relative_attention_num_buckets} buckets, max distance "
                       f"{config.relative_attention_max_distance}; the position bias is added to every score "
                       f"(a dense heads x Lq x Lk mask): {cost}")
    return text + (f"attention implementation {config._attn_implementation}, max_position_embeddings "
                   f"{config.max_position_embeddings} ({bart_positions_note}; BART's default is 1024)")


def bart_table_size(longest: int) -> int:
    """BART's `max_position_embeddings` for sequences of up to `longest` tokens: +2 (BART's position offset),
    rounded up to a multiple of 64."""
    return 64 * math.ceil((longest + 2) / 64)


def led_encoder_table_size(longest: int) -> int:
    """LED's `max_encoder_position_embeddings` for sources of up to `longest` tokens: LED pads every source to a
    multiple of its attention window, so the table holds `longest` rounded up to the window (one window at least)."""
    return LED_ATTENTION_WINDOW * max(1, math.ceil(longest / LED_ATTENTION_WINDOW))


# ------------------------------------------------------------ ablation names of bench_quality, bench_extrapolation


def add_model_size_arguments(parser: argparse.ArgumentParser, defaults: dict):
    """The group `model size (the same for every model)`: --d_model, --layers, --heads, --ffn_dim and --dropout,
    their help giving `defaults`; returned for more flags."""
    model = parser.add_argument_group("model size (the same for every model)")
    model.add_argument("--d_model", type=int, help=f"width (default: {defaults['d_model']})")
    model.add_argument("--layers", type=int,
                       help=f"encoder layers, and as many decoder layers (default: {defaults['layers']})")
    model.add_argument("--heads", type=int, help=f"attention heads (default: {defaults['heads']})")
    model.add_argument("--ffn_dim", type=int, help=f"feed-forward width (default: {defaults['ffn_dim']})")
    model.add_argument("--dropout", type=float, help=f"dropout of every model (default: {defaults['dropout']:g})")
    return model


class ModelSpec(NamedTuple):
    """What a `--models` name asks for; the fields after `attention_type` are Scaleformer config fields."""

    kind: str  # scaleformer, bart, t5, led or longt5
    attention_type: str | None  # None: the default (scaleformer) or not a Scaleformer
    cross_attention_rpe: bool = False
    absolute_positions: str | None = None
    layer_norm_position: str = "pre"
    decay_rate_range: tuple[float, float] | None = None  # None: the config's default
    feature_map: str = "elu"
    decoder_attention: str = "separate"
    count_block_heads: int | None = None  # None: the config's default (decoder_attention_heads)
    count_block_embeddings: bool = False
    count_block_zero_init: bool = False
    count_block_head_dim: int | None = None  # None: the config's default (d_model // count_block_heads)
    count_block_detach: bool = False
    count_block_embedding_dim: int | None = None  # None: the config's default (d_model)
    count_block_layer_scale: float | None = None  # None: no scale on the block's output
    remaining_count_max: int | None = None  # None: no remaining counts


MODEL_SUFFIXES = (
    "cross_rpe", "fast_decay", "slow_decay", "relu", "joint", "count", "count_block", "count_embeddings", "zero_init",
    "detach", "layer_scale", "remaining", "sinusoidal", "post_ln"
)
FAST_DECAY_RATE_RANGE = (0.5, 0.0625)  # `+fast_decay`: half-lives of 1.4 to 11 positions beyond the horizon
SLOW_DECAY_RATE_RANGE = (1e-4, 1e-5)  # `+slow_decay`: half-lives of 6,900 to 69,000 positions (almost none)
CROSS_RPE_TYPES = tuple(name for name, variant in ATTENTION_VARIANTS.items() if variant.cross_attention_rpe)
RELU_TYPES = tuple(name for name, variant in ATTENTION_VARIANTS.items() if "relu" in variant.feature_maps)
JOINT_TYPES = tuple(name for name in CROSS_RPE_TYPES if not ATTENTION_VARIANTS[name].normalised)


def parse_model_name(name: str, baselines: Sequence[str] = BASELINES) -> ModelSpec:
    """A name of `baselines` (by default `bart`, `t5`; `ALL_BASELINES` adds `led`, `longt5`), or `scaleformer` /
    `scaleformer:TYPE` followed by any of `+cross_rpe` (relative positions in cross-attention too, for the types
    whose `cross_attention_rpe` fact is set), `+fast_decay` / `+slow_decay` (decay types: `decay_rate_range`
    `FAST_DECAY_RATE_RANGE` / `SLOW_DECAY_RATE_RANGE`), `+relu` (`feature_map="relu"`, `RELU_TYPES`), `+joint`
    (`decoder_attention="joint"`, `JOINT_TYPES` with `+cross_rpe`), `+count` (`decoder_attention="count"`: any
    type, with `+cross_rpe` for `JOINT_TYPES`), `+count_block` (`decoder_attention="count_block"`: any type,
    with `+cross_rpe` for `JOINT_TYPES`; `+count_blockN`, N a number, also sets `count_block_heads=N`, and
    `+count_blockNxW` also `count_block_head_dim=W`),
    `+count_embeddings` (after `+count_block`: `count_block_embeddings=True`; `+count_embeddingsR`, R a number, also
    sets `count_block_embedding_dim=R`), `+zero_init` (after `+count_block`:
    `count_block_zero_init=True`), `+detach` (after `+count_block`, not with `+count_embeddings`:
    `count_block_detach=True`), `+layer_scaleS` (after `+count_block`, S a positive number such as 0.1:
    `count_block_layer_scale=S`), `+remainingK` (K a positive number: `remaining_count_max=K`), `+sinusoidal`
    (absolute positions)
    and `+post_ln` (post-norm blocks), in that order."""
    base, *suffixes = name.split("+")
    count_block_heads = count_block_head_dim = count_block_embedding_dim = count_block_layer_scale = None
    remaining_count_max = None
    for i, suffix in enumerate(suffixes):  # `count_blockN` / `count_blockNxW`: the count block with N heads (W wide)
        if match := re.fullmatch(r"count_block([1-9][0-9]*)(?:x([1-9][0-9]*))?", suffix):
            count_block_heads, suffixes[i] = int(match[1]), "count_block"
            count_block_head_dim = None if match[2] is None else int(match[2])
        elif match := re.fullmatch(r"count_embeddings([1-9][0-9]*)", suffix):  # a table of R channels
            count_block_embedding_dim, suffixes[i] = int(match[1]), "count_embeddings"
        elif match := re.fullmatch(r"layer_scale([0-9]*\.?[0-9]+)", suffix):  # the block's output scale, started at S
            count_block_layer_scale, suffixes[i] = float(match[1]), "layer_scale"
        elif match := re.fullmatch(r"remaining([1-9][0-9]*)", suffix):  # the remaining counts, clamped to K
            remaining_count_max, suffixes[i] = int(match[1]), "remaining"
    kind, _, attention_type = base.partition(":")
    usage = (f"unknown model {name!r}; use {', '.join(baselines)}, or scaleformer or scaleformer:TYPE with TYPE in "
             f"{', '.join(ATTENTION_TYPES)}, followed by any of " + ", ".join(f"+{x}" for x in MODEL_SUFFIXES)
             + " in that order, +count_blockN for N heads in the count block (+count_blockNxW: W channels each), "
             "+count_embeddings (+count_embeddingsR: a table of R channels), +zero_init, +detach and +layer_scaleS "
             "(S > 0) after +count_block only, +remainingK with K >= 1 (+cross_rpe with " + ", ".join(CROSS_RPE_TYPES)
             + " only, +fast_decay or +slow_decay "
             "with " + ", ".join(DECAY_TYPES) + " only, +relu with " + ", ".join(RELU_TYPES) + " only, +joint "
             "with " + ", ".join(JOINT_TYPES) + " and +cross_rpe only, +count or +count_block with +cross_rpe for those)")
    if kind in baselines and not attention_type and not suffixes:
        return ModelSpec(kind, None)
    if kind != "scaleformer" or (attention_type and attention_type not in ATTENTION_TYPES):
        raise ValueError(usage)
    if [x for x in MODEL_SUFFIXES if x in suffixes] != suffixes:  # unknown, repeated or out of order
        raise ValueError(usage)
    if "cross_rpe" in suffixes and (attention_type or DEFAULT_ATTENTION_TYPE) not in CROSS_RPE_TYPES:
        raise ValueError(usage)
    resolved = attention_type or DEFAULT_ATTENTION_TYPE
    decays = [x for x in ("fast_decay", "slow_decay") if x in suffixes]
    if decays and (resolved not in DECAY_TYPES or len(decays) > 1):
        raise ValueError(usage)
    if "relu" in suffixes and resolved not in RELU_TYPES:
        raise ValueError(usage)
    decoder_modes = [x for x in ("joint", "count", "count_block") if x in suffixes]
    # joint layers, and the count sums of an unnormalised type, add unnormalised sums: JOINT_TYPES with +cross_rpe
    needs_unnormalised_type = "joint" in suffixes or (bool(decoder_modes) and resolved in JOINT_TYPES)
    if any(x in suffixes for x in ("count_embeddings", "zero_init", "detach", "layer_scale")) and (
            "count_block" not in suffixes):
        raise ValueError(usage)
    if "detach" in suffixes and "count_embeddings" in suffixes:
        raise ValueError(usage)
    if "layer_scale" in suffixes and not count_block_layer_scale:  # bare `+layer_scale`, or a start of 0
        raise ValueError(usage)
    if "remaining" in suffixes and remaining_count_max is None:  # bare `+remaining`
        raise ValueError(usage)
    if len(decoder_modes) > 1 or needs_unnormalised_type and (
            resolved not in JOINT_TYPES or "cross_rpe" not in suffixes):
        raise ValueError(usage)
    rates = {"fast_decay": FAST_DECAY_RATE_RANGE, "slow_decay": SLOW_DECAY_RATE_RANGE}
    return ModelSpec(kind, attention_type or None, "cross_rpe" in suffixes,
                     "sinusoidal" if "sinusoidal" in suffixes else None, "post" if "post_ln" in suffixes else "pre",
                     rates[decays[0]] if decays else None, "relu" if "relu" in suffixes else "elu",
                     decoder_modes[0] if decoder_modes else "separate",
                     count_block_heads, "count_embeddings" in suffixes, "zero_init" in suffixes, count_block_head_dim,
                     "detach" in suffixes, count_block_embedding_dim, count_block_layer_scale, remaining_count_max)


def build_seq2seq(name: str, seed: int, size: ModelSize, dropout: float, bart_max_positions: int, *,
                  longest_source: int | None = None, longest_target: int | None = None) -> PreTrainedModel:
    """The model of a `parse_model_name` name (any of `ALL_BASELINES` included) at `size`, with `dropout` and the
    special ids PAD_ID, BOS_ID (also the decoder start) and EOS_ID; the baselines come from `model_configs`
    (`longest_source` and `longest_target` size LED's position tables)."""
    ids = dict(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID)
    spec = parse_model_name(name, ALL_BASELINES)
    if spec.kind in ALL_BASELINES:
        config = model_configs(size, bart_max_positions, [spec.kind], longest_source=longest_source,
                               longest_target=longest_target)[spec.kind]
        dropout_key = "dropout_rate" if spec.kind in ("t5", "longt5") else "dropout"
        for key, value in {**ids, dropout_key: dropout}.items():
            setattr(config, key, value)
        return build_model(spec.kind, config, seed)
    config = ScaleformerConfig(
        **config_shape(size), dropout=dropout, attention_type=spec.attention_type or DEFAULT_ATTENTION_TYPE,
        cross_attention_rpe=spec.cross_attention_rpe, absolute_positions=spec.absolute_positions,
        layer_norm_position=spec.layer_norm_position, feature_map=spec.feature_map,
        decoder_attention=spec.decoder_attention, count_block_heads=spec.count_block_heads,
        count_block_head_dim=spec.count_block_head_dim, count_block_detach=spec.count_block_detach,
        count_block_embeddings=spec.count_block_embeddings, count_block_zero_init=spec.count_block_zero_init,
        count_block_embedding_dim=spec.count_block_embedding_dim,
        count_block_layer_scale=spec.count_block_layer_scale, remaining_count_max=spec.remaining_count_max, **ids,
        **({} if spec.decay_rate_range is None else {"decay_rate_range": spec.decay_rate_range}),
    )
    return build_model("scaleformer", config, seed)


def collate(sources: list[list[int]], targets: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, labels): sources right-padded with PAD_ID, labels with -100."""
    input_ids = torch.full((len(sources), max(map(len, sources))), PAD_ID)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full((len(targets), max(map(len, targets))), -100)
    for row, (s, t) in enumerate(zip(sources, targets)):
        input_ids[row, :len(s)] = torch.tensor(s)
        attention_mask[row, :len(s)] = 1
        labels[row, :len(t)] = torch.tensor(t)
    return input_ids, attention_mask, labels
