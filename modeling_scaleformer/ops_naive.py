"""Quadratic reference implementations, written straight from the formulas.

They build the full (Lq, Lk) score matrix and are the ground truth every fast path is tested
against. They are also the fastest choice for short sequences, where `mode="auto"` uses them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ops_common import compute_dtype, elu_feature_map, horizon_of


def naive_kernelized_rpe_scores(
    q: Tensor,
    k: Tensor,
    rel: Tensor | None = None,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    query_offset: int = 0,
) -> Tensor:
    """Unnormalised scores S (B, H, Lq, Lk) of kernelized attention with clipped relative positions.

    S_ij = phi(q_i).phi(k_j) + phi(q_i).phi(rel_r(i,j)), r(i, j) = clip(i + query_offset - j, -h, h) + h,
    set to 0 where j > i + query_offset (causal) or key_mask[j] == 0.
    """
    dtype = compute_dtype(q.dtype)
    qf, kf = elu_feature_map(q.to(dtype)), elu_feature_map(k.to(dtype))
    lq, lk = q.shape[2], k.shape[2]
    scores = qf @ kf.transpose(-1, -2)
    q_pos = torch.arange(lq, device=q.device) + query_offset
    k_pos = torch.arange(lk, device=q.device)
    if rel is not None:
        h = horizon_of(rel)
        rf = elu_feature_map(rel.to(dtype))
        rf = rf if rf.dim() == 3 else rf.unsqueeze(0)
        weights = torch.einsum("bhid,hrd->bhir", qf, rf.expand(q.shape[1], -1, -1))
        r = (q_pos[:, None] - k_pos[None, :]).clamp(-h, h) + h
        scores = scores + weights.gather(-1, r.expand(*weights.shape[:2], lq, lk))
    keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        keep = k_pos[None, :] <= q_pos[:, None]
    keep = keep[None, None]
    if key_mask is not None:
        keep = keep & key_mask.bool()[:, None, None, :]
    return scores * keep.to(dtype)


def naive_kernelized_rpe_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel: Tensor | None = None,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    query_offset: int = 0,
) -> Tensor:
    """out_i = sum_j S_ij v_j / sum_j S_ij with S from `naive_kernelized_rpe_scores`.

    Shapes: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv), rel (H, 2h+1, D) or (2h+1, D),
    key_mask (B, Lk). Returns (B, H, Lq, Dv) in q's dtype; a row with no visible key is 0.
    Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    scores = naive_kernelized_rpe_scores(q, k, rel, causal=causal, key_mask=key_mask, query_offset=query_offset)
    num = scores @ v.to(scores.dtype)
    den = scores.sum(-1, keepdim=True)
    visible = den > 0
    out = torch.where(visible, num / torch.where(visible, den, torch.ones_like(den)), torch.zeros_like(num))
    return out.to(q.dtype)
