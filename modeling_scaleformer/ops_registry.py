"""attention_type -> AttentionVariant: the op bundle `ScaleformerAttention` calls for each variant.

A variant names its learnable parameters (shape and initialisation), states the facts the rest of the
package reads about it (`description`, `softmax`, `modes`, `constant_state`, `rpe_shareable`,
`cross_attention_rpe`), and gives five pure functions with one calling convention, so that one
attention module serves every variant:

- `attention(q, k, v, params, *, causal, key_mask, query_offset, mode)`: full-sequence attention;
- `prefill_state(k, v, params, *, key_mask)`: the generation state after a prompt;
- `step(q, k, v, params, state, *, key_mask)`: `(out, state)` for new tokens after the state;
- `cross_summary(k, v, params, *, key_mask)`: what cross attention keeps of the encoder output, computed once;
- `cross_step(q, params, summary, *, query_offset)`: cross attention of new queries on that summary.

q, k, v have shape (B, H, L, D); `params` maps the parameter names to tensors in q's dtype and, for a variant
whose `feature_maps` fact lists more than one feature map, `"feature_map"` to the configured one (a key of
`ops_common.FEATURE_MAPS`). Each role is
a named function of this module, `<family>_forward`, `_prefill`, `_decode`, `_cross_prefill`,
`_cross_decode` and `_parameters` (a family's function serves every variant it fits, e.g.
`kernelized_forward` with or without a `rel` table), and each entry names all of them, like
transformers' `eager_attention_forward` in `ALL_ATTENTION_FUNCTIONS`. Cross attention uses the variant
named by `cross_attention_type`: the self-attention family without its position term (kernelized or
softmax), or, when `config.cross_attention_rpe` is set, the self-attention variant with its relative
positions (kernelized_rpe, the decay types and kernelized_sum).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from .ops_decay import (
    kernelized_decay_attention,
    kernelized_decay_cross_step,
    kernelized_decay_cross_summary,
    kernelized_decay_prefill_state,
    kernelized_decay_step,
    kernelized_sum_attention,
    kernelized_sum_cross_step,
    kernelized_sum_cross_summary,
    prefix_sums_fit,
)
from .ops_local_softmax import (
    local_softmax_decay_attention,
    local_softmax_decay_cross_step,
    local_softmax_decay_cross_summary,
    local_softmax_decay_is_operator,
    local_softmax_decay_prefill_state,
    local_softmax_decay_step,
)
from .ops_fourier import fourier_attention, fourier_prefill_state, fourier_step
from .ops_kernelized import (
    kernelized_rpe_attention,
    kernelized_rpe_cross_step,
    kernelized_rpe_cross_summary,
    kernelized_rpe_prefill_state,
    kernelized_rpe_step,
)
from .ops_common import horizon_of
from .ops_softmax import (
    shaw_softmax_attention,
    softmax_attention,
    softmax_cross_state,
    softmax_cross_step,
    softmax_prefill_state,
    softmax_step,
    xl_relative_attention,
)
from .ops_toeplitz import toeplitz_attention, toeplitz_prefill_state, toeplitz_step


Init = Literal["normal", "zeros", "ones", "frequencies", "decay_rates"]


class ParameterSpec(NamedTuple):
    """Shape and initialisation of one learnable parameter of a variant.

    `init`: "normal" (std `config.init_std`), "zeros", "ones", "frequencies" (a_k = 10000^(-k/D) along
    the head dimension, the rotary-embedding spectrum, so that cos(a (i - j)) spans short and long ranges),
    or "decay_rates" (softplus^-1 of `decay_spectrum`: per-head decay rates from fast to slow).
    """

    shape: tuple[int, ...]
    init: Init


def rotary_spectrum(head_dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """a_k = 10000^(-k / D), k = 0..D-1: the values of a "frequencies" parameter at initialisation."""
    return 10000.0 ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim).to(dtype)


DEFAULT_DECAY_RATE_RANGE = (0.25, 2.0**-8)


def decay_spectrum(
    heads: int, rate_range: tuple[float, float] = DEFAULT_DECAY_RATE_RANGE, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Decay rates per position beyond the horizon, geometric from the fastest to the slowest of `rate_range`
    over the heads (their geometric mean for one head). The default, 1/4 to 1/256, gives half-lives from under
    3 to 177 positions, so that heads read near and far."""
    fastest, slowest = (math.log2(float(r)) for r in rate_range)
    if heads == 1:
        exponents = torch.tensor([(fastest + slowest) / 2], dtype=torch.float64)
    else:
        exponents = torch.linspace(fastest, slowest, heads, dtype=torch.float64)
    return (2.0 ** exponents).to(dtype)


