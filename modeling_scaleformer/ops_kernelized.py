"""Kernelized attention with Shaw-style clipped relative positions, in linear time and memory.

The contract, per batch element and head (phi(x) = elu(x) + 1, h the horizon, p_i = i + query_offset):

    r(i, j) = clip(p_i - j, -h, h) + h
    S_ij    = phi(q_i).phi(k_j) + phi(q_i).phi(rel_r(i,j))          (0 if j > p_i when causal,
                                                                       or if key_mask[j] == 0)
    out_i   = sum_j S_ij v_j / sum_j S_ij                            (0 for a row with no visible key)

This is eq. (9)-(10) of the Scaleformer paper with phi applied to the relative embeddings, so every
score is positive and the normaliser cannot vanish or change sign.

Linear algorithm (`chunk_kernelized_rpe_attention`). Positions are cut into chunks of c >= h
tokens. A key two or more chunks before a query's chunk is at distance > h: it scores
phi(q_i).phi(k_j) + W[i, 2h] with W = phi(Q) phi(rel)^T, so its contribution to the numerator and the
normaliser is [phi(q_i), W[i, 2h]] . Pre, where Pre is a running sum over whole chunks of
[phi(k_j), 1] [m_j v_j, m_j]^T. Keys two or more chunks after (bidirectional only) are summed the same
way with W[i, 0]. Keys in the query's own chunk and its neighbours form a dense c x 2c (causal) or
c x 3c block whose relative scores are gathered from W. Per head this costs O(L (c + D) D) time and
O(L D + (L / c) D^2) memory; nothing of size (L, 2h+1, D) or (L, D, D) is formed. The backward pass
is written by hand (`_ChunkKernelizedRPE`): it saves only the inputs and recomputes chunk states, and
works on blocks of heads and chunks so that temporaries stay small, which keeps wall time linear.

Recurrent form (`kernelized_rpe_step`): the state of the past is the kernel sum, the sum of values
older than the horizon, and the last h - 1 values; its size does not depend on how many tokens came
before.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .ops_common import (
    BLOCK_ELEMENTS,
    DEFAULT_CHUNK_SIZE,
    augment_values,
    check_attention_inputs,
    check_new_tokens,
    check_state,
    compute_dtype,
    elu_feature_map,
    horizon_of,
    normalise,
    relative_index,
    row_table,
)
from .ops_naive import naive_kernelized_rpe_attention


class _Geometry(NamedTuple):
    chunk: int
    lead: int  # query padding before the first query, so that query chunks align with key chunks
    n_query_chunks: int
    n_key_chunks: int
    local_chunks: Tensor  # (Nq, w) key chunk of each local slot; n_key_chunks marks the zero chunk
    before_index: Tensor  # (Nq,) index into Pre of the sum over chunks before the local block
    after_index: Tensor  # (Nq,) index into Pre of the sum up to the end of the local block
    rel_index: Tensor  # (c, w c) relative index r of each local (query, key) pair
    keep: Tensor | None  # (c, w c) causal mask of the local block


def _geometry(lq: int, lk: int, query_offset: int, horizon: int, causal: bool, chunk: int, device) -> _Geometry:
    c = max(chunk, horizon, 1)
    first, lead = divmod(query_offset, c)
    nq, nk = math.ceil((lead + lq) / c), math.ceil(lk / c)
    w = 2 if causal else 3
    absolute = first + torch.arange(nq, device=device)
    local = absolute[:, None] - 1 + torch.arange(w, device=device)[None, :]
    local = torch.where((local >= 0) & (local < nk), local, torch.full_like(local, nk))
    before = (absolute - 1).clamp(0, nk)
    after = (absolute + 2).clamp(0, nk)
    # positions from the start of the query chunk: its queries at 0..c-1, the local keys (w chunks from
    # the chunk before it) at -c..(w-1)c-1
    queries = torch.arange(c, device=device)
    keys = torch.arange(w * c, device=device) - c
    rel_index = relative_index(queries, keys, horizon)
    keep = (keys[None, :] <= queries[:, None]) if causal else None
    return _Geometry(c, lead, nq, nk, local, before, after, rel_index, keep)


def _pad_chunks(x: Tensor, lead: int, n_chunks: int, c: int) -> Tensor:
    """(G, L, F) -> (G, n_chunks, c, F), zero-padded with `lead` rows in front and the rest behind."""
    g, length, f = x.shape
    out = x.new_zeros(g, n_chunks * c, f)
    out[:, lead : lead + length] = x
    return out.view(g, n_chunks, c, f)


class _Prepared(NamedTuple):
    qf: Tensor  # (G, Nq, c, D)
    weights: Tensor | None  # (G, Nq, c, 2h+1) = phi(q) phi(rel)^T
    kf: Tensor  # (G, Nk+1, c, D), last chunk zero
    va: Tensor  # (G, Nk+1, c, Dv+1), augmented values, last chunk zero
    rf: Tensor | None  # (G, 2h+1, D)
    pre: Tensor  # (G, Nk+1, D+1, Dv+1) sums over whole key chunks before each chunk index


def _prepare(q, k, va, rf, geo: _Geometry, dtype) -> _Prepared:
    c = geo.chunk
    qf = _pad_chunks(elu_feature_map(q.to(dtype)), geo.lead, geo.n_query_chunks, c)
    kf = _pad_chunks(elu_feature_map(k.to(dtype)), 0, geo.n_key_chunks + 1, c)
    va = _pad_chunks(va, 0, geo.n_key_chunks + 1, c)
    weights = None
    if rf is not None:
        g, nq = qf.shape[:2]
        weights = (qf.view(g, nq * c, -1) @ rf.transpose(1, 2)).view(g, nq, c, -1)
    # chunk summaries [phi(k), 1]^T [m v, m], then an exclusive prefix sum over chunks
    kv = kf[:, :-1].transpose(2, 3) @ va[:, :-1]
    vsum = va[:, :-1].sum(2, keepdim=True)
    summary = torch.cat([kv, vsum], dim=2)
    pre = torch.cat([summary.new_zeros(summary.shape[0], 1, *summary.shape[2:]), summary.cumsum(1)], dim=1)
    return _Prepared(qf, weights, kf, va, rf, pre)


def _chunk_blocks(n_chunks: int, per_chunk: int, rows: int):
    step = max(1, BLOCK_ELEMENTS // max(1, per_chunk * rows))
    for start in range(0, n_chunks, step):
        yield start, min(n_chunks, start + step)


class _BlockTerms(NamedTuple):
    qb: Tensor
    wb: Tensor | None
    kloc: Tensor
    vloc: Tensor
    scores: Tensor
    q_before: Tensor
    before: Tensor
    q_after: Tensor | None
    after: Tensor | None


def _block_terms(p: _Prepared, geo: _Geometry, causal: bool, m0: int, m1: int) -> _BlockTerms:
    """Inputs of one block of query chunks [m0, m1), flattened to (G * nb, ...)."""
    g, nb, c = p.qf.shape[0], m1 - m0, geo.chunk
    d, dva = p.qf.shape[-1], p.va.shape[-1]
    qb = p.qf[:, m0:m1].reshape(g * nb, c, d)
    idx = geo.local_chunks[m0:m1]
    kloc = p.kf[:, idx].reshape(g * nb, -1, d)
    vloc = p.va[:, idx].reshape(g * nb, -1, dva)
    scores = qb @ kloc.transpose(1, 2)
    wb = None
    if p.weights is not None:
        wb = p.weights[:, m0:m1].reshape(g * nb, c, -1)
        scores += wb.gather(2, geo.rel_index.expand(g * nb, -1, -1))
    if causal:
        scores.mul_(geo.keep)
    before = p.pre[:, geo.before_index[m0:m1]].reshape(g * nb, d + 1, dva)
    if wb is None:
        q_before = torch.cat([qb, qb.new_zeros(g * nb, c, 1)], dim=2)
    else:
        q_before = torch.cat([qb, wb[..., -1:]], dim=2)
    q_after = after = None
    if not causal:
        after = (p.pre[:, -1:] - p.pre[:, geo.after_index[m0:m1]]).reshape(g * nb, d + 1, dva)
        q_after = q_before.clone()
        if wb is not None:
            q_after[..., -1:] = wb[..., :1]
    return _BlockTerms(qb, wb, kloc, vloc, scores, q_before, before, q_after, after)


def _block_sums(t: _BlockTerms) -> Tensor:
    """Augmented sums A = S_local V_local + [phi(q), W] . (before + after), shape (G * nb, c, Dv+1)."""
    a = torch.baddbmm(t.scores @ t.vloc, t.q_before, t.before)
    if t.after is not None:
        a.baddbmm_(t.q_after, t.after)
    return a


def _rows_per_group(bh: int, per_row: int) -> int:
    return max(1, min(bh, BLOCK_ELEMENTS // max(1, per_row)))


def _chunk_forward(q, k, va, rf_rows, causal, query_offset, chunk, dtype) -> Tensor:
    bh, lq, _ = q.shape
    lk = k.shape[1]
    geo = _geometry(lq, lk, query_offset, horizon_of(rf_rows), causal, chunk, q.device)
    out = torch.empty(bh, lq, va.shape[-1] - 1, dtype=q.dtype, device=q.device)
    w = 2 if causal else 3
    per_chunk = geo.chunk * w * geo.chunk
    rows = _rows_per_group(bh, (geo.n_query_chunks + geo.n_key_chunks) * geo.chunk * (q.shape[-1] + va.shape[-1]))
    for r0 in range(0, bh, rows):
        r1 = min(bh, r0 + rows)
        rf = None if rf_rows is None else rf_rows[r0:r1]
        p = _prepare(q[r0:r1], k[r0:r1], va[r0:r1].to(dtype), rf, geo, dtype)
        for m0, m1 in _chunk_blocks(geo.n_query_chunks, per_chunk, r1 - r0):
            a = _block_sums(_block_terms(p, geo, causal, m0, m1))
            o = normalise(a[..., :-1], a[..., -1:]).view(r1 - r0, (m1 - m0) * geo.chunk, -1)
            # query rows of this block in unpadded coordinates
            s0, s1 = m0 * geo.chunk - geo.lead, m1 * geo.chunk - geo.lead
            lo, hi = max(s0, 0), min(s1, lq)
            out[r0:r1, lo:hi] = o[:, lo - s0 : hi - s0].to(q.dtype)
    return out


def _chunk_backward(q, k, va, rf_rows, grad_out, causal, query_offset, chunk, dtype):
    bh, lq, d = q.shape
    lk = k.shape[1]
    geo = _geometry(lq, lk, query_offset, horizon_of(rf_rows), causal, chunk, q.device)
    c, nq, nk = geo.chunk, geo.n_query_chunks, geo.n_key_chunks
    w = 2 if causal else 3
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dva = torch.empty_like(va)
    drf = None if rf_rows is None else torch.empty_like(rf_rows)
    per_chunk = c * w * c
    rows = _rows_per_group(bh, (nq + nk) * c * (d + va.shape[-1]))
    for r0 in range(0, bh, rows):
        r1 = min(bh, r0 + rows)
        g = r1 - r0
        rf = None if rf_rows is None else rf_rows[r0:r1]
        p = _prepare(q[r0:r1], k[r0:r1], va[r0:r1].to(dtype), rf, geo, dtype)
        go = _pad_chunks(grad_out[r0:r1].to(dtype), geo.lead, nq, c)
        dqf = torch.zeros_like(p.qf)
        dw = None if p.weights is None else torch.zeros_like(p.weights)
        dkf = torch.zeros_like(p.kf)
        dvap = torch.zeros_like(p.va)
        dpre = torch.zeros_like(p.pre)
        for m0, m1 in _chunk_blocks(nq, per_chunk, g):
            nb = m1 - m0
            t = _block_terms(p, geo, causal, m0, m1)
            a = _block_sums(t)
            # out = num / den: d num = dO / den, d den = -(dO . out) / den; 0 where den == 0
            den = a[..., -1:]
            visible = den > 0
            inv = torch.where(visible, 1.0 / torch.where(visible, den, torch.ones_like(den)), torch.zeros_like(den))
            gob = go[:, m0:m1].reshape(g * nb, c, -1)
            da = torch.cat([gob * inv, -(gob * a[..., :-1]).sum(-1, keepdim=True) * inv * inv], dim=2)
            # local block: A += S V_local
            ds = da @ t.vloc.transpose(1, 2)
            if causal:
                ds.mul_(geo.keep)
            dvloc = t.scores.transpose(1, 2) @ da
            dqb = ds @ t.kloc
            dkloc = ds.transpose(1, 2) @ t.qb
            idx = geo.local_chunks[m0:m1].reshape(-1)
            dkf.index_add_(1, idx, dkloc.view(g, nb * w, c, d))
            dvap.index_add_(1, idx, dvloc.view(g, nb * w, c, -1))
            # chunks before (and after): A += [phi(q), W] . state
            dqa = da @ t.before.transpose(1, 2)
            dpre.index_add_(1, geo.before_index[m0:m1], (t.q_before.transpose(1, 2) @ da).view(g, nb, d + 1, -1))
            dqb += dqa[..., :d]
            if t.after is not None:
                dqa_after = da @ t.after.transpose(1, 2)
                dafter = (t.q_after.transpose(1, 2) @ da).view(g, nb, d + 1, -1)
                dpre[:, -1] += dafter.sum(1)
                dpre.index_add_(1, geo.after_index[m0:m1], -dafter)
                dqb += dqa_after[..., :d]
            if dw is not None:
                dwb = torch.zeros_like(t.wb).scatter_add_(2, geo.rel_index.expand(g * nb, -1, -1), ds)
                dwb[..., -1:] += dqa[..., d:]
                if t.after is not None:
                    dwb[..., :1] += dqa_after[..., d:]
                dw[:, m0:m1] = dwb.view(g, nb, c, -1)
            dqf[:, m0:m1] = dqb.view(g, nb, c, d)
        if dw is not None:
            flat_w = dw.view(g, nq * c, -1)
            dqf.view(g, nq * c, d).baddbmm_(flat_w, p.rf)
            drf[r0:r1] = flat_w.transpose(1, 2) @ p.qf.view(g, nq * c, d)
        # Pre[t] = sum_{m < t} C_m  =>  dC_m = sum_{t > m} dPre[t]
        dsummary = dpre[:, 1:].flip(1).cumsum(1).flip(1)
        kf, vap = p.kf[:, :-1], p.va[:, :-1]
        dkf[:, :-1] += vap @ dsummary[:, :, :d].transpose(2, 3)
        dvap[:, :-1] += kf @ dsummary[:, :, :d] + dsummary[:, :, d:]
        # phi'(x) = min(phi(x), 1) for phi = elu + 1
        dqf.mul_(p.qf.clamp(max=1.0))
        dkf.mul_(p.kf.clamp(max=1.0))
        dq[r0:r1] = dqf.view(g, nq * c, d)[:, geo.lead : geo.lead + lq]
        dk[r0:r1] = dkf.view(g, -1, d)[:, :lk]
        dva[r0:r1] = dvap.view(g, -1, dvap.shape[-1])[:, :lk]
    return dq, dk, dva, drf


class _ChunkKernelizedRPE(torch.autograd.Function):
    """Chunked linear attention on rows (B*H, L, .); saves only its inputs, recomputes in backward."""

    @staticmethod
    def forward(ctx, q, k, va, rf_rows, causal, query_offset, chunk):
        dtype = compute_dtype(q.dtype)
        ctx.save_for_backward(q, k, va, rf_rows)
        ctx.config = (causal, query_offset, chunk, dtype)
        return _chunk_forward(q, k, va, rf_rows, causal, query_offset, chunk, dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, va, rf_rows = ctx.saved_tensors
        causal, query_offset, chunk, dtype = ctx.config
        dq, dk, dva, drf = _chunk_backward(q, k, va, rf_rows, grad_out, causal, query_offset, chunk, dtype)
        return dq, dk, dva, drf, None, None, None


def chunk_kernelized_rpe_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None = None,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """The linear-time algorithm; same contract and shapes as `kernelized_rpe_attention`.

    Time O(Lq c (D + Dv) + (Lq + Lk) D Dv) and memory O((Lq + Lk)(D + Dv) + (Lk / c) D Dv) per head,
    with chunk size c = max(chunk_size, h).
    """
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    va = augment_values(v, key_mask).reshape(b * h, lk, dv + 1)
    rf_rows = None if rel is None else elu_feature_map(row_table(rel, b, h, compute_dtype(rel.dtype)))
    out = _ChunkKernelizedRPE.apply(
        q.reshape(b * h, lq, d), k.reshape(b * h, lk, d), va, rf_rows, causal, query_offset, chunk_size
    )
    return out.view(b, h, lq, dv)


def kernelized_rpe_choose_mode(
    lq: int, lk: int, dim: int, value_dim: int, horizon: int, *, causal: bool, batch_heads: int = 1
) -> str:
    """The cheaper algorithm for one call, "naive" or "linear", from a cost model in multiply-adds.

    The quadratic path costs about (D + Dv + 8) per score and batch*head; the linear path a dense
    local block of w chunks per query (w = 2 causal, 3 bidirectional), chunk states of (D+1)(Dv+1)
    per token, and a fixed bookkeeping cost per call. Fitted on a 2-core CPU with D = Dv = 64 (the
    crossover is near L = 300 for 8 heads and L = 250 for 64 batch*heads); checked by
    `benchmarks/bench_attention.py --auto-check`.
    """
    c = max(DEFAULT_CHUNK_SIZE, horizon, 1)
    w = 2 if causal else 3
    per_score = dim + value_dim + 8
    naive = batch_heads * lq * lk * per_score
    linear = batch_heads * (lq * w * c * per_score + 2 * (lq + lk) * (dim + 1) * (value_dim + 1)) + LINEAR_OVERHEAD
    return "linear" if linear < naive else "naive"


# Fixed cost of the linear path per call, in multiply-adds (Python and launch overhead).
LINEAR_OVERHEAD = 15_000_000

# The name this cost model had first, kept for callers (`benchmarks/bench_attention.py`).
choose_mode = kernelized_rpe_choose_mode


def kernelized_rpe_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None = None,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
) -> Tensor:
    """Kernelized attention with clipped relative positions (Scaleformer), exact, linear in length.

    With phi(x) = elu(x) + 1, h = (rel.shape[-2] - 1) // 2 and p_i = i + query_offset:
        S_ij  = phi(q_i).phi(k_j) + phi(q_i).phi(rel[r(i, j)]),  r(i, j) = clip(p_i - j, -h, h) + h
        out_i = sum_j S_ij v_j / sum_j S_ij
    with S_ij = 0 where j > p_i (causal) or key_mask[:, j] == 0; a row with no visible key gives 0.
    `rel=None` is plain kernelized attention (Katharopoulos et al., 2020).

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq (cross attention).
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        rel (`Tensor` of shape `(H, 2h+1, D)` or `(2h+1, D)`, *optional*): relative embeddings, per
            head or shared by heads, row r for relative position r - h.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= p_i.
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): absolute position of the first query.
        mode (`str`, defaults to `"auto"`): `"naive"` (quadratic reference), `"linear"` (chunked,
            O(L) time and memory) or `"auto"` (the cheaper for this call, see `kernelized_rpe_choose_mode`).

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype. Half precision accumulates in float32.
    """
    check_attention_inputs(q, k, v, rel, key_mask, query_offset, mode)
    if mode == "auto":
        mode = kernelized_rpe_choose_mode(
            q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], horizon_of(rel), causal=causal,
            batch_heads=q.shape[0] * q.shape[1],
        )
    if mode == "naive":
        return naive_kernelized_rpe_attention(q, k, v, rel, causal=causal, key_mask=key_mask, query_offset=query_offset)
    return chunk_kernelized_rpe_attention(q, k, v, rel, causal=causal, key_mask=key_mask, query_offset=query_offset)


class KernelizedRPEState(NamedTuple):
    """Recurrent state of causal kernelized RPE attention after `seen` tokens (positions 0..seen-1).

    Values are kept augmented as [m_j v_j, m_j] (key mask as a last channel), so each sum carries
    the numerator and the normaliser together. The size does not depend on `seen`.

    Fields:
        kv (`Tensor` of shape `(B, H, D, Dv+1)`): sum over seen tokens of phi(k_j) [m_j v_j, m_j]^T.
        far (`Tensor` of shape `(B, H, Dv+1)`): sum of [m_j v_j, m_j] over tokens j <= seen - 1 - w,
            which are at distance >= h from every later query (relative row 2h).
        window (`Tensor` of shape `(B, H, w, Dv+1)`, w = max(h - 1, 0)): [m_j v_j, m_j] of the last w
            tokens, oldest first; zero rows stand for positions before the start.
        seen (`int`): number of tokens seen, the position of the next token.
    """

    kv: Tensor
    far: Tensor
    window: Tensor
    seen: int


def _window_size(horizon: int) -> int:
    return max(horizon - 1, 0)


def kernelized_rpe_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, horizon: int, *, dtype: torch.dtype, device=None
) -> KernelizedRPEState:
    """The empty state (no token seen); accumulates in `compute_dtype(dtype)`."""
    dtype = compute_dtype(dtype)
    w = _window_size(horizon)
    return KernelizedRPEState(
        kv=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        far=torch.zeros(batch, heads, value_dim + 1, dtype=dtype, device=device),
        window=torch.zeros(batch, heads, w, value_dim + 1, dtype=dtype, device=device),
        seen=0,
    )


def kernelized_rpe_prefill_state(
    k: Tensor, v: Tensor, *, horizon: int, key_mask: Tensor | None = None
) -> KernelizedRPEState:
    """The state after the tokens k, v (B, H, L, .) at positions 0..L-1, in O(L D Dv) time.

    Use it after a full causal call on a prompt, then continue with `kernelized_rpe_step`.
    """
    dtype = compute_dtype(k.dtype)
    va = augment_values(v.to(dtype), key_mask)
    kv = elu_feature_map(k.to(dtype)).transpose(-1, -2) @ va
    w = _window_size(horizon)
    length = va.shape[2]
    if length < w:
        va = torch.cat([va.new_zeros(*va.shape[:2], w - length, va.shape[-1]), va], dim=2)
    split = va.shape[2] - w
    return KernelizedRPEState(kv=kv, far=va[:, :, :split].sum(2), window=va[:, :, split:], seen=length)


def kernelized_rpe_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel: Tensor | None,
    state: KernelizedRPEState,
    *,
    key_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, KernelizedRPEState]:
    """Causal attention of n new tokens on the past summarised by `state`, and the updated state.

    q, k, v have shape (B, H, n, .) and sit at positions state.seen .. state.seen + n - 1;
    `key_mask` (B, n) masks new tokens only. The result equals the matching rows of
    `kernelized_rpe_attention(..., causal=True)` over the whole sequence. Work is O(n (c + h) Dv +
    n D Dv) with the new tokens cut in chunks of c = chunk_size; the state keeps its size.

    Returns:
        `(out, state)`: out of shape (B, H, n, Dv) in q's dtype, and the new `KernelizedRPEState`.
    """
    check_state(state, KernelizedRPEState)
    check_attention_inputs(q, k, v, rel, key_mask, state.seen, "linear")
    check_new_tokens(q, k)
    horizon = horizon_of(rel)
    b, h_, _, d = q.shape
    expected = (b, h_, d, v.shape[-1] + 1)
    if tuple(state.kv.shape) != expected or state.window.shape[2] != _window_size(horizon):
        raise ValueError(
            f"`state` does not fit these inputs: expected kv of shape {expected} and a window of "
            f"{_window_size(horizon)} rows (horizon {horizon}), got kv {tuple(state.kv.shape)} and "
            f"window {tuple(state.window.shape)}"
        )
    dtype = state.kv.dtype
    rf = None if rel is None else elu_feature_map(rel.to(dtype))
    outs = []
    for s0 in range(0, q.shape[2], chunk_size):
        s1 = min(q.shape[2], s0 + chunk_size)
        mask = None if key_mask is None else key_mask[:, s0:s1]
        out, state = _step_chunk(q[:, :, s0:s1], k[:, :, s0:s1], v[:, :, s0:s1], rf, state, mask, horizon)
        outs.append(out.to(q.dtype))
    return torch.cat(outs, dim=2), state


def _step_chunk(q, k, v, rf, state: KernelizedRPEState, key_mask, horizon: int):
    dtype = state.kv.dtype
    n = q.shape[2]
    qf, kf = elu_feature_map(q.to(dtype)), elu_feature_map(k.to(dtype))
    va = augment_values(v.to(dtype), key_mask)
    new = torch.arange(n, device=q.device)
    a = qf @ state.kv + ((qf @ kf.transpose(-1, -2)) * (new[None, :] <= new[:, None])) @ va
    w = state.window.shape[2]
    local = torch.cat([state.window, va], dim=2)
    if rf is not None:
        weights = qf @ (rf if rf.dim() == 3 else rf.unsqueeze(0)).transpose(-1, -2)
        # positions from seen - w: local key jj at jj, query i at w + i
        queries, keys = new + w, torch.arange(w + n, device=q.device)
        rel_index = relative_index(queries, keys, horizon)
        causal = keys[None, :] <= queries[:, None]
        rel_scores = weights.gather(-1, rel_index.expand(*weights.shape[:2], -1, -1)) * causal
        a = a + rel_scores @ local + weights[..., -1:] * state.far[:, :, None, :]
    split = local.shape[2] - w
    new_state = KernelizedRPEState(
        kv=state.kv + kf.transpose(-1, -2) @ va,
        far=state.far + local[:, :, :split].sum(2),
        window=local[:, :, split:],
        seen=state.seen + n,
    )
    return normalise(a[..., :-1], a[..., -1:]), new_state


class KernelizedRPECrossSummary(NamedTuple):
    """What a query needs of a fixed key sequence (cross attention), computed once.

    Fields:
        kv (`Tensor` of shape `(B, H, D, Dv+1)`): sum over keys of phi(k_j) [m_j v_j, m_j]^T.
        values (`Tensor` of shape `(B, H, Lk, Dv+1)`, *optional*): [m_j v_j, m_j], for the window.
        prefix (`Tensor` of shape `(B, H, Lk+1, Dv+1)`, *optional*): prefix sums of `values`.
    `values` and `prefix` are None when the attention has no relative term.
    """

    kv: Tensor
    values: Tensor | None
    prefix: Tensor | None


def kernelized_rpe_cross_summary(
    k: Tensor, v: Tensor, *, key_mask: Tensor | None = None, relative: bool = True
) -> KernelizedRPECrossSummary:
    """Summarise keys and values (B, H, Lk, .) for `kernelized_rpe_cross_step`, in O(Lk D Dv)."""
    dtype = compute_dtype(k.dtype)
    va = augment_values(v.to(dtype), key_mask)
    kv = elu_feature_map(k.to(dtype)).transpose(-1, -2) @ va
    if not relative:
        return KernelizedRPECrossSummary(kv, None, None)
    prefix = torch.cat([va.new_zeros(*va.shape[:2], 1, va.shape[-1]), va.cumsum(2)], dim=2)
    return KernelizedRPECrossSummary(kv, va, prefix)


def kernelized_rpe_cross_step(
    q: Tensor, rel: Tensor | None, summary: KernelizedRPECrossSummary, *, query_offset: int
) -> Tensor:
    """Bidirectional attention of queries (B, H, n, D) at positions query_offset.. on summarised keys.

    Equals `kernelized_rpe_attention(q, k, v, rel, query_offset=query_offset)` for the keys the
    summary was built from. Cost O(n (D Dv + h Dv)), independent of Lk.
    """
    if not isinstance(summary, KernelizedRPECrossSummary):
        raise ValueError(f"`summary` must be a KernelizedRPECrossSummary, got {type(summary).__name__}")
    if rel is not None and summary.prefix is None:
        raise ValueError("`summary` was built with relative=False but `rel` is given")
    dtype = summary.kv.dtype
    qf = elu_feature_map(q.to(dtype))
    a = qf @ summary.kv
    if rel is not None:
        horizon = horizon_of(rel)
        rf = elu_feature_map(rel.to(dtype))
        weights = qf @ (rf if rf.dim() == 3 else rf.unsqueeze(0)).transpose(-1, -2)
        prefix, values = summary.prefix, summary.values
        lk = values.shape[2]
        pos = torch.arange(q.shape[2], device=q.device) + query_offset

        def prefix_at(index: Tensor) -> Tensor:
            return prefix[:, :, index.clamp(0, lk)]

        if horizon == 0:
            a = a + weights * prefix[:, :, -1:]
        else:
            # keys j <= p - h (row 2h), keys j >= p + h (row 0), and the 2h - 1 keys in between
            a = a + weights[..., -1:] * prefix_at(pos - horizon + 1)
            a = a + weights[..., :1] * (prefix[:, :, -1:] - prefix_at(pos + horizon))
            offsets = torch.arange(-horizon + 1, horizon, device=q.device)
            keys = pos[:, None] - offsets[None, :]
            inside = (keys >= 0) & (keys < lk)
            window = values[:, :, keys.clamp(0, lk - 1)] * inside[..., None]  # (B, H, n, 2h-1, Dv+1)
            a = a + (weights[..., 1:-1, None] * window).sum(3)
    return normalise(a[..., :-1], a[..., -1:]).to(q.dtype)
