"""Softmax attention inside the horizon, kernelized attention with a per-head geometric decay beyond it.

With horizon h, p_i = i + query_offset, a decay rate lambda >= 0 per head and phi(x) = elu(x) + 1, the
weight of key j for query i is

    W_ij = exp(q_i.(k_j + rel[r(i, j)]) / sqrt(D))               for |p_i - j| <= h   (Shaw et al.)
    W_ij = phi(q_i).phi(k_j) / D exp(-lambda (|p_i - j| - h))    for |p_i - j| > h

and out_i = sum_j W_ij v_j / sum_j W_ij over the visible keys (j <= p_i when causal, key_mask[j] == 1),
r(i, j) = clip(p_i - j, -h, h) + h. The 2h+1 nearest keys compete through a softmax, so one aligned key can
take almost all the weight, as in softmax attention; distant keys enter through a kernel whose total weight
is bounded by a geometric series, so it does not grow with the length of the input. The kernel is divided by
D so that, at initialisation (q, k near 0), a distant key weighs about as much as a near one (phi(0) = 1,
exp(0) = 1) rather than D times more. Every weight is positive and the row normaliser is exact.

Each row is computed with all its weights multiplied by exp(-m_i), m_i the larger of the row's largest band logit and
the log of its weight beyond the band (`ops_common.row_shift`): the ratio is unchanged, no term exceeds 1 and the
largest is 1, so that rows neither overflow nor vanish. Hundreds of positions from every visible key, at a fast decay (a
target far longer than its source, in cross attention, or a long gap of hidden keys), each weight beyond the band falls
below the compute dtype's range while the row, a ratio, does not: the quadratic path and the cross-attention decoding
step sum those weights relative to the row's largest decay and keep them. (The self-attention decoding step reads every
visible token's own key in its band; a hidden token's row far past every visible key, whose output no generation reads,
gets nothing beyond the band.) The Triton kernels form every weight beyond the band relative to the row's shift (each
block's decayed sums relative to the last visible key before it) and keep every row at any distance. The PyTorch chunked
path computes the rows without a visible key in their band (past every key, past a padded row's last visible key, before
its first, inside a gap of hidden keys) from the keys' decayed sums at the visible keys around them
(`_rows_beyond_the_keys`), exact at any distance; on CUDA (without the kernels) only the rows past every key, since a
padded row's edges would be read on the host. Its decayed sums underflow, and it gives any other row whose sum beyond
the band is below a floor near the dtype's smallest normal number (on CUDA, past a padded row's last key within the
keys' length, or inside a gap) none there (`ops_common.tails_above_floor`), where exp(-m) would make the gradients inf
and NaN.

The algorithm is linear in length: the band is a local softmax over 2h+1 keys per query, by blocks of
queries; the tail is `ops_decay.decayed_tails` (a decayed linear attention by chunks, anticausal by reversal),
computed first, since its row sums enter m_i, and scaled by exp(-m_i). Time O(L (C + h) (D + Dv) + L D Dv),
memory O(L (D + Dv) + (L / C) D Dv) per head, C the chunk size. Both parts work on groups of batch*head rows
and keep every temporary about `BLOCK_ELEMENTS` large, so that long inputs do not pay for fresh pages: the
band's backward is written by hand (`_LocalSoftmaxBand`, which saves its inputs, output and m_i and
recomputes the weights), the tails are recomputed group by group in backward (`ops_common.grouped_rows`).
The decoding state (`LocalSoftmaxDecayState`) keeps the last h keys and values and the decayed tail sum:
constant size. Cross attention's summary (`LocalSoftmaxDecayCrossSummary`) keeps the source's keys and values and
their decayed sums by chunks, so that a decoding step reads the chunks around its band and two sums, whatever the
source's length. On CUDA, with Triton, the linear path runs in the kernels of `ops_local_softmax_triton` (band,
tails and normaliser together, by blocks of queries and chunks of keys) and the one-token decoding steps in one
kernel each (cross attention's reads every key, and its summary keeps only the keys and values).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
from torch import Tensor

from .ops_common import (
    BLOCK_ELEMENTS,
    DEFAULT_CHUNK_SIZE,
    augment_values,
    check_attention_inputs,
    compute_dtype,
    elu_feature_map,
    grouped_rows,
    head_table,
    row_shift,
    row_table,
    shift_scale,
    tails_above_floor,
)
from .ops_common import normalise as normalise_rows
from .ops_decay import (
    KernelizedDecayCrossSummary,
    band_windows,
    check_decay,
    check_decay_step,
    decayed_prefill,
    decayed_tails,
    decayed_window_steps,
    kernelized_decay_choose_mode,
    resolve_horizon,
)
from .ops_naive import naive_local_softmax_decay_attention, naive_local_softmax_decay_weights


class _Band(NamedTuple):
    """How the band of one call is cut: queries in blocks of `chunk`, each block with W = C + 2h window keys."""

    horizon: int
    offset: int
    causal: bool
    chunk: int
    n_blocks: int
    keep: Tensor  # (C, W): the pair is in the band (and j <= p_i when causal)
    rel_index: Tensor  # (C, W): its row of the relative table


def _band(lq: int, horizon: int, offset: int, causal: bool, chunk: int, device) -> _Band:
    c = torch.arange(chunk, device=device)[:, None]
    t = c + horizon - torch.arange(chunk + 2 * horizon, device=device)[None, :]  # offset p_i - j, see band_windows
    keep = (t.abs() <= horizon) & ((t >= 0) if causal else True)
    return _Band(horizon, offset, causal, chunk, -(-lq // chunk), keep, t.clamp(-horizon, horizon) + horizon)


def _block_steps(band: _Band, rows: int, dim: int, value_dim: int):
    """(r0, r1, b0, b1): groups of rows and of query blocks whose temporaries hold about BLOCK_ELEMENTS: per
    block, the (C, W) weights and the W window keys and values."""
    width = band.keep.shape[1]
    per_block, n_blocks = band.chunk * width + width * (dim + value_dim), band.n_blocks
    group = max(1, min(rows, BLOCK_ELEMENTS // max(1, n_blocks * per_block)))
    step = max(1, BLOCK_ELEMENTS // max(1, group * per_block))
    for r0 in range(0, rows, group):
        for b0 in range(0, n_blocks, step):
            yield r0, min(rows, r0 + group), b0, min(n_blocks, b0 + step)


def _band_weights(q: Tensor, k: Tensor, vm: Tensor, table: Tensor | None, m: Tensor | None, tail_sum: Tensor | None,
                  band: _Band, blocks: tuple[int, int]):
    """exp(l_ij - m_i) over the band of query blocks `blocks` of rows (G, L, .), 0 for hidden keys, with
    l_ij = q_i.(k_j + rel[r]) / sqrt(D). m_i (G, nb, C, 1) is given, or computed as `ops_common.row_shift` of
    the band logits and `tail_sum` (G, nb, C, 1). A key is visible in the band when it exists and is unmasked
    (the last channel of `vm`, [m v, m], is 1). Returns (weights, m, qb, kw, vw, index)."""
    qb, kw, vw, index, _ = band_windows(q, k, vm, band.horizon, band.offset, band.chunk, blocks)
    logits = qb @ kw.transpose(-1, -2)  # (G, nb, C, W)
    if table is not None:
        weights = qb @ table[:, None].transpose(-1, -2)  # (G, nb, C, 2h+1)
        logits += weights.gather(-1, band.rel_index.expand(*weights.shape[:2], -1, -1))
    keep = band.keep & (vw[..., -1] > 0)[..., None, :]
    logits = torch.where(keep, logits / math.sqrt(q.shape[-1]), float("-inf"))
    if m is None:
        m = row_shift(logits, tail_sum)
    return torch.exp(logits - m), m, qb, kw, vw, index


def _rows_of(x: Tensor, band: _Band, blocks: tuple[int, int]) -> Tensor:
    """Rows (G, L, F) of the query blocks `blocks` as (G, nb, C, F), zero-padded after the last query."""
    b0, b1 = blocks
    rows = x[:, b0 * band.chunk:b1 * band.chunk]
    rows = torch.nn.functional.pad(rows, (0, 0, 0, (b1 - b0) * band.chunk - rows.shape[1]))
    return rows.view(x.shape[0], b1 - b0, band.chunk, -1)


class _LocalSoftmaxBand(torch.autograd.Function):
    """out_i = (sum over the band of exp(l_ij - m_i) [m v_j, m_j] + exp(-m_i) tail_i) normalised by its last
    channel, on rows (B*H, L, .) in blocks (`_block_steps`); `tail` (B*H, Lq, Dv+1) is the row's sum beyond
    the band. q and k come in the op's input dtype and are converted to vm's, the compute dtype. Saves the
    inputs, the output and m_i, and recomputes the band in backward: autograd would keep every (C, W) block of
    every row alive."""

    @staticmethod
    def forward(ctx, q_in, k_in, vm, table, tail, band: _Band):
        q, k = q_in.to(vm.dtype), k_in.to(vm.dtype)
        rows, lq, _ = q.shape
        out = q.new_empty(rows, lq, vm.shape[-1] - 1)
        shift = q.new_empty(rows, lq, 1)
        den = q.new_empty(rows, lq, 1)
        for r0, r1, b0, b1 in _block_steps(band, rows, q.shape[-1], vm.shape[-1]):
            blocks = (b0, b1)
            tail_rows = _rows_of(tail[r0:r1], band, blocks)
            weights, m, _, _, vw, _ = _band_weights(q[r0:r1], k[r0:r1], vm[r0:r1], None if table is None else
                                                    table[r0:r1], None, tail_rows[..., -1:], band, blocks)
            sums = weights @ vw + shift_scale(m) * tail_rows
            lo, hi = b0 * band.chunk, min(b1 * band.chunk, lq)
            for target, value in ((out, normalise_rows(sums[..., :-1], sums[..., -1:])), (shift, m),
                                  (den, sums[..., -1:])):
                target[r0:r1, lo:hi] = value.reshape(r1 - r0, -1, value.shape[-1])[:, :hi - lo]
        ctx.save_for_backward(q_in, k_in, vm, table, out, shift, den)
        ctx.band = band
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q_in, k_in, vm, table, out, shift, den = ctx.saved_tensors
        q, k = q_in.to(vm.dtype), k_in.to(vm.dtype)
        band = ctx.band
        scale = 1.0 / math.sqrt(q.shape[-1])
        # out = num / den: d num = g / den, d den = -(g . out) / den; 0 on rows without a visible key
        inv = torch.where(den > 0, 1.0 / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))
        grad_sums = torch.cat([grad_out, -(grad_out * out).sum(-1, keepdim=True)], dim=-1) * inv
        grad_tail = shift_scale(shift) * grad_sums
        dq, dk, dvm = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(vm)
        dtable = None if table is None else torch.zeros_like(table)
        for r0, r1, b0, b1 in _block_steps(band, q.shape[0], q.shape[-1], vm.shape[-1]):
            blocks = (b0, b1)
            tab = None if table is None else table[r0:r1]
            weights, _, qb, kw, vw, index = _band_weights(q[r0:r1], k[r0:r1], vm[r0:r1], tab,
                                                          _rows_of(shift[r0:r1], band, blocks), None, band, blocks)
            gs = _rows_of(grad_sums[r0:r1], band, blocks)  # (G, nb, C, Dv+1)
            dlogits = weights * (gs @ vw.transpose(-1, -2)) * scale  # (G, nb, C, W)
            dqb = dlogits @ kw
            if tab is not None:
                drel = torch.zeros(*dlogits.shape[:-1], tab.shape[1], dtype=q.dtype, device=q.device)
                drel.scatter_add_(-1, band.rel_index.expand(*dlogits.shape[:2], -1, -1), dlogits)
                dqb += drel @ tab[:, None]
                dtable[r0:r1] += drel.flatten(1, 2).transpose(-1, -2) @ qb.flatten(1, 2)
            dk[r0:r1].index_add_(1, index, (dlogits.transpose(-1, -2) @ qb).flatten(1, 2))
            dvm[r0:r1].index_add_(1, index, (weights.transpose(-1, -2) @ gs).flatten(1, 2))
            lo, hi = b0 * band.chunk, min(b1 * band.chunk, q.shape[1])
            dq[r0:r1, lo:hi] = dqb.flatten(1, 2)[:, :hi - lo]
        return dq.to(q_in.dtype), dk.to(k_in.dtype), dvm, dtable, grad_tail, None


def _triton_entry(device: torch.device, name: str):
    """`ops_local_softmax_triton.<name>` for `device` on CUDA when Triton is installed, None otherwise."""
    if device.type != "cuda":
        return None
    try:
        from . import ops_local_softmax_triton
    except ImportError:
        return None
    return getattr(ops_local_softmax_triton, name)


def _attention_function(device: torch.device, horizon: int, dim: int, value_dim: int, dtype: torch.dtype):
    """The linear path's Triton kernels for `device` (`ops_local_softmax_triton.local_softmax_decay`) on CUDA when
    Triton is installed and the kernels take the horizon and head dimensions for inputs of `dtype`, or None (the band
    then runs in `_LocalSoftmaxBand` and the tails in `ops_decay.decayed_tails`; on CUDA, with a warning the first
    time for each reason)."""
    if device.type != "cuda":
        return None
    fits = _triton_entry(device, "fits")
    if fits is None:
        _warn_pytorch_path(device, "Triton is not installed (`pip install triton`, or the package's `gpu` extra)")
        return None
    if not fits(horizon, dim, value_dim, dtype):
        limits = _triton_entry(device, "MAX_HORIZON"), _triton_entry(device, "max_dim")(dtype)
        _warn_pytorch_path(device, f"its Triton kernels take h <= {limits[0]} and head dimensions D, Dv <= "
                                   f"{limits[1]} for {dtype}, got h={horizon}, D={dim}, Dv={value_dim}")
        return None
    return _triton_entry(device, "local_softmax_decay")


_WARNED_PYTORCH_PATHS: set[str] = set()


def _warn_pytorch_path(device: torch.device, reason: str) -> None:
    """Warn, once per reason, that the default attention runs its PyTorch path on `device` (an accelerator), whose
    loops over blocks of rows and chunks were written for CPU caches, instead of the Triton kernels; not while
    torch.compile traces."""
    if torch.compiler.is_compiling() or reason in _WARNED_PYTORCH_PATHS:
        return
    _WARNED_PYTORCH_PATHS.add(reason)
    warnings.warn(f"the default attention (local_softmax_decay) runs its PyTorch path on {device.type}, not its "
                  f"Triton kernels: {reason}", stacklevel=3)


def local_softmax_decay_is_operator(device: torch.device, horizon: int, dim: int, value_dim: int,
                                    dtype: torch.dtype) -> bool:
    """Whether `local_softmax_decay_attention` (linear or auto mode) runs on `device`, for inputs of `dtype`, as
    `torch.library` operators (the Triton kernels' forward and backward, `_attention_function`), which torch.compile
    can trace a model around instead of compiling the PyTorch path's loops over blocks and chunks."""
    return _attention_function(device, horizon, dim, value_dim, dtype) is not None


def _decode_function(device: torch.device):
    """The one-token decoding step's kernel for `device` (`ops_local_softmax_triton.decode_step`), or None (the
    step then runs in PyTorch)."""
    return _triton_entry(device, "decode_step")


def _cross_decode_function(device: torch.device):
    """The cross-attention decoding step's kernel for `device` (`ops_local_softmax_triton.cross_decode`), or None
    (the step then computes the reference's weights in PyTorch)."""
    return _triton_entry(device, "cross_decode")


def _differentiable(*tensors: Tensor | None) -> bool:
    """Whether autograd records operations on `tensors` (the decoding kernels have no backward)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _visible_edges(visible: Tensor) -> tuple[Tensor, Tensor]:
    """(first, last) (B,): each batch row's first and last visible key of `visible` (B, Lk), Lk and -1 for a batch row
    without one."""
    index = torch.arange(visible.shape[1], device=visible.device)
    return torch.where(visible, index, visible.shape[1]).amin(-1), torch.where(visible, index, -1).amax(-1)


def _sums_around(features: Tensor, values: Tensor, rate: Tensor, edge: Tensor) -> Tensor:
    """sum_j exp(-lambda |e - j|) phi(k_j) values_j^T (B, H, D, Dv+1) for features phi(k) (B, H, Lk, D), values
    (B, H, Lk, Dv+1), rates (H,) and a key e (B,) of each batch row: the keys as seen from e, whose own weight is 1."""
    index = torch.arange(features.shape[2], device=features.device)
    distance = (edge[:, None] - index).abs().to(features.dtype)  # (B, Lk)
    weight = torch.exp(-rate[:, None] * distance[:, None])  # (B, H, Lk)
    return (features * weight[..., None]).transpose(-1, -2) @ values


def _edges_on_host(device: torch.device) -> bool:
    """Whether `_rows_beyond_the_keys` reads each batch row's visible keys (first, last, the edges of its gaps) from
    the mask on the host: not on CUDA (the PyTorch path there, where the kernels do not run), where the copy would wait
    for every queued kernel and stall the launches."""
    return device.type != "cuda"


def _edge_sums(features: Tensor, values: Tensor, rate: Tensor, edges: list[int], *, reverse: bool) -> dict[int, Tensor]:
    """S_e = sum_{j <= e} exp(-lambda (e - j)) phi(k_j) values_j^T (1, H, D, Dv+1) at each visible key e of `edges`
    (`reverse`: over j >= e, with exp(-lambda (j - e))), from one batch row's features phi(k) (1, H, Lk, D) and values
    (1, H, Lk, Dv+1), by one walk over the keys: each edge's sum is the previous edge's decayed to it plus the keys
    between them (`_sums_around`). Each weighs its own key by 1, so that no sum underflows."""
    sums, state, previous = {}, None, features.shape[2] if reverse else -1
    for edge in sorted(set(edges), reverse=reverse):
        keys = slice(edge, previous) if reverse else slice(previous + 1, edge + 1)
        at = torch.tensor([0 if reverse else edge - previous - 1], device=features.device)
        local = _sums_around(features[:, :, keys], values[:, :, keys], rate, at)
        state = local if state is None else local + state * torch.exp(-rate * abs(edge - previous))[:, None, None]
        sums[edge], previous = state, edge
    return sums


def _rows_between(q: Tensor, before: Tensor | None, after: Tensor | None,
                  exponents: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Rows q (B, H, R, D) whose visible keys all lie beyond their band: those up to the key e before them, with the
    sums `before` (B, H, D, Dv+1) at e (`_edge_sums`, `_sums_around`), and those from the key f after them, with the
    sums `after` at f (either may be None). One side's common factor, exp(-lambda (p_i - h - e)) or
    exp(-lambda (f - p_i - h)), cancels in the row's ratio phi(q_i) S / phi(q_i) s (s the last column); with both,
    their logs `exponents` ((H, R) each) weigh the two relative to the larger. Exact at any distance; 0 for a row
    without a visible key."""
    features = elu_feature_map(q.to((before if after is None else after).dtype))
    if before is None or after is None:
        sums = features @ (after if before is None else before)
    else:
        top = torch.maximum(*exponents)
        sums = sum((features @ side) * torch.exp(exponent - top)[..., None]
                   for side, exponent in zip((before, after), exponents))
    return normalise_rows(sums[..., :-1], sums[..., -1:])


def _rows_beyond_the_keys(out: Tensor, q: Tensor, k: Tensor, v: Tensor, decay: Tensor, *, causal: bool,
                          key_mask: Tensor | None, query_offset: int, horizon: int) -> Tensor:
    """`out`, the PyTorch path's output (the kernels keep these rows themselves), with the rows that have no visible
    key in their band replaced by their exact value: the rows past their batch row's last visible key (p_i - h > e),
    inside a gap of hidden keys (e < p_i - h, and p_i + h < f, or p_i < f when causal, e and f the visible keys around
    the gap) and, without causality, before its first visible key (p_i + h < f).

    Such a row's weights beyond its band share the factors exp(-lambda (p_i - h - e)) on the keys up to e and
    exp(-lambda (f - p_i - h)) on the keys from f, which the row's ratio cancels but for their ratio (`_rows_between`):
    out_i is exact from the keys' decayed sums at e and f (`_edge_sums`; `_sums_around` at each batch row's last visible
    key on CUDA), whose largest weight is 1. The chunked sums carry those factors, and underflow once they pass the
    dtype's range (a target longer than its source by hundreds of positions, or a gap as long, at a fast decay); the
    edges' sums do not. O(D Dv) per such row and O(Lk D Dv) per batch row that has some, nothing where there are none;
    differentiable by autograd. The edges are read from `key_mask` on the host, where that costs nothing; on CUDA, where
    it would stall the launches, only the rows past every key (p_i - h > Lk - 1, known from the shapes) are replaced,
    and the others keep the chunked sums (`_edges_on_host`).
    """
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    dtype = compute_dtype(q.dtype)
    rate = decay.to(dtype)
    if key_mask is None or not _edges_on_host(q.device):
        first = max(lk + horizon - query_offset, 0)
        if first >= lq:
            return out
        last = q.new_full((b,), lk - 1, dtype=torch.long) if key_mask is None else _visible_edges(key_mask.bool())[1]
        summary = _sums_around(elu_feature_map(k.to(dtype)), augment_values(v.to(dtype), key_mask), rate, last)
        out = out.clone()  # in out's layout, which the kernels choose so that merging the heads is a view
        out[:, :, first:] = _rows_between(q[:, :, first:], summary, None)
        return out
    hidden = horizon + 1 if causal else 2 * horizon + 1  # hidden keys in a row that leave a band without a visible key

    def rows(lo: int, hi: int) -> tuple[int, int]:
        return min(max(lo - query_offset, 0), lq), min(max(hi - query_offset, 0), lq)

    visible = key_mask.bool()
    pairs = visible.nonzero()  # (row, key) of every visible key, by row, then key
    wide = (pairs[1:, 0] == pairs[:-1, 0]) & (pairs[1:, 1] - pairs[:-1, 1] > hidden)
    gaps = {}  # row -> [(e, f)]: the visible keys around each gap whose rows' bands can hold no visible key
    for row, e, f in torch.cat([pairs[:-1][wide], pairs[1:, 1:][wide]], 1).tolist():
        gaps.setdefault(row, []).append((e, f))
    result = out
    for row, (first, last) in enumerate(zip(*(edge.tolist() for edge in _visible_edges(visible)))):
        if last < 0:
            continue  # no visible key: the row is 0
        # (rows, the visible key before them, the one after): before the first, inside each wide gap, past the last
        spans = [] if causal else [(rows(0, first - horizon), None, first)]
        spans += [(rows(e + horizon + 1, f if causal else f - horizon), e, None if causal else f)
                  for e, f in gaps.get(row, [])]
        spans.append((rows(last + horizon + 1, lq + query_offset), last, None))
        spans = [span for span in spans if span[0][1] > span[0][0]]
        if not spans:
            continue
        seen = slice(first, last + 1)  # the batch row's keys first..last (the others are hidden), edges from first
        features = elu_feature_map(k[row:row + 1, :, seen].to(dtype))
        values = augment_values(v[row:row + 1, :, seen].to(dtype), key_mask[row:row + 1, seen])
        before = _edge_sums(features, values, rate, [e - first for _, e, _ in spans if e is not None], reverse=False)
        after = _edge_sums(features, values, rate, [f - first for _, _, f in spans if f is not None], reverse=True)
        result = out.clone() if result is out else result  # in out's layout
        for (lo, hi), e, f in spans:
            exponents = None
            if e is not None and f is not None:  # inside a gap: the two sides' weights
                positions = torch.arange(lo + query_offset, hi + query_offset, device=q.device, dtype=dtype)
                exponents = -rate[:, None] * (positions - horizon - e), -rate[:, None] * (f - positions - horizon)
            result[row:row + 1, :, lo:hi] = _rows_between(
                q[row:row + 1, :, lo:hi], None if e is None else before[e - first],
                None if f is None else after[f - first], exponents)
    return result


def chunk_local_softmax_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, horizon: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """The linear algorithm of `local_softmax_decay_attention` (local softmax band plus decayed kernel tails,
    see the module docstring). Differentiable: the band by `_LocalSoftmaxBand`, the tails by autograd,
    recomputed by groups of rows. On CUDA the whole of it runs in the Triton kernels of
    `ops_local_softmax_triton` (`_attention_function`), in blocks of their own size."""
    h = resolve_horizon(rel, horizon)
    b, heads, lq, d = q.shape
    lk = k.shape[2]
    kernels = _attention_function(q.device, h, d, v.shape[-1], q.dtype)
    if kernels is not None:  # exact at any distance from the keys: their states keep exponents of their own
        return kernels(q, k, v, head_table(rel, heads, q.dtype), decay, causal=causal, key_mask=key_mask,
                       query_offset=query_offset, horizon=h)
    dtype = compute_dtype(q.dtype)
    vm = augment_values(v.to(dtype), key_mask)
    chunk = max(chunk_size, 1)

    def tails(q, k, vm, rate):  # rows (G, 1, L, .) of (B * H, 1, L, .), rate (G,)
        q, k, vm = (x.transpose(0, 1) for x in (q, k, vm))
        x, y = elu_feature_map(q.to(dtype)) / d, elu_feature_map(k.to(dtype))
        return decayed_tails(x, y, vm, rate, h, query_offset, chunk, causal=causal).transpose(0, 1)

    # the tails and the band take q and k as they are and compute in `dtype`
    rows = [x.reshape(b * heads, 1, x.shape[2], x.shape[3]) for x in (q, k, vm)]
    tail = grouped_rows(tails, max(lq, lk) * (chunk + d + vm.shape[-1]), *rows, decay.to(dtype).repeat(b))
    tail = tails_above_floor(tail, tail[..., -1:])
    band = _band(lq, h, query_offset, causal, chunk, q.device)
    out = _LocalSoftmaxBand.apply(q.reshape(b * heads, lq, d), k.reshape(b * heads, -1, d),
                                  vm.reshape(b * heads, -1, vm.shape[-1]), row_table(rel, b, heads, dtype),
                                  tail.reshape(b * heads, lq, -1), band)
    return _rows_beyond_the_keys(out.view(b, heads, lq, -1).to(q.dtype), q, k, v, decay, causal=causal,
                                 key_mask=key_mask, query_offset=query_offset, horizon=h)


def local_softmax_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
    horizon: int | None = None,
) -> Tensor:
    """Softmax attention over the 2h+1 nearest keys, decayed kernelized attention beyond them, under one row
    normaliser; exact and linear in length (see the module docstring for the formula).

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq (cross attention).
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        rel (`Tensor` of shape `(H, 2h+1, D)` or `(2h+1, D)`, *optional*): relative key embeddings of the band,
            row r for relative position r - h. Without it the band logits are q_i.k_j / sqrt(D), and
            `horizon` must be given.
        decay (`Tensor` of shape `(H,)`): decay rate lambda >= 0 per head, per position beyond the horizon.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= p_i.
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): absolute position of the first query.
        mode (`str`, defaults to `"auto"`): `"naive"` (quadratic reference), `"linear"` (local band plus
            chunked decayed tails, O(L) time and memory) or `"auto"` (the linear path's Triton kernels where they
            run, on CUDA, at any length; elsewhere the cheaper, by the cost model of
            `kernelized_decay_choose_mode`).
        horizon (`int`, *optional*): h; read from `rel` when omitted.

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype; a row with no visible key is 0. Half precision
        accumulates in float32.
    """
    check_attention_inputs(q, k, v, rel, key_mask, query_offset, mode)
    check_decay(decay, q.shape[1], q.dtype)
    h = resolve_horizon(rel, horizon)
    if mode == "auto" and _attention_function(q.device, h, q.shape[-1], v.shape[-1], q.dtype) is not None:
        mode = "linear"  # the Triton kernels: a handful of launches at any length, where the quadratic path has dozens
    elif mode == "auto":
        mode = kernelized_decay_choose_mode(
            q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], h, causal=causal, batch_heads=q.shape[0] * q.shape[1]
        )
    if mode == "naive":
        return naive_local_softmax_decay_attention(
            q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=query_offset, horizon=h
        )
    return chunk_local_softmax_decay_attention(
        q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=query_offset, horizon=h
    )


