"""Triton kernels of the default attention (`ops_local_softmax.local_softmax_decay_attention`) and of its decoding
steps, for CUDA.

`local_softmax_decay` computes the whole linear path, band and decayed tails under one row normaliser, with
the PyTorch path (`ops_local_softmax._LocalSoftmaxBand` beside `ops_decay.decayed_tails`) as the CPU path and the
reference. For query block b (BLOCK queries i, p_i = i + offset), its window is the BLOCK + 2h keys j = s_b ..
s_b + BLOCK + 2h - 1, s_b = b BLOCK + offset - h, and every key before the window is beyond the band of every query
of the block: with phi(x) = elu(x) + 1 and m_j the key mask,

    L_b = sum_{j < s_b} exp(-lambda (s_b - j)) phi(k_j) m_j [v_j, 1]^T      (D, Dv + 1, held as S (D, Dv), z (D,))

is the block's causal state; the anticausal state holds the keys after the window the same way (the causal state of
the reversed sequences). Each state is held as exp(nu_b) L'_b, with nu_b = -lambda (s_b - e), e the last visible key
before s_b: L'_b weighs e by 1 and the other keys relative to it, so that a state whose keys all lie far back (a
padded row's queries past its last visible key, queries past every key, a long gap of hidden keys) keeps its
weights, which relative to s_b would fall below the dtype's range hundreds of positions away at a fast decay. Query i
at a, its place in the block, weighs the pairs of its window (softmax logits in the band,
phi(q_i).phi(k_j) / D exp(-lambda (|p_i - j| - h)) beyond it) and the states, decayed by exp(-lambda a) and
exp(-lambda (BLOCK - 1 - a)), all scaled by exp(-m_i) (`ops_common.row_shift`) and normalised together. Every
weight beyond the band is formed as one exponential of its exponent relative to the row's shift (the window's
exp(-lambda (|p_i - j| - h) - s_i), the states' exp(nu_b - lambda a - m_i)), and m_i and the states' gradients'
scales are sums of logs, so that every row keeps its weights, at any distance from its visible keys and any decay:
past a padded row's last key, past every key, inside a gap of hidden keys. The kernels, laid out like
flash-linear-attention's chunk kernels:

- `_states`, or `_chunk_sums` then `_scan_sums` (the parallel passes, `_parallel_walks`): L_b of every block (kept
  for backward, or recomputed there without `KEEP_STATES`). `_states` walks the chunks with one program per row and
  direction, reading each chunk's keys in sequence; `_chunk_sums` stores what each chunk of BLOCK keys adds, every
  chunk at once, and `_scan_sums` sums them up in place, a sequential pass of elementwise work per batch*head row,
  direction and SCAN_ROWS rows of the state, SCAN_SLOTS chunks a step (or `_scan_products`, `SCAN_PRODUCTS`: the
  same pass with each step's sums as one product of the decays' weights with the step's slots, on the tensor cores;
  or `_scan_recurrence`, `SCAN_RECURRENCE`: a step's slots read at once, then walked in order as the walks do). The
  chunks before the first query block, whose states no block reads (a cross attention's source beyond its targets,
  254 of 256 chunks at 16k source and 128 target tokens), are folded into block 0's state at once (`_fold_prefix`)
  rather than passed through one after another, and in backward take G_0 decayed;
- `_forward`: one program per query block and row: the window's logits and kernel weights by tiles of KEY_TILE
  keys (the band's weights exp(l) and the kernel weights beyond the band in one sum, under the running largest of
  the band logits and the decays' exponents, as flash attention sums its weights), both states, the row shift m,
  out, and m and the normaliser for backward. A window's last tile whose pairs all lie in the band (causal: its
  slots from BLOCK - 1 on, `_beyond_band`) is taken apart, without the kernel's products and features, here and in
  `_backward_queries`;
- `_states_backward`, or `_query_sums` then `_scan_sums` (`PARALLEL_WALKS`): the states' gradient G_b = dL/dL_b
  (the block's queries add theirs, exp(-m_i) exp(-lambda a) phi(q_i) / D [gs_i, -delta_i], and
  G_b = exp(-lambda BLOCK) G_{b+1} + that), in the states' layout, with delta_i = g_i . out_i / den_i:
  `_states_backward` walks the blocks back with one program per row and direction; the parallel passes take every
  block's sum at once, then a sequential elementwise pass from the last block back. Both stop at G_0, which the
  chunks before the first query block take decayed (`_key_shares`). `_row_terms` computes delta_i and
  each query's log weight exp(-m_i) / den_i first, once, so that a walk's step reads two floats a query instead of
  reducing its g and out over Dv (and stores gs_i = g_i / den_i and phi(q_i) / D in the inputs' dtype, the
  operands of the window kernels' products, which `_backward_keys` would otherwise form again for each block of
  keys that a query's window holds). Each G is kept as exp(nu) G' with nu its own scale: a row whose visible
  keys all lie far back weighs exp(-m_i) / den_i = 1 / (its total weight), which passes float32's range (e^88) 180
  positions from its keys at lambda = 0.5, while its keys' gradients, that weight times their decay, stay finite;
- `_backward_queries`: by query blocks, like `_forward` (the same tiles, m and the normaliser known): dq, each
  block's share of the table's gradient and lambda's;
- `_backward_keys`: by blocks of KEY_BLOCK keys (in step with the windows and the walks' chunks, `_key_origin`): the
  query blocks whose windows hold them give dk and dv, and the keys' shares of the gradients of the states their
  chunks enter (one or two per direction) are added. Each pair of a window is computed twice in backward, by
  queries and by keys: one pass per query block giving its dq and its window's first keys' dk and dv took 1.27x to
  1.34x the two passes' time at 16k and 64k on an H200, its tiles spilling (benchmarks/README.md). With
  `STORED_PAIRS`, `_backward_queries` stores each pair's weight and the factor of its gradient, and
  `_backward_keys` reads them (`_stored_key_pairs`): its pairs then take three products and no exponential.

lambda's gradient is a sum of local terms (offsets within a block or a window, BLOCK for each carry), never a
product of absolute positions. q, k, v, the table and the output stay in the inputs' dtype (read with their
strides; the output is laid out (B, Lq, H, Dv), so that merging the heads is a view); 16-bit operands are
multiplied as they are, while features, weights, states and sums are fp32 (fp64 for fp64 inputs). Forward and
backward are two `torch.library` operators (`_forward_op`, `_backward_op`, tied by `register_autograd`, each
with a fake implementation that gives its outputs' shapes), so that torch.compile traces a model around them
rather than stopping at them; eager calls run the same bodies through an `autograd.Function` (`_EagerAttention`),
without the operators' dispatch.

Generation has two more kernels, without backward, each one launch per layer and token where PyTorch takes some
forty to fifty small operations: `_decode_step` (`decode_step`), the self-attention step of one token on the
recurrent state (window of the last h keys, relative table, decayed tail, row shift, normaliser, and the state's
update), and `_cross_decode` (`cross_decode`), a query on the encoder's keys (its band, then every key beyond it
by blocks, summed relative to the nearest one's decay, so that a query however far past the keys keeps its
weights); their inputs are in the compute dtype (`ops_common.compute_dtype`). The module imports Triton, which is
an optional dependency: it is loaded only for CUDA tensors (or by tests under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch


try:
    import triton
    import triton.language as tl
except ImportError as error:  # optional (the `gpu` extra): `ops_local_softmax` falls back to PyTorch without it
    raise ImportError("the Triton kernels of the default attention need `pip install triton`") from error
if not hasattr(triton, "constexpr_function"):  # an older Triton: the PyTorch path, as without one
    raise ImportError(f"the Triton kernels of the default attention need a Triton with `triton.constexpr_function` "
                      f"(3.6 has it), got {triton.__version__}")

from .ops_common import compute_dtype
from .ops_decay_triton import dot_precision


# the namespace of this module's operators (torch.library), one per name the module is imported under: a copy
# loaded as remote code (`trust_remote_code=True`) beside the installed package registers operators of its own
LIBRARY = "scaleformer_" + re.sub(r"\W", "_", __name__)


@triton.jit
def _exp(x):
    """exp(x), as 2^(x log2(e)): for float32 one special-function instruction (ex2), which flushes results below
    float32's normal range (2^-126) to 0, where `tl.exp` takes five, checking for those results and scaling them (a
    weight below 2^-126 of its row's largest, the row's shift, or a feature that small, adds nothing a float32 sum
    keeps). Float64 keeps `tl.exp`: Triton's literals are float32, and log2(e) rounded to float32 would cost float64 its
    precision."""
    if x.dtype == tl.float64:
        return tl.exp(x)
    return tl.exp2(x * 1.4426950408889634)


@triton.jit
def _elu_features(x, inside):
    """elu(x) + 1 where `inside`, 0 elsewhere (the default attention's feature map)."""
    return tl.where(inside, tl.where(x > 0, x + 1.0, _exp(x)), 0.0)


@triton.jit
def _max_exponent(x):
    """The largest t whose exp(t) is finite in x's dtype (float64, else float32)."""
    if x.dtype == tl.float64:
        return 709.0
    return 88.0


@triton.jit
def _log_or_minus_inf(x):
    """log(x) where x > 0, -inf elsewhere (an empty sum), without taking the log of 0."""
    return tl.where(x > 0, tl.log(tl.where(x > 0, x, 1.0)), float("-inf"))


@triton.jit
def _shift_scale(m):
    """exp(-m), capped where it would overflow (`ops_common.shift_scale`): a weight exp(x) relative to a shift s is
    `_shift_scale(s - x)`, 0 where x is -inf (an empty sum), finite where a product of the weight with a small term
    is what stays within range (forward and backward take the same factor)."""
    return _exp(tl.minimum(-m, _max_exponent(m)))


@triton.jit
def _floor_div(a, b):
    """floor(a / b) for integers a of any sign and b > 0 (Triton's // truncates towards zero)."""
    return (a - ((a % b) + b) % b) // b


@triton.jit
def _row_ptrs(PTR, row, heads, stride_b, stride_h, stride_l, pos, inside, width, BLOCK: tl.constexpr):
    """Pointers and mask of the rows `pos` (where `inside`) and the first `width` of BLOCK columns of batch*head `row`
    of a (B, H, L, width) tensor with strides (stride_b, stride_h, stride_l, 1)."""
    col = tl.arange(0, BLOCK)
    base = PTR + (row // heads).to(tl.int64) * stride_b + (row % heads).to(tl.int64) * stride_h
    return base + pos.to(tl.int64)[:, None] * stride_l + col[None, :], inside[:, None] & (col[None, :] < width)


@triton.jit
def _load_rows(PTR, row, heads, stride_b, stride_h, stride_l, pos, inside, width, BLOCK: tl.constexpr):
    ptr, mask = _row_ptrs(PTR, row, heads, stride_b, stride_h, stride_l, pos, inside, width, BLOCK)
    return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def _dense_rows(PTR, row, lq, width, pos, inside, BLOCK: tl.constexpr):
    """`_row_ptrs` of a contiguous (rows, lq, width) tensor: one "head" a row, rows lq * width apart."""
    return _row_ptrs(PTR, row, 1, lq * width, 0, width, pos, inside, width, BLOCK)


@triton.jit
def _key_weights(MASK, row, heads, lk, j, exists, HAS_MASK: tl.constexpr, ACC: tl.constexpr):
    """m_j of the keys j (0 where they do not exist): the key mask's value, 1 without a mask."""
    if HAS_MASK:
        return tl.load(MASK + (row // heads).to(tl.int64) * lk + j, mask=exists, other=0.0).to(ACC)
    return tl.where(exists, 1.0, 0.0).to(ACC)


@triton.jit
def _elu_slope(raw):
    """The derivative of elu(x) + 1 at `raw`."""
    return tl.where(raw > 0, 1.0, _exp(raw))


@triton.jit
def _walk_start(RATE, row, heads, direction, lq, lk, offset, nq, start0, start1, ACC: tl.constexpr,
                BLOCK: tl.constexpr):
    """A walk's coordinates in its direction (see `_Walk`): the step and first rows of the queries and the keys, the
    queries' shift, the offset and the first chunk (direction 1 reads the sequences reversed); then the row's rate
    lambda."""
    back = direction == 1
    rate = tl.load(RATE + row % heads).to(ACC)
    return (tl.where(back, -1, 1), tl.where(back, lq - 1, 0), tl.where(back, lk - 1, 0),
            tl.where(back, nq * BLOCK - lq, 0), tl.where(back, lk - lq - offset, offset),
            tl.where(back, start1, start0), rate)


@triton.jit
def _state_ptrs(S, Z, direction, row, rows, index, n_states, d, dv, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """Pointers and masks of state `index` of `row` in `direction`: S (D, Dv) and its normaliser z (D,), in
    (directions, rows, n_states, D, .) tensors."""
    dd = tl.arange(0, BLOCK_D)
    vv = tl.arange(0, BLOCK_V)
    at = ((direction * rows + row).to(tl.int64) * n_states + index) * d
    return (S + (at + dd[:, None]) * dv + vv[None, :], Z + at + dd, (dd[:, None] < d) & (vv[None, :] < dv),
            dd < d)


@triton.jit
def _chunk_keys(K, V, MASK, row, heads, lk, c, kfirst, step, qshift, off_w, d, dv, skb, skh, skl, svb, svh, svl,
                HORIZON: tl.constexpr, HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """Chunk c of the keys in a direction's coordinates, the keys y = s_c .. s_c + BLOCK - 1 with
    s_c = c BLOCK - qshift + offset - h: their rows in memory, whether they exist, their mask m_j (`_key_weights`),
    phi(k) m_j (ACC, 0 where the key is hidden) and v (the inputs' dtype)."""
    y = c * BLOCK - qshift + off_w - HORIZON + tl.arange(0, BLOCK)
    exists = (y >= 0) & (y < lk)
    j = kfirst + step * y
    k = _load_rows(K, row, heads, skb, skh, skl, j, exists, d, BLOCK_D).to(ACC)
    v = _load_rows(V, row, heads, svb, svh, svl, j, exists, dv, BLOCK_V)
    mk = _key_weights(MASK, row, heads, lk, j, exists, HAS_MASK, ACC)
    features = _elu_features(k, exists[:, None] & (tl.arange(0, BLOCK_D)[None, :] < d)) * mk[:, None]
    return j, exists, mk, features, v


@triton.jit
def _chunk_sum(K, V, MASK, row, heads, lk, c, kfirst, step, qshift, off_w, rate, d, dv, skb, skh, skl, svb, svh,
               svl, HORIZON: tl.constexpr, HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """What the keys of chunk c add to the next block's state, sum_t exp(-lambda (BLOCK - t)) phi(k_t) m_t v_t^T
    (D, Dv) and its normaliser (D,), as exp(mu) times the sums relative to the chunk's last visible key e (weights
    exp(-lambda (e - t)), the largest 1), with mu = -lambda (BLOCK - e) (-inf, and zero sums, where no key of the
    chunk is visible): the sums underflow nowhere, however fast the decay."""
    j, exists, mk, features, v = _chunk_keys(K, V, MASK, row, heads, lk, c, kfirst, step, qshift, off_w, d, dv, skb,
                                             skh, skl, svb, svh, svl, HORIZON, HAS_MASK, ACC, BLOCK, BLOCK_D, BLOCK_V)
    t = tl.arange(0, BLOCK)
    last = tl.max(tl.where(mk > 0, t, -1), 0)
    mu = tl.where(last >= 0, -rate * (BLOCK - last).to(ACC), float("-inf"))
    features = features * tl.where(t <= last, _exp(-rate * tl.maximum(last - t, 0).to(ACC)), 0.0)[:, None]
    op = K.dtype.element_ty
    return tl.dot(tl.trans(features.to(op)), v.to(op), input_precision=DOT), tl.sum(features, 0), mu


@triton.jit
def _states(
    K, V, MASK, RATE, S, Z, SE,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, d, dv, skb, skh, skl, svb, svh, svl,
    HORIZON: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr, DOT: tl.constexpr,
):
    """The states of every query block by a sequential walk over the chunks, one program per batch*head row and
    direction: L_c = exp(nu_c) L'_c, L'_c into slot c - start of S and Z, nu_c into SE (`_scaled_step`)."""
    row, direction = tl.program_id(0), tl.program_id(1)
    acc = S.dtype.element_ty
    step, qfirst, kfirst, qshift, off_w, start, rate = _walk_start(
        RATE, row, heads, direction, lq, lk, offset, nq, start0, start1, acc, BLOCK)
    state = tl.zeros((BLOCK_D, BLOCK_V), dtype=acc)
    norm = tl.zeros((BLOCK_D,), dtype=acc)
    nu = tl.max(tl.full((BLOCK_D,), float("-inf"), dtype=acc), 0)  # the state's exponent: -inf, an empty sum
    for c in range(start, nq):
        s_ptr, z_ptr, s_mask, z_mask = _state_ptrs(S, Z, direction, row, rows, c - start, n_states, d, dv, BLOCK_D,
                                                   BLOCK_V)
        tl.store(s_ptr, state, mask=s_mask)
        tl.store(z_ptr, norm, mask=z_mask)
        tl.store(SE + (direction * rows + row).to(tl.int64) * n_states + c - start, nu)
        chunk, chunk_norm, mu = _chunk_sum(K, V, MASK, row, heads, lk, c, kfirst, step, qshift, off_w, rate, d, dv,
                                           skb, skh, skl, svb, svh, svl, HORIZON, HAS_MASK, acc, BLOCK, BLOCK_D,
                                           BLOCK_V, DOT)
        nu, old, new = _scaled_step(nu, mu, rate * BLOCK)
        state = state * old + chunk * new
        norm = norm * old + chunk_norm * new


@triton.jit
def _chunk_sums(
    K, V, MASK, RATE, S, Z, SE,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, d, dv, skb, skh, skl, svb, svh, svl,
    HORIZON: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr, DOT: tl.constexpr,
):
    """`_states` in parallel, first of two: one program per chunk c, row and direction stores what the keys of chunk c
    add to the next block's state, sum_t exp(-lambda (BLOCK - t)) phi(k_t) m_t [v_t, 1]^T, as exp(mu) times the sums
    (`_chunk_sum`), in state slot c - start, and mu in SE (`_scan_sums` then turns the slots into the states)."""
    index, row, direction = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    acc = S.dtype.element_ty
    step, qfirst, kfirst, qshift, off_w, start, rate = _walk_start(
        RATE, row, heads, direction, lq, lk, offset, nq, start0, start1, acc, BLOCK)
    c = start + index
    if c < nq:
        chunk, chunk_norm, mu = _chunk_sum(K, V, MASK, row, heads, lk, c, kfirst, step, qshift, off_w, rate, d, dv,
                                           skb, skh, skl, svb, svh, svl, HORIZON, HAS_MASK, acc, BLOCK, BLOCK_D,
                                           BLOCK_V, DOT)
        s_ptr, z_ptr, s_mask, z_mask = _state_ptrs(S, Z, direction, row, rows, index, n_states, d, dv, BLOCK_D,
                                                   BLOCK_V)
        tl.store(s_ptr, chunk, mask=s_mask)
        tl.store(z_ptr, chunk_norm, mask=z_mask)
        tl.store(SE + (direction * rows + row).to(tl.int64) * n_states + index, mu)


@triton.jit
def _scaled_step(nu, mu, carry_log):
    """One step of a walk whose sums each hold an exponent of their own, y' = exp(-lambda BLOCK) y + x with
    y = exp(nu) Y and x = exp(mu) X (`carry_log` = lambda BLOCK): the states forward (y the state, x what a chunk
    adds), their gradient back (G_c = exp(-lambda BLOCK) G_{c+1} + what query block c adds). Returns the exponent of
    y' and the factors of Y and X in it (0 for a side whose exponent is -inf, a zero sum)."""
    new = tl.maximum(nu - carry_log, mu)
    base = tl.where(new > float("-inf"), new, 0.0)  # exp(-inf - base) = 0 for a side that is -inf
    return new, _exp(nu - carry_log - base), _exp(mu - base)


@triton.jit
def _scaled(p, nu):
    """exp(nu) p, without forming exp(nu) (0 where p is 0 or nu is -inf)."""
    nonzero = (p != 0) & (nu > float("-inf"))
    magnitude = _exp(tl.where(nonzero, nu + tl.log(tl.abs(tl.where(nonzero, p, 1.0))), float("-inf")))
    return tl.where(nonzero, tl.where(p > 0, magnitude, -magnitude), 0.0)


@triton.jit
def _step_exponents(nu, mu, carry_log, SLOTS: tl.constexpr):
    """The exponents of a scan's step over SLOTS slots (`_scan_sums`, `_scan_products`), from nu, the exponent of the
    sum carried into the step, and mu (SLOTS,), the slots' own: each slot u's term's at slot t,
    mu_u - lambda BLOCK (t - 1 - u) for u < t, else -inf (SLOTS, SLOTS; `carry_log` = lambda BLOCK); y_t's exponent,
    the largest of those and of nu - lambda BLOCK t; the exponent after the step likewise at t = SLOTS; and the last
    two as the bases their factors are taken relative to (0 for an empty sum, whose exponent is -inf)."""
    t = tl.arange(0, SLOTS)
    acc = mu.dtype
    terms = tl.where(t[None, :] < t[:, None], mu[None, :] + (t[None, :] + 1 - t[:, None]).to(acc) * carry_log,
                     float("-inf"))
    exponents = tl.maximum(nu - t.to(acc) * carry_log, tl.max(terms, 1))
    after = tl.maximum(nu - SLOTS * carry_log, tl.max(mu + (t + 1 - SLOTS).to(acc) * carry_log, 0))
    bases = tl.where(exponents > float("-inf"), exponents, 0.0)  # exp(-inf - base) = 0 for an empty sum
    base_after = tl.where(after > float("-inf"), after, 0.0)
    return terms, exponents, after, bases, base_after


@triton.jit
def _scan_part(RATE, heads, rows, n_states, d, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SD: tl.constexpr,
               BLOCK_V: tl.constexpr):
    """Where a program of the parallel passes' scan works (`_scan_sums`, `_scan_recurrence`): its batch*head row,
    direction and part (its program ids), the exponent of a carry's decay lambda BLOCK, its BLOCK_SD rows dd of the
    states and their columns vv, the offsets of those rows in its row's first slot (the normalisers'; times Dv, the
    sums'), and the offset of its row's first slot in the (directions, rows, slots) tensors."""
    row, direction, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    carry_log = tl.load(RATE + row % heads).to(ACC) * BLOCK
    dd = part * BLOCK_SD + tl.arange(0, BLOCK_SD)
    row_slots = (direction * rows + row).to(tl.int64) * n_states
    return row, direction, part, carry_log, dd, tl.arange(0, BLOCK_V), row_slots * d + dd, row_slots


@triton.jit
def _scan_slots(nq, direction, start0, start1, REVERSE: tl.constexpr, FOLD: tl.constexpr):
    """The slots of a scan's direction (those of chunks start .. nq - 1) and the first that it goes through one after
    another: forward, the first query block's (the chunks before it folded at once, `_fold_prefix`); REVERSE, the
    slot before it, G_0, the gradient of block 0's state, which the chunks before it take decayed (`_key_shares`);
    slot 0 where FOLD is 0 (`FOLD_SLOTS`)."""
    start = tl.where(direction == 1, start1, start0)
    if FOLD == 0:
        return nq - start, 0
    return nq - start, tl.maximum(-start - 1, 0) if REVERSE else -start


@triton.jit
def _fold_prefix(S, Z, MU, NU, norm, dd, vv, prefix, carry_log, d, dv, part, SLOTS: tl.constexpr):
    """A scan's chunks before the first query block (c < 0, slots 0 .. prefix - 1: in cross attention, the source
    before the targets, read backwards), whose states no query block reads, folded at once rather than scanned one
    after another: their sums x_u = exp(mu_u) x'_u (x'_u in S and Z: the program's rows dd of the states, at
    offsets `norm` in slot 0 of Z, and their columns vv; mu_u in MU, at the row's first slot) reduced to the state of
    query block 0, y = sum_u exp(-lambda BLOCK (prefix - 1 - u)) x_u, returned as y', its normaliser and nu,
    y = exp(nu) y' (zeros and -inf without such chunks); SLOTS slots a step from the last back, each thread weighing
    its own elements (no reduction across threads), the loads of a step waiting on no other step's.
    Slot prefix - 1 receives what the reverse pass's carried gradient takes of the states skipped, their sum
    sum_{c < 0} exp(-lambda BLOCK (-1 - c)) L_c = sum_u (prefix - 1 - u) exp(-lambda BLOCK (prefix - 2 - u)) x_u
    (its exponent in NU; the slots before it get -inf, no state, and keep their chunk's sums). The largest of the
    terms' exponents, the base of their weights, is the last visible slot's: mu_u lies in [-lambda BLOCK, -lambda]
    (`_chunk_sum`), so that a slot's term lies below those of the visible slots after it."""
    acc = S.dtype.element_ty
    tile = norm[:, None] * dv + vv[None, :]
    y = tl.zeros(tile.shape, dtype=acc)
    y_norm = tl.zeros(norm.shape, dtype=acc)
    skipped = tl.zeros(tile.shape, dtype=acc)  # the skipped states' sum, as exp(nu + lambda BLOCK) skipped
    skipped_norm = tl.zeros(norm.shape, dtype=acc)
    base = tl.max(tl.full((1,), float("-inf"), dtype=acc), 0)  # the base's exponent, relative to slot `base_top`
    base_top = prefix - 1
    for back in range(0, prefix, SLOTS):
        top = prefix - 1 - back
        for t in tl.static_range(SLOTS):
            u = top - t
            inside = u >= 0
            relative = tl.load(MU + u, mask=inside, other=float("-inf")) - t * carry_log  # mu_u, relative to `top`
            found = (base == float("-inf")) & (relative > float("-inf"))
            base_top = tl.where(found, top, base_top)
            base = tl.where(found, relative, base)
            weight = tl.where(relative > float("-inf"), _exp(relative - tl.where(base > float("-inf"), base, 0.0)
                                                             - (base_top - top).to(acc) * carry_log), 0.0)
            present = tl.where(inside, d, 0)  # the slot's rows, none before slot 0
            x = tl.load(S + tile + u * d * dv, mask=(dd[:, None] < present) & (vv[None, :] < dv), other=0.0)
            x_norm = tl.load(Z + norm + u * d, mask=dd < present, other=0.0)
            stacked = (prefix - 1 - u).to(acc) * weight  # x_u enters the prefix - 1 - u skipped states after it
            y += weight * x
            y_norm += weight * x_norm
            skipped += stacked * x
            skipped_norm += stacked * x_norm
            tl.store(NU + u, float("-inf"), mask=inside & (u < tl.where(part == 0, prefix - 1, 0)))  # part 0 writes
    nu = base - (prefix - 1 - base_top).to(acc) * carry_log
    if prefix > 0:
        last = prefix - 1
        tl.debug_barrier()  # every thread has read slot prefix - 1 before any writes it
        tl.store(S + tile + last * d * dv, skipped, mask=(dd[:, None] < d) & (vv[None, :] < dv))
        tl.store(Z + norm + last * d, skipped_norm, mask=dd < d)
        tl.store(NU + last, nu + carry_log, mask=part == 0)
    return y, y_norm, nu


@triton.jit
def _scan_sums(
    RATE, S, Z, MU, NU, L, LZ, LE, CARRIED, heads, rows, nq, n_states, start0, start1, d, dv, parts,
    REVERSE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SD: tl.constexpr, BLOCK_V: tl.constexpr, SLOTS: tl.constexpr,
    FOLD: tl.constexpr,
):
    """The parallel walks' sequential pass: one program per batch*head row, direction and BLOCK_SD rows of (D, Dv)
    sums x_c (and their (D,) normalisers), each held as exp(mu_c) x'_c (x'_c in the slots of chunks
    c = start .. nq - 1, mu_c in MU), replaces them in place by y_c = sum over the chunks c' before c of
    exp(-lambda BLOCK (c - c' - 1)) x_c' (y_start = 0), each as exp(nu_c) y'_c (y'_c into the slot, nu_c into NU,
    apart from MU, which the row's other parts still read): the states from the chunks' sums (`_chunk_sums`) or,
    REVERSE, over the chunks after c, the states' gradients G_{c+1} from the blocks' sums (`_query_sums`). REVERSE
    also stores its rows' part of lambda's gradient through the carries, -BLOCK exp(-lambda BLOCK) sum_c
    G_{c+1} . L_c with the states L_c = exp(LE_c) L'_c (`L`, `LZ`, `LE`), in CARRIED (directions, rows, parts).
    Forward folds the chunks before the first query block at once (`_fold_prefix`; the slot before that block's then
    holds what the carried gradient takes of their states), and REVERSE stops at that slot, G_0 (`_scan_slots`).

    The pass takes SLOTS slots a step: it reads them all, then writes each the carried sum decayed to it plus the
    decayed sums of the slots before it in the step, y_t = exp(-lambda BLOCK t) y_0 + sum_{u < t}
    exp(-lambda BLOCK (t - 1 - u)) x_u (t, u the step's positions in the pass's order), and carries y_SLOTS on, so
    that the pass waits on memory once per SLOTS slots rather than once per slot: elementwise work, where the walks
    also read every chunk's keys or queries. Each y_t gets its own exponent nu_t, the largest of its terms', so that
    no factor exceeds 1. A step's slots are read, then written in place: a barrier between the two keeps the
    program's threads from writing a slot that another of them, which holds a copy of the same values (the
    normalisers), has not read yet."""
    acc = S.dtype.element_ty
    row, direction, part, carry_log, dd, vv, at, row_slots = _scan_part(RATE, heads, rows, n_states, d, acc, BLOCK,
                                                                        BLOCK_SD, BLOCK_V)
    s_ptr, z_ptr = S + at[:, None] * dv + vv[None, :], Z + at
    s_mask, z_mask = (dd[:, None] < d) & (vv[None, :] < dv), dd < d
    t = tl.arange(0, SLOTS)
    carried = tl.sum(tl.zeros((BLOCK_SD,), dtype=acc), 0)
    slots, lo = _scan_slots(nq, direction, start0, start1, REVERSE, FOLD)
    if REVERSE or FOLD == 0:
        total = tl.zeros((BLOCK_SD, BLOCK_V), dtype=acc)  # y at the step's first slot, as exp(nu) total
        total_norm = tl.zeros((BLOCK_SD,), dtype=acc)
        nu = tl.max(tl.full((BLOCK_SD,), float("-inf"), dtype=acc), 0)  # the exponent of the sums in `total`
    else:
        total, total_norm, nu = _fold_prefix(S, Z, MU + row_slots, NU + row_slots, at, dd, vv, lo, carry_log, d, dv,
                                             part, FOLD)
    count = slots - lo
    for first in range(0, count, SLOTS):
        pos = first + t
        valid = pos < count
        index = slots - 1 - pos if REVERSE else lo + pos
        mu = tl.load(MU + row_slots + index, mask=valid, other=float("-inf"))
        _, exponents, after, bases, base_after = _step_exponents(nu, mu, carry_log, SLOTS)
        to_slots = _exp(nu - t.to(acc) * carry_log - bases)  # the carried sum's factor at each slot of the step
        ys = to_slots[:, None, None] * total[None, :, :]
        ys_norm = to_slots[:, None] * total_norm[None, :]
        carried_on = _exp(nu - SLOTS * carry_log - base_after)  # and after the step
        total = carried_on * total
        total_norm = carried_on * total_norm
        for u in tl.static_range(SLOTS):
            inside = first + u < count
            slot = slots - 1 - first - u if REVERSE else lo + first + u
            present = tl.where(inside, d, 0)  # the slot's rows, none past the last slot
            x = tl.load(s_ptr + slot * d * dv, mask=(dd[:, None] < present) & (vv[None, :] < dv), other=0.0)
            x_norm = tl.load(z_ptr + slot * d, mask=dd < present, other=0.0)
            mu_u = tl.load(MU + row_slots + slot, mask=inside, other=float("-inf"))
            weights = tl.where(t > u, _exp(mu_u + (u + 1 - t).to(acc) * carry_log - bases), 0.0)
            ys += weights[:, None, None] * x[None, :, :]
            ys_norm += weights[:, None] * x_norm[None, :]
            to_after = _exp(mu_u + (u + 1 - SLOTS) * carry_log - base_after)
            total += to_after * x
            total_norm += to_after * x_norm
        if REVERSE:
            states = tl.load(L + (at[None, :, None] + index[:, None, None] * d) * dv + vv[None, None, :],
                             mask=valid[:, None, None] & s_mask[None, :, :], other=0.0)
            norms = tl.load(LZ + at[None, :] + index[:, None] * d, mask=valid[:, None] & z_mask[None, :], other=0.0)
            state_exponents = tl.load(LE + row_slots + index, mask=valid, other=float("-inf"))
            products = tl.sum(tl.sum(ys * states, 2), 1) + tl.sum(ys_norm * norms, 1)
            carried += tl.sum(tl.where(valid, _scaled(products, exponents + state_exponents - carry_log), 0.0), 0)
        tl.store(NU + row_slots + index, exponents, mask=pos < tl.where(part == 0, count, 0))  # part 0 writes
        tl.debug_barrier()
        tl.store(s_ptr[None, :, :] + index[:, None, None] * d * dv, ys, mask=valid[:, None, None] & s_mask[None, :, :])
        tl.store(z_ptr[None, :] + index[:, None] * d, ys_norm, mask=valid[:, None] & z_mask[None, :])
        nu = after
    if REVERSE:
        tl.store(CARRIED + (direction * rows + row).to(tl.int64) * parts + part, -BLOCK * carried)


@triton.jit
def _scan_products(
    RATE, S, Z, MU, NU, L, LZ, LE, CARRIED, heads, rows, nq, n_states, start0, start1, d, dv, parts,
    REVERSE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SD: tl.constexpr, BLOCK_V: tl.constexpr, SLOTS: tl.constexpr,
    FOLD: tl.constexpr, DOT: tl.constexpr,
):
    """`_scan_sums` with each step as one product (`SCAN_PRODUCTS`): the same arguments, sums, exponents and carried
    gradient, from a step that reads its SLOTS slots' BLOCK_SD rows of the sums as one (SLOTS, BLOCK_SD BLOCK_V) tile
    X and gives every slot t of the step its y_t = exp(-lambda BLOCK t) y_0 + sum_{u < t} exp(-lambda BLOCK (t - 1 - u))
    x_u at once, as W X + the carried sum's share, with W the (SLOTS, SLOTS) lower triangle of the weights that
    `_scan_sums` adds one slot u at a time (each row t relative to its exponent nu_t): a product on the tensor cores,
    so that a step can take 32 slots where `_scan_sums`' broadcast sums hold 8 slots of 4 rows in registers, and a
    pass of 256 slots takes 8 steps rather than 32. The normalisers' BLOCK_SD rows are summed as broadcast
    products."""
    row, direction, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    acc = S.dtype.element_ty
    rate = tl.load(RATE + row % heads).to(acc)
    carry_log = rate * BLOCK
    n = tl.arange(0, BLOCK_SD * BLOCK_V)
    dd, vv = part * BLOCK_SD + n // BLOCK_V, n % BLOCK_V  # each column's row of the states and place in the row
    rr = part * BLOCK_SD + tl.arange(0, BLOCK_SD)  # the normalisers' rows
    columns, norm_columns = (dd < d) & (vv < dv), rr < d
    row_slots = (direction * rows + row).to(tl.int64) * n_states
    # the row's slots from here on, so that the offsets of a step's tiles are int32
    S, Z, L, LZ = S + row_slots * d * dv, Z + row_slots * d, L + row_slots * d * dv, LZ + row_slots * d
    MU, NU, LE = MU + row_slots, NU + row_slots, LE + row_slots
    t = tl.arange(0, SLOTS)
    carried = tl.sum(tl.zeros((SLOTS,), dtype=acc), 0)
    slots, lo = _scan_slots(nq, direction, start0, start1, REVERSE, FOLD)
    if REVERSE or FOLD == 0:
        total = tl.zeros((BLOCK_SD * BLOCK_V,), dtype=acc)  # y at the step's first slot, as exp(nu) total
        total_norm = tl.zeros((BLOCK_SD,), dtype=acc)
        nu = tl.max(tl.full((SLOTS,), float("-inf"), dtype=acc), 0)  # the exponent of the sums in `total`
    else:  # the fold's tiles are (BLOCK_SD, BLOCK_V), this scan's columns the same in order
        total, total_norm, nu = _fold_prefix(S, Z, MU, NU, rr, rr, tl.arange(0, BLOCK_V), lo, carry_log, d, dv, part,
                                             FOLD)
        total = tl.reshape(total, (BLOCK_SD * BLOCK_V,))
    count = slots - lo
    for first in range(0, count, SLOTS):
        pos = first + t
        valid = pos < count
        at = slots - 1 - pos if REVERSE else lo + pos  # the step's slots, in the pass's order
        mu = tl.load(MU + at, mask=valid, other=float("-inf"))
        terms, exponents, after, bases, base_after = _step_exponents(nu, mu, carry_log, SLOTS)
        weights = _exp(terms - bases[:, None])  # W: 0 where u >= t
        to_slots = _exp(nu - t.to(acc) * carry_log - bases)  # the carried sum's factor at each slot of the step
        to_after = _exp(mu + (t + 1 - SLOTS).to(acc) * carry_log - base_after)  # each slot's, after the step
        carried_on = _exp(nu - SLOTS * carry_log - base_after)
        x_at = (at[:, None] * d + dd[None, :]) * dv + vv[None, :]
        x_mask = valid[:, None] & columns[None, :]
        z_at = at[:, None] * d + rr[None, :]
        z_mask = valid[:, None] & norm_columns[None, :]
        x = tl.load(S + x_at, mask=x_mask, other=0.0)
        x_norm = tl.load(Z + z_at, mask=z_mask, other=0.0)
        ys = tl.dot(weights, x, input_precision=DOT) + to_slots[:, None] * total[None, :]
        ys_norm = tl.sum(weights[:, :, None] * x_norm[None, :, :], 1) + to_slots[:, None] * total_norm[None, :]
        total = carried_on * total + tl.sum(to_after[:, None] * x, 0)
        total_norm = carried_on * total_norm + tl.sum(to_after[:, None] * x_norm, 0)
        if REVERSE:
            states = tl.load(L + x_at, mask=x_mask, other=0.0)
            norms = tl.load(LZ + z_at, mask=z_mask, other=0.0)
            state_exponents = tl.load(LE + at, mask=valid, other=float("-inf"))
            products = tl.sum(ys * states, 1) + tl.sum(ys_norm * norms, 1)
            carried += tl.sum(tl.where(valid, _scaled(products, exponents + state_exponents - carry_log), 0.0), 0)
        tl.store(NU + at, exponents, mask=pos < tl.where(part == 0, count, 0))  # part 0 writes
        tl.debug_barrier()  # every thread has read the step's slots before any writes them
        tl.store(S + x_at, ys, mask=x_mask)
        tl.store(Z + z_at, ys_norm, mask=z_mask)
        nu = after
    if REVERSE:
        tl.store(CARRIED + (direction * rows + row).to(tl.int64) * parts + part, -BLOCK * carried)


@triton.jit
def _recurrence_slot(first, u: tl.constexpr, count, lo, slots, d, REVERSE: tl.constexpr):
    """Slot u of the step from place `first` of `_scan_recurrence`'s `count` places, from slot `lo` on (the slots from
    the last back, REVERSE; `_scan_slots`): whether it exists, its index, and its rows of the state (d, none past the
    last place)."""
    inside = first + u < count
    return inside, slots - 1 - first - u if REVERSE else lo + first + u, tl.where(inside, d, 0)


@triton.jit
def _scan_recurrence(
    RATE, S, Z, MU, NU, L, LZ, LE, CARRIED, heads, rows, nq, n_states, start0, start1, d, dv, parts,
    REVERSE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_SD: tl.constexpr, BLOCK_V: tl.constexpr, SLOTS: tl.constexpr,
    FOLD: tl.constexpr,
):
    """`_scan_sums` as the recurrence of the sequential walks (`SCAN_RECURRENCE`): the same arguments, sums, exponents
    and carried gradient. A step reads its SLOTS slots (and, REVERSE, the states at them), then walks them in
    order: each slot gets the sum carried so far, y, as it stands, and y' = exp(-lambda BLOCK) y + x_t follows
    (`_scaled_step`, whose exponent is the largest of its terms', as `_scan_sums`' nu_t). A slot costs each thread
    two exponentials and two multiply-adds an element, where `_scan_sums` weighs every slot of the step at every
    slot after it, each weight an exponential that every thread takes. REVERSE, lambda's gradient through the
    carries, sum_c exp(nu_c + LE_c - lambda BLOCK) G'_{c+1} . L'_c, is kept elementwise under a running exponent and
    summed over the program's threads once, at the end, instead of at every step."""
    acc = S.dtype.element_ty
    row, direction, part, carry_log, dd, vv, norm, row_slots = _scan_part(RATE, heads, rows, n_states, d, acc, BLOCK,
                                                                          BLOCK_SD, BLOCK_V)
    tile = norm[:, None] * dv + vv[None, :]
    carried = tl.zeros((BLOCK_SD, BLOCK_V), dtype=acc)  # REVERSE: lambda's gradient, as exp(carried_log) carried
    carried_norm = tl.zeros((BLOCK_SD,), dtype=acc)
    carried_log = tl.max(tl.full((BLOCK_SD,), float("-inf"), dtype=acc), 0)
    slots, lo = _scan_slots(nq, direction, start0, start1, REVERSE, FOLD)
    if REVERSE or FOLD == 0:
        total = tl.zeros((BLOCK_SD, BLOCK_V), dtype=acc)  # y, the sum carried into the next slot, as exp(nu) total
        total_norm = tl.zeros((BLOCK_SD,), dtype=acc)
        nu = tl.max(tl.full((BLOCK_SD,), float("-inf"), dtype=acc), 0)
    else:
        total, total_norm, nu = _fold_prefix(S, Z, MU + row_slots, NU + row_slots, norm, dd, vv, lo, carry_log, d,
                                             dv, part, FOLD)
    count = slots - lo
    for first in range(0, count, SLOTS):
        # every slot of the step read before any is written: the sums are replaced in place
        xs, x_norms, mus, states, state_norms, state_logs = (), (), (), (), (), ()
        for u in tl.static_range(SLOTS):
            inside, slot, present = _recurrence_slot(first, u, count, lo, slots, d, REVERSE)
            rows_in = (dd[:, None] < present) & (vv[None, :] < dv)
            xs += (tl.load(S + tile + slot * d * dv, mask=rows_in, other=0.0),)
            x_norms += (tl.load(Z + norm + slot * d, mask=dd < present, other=0.0),)
            mus += (tl.load(MU + row_slots + slot, mask=inside, other=float("-inf")),)
            if REVERSE:
                states += (tl.load(L + tile + slot * d * dv, mask=rows_in, other=0.0),)
                state_norms += (tl.load(LZ + norm + slot * d, mask=dd < present, other=0.0),)
                state_logs += (tl.load(LE + row_slots + slot, mask=inside, other=float("-inf")),)
        tl.debug_barrier()  # every thread has read the step's slots before any writes them
        for u in tl.static_range(SLOTS):
            inside, slot, present = _recurrence_slot(first, u, count, lo, slots, d, REVERSE)
            tl.store(S + tile + slot * d * dv, total, mask=(dd[:, None] < present) & (vv[None, :] < dv))
            tl.store(Z + norm + slot * d, total_norm, mask=dd < present)
            tl.store(NU + row_slots + slot, nu, mask=inside & (part == 0))  # part 0 writes
            if REVERSE:  # G_{c+1} . L_c, under the running exponent of the terms so far
                term_log = tl.where(inside, nu + state_logs[u] - carry_log, float("-inf"))
                new_log = tl.maximum(carried_log, term_log)
                base = tl.where(new_log > float("-inf"), new_log, 0.0)
                before, term = _exp(carried_log - base), _exp(term_log - base)
                carried = before * carried + term * (total * states[u])
                carried_norm = before * carried_norm + term * (total_norm * state_norms[u])
                carried_log = new_log
            nu, keep, add = _scaled_step(nu, mus[u], carry_log)
            total = keep * total + add * xs[u]
            total_norm = keep * total_norm + add * x_norms[u]
    if REVERSE:
        products = tl.sum(tl.sum(carried, 1), 0) + tl.sum(carried_norm, 0)
        carried_out = -BLOCK * _scaled(products, carried_log)
        tl.store(CARRIED + (direction * rows + row).to(tl.int64) * parts + part, carried_out)


@triton.jit
def _output_gradient(DO, SHIFT, DEN, row, heads, lq, i, inside, dv, sgb, sgh, sgl, ACC: tl.constexpr,
                     BLOCK_V: tl.constexpr):
    """What backward needs of the queries i (where `inside`) of `row`: their offset in the (rows, Lq) tensors, the
    output's gradient divided by the normaliser, gs = g / den (ACC, 0 on rows without a visible key), the row
    shift m and the normaliser den."""
    at = row.to(tl.int64) * lq + i
    den = tl.load(DEN + at, mask=inside, other=0.0)
    inv = tl.where(den > 0, 1.0 / tl.where(den > 0, den, 1.0), 0.0)
    gs = _load_rows(DO, row, heads, sgb, sgh, sgl, i, inside, dv, BLOCK_V).to(ACC) * inv[:, None]
    return at, gs, tl.load(SHIFT + at, mask=inside, other=0.0), den


@triton.jit
def _row_terms(
    Q, DO, OUT, SHIFT, DEN, DELTA, WEIGHT, GS, FQ, lq, heads, d, dv, sqb, sqh, sql, sgb, sgh, sgl, sob, soh, sol,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """What the walks of the states' gradient read of each query, BLOCK queries a program, computed once before them
    (two floats a query at each step, instead of reducing its g and out over Dv there): delta = g . out / den
    (gs = g / den, `_output_gradient`) and the log of exp(-m) / den, the row's weight in the states' gradient (-inf
    for a row without a visible key, den = 0, or without a gradient): a log, uncapped, since m can lie anywhere below
    the dtype's range (a row far past its keys). It also stores what `_backward_queries` and `_backward_keys` read
    of each query as their products' operands, in the inputs' dtype, (rows, Lq, .) each: gs and phi(q) / D, which
    `_backward_keys` would otherwise form again for every block of keys that a query's window holds."""
    b, row = tl.program_id(0), tl.program_id(1)
    i = b * BLOCK + tl.arange(0, BLOCK)
    inside = i < lq
    at, gs, m, den = _output_gradient(DO, SHIFT, DEN, row, heads, lq, i, inside, dv, sgb, sgh, sgl,
                                      DEN.dtype.element_ty, BLOCK_V)
    out = _load_rows(OUT, row, heads, sob, soh, sol, i, inside, dv, BLOCK_V).to(gs.dtype)
    weight = tl.where((den > 0) & (tl.max(tl.abs(gs), 1) > 0), -m - tl.log(tl.where(den > 0, den, 1.0)),
                      float("-inf"))
    tl.store(DELTA + at, tl.sum(gs * out, 1), mask=inside)
    tl.store(WEIGHT + at, weight, mask=inside)
    ptr, mask = _dense_rows(GS, row, lq, dv, i, inside, BLOCK_V)
    tl.store(ptr, gs.to(GS.dtype.element_ty), mask=mask)
    q = _load_rows(Q, row, heads, sqb, sqh, sql, i, inside, d, BLOCK_D)
    ptr, mask = _dense_rows(FQ, row, lq, d, i, inside, BLOCK_D)
    tl.store(ptr, _query_features(q, inside, d, gs.dtype, BLOCK_D).to(FQ.dtype.element_ty), mask=mask)


@triton.jit
def _query_rows(Q, DO, SHIFT, DEN, DELTA, WEIGHT, row, heads, lq, x, inside, qfirst, step, d, dv, sqb, sqh, sql,
                sgb, sgh, sgl, ACC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """Queries x (a direction's coordinates; memory rows qfirst + step x) with what the states' gradient needs of
    them: q (raw, ACC), gs (`_output_gradient`), -m, and delta and the log weight where `_row_terms` wrote them."""
    i = qfirst + step * x
    q = _load_rows(Q, row, heads, sqb, sqh, sql, i, inside, d, BLOCK_D).to(ACC)
    at, gs, m, _ = _output_gradient(DO, SHIFT, DEN, row, heads, lq, i, inside, dv, sgb, sgh, sgl, ACC, BLOCK_V)
    delta = tl.load(DELTA + at, mask=inside, other=0.0)
    weight = tl.load(WEIGHT + at, mask=inside, other=float("-inf"))
    return q, gs, delta, -m, weight


@triton.jit
def _query_sum(Q, DO, SHIFT, DEN, DELTA, WEIGHT, row, heads, lq, c, qfirst, step, qshift, rate, d, dv, sqb, sqh, sql,
               sgb, sgh, sgl, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
               DOT: tl.constexpr):
    """What query block c adds to the gradient of its state L_c, exp(-m_i) exp(-lambda a) phi(q_i) / D [gs_i,
    -delta_i] summed over its queries ((D, Dv) and (D,)), divided by exp(mu), mu the log of the block's largest
    exp(-m_i - lambda a) / den_i (a row whose visible keys all lie far back weighs 1 / (its keys' tiny weight),
    beyond float32's range, and exp(-lambda a) alone underflows at a fast decay), and mu."""
    x = c * BLOCK - qshift + tl.arange(0, BLOCK)
    inside = (x >= 0) & (x < lq)
    q, gs, delta, shift, weight = _query_rows(Q, DO, SHIFT, DEN, DELTA, WEIGHT, row, heads, lq, x, inside, qfirst,
                                              step, d, dv, sqb, sqh, sql, sgb, sgh, sgl, ACC, BLOCK_D, BLOCK_V)
    decay = rate * tl.arange(0, BLOCK).to(ACC)  # lambda a: the decay exp(-lambda a) from the state to query a
    weight -= decay
    mu = tl.max(weight, 0)
    # exp(-m_i - lambda a - mu) <= den_i: gs_i times it stays within g_i
    row_scale = tl.where(weight > float("-inf"), _exp(shift - decay - tl.where(mu > float("-inf"), mu, 0.0)), 0.0)
    features_q = (_elu_features(q, inside[:, None] & (tl.arange(0, BLOCK_D)[None, :] < d)) * (1.0 / d.to(ACC))
                  * row_scale[:, None])
    op = Q.dtype.element_ty
    return (tl.dot(tl.trans(features_q.to(op)), gs.to(op), input_precision=DOT),
            -tl.sum(features_q * delta[:, None], 0), mu)


@triton.jit
def _states_backward(
    Q, RATE, S, Z, SE, A, AZ, NU, DO, SHIFT, DEN, DELTA, WEIGHT, CARRIED,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, d, dv, sqb, sqh, sql, sgb, sgh, sgl,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr,
):
    """The states' gradient by a sequential walk back over the query blocks, one program per batch*head row and
    direction: G_{c+1}, the gradient of the state after chunk c, as exp(nu) G' (G' into slot c - start of A and AZ,
    nu into NU, as `_scan_sums` keeps them), and the walk's part of lambda's gradient through the carries into
    CARRIED (directions, rows), from the states L_c = exp(SE_c) L'_c (S, Z). The walk stops at chunk -1, G_0: the
    chunks before it hold no query, their gradients are G_0 decayed (`_key_shares`), and their carried terms are
    summed at once (`_folded_carries`)."""
    row, direction = tl.program_id(0), tl.program_id(1)
    acc = A.dtype.element_ty
    step, qfirst, kfirst, qshift, off_w, start, rate = _walk_start(
        RATE, row, heads, direction, lq, lk, offset, nq, start0, start1, acc, BLOCK)
    adjoint = tl.zeros((BLOCK_D, BLOCK_V), dtype=acc)  # G_{c+1} = exp(nu) adjoint
    adjoint_norm = tl.zeros((BLOCK_D,), dtype=acc)
    nu = tl.max(tl.full((BLOCK_D,), float("-inf"), dtype=acc), 0)
    carried = tl.sum(tl.zeros((BLOCK_D,), dtype=acc), 0)
    for back in range(0, nq - tl.maximum(start, -1)):
        c = nq - 1 - back
        a_ptr, az_ptr, a_mask, az_mask = _state_ptrs(A, AZ, direction, row, rows, c - start, n_states, d, dv, BLOCK_D,
                                                     BLOCK_V)
        tl.store(a_ptr, adjoint, mask=a_mask)
        tl.store(az_ptr, adjoint_norm, mask=az_mask)
        tl.store(NU + (direction * rows + row).to(tl.int64) * n_states + c - start, nu)
        s_ptr, z_ptr, s_mask, z_mask = _state_ptrs(S, Z, direction, row, rows, c - start, n_states, d, dv, BLOCK_D,
                                                   BLOCK_V)
        state_exponent = tl.load(SE + (direction * rows + row).to(tl.int64) * n_states + c - start)
        carried += _scaled(tl.sum(tl.sum(adjoint * tl.load(s_ptr, mask=s_mask, other=0.0), 1), 0)
                           + tl.sum(adjoint_norm * tl.load(z_ptr, mask=z_mask, other=0.0), 0),
                           nu + state_exponent - rate * BLOCK)
        # G_c = exp(-lambda BLOCK) G_{c+1} + the gradient of L_c from query block c (none for c < 0)
        block, block_norm, mu = _query_sum(Q, DO, SHIFT, DEN, DELTA, WEIGHT, row, heads, lq, c, qfirst, step, qshift,
                                           rate, d, dv, sqb, sqh, sql, sgb, sgh, sgl, acc, BLOCK, BLOCK_D, BLOCK_V, DOT)
        nu, old, new = _scaled_step(nu, mu, rate * BLOCK)
        adjoint = adjoint * old + block * new
        adjoint_norm = adjoint_norm * old + block_norm * new
    if start < -1:  # adjoint: G_{-1}
        carried += _folded_carries(S, Z, SE, direction, row, rows, start, n_states, d, dv, adjoint, adjoint_norm, nu,
                                   rate * BLOCK, BLOCK_D, BLOCK_V)
    tl.store(CARRIED + direction * rows + row, -BLOCK * carried)


@triton.jit
def _folded_carries(S, Z, SE, direction, row, rows, start, n_states, d, dv, adjoint, adjoint_norm, nu, carry_log,
                    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """`_states_backward`'s carried terms of the chunks c = start .. -2, before the walk's first query block, whose
    states' gradients are G_{c+1} = exp(-lambda BLOCK (-2 - c)) G_{-1} (G_{-1} = exp(nu) [adjoint, adjoint_norm]):
    sum_c exp(-lambda BLOCK) G_{c+1} . L_c = G_{-1} . sum_c exp(-lambda BLOCK (-1 - c)) L_c, the states summed
    first, each thread its own elements under a running exponent, with loads that wait on no other chunk's."""
    acc = adjoint.dtype
    states = tl.zeros((BLOCK_D, BLOCK_V), dtype=acc)
    norms = tl.zeros((BLOCK_D,), dtype=acc)
    base = tl.max(tl.full((BLOCK_D,), float("-inf"), dtype=acc), 0)
    for c in range(start, -1):
        s_ptr, z_ptr, s_mask, z_mask = _state_ptrs(S, Z, direction, row, rows, c - start, n_states, d, dv, BLOCK_D,
                                                   BLOCK_V)
        exponent = (tl.load(SE + (direction * rows + row).to(tl.int64) * n_states + c - start)
                    - (-1 - c) * carry_log)
        base, old, new = _scaled_step(base, exponent, 0.0)
        states = states * old + tl.load(s_ptr, mask=s_mask, other=0.0) * new
        norms = norms * old + tl.load(z_ptr, mask=z_mask, other=0.0) * new
    return _scaled(tl.sum(tl.sum(adjoint * states, 1), 0) + tl.sum(adjoint_norm * norms, 0), nu + base)


@triton.jit
def _query_sums(
    Q, RATE, A, AZ, NU, DO, SHIFT, DEN, DELTA, WEIGHT,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, d, dv, sqb, sqh, sql, sgb, sgh, sgl,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr, FOLD: tl.constexpr,
):
    """`_states_backward` in parallel, first of two: one program per query block c, row and direction stores what
    the block's queries add to the gradient of its state L_c, exp(-m_i) exp(-lambda a) phi(q_i) / D [gs_i, -delta_i]
    summed over them, as exp(mu) times the sums in slot c - start and mu in NU (`_query_sum`); `_scan_sums`
    (REVERSE) then turns the slots into G_{c+1}, the gradient of the state after chunk c. Only the slots that the
    scan goes through (`_scan_slots`, from the one before block 0 on where it folds): the chunks before hold no
    query."""
    row, direction = tl.program_id(1), tl.program_id(2)
    acc = A.dtype.element_ty
    step, qfirst, kfirst, qshift, off_w, start, rate = _walk_start(
        RATE, row, heads, direction, lq, lk, offset, nq, start0, start1, acc, BLOCK)
    slots, lo = _scan_slots(nq, direction, start0, start1, True, FOLD)
    index = lo + tl.program_id(0)
    if index < slots:
        block, block_norm, mu = _query_sum(Q, DO, SHIFT, DEN, DELTA, WEIGHT, row, heads, lq, start + index, qfirst,
                                           step, qshift, rate, d, dv, sqb, sqh, sql, sgb, sgh, sgl, acc, BLOCK,
                                           BLOCK_D, BLOCK_V, DOT)
        tl.store(NU + (direction * rows + row).to(tl.int64) * n_states + index, mu)
        a_ptr, az_ptr, a_mask, az_mask = _state_ptrs(A, AZ, direction, row, rows, index, n_states, d, dv, BLOCK_D,
                                                     BLOCK_V)
        tl.store(a_ptr, block, mask=a_mask)
        tl.store(az_ptr, block_norm, mask=az_mask)


@triton.constexpr_function
def _band_span(horizon, causal):
    """2h, or h when causal: the band's offsets t run over -h (1 - causal) .. h, span + 1 of them (the table's rows
    that the band reads), and a query block's window holds BLOCK + span keys."""
    return horizon * (2 - causal)


@triton.constexpr_function
def _keys_ahead(horizon, causal):
    """h, or 0 when causal: how many keys after its query the band holds; its offsets t run over -that .. h, and the
    pair at offset t reads column t + that of the table's tile (`_table_tile`)."""
    return horizon * (1 - causal)


@triton.constexpr_function
def _edge_apart(horizon, causal, block_r):
    """Whether the table's tile of BLOCK_R rows leaves the band's last row (offset t = h) apart: where the band reads
    one row more than the tile holds (`_table_tile_rows`)."""
    return _band_span(horizon, causal) == block_r


@triton.constexpr_function
def _beyond_band(first_slot, slots, horizon, causal, block):
    """Whether the window's slots first_slot .. first_slot + slots - 1 (of its BLOCK + span) hold a pair beyond the
    band of some query of the block: a slot before query a's band (slots a .. a + span), or after it unless causal.
    Causal, no slot from BLOCK - 1 on (where the last query's band starts) holds one: a tile of them is in the band
    only, or past the window."""
    last_slot = min(first_slot + slots, block + _band_span(horizon, causal)) - 1
    return first_slot <= last_slot and (first_slot < block - 1 or not causal and last_slot > 2 * horizon)


@triton.constexpr_function
def _two_sided_tiles(tiles, tile, horizon, causal, block, one_sided):
    """Where the window's tiles of `tile` slots that hold pairs on both sides of the band end, up to slot `tiles`:
    before the last one if that is in the band only (causal at h = 16 in whole tiles of 32, slots 64-95: 64-79 hold
    only the band's pairs, the others none), which the window kernels then take apart without the kernel's products
    (`_pairs`' BEYOND), where `one_sided` (`ONE_SIDED_TILES`)."""
    last = tiles - tile
    return last if one_sided and last >= 0 and not _beyond_band(last, tile, horizon, causal, block) else tiles


@triton.constexpr_function
def _walk_chunks(block_k, block, horizon, causal, aligned, direction):
    """How many chunks of the walk in `direction` a program's block of `block_k` keys in `_backward_keys` can meet:
    one more than it covers (a chunk's edge anywhere in it), or the chunks it covers where the blocks start in step
    with the walk's chunks. The forward walk's chunks start at keys s_c = c BLOCK + offset - h, the backward walk's at
    s_c + 2h, whatever the lengths; `aligned` (`ALIGNED_KEY_BLOCKS`, `_key_origin`), the blocks start at s_b causal,
    in step with the forward walk, and at s_b + 2h bidirectional, in step with the backward walk, and with the
    forward one too where 2h is a multiple of the smaller of block_k and BLOCK."""
    if aligned and (causal or direction == 1 or 2 * horizon % min(block_k, block) == 0):
        return max(1, block_k // block)
    return (block_k + block - 2) // block + 1


@triton.jit
def _in_band(t, HORIZON: tl.constexpr, CAUSAL: tl.constexpr):
    """Whether the pairs at offsets t = p_i - j lie in the band, in one comparison: 0 <= t <= h when causal,
    -h <= t <= h else."""
    return (t + _keys_ahead(HORIZON, CAUSAL)).to(tl.uint32) <= _band_span(HORIZON, CAUSAL)


@triton.jit
def _query_operands(GS, FQ, row, lq, i, queries, d, dv, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """The backward operands `_row_terms` stored for the queries i (0 for those that do not exist): phi(q) / D and
    gs = g / den, in the inputs' dtype."""
    ptr, mask = _dense_rows(FQ, row, lq, d, i, queries, BLOCK_D)
    features_q = tl.load(ptr, mask=mask, other=0.0)
    ptr, mask = _dense_rows(GS, row, lq, dv, i, queries, BLOCK_V)
    return features_q, tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def _pair_logits(q, k, qr, qe, t, band, scale, HORIZON: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_TABLE: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr):
    """l = q.(k + rel[t + h]) * scale for the pairs in the `band`, -inf elsewhere; q (M, D), k (N, D) in the inputs'
    dtype, t (M, N) the offsets p_i - j, qr (M, BLOCK_R) the queries' products with the table's rows from h CAUSAL
    on (`_table_tile`, `_block_queries`): the band's pair at offset t reads column t + h - h CAUSAL, or, for t = h
    where the tile leaves the band's last row apart, qe (M,), the queries' products with that row."""
    logits = tl.dot(q, tl.trans(k), input_precision=DOT)
    if HAS_TABLE:
        relative = tl.gather(qr, tl.minimum(tl.maximum(t + _keys_ahead(HORIZON, CAUSAL), 0), BLOCK_R - 1), axis=1)
        if _edge_apart(HORIZON, CAUSAL, BLOCK_R):  # the band's last row apart (`_table_tile`)
            relative = tl.where(t == HORIZON, qe[:, None], relative)
        logits += relative
    return tl.where(band, logits * scale, float("-inf"))


@triton.jit
def _pairs(q, k, features_q, features_k, mk, rows, cols, qr, qe, rate, scale, shift, HORIZON: tl.constexpr,
           CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr, ONLINE: tl.constexpr, BLOCK_R: tl.constexpr,
           DOT: tl.constexpr, BEYOND: tl.constexpr = True):
    """The pairs of queries (M,) and keys (N,) at offsets t = p_i - j = rows_i - cols_j (small integers, relative to
    the window), with m_j in `mk` (0 for a key that is not in the query block's window or does not exist): the band
    (|t| <= h, t >= 0 when causal, m_j > 0) with its logits (-inf off the band), and the pairs beyond it (t > h, or
    t < -h unless causal) with their decay relative to the rows' `shift` s_i, exp(-lambda (|t| - h) - s_i) m_j, and
    their kernel weights, phi(q).phi(k) / D times that (0 elsewhere): formed as one exponent, so that a row whose
    visible keys in the window all lie far beyond its band (in a gap of hidden keys, or near a padded row's edge, at
    a fast decay) keeps their weights, which exp(-lambda (|t| - h)) alone would flush to 0. ONLINE (forward's running
    sums), s_i is the largest of `shift` (the running shift), the tile's band logits and its visible pairs'
    -lambda (|t| - h) (-inf where there are none); else `shift` itself (backward's row shift m). The band's weights
    exp(l - s_i) m_j and the decays beyond it are one exponential a pair, of the pair's exponent x: its logit in the
    band, -lambda (|t| - h) beyond it if the key is visible, -inf elsewhere. A query that does not exist pairs like
    the others: its row is not stored, and backward's gradients of the keys take it with g / den = 0. Returns the
    band, its logits, the band's weights, the decays, the distances |t| - h (of use beyond the band), the kernel
    weights and s_i. Where none of the pairs lies beyond the band (not BEYOND: `_beyond_band`), the kernel's product
    and the decays are left out (the kernel weights and decays are 0)."""
    acc = rate.dtype
    t = rows[:, None] - cols[None, :]
    visible = (mk > 0)[None, :]
    offsets = rows.to(acc)[:, None] - cols.to(acc)[None, :]
    in_band = _in_band(t, HORIZON, CAUSAL)
    if not BEYOND:
        beyond = tl.zeros(t.shape, dtype=tl.int1)
        distance = tl.zeros(t.shape, dtype=acc)
    elif CAUSAL:
        beyond = t > HORIZON
        distance = offsets - HORIZON
    else:
        beyond = ~in_band
        distance = tl.abs(offsets) - HORIZON
    band = in_band & visible
    logits = _pair_logits(q, k, qr, qe, t, band, scale, HORIZON, CAUSAL, HAS_TABLE, BLOCK_R, DOT)
    exponents = tl.where(band, logits, tl.where(beyond & visible, -rate * distance, float("-inf")))
    if ONLINE:
        shift = tl.maximum(shift, tl.max(exponents, 1))
        base = tl.where(shift > float("-inf"), shift, 0.0)
        weights = _exp(exponents - base[:, None])  # at most 1: s_i is at least every exponent of the tile
    else:
        base = tl.where(shift > float("-inf"), shift, 0.0)
        weights = _exp(tl.minimum(exponents - base[:, None], _max_exponent(rate)))
    weights = weights * mk[None, :]
    band_weights = tl.where(band, weights, 0.0)
    decay = tl.where(band, 0.0, weights)  # 0 in the band, and for the pairs in neither (their exponent is -inf)
    if BEYOND:
        kernel = tl.dot(features_q, tl.trans(features_k), input_precision=DOT) * decay
    else:
        kernel = tl.zeros(t.shape, dtype=acc)
    return band, logits, band_weights, decay, distance, kernel, shift


@triton.jit
def _table_tile(TAB, row, heads, d, HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """The rows of the head's relative table (2h+1, D) that the band reads, in the inputs' dtype (unread without a
    table): all 2h+1, or when causal the h+1 rows from row h on (offsets t >= 0). They come as a tile zero-padded to
    (BLOCK_R, BLOCK_D) and the band's last row, the table's row 2h (offset t = h), padded to (BLOCK_D,): a tile of
    BLOCK_R rows holds all but that row where they are one more than BLOCK_R (`_table_tile_rows`; the row is then
    read apart), else every one (the row is then 0)."""
    rr = tl.arange(0, BLOCK_R)
    dd = tl.arange(0, BLOCK_D)
    head = TAB + (row % heads) * (2 * HORIZON + 1) * d
    mask = (rr[:, None] < _band_span(HORIZON, CAUSAL) + 1) & (dd[None, :] < d) & HAS_TABLE
    tile = tl.load(head + (HORIZON * CAUSAL + rr[:, None]) * d + dd[None, :], mask=mask, other=0.0)
    apart = HAS_TABLE & _edge_apart(HORIZON, CAUSAL, BLOCK_R)
    return tile, tl.load(head + 2 * HORIZON * d + dd, mask=(dd < d) & apart, other=0.0)


@triton.jit
def _query_features(q, queries, d, ACC: tl.constexpr, BLOCK_D: tl.constexpr):
    """phi(q) / D in ACC for the queries (rows) that exist."""
    # times 1 / D (in ACC: Triton's literals are float32): a division of every element takes some ten instructions
    return _elu_features(q.to(ACC), queries[:, None] & (tl.arange(0, BLOCK_D)[None, :] < d)) * (1.0 / d.to(ACC))


@triton.jit
def _block_queries(Q, tab, edge, row, b, lq, heads, d, sqb, sqh, sql, HORIZON: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_TABLE: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_R: tl.constexpr, DOT: tl.constexpr):
    """Query block b of `row`: its rows i, whether they exist, q and q's products with the table's tile `tab`
    (BLOCK, BLOCK_R, ACC) and with the band's last row `edge` where the tile leaves it apart (BLOCK,), which every key
    tile of the block's window reads (zeros without a table, or without that row)."""
    i = b * BLOCK + tl.arange(0, BLOCK)
    queries = i < lq
    q = _load_rows(Q, row, heads, sqb, sqh, sql, i, queries, d, BLOCK_D)
    qr = tl.zeros((BLOCK, BLOCK_R), dtype=ACC)
    qe = tl.zeros((BLOCK,), dtype=ACC)
    if HAS_TABLE:
        qr = tl.dot(q, tl.trans(tab), input_precision=DOT).to(ACC)
        if _edge_apart(HORIZON, CAUSAL, BLOCK_R):
            qe = tl.sum(q.to(ACC) * edge.to(ACC)[None, :], 1)
    return i, queries, q, qr, qe


@triton.jit
def _window_tile(K, V, MASK, row, heads, lk, start, w0, q, features_q, qr, qe, rate, scale, shift, d, dv, skb, skh,
                 skl, svb, svh, svl, HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                 HAS_TABLE: tl.constexpr, ONLINE: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr,
                 BEYOND: tl.constexpr = True):
    """Slots w = w0 .. w0 + TILE - 1 of a query block's window, the keys j = start + w (start = s_b) among its first
    BLOCK + 2h (BLOCK + h when causal: no query of the block reads a key after its last query): k, phi(k) (ACC; 0
    where no pair of the tile lies beyond the band, not BEYOND), v, m_j and their pairs with the block's queries
    relative to `shift` (`_pairs`; query a sits at offset t = a + h - w from slot w)."""
    acc = qr.dtype
    op = q.dtype
    w = w0 + tl.arange(0, TILE)
    j = start + w
    exists = (w < BLOCK + _band_span(HORIZON, CAUSAL)) & (j >= 0) & (j < lk)
    k = _load_rows(K, row, heads, skb, skh, skl, j, exists, d, BLOCK_D)
    v = _load_rows(V, row, heads, svb, svh, svl, j, exists, dv, BLOCK_V)
    mk = _key_weights(MASK, row, heads, lk, j, exists, HAS_MASK, acc)
    if BEYOND:
        features_k = _elu_features(k.to(acc), exists[:, None] & (tl.arange(0, BLOCK_D)[None, :] < d))
    else:
        features_k = tl.zeros(k.shape, dtype=acc)
    band, logits, band_weights, decay, distance, kernel, shift = _pairs(
        q, k, features_q, features_k.to(op), mk, tl.arange(0, BLOCK) + HORIZON, w, qr, qe, rate, scale, shift, HORIZON,
        CAUSAL, HAS_TABLE, ONLINE, BLOCK_R, DOT, BEYOND)
    return k, features_k, v, mk, band, logits, band_weights, decay, distance, kernel, shift


@triton.jit
def _block_state(S, Z, SE, direction, row, rows, index, n_states, d, dv, features_q, OP: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """A query block's state in one direction, L = exp(nu) L': the products of L' with the queries' features, (M, Dv)
    and (M,), L' itself and nu."""
    s_ptr, z_ptr, s_mask, z_mask = _state_ptrs(S, Z, direction, row, rows, index, n_states, d, dv, BLOCK_D, BLOCK_V)
    state = tl.load(s_ptr, mask=s_mask, other=0.0)
    norm = tl.load(z_ptr, mask=z_mask, other=0.0)
    nu = tl.load(SE + (direction * rows + row).to(tl.int64) * n_states + index)
    product = tl.dot(features_q.to(OP), state.to(OP), input_precision=DOT)
    return product, tl.sum(features_q * norm[None, :], 1), state, norm, nu


@triton.jit
def _block_states(S, Z, SE, row, b, rows, nq, n_states, start0, start1, d, dv, features_q, rate,
                  CAUSAL: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """Query block b's states in both directions (`_block_state`; the anticausal one is zero when causal), and the
    exponents of each state's weight at each query, nu - lambda a from the causal state to query a, nu - lambda
    (BLOCK - 1 - a) from the anticausal one (-inf for an empty state)."""
    acc = features_q.dtype
    a = tl.arange(0, BLOCK)
    before, before_norm, state_before, norm_before, nu = _block_state(S, Z, SE, 0, row, rows, b - start0, n_states, d,
                                                                      dv, features_q, OP, BLOCK_D, BLOCK_V, DOT)
    from_before = nu - rate * a.to(acc)
    if CAUSAL:  # no anticausal state
        after, after_norm = tl.zeros((BLOCK, BLOCK_V), dtype=acc), tl.zeros((BLOCK,), dtype=acc)
        state_after, norm_after = tl.zeros((BLOCK_D, BLOCK_V), dtype=acc), tl.zeros((BLOCK_D,), dtype=acc)
        from_after = tl.full((BLOCK,), float("-inf"), dtype=acc)
    else:
        after, after_norm, state_after, norm_after, nu = _block_state(S, Z, SE, 1, row, rows, nq - 1 - b - start1,
                                                                      n_states, d, dv, features_q, OP, BLOCK_D,
                                                                      BLOCK_V, DOT)
        from_after = nu - rate * (BLOCK - 1 - a).to(acc)
    return (from_before, before, before_norm, state_before, norm_before, from_after, after, after_norm, state_after,
            norm_after)


@triton.jit
def _forward_tile(K, V, MASK, row, heads, lk, start, w0, q, features_q, qr, qe, rate, scale, run_max, band_max,
                  window_sums, band_den, far_den, d, dv, skb, skh, skl, svb, svh, svl, HORIZON: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr,
                  TILE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
                  DOT: tl.constexpr, BEYOND: tl.constexpr = True):
    """Slots w0 .. w0 + TILE - 1 of a query block's window (`_window_tile`) added to `_forward`'s running sums: the
    band's weights exp(l) and the kernel weights beyond the band under the running largest of the band logits and
    the decays' exponents, one product with the values (the band's weights alone where no pair of the tile lies
    beyond the band, not BEYOND)."""
    op = q.dtype
    _, _, v, _, _, logits, band_weights, _, _, kernel, new_max = _window_tile(
        K, V, MASK, row, heads, lk, start, w0, q, features_q, qr, qe, rate, scale, run_max, d, dv, skb, skh, skl, svb,
        svh, svl, HORIZON, CAUSAL, HAS_MASK, HAS_TABLE, True, BLOCK, TILE, BLOCK_D, BLOCK_V, BLOCK_R, DOT, BEYOND)
    shift = tl.where(new_max > float("-inf"), new_max, 0.0)
    rescale = _exp(run_max - shift)
    weights = band_weights + kernel if BEYOND else band_weights
    window_sums = tl.dot(weights.to(op), v, window_sums * rescale[:, None], input_precision=DOT)
    band_den = band_den * rescale + tl.sum(band_weights, 1)
    far_den = far_den * rescale + tl.sum(kernel, 1) if BEYOND else far_den * rescale
    return new_max, tl.maximum(band_max, tl.max(logits, 1)), window_sums, band_den, far_den


@triton.jit
def _forward(
    Q, K, V, MASK, TAB, RATE, S, Z, SE, OUT, SHIFT, DEN,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, d, dv, sqb, sqh, sql, skb, skh, skl, svb, svh, svl,
    sob, soh, sol, scale,
    HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr,
    TILE: tl.constexpr, TILES: tl.constexpr, TAIL: tl.constexpr, ONE_SIDED: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr,
):
    b, row = tl.program_id(0), tl.program_id(1)
    two_sided = _two_sided_tiles(TILES, TILE, HORIZON, CAUSAL, BLOCK, ONE_SIDED)
    acc = S.dtype.element_ty
    op = Q.dtype.element_ty
    rate = tl.load(RATE + row % heads).to(acc)
    tab, edge = _table_tile(TAB, row, heads, d, HORIZON, CAUSAL, HAS_TABLE, BLOCK_R, BLOCK_D)
    i, queries, q, qr, qe = _block_queries(Q, tab, edge, row, b, lq, heads, d, sqb, sqh, sql, HORIZON, CAUSAL,
                                           HAS_TABLE, acc, BLOCK, BLOCK_D, BLOCK_R, DOT)
    features_q = _query_features(q, queries, d, acc, BLOCK_D).to(q.dtype)  # phi(q) / D, the window's operand
    # the window by tiles of keys (TILE wide up to TILES, then one of TAIL: `_window_tiles`): the band's weights exp(l)
    # and the kernel weights beyond the band in one running sum, under the running largest of the band logits and the
    # decays' exponents (as flash attention does with its logits): one product with the values per tile. A last tile
    # in the band only (`_two_sided_tiles`, `_beyond_band`) is taken apart, without the kernel's products
    run_max = tl.full((BLOCK,), float("-inf"), dtype=acc)
    band_max = tl.full((BLOCK,), float("-inf"), dtype=acc)  # the largest band logit, for the row shift
    window_sums = tl.zeros((BLOCK, BLOCK_V), dtype=acc)
    band_den = tl.zeros((BLOCK,), dtype=acc)  # under run_max
    far_den = tl.zeros((BLOCK,), dtype=acc)  # under run_max
    start = b * BLOCK + offset - HORIZON
    for w0 in range(0, two_sided, TILE):
        run_max, band_max, window_sums, band_den, far_den = _forward_tile(
            K, V, MASK, row, heads, lk, start, w0, q, features_q, qr, qe, rate, scale, run_max, band_max,
            window_sums, band_den, far_den, d, dv, skb, skh, skl, svb, svh, svl, HORIZON, CAUSAL, HAS_MASK, HAS_TABLE,
            BLOCK, TILE, BLOCK_D, BLOCK_V, BLOCK_R, DOT)
    if two_sided < TILES:
        run_max, band_max, window_sums, band_den, far_den = _forward_tile(
            K, V, MASK, row, heads, lk, start, two_sided, q, features_q, qr, qe, rate, scale, run_max, band_max,
            window_sums, band_den, far_den, d, dv, skb, skh, skl, svb, svh, svl, HORIZON, CAUSAL, HAS_MASK, HAS_TABLE,
            BLOCK, TILE, BLOCK_D, BLOCK_V, BLOCK_R, DOT, False)
    if TAIL > 0:
        run_max, band_max, window_sums, band_den, far_den = _forward_tile(
            K, V, MASK, row, heads, lk, start, TILES, q, features_q, qr, qe, rate, scale, run_max, band_max,
            window_sums, band_den, far_den, d, dv, skb, skh, skl, svb, svh, svl, HORIZON, CAUSAL, HAS_MASK, HAS_TABLE,
            BLOCK, TAIL, BLOCK_D, BLOCK_V, BLOCK_R, DOT, not ONE_SIDED or _beyond_band(TILES, TAIL, HORIZON, CAUSAL,
                                                                                   BLOCK))
    from_before, before, before_norm, _, _, from_after, after, after_norm, _, _ = _block_states(
        S, Z, SE, row, b, rows, nq, n_states, start0, start1, d, dv, _query_features(q, queries, d, acc, BLOCK_D),
        rate, CAUSAL, op, BLOCK, BLOCK_D, BLOCK_V, DOT)
    # the row shift m: the larger of the largest band logit and the log of the weight beyond the band, far_den +
    # exp(from_before) before_norm + exp(from_after) after_norm, summed in logs (the states' weights alone can pass
    # the dtype's range, far past every visible key); at least run_max, so that the window's factor
    # exp(run_max - m) is at most 1
    logs_far = run_max + _log_or_minus_inf(far_den)
    logs_before = from_before + _log_or_minus_inf(before_norm)
    logs_after = from_after + _log_or_minus_inf(after_norm)
    largest = tl.maximum(logs_far, tl.maximum(logs_before, logs_after))
    base = tl.where(largest > float("-inf"), largest, 0.0)
    beyond_log = base + _log_or_minus_inf(_exp(logs_far - base) + _exp(logs_before - base)
                                          + _exp(logs_after - base))
    m = tl.maximum(band_max, beyond_log)
    m = tl.where(m > float("-inf"), m, 0.0)
    window_scale = _shift_scale(m - run_max)
    weight_before, weight_after = _shift_scale(m - from_before), _shift_scale(m - from_after)
    sums = (window_scale[:, None] * window_sums + weight_before[:, None] * before
            + weight_after[:, None] * after)
    den = window_scale * (band_den + far_den) + weight_before * before_norm + weight_after * after_norm
    out = sums * tl.where(den > 0, 1.0 / tl.where(den > 0, den, 1.0), 0.0)[:, None]
    ptr, mask = _row_ptrs(OUT, row, heads, sob, soh, sol, i, queries, dv, BLOCK_V)
    tl.store(ptr, out, mask=mask)
    tl.store(SHIFT + row.to(tl.int64) * lq + i, m, mask=queries)
    tl.store(DEN + row.to(tl.int64) * lq + i, den, mask=queries)


@triton.jit
def _block_backward_inputs(Q, GS, FQ, SHIFT, DELTA, tab, edge, row, b, lq, heads, d, dv, sqb, sqh, sql,
                           HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr, ACC: tl.constexpr,
                           BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
                           DOT: tl.constexpr):
    """What backward reads of query block b: `_block_queries`' rows, q and q's products with the table, phi(q) / D and
    gs = g / den in the inputs' dtype (`_row_terms`' GS and FQ, 0 for the queries that do not exist), delta and the
    row shift m."""
    i, queries, q, qr, qe = _block_queries(Q, tab, edge, row, b, lq, heads, d, sqb, sqh, sql, HORIZON, CAUSAL,
                                           HAS_TABLE, ACC, BLOCK, BLOCK_D, BLOCK_R, DOT)
    features_q, gs = _query_operands(GS, FQ, row, lq, i, queries, d, dv, BLOCK_D, BLOCK_V)
    at = row.to(tl.int64) * lq + i
    delta = tl.load(DELTA + at, mask=queries, other=0.0)
    m = tl.load(SHIFT + at, mask=queries, other=0.0)
    return i, queries, q, features_q, qr, qe, gs, delta, m


@triton.jit
def _query_state_grads(S, Z, SE, row, b, rows, nq, n_states, start0, start1, d, dv, q, queries, gs, delta, m, rate,
                       CAUSAL: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                       DOT: tl.constexpr):
    """The gradients of a query block's queries (q, gs, delta, the row shift m) through the states of block b:
    phi(q_i) / D gets exp(-m_i) decay_i (S gs_i - delta_i z) (with L = exp(nu) L', forward's factor
    exp(nu - lambda a - m_i)), and lambda the decay's distance (by query)."""
    acc = m.dtype
    op = q.dtype
    a = tl.arange(0, BLOCK)
    features = _query_features(q, queries, d, acc, BLOCK_D)
    from_before, _, _, state_before, norm_before, from_after, _, _, state_after, norm_after = _block_states(
        S, Z, SE, row, b, rows, nq, n_states, start0, start1, d, dv, features, rate, CAUSAL, op, BLOCK, BLOCK_D,
        BLOCK_V, DOT)
    grad_features = (tl.dot(gs, tl.trans(state_before.to(op)), input_precision=DOT)
                     - delta[:, None] * norm_before[None, :]) * _shift_scale(m - from_before)[:, None]
    grad_rate = -a.to(acc) * tl.sum(features * grad_features, 1)
    if not CAUSAL:
        grad_after = (tl.dot(gs, tl.trans(state_after.to(op)), input_precision=DOT)
                      - delta[:, None] * norm_after[None, :]) * _shift_scale(m - from_after)[:, None]
        grad_rate -= (BLOCK - 1 - a).to(acc) * tl.sum(features * grad_after, 1)
        grad_features += grad_after
    return grad_features, grad_rate


@triton.jit
def _pair_rows(row, b, rows, nq, HORIZON: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
    """Where query block b of `row` keeps its window's pairs (`STORED_PAIRS`): the buffer holds two planes (rows, nq,
    BLOCK, width), width = BLOCK + 2h (BLOCK + h when causal) the window's keys; the elements from one plane to the
    other, and the offset of the block's rows a (BLOCK,) in the first, a width apart."""
    width = BLOCK + _band_span(HORIZON, CAUSAL)
    plane = tl.cast(rows, tl.int64) * nq * BLOCK * width  # rows is a constexpr where it is 1 (specialised)
    return plane, ((row.to(tl.int64) * nq + b) * BLOCK + tl.arange(0, BLOCK)[:, None]) * width


@triton.jit
def _pair_tile(PAIRS, pairs_at, w, width):
    """The pointers of a query block's pairs with window slots w in the first plane of `_pair_rows` (their weights;
    the second, a plane on, holds their gradients' factors), its rows at `pairs_at`, and which of the slots the
    window holds (w < width)."""
    return PAIRS + pairs_at + w[None, :], w[None, :] < width


@triton.jit
def _query_tile(K, V, MASK, PAIRS, row, heads, lk, start, w0, q, features_q, qr, qe, gs, delta, m, rate, scale, d,
                dv, skb, skh, skl, svb, svh, svl, plane, pairs_at, dq, grad_features, grad_rel, grad_edge, grad_rate,
                HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TABLE: tl.constexpr,
                STORED_PAIRS: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr, BEYOND: tl.constexpr = True):
    """Slots w0 .. w0 + TILE - 1 of query block b's window (`_window_tile`): their pairs' shares of the block's
    gradients, added to dq (through the band logits), grad_features (through phi(q) / D), grad_rel (the band logits'
    gradient by row of the table's tile), grad_edge (by query, through the band's last row where the tile leaves it
    apart) and grad_rate (lambda's, by query); the band's shares only where no pair of the tile lies beyond it (not
    BEYOND). STORED_PAIRS, the pairs' weights w_ij and the factors of their gradients (the band logits' in the band,
    the kernel values' beyond it) are stored for `_backward_keys`, in the inputs' dtype, as its products would take
    them (`_pair_tile`)."""
    op = q.dtype
    a = tl.arange(0, BLOCK)
    rr = tl.arange(0, BLOCK_R)
    k, features_k, v, _, _, _, band_weights, decay, distance, kernel, _ = _window_tile(
        K, V, MASK, row, heads, lk, start, w0, q, features_q, qr, qe, rate, scale, m, d, dv, skb, skh, skl, svb, svh,
        svl, HORIZON, CAUSAL, HAS_MASK, HAS_TABLE, False, BLOCK, TILE, BLOCK_D, BLOCK_V, BLOCK_R, DOT, BEYOND)
    # out = sums / den: a weight w_ij gets gs_i . v_j - delta_i
    grad_weights = tl.dot(gs, tl.trans(v), input_precision=DOT) - delta[:, None]
    grad_logits = band_weights * grad_weights * scale
    if BEYOND:
        grad_rate -= tl.sum(distance * kernel * grad_weights, 1)
    dq = tl.dot(grad_logits.to(op), k, dq, input_precision=DOT)
    # d/d(phi(q).phi(k) / D): the decay relative to m, 0 for the keys that are hidden or in the band
    grad_kernel = grad_weights * decay if BEYOND else tl.zeros_like(grad_weights)
    if STORED_PAIRS:  # each pair's factors lie on one side of the band, 0 on the other: one plane holds both
        ptrs, inside = _pair_tile(PAIRS, pairs_at, w0 + tl.arange(0, TILE), BLOCK + _band_span(HORIZON, CAUSAL))
        tl.store(ptrs, (band_weights + kernel).to(op) if BEYOND else band_weights.to(op), mask=inside)
        tl.store(ptrs + plane, (grad_logits + grad_kernel).to(op), mask=inside)
    if BEYOND:
        grad_features = tl.dot(grad_kernel.to(op), features_k.to(op), grad_features, input_precision=DOT)
    if HAS_TABLE:
        # the pair (a, w) reads table row a + 2h - w, column r = a + 2h - h CAUSAL - w of the table's tile: column r
        # of query a is window slot a + 2h - h CAUSAL - r
        slot = a[:, None] + _band_span(HORIZON, CAUSAL) - rr[None, :] - w0
        here = (slot >= 0) & (slot < TILE) & (rr[None, :] < _band_span(HORIZON, CAUSAL) + 1)
        grad_rel += tl.where(here, tl.gather(grad_logits, tl.minimum(tl.maximum(slot, 0), TILE - 1), axis=1), 0.0)
        if _edge_apart(HORIZON, CAUSAL, BLOCK_R):  # the band's last row apart: the pairs at t = h, slot w = a
            grad_edge += tl.sum(tl.where(a[:, None] == w0 + tl.arange(0, TILE)[None, :], grad_logits, 0.0), 1)
    return dq, grad_features, grad_rel, grad_edge, grad_rate


@triton.jit
def _store_query_grads(DQ, DTAB, GRAD_RATE, tab, edge, q, i, queries, row, heads, b, d, sdqb, sdqh, sdql, dq,
                       grad_features, grad_rel, grad_edge, rate_share, HORIZON: tl.constexpr, CAUSAL: tl.constexpr,
                       HAS_TABLE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr):
    """Query block b's dq (with the parts through the table and phi(q) / D), and its shares of the table's gradient
    (of the rows the band reads, `_table_tile`) and lambda's (`rate_share`), one per program (`tl.num_programs(0)` of
    them per row), stored."""
    op = q.dtype
    blocks = tl.num_programs(0)
    if HAS_TABLE:
        rr = tl.arange(0, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dq += tl.dot(grad_rel.to(op), tab, input_precision=DOT)
        dtab = tl.dot(tl.trans(grad_rel.to(op)), q, input_precision=DOT)
        # this block's share, summed over blocks and batch on the host (atomic adds would contend per head)
        table_rows = _band_span(HORIZON, CAUSAL) + 1
        share = DTAB + (row.to(tl.int64) * blocks + b) * table_rows * d
        tl.store(share + rr[:, None] * d + dd[None, :], dtab, mask=(rr[:, None] < table_rows) & (dd[None, :] < d))
        if _edge_apart(HORIZON, CAUSAL, BLOCK_R):  # the band's last row apart (`_table_tile`)
            dq += grad_edge[:, None] * edge.to(dq.dtype)[None, :]
            tl.store(share + BLOCK_R * d + dd, tl.sum(grad_edge[:, None] * q.to(dq.dtype), 0), mask=dd < d)
    dq += grad_features * _elu_slope(q.to(dq.dtype)) * (1.0 / d.to(dq.dtype))
    ptr, mask = _row_ptrs(DQ, row, heads, sdqb, sdqh, sdql, i, queries, d, BLOCK_D)
    tl.store(ptr, dq, mask=mask)
    tl.store(GRAD_RATE + row.to(tl.int64) * blocks + b, rate_share)


@triton.jit
def _backward_queries(
    Q, K, V, MASK, TAB, RATE, S, Z, SE, GS, FQ, SHIFT, DELTA, DQ, DTAB, GRAD_RATE, PAIRS,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, d, dv, sqb, sqh, sql, skb, skh, skl, svb, svh, svl,
    sdqb, sdqh, sdql, scale,
    HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TABLE: tl.constexpr,
    STORED_PAIRS: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr, TILES: tl.constexpr, TAIL: tl.constexpr,
    ONE_SIDED: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr,
):
    b, row = tl.program_id(0), tl.program_id(1)
    two_sided = _two_sided_tiles(TILES, TILE, HORIZON, CAUSAL, BLOCK, ONE_SIDED)
    plane, pairs_at = _pair_rows(row, b, rows, nq, HORIZON, CAUSAL, BLOCK)
    acc = S.dtype.element_ty
    rate = tl.load(RATE + row % heads).to(acc)
    tab, edge = _table_tile(TAB, row, heads, d, HORIZON, CAUSAL, HAS_TABLE, BLOCK_R, BLOCK_D)
    i, queries, q, features_q, qr, qe, gs, delta, m = _block_backward_inputs(
        Q, GS, FQ, SHIFT, DELTA, tab, edge, row, b, lq, heads, d, dv, sqb, sqh, sql, HORIZON, CAUSAL, HAS_TABLE, acc,
        BLOCK, BLOCK_D, BLOCK_V, BLOCK_R, DOT)
    grad_features, grad_rate = _query_state_grads(S, Z, SE, row, b, rows, nq, n_states, start0, start1, d, dv, q,
                                                  queries, gs, delta, m, rate, CAUSAL, BLOCK, BLOCK_D, BLOCK_V, DOT)
    dq = tl.zeros((BLOCK, BLOCK_D), dtype=acc)  # through the band logits
    grad_rel = tl.zeros((BLOCK, BLOCK_R), dtype=acc)  # the band logits' gradient by row of the table's tile
    grad_edge = tl.zeros((BLOCK,), dtype=acc)  # and by query through the band's last row, where it is apart
    start = b * BLOCK + offset - HORIZON
    for w0 in range(0, two_sided, TILE):  # the window's tiles as `_forward` takes them
        dq, grad_features, grad_rel, grad_edge, grad_rate = _query_tile(
            K, V, MASK, PAIRS, row, heads, lk, start, w0, q, features_q, qr, qe, gs, delta, m, rate, scale,
            d, dv, skb, skh, skl, svb, svh, svl, plane, pairs_at, dq, grad_features, grad_rel, grad_edge, grad_rate,
            HORIZON, CAUSAL, HAS_MASK, HAS_TABLE, STORED_PAIRS, BLOCK, TILE, BLOCK_D, BLOCK_V, BLOCK_R, DOT)
    if two_sided < TILES:
        dq, grad_features, grad_rel, grad_edge, grad_rate = _query_tile(
            K, V, MASK, PAIRS, row, heads, lk, start, two_sided, q, features_q, qr, qe, gs, delta, m, rate, scale,
            d, dv, skb, skh, skl, svb, svh, svl, plane, pairs_at, dq, grad_features, grad_rel, grad_edge, grad_rate,
            HORIZON, CAUSAL, HAS_MASK, HAS_TABLE, STORED_PAIRS, BLOCK, TILE, BLOCK_D, BLOCK_V, BLOCK_R, DOT, False)
    if TAIL > 0:
        dq, grad_features, grad_rel, grad_edge, grad_rate = _query_tile(
            K, V, MASK, PAIRS, row, heads, lk, start, TILES, q, features_q, qr, qe, gs, delta, m, rate, scale,
            d, dv, skb, skh, skl, svb, svh, svl, plane, pairs_at, dq, grad_features, grad_rel, grad_edge, grad_rate,
            HORIZON, CAUSAL, HAS_MASK, HAS_TABLE, STORED_PAIRS, BLOCK, TAIL, BLOCK_D, BLOCK_V, BLOCK_R, DOT,
            not ONE_SIDED or _beyond_band(TILES, TAIL, HORIZON, CAUSAL, BLOCK))
    _store_query_grads(DQ, DTAB, GRAD_RATE, tab, edge, q, i, queries, row, heads, b, d, sdqb, sdqh, sdql, dq,
                       grad_features, grad_rel, grad_edge, tl.sum(grad_rate, 0), HORIZON, CAUSAL, HAS_TABLE, BLOCK_D,
                       BLOCK_R, DOT)


@triton.jit
def _walk_share(A, AZ, direction, row, rows, slot, n_states, d, dv, v, features, to_next, mine, OP: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """The keys `mine`'s share of the gradient G = exp(nu) G' (G' in slot `slot` of `A`, `AZ`) of the state their
    chunk enters, with weights exp(-lambda (BLOCK - t)) m_j (`to_next` their exp(nu - lambda (BLOCK - t)),
    `features` phi(k) m_j, v their values): (G' v + g'_z) to_next (dphi(k) / m_j), phi(k) m_j to_next G' (their dv)
    and G' v + g'_z (for lambda's gradient), 0 for the other keys."""
    a_ptr, az_ptr, a_mask, az_mask = _state_ptrs(A, AZ, direction, row, rows, slot, n_states, d, dv, BLOCK_D, BLOCK_V)
    adjoint = tl.load(a_ptr, mask=a_mask, other=0.0)
    base = (tl.dot(v, tl.trans(adjoint.to(OP)), input_precision=DOT)
            + tl.load(az_ptr, mask=az_mask, other=0.0)[None, :])  # G v + g_z
    base = tl.where(mine[:, None], base, 0.0)
    weighted = tl.where(mine[:, None], features * to_next[:, None], 0.0)
    return base * to_next[:, None], tl.dot(weighted.to(OP), adjoint.to(OP), input_precision=DOT), base


@triton.jit
def _key_shares(A, AZ, NU, k, v, mk, j, keys, rate, row, rows, lq, lk, offset, nq, n_states, start0, start1, d, dv,
                grad_features, dv_, grad_rate, HORIZON: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr,
                ALIGNED: tl.constexpr):
    """The BLOCK_K keys j's (where `keys`; k and v in the inputs' dtype, their mask m_j) shares of the gradients
    G_{c+1} = exp(nu) G' of the states their chunks enter (`_scan_sums` or `_states_backward`), added to
    grad_features (through phi(k)), dv_ and grad_rate (lambda's, by key). In each direction, key y (j, or lk - 1 - j
    backwards) at place t of chunk c, its walk's coordinates, enters L_{c+1} with weight exp(-lambda (BLOCK - t)) m_j
    if c < nq - 1; the keys lie in one chunk or two (more if BLOCK_K > BLOCK), in one (BLOCK_K / BLOCK) of the
    forward walk's where the blocks start in step with its chunks (`_walk_chunks`)."""
    acc = mk.dtype
    op = k.dtype
    features = _elu_features(k.to(acc), keys[:, None] & (tl.arange(0, BLOCK_D)[None, :] < d)) * mk[:, None]
    for direction in tl.static_range(2):
        if direction == 0 or not CAUSAL:
            if direction == 0:
                y, qshift, off_w, start = j, 0, offset, start0
            else:
                y, qshift, off_w, start = lk - 1 - j, nq * BLOCK - lq, lk - lq - offset, start1
            place = y + qshift - off_w + HORIZON
            c = _floor_div(place, BLOCK)
            t = place - c * BLOCK
            reached = keys & (c < nq - 1)
            first_chunk = tl.min(tl.where(reached, c, nq), 0)
            for chunk in tl.static_range(_walk_chunks(BLOCK_K, BLOCK, HORIZON, CAUSAL, ALIGNED, direction)):
                mine = reached & (c == first_chunk + chunk)
                if tl.max(mine.to(tl.int32), 0) > 0:
                    # a chunk before the walk's first query block, c < 0, enters L_{c+1} with gradient
                    # G_{c+1} = exp(-lambda BLOCK (-1 - c)) G_0, read from G_0's slot (where the scans fold, the
                    # reverse scan writes no slot before it)
                    before = tl.maximum(-1 - first_chunk - chunk, 0)
                    slot = first_chunk + chunk + before - start
                    nu = (tl.load(NU + (direction * rows + row).to(tl.int64) * n_states + slot)
                          - (BLOCK * before).to(acc) * rate)
                    # exp(nu - lambda (BLOCK - t)): G's scale times the key's decay to the next chunk (bounded for a
                    # visible key: a row's weight 1 / W is at most 1 / its weight on that key)
                    to_next = tl.where(mine & (mk > 0),
                                       _exp(tl.minimum(nu - rate * (BLOCK - t).to(acc), _max_exponent(rate))), 0.0)
                    share, share_v, base = _walk_share(A, AZ, direction, row, rows, slot, n_states, d, dv, v,
                                                       features, to_next, mine, op, BLOCK_D, BLOCK_V, DOT)
                    grad_features += share * mk[:, None]
                    dv_ += share_v
                    grad_rate -= (BLOCK - t).to(acc) * to_next * tl.sum(features * base, 1)
    return grad_features, dv_, grad_rate


@triton.jit
def _key_pairs(Q, GS, FQ, SHIFT, DELTA, tab, edge, row, b, lq, heads, offset, j, keys, k, features_k, v, mk, rate,
               scale, d, dv, sqb, sqh, sql, dk, grad_features, dv_, HORIZON: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr):
    """Query block b's shares of the gradients of the keys j (where `keys`; k, phi(k) and v in the inputs' dtype,
    their mask m_j) that its window holds, added to dk (through the band logits), grad_features (through phi(k)) and
    dv_."""
    acc = mk.dtype
    op = k.dtype
    _, _, q, features_q, qr, qe, gs, delta, m = _block_backward_inputs(
        Q, GS, FQ, SHIFT, DELTA, tab, edge, row, b, lq, heads, d, dv, sqb, sqh, sql, HORIZON, CAUSAL, HAS_TABLE, acc,
        BLOCK, BLOCK_D, BLOCK_V, BLOCK_R, DOT)
    start = b * BLOCK + offset - HORIZON
    window = (j >= start) & (j < start + BLOCK + _band_span(HORIZON, CAUSAL)) & keys
    # query a of the block at offset a + h - (j - start) from key j
    _, _, band_weights, decay, _, kernel, _ = _pairs(q, k, features_q, features_k, tl.where(window, mk, 0.0),
                                                     tl.arange(0, BLOCK) + HORIZON, j - start, qr, qe, rate, scale, m,
                                                     HORIZON, CAUSAL, HAS_TABLE, False, BLOCK_R, DOT)
    weights = band_weights + kernel
    grad_weights = tl.dot(gs, tl.trans(v), input_precision=DOT) - delta[:, None]
    dv_ = tl.dot(tl.trans(weights.to(op)), gs, dv_, input_precision=DOT)
    dk = tl.dot(tl.trans((band_weights * grad_weights * scale).to(op)), q, dk, input_precision=DOT)
    grad_kernel = grad_weights * decay
    grad_features = tl.dot(tl.trans(grad_kernel.to(op)), features_q, grad_features, input_precision=DOT)
    return dk, grad_features, dv_


@triton.jit
def _stored_key_pairs(Q, GS, FQ, PAIRS, row, b, lq, heads, rows, nq, offset, j, keys, d, dv, sqb, sqh, sql, dk,
                      grad_features, dv_, HORIZON: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """`_key_pairs` from the pairs that `_backward_queries` stored (`STORED_PAIRS`): query block b's weights w_ij on
    the keys j of its window and the factors of their gradients, read rather than formed again, multiplied with its
    queries' gs = g / den (dv), q (dk, the pairs in the band) and phi(q) / D (grad_features, the pairs beyond it)."""
    a = tl.arange(0, BLOCK)
    i = b * BLOCK + a
    queries = i < lq
    q = _load_rows(Q, row, heads, sqb, sqh, sql, i, queries, d, BLOCK_D)
    features_q, gs = _query_operands(GS, FQ, row, lq, i, queries, d, dv, BLOCK_D, BLOCK_V)
    w = j - (b * BLOCK + offset - HORIZON)  # the keys' slots in the window
    plane, pairs_at = _pair_rows(row, b, rows, nq, HORIZON, CAUSAL, BLOCK)
    ptrs, inside = _pair_tile(PAIRS, pairs_at, w, BLOCK + _band_span(HORIZON, CAUSAL))
    inside = inside & (w >= 0)[None, :] & keys[None, :]
    weights = tl.load(ptrs, mask=inside, other=0.0)
    grads = tl.load(ptrs + plane, mask=inside, other=0.0)
    in_band = _in_band((a + HORIZON)[:, None] - w[None, :], HORIZON, CAUSAL)  # query a is at a + h - w from slot w
    dv_ = tl.dot(tl.trans(weights), gs, dv_, input_precision=DOT)
    dk = tl.dot(tl.trans(tl.where(in_band, grads, 0.0)), q, dk, input_precision=DOT)
    grad_features = tl.dot(tl.trans(tl.where(in_band, 0.0, grads)), features_q, grad_features, input_precision=DOT)
    return dk, grad_features, dv_


@triton.jit
def _backward_keys(
    Q, K, V, MASK, TAB, RATE, A, AZ, NU, GS, FQ, SHIFT, DELTA, DK, DV, GRAD_RATE, PAIRS,
    lq, lk, heads, rows, offset, nq, n_states, start0, start1, key_first, d, dv, sqb, sqh, sql, skb, skh, skl,
    svb, svh, svl, sdkb, sdkh, sdkl, sdvb, sdvh, sdvl, scale,
    HORIZON: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TABLE: tl.constexpr,
    STORED_PAIRS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, DOT: tl.constexpr, ALIGNED: tl.constexpr,
):
    """dk and dv of BLOCK_K keys a program from key_first on (those of 0 .. lk - 1), and their part of lambda's
    gradient (by program, into GRAD_RATE): the shares of the query blocks whose windows hold them (`_key_pairs`, or
    `_stored_key_pairs` from the pairs `_backward_queries` stored) and of the states' gradients (`_key_shares`)."""
    kb, row = tl.program_id(0), tl.program_id(1)
    acc = A.dtype.element_ty
    op = Q.dtype.element_ty
    rate = tl.load(RATE + row % heads).to(acc)
    dd = tl.arange(0, BLOCK_D)
    j0 = key_first + kb * BLOCK_K
    j = j0 + tl.arange(0, BLOCK_K)
    keys = (j >= 0) & (j < lk)
    k = _load_rows(K, row, heads, skb, skh, skl, j, keys, d, BLOCK_D)
    v = _load_rows(V, row, heads, svb, svh, svl, j, keys, dv, BLOCK_V)
    mk = _key_weights(MASK, row, heads, lk, j, keys, HAS_MASK, acc)
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=acc)  # through the band logits
    grad_features = tl.zeros((BLOCK_K, BLOCK_D), dtype=acc)  # through phi(k)
    dv_ = tl.zeros((BLOCK_K, BLOCK_V), dtype=acc)
    # the query blocks b whose window s_b .. s_b + width - 1 (s_b = b BLOCK + offset - h, width BLOCK + 2h, or
    # BLOCK + h when causal) meets these keys
    width = BLOCK + _band_span(HORIZON, CAUSAL)
    first = tl.maximum(_floor_div(j0 - offset + HORIZON - width, BLOCK) + 1, 0)
    last = tl.minimum(_floor_div(j0 + BLOCK_K - 1 - offset + HORIZON, BLOCK), nq - 1)
    if STORED_PAIRS:
        for b in range(first, last + 1):
            dk, grad_features, dv_ = _stored_key_pairs(Q, GS, FQ, PAIRS, row, b, lq, heads, rows, nq, offset, j, keys,
                                                       d, dv, sqb, sqh, sql, dk, grad_features, dv_, HORIZON, CAUSAL,
                                                       BLOCK, BLOCK_D, BLOCK_V, DOT)
    else:
        features_k = _elu_features(k.to(acc), keys[:, None] & (dd[None, :] < d)).to(op)
        tab, edge = _table_tile(TAB, row, heads, d, HORIZON, CAUSAL, HAS_TABLE, BLOCK_R, BLOCK_D)
        for b in range(first, last + 1):
            dk, grad_features, dv_ = _key_pairs(Q, GS, FQ, SHIFT, DELTA, tab, edge, row, b, lq, heads, offset, j,
                                                keys, k, features_k, v, mk, rate, scale, d, dv, sqb, sqh, sql, dk,
                                                grad_features, dv_, HORIZON, CAUSAL, HAS_TABLE, BLOCK, BLOCK_D, BLOCK_V,
                                                BLOCK_R, DOT)
    grad_features, dv_, grad_rate = _key_shares(A, AZ, NU, k, v, mk, j, keys, rate, row, rows, lq, lk, offset, nq,
                                                n_states, start0, start1, d, dv, grad_features, dv_,
                                                tl.zeros((BLOCK_K,), dtype=acc), HORIZON, CAUSAL, BLOCK, BLOCK_K,
                                                BLOCK_D, BLOCK_V, DOT, ALIGNED)
    tl.store(GRAD_RATE + row.to(tl.int64) * tl.num_programs(0) + kb, tl.sum(grad_rate, 0))
    dk += grad_features * _elu_slope(k.to(acc))
    ptr, mask = _row_ptrs(DK, row, heads, sdkb, sdkh, sdkl, j, keys, d, BLOCK_D)
    tl.store(ptr, dk, mask=mask)
    ptr, mask = _row_ptrs(DV, row, heads, sdvb, sdvh, sdvl, j, keys, dv, BLOCK_V)
    tl.store(ptr, dv_, mask=mask)


BLOCK = 64  # queries per block of the forward and backward kernels, keys per chunk of the states
# keys per tile of a query block's window (BLOCK + 2h keys, BLOCK + h when causal) in `_forward` and
# `_backward_queries`, and per program of `_backward_keys`: powers of two >= 16 (Triton's products); tiles as wide as
# the window (128 at BLOCK 64 and h = 16) hold (64, 128) tiles that spill
KEY_TILE = 32
KEY_BLOCK = 32
# the kernels of TAIL_TILES (of `_forward` and `_backward_queries`) end a window whose last tile of KEY_TILE keys would
# lie mostly past its end (BLOCK + h = 80 keys when causal at h = 16) in a narrower tile, the power of two that holds
# its last keys, at least MIN_KEY_TILE (Triton's products take no dimension under 16 on a GPU): 80 keys in tiles of
# 32, 32 and 16 instead of 32, 32 and 32, a sixth of the pairs fewer (`_window_tiles`). Compiled for sm90 (bf16, causal,
# h = 16; benchmarks/kernel_resources.py), `_forward` then holds 247 registers instead of 255 without spills and
# `_backward_queries` spills 368 bytes instead of 288. On an H200 (B=4, H=16, bf16, benchmarks/README.md) the op took
# 0.96x and 0.97x of its time with whole tiles at 16k and 64k causal with the tail in `_forward`, and no less with it
# in `_backward_queries` too (0.97x, 0.97x); bidirectional windows (96 keys) fill their tiles
TAIL_TILES: tuple[str, ...] = ("_forward",)
MIN_KEY_TILE = 16
# `_forward` and `_backward_queries` take a window's last tile apart where none of its pairs lies beyond the band
# (`_beyond_band`), without the kernel's products, features and decays: causal at h = 16, `_forward`'s last tile of
# 16 keys and `_backward_queries`' last of 32 (slots 64-95, the window's last 16 keys and 16 past its end), whose
# pairs are the band's or none. Compiled for sm90 (bf16, causal, h = 16; benchmarks/kernel_resources.py --instructions),
# the instructions a program of `_forward` runs fell from 3,873 to 3,742 and `_backward_queries`' from 6,110 to 5,037,
# with its spills from 56 to 28 bytes a thread (Triton 3.6, the H200's: 4,354 to 4,228 and 5,370 to 4,529, 68 to
# 32 bytes); bidirectional windows have no such tile at h = 16 (their machine code is unchanged). Not yet timed on a
# GPU (bench_attention_gpu.py's variant `two_sided_tiles` times the windows without it)
ONE_SIDED_TILES = True
# the narrowest tile of the head dimensions and of the relative table: narrower ones (16 or 32 wide, for D < 64 or
# h < 16) compiled by Triton 3.6 for sm90 gave wrong outputs or an invalid shared-memory read in
# `_backward_queries` (the table's gather and the products with it) on an H200; the padding is masked
MIN_TILE = 64
# the narrowest tile of the relative table's rows that the band reads (`_table_tile`: 2h+1, or h+1 from row h when
# causal): MIN_TILE, for the miscompiles above. Causal at h = 16, a tile of 32 holds the 17 rows, and the windows'
# gathers of the queries' products with them (`_pair_logits`, `_query_tile`) are half as wide (`bench_attention_gpu.py
# --variants narrow_table`)
MIN_TABLE_TILE = MIN_TILE
# where the rows the band reads are a power of two plus one (2h+1 = 33 at h = 16, 65 at h = 32; h+1 = 17 causal at
# h = 16), the tile holds all but the band's last row (offset t = h), which the window kernels read apart: one
# product a query with it, one select a pair, one row sum a tile in backward. A tile half as wide for one row: 32
# rows for 33 where MIN_TABLE_TILE allows 32. Compiled for sm90 (benchmarks/README.md), the window kernels' loops
# then take 9% fewer instructions bidirectional at h = 16; causal, 16 rows and one took more than 32 rows
# (bench_attention_gpu.py --variants narrow_table_edge: MIN_TABLE_TILE = 32 with this)
EDGE_APART = False
# the kernels hold whole rows of q, k and v and the relative table: h and D, Dv up to these, the sizes whose tiles
# (64-wide D and Dv, tables of 64 and 128 rows) were checked on a GPU; larger ones take the PyTorch path (at D = 128
# in float32, `_backward_keys` asks for more shared memory than an H100 or H200 has)
MAX_HORIZON = 63
MAX_DIM = 64
# 16-bit inputs: D, Dv up to 128 (tiles 128 wide, launched as `WIDE_LAUNCH`), checked against the float64 reference
# on a GPU (`test_triton_attention_shapes_on_cuda`; bfloat16 on an H200, float16 on an H100; benchmarks/README.md)
MAX_DIM_16BIT = 128
# launch options of each kernel: `_forward`, `_backward_queries` and `_backward_keys` as timed fastest by
# `bench_attention_gpu.py --tune` (4 and 8 warps, 1 to 3 stages; B=4, H=16, L=16384, D = Dv = 64, h = 16, bf16, on an
# H200: 0.93, 0.93 and 0.85 of the time with 8 warps, benchmarks/README.md), the others those with the fewest register
# spills that ptxas reports for sm90 (benchmarks/kernel_resources.py), where the timings did not tell them apart
LAUNCH = {"_states": dict(num_warps=8), "_chunk_sums": dict(num_warps=8), "_scan_sums": dict(num_warps=8),
          "_scan_products": dict(num_warps=8),
          "_scan_recurrence": dict(num_warps=8, maxnreg=128),
          "_query_sums": dict(num_warps=8), "_row_terms": dict(num_warps=8),
          "_states_backward": dict(num_warps=8, num_stages=2),
          "_forward": dict(num_warps=4, num_stages=1), "_backward_queries": dict(num_warps=4, num_stages=1),
          "_backward_keys": dict(num_warps=4, num_stages=2)}
# launch options of every kernel where D or Dv exceeds 64 (tiles 128 wide): one stage, 8 warps. With 16-bit inputs at
# D = Dv = 128, ptxas for sm90 gives every kernel at most 139,264 bytes of shared memory so (`_states` asked for
# 262,656 at 3 stages); in float32, `_backward_keys` asks for 294,912, more than the 232,448 of an H100 or H200
# (benchmarks/kernel_resources.py --dim 128 --value-dim 128)
WIDE_LAUNCH = dict(num_warps=8, num_stages=1)


# the states by `_chunk_sums` (every chunk at once) and `_scan_sums` (a sequential pass of elementwise work, rows of
# the states in slices of SCAN_ROWS), and their gradient by `_query_sums` and `_scan_sums`, instead of the walks of
# `_states` and `_states_backward`, which read every chunk or query block in sequence with one program per
# batch*head row and direction: True, False, or None for the parallel passes where the walks would have at most
# PARALLEL_WALK_PROGRAMS programs (rows times directions), too few to fill the device. On an H200 (132 SMs,
# benchmarks/README.md), with the scan 8 chunks a step, the parallel passes took 0.38-0.77 of the walks' time from
# 16k at B=1, H=8 (8 and 16 programs; 1.10-1.17 at 4k, where the host's launches set the time), 0.90-0.92 at B=4,
# H=16 causal (64 programs), and 1.05-1.11 with 128 programs or more
PARALLEL_WALKS = None
PARALLEL_WALK_PROGRAMS = 64
# `_scan_sums`' programs: SCAN_ROWS rows of the states each, SCAN_SLOTS chunks' slots a step. Slot by slot, the pass
# waited on memory at every slot: 335 us a call at 16k on an H100, 38% of the device time of the small model's
# training step (benchmarks/README.md). 4 rows by 8 slots with 8 warps is the widest step without register spills
# for sm90 (`benchmarks/kernel_resources.py --kernels _scan_sums --scans ...`)
SCAN_ROWS = 4
SCAN_SLOTS = 8
# the scans fold a walk's chunks before its first query block (`_fold_prefix`), FOLD_SLOTS slots a step, instead of
# passing through them one after another (0: they pass through them, as the walks do): each step's loads wait on no
# other step's. In the small model's training step at 16k source tokens and 128 target tokens
# (benchmarks/bench_dispatch.py), the cross attention's anticausal passes went through the 256 source chunks for the 2
# target blocks that read them, 12 of the step's 24 long passes. Compiled for sm90 (benchmarks/kernel_resources.py
# --forward-scans, 8 warps), `_scan_sums` folds a step of 16 slots in 741 instructions where it scans a step of 8 in
# 612 (Triton 3.6: 714 and 648), with 111 registers a thread (3.6: 128; 149 with 32 slots a step, one program of 8
# warps an SM where two fit at 128). Not yet timed on a GPU (run_gpu.sh's train_graphs_unfolded times the step with
# FOLD_SLOTS = 0)
FOLD_SLOTS = 16
# the parallel passes' scan by `_scan_products` instead of `_scan_sums`: each step one product of the decays' (SLOTS,
# SLOTS) weights with the step's sums, PRODUCT_ROWS rows of the states a program, PRODUCT_SLOTS chunks' slots a step
# (16 or more for the tensor cores): a pass of 256 slots in 8 steps of 2 rows where `_scan_sums` takes 32 of 4, half
# the programs' steps in all. Compiled for sm90 with 8 warps (benchmarks/kernel_resources.py), 255 registers a thread
# and no spills (1 x 64 spills 196 bytes). In the small model's training step under CUDA graphs on an H200 (batch 1, 8
# heads, 16k source tokens; benchmarks/README.md), `_scan_sums` took 3.97 ms of the 22.0 ms of device time, in 24
# passes of 256 slots (the encoder's states and gradients, both directions, and the cross attention's anticausal ones)
# and 12 short ones. Not yet timed on a GPU (bench_attention_gpu.py's variants `scan_products`, `scan_products_1x32`)
SCAN_PRODUCTS = False
PRODUCT_ROWS = 2
PRODUCT_SLOTS = 32
# the parallel passes' scan by `_scan_recurrence` (before SCAN_PRODUCTS): the walks' recurrence over a step's slots,
# SCAN_ROWS rows of the states a program, RECURRENCE_SLOTS chunks' slots read a step. Compiled for sm90 (8 warps, at
# most 128 registers a thread so that two programs share a multiprocessor as `_scan_sums`' 115 do; 16 slots spill
# there), a step of 8 slots takes 591 instructions where `_scan_sums` takes 848, 4 barriers where it takes 14
# (benchmarks/README.md). Not yet timed on a GPU (bench_attention_gpu.py's variant `scan_recurrence`)
SCAN_RECURRENCE = False
RECURRENCE_SLOTS = 8
# the states L_b of forward kept for backward, (directions, B*H, Lq / BLOCK, D, Dv + 1) float32 and their exponents
# held from one to the other, instead of recomputed there: one walk fewer, 7-13% less time on an H200 at B=4, H=16
# (benchmarks/README.md)
KEEP_STATES = True
# `_backward_keys`' blocks of keys start at a window's first key s_b causal and where two windows' overlap ends
# bidirectional (s_b + 2h; `_key_origin`) rather than at key 0: at h = 16, a block of 32 keys then meets one window or
# two, 1.5 on average, where from key 0 it meets two in the bidirectional case (the same 1.5 when causal); and it lies
# in one chunk of each walk (of the forward walk causal, whose chunks start at s_b; of both at h = 16 bidirectional),
# which `_key_shares` then takes alone (`_walk_chunks`), where from key 0 (or from s_b + h causal) half the blocks
# meet two
ALIGNED_KEY_BLOCKS = True
# `_backward_queries` stores each window's pairs, their weights w_ij and the factors of their gradients (two
# (B*H, Lq / BLOCK, BLOCK, BLOCK + 2h) planes in the inputs' dtype, BLOCK + h when causal), and `_backward_keys` reads
# them instead of forming every pair again: no logits, exponentials, kernel products or masks of the pairs there,
# three products a block of queries instead of seven (six without a table). The buffer holds 2 BLOCK (BLOCK + 2h)
# elements for each BLOCK queries: at B=4, H=16 and 16k in bf16, 335 MB causal, 403 MB bidirectional, for the time of
# backward (bench_attention_gpu.py --variants stored_pairs)
STORED_PAIRS = False
# the kernels' integer arguments that follow a batch's lengths, not the model: Triton compiles a kernel again for each
# new one that is 1, a multiple of 16 or neither (benchmarks/kernel_specialisations.py counts those compiles)
LENGTH_ARGUMENTS = ("lq", "lk", "rows", "offset", "nq", "n_states", "start0", "start1", "key_first", "n")
# the default attention's kernels' pointer arguments in the inputs' dtype: q, k, v, the table, the output, their
# gradients, backward's query operands (g / den and phi(q) / D) and its stored pairs (`STORED_PAIRS`); the others
# point to the compute dtype (float32 for 16-bit inputs). What a compile without tensors declares
# (tests/ops/test_triton_compiles.py, benchmarks/kernel_resources.py)
INPUT_POINTERS = ("Q", "K", "V", "TAB", "OUT", "DO", "GS", "FQ", "DQ", "DK", "DV", "PAIRS")
# eager calls run the operators' bodies through `_EagerAttention`, without `torch.library`'s dispatch (else through
# the operators, as traced calls do)
EAGER_FUNCTION = True


def _launch(kernel: str, d: int, dv: int) -> dict:
    """The launch options of `kernel` for head dimensions D and Dv (`LAUNCH`, `WIDE_LAUNCH` beyond 64)."""
    return LAUNCH[kernel] if max(d, dv) <= MIN_TILE else {**LAUNCH[kernel], **WIDE_LAUNCH}


def max_dim(dtype: torch.dtype) -> int:
    """The largest head dimensions D, Dv the kernels take for inputs of `dtype`."""
    return MAX_DIM_16BIT if dtype in (torch.bfloat16, torch.float16) else MAX_DIM


def fits(horizon: int, dim: int, value_dim: int, dtype: torch.dtype) -> bool:
    """Whether the kernels take a horizon and head dimensions this large, for inputs of `dtype`."""
    return horizon <= MAX_HORIZON and max(dim, value_dim) <= max_dim(dtype)


def _key_origin(offset: int, horizon: int, causal: bool) -> int:
    """Where `_backward_keys`' first block of KEY_BLOCK keys starts (at most 0; `ALIGNED_KEY_BLOCKS`): causal, at a
    window's first key s_b = b BLOCK + offset - h, where the forward walk's chunks start; bidirectional, where two
    windows' overlap ends (s_b + 2h), where the backward walk's start (`_walk_chunks`); or at key 0."""
    if not ALIGNED_KEY_BLOCKS:
        return 0
    return -((KEY_BLOCK - (offset - horizon + 2 * _keys_ahead(horizon, causal)) % KEY_BLOCK) % KEY_BLOCK)


def _key_blocks() -> dict:
    """How `_backward_keys` takes the keys: BLOCK_K (KEY_BLOCK) a program, from where `_key_origin` starts them
    (ALIGNED, `ALIGNED_KEY_BLOCKS`: in step with a walk's chunks, `_walk_chunks`)."""
    return dict(BLOCK_K=KEY_BLOCK, ALIGNED=ALIGNED_KEY_BLOCKS)


def _parallel_walks(rows: int, directions: int) -> bool:
    """Whether the states of `rows` batch*head rows walked in `directions` directions, and their gradient, take the
    parallel passes (`PARALLEL_WALKS`)."""
    return rows * directions <= PARALLEL_WALK_PROGRAMS if PARALLEL_WALKS is None else PARALLEL_WALKS


def _scan(d: int, dv: int, dtype: torch.dtype) -> tuple:
    """The parallel passes' scan for (D, Dv) states in `dtype`: its kernel (`_scan_recurrence` where SCAN_RECURRENCE,
    `_scan_products` where SCAN_PRODUCTS, else `_scan_sums`), its number of programs per batch*head row and
    direction, its step's constexprs and its launch options."""
    if SCAN_RECURRENCE:
        return (_scan_recurrence, triton.cdiv(d, SCAN_ROWS),
                dict(BLOCK_SD=SCAN_ROWS, SLOTS=RECURRENCE_SLOTS, FOLD=FOLD_SLOTS), _launch("_scan_recurrence", d, dv))
    if SCAN_PRODUCTS:
        return (_scan_products, triton.cdiv(d, PRODUCT_ROWS),
                dict(BLOCK_SD=PRODUCT_ROWS, SLOTS=PRODUCT_SLOTS, FOLD=FOLD_SLOTS,
                     DOT=dot_precision(dtype, half_inputs=False)), _launch("_scan_products", d, dv))
    return (_scan_sums, triton.cdiv(d, SCAN_ROWS), dict(BLOCK_SD=SCAN_ROWS, SLOTS=SCAN_SLOTS, FOLD=FOLD_SLOTS),
            _launch("_scan_sums", d, dv))


def _scan_extent(nq: int, start: int, reverse: bool) -> tuple[int, int]:
    """How a scan takes a direction's slots (chunks start .. nq - 1; `_scan_slots`): the slots it goes through one
    after another and the slots it folds at once before them (`_fold_prefix`): forward, nq and the -start chunks before
    the first query block; reverse, the nq blocks' and the one before them (none where start = 0), and none folded;
    all of them one after another where FOLD_SLOTS is 0."""
    if not FOLD_SLOTS:
        return nq - start, 0
    if reverse:
        return nq + (start < 0), 0
    return nq, -start


def _window_tiles(kernel: str, horizon: int, causal: bool) -> dict:
    """How `kernel` (`_forward` or `_backward_queries`) reads a query block's window of BLOCK + 2h keys (BLOCK + h when
    causal): tiles of KEY_TILE keys up to slot TILES, then one tile of TAIL keys (0: none), the power of two at least
    MIN_KEY_TILE that holds the keys left, where the kernel is one of TAIL_TILES and that is narrower than KEY_TILE;
    a last tile in the band only taken apart where ONE_SIDED (`ONE_SIDED_TILES`)."""
    window = BLOCK + _band_span(horizon, causal)
    rest = window % KEY_TILE
    tail = KEY_TILE
    if rest and kernel in TAIL_TILES:
        tail = min(KEY_TILE, max(MIN_KEY_TILE, triton.next_power_of_2(rest)))
    if tail == KEY_TILE:
        return dict(TILES=triton.cdiv(window, KEY_TILE) * KEY_TILE, TAIL=0, ONE_SIDED=ONE_SIDED_TILES)
    return dict(TILES=window - rest, TAIL=tail, ONE_SIDED=ONE_SIDED_TILES)


def _table_rows(horizon: int, causal: bool) -> tuple[int, int]:
    """The rows of the relative table (2h+1) that the band reads, as (first, count): all of them, or when causal the
    h+1 from row h on (`_table_tile`)."""
    return (horizon, horizon + 1) if causal else (0, 2 * horizon + 1)


def _table_tile_rows(horizon: int, causal: bool) -> int:
    """BLOCK_R, the rows of the kernels' tile of the relative table (`_table_tile`): the power of two, at least
    MIN_TABLE_TILE, that holds the rows the band reads, or one row fewer, where those are a power of two plus one and
    the band's last row is read apart (`EDGE_APART`)."""
    rows = _table_rows(horizon, causal)[1]
    pow2 = triton.next_power_of_2
    if EDGE_APART and rows > 2 and pow2(rows - 1) == rows - 1 >= MIN_TABLE_TILE:
        return rows - 1
    return max(MIN_TABLE_TILE, pow2(rows))


def _sizes(horizon: int, d: int, dv: int, causal: bool) -> dict:
    pow2 = triton.next_power_of_2
    return dict(BLOCK=BLOCK, TILE=KEY_TILE, BLOCK_D=max(MIN_TILE, pow2(d)), BLOCK_V=max(MIN_TILE, pow2(dv)),
                BLOCK_R=_table_tile_rows(horizon, causal))


class _Walk(NamedTuple):
    """How the states of one call are laid out. In direction 0 the queries x and keys y are the sequences' rows; in
    direction 1 (the anticausal states, bidirectional only) they are read reversed: x = Lq - 1 - i, y = Lk - 1 - j,
    query x at position x + Lk - Lq - offset, and the query blocks shifted by nq BLOCK - Lq so that they hold the
    same queries. In both, query block b holds x = b BLOCK - shift .. and chunk c the keys y = s_c .. s_c + BLOCK - 1,
    s_c = c BLOCK - shift + offset - h (offset of that direction): the keys before s_b are those beyond the band of
    every query of block b, and L_b = sum_{y < s_b} exp(-lambda (s_b - y)) phi(k_y) m_y [v_y, 1]^T is its state.
    The walks cover the chunks `starts[direction]` .. nq - 1 (the first holds key 0, or is chunk 0)."""

    nq: int
    starts: tuple[int, int]
    n_states: int

    @classmethod
    def of(cls, lq: int, lk: int, offset: int, horizon: int, causal: bool) -> "_Walk":
        nq = triton.cdiv(lq, BLOCK)
        starts = [min(0, (horizon - offset) // BLOCK)]
        starts.append(0 if causal else min(0, (horizon + nq * BLOCK - lq - (lk - lq - offset)) // BLOCK))
        return cls(nq, tuple(starts), nq - min(starts))


def _strides(*tensors: torch.Tensor) -> list[int]:
    """The (batch, head, position) strides of (B, H, L, .) tensors, in order."""
    return [s for t in tensors for s in t.stride()[:3]]


def _layouts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k and v as the kernels read them: with their strides, unless their last dimension is strided."""
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))


def _state_buffers(rate: torch.Tensor, causal: bool, rows: int, n_states: int, d: int,
                   dv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty states L' (directions, rows, n_states, D, Dv), their normalisers (directions, rows, n_states, D) and
    their exponents nu (directions, rows, n_states), L = exp(nu) L', in rate's dtype (none, n_states 0, where forward
    does not keep them for backward)."""
    directions = 1 if causal else 2
    return (rate.new_empty(directions, rows, n_states, d, dv), rate.new_empty(directions, rows, n_states, d),
            rate.new_empty(directions, rows, n_states))


def _output_buffers(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward op's outputs but the states, empty: out (B, H, Lq, Dv) in q's dtype, stored as (B, Lq, H, Dv) (so
    that merging the heads is a view), and the row shift and normaliser (B*H, Lq)."""
    b, heads, lq, _ = q.shape
    out = q.new_empty(b, lq, heads, v.shape[-1]).transpose(1, 2)
    shift, den = (q.new_empty(b * heads, lq, dtype=compute_dtype(q.dtype)) for _ in range(2))
    return out, shift, den


def _forward_body(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None,
                  decay: torch.Tensor, key_mask: torch.Tensor | None, causal: bool, offset: int, horizon: int, dot: str,
                  kept: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor]:
    """The kernels' forward (the body of `_forward_op`, an operator opaque to torch.compile, which traces the model
    around it): the output, the row shift and normaliser, and the `kept` states of each direction and row kept for
    backward (`_kept_states`: all of the walk's, or none), with their normalisers and exponents."""
    q, k, v = _layouts(q, k, v)
    b, heads, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    acc = compute_dtype(q.dtype)
    mask = None if key_mask is None else key_mask.to(acc).contiguous()
    rate = decay.to(acc).contiguous()
    walk = _Walk.of(lq, lk, offset, horizon, causal)
    if kept not in (0, walk.n_states):
        raise ValueError(f"kept must be 0 or the walk's {walk.n_states} states, got {kept}")
    states, norms, scales = _walk_states(k, v, mask, rate, walk, heads, lq, offset, horizon, causal, dot)
    out, shift, den = _output_buffers(q, v)
    _forward[(walk.nq, b * heads)](
        q, k, v, k if mask is None else mask, q if table is None else table, rate, states, norms, scales, out, shift,
        den,
        lq, lk, heads, b * heads, offset, walk.nq, walk.n_states, *walk.starts, d, dv, *_strides(q, k, v, out),
        1.0 / math.sqrt(d), HORIZON=horizon, CAUSAL=causal, HAS_MASK=mask is not None, HAS_TABLE=table is not None,
        DOT=dot, **_sizes(horizon, d, dv, causal), **_window_tiles("_forward", horizon, causal),
        **_launch("_forward", d, dv))
    if not kept:
        return out, shift, den, *_state_buffers(rate, causal, b * heads, 0, d, dv)
    for direction, start in enumerate(walk.starts[:states.shape[0]]):
        if walk.nq - start < walk.n_states:  # the slots this direction's walk leaves: empty, not what memory held
            states[direction, :, walk.nq - start:] = 0
            norms[direction, :, walk.nq - start:] = 0
            scales[direction, :, walk.nq - start:] = float("-inf")
    return out, shift, den, states, norms, scales


_forward_op = torch.library.custom_op(f"{LIBRARY}::local_softmax_decay_forward", _forward_body, mutates_args=())


@_forward_op.register_fake
def _(q, k, v, table, decay, key_mask, causal, offset, horizon, dot, kept):
    q, k, v = _layouts(q, k, v)
    b, heads, lq, d = q.shape
    return (*_output_buffers(q, v),
            *_state_buffers(decay.to(compute_dtype(q.dtype)), causal, b * heads, kept, d, v.shape[-1]))


def _kept_states(lq: int, lk: int, offset: int, horizon: int, causal: bool) -> int:
    """How many states of each direction and row forward keeps for backward (`KEEP_STATES`): all of the walk's, or
    0. An argument of the forward operator, from which its fake takes the shapes, so that what sets them is in the
    graph that torch.compile traces, and in the key under which Inductor caches what it compiled from it (a cached
    graph would otherwise keep the states' shape of whatever layout compiled it)."""
    return _Walk.of(lq, lk, offset, horizon, causal).n_states if KEEP_STATES else 0


def _gradient_buffers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None,
                      horizon: int) -> tuple[torch.Tensor, ...]:
    """The backward op's outputs, empty: dq, dk, dv written with strides of their own (`empty_like` keeps an input's
    layout where it is dense, and is contiguous where the input is a slice of a larger tensor or expanded over heads,
    stride 0), the table's gradient (H, 2h+1, D) (or empty) and the decay rates' (H,), in float32 or float64."""
    q, k, v = _layouts(q, k, v)
    heads, d = q.shape[1], q.shape[-1]
    acc = compute_dtype(q.dtype)
    dtable = q.new_empty(0, dtype=acc) if table is None else q.new_empty(heads, 2 * horizon + 1, d, dtype=acc)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dtable, q.new_empty(heads, dtype=acc)


def _backward_body(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   table: torch.Tensor | None, decay: torch.Tensor, key_mask: torch.Tensor | None, out: torch.Tensor,
                   shift: torch.Tensor, den: torch.Tensor, states: torch.Tensor, norms: torch.Tensor,
                   scales: torch.Tensor, causal: bool, offset: int, horizon: int,
                   dot: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels' backward (the body of `_backward_op`): dq, dk, dv, the table's gradient (empty without a table) and
    the decay rates' (in float32, or float64), from forward's inputs and outputs (its states recomputed where they
    were not kept, `states` empty)."""
    q, k, v = _layouts(q, k, v)
    g = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    b, heads, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    rows = b * heads
    acc = compute_dtype(q.dtype)
    mask = None if key_mask is None else key_mask.to(acc).contiguous()
    rate = decay.to(acc).contiguous()
    walk = _Walk.of(lq, lk, offset, horizon, causal)
    if states.numel() == 0:
        states, norms, scales = _walk_states(k, v, mask, rate, walk, heads, lq, offset, horizon, causal, dot)
    delta = torch.empty_like(den)
    gs, features = q.new_empty(rows, lq, dv), q.new_empty(rows, lq, d)
    sizes = _sizes(horizon, d, dv, causal)
    mask_arg = k if mask is None else mask
    common = dict(HORIZON=horizon, HAS_MASK=mask is not None, DOT=dot, BLOCK=BLOCK, BLOCK_D=sizes["BLOCK_D"],
                  BLOCK_V=sizes["BLOCK_V"])
    adjoints, adjoint_norms, adjoint_scales, grad_rate_walk = _walk_adjoints(q, lk, rate, states, norms, scales, g,
                                                                             out, shift, den, delta, gs, features,
                                                                             walk, heads, offset, common)
    dq, dk, dv_, grad_table, grad_rate = _gradient_buffers(q, k, v, table, horizon)
    scale = 1.0 / math.sqrt(d)
    tensors = (q, k, v, mask_arg, q if table is None else table, rate)
    flags = dict(CAUSAL=causal, HAS_TABLE=table is not None, STORED_PAIRS=STORED_PAIRS,
                 **{key: common[key] for key in ("HORIZON", "HAS_MASK", "DOT")})
    first_row, table_rows = _table_rows(horizon, causal)
    dtable = None if table is None else den.new_empty(rows, walk.nq, table_rows, d)
    grad_rate_queries = den.new_empty(rows, walk.nq)
    pairs = q.new_empty(2, rows, walk.nq, BLOCK, BLOCK + _band_span(horizon, causal)) if STORED_PAIRS else q
    _backward_queries[(walk.nq, rows)](
        *tensors, states, norms, scales, gs, features, shift, delta, dq, den if dtable is None else dtable,
        grad_rate_queries, pairs, lq, lk, heads, rows, offset, walk.nq, walk.n_states, *walk.starts, d, dv,
        *_strides(q, k, v, dq), scale,
        **flags, **sizes, **_window_tiles("_backward_queries", horizon, causal),
        **_launch("_backward_queries", d, dv))
    first = _key_origin(offset, horizon, causal)
    key_blocks = triton.cdiv(lk - first, KEY_BLOCK)
    grad_rate_keys = den.new_empty(rows, key_blocks)
    if key_blocks:
        _backward_keys[(key_blocks, rows)](
            *tensors, adjoints, adjoint_norms, adjoint_scales, gs, features, shift, delta, dk, dv_, grad_rate_keys,
            pairs, lq, lk, heads, rows, offset, walk.nq, walk.n_states, *walk.starts, first, d, dv,
            *_strides(q, k, v, dk, dv_), scale, BLOCK_R=sizes["BLOCK_R"], **flags, **_key_blocks(),
            **{key: common[key] for key in ("BLOCK", "BLOCK_D", "BLOCK_V")}, **_launch("_backward_keys", d, dv))
    torch.sum((grad_rate_walk.flatten(2).sum(2).sum(0) + grad_rate_queries.sum(1) + grad_rate_keys.sum(1)).view(
        b, heads), 0, out=grad_rate)
    if dtable is not None:
        shares = dtable.view(b, heads, walk.nq, table_rows, d)
        if first_row:  # causal: the rows before h, which the band does not read, have no gradient
            grad_table[:, :first_row] = 0
            torch.sum(shares, (0, 2), out=grad_table[:, first_row:])
        else:
            torch.sum(shares, (0, 2), out=grad_table)
    return dq, dk, dv_, grad_table, grad_rate


_backward_op = torch.library.custom_op(f"{LIBRARY}::local_softmax_decay_backward", _backward_body, mutates_args=())


@_backward_op.register_fake
def _(grad_out, q, k, v, table, decay, key_mask, out, shift, den, states, norms, scales, causal, offset, horizon, dot):
    return _gradient_buffers(q, k, v, table, horizon)


def _save_for_backward(ctx, inputs, output):
    q, k, v, table, decay, key_mask, causal, offset, horizon, dot, _ = inputs
    out, shift, den, states, norms, scales = output
    ctx.save_for_backward(q, k, v, table, decay, key_mask, out, shift, den, states, norms, scales)
    ctx.call = (causal, offset, horizon, dot)
    # the outputs but `out` take no gradient: None for them, not zeros as large as the kept states
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, *_, backward=_backward_op):
    q, k, v, table, decay, key_mask, out, shift, den, states, norms, scales = ctx.saved_tensors
    if grad_out is None:
        return (None,) * 11
    dq, dk, dv, grad_table, grad_rate = backward(grad_out, q, k, v, table, decay, key_mask, out, shift, den, states,
                                                 norms, scales, *ctx.call)
    grad_table = None if table is None else grad_table.to(table.dtype)
    return dq, dk, dv, grad_table, grad_rate.to(decay.dtype), None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_save_for_backward)


class _EagerAttention(torch.autograd.Function):
    """The two operators' bodies and the same autograd, without `torch.library`'s dispatch: what eager calls take.
    The dispatch's Python layers (the autograd wrapper, filling defaults, the aliasing check, the backend's wrapper,
    once for forward and once for backward) cost the host more than the forward's body at batch 1, where the host's
    launches set the time of a training step; torch.compile traces the operators instead."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward_body(*inputs)
        _save_for_backward(ctx, inputs, output)
        ctx.mark_non_differentiable(*output[1:])
        return output

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads, backward=_backward_body)


def _walk_adjoints(q, lk: int, rate, states, norms, state_scales, g, out, shift, den, delta, gs, features,
                   walk: _Walk, heads: int, offset: int, common: dict):
    """The states' gradients G_{c+1} = exp(nu) G' in the states' layout: G' (and its normaliser's part) and nu
    (directions, rows, slots), by `_query_sums` then `_scan_sums` (`PARALLEL_WALKS`) or by `_states_backward`'s
    sequential walk; delta into `delta`, g / den and phi(q) / D into `gs` and `features` (`_row_terms`); and the
    walks' part of lambda's gradient through the carries, (directions, rows, parts)."""
    directions, rows, slots, d, dv = states.shape
    lq = q.shape[2]
    adjoints, adjoint_norms = states.new_empty(states.shape), norms.new_empty(norms.shape)
    scales = den.new_empty(directions, rows, slots)
    sizes = dict(BLOCK=BLOCK, BLOCK_D=common["BLOCK_D"], BLOCK_V=common["BLOCK_V"])
    weight = torch.empty_like(den)
    _row_terms[(triton.cdiv(lq, BLOCK), rows)](q, g, out, shift, den, delta, weight, gs, features, lq, heads, d, dv,
                                               *_strides(q, g, out), BLOCK=BLOCK, BLOCK_D=common["BLOCK_D"],
                                               BLOCK_V=common["BLOCK_V"], **_launch("_row_terms", d, dv))
    if not _parallel_walks(rows, directions):
        carried = den.new_empty(directions, rows, 1)
        _states_backward[(rows, directions)](
            q, rate, states, norms, state_scales, adjoints, adjoint_norms, scales, g, shift, den, delta, weight,
            carried, lq, lk, heads, rows, offset, walk.nq, slots, *walk.starts, d, dv, *_strides(q, g),
            DOT=common["DOT"], **sizes, **_launch("_states_backward", d, dv))
        return adjoints, adjoint_norms, scales, carried
    block_scales = den.new_empty(directions, rows, slots)
    scanned = max(_scan_extent(walk.nq, start, reverse=True)[0] for start in walk.starts[:directions])
    _query_sums[(scanned, rows, directions)](
        q, rate, adjoints, adjoint_norms, block_scales, g, shift, den, delta, weight, lq, lk, heads, rows, offset,
        walk.nq, slots, *walk.starts, d, dv, *_strides(q, g), DOT=common["DOT"], FOLD=FOLD_SLOTS, **sizes,
        **_launch("_query_sums", d, dv))
    scan, parts, step, launch = _scan(d, dv, adjoints.dtype)
    carried = den.new_empty(directions, rows, parts)
    scan[(rows, directions, parts)](
        rate, adjoints, adjoint_norms, block_scales, scales, states, norms, state_scales, carried, heads, rows,
        walk.nq, slots, *walk.starts, d, dv, parts, REVERSE=True, BLOCK=BLOCK, BLOCK_V=common["BLOCK_V"], **step,
        **launch)
    return adjoints, adjoint_norms, scales, carried


def _walk_states(k, v, mask, rate, walk: _Walk, heads: int, lq: int, offset: int, horizon: int, causal: bool,
                 dot: str):
    """The states L_b = exp(nu_b) L'_b of every query block in each direction: L'_b, its normaliser and nu_b
    (`_state_buffers`), by `_chunk_sums` then `_scan_sums` (`PARALLEL_WALKS`), or by `_states`' sequential walk."""
    b, _, lk, d = k.shape
    dv = v.shape[-1]
    rows = b * heads
    states, norms, scales = _state_buffers(rate, causal, rows, walk.n_states, d, dv)
    directions = states.shape[0]
    sizes = _sizes(horizon, d, dv, causal)
    parallel = _parallel_walks(rows, directions)
    chunk_scales = torch.empty_like(scales) if parallel else scales
    args = (k, v, k if mask is None else mask, rate, states, norms, chunk_scales, lq, lk, heads, rows, offset, walk.nq,
            walk.n_states, *walk.starts, d, dv, *_strides(k, v))
    walk_sizes = dict(HORIZON=horizon, HAS_MASK=mask is not None, BLOCK=BLOCK, BLOCK_D=sizes["BLOCK_D"],
                      BLOCK_V=sizes["BLOCK_V"], DOT=dot)
    if not parallel:
        _states[(rows, directions)](*args, **walk_sizes, **_launch("_states", d, dv))
        return states, norms, scales
    _chunk_sums[(walk.n_states, rows, directions)](*args, **walk_sizes, **_launch("_chunk_sums", d, dv))
    scan, parts, step, launch = _scan(d, dv, states.dtype)
    scan[(rows, directions, parts)](
        rate, states, norms, chunk_scales, scales, states, norms, scales, rate, heads, rows, walk.nq, walk.n_states,
        *walk.starts, d, dv, parts, REVERSE=False, BLOCK=BLOCK, BLOCK_V=sizes["BLOCK_V"], **step, **launch)
    return states, norms, scales


def _traced() -> bool:
    """Whether the call is traced rather than run: by torch.compile or torch.export, or under a dispatch mode (fake
    tensors, make_fx). It then takes the operators, whose fake implementations give the outputs' shapes without the
    kernels, and which the traced graph records."""
    return torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0


def local_softmax_decay(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None,
                        decay: torch.Tensor, *, causal: bool, key_mask: torch.Tensor | None, query_offset: int,
                        horizon: int) -> torch.Tensor:
    """The linear path of `ops_local_softmax.local_softmax_decay_attention` on CUDA (`_EagerAttention`, or the
    operator `_forward_op` where torch.compile traces it), for inputs that `fits` takes; `table` is the per-head
    table (H, 2h+1, D) in q's dtype or None."""
    if not fits(horizon, q.shape[-1], v.shape[-1], q.dtype):
        raise ValueError(f"the Triton kernels take h <= {MAX_HORIZON} and D, Dv <= {max_dim(q.dtype)} for {q.dtype}, "
                         f"got h={horizon}, D={q.shape[-1]}, Dv={v.shape[-1]}")
    acc = compute_dtype(q.dtype)
    dot = dot_precision(acc, half_inputs=acc != q.dtype)
    table = None if table is None else table.contiguous()
    kept = _kept_states(q.shape[2], k.shape[2], query_offset, horizon, causal)
    attend = _EagerAttention.apply if EAGER_FUNCTION and not _traced() else _forward_op
    return attend(q, k, v, table, decay, key_mask, causal, query_offset, horizon, dot, kept)[0]


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
def _merge(logits, values, far, far_log, vv, dv1):
    """One query's output from its band logits (W,) on the window's [m v, m] `values` (W, V) and its sum beyond the
    band exp(far_log) `far` (V,): exp(l - m) values + exp(far_log - m) far, m the larger of the largest logit and
    far_log + log(far's last channel) (0 for a row with neither), normalised by the last channel (0 for a row with
    no visible key)."""
    far_sum = tl.sum(tl.where(vv == dv1 - 1, far, 0.0), 0)
    m = tl.maximum(tl.max(logits, 0), far_log + _log_or_minus_inf(far_sum))
    m = tl.where(m > float("-inf"), m, 0.0)
    sums = tl.sum(_exp(logits - m)[:, None] * values, 0) + _shift_scale(m - far_log) * far
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
    out = _merge(logits, values, far, 0.0, vv, dv1)
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
    # beyond it: phi(q).phi(k_j) / D exp(-lambda (|p - j| - h)), by blocks of keys (hidden keys hold [0, 0]), summed
    # as exp(-lambda (nearest - h)) times the weights' ratios to that decay, nearest the distance of the nearest
    # key beyond the band: a query however far past the keys keeps its weights, which would underflow one by one
    nearest = tl.where(p - HORIZON - 1 < lk, HORIZON + 1, p - lk + 1)
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
        weight = tl.sum(k_features * q_features[None, :], 1) / d * _exp(-rate * (distance - nearest).to(rate.dtype))
        far += tl.sum(tl.where(beyond, weight, 0.0)[:, None] * vm, 0)
    out = _merge(logits, values, far, -rate * (nearest - HORIZON).to(rate.dtype), vv, dv1)
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


__all__ = ["cross_decode", "decode_step", "fits", "local_softmax_decay"]