def inverse_softplus(x: Tensor) -> Tensor:
    """The raw parameter whose softplus is x > 0."""
    return x + torch.log(-torch.expm1(-x))


class AttentionVariant(NamedTuple):
    """The op bundle of one `attention_type` (see the module docstring for the calling convention).

    Fields:
        parameters: `(heads, head_dim, horizon, shared_across_heads) -> {name: ParameterSpec}`.
        attention, prefill_state, step, cross_summary, cross_step: the pure functions; `cross_summary`
            and `cross_step` are None for a variant cross attention never uses.
        modes: the `mode` strings the ops accept for each `config.attention_mode`; a missing key means
            the variant has no such algorithm.
        constant_state: whether the generation state keeps its size as tokens are generated.
        description: one line: what the score of a (query, key) pair is.
        softmax: whether the variant is of the softmax family (quadratic, a growing key/value cache),
            rather than linear kernelized attention.
        rpe_shareable: whether `config.rpe_shared_across_heads` applies (one relative table for all heads).
        cross_attention_rpe: whether `config.cross_attention_rpe` applies: cross attention then uses this
            variant itself, relative positions included.
        normalised: whether the op divides by a row normaliser; when it does not, `ScaleformerAttention`
            puts a per-head RMSNorm and a SiLU output gate on its output.
        feature_maps: the feature maps phi of its kernelized scores that `config.feature_map` may choose
            (keys of `ops_common.FEATURE_MAPS`); the first is the default.
        traced: `(device, dtype, parameter specs, head_dim, causal) -> bool`, whether `attention` (linear or auto mode,
            no generation state, inputs of `dtype`) is there what torch.compile may trace: `torch.library` operators
            (the Triton kernels) or a few tensor operations; elsewhere (None: everywhere) `ScaleformerAttention` keeps
            the op from torch.compile, which would compile its Python loops over blocks and chunks once per shape.
    """

    parameters: Callable[[int, int, int, bool], dict[str, ParameterSpec]]
    attention: Callable[..., Tensor]
    prefill_state: Callable
    step: Callable
    cross_summary: Callable | None
    cross_step: Callable | None
    modes: dict[str, str]
    constant_state: bool
    description: str
    softmax: bool
    rpe_shareable: bool
    cross_attention_rpe: bool
    normalised: bool = True
    feature_maps: tuple[str, ...] = ("elu",)
    traced: Callable[[torch.device, torch.dtype, dict[str, ParameterSpec], int, bool], bool] | None = None


# `config.attention_mode` -> the ops' `mode`: the linear variants have both algorithms, the softmax
# variants only the quadratic one ("auto" runs SDPA)
LINEAR_MODES = {"auto": "auto", "linear": "linear", "naive": "naive"}
QUADRATIC_MODES = {"auto": "auto", "naive": "naive"}


def no_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """No parameters besides the projections."""
    return {}


def rel_table_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """`rel` (H or 1, 2h+1, D): row h + t embeds the distance p_i - j = t, per head or shared by the heads."""
    return {"rel": ParameterSpec((1 if shared else heads, 2 * horizon + 1, head_dim), "normal")}


def _rel(params: dict[str, Tensor]) -> Tensor | None:
    rel = params.get("rel")
    if rel is None:
        return None
    return rel[0] if rel.shape[0] == 1 else rel  # a table shared by the heads


