"""Triton kernels of the local softmax band of `ops_local_softmax` (the default attention) and of its decoding
steps, for CUDA.

The band is the part of `local_softmax_decay_attention` that is not a linear attention: each query's softmax
over its 2h+1 nearest keys with Shaw's relative keys, merged with the decayed tails under one row
normaliser. `TritonLocalSoftmaxBand` has the contract of `ops_local_softmax._LocalSoftmaxBand`, which stays
the CPU path and the reference:

    out_i = (sum over the band of exp(l_ij - m_i) [m v_j, m_j] + exp(-m_i) tail_i) / (the same, last channel)

on rows (B*H, L, .), with l_ij = q_i.(k_j + rel[r(i, j)]) / sqrt(D) and m_i the larger of the row's largest
band logit and log(tail_i's last channel). Three kernels:

- `_band_forward`: one program per block of BLOCK_M queries and row; the block's BLOCK_M + 2h window keys,
  the (BLOCK_M, 2h+1) products with the relative table gathered onto the window, the row shift, and
  out, m and the normaliser, stored for backward;
- `_band_backward_queries`: the same grid; recomputes the weights from m and gives dq and this block's share
  of the table's gradient;
- `_band_backward_keys`: one program per block of BLOCK_M keys; the queries that can see them (a window of
  BLOCK_M + 2h) give dk and d[m v, m] without atomics.

Generation has two more, without backward, each one launch per layer and token where PyTorch takes some forty
to fifty small operations: `_decode_step` (`decode_step`), the self-attention step of one token on the recurrent
state (window of the last h keys, relative table, decayed tail, row shift, normaliser, and the state's update),
and `_cross_decode` (`cross_decode`), a query on the encoder's keys (its band, then every key beyond it by
blocks).

The band reads q and k in the op's input dtype and converts them as it loads them; the other inputs are in their
compute dtype (`ops_common.compute_dtype`: fp32 for half precision), so products and sums accumulate in fp32 or
fp64. The module imports Triton, which is an optional dependency: it is loaded
only for CUDA tensors (or by tests under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import math

import torch


try:
    import triton
    import triton.language as tl
except ImportError as error:  # optional (the `gpu` extra): `ops_local_softmax` falls back to PyTorch without it
    raise ImportError("the Triton kernels of the default attention need `pip install triton`") from error

from .ops_common import shift_scale
from .ops_decay_triton import _elu_features, dot_precision


@triton.jit
def _window(pid, offset, lk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HORIZON: tl.constexpr):
    """Key index of each window slot of query block `pid`, and whether the slot holds an existing key."""
    w = tl.arange(0, BLOCK_N)
    j = pid * BLOCK_M + offset - HORIZON + w
    return j, (w < BLOCK_M + 2 * HORIZON) & (j >= 0) & (j < lk)


@triton.jit
def _table(TAB, row, d, HORIZON: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK_R: tl.constexpr,
           BLOCK_D: tl.constexpr):
    """The row's relative table (2h+1, D), zero-padded to (BLOCK_R, BLOCK_D); zeros without a table."""
    rr = tl.arange(0, BLOCK_R)
    dd = tl.arange(0, BLOCK_D)
    if HAS_TABLE:
        tab = tl.load(TAB + row * (2 * HORIZON + 1) * d + rr[:, None] * d + dd[None, :],
                      mask=(rr[:, None] < 2 * HORIZON + 1) & (dd[None, :] < d), other=0.0)
    else:
        tab = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    return tab


@triton.jit
def _band_logits(q, k, tab, t, visible, scale, CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr,
                 HORIZON: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr):
    """l = q.(k + rel[t + h]) * scale for the pairs of offset t in the band (and t >= 0 when causal) whose key is
    `visible`, -inf elsewhere; q (M, D), k (N, D), t (M, N)."""
    logits = tl.dot(q, tl.trans(k), input_precision=DOT)
    if HAS_TABLE:
        qr = tl.dot(q, tl.trans(tab), input_precision=DOT)  # (M, BLOCK_R)
        logits += tl.gather(qr, tl.minimum(tl.maximum(t + HORIZON, 0), BLOCK_R - 1), axis=1)
    keep = (t <= HORIZON) & (t >= -HORIZON) & visible
    if CAUSAL:
        keep = keep & (t >= 0)
    return tl.where(keep, logits * scale, float("-inf"))


