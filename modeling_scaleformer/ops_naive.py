"""Quadratic reference implementations of every attention op, written straight from the formulas.

Each `naive_<algo>` builds the full (Lq, Lk) score matrix of the op of the same name and is the ground
truth its fast paths are tested against (`tests/ops/test_naive.py` checks each against a loop over
(query, key) pairs). They share one calling convention with the fast paths: q (B, H, Lq, D),
k (B, H, Lk, D), v (B, H, Lk, Dv), the op's parameters, then keyword-only `causal`, `key_mask` (B, Lk)
and `query_offset` (p_i = i + query_offset); they return (B, H, Lq, Dv) in q's dtype, computed in
`compute_dtype` (float32 for half precision), with 0 for a query row that sees no key
(`naive_kernelized_rpe_scores` returns the masked score matrix itself). Relative tables are read at
r(i, j) = clip(p_i - j, -h, h) + h (`ops_common.relative_index`; the Toeplitz bias, stored by key offset,
through `ops_common.rows_by_distance`). Each costs
O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head (Shaw and Transformer-XL: O(Lq Lk D) memory).

`mode="naive"` runs them. For the kernelized ops (`kernelized_rpe_attention`, `fourier_attention`,
`toeplitz_attention`) they are also the cheaper choice on short sequences, which `mode="auto"` picks by
a cost model; the softmax ops' "auto" runs SDPA instead.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .ops_common import (
    DEFAULT_EPS,
    compute_dtype,
    elu_feature_map,
    get_feature_map,
    guarded_normalise,
    horizon_of,
    normalise,
    relative_index,
    row_shift_of_log,
    rows_by_distance,
    token_positions,
    visible_keys,
)


def _positions(lq: int, lk: int, query_offset: int, device) -> tuple[Tensor, Tensor]:
    """Positions p_i = i + query_offset of the queries and j of the keys."""
    return torch.arange(lq, device=device) + query_offset, torch.arange(lk, device=device)


def _normalised_rows(scores: Tensor, v: Tensor) -> Tensor:
    """sum_j S_ij v_j / sum_j S_ij for scores that are positive on visible keys and 0 elsewhere."""
    return normalise(scores @ v.to(scores.dtype), scores.sum(-1, keepdim=True))


# kernelized attention: clipped relative positions (Scaleformer), Fourier kernel, Toeplitz bias


def naive_kernelized_rpe_scores(
    q: Tensor, k: Tensor, rel: Tensor | None = None,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, feature_map: str = "elu",
) -> Tensor:
    """Unnormalised scores S (B, H, Lq, Lk) of kernelized attention with clipped relative positions.

    S_ij = phi(q_i).phi(k_j) + phi(q_i).phi(rel[r(i, j)]), r(i, j) = clip(i + query_offset - j, -h, h) + h,
    set to 0 where j > i + query_offset (causal) or key_mask[j] == 0; phi is `ops_common.FEATURE_MAPS[feature_map]`.
    """
    dtype = compute_dtype(q.dtype)
    phi = get_feature_map(feature_map)
    qf, kf = phi(q.to(dtype)), phi(k.to(dtype))
    lq, lk = q.shape[2], k.shape[2]
    scores = qf @ kf.transpose(-1, -2)
    if rel is not None:
        rf = phi(rel.to(dtype))
        rf = rf if rf.dim() == 3 else rf.unsqueeze(0)
        weights = torch.einsum("bhid,hrd->bhir", qf, rf.expand(q.shape[1], -1, -1))
        r = relative_index(*_positions(lq, lk, query_offset, q.device), horizon_of(rel))
        scores = scores + weights.gather(-1, r.expand(*weights.shape[:2], lq, lk))
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=query_offset, device=q.device)
    return scores * keep.to(dtype)


def naive_kernelized_rpe_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None = None,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
) -> Tensor:
    """Reference of `kernelized_rpe_attention`: out_i = sum_j S_ij v_j / sum_j S_ij, S from
    `naive_kernelized_rpe_scores`.

    Shapes: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv), rel (H, 2h+1, D) or (2h+1, D),
    key_mask (B, Lk). Returns (B, H, Lq, Dv) in q's dtype; a row with no visible key is 0.
    Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    scores = naive_kernelized_rpe_scores(q, k, rel, causal=causal, key_mask=key_mask, query_offset=query_offset)
    return _normalised_rows(scores, v).to(q.dtype)