# kernelized attention, with ("kernelized_rpe") or without ("kernelized") clipped relative positions


def kernelized_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return kernelized_rpe_attention(
        q, k, v, _rel(params), causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    )


def kernelized_prefill(k, v, params, *, key_mask):
    return kernelized_rpe_prefill_state(k, v, horizon=horizon_of(_rel(params)), key_mask=key_mask)


def kernelized_decode(q, k, v, params, state, *, key_mask):
    return kernelized_rpe_step(q, k, v, _rel(params), state, key_mask=key_mask)


def kernelized_rpe_cross_prefill(k, v, params, *, key_mask):
    return kernelized_rpe_cross_summary(k, v, key_mask=key_mask, relative=True)


def kernelized_cross_prefill(k, v, params, *, key_mask):
    return kernelized_rpe_cross_summary(k, v, key_mask=key_mask, relative=False)


def kernelized_cross_decode(q, params, summary, *, query_offset):
    return kernelized_rpe_cross_step(q, _rel(params), summary, query_offset=query_offset)


KERNELIZED_RPE = AttentionVariant(
    description="phi(q_i).phi(k_j) + phi(q_i).phi(rel[r(i, j)]) over its row sum: relative positions, linear",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=True, cross_attention_rpe=True,
    parameters=rel_table_parameters, attention=kernelized_forward, prefill_state=kernelized_prefill,
    step=kernelized_decode, cross_summary=kernelized_rpe_cross_prefill, cross_step=kernelized_cross_decode,
)
KERNELIZED = AttentionVariant(
    description="phi(q_i).phi(k_j) over its row sum: no position information, linear",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=False, cross_attention_rpe=False,
    parameters=no_parameters, attention=kernelized_forward, prefill_state=kernelized_prefill,
    step=kernelized_decode, cross_summary=kernelized_cross_prefill, cross_step=kernelized_cross_decode,
)


# kernelized attention with clipped relative positions and a per-head decay beyond the horizon, row-normalised
# ("kernelized_decay") or not, with a per-head RMSNorm and an output gate ("kernelized_decay_gated"); the gated
# sum without the relative table, the decay from distance 0 ("kernelized_gated")


def decay_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """`rel` as for kernelized_rpe and `decay` (H,): softplus(decay) is each head's rate beyond the horizon."""
    return {**rel_table_parameters(heads, head_dim, horizon, shared), "decay": ParameterSpec((heads,), "decay_rates")}


def _decay_rates(params: dict[str, Tensor]) -> Tensor:
    return torch.nn.functional.softplus(params["decay"])


def _feature_map(params: dict) -> str:
    return params.get("feature_map", "elu")


def kernelized_decay_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return kernelized_decay_attention(
        q, k, v, _rel(params), _decay_rates(params), causal=causal, key_mask=key_mask, query_offset=query_offset,
        mode=mode, normalise=True, feature_map=_feature_map(params),
    )


def kernelized_decay_prefill(k, v, params, *, key_mask):
    return kernelized_decay_prefill_state(
        k, v, _decay_rates(params), horizon=horizon_of(_rel(params)), key_mask=key_mask, normalise=True,
        feature_map=_feature_map(params),
    )


def kernelized_decay_decode(q, k, v, params, state, *, key_mask):
    return kernelized_decay_step(
        q, k, v, _rel(params), _decay_rates(params), state, key_mask=key_mask, normalise=True,
        feature_map=_feature_map(params),
    )


def kernelized_decay_cross_prefill(k, v, params, *, key_mask):
    return kernelized_decay_cross_summary(k, v, key_mask=key_mask)


def kernelized_decay_cross_decode(q, params, summary, *, query_offset):
    return kernelized_decay_cross_step(
        q, _rel(params), _decay_rates(params), summary, query_offset=query_offset, normalise=True,
        feature_map=_feature_map(params),
    )


def _horizon(params: dict[str, Tensor]) -> int:
    """h of the relative table, or 0 without one (`kernelized_gated`: the decay starts at distance 0)."""
    rel = _rel(params)
    return 0 if rel is None else horizon_of(rel)