@triton.jit
def _query_block(Q, K, VM, TAB, pid, row, lq, lk, d, dv1, offset, scale, HORIZON: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_TABLE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr):
    """What the forward and the backward by queries both start from, for query block `pid` of `row`: the query
    indices and whether they exist, q (M, D), the window's keys (N, D) and [m v, m] (N, V), the table, and the
    band logits (M, N)."""
    c = tl.arange(0, BLOCK_M)
    i = pid * BLOCK_M + c
    rows = i < lq
    dd = tl.arange(0, BLOCK_D)
    vv = tl.arange(0, BLOCK_V)
    j, exists = _window(pid, offset, lk, BLOCK_M, BLOCK_N, HORIZON)
    acc = VM.dtype.element_ty  # q and k may be 16-bit: the band computes in [m v, m]'s dtype
    q = tl.load(Q + row * lq * d + i[:, None] * d + dd[None, :], mask=rows[:, None] & (dd[None, :] < d),
                other=0.0).to(acc)
    k = tl.load(K + row * lk * d + j[:, None] * d + dd[None, :], mask=exists[:, None] & (dd[None, :] < d),
                other=0.0).to(acc)
    vw = tl.load(VM + row * lk * dv1 + j[:, None] * dv1 + vv[None, :], mask=exists[:, None] & (vv[None, :] < dv1),
                 other=0.0)
    tab = _table(TAB, row, d, HORIZON, HAS_TABLE, BLOCK_R, BLOCK_D)
    key_mask = tl.sum(tl.where(vv[None, :] == dv1 - 1, vw, 0.0), 1)
    t = c[:, None] + HORIZON - tl.arange(0, BLOCK_N)[None, :]
    logits = _band_logits(q, k, tab, t, key_mask[None, :] > 0, scale, CAUSAL, HAS_TABLE, HORIZON, BLOCK_R, DOT)
    return i, rows, q, k, vw, tab, logits


@triton.jit
def _band_forward(
    Q, K, VM, TAB, TAIL, OUT, SHIFT, DEN,
    lq, lk, d, dv1, offset, scale,
    HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr,
):
    pid, row = tl.program_id(0), tl.program_id(1).to(tl.int64)  # offsets can pass 2^31 elements
    i, rows, q, k, vw, tab, logits = _query_block(Q, K, VM, TAB, pid, row, lq, lk, d, dv1, offset, scale, HORIZON,
                                                  CAUSAL, HAS_TABLE, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_V, BLOCK_R,
                                                  DOT)
    vv = tl.arange(0, BLOCK_V)
    tail = tl.load(TAIL + row * lq * dv1 + i[:, None] * dv1 + vv[None, :], mask=rows[:, None] & (vv[None, :] < dv1),
                   other=0.0)
    tail_sum = tl.sum(tl.where(vv[None, :] == dv1 - 1, tail, 0.0), 1)
    m = tl.maximum(tl.max(logits, 1), tl.where(tail_sum > 0, tl.log(tl.where(tail_sum > 0, tail_sum, 1.0)),
                                              float("-inf")))
    m = tl.where(m > float("-inf"), m, 0.0)
    p = tl.exp(logits - m[:, None])
    scale_tail = tl.minimum(tl.exp(-m), 3.0e38)
    sums = tl.dot(p.to(vw.dtype), vw, input_precision=DOT) + scale_tail[:, None] * tail
    den = tl.sum(tl.where(vv[None, :] == dv1 - 1, sums, 0.0), 1)
    out = tl.where(den[:, None] > 0, sums / tl.where(den > 0, den, 1.0)[:, None], 0.0)
    tl.store(OUT + row * lq * (dv1 - 1) + i[:, None] * (dv1 - 1) + vv[None, :], out,
             mask=rows[:, None] & (vv[None, :] < dv1 - 1))
    tl.store(SHIFT + row * lq + i, m, mask=rows)
    tl.store(DEN + row * lq + i, den, mask=rows)