def naive_fourier_attention(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, c: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
    q_positions: Tensor | None = None, k_positions: Tensor | None = None, eps: float = DEFAULT_EPS,
) -> Tensor:
    """Reference of `fourier_attention`: the full (Lq, Lk) score matrix, then the normaliser guard.

    S_ij = sum_k c_k phi(q_i)_k phi(k_j)_k cos(ph_ik - pk_jk), M_i = sum_j sum_k |c_k| phi(q_i)_k
    phi(k_j)_k, both over visible keys; out_i = num_i / den_safe_i as in `ops_fourier`
    (`ops_common.guarded_normalise`). The cosine of the difference is expanded as cos cos + sin sin so
    that no (Lq, Lk, D) tensor is formed.

    Shapes: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv), a (H, D, n), b (H, D), c (H, D),
    q_positions (B, Lq, n), k_positions (B, Lk, n). Returns (B, H, Lq, Dv) in q's dtype.
    Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    dtype = compute_dtype(q.dtype)
    lq, lk = q.shape[2], k.shape[2]
    qf, kf = elu_feature_map(q.to(dtype)), elu_feature_map(k.to(dtype))
    a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
    pq = token_positions(query_offset, lq, dtype, q.device) if q_positions is None else q_positions.to(dtype)
    pk = token_positions(0, lk, dtype, q.device) if k_positions is None else k_positions.to(dtype)
    ph = b[None, :, None, :] + torch.einsum("bin,hkn->bhik", pq, a)  # (B, H, Lq, D)
    pkey = torch.einsum("bjn,hkn->bhjk", pk, a)  # (B, H, Lk, D)
    cq = c[None, :, None, :] * qf
    scores = (cq * torch.cos(ph)) @ (kf * torch.cos(pkey)).transpose(-1, -2)
    scores = scores + (cq * torch.sin(ph)) @ (kf * torch.sin(pkey)).transpose(-1, -2)
    bound = (c.abs()[None, :, None, :] * qf) @ kf.transpose(-1, -2)
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=query_offset, device=q.device)
    scores = scores * keep.to(dtype)
    bound = bound * keep.to(dtype)
    num, den, big = scores @ v.to(dtype), scores.sum(-1, keepdim=True), bound.sum(-1, keepdim=True)
    return guarded_normalise(num, den, big, eps).to(q.dtype)


def naive_toeplitz_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
) -> Tensor:
    """Reference of `toeplitz_attention`: out_i = sum_j S_ij v_j / sum_j S_ij,
    S_ij = exp(bias[2h - r(i, j)]) phi(q_i).phi(k_j).

    `bias` (H, 2h+1) is stored by key offset (row r for j - p_i = r - h), so with r(i, j) = clip(p_i - j,
    -h, h) + h it is read at row 2h - r(i, j), through `ops_common.rows_by_distance`; p_i = i +
    query_offset, h = (bias.shape[-1] - 1) // 2, and S_ij = 0 where j > p_i (causal) or key_mask[:, j] == 0.

    Shapes: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv), bias (H, 2h+1), key_mask (B, Lk).
    Returns (B, H, Lq, Dv) in q's dtype; a row with no visible key is 0. Half precision is computed in
    float32. Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    dtype = compute_dtype(q.dtype)
    lq, lk = q.shape[2], k.shape[2]
    r = relative_index(*_positions(lq, lk, query_offset, q.device), (bias.shape[-1] - 1) // 2)  # (Lq, Lk)
    weight = rows_by_distance(bias).to(dtype).exp()[:, r]  # (H, Lq, Lk)
    scores = weight * (elu_feature_map(q.to(dtype)) @ elu_feature_map(k.to(dtype)).transpose(-1, -2))
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=query_offset, device=q.device)
    return _normalised_rows(scores * keep.to(dtype), v).to(q.dtype)