def kernelized_decay_gated_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return kernelized_decay_attention(
        q, k, v, _rel(params), _decay_rates(params), causal=causal, key_mask=key_mask, query_offset=query_offset,
        mode=mode, horizon=_horizon(params), feature_map=_feature_map(params),
    )


def kernelized_decay_gated_prefill(k, v, params, *, key_mask):
    return kernelized_decay_prefill_state(
        k, v, _decay_rates(params), horizon=_horizon(params), key_mask=key_mask, feature_map=_feature_map(params),
    )


def kernelized_decay_gated_decode(q, k, v, params, state, *, key_mask):
    return kernelized_decay_step(
        q, k, v, _rel(params), _decay_rates(params), state, key_mask=key_mask, horizon=_horizon(params),
        feature_map=_feature_map(params),
    )


def kernelized_decay_gated_cross_decode(q, params, summary, *, query_offset):
    return kernelized_decay_cross_step(
        q, _rel(params), _decay_rates(params), summary, query_offset=query_offset, horizon=_horizon(params),
        feature_map=_feature_map(params),
    )


def decay_only_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """`decay` (H,) only: softplus(decay) is each head's rate per position of distance."""
    return {"decay": ParameterSpec((heads,), "decay_rates")}


KERNELIZED_DECAY = AttentionVariant(
    description="(phi(q_i).phi(k_j) + phi(q_i).phi(rel[r(i, j)])) exp(-lambda max(|i - j| - h, 0)) over its row "
    "sum: relative positions that fade beyond the horizon, linear",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=True, cross_attention_rpe=True,
    parameters=decay_parameters, attention=kernelized_decay_forward, prefill_state=kernelized_decay_prefill,
    step=kernelized_decay_decode, cross_summary=kernelized_decay_cross_prefill, cross_step=kernelized_decay_cross_decode,
    feature_maps=("elu", "relu"),
)
KERNELIZED_DECAY_GATED = AttentionVariant(
    description="(phi(q_i).phi(k_j) + phi(q_i).phi(rel[r(i, j)])) exp(-lambda max(|i - j| - h, 0)), no row "
    "normaliser (per-head RMSNorm and output gate): linear",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=True, cross_attention_rpe=True,
    normalised=False, parameters=decay_parameters, attention=kernelized_decay_gated_forward,
    prefill_state=kernelized_decay_gated_prefill, step=kernelized_decay_gated_decode,
    cross_summary=kernelized_decay_cross_prefill, cross_step=kernelized_decay_gated_cross_decode,
    feature_maps=("elu", "relu"),
)

# the same ops without the relative table: `_horizon` is 0, so the decay starts at distance 0
KERNELIZED_GATED = KERNELIZED_DECAY_GATED._replace(
    description="phi(q_i).phi(k_j) exp(-lambda |i - j|), no row normaliser (per-head RMSNorm and output gate): "
    "a per-head decay and no other position information (retention with a feature map), linear",
    rpe_shareable=False, parameters=decay_only_parameters,
)


# the plain sum of the same ops, without relative table and without decay ("kernelized_sum"): what a key adds
# never fades, so a sum over matching keys is their count at any length


def no_decay(x: Tensor) -> Tensor:
    """Rates of 0 for the heads of `x` (B, H, L, D)."""
    return x.new_zeros(x.shape[1])


def kernelized_sum_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return kernelized_sum_attention(
        q, k, v, causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode,
        feature_map=_feature_map(params),
    )


def kernelized_sum_traced(device: torch.device, dtype: torch.dtype, specs: dict[str, ParameterSpec], head_dim: int,
                          causal: bool) -> bool:
    """Whether the attention is a few tensor operations (the keys' sums, or their running sums where those fit, or
    the quadratic scores), not the chunked path's loops: on any device."""
    return not causal or prefix_sums_fit(head_dim, head_dim)


def kernelized_sum_prefill(k, v, params, *, key_mask):
    return kernelized_decay_prefill_state(
        k, v, no_decay(k), horizon=0, key_mask=key_mask, feature_map=_feature_map(params),
    )


