"""Kernelized attention with a Fourier relative-position term, in linear time and memory.

The contract, per batch element and head (phi(x) = elu(x) + 1, positions P in R^n, parameters
a (D, n) frequencies, b (D,) phases, c (D,) amplitudes of the head):

    ph_ik = b_k + sum_n a_kn P_in          (query positions)
    pk_jk =       sum_n a_kn P_jn          (key positions)
    S_ij  = sum_k c_k phi(q_i)_k phi(k_j)_k cos(ph_ik - pk_jk)
          = sum_k c_k phi(q_i)_k phi(k_j)_k cos(b_k + a_k . (P_i - P_j))
    out_i = sum_j S_ij v_j / sum_j S_ij                                (over visible keys j)

so each feature k scores a pair by one harmonic of the relative position P_i - P_j. A key j is
visible to query i unless key_mask[j] == 0 or, for causal attention, j > i + query_offset (causality
always follows the token index, whatever the positions). By default the positions are the token
indices (n = 1): query i sits at i + query_offset, key j at j. The caller may give any real positions
(e.g. 2-D patch coordinates) as `q_positions` (B, Lq, n) and `k_positions` (B, Lk, n).

Guarded normaliser. Unlike plain kernelized attention, c_k cos(.) can be negative, so den_i =
sum_j S_ij can vanish or change sign. With

    M_i = sum_j m_j sum_k |c_k| phi(q_i)_k phi(k_j)_k          (>= |den_i|)

the ops return out_i = num_i / den_safe_i where den_safe_i = den_i if |den_i| >= eps M_i, and
sign(den_i) eps M_i otherwise (sign(0) = +1); out_i = 0 where M_i = 0 (no visible key). Since
|num_i| <= max_j |v_j| M_i, every output obeys |out_i| <= max|v| / eps, and it equals the exact
formula wherever the normaliser is well conditioned (|den_i| >= eps M_i). `eps` defaults to 1e-2.

Linear algorithm. With cos(x - y) = cos x cos y + sin x sin y, S_ij = Qc_i . Kc_j + Qs_i . Ks_j with
Qc = c * phi(q) * cos(ph), Qs = c * phi(q) * sin(ph), Kc = phi(k) * cos(pk), Ks = phi(k) * sin(pk):
plain linear attention with 2D features on the augmented values [m_j v_j, m_j], which yields the
numerator and den in one pass; M_i = |c| phi(q_i) . sum_j m_j phi(k_j) needs only a running sum of
m_j phi(k_j), O(L D). Bidirectional attention sums all keys once, O((Lq + Lk) D Dv). Causal attention
cuts the token indices into chunks of c tokens: dense masked scores inside a chunk, and a running sum
of chunk states sum_j [Kc_j, Ks_j] [m_j v_j, m_j]^T across chunks, O(L (c + D) Dv) time.

Memory. `chunk_fourier_attention` works on blocks: groups of (batch, head) rows times spans of whole
chunks, sized so that no temporary holds more than about `BLOCK_ELEMENTS` numbers; the scan over
spans carries one 2D x (Dv + 1) state per row. Small allocations are served from memory the
allocator already holds, whereas tensors of tens of MiB come as fresh pages from the kernel and make
wall time grow faster than the work at long lengths. The backward pass is written by hand
(`_ChunkFourier`): it saves only the inputs, O(L (D + Dv)) per head, and recomputes features, scores
and states span by span, walking the spans backwards with the gradient sums of later queries.
Positions and the key mask receive no gradient, and the gradient itself cannot be differentiated
again (no double backward).

Recurrent form (`fourier_step`): the state is the two D x (Dv + 1) sums of keys times cos and sin,
the sum of phi(k_j) m_j for the guard, and the number of tokens seen; its size does not depend on
the length.

Reference: kernelized attention with a Fourier (cosine) relative-position kernel, linear for masked and
unmasked attention through the product formula of the cosine; phi from Katharopoulos et al. (2020).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .ops_common import augment_values, check_attention_inputs, compute_dtype, elu_feature_map


DEFAULT_CHUNK_SIZE = 64
DEFAULT_EPS = 1e-2


def naive_fourier_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    query_offset: int = 0,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Quadratic reference of `fourier_attention`: the full (Lq, Lk) score matrix, then the guard.

    S_ij = sum_k c_k phi(q_i)_k phi(k_j)_k cos(ph_ik - pk_jk), M_i = sum_j sum_k |c_k| phi(q_i)_k
    phi(k_j)_k, both over visible keys; out_i = num_i / den_safe_i as in the module docstring. The
    cosine of the difference is expanded as cos cos + sin sin so that no (Lq, Lk, D) tensor is formed.

    Shapes: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv), a (H, D, n), b (H, D), c (H, D),
    q_positions (B, Lq, n), k_positions (B, Lk, n). Returns (B, H, Lq, Dv) in q's dtype.
    Cost: O(Lq Lk (D + Dv)) time and O(Lq Lk) memory per head.
    """
    dtype = compute_dtype(q.dtype)
    lq, lk = q.shape[2], k.shape[2]
    qf, kf = elu_feature_map(q.to(dtype)), elu_feature_map(k.to(dtype))
    a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
    q_index = torch.arange(lq, device=q.device) + query_offset
    k_index = torch.arange(lk, device=q.device)
    pq = q_index.to(dtype)[None, :, None] if q_positions is None else q_positions.to(dtype)
    pk = k_index.to(dtype)[None, :, None] if k_positions is None else k_positions.to(dtype)
    ph = b[None, :, None, :] + torch.einsum("bin,hkn->bhik", pq, a)  # (B, H, Lq, D)
    pkey = torch.einsum("bjn,hkn->bhjk", pk, a)  # (B, H, Lk, D)
    cq = c[None, :, None, :] * qf
    scores = (cq * torch.cos(ph)) @ (kf * torch.cos(pkey)).transpose(-1, -2)
    scores = scores + (cq * torch.sin(ph)) @ (kf * torch.sin(pkey)).transpose(-1, -2)
    bound = (c.abs()[None, :, None, :] * qf) @ kf.transpose(-1, -2)
    keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        keep = k_index[None, :] <= q_index[:, None]
    keep = keep[None, None]
    if key_mask is not None:
        keep = keep & key_mask.bool()[:, None, None, :]
    scores = scores * keep.to(dtype)
    bound = bound * keep.to(dtype)
    num = scores @ v.to(dtype)
    den = scores.sum(-1, keepdim=True)
    big = bound.sum(-1, keepdim=True)
    sign = torch.where(den >= 0, torch.ones_like(den), -torch.ones_like(den))
    den_safe = torch.where(den.abs() >= eps * big, den, sign * eps * big)
    visible = big > 0
    den_safe = torch.where(visible, den_safe, torch.ones_like(den_safe))
    out = torch.where(visible, num / den_safe, torch.zeros_like(num))
    return out.to(q.dtype)