def naive_kernelized_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, horizon: int | None = None,
    normalise: bool = False, feature_map: str = "elu",
) -> Tensor:
    """Reference of `kernelized_decay_attention`: out_i = sum_j W_ij v_j with W_ij = S_ij exp(-lambda
    max(|p_i - j| - h, 0)), S from `naive_kernelized_rpe_scores` (with `feature_map`); divided by sum_j W_ij
    when `normalise`.

    Shapes: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv), rel (H, 2h+1, D) or (2h+1, D) or None (then
    `horizon` gives h), decay (H,) of rates lambda >= 0, key_mask (B, Lk). Returns (B, H, Lq, Dv) in q's
    dtype; a row with no visible key is 0. Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    dtype = compute_dtype(q.dtype)
    h = horizon_of(rel) if horizon is None else horizon
    scores = naive_kernelized_rpe_scores(q, k, rel, causal=causal, key_mask=key_mask, query_offset=query_offset,
                                         feature_map=feature_map)
    pq, pk = _positions(q.shape[2], k.shape[2], query_offset, q.device)
    beyond = ((pq[:, None] - pk[None, :]).abs() - h).clamp(min=0).to(dtype)  # (Lq, Lk)
    weight = torch.exp(-decay.to(dtype)[:, None, None] * beyond)  # (H, Lq, Lk)
    if normalise:
        return _normalised_rows(scores * weight, v).to(q.dtype)
    return ((scores * weight) @ v.to(dtype)).to(q.dtype)


def naive_local_softmax_decay_weights(
    q: Tensor, k: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, horizon: int | None = None,
) -> Tensor:
    """The weights W (B, H, Lq, Lk) of `local_softmax_decay_attention`, each row times exp(-m_i), 0 on hidden keys.

    W_ij = exp(q_i.(k_j + rel[r(i, j)]) / sqrt(D)) for |p_i - j| <= h, W_ij = phi(q_i).phi(k_j) / D
    exp(-lambda (|p_i - j| - h)) beyond; m_i = max(max of row i's visible band logits, log of the sum of its
    weights beyond the band) (`ops_common.row_shift`), so that every weight is at most 1 and the largest
    part is 1 (the attention, a ratio of sums over the row, does not depend on m). That log is taken around the
    row's largest decay exponent, so that rows however far from their keys keep their weights (where the chunked
    path's decayed sums underflow, `ops_common.tails_above_floor`).
    """
    dtype = compute_dtype(q.dtype)
    h = horizon_of(rel) if horizon is None else horizon
    lq, lk = q.shape[2], k.shape[2]
    qc, kc = q.to(dtype), k.to(dtype)
    pq, pk = _positions(lq, lk, query_offset, q.device)
    logits = qc @ kc.transpose(-1, -2)
    if rel is not None:
        weights = qc @ _per_head(rel, dtype).transpose(-1, -2)  # (B, H, Lq, 2h+1)
        r = relative_index(pq, pk, h)
        logits = logits + weights.gather(-1, r.expand(*weights.shape[:2], lq, lk))
    logits = logits / math.sqrt(q.shape[-1])
    distance = (pq[:, None] - pk[None, :]).abs()
    band = distance <= h
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=query_offset, device=q.device)
    kernel = (elu_feature_map(qc) @ elu_feature_map(kc).transpose(-1, -2)) / q.shape[-1]
    rate = decay.to(dtype)[:, None, None]
    exponent = -rate * (distance - h).clamp(min=0).to(dtype)  # (H, Lq, Lk)
    beyond = keep & ~band
    in_band = band & keep
    # each row's nearest visible key beyond the band has its largest decay exponent, top; its weights beyond the
    # band are taken relative to that decay, so that their sum neither underflows nor loses its digits however far
    # the row lies from its keys, and exp(-m) meets the decay as exp(top - m), where the two cancel
    nearest = torch.where(beyond, distance.to(dtype), float("inf")).amin(-1, keepdim=True)
    nearest = torch.where(torch.isfinite(nearest), nearest, torch.full_like(nearest, h))  # top 0 for a row with none
    top = -rate * (nearest - h).clamp(min=0)
    relative = kernel * torch.exp((exponent - top).clamp(max=0)) * beyond.to(dtype)
    log_tail = top + torch.log(relative.detach().sum(-1, keepdim=True))  # -inf for a row with none
    m = row_shift_of_log(torch.where(in_band, logits, torch.full_like(logits, float("-inf"))), log_tail)
    # exp(top - m) is capped below the dtype's largest, so that a row whose kernel sum is 0 cannot meet an infinite
    # factor; hidden keys in the band get the exponent 0, so that no exponential overflows before the mask zeroes
    # them
    cap = math.log(torch.finfo(dtype).max) - 1
    far = relative * torch.exp((top - m).clamp(max=cap))
    weights = torch.where(in_band, torch.exp(torch.where(in_band, logits, m) - m), far)
    return weights * keep.to(dtype)


def naive_local_softmax_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, horizon: int | None = None,
) -> Tensor:
    """Reference of `local_softmax_decay_attention`: out_i = sum_j W_ij v_j / sum_j W_ij, W from
    `naive_local_softmax_decay_weights`.

    Shapes as `naive_kernelized_decay_attention`. Returns (B, H, Lq, Dv) in q's dtype; a row with no visible
    key is 0. Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    weights = naive_local_softmax_decay_weights(
        q, k, rel, decay, causal=causal, key_mask=key_mask, query_offset=query_offset, horizon=horizon
    )
    return _normalised_rows(weights, v).to(q.dtype)


# softmax baselines: plain, Shaw et al. (2018) relative keys, Transformer-XL relative attention