# ------------------------------------------------------------------------------------------------ decoding


class LocalSoftmaxDecayState(NamedTuple):
    """Recurrent state of causal local-softmax decay attention after `seen` tokens (positions 0..seen-1).

    Fields:
        keys (`Tensor` of shape `(B, H, h, D)`): the keys k_j of the last h tokens, oldest first; zero rows
            stand for positions before the start (their values are zero, normaliser channel included).
        values (`Tensor` of shape `(B, H, h, Dv+1)`): [m_j v_j, m_j] of the same tokens.
        tail (`Tensor` of shape `(B, H, D, Dv+1)`): sum over j <= seen - h - 1 of
            exp(-lambda (seen - h - 1 - j)) phi(k_j) values_j^T.
        seen (`int`): number of tokens seen, the position of the next token.
    """

    keys: Tensor
    values: Tensor
    tail: Tensor
    seen: int


def local_softmax_decay_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, horizon: int, *, dtype: torch.dtype, device=None
) -> LocalSoftmaxDecayState:
    """The empty state (no token seen); accumulates in `compute_dtype(dtype)`."""
    dtype = compute_dtype(dtype)
    return LocalSoftmaxDecayState(
        keys=torch.zeros(batch, heads, horizon, dim, dtype=dtype, device=device),
        values=torch.zeros(batch, heads, horizon, value_dim + 1, dtype=dtype, device=device),
        tail=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        seen=0,
    )


