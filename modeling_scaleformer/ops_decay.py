"""Kernelized attention with clipped relative positions and a per-head geometric decay beyond the horizon.

With a feature map phi (`feature_map`: elu(x) + 1 by default, or max(x, 0); `ops_common.FEATURE_MAPS`),
horizon h, p_i = i + query_offset and a decay rate lambda >= 0 per head:

    S_ij  = (phi(q_i).phi(k_j) + phi(q_i).phi(rel[r(i, j)])) * exp(-lambda max(|p_i - j| - h, 0))
    out_i = sum_j S_ij v_j

over the visible keys (j <= p_i when causal, key_mask[j] == 1), with r(i, j) = clip(p_i - j, -h, h) + h as
in `kernelized_rpe_attention`. Inside the horizon the score is that of `kernelized_rpe_attention`; beyond it
the score fades geometrically instead of adding one more equal term per key, so distant keys do not dilute
near ones as inputs grow. With `normalise=True` each row is divided by sum_j S_ij (registry type
`kernelized_decay`); without it the plain sum is returned and `ScaleformerAttention` puts a per-head RMSNorm
and an output gate on it (`kernelized_decay_gated`, variant fact `normalised=False`).

The multiplier exp(-lambda max(|t| - h, 0)) of the offset t = p_i - j is a band plus a semiseparable tail,
so the op is exact and linear in length:

- the band |t| <= h is a local attention over 2h+1 keys per query, computed by blocks of queries;
- the tail t > h (and t < -h when bidirectional) is a decayed linear attention with queries
  [phi(q_i), phi(q_i).phi(rel[edge])] and keys [phi(k_j), 1] whose query i sees the keys up to p_i - h - 1
  with weight exp(-lambda (p_i - h - j)); it runs by chunks with a (D+1, Dv) state per head (on CUDA in the
  Triton kernels of `ops_decay_triton`). The anticausal tail is the causal one of the reversed sequences.

Time O(L (C + h) (D + Dv) + L D Dv) and memory O(L (D + Dv) + (L / C) D Dv) per head, C the chunk size. The
decoding state (`KernelizedDecayState`) keeps the last h keys and values and the decayed tail sum: constant
size.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .ops_common import (
    DEFAULT_CHUNK_SIZE,
    check_attention_inputs,
    check_horizon,
    check_new_tokens,
    check_state,
    checks_values,
    compute_dtype,
    augment_values,
    describe,
    get_feature_map,
    grouped_rows,
    head_table,
    horizon_of,
    row_table,
)
from .ops_common import normalise as normalise_rows
from .ops_naive import naive_kernelized_decay_attention


def check_decay(decay: Tensor, heads: int, dtype: torch.dtype) -> None:
    """Raise ValueError naming `decay` unless it is a (heads,) tensor of non-negative rates in q's dtype (values
    checked on CPU, `ops_common.checks_values`)."""
    if not isinstance(decay, Tensor) or tuple(decay.shape) != (heads,):
        raise ValueError(f"`decay` must be a tensor of shape (heads,) = ({heads},), got {describe(decay)}")
    if decay.dtype != dtype:
        raise ValueError(f"`decay` must have the dtype of `q` ({dtype}), got {decay.dtype}")
    if checks_values(decay) and bool((decay < 0).any()):
        raise ValueError("`decay` must hold non-negative decay rates (lambda >= 0)")


def _mask_values(v: Tensor, key_mask: Tensor | None, normalise: bool = False) -> Tensor:
    """m_j v_j, or [m_j v_j, m_j] when `normalise` (the last channel then sums to the row normaliser)."""
    if normalise:
        return augment_values(v, key_mask)
    return v if key_mask is None else v * key_mask.to(v.dtype)[:, None, :, None]


def _finish(out: Tensor, normalise: bool) -> Tensor:
    """The attention from the sums over [m v] (as is) or [m v, m] (divided by the last channel)."""
    return normalise_rows(out[..., :-1], out[..., -1:]) if normalise else out


def _rel_features(rel: Tensor | None, heads: int, dtype: torch.dtype, phi) -> Tensor | None:
    """phi(rel) as (H, 2h+1, D), a shared table expanded over the heads."""
    table = head_table(rel, heads, dtype)
    return None if table is None else phi(table)


def band_windows(q: Tensor, k: Tensor, vm: Tensor, horizon: int, offset: int, chunk: int,
                 blocks: tuple[int, int] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The queries in blocks of `chunk` and the keys each block's band can reach, over any leading dimensions
    (positions on dim -2).

    Block b sees the keys p_{bC} - h .. p_{bC} + C - 1 + h (W = C + 2h of them, clamped to 0..Lk-1, with zero
    values outside). `blocks` = (b0, b1) takes blocks b0..b1-1 only (default: all). Returns qb (..., nb, C, D),
    kw (..., nb, W, D), vw (..., nb, W, .), `index` (nb W,): the key each window row was read from, and
    t (C, W): the offset p_i - j = c + h - w of query c and key w of a block, in the band for c <= w <= c + 2h.
    """
    *lead, lq, d = q.shape
    lk = k.shape[-2]
    b0, b1 = blocks if blocks is not None else (0, -(-lq // chunk))
    n_blocks = b1 - b0
    width = chunk + 2 * horizon
    rows = q[..., b0 * chunk:b1 * chunk, :]
    qb = torch.nn.functional.pad(rows, (0, 0, 0, n_blocks * chunk - rows.shape[-2])).view(*lead, n_blocks, chunk, d)
    starts = torch.arange(b0, b1, device=q.device) * chunk + offset - horizon
    index = starts[:, None] + torch.arange(width, device=q.device)  # (n_blocks, width)
    inside = (index >= 0) & (index < lk)
    index = index.clamp(0, lk - 1).reshape(-1)
    kw = k.index_select(-2, index).view(*lead, n_blocks, width, -1)
    vw = vm.index_select(-2, index).view(*lead, n_blocks, width, -1) * inside[..., None].to(vm.dtype)
    t = torch.arange(chunk, device=q.device)[:, None] + horizon - torch.arange(width, device=q.device)[None, :]
    return qb, kw, vw, index, t


def _band(qf: Tensor, kf: Tensor, vm: Tensor, rf: Tensor | None, horizon: int, offset: int, causal: bool,
          chunk: int) -> Tensor:
    """sum over |p_i - j| <= h (j <= p_i when causal) of (phi(q_i).phi(k_j) + phi(q_i).phi(rel[r])) v_j.

    Queries in blocks of `chunk` (`band_windows`).
    """
    b, heads, lq, _ = qf.shape
    qb, kw, vw, _, t = band_windows(qf, kf, vm, horizon, offset, chunk)
    n_blocks, width = kw.shape[2], kw.shape[3]
    scores = qb @ kw.transpose(-1, -2)  # (B, H, n_blocks, C, W)
    keep = (t.abs() <= horizon) & ((t >= 0) if causal else True)
    if rf is not None:
        weights = qb @ rf[None, :, None].transpose(-1, -2)  # (B, H, n_blocks, C, 2h+1)
        rel_index = (t.clamp(-horizon, horizon) + horizon).expand(b, heads, n_blocks, chunk, width)
        scores = scores + weights.gather(-1, rel_index)
    scores = scores * keep.to(scores.dtype)
    return (scores @ vw).reshape(b, heads, n_blocks * chunk, -1)[:, :, :lq]


class _DecayScan(torch.autograd.Function):
    """states_0 = initial (or 0), states_{c+1} = carry states_c + local_c for local (B, H, n, E, Dv) and
    carry (H,).

    A loop over the n chunks that writes into one preallocated tensor, forward and backward: autograd over
    the loop would keep n states and n products alive and, for each chunk, add a full-size zero gradient.
    Backward: the adjoint G_c = grad_c + carry G_{c+1} of states_c is that of local_{c-1} (and of the initial
    state for c = 0), and the carry gets sum_c G_c . states_{c-1}.
    """

    @staticmethod
    def forward(ctx, local: Tensor, carry: Tensor, initial: Tensor | None) -> Tensor:
        n = local.shape[2]
        steps = local.movedim(2, 0)  # (n, B, H, E, Dv)
        states = torch.empty_like(steps, memory_format=torch.contiguous_format)
        if initial is None:
            states[0].zero_()
        else:
            states[0] = initial
        factor = carry[None, :, None, None]
        for c in range(n - 1):
            torch.addcmul(steps[c], factor, states[c], out=states[c + 1])
        ctx.save_for_backward(states, carry)
        return states.movedim(0, 2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        states, carry = ctx.saved_tensors
        n = states.shape[0]
        grads = grad.movedim(2, 0)
        factor = carry[None, :, None, None]
        adjoint = torch.empty_like(states)  # adjoint[c] = G_c
        adjoint[n - 1] = grads[n - 1]
        for c in range(n - 2, -1, -1):
            torch.addcmul(grads[c], factor, adjoint[c + 1], out=adjoint[c])
        grad_local = torch.zeros_like(states)
        grad_local[:-1] = adjoint[1:]
        grad_carry = None
        if ctx.needs_input_grad[1]:
            grad_carry = torch.zeros_like(carry)
            for c in range(1, n):
                grad_carry += (adjoint[c] * states[c - 1]).sum((0, 2, 3))
        grad_initial = adjoint[0] if ctx.needs_input_grad[2] else None
        return grad_local.movedim(0, 2), grad_carry, grad_initial


def _tail_kernel(device: torch.device, dim: int):
    """The Triton kernels of `decayed_tail` for `device` and features of width `dim`
    (`ops_decay_triton.decayed_tail`), or None where PyTorch computes it: off CUDA, without Triton, or for
    features wider than the kernels hold."""
    if device.type != "cuda":
        return None
    try:
        from .ops_decay_triton import decayed_tail as kernel, fits
    except ImportError:
        return None
    return kernel if fits(dim) else None


def _decayed_prefix(x: Tensor, y: Tensor, v: Tensor, rate: Tensor, chunk: int, initial: Tensor | None = None
                    ) -> Tensor:
    """out_m = sum_{j <= m} exp(-rate (m + 1 - j)) x_m.y_j v_j for m = 0..L-1, by chunks of keys; keys before
    position 0 enter through `initial` (B, H, E, Dv) = sum_{j < 0} exp(-rate (-1 - j)) y_j v_j^T.

    x, y (B, H, L, E), v (B, H, L, Dv), rate (H,). Within a chunk the (C, C) decayed scores; across chunks a
    state S_c = sum_{j < cC} exp(-rate (cC - 1 - j)) y_j v_j^T of shape (E, Dv).
    """
    b, heads, length, e = x.shape
    dv = v.shape[-1]
    n = -(-length // chunk)
    pad = n * chunk - length
    xc = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(b, heads, n, chunk, e)
    yc = torch.nn.functional.pad(y, (0, 0, 0, pad)).view(b, heads, n, chunk, e)
    vc = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(b, heads, n, chunk, dv)
    pos = torch.arange(chunk, device=x.device, dtype=x.dtype)
    rate = rate.to(x.dtype)[:, None, None]  # (H, 1, 1)
    gap = pos[:, None] - pos[None, :]  # a - b
    intra_decay = torch.where(gap >= 0, torch.exp(-rate * (gap + 1).clamp(min=0)), torch.zeros((), dtype=x.dtype,
                                                                                                  device=x.device))
    out = ((xc @ yc.transpose(-1, -2)) * intra_decay[None, :, None]) @ vc  # (B, H, n, C, Dv)
    if n > 1 or initial is not None:
        to_end = torch.exp(-rate[..., 0] * (chunk - 1 - pos))  # (H, C): key b of a chunk to the chunk's end
        local = (yc * to_end[None, :, None, :, None]).transpose(-1, -2) @ vc  # (B, H, n, E, Dv)
        # the state before each chunk
        states = _DecayScan.apply(local, torch.exp(-rate[:, 0, 0] * chunk), initial)
        from_start = torch.exp(-rate[..., 0] * (pos + 2))  # (H, C): query a of a chunk from the state
        out = out + (xc * from_start[None, :, None, :, None]) @ states
    return out.reshape(b, heads, n * chunk, dv)[:, :, :length]


def _decayed_before(y: Tensor, vm: Tensor, rate: Tensor, lead: int, reverse: bool) -> Tensor | None:
    """sum over the keys j < lead of exp(-rate (lead - 1 - j)) y_j vm_j^T (B, H, E, Dv) in vm's dtype, the keys
    counted from the end when `reverse`; None when there are none."""
    lk = y.shape[2]
    before = min(lead, lk)
    if before <= 0:
        return None
    keys, values = (y[:, :, :before], vm[:, :, :before]) if not reverse else \
        (y[:, :, lk - before:].flip(2), vm[:, :, lk - before:].flip(2))
    keys = keys.to(vm.dtype)
    distance = lead - 1 - torch.arange(before, device=y.device, dtype=vm.dtype)
    weight = torch.exp(-rate.to(vm.dtype)[:, None] * distance)
    return (keys * weight[None, :, :, None]).transpose(-1, -2) @ values


def decayed_tail(xq: Tensor, y: Tensor, vm: Tensor, rate: Tensor, horizon: int, offset: int, chunk: int,
                 half_inputs: bool = False, reverse: bool = False) -> Tensor:
    """sum over j <= p_i - h - 1 of exp(-rate (p_i - h - j)) x_i.y_j v_j, p_i = i + offset (any integer offset).

    The query with cutoff m = p_i - h - 1 is placed at key position m, so that one causal pass
    (`_decayed_prefix`) over the cutoffs' span serves all queries; the keys before the span enter as one
    decayed sum, so that few queries on many keys (cross attention) cost O(Lk E Dv + Lq C (E + Dv)). Queries
    with m < 0 see no key. With `reverse` the same on the sequences reversed along their positions (xq, y, vm
    flipped, and the result flipped back): the anticausal tail. On CUDA the Triton kernels compute it
    (`_tail_kernel`) reading the span and the reversal in place; `half_inputs` says that the operands came from
    16-bit floats (the kernels may multiply them in TF32). vm is in the accumulation dtype; xq and y may be
    16-bit: the kernels then multiply 16-bit operands (states and sums in float32), and PyTorch computes in vm's
    dtype.
    """
    b, heads, lq, e = xq.shape
    first = offset - horizon - 1  # the cutoff of query 0
    last = first + lq - 1
    if last < 0:
        return xq.new_zeros(b, heads, lq, vm.shape[-1])
    lead = max(first, 0)  # the pass covers the cutoffs lead..last
    skip = lead - first  # the queries before it see no key
    kernel = _tail_kernel(xq.device, e)
    initial = _decayed_before(y, vm, rate, lead, reverse)
    if kernel is not None:
        return kernel(xq, y, vm, rate, initial, skip=skip, lead=lead, reverse=reverse, half_inputs=half_inputs)
    xq, y = xq.to(vm.dtype), y.to(vm.dtype)
    if reverse:
        xq, y, vm = (t.flip(2) for t in (xq, y, vm))
    span = last - lead + 1
    ys = torch.nn.functional.pad(y[:, :, lead:last + 1], (0, 0, 0, span - y[:, :, lead:last + 1].shape[2]))
    vs = torch.nn.functional.pad(vm[:, :, lead:last + 1], (0, 0, 0, span - vm[:, :, lead:last + 1].shape[2]))
    out = torch.nn.functional.pad(_decayed_prefix(xq[:, :, skip:], ys, vs, rate, chunk, initial), (0, 0, skip, 0))
    return out.flip(2) if reverse else out


def decayed_tails(xq: Tensor, y: Tensor, vm: Tensor, rate: Tensor, horizon: int, offset: int, chunk: int, *,
                  causal: bool, half_inputs: bool = False) -> Tensor:
    """`decayed_tail`, plus, unless `causal`, the anticausal tail: the keys j >= p_i + h + 1, the causal tail of
    the reversed sequences (key j' = Lk-1-j, query i' = Lq-1-i at p' = i' + Lk - Lq - offset)."""
    tail = decayed_tail(xq, y, vm, rate, horizon, offset, chunk, half_inputs)
    if not causal:
        tail = tail + decayed_tail(xq, y, vm, rate, horizon, y.shape[2] - xq.shape[2] - offset, chunk, half_inputs,
                                   reverse=True)
    return tail


def _tail_features(qf: Tensor, kf: Tensor, rf: Tensor | None, edge: int) -> tuple[Tensor, Tensor]:
    """x_i = [phi(q_i), phi(q_i).phi(rel[edge])], y_j = [phi(k_j), 1]; without a table x = phi(q), y = phi(k)."""
    if rf is None:
        return qf, kf
    x = torch.cat([qf, qf @ rf[None, :, edge, :, None]], dim=-1)
    y = torch.cat([kf, torch.ones_like(kf[..., :1])], dim=-1)
    return x, y


def chunk_kernelized_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, horizon: int | None = None,
    normalise: bool = False, feature_map: str = "elu", chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """The linear algorithm of `kernelized_decay_attention` (band + decayed tails, see the module docstring).

    Differentiable by autograd, recomputed in backward by groups of batch*head rows
    (`ops_common.grouped_rows`). `horizon` is read from `rel` unless given (needed when `rel` is None).
    """
    dtype = compute_dtype(q.dtype)
    h = resolve_horizon(rel, horizon)
    b, heads, lq, d = q.shape
    lk = k.shape[2]
    vm = _mask_values(v.to(dtype), key_mask, normalise)
    chunk = max(chunk_size, 1)
    phi = get_feature_map(feature_map)
    half = dtype != q.dtype

    def attend(q, k, vm, rate, rel=None):  # rows (G, 1, L, .) of (B * H, 1, L, .), rate (G,), rel (G, 2h+1, D)
        qf, kf = (phi(x.transpose(0, 1)) for x in (q, k))
        vm = vm.transpose(0, 1)
        rf = None if rel is None else phi(rel)
        out = _band(qf, kf, vm, rf, h, query_offset, causal, chunk)
        x, y = _tail_features(qf, kf, rf, 2 * h)
        out = out + decayed_tail(x, y, vm, rate, h, query_offset, chunk, half)
        if not causal:
            # keys j >= p_i + h + 1 of the reversed sequences: j' = Lk-1-j, query i' = Lq-1-i at p' = i' + Lk-Lq-off
            x, y = _tail_features(qf, kf, rf, 0)
            out = out + decayed_tail(x, y, vm, rate, h, lk - lq - query_offset, chunk, half, reverse=True)
        return out.transpose(0, 1)

    rows = [x.reshape(b * heads, 1, x.shape[2], x.shape[3]) for x in (q.to(dtype), k.to(dtype), vm)]
    tables = [] if rel is None else [row_table(rel, b, heads, dtype)]
    per_row = max(lq, lk) * (2 * chunk + 2 * h + d + vm.shape[-1])
    out = grouped_rows(attend, per_row, *rows, decay.to(dtype).repeat(b), *tables)
    return _finish(out.view(b, heads, lq, -1), normalise).to(q.dtype)


# Fixed cost of the linear path per call, in multiply-adds (Python and launch overhead).
LINEAR_OVERHEAD = 15_000_000


def kernelized_decay_choose_mode(
    lq: int, lk: int, dim: int, value_dim: int, horizon: int, *, causal: bool, batch_heads: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> str:
    """The cheaper algorithm for one call, "naive" or "linear", from a cost model in multiply-adds.

    Quadratic: about (D + Dv + 8) per score. Linear: the band (C + 2h keys per query), the tail's chunk
    scores (C per query and direction: the pass covers the queries' span) and its states ((D+1) Dv per query
    and key and direction: the keys before the span enter as one decayed sum).
    """
    c = max(chunk_size, 1)
    directions = 1 if causal else 2
    per_score = dim + value_dim + 8
    naive = batch_heads * lq * lk * per_score
    linear = batch_heads * (
        lq * (c + 2 * horizon) * per_score
        + directions * (lq * c * per_score + (lq + lk) * (dim + 1) * value_dim)
    ) + LINEAR_OVERHEAD
    return "linear" if linear < naive else "naive"


def kernelized_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
    horizon: int | None = None, normalise: bool = False, feature_map: str = "elu",
) -> Tensor:
    """Kernelized attention with clipped relative positions and a geometric decay beyond the horizon, exact,
    linear in length, as a plain sum or row-normalised (see the module docstring for the formula).

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq (cross attention).
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        rel (`Tensor` of shape `(H, 2h+1, D)` or `(2h+1, D)`, *optional*): relative embeddings, row r for
            relative position r - h. Without it the score is phi(q_i).phi(k_j) times the decay, and
            `horizon` must be given.
        decay (`Tensor` of shape `(H,)`): decay rate lambda >= 0 per head, per position beyond the horizon.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= p_i.
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): absolute position of the first query.
        mode (`str`, defaults to `"auto"`): `"naive"` (quadratic reference), `"linear"` (band plus chunked
            decayed tails, O(L) time and memory) or `"auto"` (the cheaper, see `kernelized_decay_choose_mode`).
        horizon (`int`, *optional*): h; read from `rel` when omitted.
        normalise (`bool`, defaults to `False`): divide each row by sum_j S_ij (the decayed scores are
            non-negative; a row whose sum is 0 is 0), as `kernelized_rpe_attention` does, instead of returning
            the plain sum.
        feature_map (`str`, defaults to `"elu"`): phi, a key of `ops_common.FEATURE_MAPS`: `"elu"` (elu + 1,
            every score positive) or `"relu"` (max(x, 0): a score can be exactly 0).

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype; a row with no visible key is 0. Half precision
        accumulates in float32.
    """
    check_attention_inputs(q, k, v, rel, key_mask, query_offset, mode)
    check_decay(decay, q.shape[1], q.dtype)
    get_feature_map(feature_map)
    h = resolve_horizon(rel, horizon)
    if mode == "auto":
        mode = kernelized_decay_choose_mode(
            q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], h, causal=causal, batch_heads=q.shape[0] * q.shape[1]
        )
    if mode == "naive":
        return naive_kernelized_decay_attention(
            q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=query_offset, horizon=h,
            normalise=normalise, feature_map=feature_map,
        )
    return chunk_kernelized_decay_attention(
        q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=query_offset, horizon=h,
        normalise=normalise, feature_map=feature_map,
    )


# Fixed cost of the key-sum path of `kernelized_sum_attention` per call, in multiply-adds (a few tensor ops).
SUM_OVERHEAD = 200_000


def prefix_sums_fit(dim: int, value_dim: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> bool:
    """Whether causal `kernelized_sum_attention` keeps a running key sum per key: its D x Dv entries take no
    more memory per key than the chunked path's scores and inputs (2C + D + Dv)."""
    return dim * value_dim <= 2 * max(chunk_size, 1) + dim + value_dim


def kernelized_sum_choose_mode(lq: int, lk: int, dim: int, value_dim: int, *, causal: bool, batch_heads: int = 1
                               ) -> str:
    """The cheaper algorithm for one call of `kernelized_sum_attention`, "naive" or "linear", in multiply-adds:
    about (D + Dv + 8) per score against about 4 D Dv per query and per key for the key sums (or the chunked
    path's cost, `kernelized_decay_choose_mode`, where causal running sums do not fit)."""
    if causal and not prefix_sums_fit(dim, value_dim):
        return kernelized_decay_choose_mode(lq, lk, dim, value_dim, 0, causal=True, batch_heads=batch_heads)
    naive = batch_heads * lq * lk * (dim + value_dim + 8)
    summed = batch_heads * (lq + lk) * dim * value_dim * 4 + SUM_OVERHEAD
    return "linear" if summed < naive else "naive"


def kernelized_sum_attention(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
    mode: str = "auto", feature_map: str = "elu",
) -> Tensor:
    """out_i = sum_j phi(q_i).phi(k_j) v_j over the visible keys, with no decay and no position information:
    `kernelized_decay_attention` with rates of 0, no table and horizon 0 (its naive mode is the reference).

    The linear mode reads the sums of the keys' outer products phi(k_j) v_j^T: one (D, Dv) sum per head when
    bidirectional, and their running sum along the keys when causal, query i reading the sum up to
    p_i = i + query_offset; where a running sum per key would take more memory than the chunked path
    (`prefix_sums_fit`: square heads wider than 12 x 12), causal attention runs on the chunked path of
    `kernelized_decay_attention`. Time O(L D Dv), memory O(L D Dv) per head with D Dv <= 2C + D + Dv.

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`), k (`Tensor` of shape `(B, H, Lk, D)`), v (`Tensor` of shape
            `(B, H, Lk, Dv)`): queries, keys and values; Lk may differ from Lq.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= p_i.
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): absolute position of the first query.
        mode (`str`, defaults to `"auto"`): `"naive"`, `"linear"` or `"auto"` (`kernelized_sum_choose_mode`).
        feature_map (`str`, defaults to `"elu"`): phi, a key of `ops_common.FEATURE_MAPS`.

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype; a row with no visible key is 0. Half precision
        accumulates in float32.
    """
    check_attention_inputs(q, k, v, None, key_mask, query_offset, mode)
    phi = get_feature_map(feature_map)
    b, heads, lq, dim = q.shape
    lk, value_dim = k.shape[2], v.shape[-1]
    if mode == "auto":
        mode = kernelized_sum_choose_mode(lq, lk, dim, value_dim, causal=causal, batch_heads=b * heads)
    if mode == "naive" or (causal and not prefix_sums_fit(dim, value_dim)):
        return kernelized_decay_attention(
            q, k, v, None, q.new_zeros(heads), causal=causal, key_mask=key_mask, query_offset=query_offset,
            mode=mode, horizon=0, feature_map=feature_map,
        )
    if not causal:  # every query reads the same sum, the one cross attention keeps
        summary = kernelized_sum_cross_summary(k, v, key_mask=key_mask, feature_map=feature_map)
        return kernelized_sum_cross_step(q, summary, feature_map=feature_map)
    dtype = compute_dtype(q.dtype)
    qf, kf = phi(q.to(dtype)), phi(k.to(dtype))
    vm = _mask_values(v.to(dtype), key_mask)
    running = torch.cumsum(kf[..., :, None] * vm[..., None, :], dim=2)  # (B, H, Lk, D, Dv)
    last = (torch.arange(lq, device=q.device) + query_offset).clamp(max=lk - 1)  # the last key each query sees
    return torch.einsum("bhid,bhide->bhie", qf, running[:, :, last]).to(q.dtype)


def resolve_horizon(rel: Tensor | None, horizon: int | None) -> int:
    """h from `horizon`, or from `rel` when it is None; ValueError when neither gives it or they disagree."""
    if horizon is None:
        if rel is None:
            raise ValueError("`horizon` must be given when `rel` is None")
        return horizon_of(rel)
    check_horizon(horizon)
    if rel is not None and horizon != horizon_of(rel):
        raise ValueError(f"`horizon` ({horizon}) must match `rel`, whose {rel.shape[-2]} rows give {horizon_of(rel)}")
    return horizon


# ------------------------------------------------------------------------------------------------ decoding


class KernelizedDecayState(NamedTuple):
    """Recurrent state of causal kernelized decay attention after `seen` tokens (positions 0..seen-1).

    Fields:
        keys (`Tensor` of shape `(B, H, h, D)`): phi(k_j) of the last h tokens, oldest first; zero rows stand
            for positions before the start.
        values (`Tensor` of shape `(B, H, h, Dv')`): m_j v_j of the same tokens (key mask applied), with m_j
            as a last channel when the attention is normalised (Dv' = Dv + 1, else Dv' = Dv).
        tail (`Tensor` of shape `(B, H, D+1, Dv')`): sum over j <= seen - h - 1 of
            exp(-lambda (seen - h - 1 - j)) [phi(k_j), 1] values_j^T.
        seen (`int`): number of tokens seen, the position of the next token.
    """

    keys: Tensor
    values: Tensor
    tail: Tensor
    seen: int


def kernelized_decay_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, horizon: int, *, dtype: torch.dtype, device=None,
    normalise: bool = False,
) -> KernelizedDecayState:
    """The empty state (no token seen); accumulates in `compute_dtype(dtype)`."""
    dtype = compute_dtype(dtype)
    value_dim += int(normalise)
    return KernelizedDecayState(
        keys=torch.zeros(batch, heads, horizon, dim, dtype=dtype, device=device),
        values=torch.zeros(batch, heads, horizon, value_dim, dtype=dtype, device=device),
        tail=torch.zeros(batch, heads, dim + 1, value_dim, dtype=dtype, device=device),
        seen=0,
    )


def decayed_prefill(window: Tensor, y: Tensor, vm: Tensor, decay: Tensor, horizon: int) -> tuple[Tensor, Tensor, Tensor]:
    """The parts of a decay state after L tokens at positions 0..L-1: `window` and `vm` rows of the last h
    tokens (zero rows in front when L < h) and the tail sum over j <= L - h - 1 of
    exp(-lambda (L - h - 1 - j)) y_j vm_j^T, in O(L D Dv) time."""
    length = window.shape[2]
    old = max(length - horizon, 0)  # tokens 0..old-1 are in the tail
    weight = torch.exp(-decay.to(y.dtype)[:, None] * (old - 1 - torch.arange(old, device=y.device, dtype=y.dtype)))
    tail = (y[:, :, :old] * weight[None, :, :, None]).transpose(-1, -2) @ vm[:, :, :old]
    pad = horizon - (length - old)
    keys = torch.nn.functional.pad(window[:, :, old:], (0, 0, pad, 0))
    values = torch.nn.functional.pad(vm[:, :, old:], (0, 0, pad, 0))
    return keys, values, tail


def kernelized_decay_prefill_state(
    k: Tensor, v: Tensor, decay: Tensor, *, horizon: int, key_mask: Tensor | None = None, normalise: bool = False,
    feature_map: str = "elu",
) -> KernelizedDecayState:
    """The state after the tokens k, v (B, H, L, .) at positions 0..L-1, in O(L D Dv) time."""
    dtype = compute_dtype(k.dtype)
    kf = get_feature_map(feature_map)(k.to(dtype))
    y = torch.cat([kf, torch.ones_like(kf[..., :1])], dim=-1)
    keys, values, tail = decayed_prefill(kf, y, _mask_values(v.to(dtype), key_mask, normalise), decay, horizon)
    length = k.shape[2]
    return KernelizedDecayState(keys=keys, values=values, tail=tail, seen=length)


def check_decay_step(q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor, state, state_type: type,
                     key_mask: Tensor | None, horizon: int | None, tail_rows: int, value_channels: int) -> int:
    """The checks of a decay op's recurrent step: inputs, new tokens, rates and a state whose window holds h
    keys of q's size and whose tail has `tail_rows` x `value_channels`; returns h. ValueError naming what
    does not fit."""
    check_state(state, state_type)
    check_attention_inputs(q, k, v, rel, key_mask, state.seen, "linear")
    check_new_tokens(q, k)
    check_decay(decay, q.shape[1], q.dtype)
    h = resolve_horizon(rel, horizon)
    b, heads, _, d = q.shape
    expected, tail_shape = (b, heads, h, d), (b, heads, tail_rows, value_channels)
    if tuple(state.keys.shape) != expected or tuple(state.tail.shape) != tail_shape:
        raise ValueError(
            f"`state` does not fit these inputs: expected keys of shape {expected} (horizon {h}) and a tail of "
            f"shape {tail_shape}, got {tuple(state.keys.shape)} and {tuple(state.tail.shape)}"
        )
    return h


def decayed_window_steps(queries: Tensor, new_keys: Tensor, new_values: Tensor, state, decay: Tensor, read,
                         tail_key) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The recurrent loop of the decay ops, token by token: the new token joins the window of the last h keys;
    `read(query, keys, values, far)` gives its sums from the h + 1 window keys (oldest first, at offsets
    h .. 0) and from far = exp(-lambda) tail, the keys beyond the window at their decay for this token; then
    the oldest window key moves to the tail: tail <- exp(-lambda) tail + tail_key(key)^T value.

    queries, new_keys, new_values (B, H, n, .); `state` has `keys`, `values` and `tail`. Returns the sums
    (B, H, n, .) and the new window keys, window values and tail.
    """
    gamma = torch.exp(-decay.to(state.tail.dtype))[None, :, None, None]
    keys, values, tail = state.keys, state.values, state.tail
    outs = []
    for s in range(queries.shape[2]):
        keys = torch.cat([keys, new_keys[:, :, s:s + 1]], dim=2)
        values = torch.cat([values, new_values[:, :, s:s + 1]], dim=2)
        outs.append(read(queries[:, :, s:s + 1], keys, values, gamma * tail))
        tail = gamma * tail + tail_key(keys[:, :, :1]).transpose(-1, -2) @ values[:, :, :1]
        keys, values = keys[:, :, 1:], values[:, :, 1:]
    return torch.cat(outs, dim=2), keys, values, tail


def kernelized_decay_step(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor, state: KernelizedDecayState,
    *, key_mask: Tensor | None = None, horizon: int | None = None, normalise: bool = False, feature_map: str = "elu",
) -> tuple[Tensor, KernelizedDecayState]:
    """Causal attention of n new tokens on the past summarised by `state`, and the updated state.

    q, k, v have shape (B, H, n, .) and sit at positions state.seen .. state.seen + n - 1; `key_mask` (B, n)
    masks new tokens only. The result equals the matching rows of
    `kernelized_decay_attention(..., causal=True)` over the whole sequence; the state keeps its size.
    """
    h = check_decay_step(q, k, v, rel, decay, state, KernelizedDecayState, key_mask, horizon, q.shape[-1] + 1,
                         v.shape[-1] + int(normalise))
    dtype = state.tail.dtype
    phi = get_feature_map(feature_map)
    rf = _rel_features(rel, q.shape[1], dtype, phi)

    def read(qi, keys, values, far):  # qi = phi(q_i) (B, H, 1, D), keys phi(k_j)
        scores = qi @ keys.transpose(-1, -2)
        x = qi
        if rf is not None:
            weights = qi @ rf.transpose(-1, -2)[None]  # (B, H, 1, 2h+1); window key w at offset h - w: row 2h - w
            scores = scores + weights[..., h:].flip(-1)
            x = torch.cat([qi, weights[..., -1:]], dim=-1)
        return scores @ values + x @ far[:, :, :x.shape[-1]]

    def tail_key(key):  # [phi(k), 1]
        return torch.cat([key, torch.ones_like(key[..., :1])], dim=-1)

    qf, kf = phi(q.to(dtype)), phi(k.to(dtype))
    vm = _mask_values(v.to(dtype), key_mask, normalise)
    out, keys, values, tail = decayed_window_steps(qf, kf, vm, state, decay, read, tail_key)
    return _finish(out, normalise).to(q.dtype), KernelizedDecayState(keys, values, tail, state.seen + q.shape[2])


class KernelizedDecayCrossSummary(NamedTuple):
    """The fixed keys of cross attention, kept for `kernelized_decay_cross_step`.

    Fields:
        keys (`Tensor` of shape `(B, H, Lk, D)`): the keys.
        values (`Tensor` of shape `(B, H, Lk, Dv+1)`): [m_j v_j, m_j], the values with the key mask applied
            and the mask as a last channel (the row normaliser's sum; a plain sum leaves it out).
    """

    keys: Tensor
    values: Tensor


def kernelized_decay_cross_summary(k: Tensor, v: Tensor, *, key_mask: Tensor | None = None) -> KernelizedDecayCrossSummary:
    """Keep keys and masked values (B, H, Lk, .) for `kernelized_decay_cross_step`."""
    dtype = compute_dtype(k.dtype)
    return KernelizedDecayCrossSummary(keys=k.to(dtype), values=augment_values(v.to(dtype), key_mask))


def kernelized_decay_cross_step(
    q: Tensor, rel: Tensor | None, decay: Tensor, summary: KernelizedDecayCrossSummary, *, query_offset: int,
    horizon: int | None = None, normalise: bool = False, feature_map: str = "elu",
) -> Tensor:
    """Bidirectional attention of queries (B, H, n, D) at positions query_offset.. on the summarised keys.

    Equals `kernelized_decay_attention(q, k, v, rel, decay, query_offset=query_offset)` for the keys the
    summary was built from. Each query reads every key once: O(n Lk (D + Dv)), like softmax cross attention.
    """
    if not isinstance(summary, KernelizedDecayCrossSummary):
        raise ValueError(f"`summary` must be a KernelizedDecayCrossSummary, got {type(summary).__name__}")
    dtype = summary.keys.dtype
    h = resolve_horizon(rel, horizon)
    values = summary.values if normalise else summary.values[..., :-1]
    out = naive_kernelized_decay_attention(
        q.to(dtype), summary.keys, values, None if rel is None else rel.to(dtype), decay.to(dtype),
        query_offset=query_offset, horizon=h, feature_map=feature_map,
    )
    return _finish(out, normalise).to(q.dtype)


class KernelizedSumCrossSummary(NamedTuple):
    """What `kernelized_sum_cross_step` keeps of the fixed keys of cross attention: with no positions and no decay,
    every query reads the same sum.

    Fields:
        sums (`Tensor` of shape `(B, H, D, Dv)`): sum_j phi(k_j) m_j v_j^T over the keys, m the key mask.
    """

    sums: Tensor


# keys per product of `_key_sums`. One (D, Lk) x (Lk, Dv) product per head has a small output over a long reduction,
# which a GPU's matrix kernels run with little parallelism: the count block's source sum in the small model's
# training step (64 heads of 2 x 2 over 16,384 keys, float32) took 0.54 ms in one cuBLAS kernel on an H200
# (benchmarks/README.md). Summed by chunks of this many keys, then over the chunks, it is many small products at once
KEY_SUM_CHUNK = 512


def _key_sums(kf: Tensor, vm: Tensor) -> Tensor:
    """sum_j kf_j vm_j^T over the keys of (B, H, Lk, D) and (B, H, Lk, Dv): (B, H, D, Dv), as one product, or by
    chunks of KEY_SUM_CHUNK keys where Lk spans more than two (the last chunk padded with zeros)."""
    b, heads, lk, dim = kf.shape
    if lk <= 2 * KEY_SUM_CHUNK:
        return kf.transpose(-1, -2) @ vm
    chunks = -(-lk // KEY_SUM_CHUNK)
    pad = chunks * KEY_SUM_CHUNK - lk
    kf, vm = (torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(b, heads, chunks, KEY_SUM_CHUNK, x.shape[-1])
              for x in (kf, vm))
    return (kf.transpose(-1, -2) @ vm).sum(2)


def kernelized_sum_cross_summary(k: Tensor, v: Tensor, *, key_mask: Tensor | None = None,
                                 feature_map: str = "elu") -> KernelizedSumCrossSummary:
    """The sums of the keys and masked values (B, H, Lk, .) for `kernelized_sum_cross_step`, in O(Lk D Dv)."""
    dtype = compute_dtype(k.dtype)
    phi = get_feature_map(feature_map)
    return KernelizedSumCrossSummary(sums=_key_sums(phi(k.to(dtype)), _mask_values(v.to(dtype), key_mask)))


def kernelized_sum_cross_step(q: Tensor, summary: KernelizedSumCrossSummary, *, feature_map: str = "elu") -> Tensor:
    """Attention of queries (B, H, n, D) at any positions on the summarised keys: phi(q_i) sums, O(n D Dv) whatever
    the number of keys. Equals `kernelized_sum_attention(q, k, v)` for the keys the summary was built from."""
    if not isinstance(summary, KernelizedSumCrossSummary):
        raise ValueError(f"`summary` must be a KernelizedSumCrossSummary, got {type(summary).__name__}")
    dtype = summary.sums.dtype
    return (get_feature_map(feature_map)(q.to(dtype)) @ summary.sums).to(q.dtype)


__all__ = [
    "KernelizedDecayCrossSummary",
    "KernelizedDecayState",
    "KernelizedSumCrossSummary",
    "chunk_kernelized_decay_attention",
    "kernelized_decay_attention",
    "kernelized_decay_choose_mode",
    "kernelized_decay_cross_step",
    "kernelized_decay_cross_summary",
    "kernelized_decay_initial_state",
    "kernelized_decay_prefill_state",
    "kernelized_decay_step",
    "kernelized_sum_attention",
    "kernelized_sum_cross_step",
    "kernelized_sum_cross_summary",
]
