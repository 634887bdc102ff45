"""The blocked linear path of Fourier attention (`ops_fourier.chunk_fourier_attention`): forward and
backward functions, then the `autograd.Function`.

The algorithm is that of the `ops_fourier` docstring: S_ij = Qc_i . Kc_j + Qs_i . Ks_j is linear
attention with 2D features [Kc, Ks] on the augmented values [m_j v_j, m_j], and the guard sum M_i needs
only a running sum of m_j phi(k_j). Bidirectional attention sums all keys once; causal attention cuts
the token indices into chunks of c tokens, with dense masked scores inside a chunk and a running sum of
chunk states across chunks.

Work is done on blocks: groups of (batch, head) rows (`_Rows`) times spans of whole chunks (`_Span`),
sized by `_plan` so that no temporary holds more than about `BLOCK_ELEMENTS` numbers; the scan over
spans carries one 2D x (Dv + 1) state per row (`_Sums`). Small allocations are served from memory the
allocator already holds, whereas tensors of tens of MiB come as fresh pages from the kernel and make
wall time grow faster than the work at long lengths.

`chunk_fourier_fwd` and `chunk_fourier_bwd` take the tensors as one `FourierInputs` and the static
arguments as one `FourierChunkConfig`. `ChunkFourierFunction` saves only the inputs, O(L (D + Dv)) per
head; its backward pass recomputes features, scores and states span by span, walking the spans
backwards with the gradient sums of later queries. Positions and the key mask receive no gradient, and
the gradient itself cannot be differentiated again (no double backward).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .ops_common import BLOCK_ELEMENTS, compute_dtype, elu_feature_map, guarded_normalise, token_positions


class FourierInputs(NamedTuple):
    """The tensor arguments of the blocked path, as `fourier_attention` takes them."""

    q: Tensor  # (B, H, Lq, D)
    k: Tensor  # (B, H, Lk, D)
    v: Tensor  # (B, H, Lk, Dv)
    a: Tensor  # (H, D, n) frequencies
    b: Tensor  # (H, D) phases
    c: Tensor  # (H, D) amplitudes
    q_positions: Tensor | None  # (B or 1, Lq, n); None: the token index i + query_offset
    k_positions: Tensor | None  # (B or 1, Lk, n); None: the token index j
    key_mask: Tensor | None  # (B, Lk)


class FourierChunkConfig(NamedTuple):
    """The static (non-tensor) arguments of the blocked path."""

    causal: bool
    query_offset: int
    chunk: int  # chunk size c of the causal path
    eps: float  # guard of the normaliser


class _Rows(NamedTuple):
    b0: int  # batch rows [b0, b1)
    b1: int
    h0: int  # heads [h0, h1)
    h1: int


class _Plan(NamedTuple):
    groups: list[_Rows]
    span_chunks: int  # chunks per span


class _Group(NamedTuple):
    """One group of (batch, head) rows of a call, with everything its blocks are computed from."""

    x: FourierInputs
    cfg: FourierChunkConfig
    rows: _Rows
    dtype: torch.dtype  # the compute dtype
    within: Tensor  # (c, c) ones on and below the diagonal: the causal mask inside a chunk


class _Tokens(NamedTuple):
    """Tokens [start, stop), placed at rows lead .. lead + stop - start of a block of `length` rows."""

    start: int
    stop: int
    lead: int
    length: int


class _Span(NamedTuple):
    """Absolute chunks [t0, t1) of the causal path: the queries whose positions i + query_offset fall in
    them and the keys in them, both placed in blocks of (t1 - t0) c rows."""

    queries: _Tokens
    keys: _Tokens


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


def _token_spans(length: int, step: int) -> list[_Tokens]:
    """Tokens 0..length-1 in spans of `step`, each in a block of its own size (bidirectional path)."""
    return [_Tokens(s, min(length, s + step), 0, min(length, s + step) - s) for s in range(0, length, step)]


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
        queries = _Tokens(i0, i1, i0 + query_offset - s0, s1 - s0)
        spans.append(_Span(queries, _Tokens(min(s0, lk), min(s1, lk), 0, s1 - s0)))
    return spans


def _positions(positions: Tensor | None, rows: _Rows, tokens: _Tokens, shift: int, dtype, device) -> Tensor:
    """Positions (1 or rows, n_tokens, n) of `tokens`; the token index + shift by default."""
    if positions is None:
        return token_positions(tokens.start + shift, tokens.stop - tokens.start, dtype, device)
    if positions.shape[0] > 1:
        positions = positions[rows.b0 : rows.b1]
    return positions[:, tokens.start : tokens.stop].to(dtype)


def _within(chunk: int, dtype, device) -> Tensor:
    return torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril().to(dtype)


def _zero_sums(grp: _Group) -> _Sums:
    g = (grp.rows.b1 - grp.rows.b0) * (grp.rows.h1 - grp.rows.h0)
    dim, value_dim, device = grp.x.q.shape[-1], grp.x.v.shape[-1], grp.x.q.device
    return _Sums(torch.zeros(g, 2 * dim, value_dim + 1, dtype=grp.dtype, device=device),
                 torch.zeros(g, dim, dtype=grp.dtype, device=device))


def _padded(like: Tensor, shape: tuple[int, ...], lead: int, n: int) -> Tensor:
    """An uninitialised (..., T, F) buffer whose rows outside [lead, lead + n) are zero."""
    out = like.new_empty(shape)
    out[..., :lead, :] = 0.0
    out[..., lead + n :, :] = 0.0
    return out


def _query_block(grp: _Group, tokens: _Tokens) -> _QueryBlock:
    """Features of the queries `tokens` of the group's rows, placed at rows lead.. of a zero block."""
    x, dtype = grp.x, grp.dtype
    b0, b1, h0, h1 = grp.rows
    i0, i1, lead, length = tokens
    qf = elu_feature_map(x.q[b0:b1, h0:h1, i0:i1].to(dtype))
    pos = _positions(x.q_positions, grp.rows, tokens, grp.cfg.query_offset, dtype, x.q.device)
    ph = x.b[h0:h1].to(dtype)[None, :, None, :] + torch.einsum("bin,hkn->bhik", pos, x.a[h0:h1].to(dtype))
    cos, sin = torch.cos(ph), torch.sin(ph)
    amp = x.c[h0:h1].to(dtype)[None, :, None, :]
    cq = amp * qf
    nb, nh, n, d = qf.shape
    cs = _padded(qf, (nb, nh, length, 2 * d), lead, n)
    torch.mul(cq, cos, out=cs[:, :, lead : lead + n, :d])
    torch.mul(cq, sin, out=cs[:, :, lead : lead + n, d:])
    qa = _padded(qf, (nb, nh, length, d), lead, n)
    torch.mul(amp.abs(), qf, out=qa[:, :, lead : lead + n])
    return _QueryBlock(qf, cq, cos, sin, pos, cs.view(nb * nh, length, 2 * d), qa.view(nb * nh, length, d))


