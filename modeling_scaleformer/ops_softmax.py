"""Softmax attention baselines: plain, Shaw relative positions and Transformer-XL relative positions.

These are the quadratic baselines the kernelized ops are compared with. Per batch element and head,
with d the head dim, h the horizon, p_i = i + query_offset the position of query i, key j at position
j, and the clipped relative index of the core op (`ops_common.relative_index`)

    r(i, j) = clip(p_i - j, -h, h) + h                                  (row h is distance 0)

the three variants score a (query, key) pair as

    "softmax"       e_ij = q_i.k_j / sqrt(d)
    "shaw_softmax"  e_ij = q_i.(k_j + rel[r(i, j)]) / sqrt(d)                  Shaw et al. (2018), eq. (4)
    "xl_relative"   e_ij = ((q_i + u).k_j + q_i.R[r(i, j)] + s[r(i, j)]) / sqrt(d)  Dai et al. (2019), sec. 3.3

and return out_i = sum_j softmax_j(e_i)_j v_j, where a masked key (key_mask[j] == 0, or j > p_i when
causal) scores -inf and a query row with no visible key returns 0 (not NaN).

Transformer-XL writes its score as terms (a) q_i.k_j, (b) q_i.W_R R_{i-j}, (c) u.k_j, (d) v.W_R R_{i-j}.
Here the projected sinusoid W_R R_{i-j} is replaced by a learnt table R[r(i, j)] and the position-only
term (d) by a learnt scalar s[r(i, j)], both clipped at distance h like Shaw's table; u is the global
content bias of term (c).

Two paths compute the same thing. `ops_naive.naive_*` builds the scores explicitly from the formula
(the reference). The fast path calls `torch.nn.functional.scaled_dot_product_attention` with the content
term as (q or q + u, k) and SDPA's own `scale`, and the relative terms, gathered from q R^T (+ s) and
scaled, as an additive float `attn_mask`. Query rows with no visible key are given an all-visible mask
row before SDPA (SDPA returns NaN for an all -inf row on some backends) and their output is then set
to 0, so outputs and gradients stay finite. `mode` is "naive", "sdpa" or "auto" (= "sdpa": both paths
are quadratic, there is nothing to choose).

Generation keeps an ordinary growing key/value cache (`SoftmaxKVState`): each step appends the new
tokens and attends causally over everything cached, O(seen) time and memory per token.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .ops_common import (
    check_attention_inputs,
    check_key_mask,
    check_new_tokens,
    check_state,
    compute_dtype,
    describe,
    relative_index,
    visible_keys,
)
from .ops_naive import naive_shaw_softmax_attention, naive_softmax_attention, naive_xl_relative_attention


SOFTMAX_MODES = ("auto", "naive", "sdpa")


def _check_mode(mode: str) -> None:
    if mode not in SOFTMAX_MODES:
        raise ValueError(f"`mode` must be one of {SOFTMAX_MODES}, got {mode!r}")


def _check_xl_parameters(q: Tensor, u: Tensor, rel: Tensor, bias: Tensor) -> None:
    heads, dim = q.shape[1], q.shape[-1]
    if not isinstance(rel, Tensor):
        expected = f"({heads}, 2h+1, {dim}) or (2h+1, {dim})"
        raise ValueError(f"`rel` must be a tensor of shape {expected}, got {describe(rel)}")
    rows = rel.shape[-2]
    for name, t, shape in (("u", u, (heads, dim)), ("bias", bias, (heads, rows))):
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"`{name}` must be a tensor of shape {shape}, got {describe(t)}")
        if t.dtype != q.dtype:
            raise ValueError(f"`{name}` must have the dtype of `q` ({q.dtype}), got {t.dtype}")


def _sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, positional: Tensor | None,
    *, causal: bool, key_mask: Tensor | None, query_offset: int,
) -> Tensor:
    """SDPA on (q, k, v) in compute dtype with `positional` (B, H, Lq, Lk, already scaled) added to the scores."""
    dtype = compute_dtype(q.dtype)
    keep = None  # broadcastable to (B, H, Lq, Lk), True where the key is visible; None: every key
    if causal or key_mask is not None:
        keep = visible_keys(
            q.shape[2], k.shape[2], causal=causal, key_mask=key_mask, query_offset=query_offset, device=q.device
        )
    any_visible = None
    if key_mask is not None:
        # causal alone always leaves key 0 visible; with a key mask a row can be empty: it attends
        # to every key inside SDPA (finite values and gradients) and its output is replaced by 0
        any_visible = keep.any(-1, keepdim=True)
        keep = keep | ~any_visible
    is_causal = causal and key_mask is None and positional is None and query_offset == 0
    if is_causal:
        attn_mask = None  # SDPA's causal mask is top-left aligned: key j visible iff j <= i
    elif positional is None:
        attn_mask = keep
    else:
        attn_mask = positional if keep is None else positional.masked_fill(~keep, float("-inf"))
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=attn_mask, is_causal=is_causal, scale=scale
    )
    if any_visible is not None:
        out = torch.where(any_visible, out, torch.zeros_like(out))
    return out.to(q.dtype)


def _gather_relative(weights: Tensor, lk: int, query_offset: int) -> Tensor:
    """(B, H, Lq, 2h+1) per-row relative terms -> (B, H, Lq, Lk) at column r(i, j)."""
    lq, rows = weights.shape[-2:]
    index = relative_index(
        torch.arange(lq, device=weights.device) + query_offset, torch.arange(lk, device=weights.device), (rows - 1) // 2
    )
    return weights.gather(-1, index.expand(*weights.shape[:2], lq, lk))


def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
) -> Tensor:
    """Scaled dot-product softmax attention (Vaswani et al., 2017, eq. 1), the quadratic baseline.

        e_ij = q_i.k_j / sqrt(d),   out_i = sum_j softmax_j(e_i)_j v_j
    with e_ij = -inf where j > p_i = i + query_offset (causal) or key_mask[:, j] == 0; a row with no
    visible key gives 0.

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq (cross attention).
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= p_i.
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): absolute position of the first query.
        mode (`str`, defaults to `"auto"`): `"naive"` (explicit scores), `"sdpa"`
            (`torch.nn.functional.scaled_dot_product_attention`) or `"auto"` (= `"sdpa"`).

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype; half precision runs in float32.
        Cost O(Lq Lk (D + Dv)) time per head; memory O(Lq Lk) per head at most (SDPA kernels may
        use less, a key mask costs a (B, Lq, Lk) boolean mask).
    """
    check_attention_inputs(q, k, v, None, key_mask, query_offset, "naive")
    _check_mode(mode)
    if mode == "naive":
        return naive_softmax_attention(q, k, v, causal=causal, key_mask=key_mask, query_offset=query_offset)
    return _sdpa_attention(q, k, v, None, causal=causal, key_mask=key_mask, query_offset=query_offset)


def shaw_softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
) -> Tensor:
    """Softmax attention with Shaw et al. (2018) clipped relative key embeddings (their eq. 4).

        e_ij = q_i.(k_j + rel[r(i, j)]) / sqrt(d),   r(i, j) = clip(p_i - j, -h, h) + h
        out_i = sum_j softmax_j(e_i)_j v_j
    with p_i = i + query_offset, e_ij = -inf where j > p_i (causal) or key_mask[:, j] == 0, and 0 for a
    row with no visible key. Row h + t of `rel` holds relative distance p_i - j = t (t > 0: the key is
    t positions in the past); distances beyond h use rows 0 and 2h. Only the key-side embeddings a^K
    of the paper are used (no value-side a^V), as in the Scaleformer kernelized op.

    Args:
        q, k, v, causal, key_mask, query_offset, mode: as in `softmax_attention`.
        rel (`Tensor` of shape `(H, 2h+1, D)` or `(2h+1, D)`): relative key embeddings, per head or
            shared by heads, in q's dtype.

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype; half precision runs in float32.
        Cost O(Lq (Lk + h) D + Lq Lk Dv) time and O(Lq (Lk + h)) memory per head: the SDPA path adds
        the gathered, scaled q_i.rel[r(i, j)] as a float (B, H, Lq, Lk) `attn_mask`.
    """
    check_attention_inputs(q, k, v, rel, key_mask, query_offset, "naive")
    if rel is None:
        raise ValueError("`rel` must be a tensor of shape (heads, 2h+1, dim) or (2h+1, dim), got None")
    _check_mode(mode)
    if mode == "naive":
        return naive_shaw_softmax_attention(q, k, v, rel, causal=causal, key_mask=key_mask, query_offset=query_offset)
    dtype = compute_dtype(q.dtype)
    table = rel.to(dtype)
    weights = q.to(dtype) @ table.transpose(-1, -2)  # (B, H, Lq, 2h+1): q_i.rel[r] for every r
    positional = _gather_relative(weights, k.shape[2], query_offset) * (1.0 / math.sqrt(q.shape[-1]))
    return _sdpa_attention(q, k, v, positional, causal=causal, key_mask=key_mask, query_offset=query_offset)


def xl_relative_attention(
    q: Tensor, k: Tensor, v: Tensor, u: Tensor, rel: Tensor, bias: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
) -> Tensor:
    """Softmax attention with Transformer-XL relative positions (Dai et al., 2019, section 3.3).

        e_ij = ((q_i + u).k_j + q_i.R[r(i, j)] + s[r(i, j)]) / sqrt(d),   r(i, j) = clip(p_i - j, -h, h) + h
        out_i = sum_j softmax_j(e_i)_j v_j
    i.e. the paper's terms (a) q_i.k_j, (c) u.k_j (global content bias), (b) q_i.R_{i-j} and
    (d) a global position bias, with the projected sinusoids W_R R_{i-j} replaced by a learnt table
    R (rel) and term (d) by a learnt scalar s (bias), both constant beyond distance h. Masking and
    empty rows as in `shaw_softmax_attention`.

    Args:
        q, k, v, causal, key_mask, query_offset, mode: as in `softmax_attention`.
        u (`Tensor` of shape `(H, D)`): content bias added to every query for the (q_i + u).k_j term.
        rel (`Tensor` of shape `(H, 2h+1, D)` or `(2h+1, D)`): relative embeddings R, row h + t for
            distance p_i - j = t.
        bias (`Tensor` of shape `(H, 2h+1)`): relative scalar bias s, same rows as `rel`.
        All three in q's dtype.

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype; half precision runs in float32.
        Cost O(Lq (Lk + h) D + Lq Lk Dv) time and O(Lq (Lk + h)) memory per head: the SDPA path runs
        on (q + u, k, v) and adds the gathered, scaled q_i.R[r] + s[r] as a float `attn_mask`.
    """
    check_attention_inputs(q, k, v, rel, key_mask, query_offset, "naive")
    _check_xl_parameters(q, u, rel, bias)
    _check_mode(mode)
    if mode == "naive":
        return naive_xl_relative_attention(
            q, k, v, u, rel, bias, causal=causal, key_mask=key_mask, query_offset=query_offset
        )
    dtype = compute_dtype(q.dtype)
    qc = q.to(dtype)
    weights = qc @ rel.to(dtype).transpose(-1, -2) + bias.to(dtype)[:, None, :]  # (B, H, Lq, 2h+1)
    positional = _gather_relative(weights, k.shape[2], query_offset) * (1.0 / math.sqrt(q.shape[-1]))
    # content terms (a) + (c) as SDPA's own product (q + u).k, in compute dtype
    content_q = qc + u.to(dtype)[None, :, None, :]
    out = _sdpa_attention(content_q, k, v, positional, causal=causal, key_mask=key_mask, query_offset=query_offset)
    return out.to(q.dtype)


# Generation: a growing key/value cache.


class SoftmaxKVState(NamedTuple):
    """Key/value cache of softmax attention after `seen` tokens (positions 0..seen-1).

    Tensors keep the dtype they were created with (the model dtype); attention runs in
    `compute_dtype` of it. The size grows by one key and one value per token and head.

    Fields:
        k (`Tensor` of shape `(B, H, seen, D)`): cached keys.
        v (`Tensor` of shape `(B, H, seen, Dv)`): cached values.
        key_mask (`Tensor` of shape `(B, seen)`, bool): True for keys to attend to.
        seen (`int`): number of tokens cached, the position of the next token.
    """

    k: Tensor
    v: Tensor
    key_mask: Tensor
    seen: int


def softmax_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, *, dtype: torch.dtype, device=None
) -> SoftmaxKVState:
    """The empty cache (no token seen): zero-length k (B, H, 0, D), v (B, H, 0, Dv), key_mask (B, 0)."""
    return SoftmaxKVState(
        k=torch.zeros(batch, heads, 0, dim, dtype=dtype, device=device),
        v=torch.zeros(batch, heads, 0, value_dim, dtype=dtype, device=device),
        key_mask=torch.zeros(batch, 0, dtype=torch.bool, device=device),
        seen=0,
    )


def _check_keys_values(k: Tensor, v: Tensor, key_mask: Tensor | None) -> None:
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4 or not t.is_floating_point():
            expected = "a 4-D floating-point tensor (batch, heads, length, dim)"
            raise ValueError(f"`{name}` must be {expected}, got {describe(t)}")
    if v.shape[:3] != k.shape[:3] or v.dtype != k.dtype:
        expected = f"shape ({', '.join(map(str, k.shape[:3]))}, Dv) and dtype {k.dtype}"
        raise ValueError(f"`v` must have {expected} to match `k`, got {describe(v)}")
    check_key_mask(key_mask, k.shape[0], k.shape[2])


def _bool_mask(key_mask: Tensor | None, k: Tensor) -> Tensor:
    if key_mask is None:
        return torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
    return key_mask.bool()


def softmax_prefill_state(k: Tensor, v: Tensor, *, key_mask: Tensor | None = None) -> SoftmaxKVState:
    """The cache after the tokens k (B, H, L, D), v (B, H, L, Dv) at positions 0..L-1 (no copy of k, v)."""
    _check_keys_values(k, v, key_mask)
    return SoftmaxKVState(k=k, v=v, key_mask=_bool_mask(key_mask, k), seen=k.shape[2])


# What `softmax_step` runs for each value of its `variant` argument: an attention function of this
# module and the names of the parameters it takes after q, k, v, in order.
STEP_VARIANTS = {
    "softmax": (softmax_attention, ()),
    "shaw_softmax": (shaw_softmax_attention, ("rel",)),
    "xl_relative": (xl_relative_attention, ("u", "rel", "bias")),
}


def _check_variant_parameters(variant: str, rel, u, bias) -> None:
    if variant not in STEP_VARIANTS:
        raise ValueError(f"`variant` must be one of {tuple(STEP_VARIANTS)}, got {variant!r}")
    needed = STEP_VARIANTS[variant][1]
    for name, value in (("rel", rel), ("u", u), ("bias", bias)):
        if name in needed and value is None:
            raise ValueError(f"`{name}` is required by variant {variant!r}, got None")
        if name not in needed and value is not None:
            raise ValueError(f"`{name}` is not a parameter of variant {variant!r}, got {describe(value)}")


def _check_cache(state: SoftmaxKVState, k: Tensor, v: Tensor) -> None:
    check_state(state, SoftmaxKVState)
    b, h, _, d = k.shape
    expected_k, expected_v = (b, h, state.seen, d), (b, h, state.seen, v.shape[-1])
    if (
        tuple(state.k.shape) != expected_k
        or tuple(state.v.shape) != expected_v
        or tuple(state.key_mask.shape) != (b, state.seen)
        or state.k.dtype != k.dtype
        or state.v.dtype != v.dtype
    ):
        raise ValueError(
            f"`state` does not fit these inputs: expected k {expected_k} and v {expected_v} in {k.dtype} "
            f"and key_mask {(b, state.seen)}, got k {describe(state.k)}, v {describe(state.v)} and key_mask "
            f"{tuple(state.key_mask.shape)}"
        )


def softmax_step(
    q: Tensor, k: Tensor, v: Tensor, state: SoftmaxKVState,
    *, key_mask: Tensor | None = None, rel: Tensor | None = None, u: Tensor | None = None,
    bias: Tensor | None = None, variant: str = "softmax",
) -> tuple[Tensor, SoftmaxKVState]:
    """Causal attention of n new tokens over the cache plus themselves, and the grown cache.

    q, k, v have shape (B, H, n, .) and sit at positions state.seen .. state.seen + n - 1; `key_mask`
    (B, n) masks the new tokens only. The new keys and values are appended, then `variant` runs with
    causal=True and query_offset=state.seen over all cached keys, so the result equals the matching
    rows of the full causal attention over the whole sequence.

    Args:
        variant (`str`, defaults to `"softmax"`): `"softmax"` (no parameters), `"shaw_softmax"` (`rel`)
            or `"xl_relative"` (`u`, `rel`, `bias`); parameters as in the matching attention function.

    Returns:
        `(out, state)`: out of shape (B, H, n, Dv) in q's dtype and the `SoftmaxKVState` with seen + n
        tokens. Cost O(n (seen + n)(D + Dv)) time per head; the cache grows by n tokens.
    """
    _check_variant_parameters(variant, rel, u, bias)
    check_attention_inputs(q, k, v, None, key_mask, 0, "naive")
    check_new_tokens(q, k)
    _check_cache(state, k, v)
    keys = torch.cat([state.k, k], dim=2)
    values = torch.cat([state.v, v], dim=2)
    mask = torch.cat([state.key_mask, _bool_mask(key_mask, k)], dim=1)
    attention, names = STEP_VARIANTS[variant]
    params = dict(rel=rel, u=u, bias=bias)
    out = attention(q, keys, values, *(params[n] for n in names), causal=True, key_mask=mask, query_offset=state.seen)
    return out, SoftmaxKVState(k=keys, v=values, key_mask=mask, seen=state.seen + q.shape[2])


def softmax_cross_state(k: Tensor, v: Tensor, *, key_mask: Tensor | None = None) -> SoftmaxKVState:
    """Encoder keys (B, H, Lk, D) and values (B, H, Lk, Dv), stored once for `softmax_cross_step`."""
    _check_keys_values(k, v, key_mask)
    return SoftmaxKVState(k=k, v=v, key_mask=_bool_mask(key_mask, k), seen=k.shape[2])


def softmax_cross_step(q: Tensor, state: SoftmaxKVState) -> Tensor:
    """Plain bidirectional softmax attention of queries (B, H, n, D) over the stored keys (no positions).

    Equals `softmax_attention(q, k, v, key_mask=key_mask)` for the keys the state was built from.
    Cost O(n Lk (D + Dv)) per head.
    """
    check_state(state, SoftmaxKVState)
    return softmax_attention(q, state.k, state.v, key_mask=state.key_mask)