@triton.jit
def _band_backward_queries(
    Q, K, VM, TAB, SHIFT, GS, DQ, DTAB,
    lq, lk, d, dv1, offset, scale,
    HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr,
):
    pid, row = tl.program_id(0), tl.program_id(1).to(tl.int64)  # offsets can pass 2^31 elements
    i, rows, q, k, vw, tab, logits = _query_block(Q, K, VM, TAB, pid, row, lq, lk, d, dv1, offset, scale, HORIZON,
                                                  CAUSAL, HAS_TABLE, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_V, BLOCK_R,
                                                  DOT)
    c = tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    vv = tl.arange(0, BLOCK_V)
    rr = tl.arange(0, BLOCK_R)
    m = tl.load(SHIFT + row * lq + i, mask=rows, other=0.0)
    p = tl.exp(logits - m[:, None])
    gs = tl.load(GS + row * lq * dv1 + i[:, None] * dv1 + vv[None, :], mask=rows[:, None] & (vv[None, :] < dv1),
                 other=0.0)
    dlogits = p * tl.dot(gs, tl.trans(vw), input_precision=DOT) * scale  # (M, N), 0 off the band
    dq = tl.dot(dlogits.to(k.dtype), k, input_precision=DOT)
    if HAS_TABLE:
        # the pair (c, w) reads table row r = c + 2h - w: row r of query c is window slot c + 2h - r
        slot = tl.minimum(tl.maximum(c[:, None] + 2 * HORIZON - rr[None, :], 0), BLOCK_N - 1)
        drel = tl.where(rr[None, :] < 2 * HORIZON + 1, tl.gather(dlogits, slot, axis=1), 0.0)  # (M, BLOCK_R)
        dq += tl.dot(drel.to(tab.dtype), tab, input_precision=DOT)
        dtab = tl.dot(tl.trans(drel.to(q.dtype)), q, input_precision=DOT)  # (BLOCK_R, BLOCK_D)
        n_blocks = tl.num_programs(0)
        tl.store(DTAB + (row * n_blocks + pid) * BLOCK_R * BLOCK_D + rr[:, None] * BLOCK_D + dd[None, :], dtab)
    tl.store(DQ + row * lq * d + i[:, None] * d + dd[None, :], dq, mask=rows[:, None] & (dd[None, :] < d))


@triton.jit
def _band_backward_keys(
    Q, K, VM, TAB, SHIFT, GS, DK, DVM,
    lq, lk, d, dv1, offset, scale,
    HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr,
):
    pid, row = tl.program_id(0), tl.program_id(1).to(tl.int64)  # offsets can pass 2^31 elements
    c = tl.arange(0, BLOCK_M)
    j = pid * BLOCK_M + c  # this block's keys
    u = tl.arange(0, BLOCK_N)
    i = pid * BLOCK_M - HORIZON - offset + u  # the queries whose band can hold them: p_i in j - h .. j + h
    dd = tl.arange(0, BLOCK_D)
    vv = tl.arange(0, BLOCK_V)
    keys = j < lk
    queries = (u < BLOCK_M + 2 * HORIZON) & (i >= 0) & (i < lq)
    acc = VM.dtype.element_ty  # q and k may be 16-bit: the band computes in [m v, m]'s dtype
    q = tl.load(Q + row * lq * d + i[:, None] * d + dd[None, :], mask=queries[:, None] & (dd[None, :] < d),
                other=0.0).to(acc)
    k = tl.load(K + row * lk * d + j[:, None] * d + dd[None, :], mask=keys[:, None] & (dd[None, :] < d),
                other=0.0).to(acc)
    vm = tl.load(VM + row * lk * dv1 + j[:, None] * dv1 + vv[None, :], mask=keys[:, None] & (vv[None, :] < dv1),
                 other=0.0)
    tab = _table(TAB, row, d, HORIZON, HAS_TABLE, BLOCK_R, BLOCK_D)
    key_mask = tl.sum(tl.where(vv[None, :] == dv1 - 1, vm, 0.0), 1)
    t = u[:, None] - HORIZON - c[None, :]  # p_i - j
    visible = (key_mask[None, :] > 0) & queries[:, None]
    logits = _band_logits(q, k, tab, t, visible, scale, CAUSAL, HAS_TABLE, HORIZON, BLOCK_R, DOT)  # (N, M)
    m = tl.load(SHIFT + row * lq + i, mask=queries, other=0.0)
    p = tl.exp(logits - m[:, None])
    gs = tl.load(GS + row * lq * dv1 + i[:, None] * dv1 + vv[None, :], mask=queries[:, None] & (vv[None, :] < dv1),
                 other=0.0)
    dlogits = p * tl.dot(gs, tl.trans(vm), input_precision=DOT) * scale  # (N, M)
    dk = tl.dot(tl.trans(dlogits.to(q.dtype)), q, input_precision=DOT)
    dvm = tl.dot(tl.trans(p.to(gs.dtype)), gs, input_precision=DOT)
    tl.store(DK + row * lk * d + j[:, None] * d + dd[None, :], dk, mask=keys[:, None] & (dd[None, :] < d))
    tl.store(DVM + row * lk * dv1 + j[:, None] * dv1 + vv[None, :], dvm, mask=keys[:, None] & (vv[None, :] < dv1))