def _key_block(grp: _Group, tokens: _Tokens) -> _KeyBlock:
    """Features of the keys `tokens` of the group's rows, in the first rows of a zero block."""
    x, dtype = grp.x, grp.dtype
    b0, b1, h0, h1 = grp.rows
    j0, j1, _, length = tokens
    kf = elu_feature_map(x.k[b0:b1, h0:h1, j0:j1].to(dtype))
    pos = _positions(x.k_positions, grp.rows, tokens, 0, dtype, x.k.device)
    pk = torch.einsum("bjn,hkn->bhjk", pos, x.a[h0:h1].to(dtype))
    cos, sin = torch.cos(pk), torch.sin(pk)
    nb, nh, n, d = kf.shape
    values = x.v[b0:b1, h0:h1, j0:j1].to(dtype)
    dv = values.shape[-1]
    cs = _padded(kf, (nb, nh, length, 2 * d), 0, n)
    torch.mul(kf, cos, out=cs[:, :, :n, :d])
    torch.mul(kf, sin, out=cs[:, :, :n, d:])
    va = _padded(kf, (nb, nh, length, dv + 1), 0, n)
    kfm = kf if x.key_mask is None and n == length else _padded(kf, (nb, nh, length, d), 0, n)
    mask = None
    if x.key_mask is None:
        va[:, :, :n, :dv] = values
        va[:, :, :n, dv] = 1.0
        if kfm is not kf:
            kfm[:, :, :n] = kf
    else:
        mask = x.key_mask[b0:b1, j0:j1].to(dtype)[:, None, :, None]
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


def _local_sums(grp: _Group, qb: _QueryBlock, kb: _KeyBlock, pre: Tensor, kcum: Tensor):
    """A = [num, den] and M of a span whose queries and keys share its chunks; also the masked scores."""
    chunk = grp.cfg.chunk
    g, length, f = qb.cs.shape
    qc = qb.cs.view(-1, chunk, f)
    kc = kb.cs.view(-1, chunk, f)
    vc = kb.va.view(-1, chunk, kb.va.shape[-1])
    scores = torch.bmm(qc, kc.transpose(1, 2)).mul_(grp.within)  # (G * N, c, c)
    a_sum = torch.bmm(qc, pre).add_(torch.bmm(scores, vc))
    big = (qb.abs * kcum).sum(-1, keepdim=True)
    return a_sum.view(g, length, -1), big, scores