def local_softmax_decay_prefill_state(
    k: Tensor, v: Tensor, decay: Tensor, *, horizon: int, key_mask: Tensor | None = None
) -> LocalSoftmaxDecayState:
    """The state after the tokens k, v (B, H, L, .) at positions 0..L-1, in O(L D Dv) time."""
    dtype = compute_dtype(k.dtype)
    kc = k.to(dtype)
    keys, values, tail = decayed_prefill(kc, elu_feature_map(kc), augment_values(v.to(dtype), key_mask), decay, horizon)
    length = k.shape[2]
    return LocalSoftmaxDecayState(keys=keys, values=values, tail=tail, seen=length)


def local_softmax_decay_step(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None, decay: Tensor, state: LocalSoftmaxDecayState,
    *, key_mask: Tensor | None = None, horizon: int | None = None,
) -> tuple[Tensor, LocalSoftmaxDecayState]:
    """Causal attention of n new tokens on the past summarised by `state`, and the updated state.

    q, k, v have shape (B, H, n, .) and sit at positions state.seen .. state.seen + n - 1; `key_mask` (B, n)
    masks new tokens only. The result equals the matching rows of
    `local_softmax_decay_attention(..., causal=True)` over the whole sequence; the state keeps its size. On CUDA
    one token without autograd (generation) runs in one Triton launch (`_decode_function`).
    """
    h = check_decay_step(q, k, v, rel, decay, state, LocalSoftmaxDecayState, key_mask, horizon, q.shape[-1],
                         v.shape[-1] + 1)
    dtype = state.tail.dtype
    d = q.shape[-1]
    table = head_table(rel, q.shape[1], dtype)

    def read(qi, keys, values, far):  # raw q_i (B, H, 1, D) and keys
        logits = qi @ keys.transpose(-1, -2)
        if table is not None:
            # window key w sits at offset h - w: table row 2h - w
            logits = logits + (qi @ table.transpose(-1, -2)[None])[..., h:].flip(-1)
        logits = torch.where(values[..., -1:].transpose(-1, -2) > 0, logits / math.sqrt(d), float("-inf"))
        far = elu_feature_map(qi) @ far / d
        far = tails_above_floor(far, far[..., -1:])  # a hidden token far past the visible keys
        m = row_shift(logits, far[..., -1:])
        return torch.exp(logits - m) @ values + shift_scale(m) * far

    vm = augment_values(v.to(dtype), key_mask)
    decode = _decode_function(q.device)
    if decode is not None and q.shape[2] == 1 and not _differentiable(q, k, v, rel, decay, state.tail):
        # one token without autograd (generation): one kernel launch instead of some forty small operations
        out, keys, values, tail = decode(q.to(dtype), k.to(dtype), vm, table, torch.exp(-decay.to(dtype)), state.keys,
                                         state.values, state.tail)
        return out.to(q.dtype), LocalSoftmaxDecayState(keys=keys, values=values, tail=tail, seen=state.seen + 1)
    out, keys, values, tail = decayed_window_steps(q.to(dtype), k.to(dtype), vm, state, decay, read, elu_feature_map)
    out = normalise_rows(out[..., :-1], out[..., -1:]).to(q.dtype)
    return out, LocalSoftmaxDecayState(keys=keys, values=values, tail=tail, seen=state.seen + q.shape[2])