def _block_sizes(chunk: int, horizon: int, d: int, dv1: int) -> dict:
    pow2 = triton.next_power_of_2
    block_m = max(16, pow2(chunk))
    return dict(BLOCK_M=block_m, BLOCK_N=max(16, pow2(block_m + 2 * horizon)), BLOCK_D=max(16, pow2(d)),
                BLOCK_V=max(16, pow2(dv1)), BLOCK_R=max(16, pow2(2 * horizon + 1)))


class TritonLocalSoftmaxBand(torch.autograd.Function):
    """`ops_local_softmax._LocalSoftmaxBand` in three Triton kernels (see the module docstring): same inputs,
    q, k (R, L, D) in the op's input dtype, vm and tail (R, L, Dv+1) and table (R, 2h+1, D) or None in the compute
    dtype, and the `_Band` of the call. The kernels read q and k as they are and compute in vm's dtype."""

    @staticmethod
    def forward(ctx, q, k, vm, table, tail, band):
        q, k, vm, tail = (x.contiguous() for x in (q, k, vm, tail))
        table = None if table is None else table.contiguous()
        rows, lq, d = q.shape
        lk, dv1 = k.shape[1], vm.shape[-1]
        sizes = {**_block_sizes(band.chunk, band.horizon, d, dv1), "DOT": dot_precision(vm.dtype, band.half_inputs)}
        out = vm.new_empty(rows, lq, dv1 - 1)
        shift, den = vm.new_empty(rows, lq), vm.new_empty(rows, lq)
        grid = (triton.cdiv(lq, sizes["BLOCK_M"]), rows)
        _band_forward[grid](q, k, vm, q if table is None else table, tail, out, shift, den, lq, lk, d, dv1,
                            band.offset, 1.0 / math.sqrt(d), HORIZON=band.horizon, CAUSAL=band.causal,
                            HAS_TABLE=table is not None, **sizes)
        ctx.save_for_backward(q, k, vm, table, out, shift, den)
        ctx.band, ctx.sizes = band, sizes
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, vm, table, out, shift, den = ctx.saved_tensors
        band, sizes = ctx.band, ctx.sizes
        rows, lq, d = q.shape
        lk, dv1 = k.shape[1], vm.shape[-1]
        shift, den = shift[..., None], den[..., None]
        inv = torch.where(den > 0, 1.0 / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))
        grad_sums = (torch.cat([grad_out, -(grad_out * out).sum(-1, keepdim=True)], dim=-1) * inv).contiguous()
        grad_tail = shift_scale(shift) * grad_sums
        dq, dk, dvm = torch.empty_like(q), torch.empty_like(k), torch.empty_like(vm)
        n_blocks = triton.cdiv(lq, sizes["BLOCK_M"])
        dtab = None if table is None else vm.new_empty(rows, n_blocks, sizes["BLOCK_R"], sizes["BLOCK_D"])
        common = dict(HORIZON=band.horizon, CAUSAL=band.causal, HAS_TABLE=table is not None,
                      **sizes)
        scale = 1.0 / math.sqrt(d)
        tab = q if table is None else table
        _band_backward_queries[(n_blocks, rows)](q, k, vm, tab, shift, grad_sums, dq, q if dtab is None else dtab,
                                                  lq, lk, d, dv1, band.offset, scale, **common)
        _band_backward_keys[(triton.cdiv(lk, sizes["BLOCK_M"]), rows)](q, k, vm, tab, shift, grad_sums, dk, dvm,
                                                                      lq, lk, d, dv1, band.offset, scale, **common)
        dtable = None
        if table is not None:
            dtable = dtab.sum(1)[:, :table.shape[1], :d]
        return dq, dk, dvm, dtable, grad_tail, None