def _read_sums(qb: _QueryBlock, sums: _Sums) -> tuple[Tensor, Tensor]:
    """A and M of queries that see every key summarised in `sums`."""
    return torch.bmm(qb.cs, sums.kv), torch.bmm(qb.abs, sums.k[..., None])


def _normalise(a_sum: Tensor, big: Tensor, eps: float) -> Tensor:
    """`guarded_normalise` of augmented sums A = [num, den]."""
    return guarded_normalise(a_sum[..., :-1], a_sum[..., -1:], big, eps)


def _guard_backward(a_sum: Tensor, big: Tensor, grad: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Gradients of `guarded_normalise` with respect to A = [num, den] and M, given dL/d out."""
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


def _grad_rows(grad_out: Tensor, grp: _Group, tokens: _Tokens) -> Tensor:
    """dL/d out of the queries `tokens`, placed like the query block: (G, T, Dv), zero elsewhere."""
    b0, b1, h0, h1 = grp.rows
    i0, i1, lead, length = tokens
    block = grad_out.new_zeros(b1 - b0, h1 - h0, length, grad_out.shape[-1], dtype=grp.dtype)
    block[:, :, lead : lead + i1 - i0] = grad_out[b0:b1, h0:h1, i0:i1]
    return block.view(-1, length, grad_out.shape[-1])


def _write_rows(target: Tensor, block: Tensor, rows: _Rows, tokens: _Tokens) -> None:
    b0, b1, h0, h1 = rows
    i0, i1, lead, _ = tokens
    target[b0:b1, h0:h1, i0:i1] = block.view(b1 - b0, h1 - h0, -1, block.shape[-1])[:, :, lead : lead + i1 - i0]


def _accumulate_phase(da: Tensor, rows: _Rows, d_phase: Tensor, positions: Tensor) -> None:
    """da[h] += sum over batch and tokens of d_phase (Bb, Hb, n, D) times positions (Pb, n, n_pos)."""
    if positions.shape[0] != d_phase.shape[0]:
        d_phase = d_phase.sum(0, keepdim=True)
    da[rows.h0 : rows.h1] += torch.einsum("bhik,bin->hkn", d_phase, positions)


def _query_chain(grp: _Group, qb: _QueryBlock, d_cs: Tensor, d_abs: Tensor, tokens: _Tokens, grads: _Grads):
    """From dL/d[Qc, Qs] and dL/d|c|phi(q) of a query block to dq (written) and da, db, dc (added)."""
    b0, b1, h0, h1 = grp.rows
    i0, i1, lead, _ = tokens
    nb, nh, n, d = qb.qf.shape
    d_cs = d_cs.view(nb, nh, -1, 2 * d)[:, :, lead : lead + n]
    d_abs = d_abs.view(nb, nh, -1, d)[:, :, lead : lead + n]
    d_cos, d_sin = d_cs[..., :d], d_cs[..., d:]
    amp = grp.x.c[h0:h1].to(qb.qf.dtype)[None, :, None, :]
    d_phase = qb.cq * torch.addcmul(d_sin * qb.cos, d_cos, qb.sin, value=-1.0)
    # dL/d(c phi(q)) from the cos and sin features, plus |c| = c sign(c) from the guard features
    d_cq = torch.addcmul(torch.addcmul(d_cos * qb.cos, d_sin, qb.sin), amp.sign(), d_abs)
    grads.dc[h0:h1] += (qb.qf * d_cq).sum((0, 2))
    grads.db[h0:h1] += d_phase.sum((0, 2))
    _accumulate_phase(grads.da, grp.rows, d_phase, qb.positions)
    # phi'(x) = min(phi(x), 1) for phi = elu + 1
    torch.mul(amp * d_cq, qb.qf.clamp(max=1.0), out=grads.dq[b0:b1, h0:h1, i0:i1])


def _key_chain(grp: _Group, kb: _KeyBlock, d_cs: Tensor, d_kfm: Tensor, d_va: Tensor, tokens: _Tokens,
               grads: _Grads):
    """From dL/d[Kc, Ks], dL/d m phi(k) and dL/d[m v, m] of a key block to dk, dv (written) and da (added)."""
    b0, b1, h0, h1 = grp.rows
    j0, j1 = tokens.start, tokens.stop
    nb, nh, n, d = kb.kf.shape
    d_cs = d_cs.view(nb, nh, -1, 2 * d)[:, :, :n]
    d_cos, d_sin = d_cs[..., :d], d_cs[..., d:]
    d_kfm = d_kfm.view(nb, nh, -1, d)[:, :, :n]
    d_values = d_va.view(nb, nh, -1, d_va.shape[-1])[:, :, :n, :-1]
    if kb.mask is not None:
        d_kfm = d_kfm * kb.mask
        d_values = d_values * kb.mask
    d_kf = torch.addcmul(torch.addcmul(d_kfm, d_cos, kb.cos), d_sin, kb.sin)
    d_phase = kb.kf * torch.addcmul(d_sin * kb.cos, d_cos, kb.sin, value=-1.0)
    _accumulate_phase(grads.da, grp.rows, d_phase, kb.positions)
    torch.mul(d_kf, kb.kf.clamp(max=1.0), out=grads.dk[b0:b1, h0:h1, j0:j1])
    grads.dv[b0:b1, h0:h1, j0:j1] = d_values


def _keys_backward(grp: _Group, kb: _KeyBlock, later: _Sums, tokens: _Tokens, grads: _Grads) -> None:
    """Keys all read by the same queries, whose gradient sums are `later`."""
    d_cs = torch.bmm(kb.va, later.kv.transpose(1, 2))
    d_va = torch.bmm(kb.cs, later.kv)
    _key_chain(grp, kb, d_cs, later.k[:, None, :], d_va, tokens, grads)


def _read_backward(grp: _Group, qb: _QueryBlock, sums: _Sums, grad: Tensor, tokens: _Tokens, grads: _Grads) -> _Sums:
    """Backward of `_read_sums` and the guard; returns the gradient sums of these queries for the keys."""
    a_sum, big = _read_sums(qb, sums)
    d_a, d_big = _guard_backward(a_sum, big, grad, grp.cfg.eps)
    d_cs = torch.bmm(d_a, sums.kv.transpose(1, 2))
    d_abs = d_big * sums.k[:, None, :]
    _query_chain(grp, qb, d_cs, d_abs, tokens, grads)
    return _Sums(torch.bmm(qb.cs.transpose(1, 2), d_a), (d_big * qb.abs).sum(1))


def _local_backward(
    grp: _Group, qb: _QueryBlock, kb: _KeyBlock, sums: _Sums, later: _Sums, grad: Tensor, span: _Span, grads: _Grads
) -> _Sums:
    """Backward of a span whose queries and keys share its chunks, given the sums of the keys before
    it (`sums`) and the gradient sums of the queries after it (`later`); returns `later` for the
    spans before."""
    chunk = grp.cfg.chunk
    pre = _advance(kb, sums, chunk)[0]
    kcum = _key_prefix(kb, sums)
    a_sum, big, scores = _local_sums(grp, qb, kb, pre, kcum)
    d_a, d_big = _guard_backward(a_sum, big, grad, grp.cfg.eps)
    g, length, f = qb.cs.shape
    n, e = length // chunk, kb.va.shape[-1]
    qc, kc = qb.cs.view(g * n, chunk, f), kb.cs.view(g * n, chunk, f)
    vc, d_ac = kb.va.view(g * n, chunk, e), d_a.view(g * n, chunk, e)
    d_scores = torch.bmm(d_ac, vc.transpose(1, 2)).mul_(grp.within)
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
    _query_chain(grp, qb, d_qcs.view(g, length, f), d_big * kcum, span.queries, grads)
    _key_chain(grp, kb, d_kcs.view(g, length, f), d_kfm, d_va.view(g, length, e), span.keys, grads)
    return _Sums(later_kv, d_kfm[:, 0])


def _groups(x: FourierInputs, cfg: FourierChunkConfig) -> tuple[list[_Group], int]:
    """The row groups of a call and the chunks per span, from `_plan`."""
    bsz, heads, _, dim = x.q.shape
    dtype = compute_dtype(x.q.dtype)
    plan = _plan(bsz, heads, cfg.chunk, dim, x.v.shape[-1])
    within = _within(cfg.chunk, dtype, x.q.device)
    return [_Group(x, cfg, rows, dtype, within) for rows in plan.groups], plan.span_chunks


def chunk_fourier_fwd(x: FourierInputs, cfg: FourierChunkConfig) -> Tensor:
    """Blocked forward pass: out (B, H, Lq, Dv) in q's dtype, A and M computed in the compute dtype."""
    lq, lk = x.q.shape[2], x.k.shape[2]
    out = x.q.new_empty(*x.q.shape[:3], x.v.shape[-1])
    groups, span_chunks = _groups(x, cfg)
    for grp in groups:
        sums = _zero_sums(grp)
        if not cfg.causal:
            for keys in _token_spans(lk, span_chunks * cfg.chunk):
                sums = _key_sums(_key_block(grp, keys), sums)
            for queries in _token_spans(lq, span_chunks * cfg.chunk):
                a_sum, big = _read_sums(_query_block(grp, queries), sums)
                _write_rows(out, _normalise(a_sum, big, cfg.eps), grp.rows, queries)
            continue
        for span in _causal_spans(lq, lk, cfg.query_offset, cfg.chunk, span_chunks):
            if span.queries.stop == span.queries.start:
                sums = _advance(_key_block(grp, span.keys), sums, cfg.chunk)[1]
                continue
            qb = _query_block(grp, span.queries)
            if span.keys.stop == span.keys.start:
                a_sum, big = _read_sums(qb, sums)
            else:
                kb = _key_block(grp, span.keys)
                pre, sums_after = _advance(kb, sums, cfg.chunk)
                a_sum, big, _ = _local_sums(grp, qb, kb, pre, _key_prefix(kb, sums))
                sums = sums_after
            _write_rows(out, _normalise(a_sum, big, cfg.eps), grp.rows, span.queries)
    return out


def chunk_fourier_bwd(grad_out: Tensor, x: FourierInputs, cfg: FourierChunkConfig) -> _Grads:
    """Blocked backward pass: dq, dk, dv in their dtypes and da, db, dc in the compute dtype."""
    lq, lk = x.q.shape[2], x.k.shape[2]
    dtype = compute_dtype(x.q.dtype)
    grads = _Grads(
        torch.empty_like(x.q), torch.empty_like(x.k), torch.empty_like(x.v),
        torch.zeros(x.a.shape, dtype=dtype, device=x.a.device), torch.zeros(x.b.shape, dtype=dtype, device=x.b.device),
        torch.zeros(x.c.shape, dtype=dtype, device=x.c.device),
    )
    groups, span_chunks = _groups(x, cfg)
    for grp in groups:
        zero = _zero_sums(grp)
        if not cfg.causal:
            key_spans = _token_spans(lk, span_chunks * cfg.chunk)
            sums = zero
            for keys in key_spans:
                sums = _key_sums(_key_block(grp, keys), sums)
            later = zero
            for queries in _token_spans(lq, span_chunks * cfg.chunk):
                grad = _grad_rows(grad_out, grp, queries)
                part = _read_backward(grp, _query_block(grp, queries), sums, grad, queries, grads)
                later = _Sums(later.kv + part.kv, later.k + part.k)
            for keys in key_spans:
                _keys_backward(grp, _key_block(grp, keys), later, keys, grads)
            continue
        spans = _causal_spans(lq, lk, cfg.query_offset, cfg.chunk, span_chunks)
        before, sums = [], zero
        for span in spans:
            before.append(sums)
            if span.keys.stop > span.keys.start:
                sums = _advance(_key_block(grp, span.keys), sums, cfg.chunk)[1]
        later = zero
        for span, sums in zip(reversed(spans), reversed(before)):
            if span.queries.stop == span.queries.start:
                _keys_backward(grp, _key_block(grp, span.keys), later, span.keys, grads)
                continue
            qb = _query_block(grp, span.queries)
            grad = _grad_rows(grad_out, grp, span.queries)
            if span.keys.stop == span.keys.start:
                part = _read_backward(grp, qb, sums, grad, span.queries, grads)
                later = _Sums(later.kv + part.kv, later.k + part.k)
                continue
            later = _local_backward(grp, qb, _key_block(grp, span.keys), sums, later, grad, span, grads)
    return grads


class ChunkFourierFunction(torch.autograd.Function):
    """The blocked linear path on (B, H, L, .) inputs; saves only its inputs, recomputes in backward.

    `apply(q, k, v, a, b, c, q_positions, k_positions, key_mask, cfg)` with `cfg` a `FourierChunkConfig`.
    Gradients flow to q, k, v, a, b and c; positions and the key mask receive none.
    """

    @staticmethod
    def forward(ctx, q, k, v, a, b, c, q_positions, k_positions, key_mask, cfg: FourierChunkConfig):
        ctx.save_for_backward(q, k, v, a, b, c, q_positions, k_positions, key_mask)
        ctx.cfg = cfg
        return chunk_fourier_fwd(FourierInputs(q, k, v, a, b, c, q_positions, k_positions, key_mask), cfg)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x = FourierInputs(*ctx.saved_tensors)
        grads = chunk_fourier_bwd(grad_out, x, ctx.cfg)
        return (
            grads.dq, grads.dk, grads.dv, grads.da.to(x.a.dtype), grads.db.to(x.b.dtype), grads.dc.to(x.c.dtype),
            None, None, None, None,
        )