CROSS_CHUNK = 256  # keys per chunk of a cross summary's decayed sums


class LocalSoftmaxDecayCrossSummary(NamedTuple):
    """The fixed keys of cross attention for `local_softmax_decay_cross_step`, with their decayed sums by chunks of C
    keys, so that a decoding step reads the window of chunks around its band and two sums instead of every key.

    With n = ceil(Lk / C) and values_j = [m_j v_j, m_j] (m the key mask):

    Fields:
        keys (`Tensor` of shape `(B, H, Lk, D)`): the keys.
        values (`Tensor` of shape `(B, H, Lk, Dv+1)`): [m_j v_j, m_j].
        before (`Tensor` of shape `(B, H, n+1, D, Dv+1)`): sum over j < cC of exp(-lambda (cC - j)) phi(k_j)
            values_j^T: the keys before chunk c as seen from position cC.
        after (`Tensor` of shape `(B, H, n+1, D, Dv+1)`): sum over j >= cC of exp(-lambda (j - cC + 1)) phi(k_j)
            values_j^T: the keys from chunk c on as seen from position cC - 1.
        past (`Tensor` of shape `(B, H, D, Dv+1)`): sum over j of exp(-lambda |e - j|) phi(k_j) values_j^T, e the
            batch row's last visible key: what a query past every visible key reads, its common decay cancelled.
        ahead (`Tensor` of shape `(B, H, D, Dv+1)`): the same around s, the batch row's first visible key, for a
            query before every visible key.
        last (`Tensor` of shape `(B,)`): e, -1 for a batch row with no visible key.
        first (`Tensor` of shape `(B,)`): s, Lk for a batch row with no visible key.
        chunk (`int`): C.
    """

    keys: Tensor
    values: Tensor
    before: Tensor
    after: Tensor
    past: Tensor
    ahead: Tensor
    last: Tensor
    first: Tensor
    chunk: int