@triton.jit
def _window_logits(q, keys, values, TAB, row, heads, w, inside, d, dd, d_in, vv, dv1, scale, HORIZON: tl.constexpr,
                   HAS_TABLE: tl.constexpr):
    """The band logits (W,) of one query q on the window slots w whose keys (W, D) and [m v, m] (W, V) are given:
    q.(k_w + rel[2h - w]) * scale where the slot is `inside` and its key visible (mask channel > 0), -inf
    elsewhere. Slot w sits at offset h - w from the query (the self step's slots 0..h, the cross step's 0..2h):
    table row 2h - w."""
    logits = tl.sum(keys * q[None, :], 1)
    if HAS_TABLE:
        tab = tl.load(TAB + ((row % heads) * (2 * HORIZON + 1) + 2 * HORIZON - w[:, None]) * d + dd[None, :],
                      mask=inside[:, None] & d_in[None, :], other=0.0)
        logits += tl.sum(tab * q[None, :], 1)
    visible = inside & (tl.sum(tl.where(vv[None, :] == dv1 - 1, values, 0.0), 1) > 0)
    return tl.where(visible, logits * scale, float("-inf"))


@triton.jit
def _merge(logits, values, far, vv, dv1):
    """One query's output from its band logits (W,) on the window's [m v, m] `values` (W, V) and its sum beyond the
    band `far` (V,): exp(l - m) values + exp(-m) far, m the larger of the largest logit and log(far's last
    channel) (0 for a row with neither), normalised by the last channel (0 for a row with no visible key)."""
    far_sum = tl.sum(tl.where(vv == dv1 - 1, far, 0.0), 0)
    m = tl.maximum(tl.max(logits, 0), tl.where(far_sum > 0, tl.log(tl.where(far_sum > 0, far_sum, 1.0)),
                                                float("-inf")))
    m = tl.where(m > float("-inf"), m, 0.0)
    sums = tl.sum(tl.exp(logits - m)[:, None] * values, 0) + tl.minimum(tl.exp(-m), 3.0e38) * far
    den = tl.sum(tl.where(vv == dv1 - 1, sums, 0.0), 0)
    return tl.where(den > 0, sums / tl.where(den > 0, den, 1.0), 0.0)