def kernelized_sum_decode(q, k, v, params, state, *, key_mask):
    return kernelized_decay_step(
        q, k, v, None, no_decay(q), state, key_mask=key_mask, horizon=0, feature_map=_feature_map(params),
    )


def kernelized_sum_cross_prefill(k, v, params, *, key_mask):
    return kernelized_sum_cross_summary(k, v, key_mask=key_mask, feature_map=_feature_map(params))


def kernelized_sum_cross_decode(q, params, summary, *, query_offset):
    return kernelized_sum_cross_step(q, summary, feature_map=_feature_map(params))


KERNELIZED_SUM = KERNELIZED_DECAY_GATED._replace(
    description="phi(q_i).phi(k_j), no row normaliser (per-head RMSNorm and output gate) and no position "
    "information: sums that keep every key's weight at any distance, linear",
    rpe_shareable=False, parameters=no_parameters, attention=kernelized_sum_forward, traced=kernelized_sum_traced,
    prefill_state=kernelized_sum_prefill, step=kernelized_sum_decode, cross_summary=kernelized_sum_cross_prefill,
    cross_step=kernelized_sum_cross_decode,
)


# softmax over the 2h+1 nearest keys (Shaw relative keys), kernelized attention with a per-head decay beyond
# them, one row normaliser ("local_softmax_decay")


def local_softmax_decay_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return local_softmax_decay_attention(
        q, k, v, _rel(params), _decay_rates(params), causal=causal, key_mask=key_mask, query_offset=query_offset,
        mode=mode,
    )