def local_softmax_decay_cross_summary(
    k: Tensor, v: Tensor, decay: Tensor, *, key_mask: Tensor | None = None, chunk_size: int = CROSS_CHUNK,
) -> LocalSoftmaxDecayCrossSummary | KernelizedDecayCrossSummary:
    """What `local_softmax_decay_cross_step` keeps of the keys k and values v (B, H, Lk, .) of cross attention at the
    decay rates `decay` (H,), which its steps must use too: the keys and masked values, and on CPU their decayed sums
    by chunks of `chunk_size` keys (`LocalSoftmaxDecayCrossSummary`), built in O(Lk D Dv) and holding 2 (Lk / C + 2)
    D (Dv + 1) more numbers per head; on CUDA, where one kernel reads every key, the keys and values only
    (`KernelizedDecayCrossSummary`)."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive int, got {chunk_size!r}")
    check_decay(decay, k.shape[1], k.dtype)
    dtype = compute_dtype(k.dtype)
    keys, values = k.to(dtype), augment_values(v.to(dtype), key_mask)
    if _cross_decode_function(k.device) is not None:
        return KernelizedDecayCrossSummary(keys=keys, values=values)
    b, heads, lk, d = keys.shape
    n = -(-lk // chunk_size)
    rates = decay.to(dtype)
    rate = rates[:, None]  # (H, 1)
    position = torch.arange(chunk_size, device=k.device, dtype=dtype)
    phi = elu_feature_map(keys)
    features = torch.nn.functional.pad(phi, (0, 0, 0, n * chunk_size - lk)).view(b, heads, n, chunk_size, d)
    chunked = torch.nn.functional.pad(values, (0, 0, 0, n * chunk_size - lk)).view(b, heads, n, chunk_size, -1)
    # each chunk's keys as seen from the start of the next chunk, and from the position before their own
    to_end = features * torch.exp(-rate * (chunk_size - position))[None, :, None, :, None]
    to_start = features * torch.exp(-rate * (position + 1))[None, :, None, :, None]
    local_before = to_end.transpose(-1, -2) @ chunked  # (B, H, n, D, Dv+1)
    local_after = to_start.transpose(-1, -2) @ chunked
    carry = torch.exp(-rates * chunk_size)[None, :, None, None]
    before = keys.new_zeros(b, heads, n + 1, d, values.shape[-1])
    after = torch.zeros_like(before)
    for c in range(n):
        before[:, :, c + 1] = carry * before[:, :, c] + local_before[:, :, c]
        after[:, :, n - 1 - c] = carry * after[:, :, n - c] + local_after[:, :, n - 1 - c]
    first, last = _visible_edges(values[:, 0, :, -1] > 0)
    return LocalSoftmaxDecayCrossSummary(
        keys=keys, values=values, before=before, after=after, past=_sums_around(phi, values, rates, last),
        ahead=_sums_around(phi, values, rates, first), last=last, first=first, chunk=chunk_size)


def _windowed_cross_step(q: Tensor, table: Tensor | None, decay: Tensor, summary: LocalSoftmaxDecayCrossSummary,
                         position: int, h: int) -> Tensor:
    """One query per batch row and head (B, H, 1, D) at `position` on the summary's keys: the keys of the chunks
    that hold its band's edges (at most 2C + 2h + 1), and the decayed sums of the chunks before and after them, each
    taken to the band's edge by its decay. A row past every visible key (or before every one) reads `past` (`ahead`),
    its factor exp(-lambda (|p - e| - h)), which may lie below the dtype's range, cancelled by its ratio. O((C + h)
    (D + Dv) + D Dv) per head, whatever the number of keys."""
    dtype = summary.keys.dtype
    d = q.shape[-1]
    lk, chunk, n = summary.keys.shape[2], summary.chunk, summary.before.shape[2] - 1
    start, end = position - h, position + h + 1  # the band: keys start .. end - 1
    c0 = min(max(start, 0) // chunk, n)  # `before` holds the keys before chunk c0
    c1 = min(-(-end // chunk), n)  # `after` the keys from chunk c1 on
    lo, hi = c0 * chunk, min(c1 * chunk, lk)
    if hi <= lo:  # past every key: the row reads `past`
        return _beyond_the_keys(elu_feature_map(q), summary, start, end,
                                q.new_zeros(*q.shape[:3], summary.values.shape[-1] - 1))
    keys, values = summary.keys[:, :, lo:hi], summary.values[:, :, lo:hi]
    index = torch.arange(lo, hi, device=q.device)
    distance = (position - index).abs()
    visible = values[..., -1] > 0  # (B, H, W)
    band = (distance <= h) & visible
    logits = q @ keys.transpose(-1, -2)  # (B, H, 1, W)
    if table is not None:
        offsets = (position - index).clamp(-h, h) + h  # table row of each key
        logits = logits + (q @ table.transpose(-1, -2)[None])[..., offsets]
    logits = torch.where(band[:, :, None], logits / math.sqrt(d), float("-inf"))
    rate = decay.to(dtype)[:, None]  # (H, 1)
    features_q = elu_feature_map(q)
    fq = features_q / d
    kernel = (fq @ elu_feature_map(keys).transpose(-1, -2)) * torch.exp(-rate * (distance - h).clamp(min=0))[:, None]
    tail = (kernel * ((distance > h) & visible)[:, :, None]) @ values  # (B, H, 1, Dv+1)
    if c0 > 0:
        tail = tail + (fq @ summary.before[:, :, c0]) * torch.exp(-rate * (start - lo))[..., None]
    if c1 < n:
        tail = tail + (fq @ summary.after[:, :, c1]) * torch.exp(-rate * (c1 * chunk - end))[..., None]
    m = row_shift(logits, tail[..., -1:])
    sums = torch.exp(logits - m) @ values + shift_scale(m) * tail
    return _beyond_the_keys(features_q, summary, start, end, normalise_rows(sums[..., :-1], sums[..., -1:]))


def _beyond_the_keys(features_q: Tensor, summary: LocalSoftmaxDecayCrossSummary, start: int, end: int,
                     out: Tensor) -> Tensor:
    """`out` (B, H, 1, Dv) with the batch rows whose visible keys all lie before the band start .. end - 1 (or all
    after it) read from `summary.past` (`summary.ahead`); features_q = phi(q)."""
    for sums, beyond in ((summary.past, start > summary.last), (summary.ahead, end <= summary.first)):
        sums = features_q @ sums  # (B, H, 1, Dv+1)
        out = torch.where(beyond[:, None, None, None], normalise_rows(sums[..., :-1], sums[..., -1:]), out)
    return out


def local_softmax_decay_cross_step(
    q: Tensor, rel: Tensor | None, decay: Tensor,
    summary: LocalSoftmaxDecayCrossSummary | KernelizedDecayCrossSummary, *, query_offset: int,
    horizon: int | None = None,
) -> Tensor:
    """Bidirectional attention of queries (B, H, n, D) at positions query_offset.. on the keys of `summary`
    (`local_softmax_decay_cross_summary`, built with the same decay rates, or `ops_decay.kernelized_decay_cross_summary`:
    the keys and [m v, m]).

    Equals `local_softmax_decay_attention(q, k, v, rel, decay, query_offset=query_offset)` for the keys the
    summary was built from. One query without autograd (generation) reads, on CPU, the window of chunks around its
    band and the chunks' decayed sums (`_windowed_cross_step`): O((C + h) (D + Dv) + D Dv) whatever the number of
    keys; on CUDA one Triton launch reads every key (`_cross_decode_function`). Otherwise each query reads every key
    once: O(n Lk (D + Dv)), like softmax cross attention.
    """
    if not isinstance(summary, (LocalSoftmaxDecayCrossSummary, KernelizedDecayCrossSummary)):
        raise ValueError(f"`summary` must be a LocalSoftmaxDecayCrossSummary or a KernelizedDecayCrossSummary, got "
                         f"{type(summary).__name__}")
    dtype = summary.keys.dtype
    h = resolve_horizon(rel, horizon)
    differentiable = _differentiable(q, rel, decay, *summary[:2])
    decode = _cross_decode_function(q.device)
    if decode is not None and not differentiable:
        # without autograd (generation): one kernel launch instead of the reference's some fifty operations
        out = decode(q.to(dtype), summary.keys, summary.values, head_table(rel, q.shape[1], dtype),
                     decay.to(dtype), query_offset, h)
        return out.to(q.dtype)
    if isinstance(summary, LocalSoftmaxDecayCrossSummary) and q.shape[2] == 1 and not differentiable:
        out = _windowed_cross_step(q.to(dtype), head_table(rel, q.shape[1], dtype), decay, summary, query_offset, h)
        return out.to(q.dtype)
    weights = naive_local_softmax_decay_weights(
        q.to(dtype), summary.keys, None if rel is None else rel.to(dtype), decay.to(dtype),
        key_mask=summary.values[:, 0, :, -1], query_offset=query_offset, horizon=h,
    )
    out = weights @ summary.values
    return normalise_rows(out[..., :-1], out[..., -1:]).to(q.dtype)


__all__ = [
    "CROSS_CHUNK",
    "LocalSoftmaxDecayCrossSummary",
    "LocalSoftmaxDecayState",
    "chunk_local_softmax_decay_attention",
    "local_softmax_decay_cross_step",
    "local_softmax_decay_attention",
    "local_softmax_decay_cross_summary",
    "local_softmax_decay_initial_state",
    "local_softmax_decay_is_operator",
    "local_softmax_decay_prefill_state",
    "local_softmax_decay_step",
]
