"""Modules that wire parameters to the attention ops: ScaleformerAttention and the feed-forward block."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from transformers.activations import ACT2FN

from .cache import ScaleformerCache
from .configuration_scaleformer import ScaleformerConfig
from .ops_registry import ParameterSpec, cross_attention_type, get_attention_variant


class TokenRows(NamedTuple):
    """Hidden states that depend on the token id alone (B, L, d_model), kept as one row per distinct id: `rows`
    (U, d_model) and `index` (B, L) into them. `ScaleformerAttention` projects the rows and then gathers, so that
    each projection costs U rows instead of B * L."""

    rows: Tensor
    index: Tensor

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.index.shape, self.rows.shape[-1]))


def project(projection: Callable[[Tensor], Tensor], states: Tensor | TokenRows) -> Tensor:
    """`projection` of `states` (B, L, d_model), or of a `TokenRows`' rows, then gathered to (B, L, width)."""
    if isinstance(states, TokenRows):
        return projection(states.rows)[states.index]
    return projection(states)


def source_token_counts(source_ids: Tensor, source_mask: Tensor | None, vocab_size: int) -> Tensor:
    """(B, vocab_size) int64: how many times each token id occurs in each row of `source_ids` (B, S), the
    positions where `source_mask` is 0 left out."""
    kept = torch.ones_like(source_ids, dtype=torch.long) if source_mask is None else source_mask.long()
    counts = torch.zeros(source_ids.shape[0], vocab_size, dtype=torch.long, device=source_ids.device)
    return counts.scatter_add_(1, source_ids, kept)


