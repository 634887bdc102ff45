"""Kernelized attention with an exponentiated relative bias, computed by FFT Toeplitz products.

The contract, per batch element and head (phi(x) = elu(x) + 1, h the horizon, p_i = i +
query_offset), after Luo et al. (2021), "Stable, Fast and Accurate: Kernelized Attention with Relative
Positional Encoding" (kernelized attention with relative positional encoding, computed with FFT):

    r(i, j) = clip(p_i - j, -h, h) + h               (`ops_common.relative_index`)
    S_ij    = exp(bias[2h - r(i, j)]) phi(q_i).phi(k_j)   (0 if j > p_i when causal, or if key_mask[j] == 0)
    out_i   = sum_j S_ij v_j / sum_j S_ij                (0 for a row with no visible key)

`bias` has shape (H, 2h+1), one row per head, and is stored by key offset: entry r is the bias of
j - p_i = r - h (entry 0: keys h or more positions in the past; entry 2h: keys h or more positions
ahead), and every offset beyond h in either direction shares the bias of the last entry on its side.
This is the reverse of the rows of the other relative tables, so every op reads it through
`ops_common.rows_by_distance`, which reorders it by distance p_i - j. Scores are products of positive
factors, so the normaliser is positive whenever a key is visible. Causal attention only reads offsets
-h..0 (entries 0..h). With bias = 0 the op is plain kernelized attention (Katharopoulos et al., 2020),
the natural initialisation.

Linear algorithm (`fft_toeplitz_attention`, the paper's D1 = C B1, D2 = C B2). With the augmented
values [m_j v_j, m_j] (key mask m as a last channel) let B_j = phi(k_j) [m_j v_j, m_j]^T, a (D, Dv+1)
matrix, and C_ij = exp(bias[2h - r(i, j)]) (0 for j > p_i when causal). C depends only on j - i, so it is
Toeplitz, and D_i = sum_j C_ij B_j is one linear convolution along the sequence per feature pair
(d, e); the last channel carries the paper's D2, the normaliser. It is computed for all pairs at once
with `torch.fft.rfft`/`irfft` of length N >= Lq + Lk - 1; then out_i = phi(q_i) . D_i. Per head this
costs O(N log N D Dv + (Lq + Lk) D Dv) time. Work is split into blocks of batch*heads, key features
and value channels so that no temporary exceeds about `FFT_BLOCK_ELEMENTS` elements. The backward pass is
written by hand (`_ToeplitzProduct`): it saves only phi(q), phi(k), the augmented values and the
kernel taps, O(L (D + Dv)) per head, and recomputes the spectra block by block; its adjoint is again a
Toeplitz product (with C^T) done by FFT.

FFT round-off is relative to the largest terms of each convolution, not to each output. Bidirectional
float32 outputs agree with float64 to about 1e-7. In causal attention an early row sees few keys while
the convolution also carries the sums of late rows over up to L keys, so its error grows about linearly
with L: measured with D = Dv = 16, padding and a bias of std 1 (bias 0 in brackets), the largest
float32 error is 2e-4 at L = 512, 8e-4 (1e-4) at L = 2048 and 1e-2 (2e-3) at L = 8192, always in the
first rows; rows in the second half stay near 1e-7. The tests allow 1e-6 bidirectional and 1e-3 causal
at L = 512 (`tests/ops/test_toeplitz.py::test_float32_tolerance`). Whether a row sees any key is
decided exactly from the mask, never from the rounded normaliser.

Recurrent form (`toeplitz_step`): keys at distance > h from every future query all weigh
exp(bias[0]), so their sum phi(k_j) [m_j v_j, m_j]^T is kept as one (D, Dv+1) matrix; the last h keys
and values are kept as they are. The size of the state does not depend on the number of tokens seen.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .ops_common import (
    DEFAULT_CHUNK_SIZE,
    FFT_BLOCK_ELEMENTS,
    augment_values,
    check_attention_inputs,
    check_horizon,
    check_new_tokens,
    check_state,
    compute_dtype,
    distance_index,
    elu_feature_map,
    normalise,
    rows_by_distance,
)
from .ops_naive import naive_toeplitz_attention


# New tokens handled together by `toeplitz_step`: its local block costs O(n (h + n)) per head.
STEP_CHUNK = DEFAULT_CHUNK_SIZE


def _check_bias(bias: Tensor, q: Tensor) -> int:
    """Raise ValueError naming `bias` unless it is a (H, 2h+1) tensor of q's dtype; return the horizon h."""
    heads = q.shape[1]
    if not isinstance(bias, Tensor) or bias.dim() != 2:
        got = f"tensor of shape {tuple(bias.shape)}" if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"`bias` must be a 2-D tensor of shape (heads, 2h+1) = ({heads}, 2h+1), got {got}")
    if bias.shape[0] != heads or bias.shape[1] % 2 != 1:
        raise ValueError(
            f"`bias` must have shape (heads, 2h+1) = ({heads}, 2h+1) with an odd number of offsets, "
            f"got {tuple(bias.shape)}"
        )
    if bias.dtype != q.dtype:
        raise ValueError(f"`bias` must have the dtype of `q` ({q.dtype}), got {bias.dtype}")
    return (bias.shape[1] - 1) // 2