def _describe(t: object) -> str:
    if isinstance(t, Tensor):
        return f"tensor of shape {tuple(t.shape)} and dtype {t.dtype}"
    return f"{type(t).__name__} {t!r}"


def _check_eps(eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 < eps <= 1.0):
        raise ValueError(f"`eps` must be a number with 0 < eps <= 1, got {eps!r}")


def _check_parameters(q: Tensor, a: Tensor, b: Tensor, c: Tensor) -> int:
    """Check a (H, D, n), b (H, D), c (H, D) against q (B, H, L, D); return n."""
    heads, dim = q.shape[1], q.shape[-1]
    if not isinstance(a, Tensor) or a.dim() != 3 or tuple(a.shape[:2]) != (heads, dim) or a.shape[2] < 1:
        raise ValueError(f"`a` must be a tensor of shape (heads, dim, n) = ({heads}, {dim}, n), got {_describe(a)}")
    for name, t in (("a", a), ("b", b), ("c", c)):
        if isinstance(t, Tensor) and not t.is_floating_point():
            raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {t.dtype}")
    for name, t in (("b", b), ("c", c)):
        if not isinstance(t, Tensor) or tuple(t.shape) != (heads, dim):
            raise ValueError(f"`{name}` must be a tensor of shape (heads, dim) = ({heads}, {dim}), got {_describe(t)}")
    return a.shape[2]


def _check_positions(name: str, positions: Tensor | None, batch: int, length: int, n: int) -> None:
    if positions is None:
        if n != 1:
            raise ValueError(
                f"`{name}` is required when `a` has n = {n} position dimensions (the default, the token "
                f"index, has n = 1)"
            )
        return
    if (
        not isinstance(positions, Tensor)
        or positions.dim() != 3
        or positions.shape[0] not in (1, batch)
        or tuple(positions.shape[1:]) != (length, n)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, length, n) = ({batch}, {length}, {n}) with n = a.shape[-1] "
            f"(or batch 1), got {_describe(positions)}"
        )
    if positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold real numbers, got dtype {positions.dtype}")


class _Features(NamedTuple):
    q_cs: Tensor  # (B, H, Lq, 2D)  [c phi(q) cos(ph), c phi(q) sin(ph)]
    q_abs: Tensor  # (B, H, Lq, D)  |c| phi(q)
    k_cs: Tensor  # (B, H, Lk, 2D)  [phi(k) cos(pk), phi(k) sin(pk)]
    kf: Tensor  # (B, H, Lk, D)   phi(k)
    va: Tensor  # (B, H, Lk, Dv+1)  [m v, m]


