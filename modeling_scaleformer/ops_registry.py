"""attention_type -> AttentionVariant: the op bundle `ScaleformerAttention` calls for each variant.

A variant names its learnable parameters (shape and initialisation) and gives five pure functions with
one calling convention, so that one attention module serves every variant:

- `attention(q, k, v, params, *, causal, key_mask, query_offset, mode)`: full-sequence attention;
- `prefill_state(k, v, params, *, key_mask)`: the generation state after a prompt;
- `step(q, k, v, params, state, *, key_mask)`: `(out, state)` for new tokens after the state;
- `cross_summary(k, v, *, key_mask)`: what cross attention keeps of the encoder output, computed once;
- `cross_step(q, params, summary, *, query_offset)`: cross attention of new queries on that summary.

q, k, v have shape (B, H, L, D); `params` maps the parameter names to tensors in q's dtype.
Cross attention uses the variant named by `cross_attention_type`: the self-attention variant without
its position term (kernelized or softmax), or kernelized attention with relative positions when
`config.cross_attention_rpe` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
from torch import Tensor

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


ATTENTION_TYPES = ("kernelized_rpe", "kernelized", "fourier", "toeplitz", "xl_relative", "shaw_softmax", "softmax")

Init = Literal["normal", "zeros", "ones", "frequencies"]


class ParameterSpec(NamedTuple):
    """Shape and initialisation of one learnable parameter of a variant.

    `init`: "normal" (std `config.init_std`), "zeros", "ones", or "frequencies" (a_k = 10000^(-k/D) along
    the head dimension, the rotary-embedding spectrum, so that cos(a (i - j)) spans short and long ranges).
    """

    shape: tuple[int, ...]
    init: Init


def rotary_spectrum(head_dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """a_k = 10000^(-k / D), k = 0..D-1: the values of a "frequencies" parameter at initialisation."""
    return 10000.0 ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim).to(dtype)


class AttentionVariant(NamedTuple):
    """The op bundle of one `attention_type` (see the module docstring for the calling convention).

    Fields:
        parameters: `(heads, head_dim, horizon, shared_across_heads) -> {name: ParameterSpec}`.
        attention, prefill_state, step, cross_summary, cross_step: the pure functions.
        modes: the `mode` strings the ops accept for each `config.attention_mode`; a missing key means
            the variant has no such algorithm.
        constant_state: whether the generation state keeps its size as tokens are generated.
    """

    parameters: Callable[[int, int, int, bool], dict[str, ParameterSpec]]
    attention: Callable[..., Tensor]
    prefill_state: Callable
    step: Callable
    cross_summary: Callable | None
    cross_step: Callable | None
    modes: dict[str, str]
    constant_state: bool


KERNELIZED_MODES = {"auto": "auto", "linear": "linear", "naive": "naive"}
SOFTMAX_MODES = {"auto": "auto", "naive": "naive"}


def _rel_table(heads: int, head_dim: int, horizon: int, shared: bool) -> dict[str, ParameterSpec]:
    return {"rel": ParameterSpec((1 if shared else heads, 2 * horizon + 1, head_dim), "normal")}


def _rel(params: dict[str, Tensor]) -> Tensor | None:
    rel = params.get("rel")
    if rel is None:
        return None
    return rel[0] if rel.shape[0] == 1 else rel  # a table shared by the heads


# kernelized attention, with ("kernelized_rpe") or without ("kernelized") clipped relative positions


def _kernelized_attention(q, k, v, params, *, causal, key_mask, query_offset, mode):
    return kernelized_rpe_attention(
        q, k, v, _rel(params), causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    )


def _kernelized_prefill(k, v, params, *, key_mask):
    return kernelized_rpe_prefill_state(k, v, horizon=horizon_of(_rel(params)), key_mask=key_mask)


def _kernelized_step(q, k, v, params, state, *, key_mask):
    return kernelized_rpe_step(q, k, v, _rel(params), state, key_mask=key_mask)


def _kernelized_summary(k, v, *, key_mask, relative):
    return kernelized_rpe_cross_summary(k, v, key_mask=key_mask, relative=relative)


def _kernelized_cross_step(q, params, summary, *, query_offset):
    return kernelized_rpe_cross_step(q, _rel(params), summary, query_offset=query_offset)


KERNELIZED_RPE = AttentionVariant(
    parameters=_rel_table,
    attention=_kernelized_attention,
    prefill_state=_kernelized_prefill,
    step=_kernelized_step,
    cross_summary=lambda k, v, *, key_mask: _kernelized_summary(k, v, key_mask=key_mask, relative=True),
    cross_step=_kernelized_cross_step,
    modes=KERNELIZED_MODES,
    constant_state=True,
)

KERNELIZED = KERNELIZED_RPE._replace(
    parameters=lambda heads, head_dim, horizon, shared: {},
    cross_summary=lambda k, v, *, key_mask: _kernelized_summary(k, v, key_mask=key_mask, relative=False),
)


# kernelized attention with a Fourier (cosine) relative-position kernel


def _fourier_parameters(heads, head_dim, horizon, shared):
    return {
        "frequencies": ParameterSpec((heads, head_dim, 1), "frequencies"),
        "phases": ParameterSpec((heads, head_dim), "zeros"),
        "amplitudes": ParameterSpec((heads, head_dim), "ones"),
    }


def _fourier_args(params):
    return params["frequencies"], params["phases"], params["amplitudes"]


FOURIER = AttentionVariant(
    parameters=_fourier_parameters,
    attention=lambda q, k, v, params, *, causal, key_mask, query_offset, mode: fourier_attention(
        q, k, v, *_fourier_args(params), causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    ),
    prefill_state=lambda k, v, params, *, key_mask: fourier_prefill_state(
        k, v, params["frequencies"], key_mask=key_mask
    ),
    step=lambda q, k, v, params, state, *, key_mask: fourier_step(
        q, k, v, *_fourier_args(params), state, key_mask=key_mask
    ),
    cross_summary=None,
    cross_step=None,
    modes=KERNELIZED_MODES,
    constant_state=True,
)


# kernelized attention with a multiplicative Toeplitz relative bias exp(b_{j-i}), FFT training path


TOEPLITZ = AttentionVariant(
    parameters=lambda heads, head_dim, horizon, shared: {"rel_bias": ParameterSpec((heads, 2 * horizon + 1), "zeros")},
    attention=lambda q, k, v, params, *, causal, key_mask, query_offset, mode: toeplitz_attention(
        q, k, v, params["rel_bias"], causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    ),
    prefill_state=lambda k, v, params, *, key_mask: toeplitz_prefill_state(
        k, v, (params["rel_bias"].shape[-1] - 1) // 2, key_mask=key_mask
    ),
    step=lambda q, k, v, params, state, *, key_mask: toeplitz_step(
        q, k, v, params["rel_bias"], state, key_mask=key_mask
    ),
    cross_summary=None,
    cross_step=None,
    modes=KERNELIZED_MODES,
    constant_state=True,
)


# softmax baselines: plain, Shaw et al. (2018) relative keys, Transformer-XL relative attention


def _softmax_prefill(k, v, params, *, key_mask):
    return softmax_prefill_state(k, v, key_mask=key_mask)


SOFTMAX = AttentionVariant(
    parameters=lambda heads, head_dim, horizon, shared: {},
    attention=lambda q, k, v, params, *, causal, key_mask, query_offset, mode: softmax_attention(
        q, k, v, causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    ),
    prefill_state=_softmax_prefill,
    step=lambda q, k, v, params, state, *, key_mask: softmax_step(q, k, v, state, key_mask=key_mask),
    cross_summary=lambda k, v, *, key_mask: softmax_cross_state(k, v, key_mask=key_mask),
    cross_step=lambda q, params, summary, *, query_offset: softmax_cross_step(q, summary),
    modes=SOFTMAX_MODES,
    constant_state=False,
)

SHAW_SOFTMAX = SOFTMAX._replace(
    parameters=_rel_table,
    attention=lambda q, k, v, params, *, causal, key_mask, query_offset, mode: shaw_softmax_attention(
        q, k, v, _rel(params), causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode
    ),
    step=lambda q, k, v, params, state, *, key_mask: softmax_step(
        q, k, v, state, key_mask=key_mask, rel=_rel(params), variant="shaw_softmax"
    ),
    cross_summary=None,
    cross_step=None,
)


def _xl_parameters(heads, head_dim, horizon, shared):
    return {
        "content_bias": ParameterSpec((heads, head_dim), "zeros"),
        "rel": ParameterSpec((heads, 2 * horizon + 1, head_dim), "normal"),
        "rel_bias": ParameterSpec((heads, 2 * horizon + 1), "zeros"),
    }


XL_RELATIVE = SOFTMAX._replace(
    parameters=_xl_parameters,
    attention=lambda q, k, v, params, *, causal, key_mask, query_offset, mode: xl_relative_attention(
        q, k, v, params["content_bias"], params["rel"], params["rel_bias"],
        causal=causal, key_mask=key_mask, query_offset=query_offset, mode=mode,
    ),
    step=lambda q, k, v, params, state, *, key_mask: softmax_step(
        q, k, v, state, key_mask=key_mask, u=params["content_bias"], rel=params["rel"], bias=params["rel_bias"],
        variant="xl_relative",
    ),
    cross_summary=None,
    cross_step=None,
)


ATTENTION_VARIANTS: dict[str, AttentionVariant] = {
    "kernelized_rpe": KERNELIZED_RPE,
    "kernelized": KERNELIZED,
    "fourier": FOURIER,
    "toeplitz": TOEPLITZ,
    "xl_relative": XL_RELATIVE,
    "shaw_softmax": SHAW_SOFTMAX,
    "softmax": SOFTMAX,
}

SOFTMAX_TYPES = ("xl_relative", "shaw_softmax", "softmax")


def cross_attention_type(attention_type: str, cross_attention_rpe: bool) -> str:
    """The variant cross attention uses: the self-attention family without positions, or kernelized RPE."""
    if cross_attention_rpe:
        return "kernelized_rpe"
    return "softmax" if attention_type in SOFTMAX_TYPES else "kernelized"


def get_attention_variant(attention_type: str) -> AttentionVariant:
    """The op bundle registered under `attention_type`; ValueError names the known types otherwise."""
    if attention_type not in ATTENTION_VARIANTS:
        raise ValueError(f"`attention_type` must be one of {ATTENTION_TYPES}, got {attention_type!r}")
    return ATTENTION_VARIANTS[attention_type]


__all__ = [
    "ATTENTION_TYPES",
    "ATTENTION_VARIANTS",
    "AttentionVariant",
    "ParameterSpec",
    "cross_attention_type",
    "get_attention_variant",
]