def _fft_length(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n: sizes the FFT handles fastest."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            p = p35
            while p < n:
                p *= 2
            best = min(best, p)
            p35 *= 3
        p5 *= 5
    return best


def _kernel_taps(bias: Tensor, lq: int, lk: int, query_offset: int, causal: bool, n_fft: int, dtype) -> Tensor:
    """Taps g[m] = C(i, j) for m = i + Lk - 1 - j in [0, Lq + Lk - 1), zero up to N; shape (H, N).

    Output n = i + Lk - 1 of the linear convolution of g with the keys' sequence is then
    sum_j g[i + Lk - 1 - j] B_j = sum_j C_ij B_j, and N >= Lq + Lk - 1 keeps the circular
    convolution of the FFT free of wrap-around on those outputs.
    """
    m = torch.arange(n_fft, device=bias.device)
    distance = m - (lk - 1 - query_offset)  # p_i - j at this tap
    index = distance_index(distance, (bias.shape[-1] - 1) // 2)
    keep = m < lq + lk - 1
    if causal:
        keep = keep & (distance >= 0)
    # out_i is a ratio: a per-head constant factor in C cancels, and subtracting the largest bias keeps
    # exp() from overflowing
    b = rows_by_distance(bias).to(dtype)
    return (b - b.max(dim=-1, keepdim=True).values.detach()).exp()[:, index] * keep.to(dtype)


def _block_sizes(rows: int, dim: int, channels: int, per_channel: int) -> tuple[int, int, int]:
    """Rows, key features and value channels per block so that a block holds <= FFT_BLOCK_ELEMENTS."""
    budget = max(1, FFT_BLOCK_ELEMENTS // per_channel)
    e_blk = min(channels, budget)
    d_blk = min(dim, max(1, budget // e_blk))
    r_blk = min(rows, max(1, budget // (e_blk * d_blk)))
    return r_blk, d_blk, e_blk


def _blocks(rows: int, dim: int, channels: int, n_fft: int):
    """(r0, r1, d0, d1, e0, e1) of every block; rows r, key features d, value channels e."""
    # a block's largest temporaries hold N reals or N/2+1 complex numbers per (row, d, e)
    r_blk, d_blk, e_blk = _block_sizes(rows, dim, channels, n_fft + 2)
    for r0 in range(0, rows, r_blk):
        for e0 in range(0, channels, e_blk):
            for d0 in range(0, dim, d_blk):
                yield r0, min(rows, r0 + r_blk), d0, min(dim, d0 + d_blk), e0, min(channels, e0 + e_blk)


def _outer_padded(a: Tensor, b: Tensor, start: int, n_fft: int) -> Tensor:
    """(g, da, db, N) zeros with a[:, :, t] b[:, :, t]^T written at t = start .. start + len - 1."""
    g, da, length = a.shape
    out = a.new_zeros(g, da, b.shape[1], n_fft)
    torch.mul(a[:, :, None, :], b[:, None, :, :], out=out[..., start : start + length])
    return out


class _ToeplitzProduct(torch.autograd.Function):
    """A_i = phi(q_i) . sum_j C_ij phi(k_j) [m v, m]_j^T for rows r = b*H + h, C Toeplitz from `taps`.

    Inputs are feature-major, qf (BH, D, Lq), kf (BH, D, Lk), va (BH, Dv+1, Lk), taps (H, N); the
    output is (BH, Dv+1, Lq). Sequences run along the last dimension, where the FFT puts them.
    Saves only its inputs; the backward pass recomputes each block's spectrum. With dY the output
    gradient placed at positions Lk-1 .. Lk+Lq-2 of a length-N signal, the adjoint of the convolution
    is the correlation dP = irfft(rfft(dY) conj(G)), and the taps' gradient is the correlation
    irfft(sum over (d, e) of rfft(dY) conj(rfft(P))).
    """

    @staticmethod
    def forward(ctx, qf, kf, va, taps, heads):
        ctx.save_for_backward(qf, kf, va, taps)
        ctx.heads = heads
        (rows, dim, lq), lk, n_fft = qf.shape, kf.shape[-1], taps.shape[-1]
        spectrum = torch.fft.rfft(taps)  # (H, N/2+1)
        heads_of = torch.arange(rows, device=qf.device) % heads
        out = qf.new_zeros(rows, va.shape[1], lq)
        for r0, r1, d0, d1, e0, e1 in _blocks(rows, dim, va.shape[1], n_fft):
            spec = spectrum[heads_of[r0:r1], None, None, :]  # (g, 1, 1, N/2+1)
            pairs = _outer_padded(kf[r0:r1, d0:d1], va[r0:r1, e0:e1], 0, n_fft)  # (g, d, e, N)
            conv = torch.fft.irfft(torch.fft.rfft(pairs).mul_(spec), n=n_fft)
            toeplitz = conv[..., lk - 1 : lk - 1 + lq]  # D_i of this block, (g, d, e, Lq)
            out[r0:r1, e0:e1] += (toeplitz * qf[r0:r1, d0:d1, None, :]).sum(1)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qf, kf, va, taps = ctx.saved_tensors
        heads = ctx.heads
        (rows, dim, lq), lk, n_fft = qf.shape, kf.shape[-1], taps.shape[-1]
        grad_out = grad_out.to(qf.dtype)
        spectrum = torch.fft.rfft(taps)
        heads_of = torch.arange(rows, device=qf.device) % heads
        dqf, dkf, dva = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(va)
        dspec = torch.zeros(rows, spectrum.shape[-1], dtype=spectrum.dtype, device=qf.device)
        for r0, r1, d0, d1, e0, e1 in _blocks(rows, dim, va.shape[1], n_fft):
            spec = spectrum[heads_of[r0:r1], None, None, :]
            go = grad_out[r0:r1, e0:e1]  # (g, e, Lq)
            kb, vb, qb = kf[r0:r1, d0:d1], va[r0:r1, e0:e1], qf[r0:r1, d0:d1]
            spec_pairs = torch.fft.rfft(_outer_padded(kb, vb, 0, n_fft))
            toeplitz = torch.fft.irfft(spec_pairs * spec, n=n_fft)[..., lk - 1 : lk - 1 + lq]
            dqf[r0:r1, d0:d1] += (toeplitz * go[:, None]).sum(2)
            spec_grad = torch.fft.rfft(_outer_padded(qb, go, lk - 1, n_fft))
            dspec[r0:r1] += (spec_grad * spec_pairs.conj_physical()).sum((1, 2))
            dpairs = torch.fft.irfft(spec_grad.mul_(spec.conj()), n=n_fft)[..., :lk]  # (g, d, e, Lk)
            dkf[r0:r1, d0:d1] += (dpairs * vb[:, None]).sum(2)
            dva[r0:r1, e0:e1] += (dpairs * kb[:, :, None]).sum(1)
        dtaps = None
        if ctx.needs_input_grad[3]:
            dtaps = torch.zeros_like(taps).index_add_(0, heads_of, torch.fft.irfft(dspec, n=n_fft))
        return dqf, dkf, dva, dtaps, None


def _visible_rows(b: int, lq: int, lk: int, key_mask: Tensor | None, causal: bool, query_offset: int, device):
    """(B, 1, Lq, 1) bool: whether query i sees at least one key, decided exactly from the mask."""
    if key_mask is None:
        # causal: key 0 <= p_i always
        return torch.ones(b, 1, lq, 1, dtype=torch.bool, device=device)
    count = key_mask.to(torch.long).cumsum(-1)  # (B, Lk) visible keys at positions <= j
    if causal:
        last = (torch.arange(lq, device=device) + query_offset).clamp(max=lk - 1)
        seen = count[:, last]
    else:
        seen = count[:, -1:].expand(b, lq)
    return (seen > 0)[:, None, :, None]


def fft_toeplitz_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
) -> Tensor:
    """The FFT algorithm; same contract and shapes as `toeplitz_attention`.

    D_i = sum_j C_ij phi(k_j) [m_j v_j, m_j]^T with the Toeplitz matrix C_ij = exp(bias[2h - r(i, j)]) is
    one linear convolution along the sequence per feature pair, done with rfft/irfft of length
    N >= Lq + Lk - 1 (the smallest 2^a 3^b 5^c); out_i = phi(q_i) . D_i, normalised by its last
    channel.

    Time O(N log N D Dv + (Lq + Lk) D Dv) per head, forward 2 and backward 4 real FFTs per feature
    pair. Memory: the backward pass keeps only phi(q), phi(k), the augmented values and the taps, and
    recomputes spectra block by block; temporaries are at most a few times `FFT_BLOCK_ELEMENTS` elements
    (unless one feature pair of one head, about N elements, is larger).
    """
    check_attention_inputs(q, k, v, None, key_mask, query_offset, "linear")
    _check_bias(bias, q)
    dtype = compute_dtype(q.dtype)
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    n_fft = _fft_length(lq + lk - 1)
    taps = _kernel_taps(bias, lq, lk, query_offset, causal, n_fft, dtype)  # (H, N)
    # feature-major (B*H, features, L): the FFT runs along the last dimension
    qf = elu_feature_map(q.to(dtype)).reshape(b * h, lq, d).transpose(1, 2).contiguous()
    kf = elu_feature_map(k.to(dtype)).reshape(b * h, lk, d).transpose(1, 2).contiguous()
    va = augment_values(v.to(dtype), key_mask).reshape(b * h, lk, dv + 1).transpose(1, 2).contiguous()
    a = _ToeplitzProduct.apply(qf, kf, va, taps, h).transpose(1, 2).reshape(b, h, lq, dv + 1)
    # rounding can leave a small den on a row that sees no key: visibility comes from the mask
    visible = _visible_rows(b, lq, lk, key_mask, causal, query_offset, q.device)
    return normalise(a[..., :-1], a[..., -1:], visible).to(q.dtype)


# Cost model of `toeplitz_choose_mode`, in units of one multiply-add of the quadratic path.
NAIVE_PER_SCORE = 8
FFT_PER_POINT = 3.7
LINEAR_OVERHEAD = 3_000_000


def toeplitz_choose_mode(lq: int, lk: int, dim: int, value_dim: int, *, causal: bool, batch_heads: int = 1) -> str:
    """The cheaper algorithm for one call, "naive" or "linear" (FFT), from a cost model.

    The quadratic path costs about (D + Dv + NAIVE_PER_SCORE) per score and batch*head; the FFT path
    D (Dv+1) (FFT_PER_POINT N log2 N + 2 (Lq + Lk)) per batch*head, N the FFT length, plus a fixed
    overhead per call. Neither depends on `causal`: the FFT convolves with a kernel whose upper half
    is zero, the naive path masks a full score matrix. Fitted on forward plus backward passes in
    float32 on one CPU thread, 8 heads, D = Dv = 64 (CPU seconds, naive / FFT): L = 1024 0.40 / 1.17,
    L = 2048 1.60 / 2.23, L = 4096 6.49 / 5.01, so the crossover is near L = 3000. The FFT path does
    O(D Dv) transforms of length about 2L, so it wins only on long sequences.
    """
    naive = batch_heads * lq * lk * (dim + value_dim + NAIVE_PER_SCORE)
    n_fft = _fft_length(lq + lk - 1)
    pairs = dim * (value_dim + 1)
    fft = batch_heads * pairs * (FFT_PER_POINT * n_fft * math.log2(max(n_fft, 2)) + 2 * (lq + lk)) + LINEAR_OVERHEAD
    return "linear" if fft < naive else "naive"


def toeplitz_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0, mode: str = "auto",
) -> Tensor:
    """Kernelized attention with an exponentiated, clipped relative bias (Luo et al., 2021).

    With phi(x) = elu(x) + 1, h = (bias.shape[-1] - 1) // 2 and p_i = i + query_offset:
        S_ij  = exp(bias[2h - r(i, j)]) phi(q_i).phi(k_j),   r(i, j) = clip(p_i - j, -h, h) + h
        out_i = sum_j S_ij v_j / sum_j S_ij
    with S_ij = 0 where j > p_i (causal) or key_mask[:, j] == 0; a row with no visible key gives 0.
    bias = 0 is plain kernelized attention (Katharopoulos et al., 2020).

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq.
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        bias (`Tensor` of shape `(H, 2h+1)`): per-head bias of the key's offset relative to the query,
            entry r for offset j - p_i = r - h (entry 2h - r(i, j)); offsets beyond +-h use the last
            entry on their side. Same dtype as q.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= p_i.
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): absolute position of the first query.
        mode (`str`, defaults to `"auto"`): `"naive"` (quadratic reference), `"linear"` (FFT Toeplitz
            products, O(L log L D Dv) time) or `"auto"` (the cheaper, see `toeplitz_choose_mode`).

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype. Half precision is computed in float32.
    """
    check_attention_inputs(q, k, v, None, key_mask, query_offset, mode)
    _check_bias(bias, q)
    if mode == "auto":
        mode = toeplitz_choose_mode(
            q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], causal=causal, batch_heads=q.shape[0] * q.shape[1]
        )
    if mode == "naive":
        return naive_toeplitz_attention(q, k, v, bias, causal=causal, key_mask=key_mask, query_offset=query_offset)
    return fft_toeplitz_attention(q, k, v, bias, causal=causal, key_mask=key_mask, query_offset=query_offset)


class ToeplitzState(NamedTuple):
    """Recurrent state of causal Toeplitz attention after `seen` tokens (positions 0..seen-1).

    Values are kept augmented as [m_j v_j, m_j] (key mask as a last channel), so each sum carries the
    numerator and the normaliser together. The size depends on the horizon h, not on `seen`.

    Fields:
        kv_far (`Tensor` of shape `(B, H, D, Dv+1)`): sum of phi(k_j) [m_j v_j, m_j]^T over the tokens
            j <= seen - 1 - h, which are at distance > h from every later query (weight exp(bias[0])).
        k_window (`Tensor` of shape `(B, H, h, D)`): phi(k_j) of the last h tokens, oldest first.
        v_window (`Tensor` of shape `(B, H, h, Dv+1)`): [m_j v_j, m_j] of the last h tokens; zero rows
            stand for positions before the start.
        seen (`int`): number of tokens seen, the position of the next token.
    """

    kv_far: Tensor
    k_window: Tensor
    v_window: Tensor
    seen: int


def toeplitz_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, horizon: int, *, dtype: torch.dtype, device=None
) -> ToeplitzState:
    """The empty state (no token seen) for bias tables of 2 * horizon + 1 offsets.

    Tensors are in `compute_dtype(dtype)` (float32 for half precision).
    """
    check_horizon(horizon)
    dtype = compute_dtype(dtype)
    return ToeplitzState(
        kv_far=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        k_window=torch.zeros(batch, heads, horizon, dim, dtype=dtype, device=device),
        v_window=torch.zeros(batch, heads, horizon, value_dim + 1, dtype=dtype, device=device),
        seen=0,
    )


def toeplitz_prefill_state(k: Tensor, v: Tensor, horizon: int, *, key_mask: Tensor | None = None) -> ToeplitzState:
    """The state after the tokens k (B, H, L, D), v (B, H, L, Dv) at positions 0..L-1, in O(L D Dv).

    Use it after a full causal call on a prompt, then continue with `toeplitz_step`.
    """
    check_horizon(horizon)
    check_attention_inputs(k, k, v, None, key_mask, 0, "linear")
    dtype = compute_dtype(k.dtype)
    kf = elu_feature_map(k.to(dtype))
    va = augment_values(v.to(dtype), key_mask)
    length = k.shape[2]
    if length < horizon:
        # zero rows for positions before the start: their augmented value (and mask) is 0
        kf = torch.cat([kf.new_zeros(*kf.shape[:2], horizon - length, kf.shape[-1]), kf], dim=2)
        va = torch.cat([va.new_zeros(*va.shape[:2], horizon - length, va.shape[-1]), va], dim=2)
    split = kf.shape[2] - horizon
    return ToeplitzState(
        kv_far=kf[:, :, :split].transpose(-1, -2) @ va[:, :, :split],
        k_window=kf[:, :, split:],
        v_window=va[:, :, split:],
        seen=length,
    )


def toeplitz_step(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, state: ToeplitzState, *, key_mask: Tensor | None = None
) -> tuple[Tensor, ToeplitzState]:
    """Causal attention of n new tokens on the past summarised by `state`, and the updated state.

    q, k, v have shape (B, H, n, .) and sit at positions state.seen .. state.seen + n - 1; `key_mask`
    (B, n) masks the new tokens only. The result equals the matching rows of
    `toeplitz_attention(..., causal=True)` over the whole sequence. New tokens are taken STEP_CHUNK at a
    time: per chunk of c tokens the work is O(c D Dv + c (h + c)(D + Dv)) per head; the state keeps its
    size, O(D Dv + h (D + Dv)) per head.

    Returns:
        `(out, state)`: out of shape (B, H, n, Dv) in q's dtype, and the new `ToeplitzState`.
    """
    check_state(state, ToeplitzState)
    check_attention_inputs(q, k, v, None, key_mask, state.seen, "linear")
    horizon = _check_bias(bias, q)
    check_new_tokens(q, k)
    b, h, _, d = q.shape
    expected = (b, h, d, v.shape[-1] + 1)
    if (
        tuple(state.kv_far.shape) != expected
        or tuple(state.k_window.shape) != (b, h, horizon, d)
        or tuple(state.v_window.shape) != (b, h, horizon, v.shape[-1] + 1)
    ):
        raise ValueError(
            f"`state` does not fit these inputs: expected kv_far of shape {expected} and windows of "
            f"{horizon} rows (bias of {2 * horizon + 1} offsets), got kv_far "
            f"{tuple(state.kv_far.shape)}, k_window {tuple(state.k_window.shape)} and v_window "
            f"{tuple(state.v_window.shape)}"
        )
    weight = rows_by_distance(bias).to(state.kv_far.dtype).exp()  # (H, 2h+1), row h + t for distance t
    outs = []
    for s0 in range(0, q.shape[2], STEP_CHUNK):
        s1 = min(q.shape[2], s0 + STEP_CHUNK)
        mask = None if key_mask is None else key_mask[:, s0:s1]
        out, state = _step_chunk(q[:, :, s0:s1], k[:, :, s0:s1], v[:, :, s0:s1], weight, state, mask)
        outs.append(out.to(q.dtype))
    return torch.cat(outs, dim=2), state


def _step_chunk(q, k, v, weight, state: ToeplitzState, key_mask):
    dtype = state.kv_far.dtype
    n, w = q.shape[2], state.k_window.shape[2]
    qf = elu_feature_map(q.to(dtype))
    k_local = torch.cat([state.k_window, elu_feature_map(k.to(dtype))], dim=2)  # (B, H, h + n, D)
    v_local = torch.cat([state.v_window, augment_values(v.to(dtype), key_mask)], dim=2)
    # local key jj sits at position seen - h + jj, query i at seen + i: distance w + i - jj; the later
    # (masked) keys read the weight of distance 0
    distance = torch.arange(n, device=q.device)[:, None] + w - torch.arange(w + n, device=q.device)[None, :]
    local_weight = weight[:, distance_index(distance.clamp(min=0), w)] * (distance >= 0).to(dtype)  # (H, n, h + n)
    a = ((qf @ k_local.transpose(-1, -2)) * local_weight) @ v_local
    a = a + weight[:, -1:, None] * (qf @ state.kv_far)  # distance > h: the last row
    split = n  # the oldest n local tokens move to the far sum, the last h stay in the window
    new_state = ToeplitzState(
        kv_far=state.kv_far + k_local[:, :, :split].transpose(-1, -2) @ v_local[:, :, :split],
        k_window=k_local[:, :, split:],
        v_window=v_local[:, :, split:],
        seen=state.seen + n,
    )
    return normalise(a[..., :-1], a[..., -1:]), new_state