def running_token_counts(token_ids: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """(B, L) int64: at each position, how many kept positions up to and including it hold its token id; 0 where
    `token_mask` is 0. A stable sort groups equal ids in order, so that each position's count is its rank in its
    group: O(L log L) time and O(L) memory."""
    batch, length = token_ids.shape
    keys = token_ids if token_mask is None else torch.where(token_mask.bool(), token_ids, -1)
    ordered, order = torch.sort(keys, dim=1, stable=True)
    positions = torch.arange(length, device=token_ids.device).expand(batch, length)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ranks = positions - torch.where(starts, positions, 0).cummax(dim=1).values + 1
    counts = torch.empty_like(ranks).scatter_(1, order, ranks)
    return counts if token_mask is None else counts * token_mask.long()


def remaining_counts(token_ids: Tensor, counts: Tensor, token_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """For the tokens `token_ids` (B, L) written after `counts` (B, vocab_size), the remaining counts of each
    token id: (B, L) `counts` of each position's token id minus how many times it has been written up to and
    including that position, and (B, vocab_size) the counts after all of them. Positions where `token_mask` is 0
    are not written (their remaining counts are meaningless)."""
    written = torch.ones_like(token_ids, dtype=torch.long) if token_mask is None else token_mask.long()
    remaining = counts.gather(1, token_ids) - running_token_counts(token_ids, token_mask)
    return remaining, counts.scatter_add(1, token_ids, -written)


class ScaleformerAttention(nn.Module):
    """Multi-head attention of the configured `attention_type`, for self and cross attention.

    Projects to (B, H, L, D) and calls the variant's op bundle (`ops_registry.AttentionVariant`) with
    the variant's own parameters (relative tables, Fourier frequencies, Toeplitz biases, ...). The
    decoder's generation state lives in the layer's slot of a `ScaleformerCache`: the variant's
    recurrent state (or key/value cache for the softmax baselines) for self-attention, and an
    encoder summary computed once for cross-attention. A variant without a row normaliser
    (`variant.normalised` False) gets a per-head RMSNorm on its output and a SiLU gate from the input,
    o_proj(RMSNorm(attn) * silu(g_proj(x))), as in GLA and RetNet.

    The steps are also public for the decoder's joint attention (`config.decoder_attention="joint"`):
    `query` projects the queries, `read` gives the variant's attention of given queries on this module's keys
    (before the output norm), `finish` applies the norm, gate and output projection. A module built with
    `keys_only=True` has only the key and value projections and its variant's parameters: it is read with
    the queries of another module. With `own_keys=False` as well it has only its variant's parameters, and
    `read` takes the key and value projections (`projections`) of another module too. `head_dim` (default
    `d_model // num_heads`) sets the width of each head: the projections then map `d_model` to
    `num_heads * head_dim` channels and `o_proj` back. The states that `query`, `read` and `finish` project may
    be `TokenRows` (states that depend on the token id alone): each projection then runs once per distinct id.
    """

    def __init__(
        self,
        config: ScaleformerConfig,
        num_heads: int,
        *,
        is_causal: bool,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
        keys_only: bool = False,
        own_keys: bool = True,
        head_dim: int | None = None,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads if head_dim is None else head_dim
        width = num_heads * self.head_dim  # the projections' width, d_model unless `head_dim` is given
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        self.attention_type = (
            cross_attention_type(config.attention_type, config.cross_attention_rpe)
            if is_cross_attention
            else config.attention_type
        )
        self.variant = get_attention_variant(self.attention_type)
        self.mode = self.variant.modes[config.attention_mode]
        self.key_dropout = config.attention_dropout
        self.decay_rate_range = config.decay_rate_range  # the initial decay rates of the decay types
        # the configured feature map, for the variants that offer a choice (ops_registry's `feature_maps` fact)
        self.options = {"feature_map": config.feature_map} if len(self.variant.feature_maps) > 1 else {}
        self.q_proj = self.o_proj = None
        if not keys_only:
            self.q_proj = nn.Linear(config.d_model, width)
        self.k_proj = self.v_proj = None
        if own_keys:
            self.k_proj = nn.Linear(config.d_model, width)
            self.v_proj = nn.Linear(config.d_model, width)
        if not keys_only:
            self.o_proj = nn.Linear(width, config.d_model)
        self.parameter_specs: dict[str, ParameterSpec] = self.variant.parameters(
            num_heads, self.head_dim, config.rpe_horizon, config.rpe_shared_across_heads
        )
        for name, spec in self.parameter_specs.items():
            self.register_parameter(name, nn.Parameter(torch.empty(spec.shape)))
        self.out_norm = self.g_proj = None
        if not self.variant.normalised and not keys_only:
            self.out_norm = nn.RMSNorm(self.head_dim, eps=config.layer_norm_eps)
            self.g_proj = nn.Linear(config.d_model, width)

    def _heads(self, x: Tensor) -> Tensor:
        # (B, L, H * D) -> (B, H, L, D)
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def _variant_parameters(self, dtype: torch.dtype) -> dict:
        # under autocast the projections come out in half precision while the parameters stay float32
        return {**{name: getattr(self, name).to(dtype) for name in self.parameter_specs}, **self.options}

    def _drop_keys(self, key_mask: Tensor | None, batch: int, length: int, device) -> Tensor | None:
        """Attention dropout: hide each key with probability `attention_dropout` while training."""
        if not self.training or self.key_dropout == 0:
            return key_mask
        keep = torch.rand(batch, length, device=device) >= self.key_dropout
        return keep if key_mask is None else keep & key_mask.bool()

    def forward(
        self, hidden_states: Tensor, key_value_states: Tensor | None = None, key_mask: Tensor | None = None,
        past_key_values: ScaleformerCache | None = None, query_offset: int = 0,
    ) -> Tensor:
        q = self.query(hidden_states)
        source = key_value_states if self.is_cross_attention else hidden_states
        return self.finish(self.read(q, source, key_mask, past_key_values, query_offset), hidden_states)

    def query(self, hidden_states: Tensor | TokenRows) -> Tensor:
        """The queries (B, H, L, D) of `hidden_states` (B, L, d_model)."""
        return self._heads(project(self.q_proj, hidden_states))

    def read(
        self, q: Tensor, source: Tensor | TokenRows | None, key_mask: Tensor | None = None,
        past_key_values: ScaleformerCache | None = None, query_offset: int = 0,
        projections: tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]] | None = None,
    ) -> Tensor:
        """The variant's attention (B, H, L, D) of the queries `q` on the keys and values of `source` (the
        hidden states for self-attention, the encoder output for cross attention), continuing or filling the
        generation state of this layer when `past_key_values` is given; before the output norm. `projections`
        (key, value) replace this module's `k_proj` and `v_proj`."""
        state = None if past_key_values is None else past_key_values.layers[self.layer_idx]
        key_proj, value_proj = (self.k_proj, self.v_proj) if projections is None else projections
        k = v = None
        if not (self.is_cross_attention and state is not None and state.cross_summary is not None):
            k, v = self._heads(project(key_proj, source)), self._heads(project(value_proj, source))
            key_mask = self._drop_keys(key_mask, source.shape[0], k.shape[2], k.device)
        attend = self._attend if self._traced(q, k, state) else self._attend_eagerly
        # the ops accumulate half precision in float32 themselves: autocast must not downcast inside them
        with torch.autocast(device_type=q.device.type, enabled=False):
            return attend(q, k, v, key_mask, state, query_offset)

    def _traced(self, q: Tensor, k: Tensor | None, state) -> bool:
        """Whether torch.compile may trace this call's attention: its op is operators or a few tensor operations on
        q's device (`AttentionVariant.traced`), with no generation state to fill or continue."""
        return (state is None and k is not None and self.mode != "naive" and self.variant.traced is not None
                and self.variant.traced(q.device, q.dtype, self.parameter_specs, self.head_dim, self.is_causal))

    def finish(self, out: Tensor, hidden_states: Tensor | TokenRows) -> Tensor:
        """The output (B, L, d_model) from the attention `out` (B, H, L, D) of the queries of `hidden_states`."""
        batch, length, _ = hidden_states.shape
        if self.out_norm is not None:
            out = self.out_norm(out)
        out = out.transpose(1, 2).reshape(batch, length, -1)
        if self.g_proj is not None:
            out = out * nn.functional.silu(project(self.g_proj, hidden_states))
        return self.o_proj(out)

    def _attend(self, q, k, v, key_mask, state, query_offset: int) -> Tensor:
        variant, params = self.variant, self._variant_parameters(q.dtype)
        k = None if k is None else k.to(q.dtype)
        v = None if v is None else v.to(q.dtype)
        if self.is_cross_attention:
            if k is None:  # the encoder summary was computed at the first decoding step
                return variant.cross_step(q, params, state.cross_summary, query_offset=query_offset)
            if state is not None:
                state.cross_summary = variant.cross_summary(k, v, params, key_mask=key_mask)
            return variant.attention(
                q, k, v, params, causal=False, key_mask=key_mask, query_offset=query_offset, mode=self.mode
            )
        if state is not None and state.self_state is not None:
            out, state.self_state = variant.step(q, k, v, params, state.self_state, key_mask=key_mask)
            return out
        if state is not None:
            state.self_state = variant.prefill_state(k, v, params, key_mask=key_mask)
        return variant.attention(
            q, k, v, params, causal=self.is_causal, key_mask=key_mask, query_offset=0, mode=self.mode
        )

    # `_attend` where torch.compile must not trace it (`_traced`): the ops run as they are, since tracing them would
    # compile their Python loops over blocks and chunks (and launch sites of their Triton kernels) once per shape
    _attend_eagerly = torch.compiler.disable(_attend)


class ScaleformerFeedForward(nn.Module):
    def __init__(self, config: ScaleformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.activation_dropout)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(hidden_states))))