def _softmax_rows(scores: Tensor, v: Tensor, causal: bool, key_mask: Tensor | None, query_offset: int) -> Tensor:
    """softmax_j(scores) @ v with masked keys at -inf; a row with no visible key gives 0."""
    lq, lk = scores.shape[-2:]
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=query_offset, device=scores.device)
    scores = scores.masked_fill(~keep, float("-inf"))
    any_visible = keep.any(-1, keepdim=True)
    # softmax of an all -inf row is NaN: such rows get finite scores, then zero weights
    probs = torch.softmax(torch.where(any_visible, scores, torch.zeros_like(scores)), dim=-1) * any_visible
    return probs @ v.to(probs.dtype)


def _relative_rows(table: Tensor, heads: int, lq: int, lk: int, query_offset: int) -> Tensor:
    """The table row of each (query, key) pair, a[h, i, j] = table[h, r(i, j)], shape (H, Lq, Lk, ...)."""
    r = relative_index(*_positions(lq, lk, query_offset, table.device), (table.shape[1] - 1) // 2)
    return table.expand(heads, *table.shape[1:])[:, r]


def _per_head(rel: Tensor, dtype: torch.dtype) -> Tensor:
    """A relative table (H, 2h+1, D) or (2h+1, D) as (H or 1, 2h+1, D) in `dtype`."""
    table = rel.to(dtype)
    return table if table.dim() == 3 else table.unsqueeze(0)


def naive_softmax_attention(
    q: Tensor, k: Tensor, v: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
) -> Tensor:
    """Reference of `softmax_attention`: e_ij = q_i.k_j / sqrt(d), out_i = softmax_j(e_i) @ v.

    Shapes as `softmax_attention`. Cost O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    dtype = compute_dtype(q.dtype)
    qc, kc = q.to(dtype), k.to(dtype)
    scores = torch.einsum("bhid,bhjd->bhij", qc, kc) / math.sqrt(q.shape[-1])
    return _softmax_rows(scores, v, causal, key_mask, query_offset).to(q.dtype)


def naive_shaw_softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
) -> Tensor:
    """Reference of `shaw_softmax_attention`: e_ij = q_i.(k_j + a_ij) / sqrt(d) with a_ij = rel[r(i, j)].

    Builds a_ij for every pair: O(H Lq Lk D) memory. Shapes as `shaw_softmax_attention`.
    """
    dtype = compute_dtype(q.dtype)
    qc, kc = q.to(dtype), k.to(dtype)
    a = _relative_rows(_per_head(rel, dtype), q.shape[1], q.shape[2], k.shape[2], query_offset)  # (H, Lq, Lk, D)
    scores = torch.einsum("bhid,bhjd->bhij", qc, kc) + torch.einsum("bhid,hijd->bhij", qc, a)
    scores = scores / math.sqrt(q.shape[-1])
    return _softmax_rows(scores, v, causal, key_mask, query_offset).to(q.dtype)


def naive_xl_relative_attention(
    q: Tensor, k: Tensor, v: Tensor, u: Tensor, rel: Tensor, bias: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
) -> Tensor:
    """Reference of `xl_relative_attention`: e_ij = ((q_i + u).k_j + q_i.R[r(i, j)] + s[r(i, j)]) / sqrt(d).

    R = rel, s = bias. Builds R[r(i, j)] for every pair: O(H Lq Lk D) memory. Shapes as
    `xl_relative_attention`.
    """
    dtype = compute_dtype(q.dtype)
    qc, kc = q.to(dtype), k.to(dtype)
    heads, lq, lk = q.shape[1], q.shape[2], k.shape[2]
    content = torch.einsum("bhid,bhjd->bhij", qc + u.to(dtype)[None, :, None, :], kc)  # (a) + (c)
    position = torch.einsum("bhid,hijd->bhij", qc, _relative_rows(_per_head(rel, dtype), heads, lq, lk, query_offset))
    position = position + _relative_rows(bias.to(dtype)[..., None], heads, lq, lk, query_offset)[..., 0]  # (d)
    scores = (content + position) / math.sqrt(q.shape[-1])
    return _softmax_rows(scores, v, causal, key_mask, query_offset).to(q.dtype)


__all__ = [
    "naive_fourier_attention",
    "naive_kernelized_decay_attention",
    "naive_kernelized_rpe_attention",
    "naive_kernelized_rpe_scores",
    "naive_local_softmax_decay_attention",
    "naive_local_softmax_decay_weights",
    "naive_shaw_softmax_attention",
    "naive_softmax_attention",
    "naive_toeplitz_attention",
    "naive_xl_relative_attention",
]
