"""A Triton kernel of the chunk-state scan of `ops_decay` (the decayed tails of the default attention), for CUDA.

`ops_decay._DecayScan` carries the state of a decayed linear attention across chunks:

    states_0 = initial (or 0),  states_{c+1} = carry states_c + local_c,  c = 0 .. n - 2

for local (B, H, n, E, Dv) and carry (H,). In PyTorch that is a loop of n small launches forward and n
backward (n = L / chunk: 256 at 16k tokens, per layer and direction), each far too small to fill a GPU.
`TritonDecayScan` has `_DecayScan`'s contract and runs the whole loop in one launch: one program per row
and block of state elements, the state held in registers while it walks the chunks.

- `_scan_forward` writes states_0 .. states_{n-1};
- `_scan_backward` walks back with the adjoint G_c = grad_c + carry G_{c+1}: the gradient of local_{c-1} is
  G_c, that of the initial state G_0, and each program adds up its share of the carry's gradient,
  sum_c G_c . states_{c-1}, into its own slot (no atomics; the slots are summed afterwards).

States accumulate in their dtype (fp32 for half-precision inputs, `ops_common.compute_dtype`). Triton is an
optional dependency: this module is imported only for CUDA tensors (or by tests under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch


try:
    import triton
    import triton.language as tl
except ImportError as error:  # optional (the `gpu` extra): `ops_decay` falls back to PyTorch without it
    raise ImportError("the Triton kernels of the default attention need `pip install triton`") from error


BLOCK = 1024  # state elements per program


@triton.jit
def _scan_forward(LOCAL, CARRY, INITIAL, STATES, n, heads, size, HAS_INITIAL: tl.constexpr, BLOCK: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)
    e = part * BLOCK + tl.arange(0, BLOCK)
    inside = e < size
    carry = tl.load(CARRY + row % heads)
    if HAS_INITIAL:
        state = tl.load(INITIAL + row.to(tl.int64) * size + e, mask=inside, other=0.0)
    else:
        state = tl.zeros((BLOCK,), dtype=STATES.dtype.element_ty)
    base = row.to(tl.int64) * n * size  # beyond 2^31 elements for long inputs and large batches
    for c in range(n):
        tl.store(STATES + base + c * size + e, state, mask=inside)
        local = tl.load(LOCAL + base + c * size + e, mask=inside, other=0.0)
        state = carry * state + local


@triton.jit
def _scan_backward(GRAD, CARRY, STATES, GRAD_LOCAL, GRAD_INITIAL, GRAD_CARRY, n, heads, size, parts,
                   BLOCK: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)
    e = part * BLOCK + tl.arange(0, BLOCK)
    inside = e < size
    carry = tl.load(CARRY + row % heads)
    base = row.to(tl.int64) * n * size  # beyond 2^31 elements for long inputs and large batches
    tl.store(GRAD_LOCAL + base + (n - 1) * size + e, tl.zeros((BLOCK,), dtype=GRAD_LOCAL.dtype.element_ty),
             mask=inside)
    adjoint = tl.zeros((BLOCK,), dtype=STATES.dtype.element_ty)
    to_carry = tl.zeros((BLOCK,), dtype=STATES.dtype.element_ty)
    for step in range(n):
        c = n - 1 - step
        adjoint = tl.load(GRAD + base + c * size + e, mask=inside, other=0.0) + carry * adjoint  # G_c
        if c > 0:
            tl.store(GRAD_LOCAL + base + (c - 1) * size + e, adjoint, mask=inside)
            to_carry += adjoint * tl.load(STATES + base + (c - 1) * size + e, mask=inside, other=0.0)
    tl.store(GRAD_INITIAL + row.to(tl.int64) * size + e, adjoint, mask=inside)
    tl.store(GRAD_CARRY + row * parts + part, tl.sum(to_carry, 0))


class TritonDecayScan(torch.autograd.Function):
    """`ops_decay._DecayScan` in two Triton kernels: local (B, H, n, E, Dv), carry (H,), initial (B, H, E, Dv)
    or None; returns the states before each chunk, (B, H, n, E, Dv)."""

    @staticmethod
    def forward(ctx, local, carry, initial):
        b, heads, n, e, dv = local.shape
        size = e * dv
        local = local.contiguous()
        carry = carry.to(local.dtype).contiguous()
        states = torch.empty_like(local)
        parts = triton.cdiv(size, BLOCK)
        has_initial = initial is not None
        first = initial.to(local.dtype).contiguous() if has_initial else local  # unread without an initial state
        _scan_forward[(b * heads, parts)](local, carry, first, states, n, heads, size, HAS_INITIAL=has_initial,
                                          BLOCK=BLOCK)
        ctx.save_for_backward(states, carry)
        ctx.has_initial = has_initial
        return states

    @staticmethod
    def backward(ctx, grad):
        states, carry = ctx.saved_tensors
        b, heads, n, e, dv = states.shape
        size = e * dv
        parts = triton.cdiv(size, BLOCK)
        grad = grad.to(states.dtype).contiguous()
        grad_local = torch.empty_like(states)
        grad_initial = states.new_empty(b, heads, e, dv)
        grad_carry = states.new_empty(b * heads, parts)
        _scan_backward[(b * heads, parts)](grad, carry, states, grad_local, grad_initial, grad_carry, n, heads,
                                           size, parts, BLOCK=BLOCK)
        grad_carry = grad_carry.view(b, heads, parts).sum((0, 2)) if ctx.needs_input_grad[1] else None
        return grad_local, grad_carry, grad_initial if ctx.has_initial and ctx.needs_input_grad[2] else None


__all__ = ["TritonDecayScan"]