def local_softmax_decay_traced(device: torch.device, dtype: torch.dtype, specs: dict[str, ParameterSpec],
                               head_dim: int, causal: bool) -> bool:
    """Whether the attention is the Triton kernels' operators on `device` (CUDA, sizes they take in `dtype`)."""
    return local_softmax_decay_is_operator(device, (specs["rel"].shape[1] - 1) // 2, head_dim, head_dim, dtype)


def local_softmax_decay_prefill(k, v, params, *, key_mask):
    return local_softmax_decay_prefill_state(k, v, _decay_rates(params), horizon=horizon_of(_rel(params)), key_mask=key_mask)


def local_softmax_decay_decode(q, k, v, params, state, *, key_mask):
    return local_softmax_decay_step(q, k, v, _rel(params), _decay_rates(params), state, key_mask=key_mask)


def local_softmax_decay_cross_prefill(k, v, params, *, key_mask):
    return local_softmax_decay_cross_summary(k, v, _decay_rates(params), key_mask=key_mask)


def local_softmax_decay_cross_decode(q, params, summary, *, query_offset):
    return local_softmax_decay_cross_step(q, _rel(params), _decay_rates(params), summary, query_offset=query_offset)


LOCAL_SOFTMAX_DECAY = AttentionVariant(
    description="exp(q_i.(k_j + rel[r(i, j)]) / sqrt(d)) within the horizon, phi(q_i).phi(k_j) / d exp(-lambda "
    "(|i - j| - h)) beyond, over its row sum: a local softmax with a fading linear tail, linear",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=True, cross_attention_rpe=True,
    parameters=decay_parameters, attention=local_softmax_decay_forward, prefill_state=local_softmax_decay_prefill,
    step=local_softmax_decay_decode, cross_summary=local_softmax_decay_cross_prefill,
    cross_step=local_softmax_decay_cross_decode, traced=local_softmax_decay_traced,
)


# kernelized attention with a Fourier (cosine) relative-position kernel


def fourier_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """Frequencies a (H, D, 1), phases b (H, D) and amplitudes c (H, D) of `fourier_attention`."""
    return {
        "frequencies": ParameterSpec((heads, head_dim, 1), "frequencies"),
        "phases": ParameterSpec((heads, head_dim), "zeros"),
        "amplitudes": ParameterSpec((heads, head_dim), "ones"),
    }


def _fourier_args(params: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    return params["frequencies"], params["phases"], params["amplitudes"]


def fourier_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return fourier_attention(
        q, k, v, *_fourier_args(params), causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    )


def fourier_prefill(k, v, params, *, key_mask):
    return fourier_prefill_state(k, v, params["frequencies"], key_mask=key_mask)


def fourier_decode(q, k, v, params, state, *, key_mask):
    return fourier_step(q, k, v, *_fourier_args(params), state, key_mask=key_mask)


FOURIER = AttentionVariant(
    description="sum_k c_k phi(q_i)_k phi(k_j)_k cos(b_k + a_k (i - j)) over its guarded row sum: linear",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=False, cross_attention_rpe=False,
    parameters=fourier_parameters, attention=fourier_forward, prefill_state=fourier_prefill,
    step=fourier_decode, cross_summary=None, cross_step=None,
)


# kernelized attention with a multiplicative Toeplitz relative bias exp(b_{j-i}), FFT training path


def toeplitz_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return toeplitz_attention(
        q, k, v, params["rel_bias"], causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    )


def toeplitz_prefill(k, v, params, *, key_mask):
    return toeplitz_prefill_state(k, v, (params["rel_bias"].shape[-1] - 1) // 2, key_mask=key_mask)


def toeplitz_decode(q, k, v, params, state, *, key_mask):
    return toeplitz_step(q, k, v, params["rel_bias"], state, key_mask=key_mask)


def toeplitz_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """`rel_bias` (H, 2h+1), stored by key offset: row r is the bias of j - p_i = r - h (see `ops_toeplitz`)."""
    return {"rel_bias": ParameterSpec((heads, 2 * horizon + 1), "zeros")}


TOEPLITZ = AttentionVariant(
    description="exp(rel_bias[j - i]) phi(q_i).phi(k_j) over its row sum: O(L log L) by FFT",
    softmax=False, modes=LINEAR_MODES, constant_state=True, rpe_shareable=False, cross_attention_rpe=False,
    parameters=toeplitz_parameters, attention=toeplitz_forward, prefill_state=toeplitz_prefill,
    step=toeplitz_decode, cross_summary=None, cross_step=None,
)


# softmax baselines: plain, Shaw et al. (2018) relative keys, Transformer-XL relative attention; all keep
# their keys and values for generation


def softmax_prefill(k, v, params, *, key_mask):
    return softmax_prefill_state(k, v, key_mask=key_mask)


def xl_relative_parameters(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    """Content bias u (H, D), relative embeddings R (H, 2h+1, D) and relative scalar bias s (H, 2h+1)."""
    return {
        "content_bias": ParameterSpec((heads, head_dim), "zeros"),
        "rel": ParameterSpec((heads, 2 * horizon + 1, head_dim), "normal"),
        "rel_bias": ParameterSpec((heads, 2 * horizon + 1), "zeros"),
    }


def xl_relative_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return xl_relative_attention(
        q, k, v, params["content_bias"], params["rel"], params["rel_bias"],
        causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode,
    )


def xl_relative_decode(q, k, v, params, state, *, key_mask):
    u, rel, bias = params["content_bias"], params["rel"], params["rel_bias"]
    return softmax_step(q, k, v, state, key_mask=key_mask, u=u, rel=rel, bias=bias, variant="xl_relative")


XL_RELATIVE = AttentionVariant(
    description="softmax_j(((q_i + u).k_j + q_i.rel[r(i, j)] + rel_bias[r(i, j)]) / sqrt(d)): quadratic",
    softmax=True, modes=QUADRATIC_MODES, constant_state=False, rpe_shareable=False, cross_attention_rpe=False,
    parameters=xl_relative_parameters, attention=xl_relative_forward, prefill_state=softmax_prefill,
    step=xl_relative_decode, cross_summary=None, cross_step=None,
)


def shaw_softmax_decode(q, k, v, params, state, *, key_mask):
    return softmax_step(q, k, v, state, key_mask=key_mask, rel=_rel(params), variant="shaw_softmax")


def shaw_softmax_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return shaw_softmax_attention(
        q, k, v, _rel(params), causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    )


SHAW_SOFTMAX = AttentionVariant(
    description="softmax_j(q_i.(k_j + rel[r(i, j)]) / sqrt(d)): Shaw et al. relative keys, quadratic",
    softmax=True, modes=QUADRATIC_MODES, constant_state=False, rpe_shareable=True, cross_attention_rpe=False,
    parameters=rel_table_parameters, attention=shaw_softmax_forward, prefill_state=softmax_prefill,
    step=shaw_softmax_decode, cross_summary=None, cross_step=None,
)


def softmax_cross_prefill(k, v, params, *, key_mask):
    return softmax_cross_state(k, v, key_mask=key_mask)


def softmax_cross_decode(q, params, summary, *, query_offset):
    return softmax_cross_step(q, summary)


def softmax_forward(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return softmax_attention(q, k, v, causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode)


def softmax_decode(q, k, v, params, state, *, key_mask):
    return softmax_step(q, k, v, state, key_mask=key_mask)


SOFTMAX = AttentionVariant(
    description="softmax_j(q_i.k_j / sqrt(d)): no position information, quadratic",
    softmax=True, modes=QUADRATIC_MODES, constant_state=False, rpe_shareable=False, cross_attention_rpe=False,
    parameters=no_parameters, attention=softmax_forward, prefill_state=softmax_prefill,
    step=softmax_decode, cross_summary=softmax_cross_prefill, cross_step=softmax_cross_decode,
)


ATTENTION_VARIANTS: dict[str, AttentionVariant] = {
    "kernelized_rpe": KERNELIZED_RPE,
    "kernelized": KERNELIZED,
    "kernelized_decay": KERNELIZED_DECAY,
    "kernelized_decay_gated": KERNELIZED_DECAY_GATED,
    "kernelized_gated": KERNELIZED_GATED,
    "kernelized_sum": KERNELIZED_SUM,
    "local_softmax_decay": LOCAL_SOFTMAX_DECAY,
    "fourier": FOURIER,
    "toeplitz": TOEPLITZ,
    "xl_relative": XL_RELATIVE,
    "shaw_softmax": SHAW_SOFTMAX,
    "softmax": SOFTMAX,
}

ATTENTION_TYPES = tuple(ATTENTION_VARIANTS)
SOFTMAX_TYPES = tuple(name for name, variant in ATTENTION_VARIANTS.items() if variant.softmax)
# the types with a learned decay beyond the horizon (`config.decay_rate_range` applies to them)
DECAY_TYPES = tuple(
    name for name, variant in ATTENTION_VARIANTS.items() if "decay" in variant.parameters(1, 1, 1, False)
)


def get_attention_variant(attention_type: str) -> AttentionVariant:
    """The op bundle registered under `attention_type`; ValueError names the known types otherwise."""
    if attention_type not in ATTENTION_VARIANTS:
        raise ValueError(f"`attention_type` must be one of {ATTENTION_TYPES}, got {attention_type!r}")
    return ATTENTION_VARIANTS[attention_type]


def cross_attention_type(attention_type: str, cross_attention_rpe: bool) -> str:
    """The variant cross attention uses: the self-attention family without positions, or with
    `cross_attention_rpe` the self-attention variant itself (one whose `cross_attention_rpe` fact is True)."""
    if cross_attention_rpe:
        if not get_attention_variant(attention_type).cross_attention_rpe:
            raise ValueError(f"`cross_attention_rpe` does not apply to attention_type {attention_type!r}")
        return attention_type
    return "softmax" if get_attention_variant(attention_type).softmax else "kernelized"


__all__ = [
    "ATTENTION_TYPES",
    "ATTENTION_VARIANTS",
    "AttentionVariant",
    "ParameterSpec",
    "SOFTMAX_TYPES",
    "cross_attention_type",
    "DECAY_TYPES",
    "DEFAULT_DECAY_RATE_RANGE",
    "decay_spectrum",
    "get_attention_variant",
    "rotary_spectrum",
]
