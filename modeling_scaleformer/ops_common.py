"""Helpers shared by the attention ops: feature map, relative indices, dtype policy, input checks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


ATTENTION_MODES = ("auto", "naive", "linear")


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1, the positive feature map of Katharopoulos et al. (2020)."""
    return F.elu(x) + 1.0


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ops accumulate in: float32 for half precision, the input dtype otherwise."""
    return torch.promote_types(dtype, torch.float32)


def horizon_of(rel: Tensor | None) -> int:
    """Horizon h of a relative table with 2h+1 rows (0 when there is no table)."""
    return 0 if rel is None else (rel.shape[-2] - 1) // 2


def relative_index(query_positions: Tensor, key_positions: Tensor, horizon: int) -> Tensor:
    """r(i, j) = clip(p_i - j, -h, h) + h, shape (len(query_positions), len(key_positions))."""
    delta = query_positions[:, None] - key_positions[None, :]
    return delta.clamp(-horizon, horizon) + horizon


def augment_values(v: Tensor, key_mask: Tensor | None) -> Tensor:
    """[m_j v_j, m_j]: values times the key mask, with the mask appended as a last channel.

    One pass of any algorithm over the augmented values yields the numerator (first Dv channels)
    and the normaliser (last channel) of the row-normalised attention.
    """
    if key_mask is None:
        ones = torch.ones(*v.shape[:-1], 1, dtype=v.dtype, device=v.device)
        return torch.cat([v, ones], dim=-1)
    m = key_mask.to(v.dtype)[:, None, :, None].expand(*v.shape[:-1], 1)
    return torch.cat([v * m, m], dim=-1)


def normalise(a: Tensor) -> Tensor:
    """Split augmented sums into out = numerator / normaliser; rows with no visible key give 0."""
    num, den = a[..., :-1], a[..., -1:]
    visible = den > 0
    return torch.where(visible, num / torch.where(visible, den, torch.ones_like(den)), torch.zeros_like(num))


def _describe(t: object) -> str:
    if isinstance(t, Tensor):
        return f"tensor of shape {tuple(t.shape)} and dtype {t.dtype}"
    return f"{type(t).__name__} {t!r}"


def check_attention_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel: Tensor | None,
    key_mask: Tensor | None,
    query_offset: int,
    mode: str,
) -> None:
    """Raise ValueError naming the argument when shapes, dtypes or values are not as documented."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"`{name}` must be a 4-D tensor (batch, heads, length, dim), got {_describe(t)}")
        if not t.is_floating_point():
            raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"`q`, `k` and `v` must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    b, h, _, d = q.shape
    if k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
        raise ValueError(f"`k` must have shape ({b}, {h}, Lk, {d}) to match `q` {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"`v` must have shape ({b}, {h}, {k.shape[2]}, Dv) to match `k`, got {tuple(v.shape)}")
    if k.shape[2] == 0 or q.shape[2] == 0:
        raise ValueError(f"`q` and `k` must hold at least one position, got Lq={q.shape[2]}, Lk={k.shape[2]}")
    if rel is not None:
        if not isinstance(rel, Tensor) or rel.dim() not in (2, 3):
            raise ValueError(f"`rel` must be a tensor of shape (heads, 2h+1, dim) or (2h+1, dim), got {_describe(rel)}")
        if rel.dtype != q.dtype:
            raise ValueError(f"`rel` must have the dtype of `q` ({q.dtype}), got {rel.dtype}")
        if rel.shape[-1] != d or rel.shape[-2] % 2 != 1 or (rel.dim() == 3 and rel.shape[0] != h):
            expected = f"({h}, 2h+1, {d}) or (2h+1, {d})"
            raise ValueError(f"`rel` must have shape {expected} with an odd number of rows, got {tuple(rel.shape)}")
    if key_mask is not None:
        if not isinstance(key_mask, Tensor) or tuple(key_mask.shape) != (b, k.shape[2]):
            raise ValueError(f"`key_mask` must have shape (batch, Lk) = ({b}, {k.shape[2]}), got {_describe(key_mask)}")
        if key_mask.dtype != torch.bool and bool(((key_mask != 0) & (key_mask != 1)).any()):
            raise ValueError("`key_mask` must hold only 0 and 1 (or be boolean)")
    if isinstance(query_offset, bool) or not isinstance(query_offset, int) or query_offset < 0:
        raise ValueError(f"`query_offset` must be a non-negative int, got {query_offset!r}")
    if mode not in ATTENTION_MODES:
        raise ValueError(f"`mode` must be one of {ATTENTION_MODES}, got {mode!r}")