def _query_features(q: Tensor, a: Tensor, b: Tensor, c: Tensor, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
    """positions (B or 1, Lq, n) -> ([c phi(q) cos(ph), c phi(q) sin(ph)], |c| phi(q))."""
    qf = elu_feature_map(q.to(dtype))
    a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
    ph = b[None, :, None, :] + torch.einsum("bin,hkn->bhik", positions.to(dtype), a)
    cq = c[None, :, None, :] * qf
    return torch.cat([cq * torch.cos(ph), cq * torch.sin(ph)], dim=-1), c.abs()[None, :, None, :] * qf


def _key_features(k: Tensor, a: Tensor, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
    """positions (B or 1, Lk, n) -> ([phi(k) cos(pk), phi(k) sin(pk)], phi(k))."""
    kf = elu_feature_map(k.to(dtype))
    pk = torch.einsum("bjn,hkn->bhjk", positions.to(dtype), a.to(dtype))
    return torch.cat([kf * torch.cos(pk), kf * torch.sin(pk)], dim=-1), kf


def _token_positions(start: int, length: int, dtype, device) -> Tensor:
    return (torch.arange(length, device=device) + start).to(dtype)[None, :, None]


def _causal_sums(qf: Tensor, kf: Tensor, va: Tensor, query_offset: int, chunk: int) -> Tensor:
    """A_i = sum_{j <= i + query_offset} (qf_i . kf_j) va_j for rows qf (G, Lq, F), kf (G, Lk, F), va (G, Lk, E).

    Query chunks are aligned with key chunks of `chunk` tokens: query i (position p = i +
    query_offset) reads the prefix state of all key chunks before chunk p // chunk, plus masked dense
    scores inside its own chunk. Keys past the end form an extra zero chunk.
    """
    g, lq, f = qf.shape
    lk, e = kf.shape[1], va.shape[-1]
    first, lead = divmod(query_offset, chunk)
    nq, nk = math.ceil((lead + lq) / chunk), math.ceil(lk / chunk)
    qc = F.pad(qf, (0, 0, lead, nq * chunk - lead - lq)).view(g, nq, chunk, f)
    kc = F.pad(kf, (0, 0, 0, (nk + 1) * chunk - lk)).view(g, nk + 1, chunk, f)
    vc = F.pad(va, (0, 0, 0, (nk + 1) * chunk - lk)).view(g, nk + 1, chunk, e)
    summary = kc[:, :nk].transpose(2, 3) @ vc[:, :nk]  # (G, Nk, F, E)
    pre = torch.cat([summary.new_zeros(g, 1, f, e), summary.cumsum(1)], dim=1)  # sums over chunks < t
    index = (first + torch.arange(nq, device=qf.device)).clamp(max=nk)
    within = torch.ones(chunk, chunk, dtype=torch.bool, device=qf.device).tril()
    scores = (qc @ kc[:, index].transpose(2, 3)) * within.to(qf.dtype)
    out = qc @ pre[:, index] + scores @ vc[:, index]  # (G, Nq, c, E)
    return out.view(g, nq * chunk, e)[:, lead : lead + lq]


def _step_sums(feats: _Features, chunk: int) -> tuple[Tensor, Tensor]:
    """Causal augmented sums A = [num, den] (B, H, n, Dv+1) and guard sums M (B, H, n, 1) of new tokens."""
    q_cs, q_abs, k_cs, kf, va = feats
    b, h, lq, _ = q_cs.shape

    def rows(x: Tensor) -> Tensor:
        return x.expand(b, h, *x.shape[2:]).reshape(b * h, x.shape[2], x.shape[3])

    a_sum = _causal_sums(rows(q_cs), rows(k_cs), rows(va), 0, chunk)
    big = _causal_sums(rows(q_abs), rows(kf), rows(va[..., -1:]), 0, chunk)
    return a_sum.view(b, h, lq, -1), big.view(b, h, lq, 1)


def _guarded_normalise(a_sum: Tensor, big: Tensor, eps: float) -> Tensor:
    """num / den_safe with den_safe = den if |den| >= eps M else sign(den) eps M; 0 where M == 0."""
    num, den = a_sum[..., :-1], a_sum[..., -1:]
    sign = torch.where(den >= 0, torch.ones_like(den), -torch.ones_like(den))
    den_safe = torch.where(den.abs() >= eps * big, den, sign * eps * big)
    visible = big > 0
    den_safe = torch.where(visible, den_safe, torch.ones_like(den_safe))
    return torch.where(visible, num / den_safe, torch.zeros_like(num))


# Largest temporary (in elements) one block of rows and chunks may create: small blocks keep
# allocations out of fresh pages from the kernel, which otherwise dominate wall time at long lengths.
BLOCK_ELEMENTS = 1 << 20


class _Rows(NamedTuple):
    b0: int  # batch rows [b0, b1)
    b1: int
    h0: int  # heads [h0, h1)
    h1: int


class _Plan(NamedTuple):
    groups: list[_Rows]
    span_chunks: int  # chunks per span


def _plan(bsz: int, heads: int, chunk: int, dim: int, value_dim: int) -> _Plan:
    """Row groups and span length so that rows * chunks * (largest per-chunk temporary) <= BLOCK_ELEMENTS."""
    # per row and chunk: a chunk state (2D, Dv+1), features (c, 2D), scores (c, c), values (c, Dv+1)
    per_chunk = max(2 * dim * (value_dim + 1), 2 * chunk * dim, chunk * chunk, chunk * (value_dim + 1))
    budget = max(1, BLOCK_ELEMENTS // per_chunk)
    rows = min(bsz * heads, budget)
    if rows >= heads:
        step = rows // heads
        groups = [_Rows(b0, min(bsz, b0 + step), 0, heads) for b0 in range(0, bsz, step)]
    else:
        groups = [_Rows(bi, bi + 1, h0, min(heads, h0 + rows)) for bi in range(bsz) for h0 in range(0, heads, rows)]
    largest = max((r.b1 - r.b0) * (r.h1 - r.h0) for r in groups)
    return _Plan(groups, max(1, budget // largest))


class _Span(NamedTuple):
    """Absolute chunks [t0, t1), the query rows [i0, i1) whose positions i + query_offset fall in them
    (the first at row `lead` of the span) and the key rows [j0, j1) in them."""

    t0: int
    t1: int
    i0: int
    i1: int
    lead: int
    j0: int
    j1: int


def _causal_spans(lq: int, lk: int, query_offset: int, chunk: int, step: int) -> list[_Span]:
    """Spans of at most `step` chunks over the key chunks and the query chunks, in order.

    Query i reads key j if j <= i + query_offset: chunks are laid on the key index, and query i sits in
    chunk (i + query_offset) // chunk. Chunks holding neither keys nor queries are skipped.
    """
    first = query_offset // chunk
    query_end = -(-(query_offset + lq) // chunk)
    n_key = -(-lk // chunk)
    keys_only = min(first, n_key)
    end = max(n_key, query_end)
    ranges = [(t, min(t + step, keys_only)) for t in range(0, keys_only, step)]
    ranges += [(t, min(t + step, end)) for t in range(first, end, step)]
    spans = []
    for t0, t1 in ranges:
        s0, s1 = t0 * chunk, t1 * chunk
        i0 = max(0, s0 - query_offset)
        i1 = max(i0, min(lq, s1 - query_offset))
        spans.append(_Span(t0, t1, i0, i1, i0 + query_offset - s0, min(s0, lk), min(s1, lk)))
    return spans


def _positions(positions: Tensor | None, rows: _Rows, start: int, stop: int, shift: int, dtype, device) -> Tensor:
    """Positions (1 or rows, n_tokens, n) of tokens [start, stop); the token index + shift by default."""
    if positions is None:
        return _token_positions(start + shift, stop - start, dtype, device)
    if positions.shape[0] > 1:
        positions = positions[rows.b0 : rows.b1]
    return positions[:, start:stop].to(dtype)


class _QueryBlock(NamedTuple):
    qf: Tensor  # (Bb, Hb, n, D) phi(q) of the block's n queries
    cq: Tensor  # (Bb, Hb, n, D) c phi(q)
    cos: Tensor  # (Pb, Hb, n, D) cos(ph), Pb = 1 when positions are shared by the batch
    sin: Tensor
    positions: Tensor  # (Pb, n, n_pos)
    cs: Tensor  # (Bb * Hb, T, 2D) [c phi(q) cos(ph), c phi(q) sin(ph)], rows lead..lead+n, zero elsewhere
    abs: Tensor  # (Bb * Hb, T, D) |c| phi(q), same rows


class _KeyBlock(NamedTuple):
    kf: Tensor  # (Bb, Hb, n, D) phi(k) of the block's n keys
    cos: Tensor  # (Pb, Hb, n, D) cos(pk)
    sin: Tensor
    positions: Tensor  # (Pb, n, n_pos)
    mask: Tensor | None  # (Bb, 1, n, 1) key mask m
    cs: Tensor  # (Bb * Hb, T, 2D) [phi(k) cos(pk), phi(k) sin(pk)], rows 0..n, zero elsewhere
    va: Tensor  # (Bb * Hb, T, Dv+1) [m v, m], zero past row n
    kfm: Tensor  # (Bb * Hb, T, D) m phi(k), zero past row n


class _Sums(NamedTuple):
    """Sums over keys, per row: kv = sum_j [Kc_j, Ks_j]^T [m_j v_j, m_j] and k = sum_j m_j phi(k_j)."""

    kv: Tensor  # (G, 2D, Dv+1)
    k: Tensor  # (G, D)


class _Grads(NamedTuple):
    dq: Tensor
    dk: Tensor
    dv: Tensor
    da: Tensor  # accumulated in the compute dtype
    db: Tensor
    dc: Tensor


def _zero_sums(g: int, dim: int, value_dim: int, dtype, device) -> _Sums:
    return _Sums(torch.zeros(g, 2 * dim, value_dim + 1, dtype=dtype, device=device),
                 torch.zeros(g, dim, dtype=dtype, device=device))


def _padded(like: Tensor, shape: tuple[int, ...], lead: int, n: int) -> Tensor:
    """An uninitialised (..., T, F) buffer whose rows outside [lead, lead + n) are zero."""
    out = like.new_empty(shape)
    out[..., :lead, :] = 0.0
    out[..., lead + n :, :] = 0.0
    return out


def _query_block(q, a, b, c, positions, rows: _Rows, i0, i1, lead, length, query_offset, dtype) -> _QueryBlock:
    """Features of queries [i0, i1) of `rows`, placed at rows lead.. of a zero block of `length` rows."""
    b0, b1, h0, h1 = rows
    qf = elu_feature_map(q[b0:b1, h0:h1, i0:i1].to(dtype))
    pos = _positions(positions, rows, i0, i1, query_offset, dtype, q.device)
    ph = b[h0:h1].to(dtype)[None, :, None, :] + torch.einsum("bin,hkn->bhik", pos, a[h0:h1].to(dtype))
    cos, sin = torch.cos(ph), torch.sin(ph)
    amp = c[h0:h1].to(dtype)[None, :, None, :]
    cq = amp * qf
    nb, nh, n, d = qf.shape
    cs = _padded(qf, (nb, nh, length, 2 * d), lead, n)
    torch.mul(cq, cos, out=cs[:, :, lead : lead + n, :d])
    torch.mul(cq, sin, out=cs[:, :, lead : lead + n, d:])
    qa = _padded(qf, (nb, nh, length, d), lead, n)
    torch.mul(amp.abs(), qf, out=qa[:, :, lead : lead + n])
    return _QueryBlock(qf, cq, cos, sin, pos, cs.view(nb * nh, length, 2 * d), qa.view(nb * nh, length, d))


def _key_block(k, v, a, positions, key_mask, rows: _Rows, j0, j1, length, dtype) -> _KeyBlock:
    """Features of keys [j0, j1) of `rows`, in the first rows of a zero block of `length` rows."""
    b0, b1, h0, h1 = rows
    kf = elu_feature_map(k[b0:b1, h0:h1, j0:j1].to(dtype))
    pos = _positions(positions, rows, j0, j1, 0, dtype, k.device)
    pk = torch.einsum("bjn,hkn->bhjk", pos, a[h0:h1].to(dtype))
    cos, sin = torch.cos(pk), torch.sin(pk)
    nb, nh, n, d = kf.shape
    values = v[b0:b1, h0:h1, j0:j1].to(dtype)
    dv = values.shape[-1]
    cs = _padded(kf, (nb, nh, length, 2 * d), 0, n)
    torch.mul(kf, cos, out=cs[:, :, :n, :d])
    torch.mul(kf, sin, out=cs[:, :, :n, d:])
    va = _padded(kf, (nb, nh, length, dv + 1), 0, n)
    kfm = kf if key_mask is None and n == length else _padded(kf, (nb, nh, length, d), 0, n)
    mask = None
    if key_mask is None:
        va[:, :, :n, :dv] = values
        va[:, :, :n, dv] = 1.0
        if kfm is not kf:
            kfm[:, :, :n] = kf
    else:
        mask = key_mask[b0:b1, j0:j1].to(dtype)[:, None, :, None]
        torch.mul(values, mask, out=va[:, :, :n, :dv])
        va[:, :, :n, dv:] = mask
        torch.mul(kf, mask, out=kfm[:, :, :n])
    g = nb * nh
    return _KeyBlock(kf, cos, sin, pos, mask, cs.view(g, length, 2 * d), va.view(g, length, dv + 1),
                     kfm.view(g, length, d))


def _advance(kb: _KeyBlock, sums: _Sums, chunk: int) -> tuple[Tensor, _Sums]:
    """Chunk prefix states of one span of keys, and the sums after it.

    Returns pre (G * N, 2D, Dv+1), the sums over all keys of earlier chunks for each of the span's N
    chunks, and the new sums. Forward and backward compute the sums with this same function, so the
    guard takes the same branch in both.
    """
    g, length, f = kb.cs.shape
    n, e = length // chunk, kb.va.shape[-1]
    summary = torch.bmm(kb.cs.view(g * n, chunk, f).transpose(1, 2), kb.va.view(g * n, chunk, e))
    summary = summary.view(g, n, f * e)
    # pre[t] = carry + sum_{t' < t} summary[t'] as one product with a triangular matrix: a single op
    # (a loop of adds, or torch.cumsum, is slower, and every op costs a thread sync on a busy machine)
    pre = torch.baddbmm(sums.kv.view(g, 1, f * e), _triangle(n, summary, upper=False), summary)
    kv = (pre[:, -1] + summary[:, -1]).view(g, f, e)
    return pre.view(g * n, f, e), _Sums(kv, sums.k + kb.kfm.sum(1))


def _triangle(n: int, like: Tensor, upper: bool) -> Tensor:
    """(G, n, n) ones strictly below (or above) the diagonal, G = like.shape[0], as a broadcast view."""
    ones = torch.ones(n, n, dtype=like.dtype, device=like.device)
    return (ones.triu(1) if upper else ones.tril(-1)).expand(like.shape[0], n, n)


def _key_sums(kb: _KeyBlock, sums: _Sums) -> _Sums:
    """The sums after adding every key of the block (bidirectional attention needs no chunk states)."""
    return _Sums(torch.baddbmm(sums.kv, kb.cs.transpose(1, 2), kb.va), sums.k + kb.kfm.sum(1))


def _key_prefix(kb: _KeyBlock, sums: _Sums) -> Tensor:
    """kcum (G, T, D): sum of m phi(k_j') over all keys j' up to each key row j of the span."""
    return kb.kfm.cumsum(1).add_(sums.k[:, None])


def _local_sums(qb: _QueryBlock, kb: _KeyBlock, pre: Tensor, kcum: Tensor, chunk: int, within: Tensor):
    """A = [num, den] and M of a span whose queries and keys share its chunks; also the masked scores."""
    g, length, f = qb.cs.shape
    qc = qb.cs.view(-1, chunk, f)
    kc = kb.cs.view(-1, chunk, f)
    vc = kb.va.view(-1, chunk, kb.va.shape[-1])
    scores = torch.bmm(qc, kc.transpose(1, 2)).mul_(within)  # (G * N, c, c)
    a_sum = torch.bmm(qc, pre).add_(torch.bmm(scores, vc))
    big = (qb.abs * kcum).sum(-1, keepdim=True)
    return a_sum.view(g, length, -1), big, scores


def _read_sums(qb: _QueryBlock, sums: _Sums) -> tuple[Tensor, Tensor]:
    """A and M of queries that see every key summarised in `sums`."""
    return torch.bmm(qb.cs, sums.kv), torch.bmm(qb.abs, sums.k[..., None])


def _guard_backward(a_sum: Tensor, big: Tensor, grad: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Gradients of `_guarded_normalise` with respect to A = [num, den] and M, given dL/d out."""
    num, den = a_sum[..., :-1], a_sum[..., -1:]
    visible = big > 0
    well = den.abs() >= eps * big
    sign = torch.where(den >= 0, torch.ones_like(den), -torch.ones_like(den))
    den_safe = torch.where(well, den, sign * eps * big)
    den_safe = torch.where(visible, den_safe, torch.ones_like(den_safe))
    grad = torch.where(visible, grad, torch.zeros_like(grad))
    d_den_safe = -(grad * num).sum(-1, keepdim=True) / (den_safe * den_safe)
    d_den = torch.where(well, d_den_safe, torch.zeros_like(d_den_safe))
    d_big = torch.where(well, torch.zeros_like(d_den_safe), sign * eps * d_den_safe)
    d_a = a_sum.new_empty(a_sum.shape)
    torch.div(grad, den_safe, out=d_a[..., :-1])
    d_a[..., -1:] = d_den
    return d_a, d_big


def _grad_rows(grad_out: Tensor, rows: _Rows, i0: int, i1: int, lead: int, length: int, dtype) -> Tensor:
    """dL/d out of queries [i0, i1), placed like the query block: (G, T, Dv), zero elsewhere."""
    b0, b1, h0, h1 = rows
    block = grad_out.new_zeros(b1 - b0, h1 - h0, length, grad_out.shape[-1], dtype=dtype)
    block[:, :, lead : lead + i1 - i0] = grad_out[b0:b1, h0:h1, i0:i1]
    return block.view(-1, length, grad_out.shape[-1])


def _write_rows(target: Tensor, block: Tensor, rows: _Rows, i0: int, i1: int, lead: int) -> None:
    b0, b1, h0, h1 = rows
    target[b0:b1, h0:h1, i0:i1] = block.view(b1 - b0, h1 - h0, -1, block.shape[-1])[:, :, lead : lead + i1 - i0]


def _accumulate_phase(da: Tensor, rows: _Rows, d_phase: Tensor, positions: Tensor) -> None:
    """da[h] += sum over batch and tokens of d_phase (Bb, Hb, n, D) times positions (Pb, n, n_pos)."""
    if positions.shape[0] != d_phase.shape[0]:
        d_phase = d_phase.sum(0, keepdim=True)
    da[rows.h0 : rows.h1] += torch.einsum("bhik,bin->hkn", d_phase, positions)


def _query_chain(qb: _QueryBlock, d_cs: Tensor, d_abs: Tensor, c: Tensor, rows: _Rows, i0, i1, lead, grads):
    """From dL/d[Qc, Qs] and dL/d|c|phi(q) of a query block to dq (written) and da, db, dc (added)."""
    b0, b1, h0, h1 = rows
    nb, nh, n, d = qb.qf.shape
    d_cs = d_cs.view(nb, nh, -1, 2 * d)[:, :, lead : lead + n]
    d_abs = d_abs.view(nb, nh, -1, d)[:, :, lead : lead + n]
    d_cos, d_sin = d_cs[..., :d], d_cs[..., d:]
    amp = c[h0:h1].to(qb.qf.dtype)[None, :, None, :]
    d_phase = qb.cq * torch.addcmul(d_sin * qb.cos, d_cos, qb.sin, value=-1.0)
    # dL/d(c phi(q)) from the cos and sin features, plus |c| = c sign(c) from the guard features
    d_cq = torch.addcmul(torch.addcmul(d_cos * qb.cos, d_sin, qb.sin), amp.sign(), d_abs)
    grads.dc[h0:h1] += (qb.qf * d_cq).sum((0, 2))
    grads.db[h0:h1] += d_phase.sum((0, 2))
    _accumulate_phase(grads.da, rows, d_phase, qb.positions)
    # phi'(x) = min(phi(x), 1) for phi = elu + 1
    torch.mul(amp * d_cq, qb.qf.clamp(max=1.0), out=grads.dq[b0:b1, h0:h1, i0:i1])


def _key_chain(kb: _KeyBlock, d_cs: Tensor, d_kfm: Tensor, d_va: Tensor, rows: _Rows, j0, j1, grads):
    """From dL/d[Kc, Ks], dL/d m phi(k) and dL/d[m v, m] of a key block to dk, dv (written) and da (added)."""
    b0, b1, h0, h1 = rows
    nb, nh, n, d = kb.kf.shape
    d_cs = d_cs.view(nb, nh, -1, 2 * d)[:, :, :n]
    d_cos, d_sin = d_cs[..., :d], d_cs[..., d:]
    d_kfm = d_kfm.view(nb, nh, -1, d)[:, :, :n]
    d_values = d_va.view(nb, nh, -1, d_va.shape[-1])[:, :, :n, :-1]
    if kb.mask is not None:
        d_kfm = d_kfm * kb.mask
        d_values = d_values * kb.mask
    d_kf = torch.addcmul(torch.addcmul(d_kfm, d_cos, kb.cos), d_sin, kb.sin)
    _accumulate_phase(grads.da, rows, kb.kf * torch.addcmul(d_sin * kb.cos, d_cos, kb.sin, value=-1.0), kb.positions)
    torch.mul(d_kf, kb.kf.clamp(max=1.0), out=grads.dk[b0:b1, h0:h1, j0:j1])
    grads.dv[b0:b1, h0:h1, j0:j1] = d_values


def _keys_backward(kb: _KeyBlock, later: _Sums, rows: _Rows, j0, j1, grads) -> None:
    """Keys all read by the same queries, whose gradient sums are `later`."""
    d_cs = torch.bmm(kb.va, later.kv.transpose(1, 2))
    d_va = torch.bmm(kb.cs, later.kv)
    _key_chain(kb, d_cs, later.k[:, None, :], d_va, rows, j0, j1, grads)


def _read_backward(qb, sums: _Sums, grad: Tensor, eps, c, rows, i0, i1, lead, grads) -> _Sums:
    """Backward of `_read_sums` and the guard; returns the gradient sums of these queries for the keys."""
    a_sum, big = _read_sums(qb, sums)
    d_a, d_big = _guard_backward(a_sum, big, grad, eps)
    d_cs = torch.bmm(d_a, sums.kv.transpose(1, 2))
    d_abs = d_big * sums.k[:, None, :]
    _query_chain(qb, d_cs, d_abs, c, rows, i0, i1, lead, grads)
    return _Sums(torch.bmm(qb.cs.transpose(1, 2), d_a), (d_big * qb.abs).sum(1))


def _within(chunk: int, dtype, device) -> Tensor:
    return torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril().to(dtype)


def _chunk_forward(q, k, v, a, b, c, q_positions, k_positions, key_mask, causal, query_offset, chunk, eps):
    bsz, heads, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    dtype = compute_dtype(q.dtype)
    out = q.new_empty(bsz, heads, lq, dv)
    plan = _plan(bsz, heads, chunk, d, dv)
    within = _within(chunk, dtype, q.device)
    span_tokens = plan.span_chunks * chunk
    for rows in plan.groups:
        g = (rows.b1 - rows.b0) * (rows.h1 - rows.h0)
        sums = _zero_sums(g, d, dv, dtype, q.device)

        def keys(j0, j1, length):
            return _key_block(k, v, a, k_positions, key_mask, rows, j0, j1, length, dtype)

        def queries(i0, i1, lead, length):
            return _query_block(q, a, b, c, q_positions, rows, i0, i1, lead, length, query_offset, dtype)

        if not causal:
            for j0 in range(0, lk, span_tokens):
                j1 = min(lk, j0 + span_tokens)
                sums = _key_sums(keys(j0, j1, j1 - j0), sums)
            for i0 in range(0, lq, span_tokens):
                i1 = min(lq, i0 + span_tokens)
                a_sum, big = _read_sums(queries(i0, i1, 0, i1 - i0), sums)
                _write_rows(out, _guarded_normalise(a_sum, big, eps), rows, i0, i1, 0)
            continue
        for span in _causal_spans(lq, lk, query_offset, chunk, plan.span_chunks):
            length = (span.t1 - span.t0) * chunk
            if span.i1 == span.i0:
                sums = _advance(keys(span.j0, span.j1, length), sums, chunk)[1]
                continue
            qb = queries(span.i0, span.i1, span.lead, length)
            if span.j1 == span.j0:
                a_sum, big = _read_sums(qb, sums)
            else:
                kb = keys(span.j0, span.j1, length)
                pre, sums_after = _advance(kb, sums, chunk)
                a_sum, big, _ = _local_sums(qb, kb, pre, _key_prefix(kb, sums), chunk, within)
                sums = sums_after
            _write_rows(out, _guarded_normalise(a_sum, big, eps), rows, span.i0, span.i1, span.lead)
    return out


def _local_backward(qb, kb, sums: _Sums, later: _Sums, grad, eps, chunk, within, c, rows, span: _Span, grads) -> _Sums:
    """Backward of a span whose queries and keys share its chunks, given the sums of the keys before
    it (`sums`) and the gradient sums of the queries after it (`later`); returns `later` for the
    spans before."""
    pre = _advance(kb, sums, chunk)[0]
    kcum = _key_prefix(kb, sums)
    a_sum, big, scores = _local_sums(qb, kb, pre, kcum, chunk, within)
    d_a, d_big = _guard_backward(a_sum, big, grad, eps)
    g, length, f = qb.cs.shape
    n, e = length // chunk, kb.va.shape[-1]
    qc, kc = qb.cs.view(g * n, chunk, f), kb.cs.view(g * n, chunk, f)
    vc, d_ac = kb.va.view(g * n, chunk, e), d_a.view(g * n, chunk, e)
    d_scores = torch.bmm(d_ac, vc.transpose(1, 2)).mul_(within)
    d_qcs = torch.bmm(d_scores, kc).baddbmm_(d_ac, pre.transpose(1, 2))
    q_sums = torch.bmm(qc.transpose(1, 2), d_ac).view(g, n, f * e)
    # after[t] = later + the query sums of chunks t' > t: what the keys of chunk t feed
    after = torch.baddbmm(later.kv.view(g, 1, f * e), _triangle(n, q_sums, upper=True), q_sums)
    later_kv = (after[:, 0] + q_sums[:, 0]).view(g, f, e)
    after = after.view(g * n, f, e)
    d_kcs = torch.bmm(d_scores.transpose(1, 2), qc).baddbmm_(vc, after.transpose(1, 2))
    d_va = torch.bmm(scores.transpose(1, 2), d_ac).baddbmm_(kc, after)
    # M_i = |c| phi(q_i) . kcum_i: key row j feeds every query row at or after it
    d_kfm = (d_big * qb.abs).flip(1).cumsum(1).flip(1).add_(later.k[:, None])
    _query_chain(qb, d_qcs.view(g, length, f), d_big * kcum, c, rows, span.i0, span.i1, span.lead, grads)
    _key_chain(kb, d_kcs.view(g, length, f), d_kfm, d_va.view(g, length, e), rows, span.j0, span.j1, grads)
    return _Sums(later_kv, d_kfm[:, 0])


def _chunk_backward(grad_out, q, k, v, a, b, c, q_positions, k_positions, key_mask, causal, query_offset, chunk, eps):
    bsz, heads, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    dtype = compute_dtype(q.dtype)
    grads = _Grads(
        torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
        torch.zeros(a.shape, dtype=dtype, device=a.device), torch.zeros(b.shape, dtype=dtype, device=b.device),
        torch.zeros(c.shape, dtype=dtype, device=c.device),
    )
    plan = _plan(bsz, heads, chunk, d, dv)
    within = _within(chunk, dtype, q.device)
    span_tokens = plan.span_chunks * chunk
    for rows in plan.groups:
        g = (rows.b1 - rows.b0) * (rows.h1 - rows.h0)
        zero = _zero_sums(g, d, dv, dtype, q.device)

        def keys(j0, j1, length):
            return _key_block(k, v, a, k_positions, key_mask, rows, j0, j1, length, dtype)

        def queries(i0, i1, lead, length):
            return _query_block(q, a, b, c, q_positions, rows, i0, i1, lead, length, query_offset, dtype)

        if not causal:
            key_spans = [(j0, min(lk, j0 + span_tokens)) for j0 in range(0, lk, span_tokens)]
            sums = zero
            for j0, j1 in key_spans:
                sums = _key_sums(keys(j0, j1, j1 - j0), sums)
            later = zero
            for i0 in range(0, lq, span_tokens):
                i1 = min(lq, i0 + span_tokens)
                grad = _grad_rows(grad_out, rows, i0, i1, 0, i1 - i0, dtype)
                part = _read_backward(queries(i0, i1, 0, i1 - i0), sums, grad, eps, c, rows, i0, i1, 0, grads)
                later = _Sums(later.kv + part.kv, later.k + part.k)
            for j0, j1 in key_spans:
                _keys_backward(keys(j0, j1, j1 - j0), later, rows, j0, j1, grads)
            continue
        spans = _causal_spans(lq, lk, query_offset, chunk, plan.span_chunks)
        before, sums = [], zero
        for span in spans:
            before.append(sums)
            if span.j1 > span.j0:
                sums = _advance(keys(span.j0, span.j1, (span.t1 - span.t0) * chunk), sums, chunk)[1]
        later = zero
        for span, sums in zip(reversed(spans), reversed(before)):
            length = (span.t1 - span.t0) * chunk
            if span.i1 == span.i0:
                _keys_backward(keys(span.j0, span.j1, length), later, rows, span.j0, span.j1, grads)
                continue
            qb = queries(span.i0, span.i1, span.lead, length)
            grad = _grad_rows(grad_out, rows, span.i0, span.i1, span.lead, length, dtype)
            if span.j1 == span.j0:
                part = _read_backward(qb, sums, grad, eps, c, rows, span.i0, span.i1, span.lead, grads)
                later = _Sums(later.kv + part.kv, later.k + part.k)
                continue
            kb = keys(span.j0, span.j1, length)
            later = _local_backward(qb, kb, sums, later, grad, eps, chunk, within, c, rows, span, grads)
    return grads


class _ChunkFourier(torch.autograd.Function):
    """The blocked linear path on (B, H, L, .) inputs; saves only its inputs, recomputes in backward.

    Gradients flow to q, k, v, a, b and c; positions and the key mask receive none.
    """

    @staticmethod
    def forward(ctx, q, k, v, a, b, c, q_positions, k_positions, key_mask, causal, query_offset, chunk, eps):
        ctx.save_for_backward(q, k, v, a, b, c, q_positions, k_positions, key_mask)
        ctx.config = (causal, query_offset, chunk, eps)
        return _chunk_forward(q, k, v, a, b, c, q_positions, k_positions, key_mask, causal, query_offset, chunk, eps)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, a, b, c, q_positions, k_positions, key_mask = ctx.saved_tensors
        grads = _chunk_backward(grad_out, q, k, v, a, b, c, q_positions, k_positions, key_mask, *ctx.config)
        return (
            grads.dq, grads.dk, grads.dv, grads.da.to(a.dtype), grads.db.to(b.dtype), grads.dc.to(c.dtype),
            None, None, None, None, None, None, None,
        )


def _check_inputs(q, k, v, a, b, c, key_mask, query_offset, mode, q_positions, k_positions, eps) -> None:
    check_attention_inputs(q, k, v, None, key_mask, query_offset, mode)
    n = _check_parameters(q, a, b, c)
    _check_positions("q_positions", q_positions, q.shape[0], q.shape[2], n)
    _check_positions("k_positions", k_positions, k.shape[0], k.shape[2], n)
    _check_eps(eps)


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive int, got {chunk_size!r}")


def chunk_fourier_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    query_offset: int = 0,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """The linear-time algorithm; same contract, shapes and guard as `fourier_attention`.

    Bidirectional: A_i = [Qc_i, Qs_i] . sum_j [Kc_j, Ks_j]^T [m_j v_j, m_j], one sum over all keys,
    O((Lq + Lk) D Dv) time per head. Causal: chunks of c = chunk_size tokens on the token index; a
    query reads the running sum of the key chunks before its own and masked dense scores inside it,
    O(Lq c (D + Dv) + (Lq + Lk) D Dv) time per head. In both, M_i = |c| phi(q_i) . sum_j m_j phi(k_j)
    over the same keys, then the guard of `fourier_attention`.

    Work is done in blocks of (batch, head) rows and spans of chunks, each creating at most about
    `BLOCK_ELEMENTS` numbers; beyond the outputs and gradients, memory is O(BLOCK_ELEMENTS) plus one
    2D x (Dv + 1) state per row (and, in the backward pass, per row and span). Autograd keeps only the
    inputs, O((Lq + Lk)(D + Dv)) per head; the backward pass recomputes each block and costs about
    three forward passes. Gradients flow to q, k, v, a, b and
    c; `q_positions`, `k_positions` and `key_mask` receive none, and double backward is not supported.
    """
    _check_inputs(q, k, v, a, b, c, key_mask, query_offset, "linear", q_positions, k_positions, eps)
    _check_chunk_size(chunk_size)
    return _ChunkFourier.apply(
        q, k, v, a, b, c, q_positions, k_positions, key_mask, causal, query_offset, chunk_size, eps
    )


# Fixed cost of the linear path per call, in multiply-adds: the Python and launch overhead of its
# extra tensor operations (about 5 ms on a 2-core CPU).
LINEAR_OVERHEAD = 8_000_000


def fourier_choose_mode(
    lq: int, lk: int, dim: int, value_dim: int, *, causal: bool, batch_heads: int = 1
) -> str:
    """The cheaper algorithm for one call, "naive" or "linear", from a cost model in multiply-adds.

    The quadratic path costs about 3D + Dv + 8 per score and batch*head (2D for the cos and sin
    scores, D for the guard, Dv + 1 for the values, masking). The linear path costs, per token,
    1.5 (2D + 1)(Dv + 1) for building and reading the states, per query (causal only) a dense chunk of
    c = 64 keys at twice the price per score (two passes, masking), and a fixed overhead per call.
    Fitted to forward + backward in float32 on a 2-core CPU with D = Dv = 64: the crossover is near
    L = 100 bidirectional and L = 200 - 250 causal for 8 to 64 batch*heads.
    """
    per_score = 3 * dim + value_dim + 8
    naive = batch_heads * lq * lk * per_score
    states = 1.5 * (lq + lk) * (2 * dim + 1) * (value_dim + 1)
    local = 2 * lq * DEFAULT_CHUNK_SIZE * per_score if causal else 0
    linear = batch_heads * (local + states) + LINEAR_OVERHEAD
    return "linear" if linear < naive else "naive"


def fourier_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
    query_offset: int = 0,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    mode: str = "auto",
) -> Tensor:
    """Kernelized attention with Fourier relative positions, exact up to the normaliser guard, linear in length.

    With phi(x) = elu(x) + 1, per head:
        ph_ik = b_k + sum_n a_kn P_in,   pk_jk = sum_n a_kn P_jn
        S_ij  = sum_k c_k phi(q_i)_k phi(k_j)_k cos(ph_ik - pk_jk)
        M_i   = sum_j sum_k |c_k| phi(q_i)_k phi(k_j)_k
        out_i = sum_j S_ij v_j / den_safe_i,  den_safe_i = den_i if |den_i| >= eps M_i
                                                         = sign(den_i) eps M_i otherwise
    with den_i = sum_j S_ij, sums over visible keys (S_ij = 0 where key_mask[:, j] == 0 or, causal,
    j > i + query_offset), sign(0) = +1, and out_i = 0 where M_i = 0 (no visible key). Hence
    |out_i| <= max|v| / eps always, and out_i is the exact formula wherever |den_i| >= eps M_i. With
    a = 0, b = 0, c = 1 this is plain kernelized attention (Katharopoulos et al., 2020).

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq (cross attention).
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        a (`Tensor` of shape `(H, D, n)`): frequencies, in radians per unit of position, of each
            feature of each head along each of the n position dimensions.
        b (`Tensor` of shape `(H, D)`): phases, added to the query side.
        c (`Tensor` of shape `(H, D)`): amplitudes; may be negative.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= i + query_offset
            (token indices, also when positions are given).
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): token index of the first query; also its default position.
        q_positions (`Tensor` of shape `(B, Lq, n)` or `(1, Lq, n)`, *optional*): query positions;
            defaults to i + query_offset (then n must be 1). Used as given (not shifted by query_offset).
        k_positions (`Tensor` of shape `(B, Lk, n)` or `(1, Lk, n)`, *optional*): key positions;
            defaults to j (then n must be 1).
        eps (`float`, defaults to 1e-2): guard of the normaliser, 0 < eps <= 1.
        mode (`str`, defaults to `"auto"`): `"naive"` (quadratic reference), `"linear"` (O(L) time
            and memory, see `chunk_fourier_attention`) or `"auto"` (the cheaper, see `fourier_choose_mode`).

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype. Half precision inputs are computed in float32;
        the parameters and positions are cast to that dtype (phases a . P lose absolute precision in
        float32 once |a . P| is large, about 1e-3 rad at 1e4).
    """
    _check_inputs(q, k, v, a, b, c, key_mask, query_offset, mode, q_positions, k_positions, eps)
    if mode == "auto":
        mode = fourier_choose_mode(
            q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], causal=causal, batch_heads=q.shape[0] * q.shape[1]
        )
    kwargs = dict(
        causal=causal, key_mask=key_mask, query_offset=query_offset, q_positions=q_positions,
        k_positions=k_positions, eps=eps,
    )
    if mode == "naive":
        return naive_fourier_attention(q, k, v, a, b, c, **kwargs)
    return chunk_fourier_attention(q, k, v, a, b, c, **kwargs)


class FourierState(NamedTuple):
    """Recurrent state of causal Fourier attention after `seen` tokens (token indices 0..seen-1).

    Values are kept augmented as [m_j v_j, m_j] (key mask as a last channel), so each sum carries the
    numerator and the normaliser together. The sums depend on `a` (key phases pk_j = a . P_j): keep
    the parameters fixed while stepping. The size does not depend on `seen`.

    Fields:
        kv_cos (`Tensor` of shape `(B, H, D, Dv+1)`): sum_j (phi(k_j) * cos(pk_j)) [m_j v_j, m_j]^T.
        kv_sin (`Tensor` of shape `(B, H, D, Dv+1)`): sum_j (phi(k_j) * sin(pk_j)) [m_j v_j, m_j]^T.
        k_sum (`Tensor` of shape `(B, H, D)`): sum_j m_j phi(k_j), for the guard sum M.
        seen (`int`): number of tokens seen, the token index of the next token.
    """

    kv_cos: Tensor
    kv_sin: Tensor
    k_sum: Tensor
    seen: int


def fourier_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, *, dtype: torch.dtype, device=None
) -> FourierState:
    """The empty state (no token seen); accumulates in `compute_dtype(dtype)`."""
    dtype = compute_dtype(dtype)
    return FourierState(
        kv_cos=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        kv_sin=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        k_sum=torch.zeros(batch, heads, dim, dtype=dtype, device=device),
        seen=0,
    )


def _state_sums(k_cs: Tensor, kf: Tensor, va: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    kv = k_cs.transpose(-1, -2) @ va  # (B, H, 2D, Dv+1)
    d = kf.shape[-1]
    return kv[..., :d, :], kv[..., d:, :], (kf * va[..., -1:]).sum(2)


def fourier_prefill_state(
    k: Tensor, v: Tensor, a: Tensor, *, key_mask: Tensor | None = None, k_positions: Tensor | None = None
) -> FourierState:
    """The state after the tokens k, v (B, H, L, .) at token indices 0..L-1, in O(L D Dv) time.

    `k_positions` (B, L, n) defaults to the token index (n = 1). Use it after a full causal call on a
    prompt, then continue with `fourier_step`.
    """
    check_attention_inputs(k, k, v, None, key_mask, 0, "linear")
    heads, dim = k.shape[1], k.shape[-1]
    if not isinstance(a, Tensor) or a.dim() != 3 or tuple(a.shape[:2]) != (heads, dim) or a.shape[2] < 1:
        raise ValueError(f"`a` must be a tensor of shape (heads, dim, n) = ({heads}, {dim}, n), got {_describe(a)}")
    _check_positions("k_positions", k_positions, k.shape[0], k.shape[2], a.shape[2])
    dtype = compute_dtype(k.dtype)
    if k_positions is None:
        k_positions = _token_positions(0, k.shape[2], dtype, k.device)
    k_cs, kf = _key_features(k, a, k_positions, dtype)
    va = augment_values(v.to(dtype), key_mask)
    kv_cos, kv_sin, k_sum = _state_sums(k_cs, kf, va)
    return FourierState(kv_cos.contiguous(), kv_sin.contiguous(), k_sum, k.shape[2])


def fourier_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    state: FourierState,
    *,
    key_mask: Tensor | None = None,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, FourierState]:
    """Causal attention of n new tokens on the past summarised by `state`, and the updated state.

    q, k, v have shape (B, H, n, .) and sit at token indices state.seen .. state.seen + n - 1;
    `key_mask` (B, n) masks new tokens only; `q_positions` / `k_positions` (B, n, n_pos) are the
    positions of the new tokens and default to their token indices. The result equals the matching
    rows of `fourier_attention(..., causal=True)` over the whole sequence (same positions, same eps).
    Work is O(n (c + D) Dv) with the new tokens cut in chunks of c = 64; the state keeps its size.

    Returns:
        `(out, state)`: out of shape (B, H, n, Dv) in q's dtype, and the new `FourierState`.
    """
    if not isinstance(state, FourierState):
        raise ValueError(f"`state` must be a FourierState, got {type(state).__name__}")
    _check_inputs(q, k, v, a, b, c, key_mask, state.seen, "linear", q_positions, k_positions, eps)
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"`q` and `k` must hold the same new tokens, got lengths {q.shape[2]} and {k.shape[2]}")
    bsz, heads, n, dim = q.shape
    expected = (bsz, heads, dim, v.shape[-1] + 1)
    if (
        tuple(state.kv_cos.shape) != expected
        or tuple(state.kv_sin.shape) != expected
        or tuple(state.k_sum.shape) != expected[:3]
    ):
        raise ValueError(
            f"`state` does not fit these inputs: expected kv_cos and kv_sin of shape {expected} and k_sum of "
            f"shape {expected[:3]}, got {tuple(state.kv_cos.shape)}, {tuple(state.kv_sin.shape)} and "
            f"{tuple(state.k_sum.shape)}"
        )
    dtype = state.kv_cos.dtype
    if q_positions is None:
        q_positions = _token_positions(state.seen, n, dtype, q.device)
    if k_positions is None:
        k_positions = _token_positions(state.seen, n, dtype, k.device)
    q_cs, q_abs = _query_features(q, a, b, c, q_positions, dtype)
    k_cs, kf = _key_features(k, a, k_positions, dtype)
    va = augment_values(v.to(dtype), key_mask)
    feats = _Features(q_cs, q_abs, k_cs, kf, va)
    a_sum, big = _step_sums(feats, DEFAULT_CHUNK_SIZE)
    a_sum = a_sum + q_cs @ torch.cat([state.kv_cos, state.kv_sin], dim=2)
    big = big + q_abs @ state.k_sum[..., None]
    kv_cos, kv_sin, k_sum = _state_sums(k_cs, kf, va)
    new_state = FourierState(state.kv_cos + kv_cos, state.kv_sin + kv_sin, state.k_sum + k_sum, state.seen + n)
    return _guarded_normalise(a_sum, big, eps).to(q.dtype), new_state