@triton.jit
def _decode_step(
    Q, K, VM, KEYS, VALUES, TAIL, TAB, GAMMA, OUT, NEW_KEYS, NEW_VALUES, NEW_TAIL,
    heads, d, dv1, scale,
    HORIZON: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # offsets can pass 2^31 elements
    w = tl.arange(0, BLOCK_W)  # window slots, oldest first: the state's h keys, then the new one (slot h)
    dd = tl.arange(0, BLOCK_D)
    vv = tl.arange(0, BLOCK_V)
    d_in, v_in = dd < d, vv < dv1
    old, new = w < HORIZON, w == HORIZON
    q = tl.load(Q + row * d + dd, mask=d_in, other=0.0)
    keys = tl.load(KEYS + (row * HORIZON + w[:, None]) * d + dd[None, :], mask=old[:, None] & d_in[None, :],
                   other=0.0)
    keys += tl.where(new[:, None], tl.load(K + row * d + dd, mask=d_in, other=0.0)[None, :], 0.0)
    values = tl.load(VALUES + (row * HORIZON + w[:, None]) * dv1 + vv[None, :], mask=old[:, None] & v_in[None, :],
                     other=0.0)
    values += tl.where(new[:, None], tl.load(VM + row * dv1 + vv, mask=v_in, other=0.0)[None, :], 0.0)
    logits = _window_logits(q, keys, values, TAB, row, heads, w, w <= HORIZON, d, dd, d_in, vv, dv1, scale, HORIZON,
                            HAS_TABLE)
    # the keys beyond the window, one step further away: gamma * tail
    gamma = tl.load(GAMMA + row % heads)
    tail = gamma * tl.load(TAIL + (row * d + dd[:, None]) * dv1 + vv[None, :], mask=d_in[:, None] & v_in[None, :],
                           other=0.0)
    far = tl.sum(_elu_features(q, d_in)[:, None] * tail, 0) / d
    out = _merge(logits, values, far, vv, dv1)
    tl.store(OUT + row * (dv1 - 1) + vv, out, mask=vv < dv1 - 1)
    # the oldest window key moves to the tail; the others move down one slot
    first = w == 0
    oldest = tl.sum(tl.where(first[:, None], keys, 0.0), 0)
    oldest = _elu_features(oldest, d_in)
    oldest_values = tl.sum(tl.where(first[:, None], values, 0.0), 0)
    tl.store(NEW_TAIL + (row * d + dd[:, None]) * dv1 + vv[None, :], tail + oldest[:, None] * oldest_values[None, :],
             mask=d_in[:, None] & v_in[None, :])
    moved = (w >= 1) & (w <= HORIZON)
    tl.store(NEW_KEYS + (row * HORIZON + w[:, None] - 1) * d + dd[None, :], keys, mask=moved[:, None] & d_in[None, :])
    tl.store(NEW_VALUES + (row * HORIZON + w[:, None] - 1) * dv1 + vv[None, :], values,
             mask=moved[:, None] & v_in[None, :])


def _decode_blocks(horizon: int, d: int, dv1: int) -> dict:
    pow2 = triton.next_power_of_2
    return dict(BLOCK_W=max(16, pow2(horizon + 1)), BLOCK_D=max(16, pow2(d)), BLOCK_V=max(16, pow2(dv1)))


def decode_step(q, k, vm, table, gamma, keys, values, tail):
    """One token of `ops_local_softmax.local_softmax_decay_step` in one launch (`_decode_step`, one program per
    batch*head row): q, k (B, H, 1, D), vm (B, H, 1, Dv+1) = [m v, m], table (H, 2h+1, D) or None, gamma
    (H,) = exp(-lambda), and the state's keys (B, H, h, D), values (B, H, h, Dv+1) and tail (B, H, D, Dv+1), all
    in the state's dtype. Returns the normalised output (B, H, 1, Dv) and the new keys, values and tail."""
    b, heads, horizon, d = keys.shape
    dv1 = values.shape[-1]
    q, k, vm, keys, values, tail, gamma = (t.contiguous() for t in (q, k, vm, keys, values, tail, gamma))
    table = None if table is None else table.contiguous()
    out = q.new_empty(b, heads, 1, dv1 - 1)
    new_keys, new_values, new_tail = torch.empty_like(keys), torch.empty_like(values), torch.empty_like(tail)
    _decode_step[(b * heads,)](
        q, k, vm, keys, values, tail, q if table is None else table, gamma, out, new_keys, new_values, new_tail,
        heads, d, dv1, 1.0 / math.sqrt(d), HORIZON=horizon, HAS_TABLE=table is not None,
        **_decode_blocks(horizon, d, dv1),
    )
    return out, new_keys, new_values, new_tail


@triton.jit
def _cross_decode(
    Q, KEYS, VALUES, TAB, RATE, OUT,
    heads, n, lk, d, dv1, offset, scale,
    HORIZON: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row, i = tl.program_id(0).to(tl.int64), tl.program_id(1)  # offsets can pass 2^31 elements
    p = offset + i
    dd = tl.arange(0, BLOCK_D)
    vv = tl.arange(0, BLOCK_V)
    d_in, v_in = dd < d, vv < dv1
    q = tl.load(Q + (row * n + i) * d + dd, mask=d_in, other=0.0)
    q_features = _elu_features(q, d_in)
    rate = tl.load(RATE + row % heads)
    # the band: keys j = p - h + w, w = 0 .. 2h, table row 2h - w
    w = tl.arange(0, BLOCK_W)
    j = p - HORIZON + w
    window = (w <= 2 * HORIZON) & (j >= 0) & (j < lk)
    keys = tl.load(KEYS + (row * lk + j[:, None]) * d + dd[None, :], mask=window[:, None] & d_in[None, :], other=0.0)
    values = tl.load(VALUES + (row * lk + j[:, None]) * dv1 + vv[None, :], mask=window[:, None] & v_in[None, :],
                     other=0.0)
    logits = _window_logits(q, keys, values, TAB, row, heads, w, window, d, dd, d_in, vv, dv1, scale, HORIZON,
                            HAS_TABLE)
    # beyond it: phi(q).phi(k_j) / D exp(-lambda (|p - j| - h)), by blocks of keys (hidden keys hold [0, 0])
    far = tl.zeros((BLOCK_V,), dtype=OUT.dtype.element_ty)
    for j0 in range(0, lk, BLOCK_N):
        jj = j0 + tl.arange(0, BLOCK_N)
        distance = tl.abs(p - jj)
        beyond = (jj < lk) & (distance > HORIZON)
        k = tl.load(KEYS + (row * lk + jj[:, None]) * d + dd[None, :], mask=beyond[:, None] & d_in[None, :],
                    other=0.0)
        vm = tl.load(VALUES + (row * lk + jj[:, None]) * dv1 + vv[None, :], mask=beyond[:, None] & v_in[None, :],
                     other=0.0)
        k_features = _elu_features(k, d_in[None, :])
        weight = tl.sum(k_features * q_features[None, :], 1) / d * tl.exp(-rate * (distance - HORIZON).to(rate.dtype))
        far += tl.sum(tl.where(beyond, weight, 0.0)[:, None] * vm, 0)
    out = _merge(logits, values, far, vv, dv1)
    tl.store(OUT + (row * n + i) * (dv1 - 1) + vv, out, mask=vv < dv1 - 1)


CROSS_BLOCK_N = 64  # keys per iteration of `_cross_decode`


def cross_decode(q, keys, values, table, rate, query_offset: int, horizon: int):
    """`ops_local_softmax.local_softmax_decay_cross_step` in one launch (`_cross_decode`, one program per batch*head
    row and query): queries q (B, H, n, D) at positions query_offset.., the summary's keys (B, H, Lk, D) and
    [m v, m] (B, H, Lk, Dv+1), table (H, 2h+1, D) or None, rate (H,), all in the summary's dtype. Each query
    reads every key once, as the PyTorch step does; returns the normalised output (B, H, n, Dv)."""
    b, heads, n, d = q.shape
    lk, dv1 = keys.shape[2], values.shape[-1]
    q, keys, values, rate = (t.contiguous() for t in (q, keys, values, rate))
    table = None if table is None else table.contiguous()
    out = q.new_empty(b, heads, n, dv1 - 1)
    _cross_decode[(b * heads, n)](q, keys, values, q if table is None else table, rate, out, heads, n, lk, d, dv1,
                                  query_offset, 1.0 / math.sqrt(d), HORIZON=horizon, HAS_TABLE=table is not None,
                                  BLOCK_N=CROSS_BLOCK_N, **_decode_blocks(2 * horizon, d, dv1))
    return out


__all__ = ["TritonLocalSoftmaxBand", "cross_decode", "decode_step"]
