"""Triton kernels of the decayed tails of `ops_decay` (the linear part of the default attention), for CUDA.

The pass of `ops_decay.decayed_tail` computes, for x, y (B, H, L, E), v (B, H, L, Dv), a rate lambda >= 0 per head
and an optional initial state S_init (B, H, E, Dv),

    out_m = sum_{j <= m} exp(-lambda (m + 1 - j)) x_m.y_j v_j  +  exp(-lambda (m + 1)) x_m S_init

by chunks of T positions, with the state S_c = sum_{j < cT} exp(-lambda (cT - 1 - j)) y_j v_j^T (+ the decayed
initial state) carried between them. In PyTorch (`ops_decay._decayed_prefix`) that is several batched products
per chunk, a scan launched once per chunk, and copies: the span of queries and keys the pass covers is sliced
and padded, and the anticausal tail reverses the sequences. `TritonDecayedTail` computes the same in five
kernels laid out like flash-linear-attention's chunk kernels (states, then outputs; backward likewise), reading
the span and the reversal in place (`_Span`):

- `_states_forward`: one program per row and (E, Dv) block of the state walks the chunks with the state in
  registers, S_{c+1} = exp(-lambda T) S_c + (y_c * exp(-lambda (T - 1 - b)))^T v_c, and stores S_0 .. S_{n-1};
- `_output_forward`: one program per chunk, row and block of Dv: out_c = (x_c * exp(-lambda (a + 2))) S_c
  + (x_c y_c^T * M) v_c, with M_ab = exp(-lambda (a + 1 - b)) for a >= b (a, b positions within the chunk);
- `_states_backward`: the adjoint G_c of the state after chunk c, walked back from G_{n-1} = 0 by
  G_{c-1} = exp(-lambda T) G_c + (x_c * exp(-lambda (a + 2)))^T dout_c; stores G_c, gives the initial state's
  gradient and each block's share of the carry's gradient, sum_c G_c . S_c;
- `_grad_xy`: one program per chunk and row: dx and dy from the chunk's products, S_c and G_c, and the chunk's
  share of lambda's gradient; `_grad_v`: one program per chunk, row and block of Dv: dv from the chunk's scores
  and G_c (the transpose of `_output_forward`).

lambda's gradient is a sum of local terms (offsets within a chunk, T for the carry), never a product of
absolute positions, so it keeps its digits on long inputs. Products accumulate in float32 (float64 for float64
inputs; `dot_precision` says how float32 operands are multiplied). T is `CHUNK`, whatever chunk the PyTorch path
uses. Triton is an optional dependency: this module is imported only for CUDA tensors (or by tests under
TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


try:
    import triton
    import triton.language as tl
except ImportError as error:  # optional (the `gpu` extra): `ops_decay` falls back to PyTorch without it
    raise ImportError("the Triton kernels of the default attention need `pip install triton`") from error

from .ops_common import compute_dtype


CHUNK = 64  # T: positions per chunk (a power of two, at least 16)
STATE_BLOCK_E = 64  # state rows per program of the state kernels
STATE_BLOCK_V = 32  # state columns per program of the state kernels and of the output kernel
MAX_DIM = 256  # `_grad_xy` holds a chunk's x and y whole: E up to this


def fits(dim: int) -> bool:
    """Whether the kernels take features of width `dim` (E); any Dv fits."""
    return dim <= MAX_DIM


def dot_precision(dtype: torch.dtype, half_inputs: bool) -> str:
    """Triton's input precision for the kernels' products of operands in `dtype`. Operands that came from 16-bit
    floats (`half_inputs`) are exact in TF32, so those calls use the tensor cores' TF32 mode, as float32 inputs
    do where `torch.get_float32_matmul_precision()` allows it; at "highest" (PyTorch's default) float32 products
    use three TF32 products (about float32's accuracy), and float64 ones are exact."""
    if dtype == torch.float64:
        return "ieee"
    if half_inputs or _float32_matmul_precision() != "highest":
        return "tf32"
    return "tf32x3"


@torch.compiler.assume_constant_result
def _float32_matmul_precision() -> str:
    """`torch.get_float32_matmul_precision()`, read by torch.compile when it traces a call and kept in the graph as
    a constant: a function that returns a string would otherwise end the graph at every attention layer."""
    return torch.get_float32_matmul_precision()


@triton.jit
def _tile(PTR, row, rows, first, step, count, c, width, col0, T: tl.constexpr, BLOCK: tl.constexpr):
    """Pointers and mask of the (T, BLOCK) tile of chunk c, columns col0.., of `row` of a (R, rows, width) tensor
    read as a sequence: its position t is the tensor's row first + step * t (step 1, or -1 for the reversed
    sequence), and positions from `count` on are outside it."""
    t = c * T + tl.arange(0, T)
    col = col0 + tl.arange(0, BLOCK)
    ptr = PTR + (row.to(tl.int64) * rows + first + step * t)[:, None] * width + col[None, :]
    return ptr, (t[:, None] < count) & (col[None, :] < width)


@triton.jit
def _load_tile(PTR, row, rows, first, step, count, c, width, col0, T: tl.constexpr, BLOCK: tl.constexpr):
    ptr, mask = _tile(PTR, row, rows, first, step, count, c, width, col0, T, BLOCK)
    return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def _chunk_products(X, Y, STATE, row, c, n, lq, q_first, span, lk, k_first, k_count, step, e_size, dv, v0,
                    KEYS: tl.constexpr, T: tl.constexpr, BE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    """Over the blocks of E: the chunk's x y^T (T, T), and the product of its x (its y when KEYS) with columns
    v0.. of state c of STATE (T, BV)."""
    acc = STATE.dtype.element_ty
    scores = tl.zeros((T, T), dtype=acc)
    product = tl.zeros((T, BV), dtype=acc)
    for e0 in range(0, e_size, BE):
        x = _load_tile(X, row, lq, q_first, step, span, c, e_size, e0, T, BE)
        y = _load_tile(Y, row, lk, k_first, step, k_count, c, e_size, e0, T, BE)
        ptr, mask = _state(STATE, row, c, n, e_size, dv, e0, v0, BE, BV)
        state = tl.load(ptr, mask=mask, other=0.0).to(X.dtype.element_ty)
        scores += tl.dot(x, tl.trans(y), input_precision=DOT)
        product += tl.dot(y if KEYS else x, state, input_precision=DOT)
    return scores, product


@triton.jit
def _intra_chunk_decay(rate, T: tl.constexpr):
    """M (T, T), M_ab = exp(-lambda (a + 1 - b)) for a >= b and 0 above the diagonal, and a - b (0 above it):
    the decay between positions a (queries) and b (keys) of one chunk."""
    a = tl.arange(0, T)
    gap = tl.maximum(a[:, None] - a[None, :], 0).to(rate.dtype)
    return tl.where(a[:, None] >= a[None, :], tl.exp(-rate * (gap + 1)), 0.0), gap


@triton.jit
def _state(PTR, row, c, n, e_size, dv, e0, v0, BE: tl.constexpr, BV: tl.constexpr):
    """Pointers and mask of the (BE, BV) block at (e0, v0) of state c of `row` of a (rows, n, E, Dv) tensor."""
    e = e0 + tl.arange(0, BE)
    v = v0 + tl.arange(0, BV)
    ptr = PTR + ((row.to(tl.int64) * n + c) * e_size + e[:, None]) * dv + v[None, :]
    return ptr, (e[:, None] < e_size) & (v[None, :] < dv)


@triton.jit
def _states_forward(Y, V, RATE, INITIAL, STATES, lk, k_first, k_count, step, n, heads, e_size, dv,
                    HAS_INITIAL: tl.constexpr, T: tl.constexpr, BE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    eb, vb, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e0, v0 = eb * BE, vb * BV
    acc = STATES.dtype.element_ty
    rate = tl.load(RATE + row % heads)
    to_end = tl.exp(-rate * (T - 1 - tl.arange(0, T).to(acc)))  # key b of a chunk to the chunk's end
    carry = tl.exp(-rate * T)
    if HAS_INITIAL:
        ptr, mask = _state(INITIAL, row, 0, 1, e_size, dv, e0, v0, BE, BV)
        state = tl.load(ptr, mask=mask, other=0.0)
    else:
        state = tl.zeros((BE, BV), dtype=acc)
    for c in range(n):
        ptr, mask = _state(STATES, row, c, n, e_size, dv, e0, v0, BE, BV)
        tl.store(ptr, state, mask=mask)
        y = _load_tile(Y, row, lk, k_first, step, k_count, c, e_size, e0, T, BE)
        v = _load_tile(V, row, lk, k_first, step, k_count, c, dv, v0, T, BV).to(Y.dtype.element_ty)
        y = (y.to(acc) * to_end[:, None]).to(Y.dtype.element_ty)
        state = state * carry + tl.dot(tl.trans(y), v, input_precision=DOT)


@triton.jit
def _output_forward(X, Y, V, RATE, STATES, OUT, lq, q_first, span, lk, k_first, k_count, step, n, heads, e_size,
                    dv, T: tl.constexpr, BE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    vb, c, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    v0 = vb * BV
    acc = OUT.dtype.element_ty
    rate = tl.load(RATE + row % heads)
    a = tl.arange(0, T)
    scores, out = _chunk_products(X, Y, STATES, row, c, n, lq, q_first, span, lk, k_first, k_count, step, e_size, dv,
                                  v0, False, T, BE, BV, DOT)
    out = out * tl.exp(-rate * (a + 2).to(acc))[:, None]
    scores = scores * _intra_chunk_decay(rate, T)[0]
    v = _load_tile(V, row, lk, k_first, step, k_count, c, dv, v0, T, BV).to(X.dtype.element_ty)
    out += tl.dot(scores.to(X.dtype.element_ty), v, input_precision=DOT)
    ptr, mask = _tile(OUT, row, lq, q_first, step, span, c, dv, v0, T, BV)
    tl.store(ptr, out, mask=mask)


@triton.jit
def _states_backward(X, DOUT, RATE, STATES, GRADS, GRAD_INITIAL, GRAD_CARRY, lq, q_first, span, step, n, heads,
                     e_size, dv, T: tl.constexpr, BE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    eb, vb, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    e0, v0 = eb * BE, vb * BV
    acc = STATES.dtype.element_ty
    rate = tl.load(RATE + row % heads)
    from_start = tl.exp(-rate * (tl.arange(0, T) + 2).to(acc))  # query a of a chunk from the chunk's state
    carry = tl.exp(-rate * T)
    adjoint = tl.zeros((BE, BV), dtype=acc)  # G_c, the gradient of the state after chunk c
    to_carry = tl.zeros((BE, BV), dtype=acc)
    for back in range(n):
        c = n - 1 - back
        ptr, mask = _state(GRADS, row, c, n, e_size, dv, e0, v0, BE, BV)
        tl.store(ptr, adjoint, mask=mask)
        ptr, mask = _state(STATES, row, c, n, e_size, dv, e0, v0, BE, BV)
        to_carry += adjoint * tl.load(ptr, mask=mask, other=0.0)
        x = _load_tile(X, row, lq, q_first, step, span, c, e_size, e0, T, BE)
        grad = _load_tile(DOUT, row, lq, q_first, step, span, c, dv, v0, T, BV)
        x = (x.to(acc) * from_start[:, None]).to(X.dtype.element_ty)
        adjoint = adjoint * carry + tl.dot(tl.trans(x), grad.to(X.dtype.element_ty), input_precision=DOT)
    ptr, mask = _state(GRAD_INITIAL, row, 0, 1, e_size, dv, e0, v0, BE, BV)
    tl.store(ptr, adjoint, mask=mask)
    tl.store(GRAD_CARRY + (row * tl.num_programs(0) + eb) * tl.num_programs(1) + vb, tl.sum(tl.sum(to_carry, 1), 0))


@triton.jit
def _grad_xy(X, Y, V, DOUT, RATE, STATES, GRADS, DX, DY, GRAD_RATE, lq, q_first, span, lk, k_first, k_count, step,
             n, heads, e_size, dv, T: tl.constexpr, BE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    c, row = tl.program_id(0), tl.program_id(1)
    acc = STATES.dtype.element_ty
    dtype = X.dtype.element_ty
    rate = tl.load(RATE + row % heads)
    a = tl.arange(0, T)
    pos = a.to(acc)
    from_start = tl.exp(-rate * (pos + 2))
    to_end = tl.exp(-rate * (T - 1 - pos))
    # over the blocks of Dv: dout v^T, dout S_c^T and v G_c^T
    products = tl.zeros((T, T), dtype=acc)
    grad_x_state = tl.zeros((T, BE), dtype=acc)
    grad_y_state = tl.zeros((T, BE), dtype=acc)
    for v0 in range(0, dv, BV):
        v = _load_tile(V, row, lk, k_first, step, k_count, c, dv, v0, T, BV).to(dtype)
        grad = _load_tile(DOUT, row, lq, q_first, step, span, c, dv, v0, T, BV).to(dtype)
        state_ptr, state_mask = _state(STATES, row, c, n, e_size, dv, 0, v0, BE, BV)
        state = tl.load(state_ptr, mask=state_mask, other=0.0).to(dtype)
        state_ptr, state_mask = _state(GRADS, row, c, n, e_size, dv, 0, v0, BE, BV)
        adjoint = tl.load(state_ptr, mask=state_mask, other=0.0).to(dtype)
        products += tl.dot(grad, tl.trans(v), input_precision=DOT)
        grad_x_state += tl.dot(grad, tl.trans(state), input_precision=DOT)
        grad_y_state += tl.dot(v, tl.trans(adjoint), input_precision=DOT)
    x = _load_tile(X, row, lq, q_first, step, span, c, e_size, 0, T, BE)
    y = _load_tile(Y, row, lk, k_first, step, k_count, c, e_size, 0, T, BE)
    decay, gap = _intra_chunk_decay(rate, T)
    grad_scores = products * decay
    # d/dlambda of exp(-lambda t) is -t exp(-lambda t): t = a + 1 - b within the chunk, a + 2 from the state,
    # T - 1 - b into the next state (the carry's T is added by the caller)
    grad_rate = -tl.sum(tl.sum((gap + 1) * grad_scores * tl.dot(x, tl.trans(y), input_precision=DOT), 1), 0)
    grad_rate -= tl.sum((pos + 2) * from_start * tl.sum(x * grad_x_state, 1), 0)
    grad_rate -= tl.sum((T - 1 - pos) * to_end * tl.sum(y * grad_y_state, 1), 0)
    tl.store(GRAD_RATE + row * n + c, grad_rate)
    dx = tl.dot(grad_scores.to(dtype), y, input_precision=DOT) + from_start[:, None] * grad_x_state
    ptr, mask = _tile(DX, row, lq, q_first, step, span, c, e_size, 0, T, BE)
    tl.store(ptr, dx, mask=mask)
    dy = tl.dot(tl.trans(grad_scores.to(dtype)), x, input_precision=DOT) + to_end[:, None] * grad_y_state
    ptr, mask = _tile(DY, row, lk, k_first, step, k_count, c, e_size, 0, T, BE)
    tl.store(ptr, dy, mask=mask)


@triton.jit
def _grad_v(X, Y, DOUT, RATE, GRADS, DV, lq, q_first, span, lk, k_first, k_count, step, n, heads, e_size, dv,
            T: tl.constexpr, BE: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    vb, c, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    v0 = vb * BV
    acc = GRADS.dtype.element_ty
    dtype = X.dtype.element_ty
    rate = tl.load(RATE + row % heads)
    a = tl.arange(0, T)
    to_end = tl.exp(-rate * (T - 1 - a.to(acc)))
    scores, grad_v = _chunk_products(X, Y, GRADS, row, c, n, lq, q_first, span, lk, k_first, k_count, step, e_size,
                                     dv, v0, True, T, BE, BV, DOT)
    grad_v = grad_v * to_end[:, None]
    scores = scores * _intra_chunk_decay(rate, T)[0]
    grad = _load_tile(DOUT, row, lq, q_first, step, span, c, dv, v0, T, BV)
    grad_v += tl.dot(tl.trans(scores.to(dtype)), grad.to(dtype), input_precision=DOT)
    ptr, mask = _tile(DV, row, lk, k_first, step, k_count, c, dv, v0, T, BV)
    tl.store(ptr, grad_v, mask=mask)


def _block(size: int, most: int) -> int:
    return max(16, min(most, triton.next_power_of_2(size)))


class _Span(NamedTuple):
    """Where the pass of one call reads and writes: its `span` positions are the queries skip.. (of lq) and the
    keys lead.. (of lk, `key_count` of them exist), counted from the end of the sequences when reversed: position
    t is row q_first + step * t of the queries and k_first + step * t of the keys (`_tile`)."""

    span: int
    lq: int
    q_first: int
    lk: int
    k_first: int
    key_count: int
    step: int

    @classmethod
    def of(cls, lq: int, lk: int, skip: int, lead: int, reverse: bool) -> "_Span":
        span = lq - skip
        key_count = max(0, min(lk - lead, span))
        if reverse:
            return cls(span, lq, lq - 1 - skip, lk, lk - 1 - lead, key_count, -1)
        return cls(span, lq, skip, lk, lead, key_count, 1)

    def query_rows(self) -> tuple:
        """The kernels' (rows, first, count) arguments of the query-side tensors (x, out and their gradients)."""
        return self.lq, self.q_first, self.span

    def key_rows(self) -> tuple:
        """The same of the key-side tensors (y, v and their gradients)."""
        return self.lk, self.k_first, self.key_count


class TritonDecayedTail(torch.autograd.Function):
    """The pass of `ops_decay.decayed_tail` in five Triton kernels (see the module docstring), on x (B, H, Lq, E),
    y (B, H, Lk, E), v (B, H, Lk, Dv), rate (H,) and the initial state (B, H, E, Dv) or None, read in place
    through `_Span`; returns out (B, H, Lq, Dv) in the accumulation dtype (`ops_common.compute_dtype` of x's),
    0 on the queries outside the span."""

    @staticmethod
    def forward(ctx, x, y, v, rate, initial, where: _Span, dot: str):
        b, heads, lq, e = x.shape
        dv = v.shape[-1]
        acc = compute_dtype(x.dtype)
        x, y, v = (t.contiguous() for t in (x, y, v))
        rate = rate.to(acc).contiguous()
        n = triton.cdiv(where.span, CHUNK)
        states = x.new_empty(b, heads, n, e, dv, dtype=acc)
        be, bv = _block(e, STATE_BLOCK_E), _block(dv, STATE_BLOCK_V)
        first = states if initial is None else initial.to(acc).contiguous()  # unread without an initial state
        _states_forward[(triton.cdiv(e, be), triton.cdiv(dv, bv), b * heads)](
            y, v, rate, first, states, *where.key_rows(), where.step, n, heads, e, dv, HAS_INITIAL=initial is not None,
            T=CHUNK, BE=be, BV=bv, DOT=dot)
        out = (x.new_empty if where.span == lq else x.new_zeros)(b, heads, lq, dv, dtype=acc)
        _output_forward[(triton.cdiv(dv, bv), n, b * heads)](x, y, v, rate, states, out, *where.query_rows(),
                                                             *where.key_rows(), where.step, n, heads, e, dv, T=CHUNK,
                                                             BE=be, BV=bv, DOT=dot)
        ctx.save_for_backward(x, y, v, rate, states)
        ctx.has_initial, ctx.where, ctx.dot = initial is not None, where, dot
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, y, v, rate, states = ctx.saved_tensors
        where, dot = ctx.where, ctx.dot
        b, heads, n, e, dv = states.shape
        grad_out = grad_out.to(states.dtype).contiguous()
        be, bv = _block(e, STATE_BLOCK_E), _block(dv, STATE_BLOCK_V)
        parts = (triton.cdiv(e, be), triton.cdiv(dv, bv))
        grads = torch.empty_like(states)
        grad_initial = states.new_empty(b, heads, e, dv)
        grad_carry = states.new_empty(b * heads, parts[0] * parts[1])
        _states_backward[(*parts, b * heads)](x, grad_out, rate, states, grads, grad_initial, grad_carry,
                                              *where.query_rows(), where.step, n, heads, e, dv, T=CHUNK, BE=be,
                                              BV=bv, DOT=dot)
        dx = (torch.empty_like if where.span == x.shape[2] else torch.zeros_like)(x)
        dy, dv_ = ((torch.empty_like if where.key_count == y.shape[2] else torch.zeros_like)(t) for t in (y, v))
        grad_rate = states.new_empty(b * heads, n)
        _grad_xy[(n, b * heads)](x, y, v, grad_out, rate, states, grads, dx, dy, grad_rate, *where.query_rows(),
                                 *where.key_rows(), where.step, n, heads, e, dv, T=CHUNK, BE=_block(e, MAX_DIM),
                                 BV=bv, DOT=dot)
        _grad_v[(parts[1], n, b * heads)](x, y, grad_out, rate, grads, dv_, *where.query_rows(), *where.key_rows(),
                                          where.step, n, heads, e, dv, T=CHUNK, BE=be, BV=bv, DOT=dot)
        carry = torch.exp(-rate * CHUNK)
        grad_rate = grad_rate.sum(1).view(b, heads) - CHUNK * carry * grad_carry.sum(1).view(b, heads)
        return dx, dy, dv_, grad_rate.sum(0), grad_initial if ctx.has_initial else None, None, None


def decayed_tail(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, rate: torch.Tensor, initial: torch.Tensor | None,
                 *, skip: int, lead: int, reverse: bool = False, half_inputs: bool = False) -> torch.Tensor:
    """The pass of `ops_decay.decayed_tail` on CUDA (`TritonDecayedTail`): for the queries i = skip.. of x and the
    keys j = lead.. of y and v (keys past the end count as 0),

        out_i = sum_{t <= i - skip} exp(-rate (i - skip + 1 - t)) x_i.y_{lead+t} v_{lead+t}
                + exp(-rate (i - skip + 1)) x_i initial,

    0 for the queries before skip; with `reverse`, the same on the sequences reversed along their positions (read
    from the end, without copies). `half_inputs`: the operands came from 16-bit floats (see `dot_precision`)."""
    if not fits(x.shape[-1]):
        raise ValueError(f"`x` must have at most {MAX_DIM} features for the Triton kernels, got {x.shape[-1]}")
    where = _Span.of(x.shape[2], y.shape[2], skip, lead, reverse)
    return TritonDecayedTail.apply(x, y, v, rate, initial, where, dot_precision(x.dtype, half_inputs))


__all__ = ["TritonDecayedTail", "decayed_tail", "dot_precision", "fits"]
