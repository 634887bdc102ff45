"""Helpers shared by the attention ops: feature map, relative index, visible keys, normalisers, dtype policy,
input checks and the block budgets of the blocked algorithms.

Relative positions follow one convention in every op: query i sits at p_i = i + query_offset, key j at j,
and a table of 2h + 1 rows (h the horizon) is read at row

    r(i, j) = clip(p_i - j, -h, h) + h                 (`relative_index`; row h is distance 0)

so row h + t holds distance p_i - j = t (t > 0: the key is t positions in the past). The one table laid
out the other way round, the Toeplitz `rel_bias` (row r for key offset j - p_i = r - h), is read through
`rows_by_distance`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


ATTENTION_MODES = ("auto", "naive", "linear")

# New tokens taken together by the chunked linear algorithms and by the recurrent steps.
DEFAULT_CHUNK_SIZE = 64

# Largest temporary (in elements) one block of the chunked linear algorithms (`ops_kernelized`,
# `ops_fourier_chunk`, `ops_local_softmax`, `grouped_rows`) may create: small blocks keep allocations
# out of fresh pages from the kernel, which otherwise dominate wall time at long lengths.
BLOCK_ELEMENTS = 1 << 20

# Size (in elements) of one block of the FFT path (`ops_toeplitz`): each of its few temporaries (N reals
# or N/2+1 complex numbers per row and feature pair) stays about this size, 16 MiB in float32. A block
# must hold whole sequences of N points, and each FFT call carries a fixed cost, so the FFT path takes
# blocks four times larger than the chunked algorithms.
FFT_BLOCK_ELEMENTS = 1 << 22

# Guard of the Fourier normaliser (`guarded_normalise`): |out_i| <= max|v| / eps.
DEFAULT_EPS = 1e-2


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1, the positive feature map of Katharopoulos et al. (2020)."""
    return F.elu(x) + 1.0


def relu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = max(x, 0): non-negative, and exactly 0 on the negative half-space, so that a query can give a key
    no weight at all (a score of elu + 1 is never 0)."""
    return F.relu(x)


# the feature maps phi of the kernelized ops that take `feature_map`
FEATURE_MAPS = {"elu": elu_feature_map, "relu": relu_feature_map}


def get_feature_map(name: str):
    """The function of `FEATURE_MAPS[name]`; ValueError naming `feature_map` for an unknown name."""
    if name not in FEATURE_MAPS:
        raise ValueError(f"`feature_map` must be one of {tuple(FEATURE_MAPS)}, got {name!r}")
    return FEATURE_MAPS[name]


# the floating dtypes' compute dtypes, looked up: `torch.promote_types` is an operation the dispatcher runs, which
# costs the host some microseconds in every call of an op, where the host sets a GPU's pace at batch 1
_COMPUTE_DTYPES = {dtype: torch.promote_types(dtype, torch.float32)
                   for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ops accumulate in: float32 for half precision, the input dtype otherwise."""
    return _COMPUTE_DTYPES.get(dtype) or torch.promote_types(dtype, torch.float32)


def horizon_of(rel: Tensor | None) -> int:
    """Horizon h of a relative table with 2h+1 rows (0 when there is no table)."""
    return 0 if rel is None else (rel.shape[-2] - 1) // 2


def distance_index(distance: Tensor, horizon: int) -> Tensor:
    """Row clip(t, -h, h) + h of a relative table for distances t = p_i - j (any shape)."""
    return distance.clamp(-horizon, horizon) + horizon


def relative_index(query_positions: Tensor, key_positions: Tensor, horizon: int) -> Tensor:
    """r(i, j) = clip(p_i - j, -h, h) + h, shape (len(query_positions), len(key_positions))."""
    return distance_index(query_positions[:, None] - key_positions[None, :], horizon)


def rows_by_distance(rel_bias: Tensor) -> Tensor:
    """The Toeplitz bias table (H, 2h+1) reordered so that `relative_index` reads it.

    `rel_bias` is stored by key offset: row r is the bias of j - p_i = r - h (row 0: keys h or more
    positions in the past, row 2h: keys h or more positions ahead). The result has row r for distance
    p_i - j = r - h, the layout of every other relative table. Reversing the rows is exact.
    """
    return rel_bias.flip(-1)


def token_positions(start: int, length: int, dtype: torch.dtype, device) -> Tensor:
    """Positions (1, length, 1) of tokens start .. start + length - 1: their token indices."""
    return (torch.arange(length, device=device) + start).to(dtype)[None, :, None]


def visible_keys(
    lq: int, lk: int, *, causal: bool, key_mask: Tensor | None, query_offset: int, device
) -> Tensor:
    """keep[b, 0, i, j]: whether key j is visible to query i, boolean and broadcastable to (B, H, Lq, Lk).

    A key is hidden when key_mask[b, j] == 0, or, causal, when j > p_i = i + query_offset. The shape is
    the smallest that holds this: (B or 1, 1, Lq or 1, Lk).
    """
    keep = torch.ones(1, 1, 1, lk, dtype=torch.bool, device=device)
    if causal:
        q_pos = torch.arange(lq, device=device) + query_offset
        keep = (torch.arange(lk, device=device)[None, :] <= q_pos[:, None])[None, None]
    if key_mask is not None:
        keep = keep & key_mask.bool()[:, None, None, :]
    return keep


def augment_values(v: Tensor, key_mask: Tensor | None) -> Tensor:
    """[m_j v_j, m_j]: values times the key mask, with the mask appended as a last channel.

    One pass of any algorithm over the augmented values yields the numerator (first Dv channels)
    and the normaliser (last channel) of the row-normalised attention.
    """
    if key_mask is None:
        ones = torch.ones(*v.shape[:-1], 1, dtype=v.dtype, device=v.device)
        return torch.cat([v, ones], dim=-1)
    m = key_mask.to(v.dtype)[:, None, :, None].expand(*v.shape[:-1], 1)
    return torch.cat([v * m, m], dim=-1)


def normalise(num: Tensor, den: Tensor, visible: Tensor | None = None) -> Tensor:
    """out = num / den row by row, 0 on rows with no visible key; with augmented sums a = [num, den],
    num = a[..., :-1] and den = a[..., -1:].

    `visible` (broadcastable to den) says which rows see a key; by default den >= the smallest normal number of
    den's dtype over its epsilon (float32: 1e-31), right whenever every score is positive: a smaller sum is made
    of weights that underflowed (keys far beyond a fast decay), and its reciprocal would take the gradients past
    the dtype's range.
    """
    if visible is None:
        info = torch.finfo(den.dtype)
        visible = den >= info.tiny / info.eps
    return torch.where(visible, num / torch.where(visible, den, torch.ones_like(den)), torch.zeros_like(num))


def row_shift(band_logits: Tensor, tail_sum: Tensor) -> Tensor:
    """m_i = max(max_j band_logits_ij, log tail_sum_i), detached, 0 for a row with neither.

    `band_logits` (..., W) holds -inf for hidden keys, `tail_sum` (..., 1) is the row's total weight from
    other keys (>= 0). exp(l - m) and tail_sum exp(-m) are then at most 1, and at least one of them is 1:
    a row of softmax weights mixed with other positive weights neither overflows nor underflows to 0/0.
    """
    return row_shift_of_log(band_logits, torch.log(tail_sum))


def row_shift_of_log(band_logits: Tensor, log_tail_sum: Tensor) -> Tensor:
    """`row_shift` from the log of the rows' weight beyond the band, for a weight that may lie below the dtype's
    range while its log does not."""
    m = torch.maximum(band_logits.amax(-1, keepdim=True), log_tail_sum)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()


def tail_floor(dtype: torch.dtype) -> float:
    """The smallest weight beyond the band that a row keeps (`tails_above_floor`): the smallest normal number of
    `dtype` to the power 2/3 (float32: 5e-26, about e^-58; float64: 8e-206)."""
    return torch.finfo(dtype).tiny ** (2 / 3)


def tails_above_floor(tail: Tensor, tail_sum: Tensor) -> Tensor:
    """`tail`, 0 on the rows whose weight beyond the band `tail_sum` is below `tail_floor` of its dtype. Such a row's
    shift m can be the log of that weight, and exp(-m) (`shift_scale`), which makes its largest weight 1, scales the
    row's gradient in backward: for a weight near the smallest normal number, exp(-m) times a gradient of a few
    units passes the dtype's largest number and makes the gradients inf and NaN. Above the floor, gradients up to
    the largest number times the floor (float32: 2e13, loss scaling included; float64: 1e103) stay finite. The row
    then has no weight beyond the band, as it has none when the weights underflow to 0 outright."""
    return torch.where(tail_sum >= tail_floor(tail.dtype), tail, torch.zeros_like(tail))


def shift_scale(m: Tensor) -> Tensor:
    """exp(-m) for the weights outside the band, capped at the largest finite value: a row whose shift m is
    below -709 (float64) has no weight outside the band, and 0 times the cap stays 0 instead of NaN."""
    return torch.exp(-m).clamp(max=torch.finfo(m.dtype).max)


def guarded_normalise(num: Tensor, den: Tensor, big: Tensor, eps: float) -> Tensor:
    """num / den_safe row by row, with den_safe = den if |den| >= eps M, and sign(den) eps M otherwise
    (sign(0) = +1); 0 where M == 0 (no visible key). M = `big` bounds |den|.
    """
    sign = torch.where(den >= 0, torch.ones_like(den), -torch.ones_like(den))
    den_safe = torch.where(den.abs() >= eps * big, den, sign * eps * big)
    visible = big > 0
    den_safe = torch.where(visible, den_safe, torch.ones_like(den_safe))
    return torch.where(visible, num / den_safe, torch.zeros_like(num))


class _GroupedRows(torch.autograd.Function):
    """`grouped_rows`: forward without autograd, group by group; backward recomputes each group with
    autograd and takes its gradients before the next, so only one group's intermediates live at a time."""

    @staticmethod
    def forward(ctx, fn, group, *inputs):
        rows = inputs[0].shape[0]
        out = torch.cat([fn(*(x[r0:r0 + group] for x in inputs)) for r0 in range(0, rows, group)])
        ctx.fn, ctx.group = fn, group
        ctx.save_for_backward(*inputs)
        return out

    @staticmethod
    def backward(ctx, grad):
        inputs = ctx.saved_tensors
        wanted = [i for i, x in enumerate(inputs) if ctx.needs_input_grad[i + 2]]
        grads = [torch.zeros_like(x) if i in wanted else None for i, x in enumerate(inputs)]
        for r0 in range(0, inputs[0].shape[0], ctx.group):
            with torch.enable_grad():
                pieces = [x[r0:r0 + ctx.group].detach().requires_grad_(i in wanted) for i, x in enumerate(inputs)]
                out = ctx.fn(*pieces)
            if not out.requires_grad:  # this group's output does not depend on the inputs (no key reaches it)
                continue
            parts = torch.autograd.grad(out, [pieces[i] for i in wanted], grad[r0:r0 + ctx.group], allow_unused=True)
            for i, part in zip(wanted, parts):
                if part is not None:
                    grads[i][r0:r0 + ctx.group] = part
        return None, None, *grads


def grouped_rows(fn, per_row: int, *inputs: Tensor) -> Tensor:
    """fn(*inputs), for a fn that treats the rows (dim 0) of its inputs independently, computed on groups of
    rows of about BLOCK_ELEMENTS / per_row each and differentiable, with its intermediates recomputed in
    backward rather than kept: activation checkpointing by groups. `per_row` is the size of fn's largest
    temporary per row. Costs one more forward of fn; keeps every temporary about BLOCK_ELEMENTS large, so
    that long inputs do not pay for fresh pages. On CUDA, where that cost does not arise and many small
    launches would, fn runs once on all rows under autograd."""
    if inputs[0].is_cuda:
        return fn(*inputs)
    group = max(1, BLOCK_ELEMENTS // max(1, per_row))
    return _GroupedRows.apply(fn, group, *inputs)


def head_table(rel: Tensor | None, heads: int, dtype: torch.dtype) -> Tensor | None:
    """A relative table (H, 2h+1, D), or one (2h+1, D) shared by the heads expanded to it, in `dtype`."""
    if rel is None:
        return None
    table = rel.to(dtype)
    return table if table.dim() == 3 else table.unsqueeze(0).expand(heads, -1, -1)


def row_table(rel: Tensor | None, batch: int, heads: int, dtype: torch.dtype) -> Tensor | None:
    """`head_table` repeated for each batch element: one table per batch*head row, (B * H, 2h+1, D)."""
    table = head_table(rel, heads, dtype)
    if table is None:
        return None
    return table.unsqueeze(0).expand(batch, -1, -1, -1).reshape(batch * heads, *table.shape[1:])


def describe(t: object) -> str:
    """What an argument is, for error messages: shape and dtype of a tensor, else type and value."""
    if isinstance(t, Tensor):
        return f"tensor of shape {tuple(t.shape)} and dtype {t.dtype}"
    return f"{type(t).__name__} {t!r}"


def check_horizon(horizon: int) -> None:
    """Raise ValueError naming `horizon` unless it is a non-negative int."""
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise ValueError(f"`horizon` must be a non-negative int, got {horizon!r}")


def check_state(state: object, state_type: type) -> None:
    """Raise ValueError naming `state` unless it is a `state_type` (a state NamedTuple of the ops)."""
    if not isinstance(state, state_type):
        raise ValueError(f"`state` must be a {state_type.__name__}, got {type(state).__name__}")


def check_new_tokens(q: Tensor, k: Tensor) -> None:
    """Raise ValueError unless `q` and `k` hold the same number of new tokens (a recurrent step)."""
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"`q` and `k` must hold the same new tokens, got lengths {q.shape[2]} and {k.shape[2]}")


def checks_values(t: Tensor) -> bool:
    """Whether the ops check the values of `t` (not only its shape and dtype): on CPU. Reading a reduction back
    to the host would synchronise an accelerator in every layer of every step, so there only shapes and dtypes
    are checked."""
    return t.device.type == "cpu"


def check_key_mask(key_mask: Tensor | None, batch: int, length: int) -> None:
    """Raise ValueError naming `key_mask` unless it is None or a (batch, length) mask of 0 and 1 (or bool);
    values are checked on CPU (`checks_values`)."""
    if key_mask is None:
        return
    if not isinstance(key_mask, Tensor) or tuple(key_mask.shape) != (batch, length):
        raise ValueError(f"`key_mask` must have shape (batch, Lk) = ({batch}, {length}), got {describe(key_mask)}")
    if key_mask.dtype != torch.bool and checks_values(key_mask) and bool(((key_mask != 0) & (key_mask != 1)).any()):
        raise ValueError("`key_mask` must hold only 0 and 1 (or be boolean)")


def check_attention_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel: Tensor | None,
    key_mask: Tensor | None,
    query_offset: int,
    mode: str,
) -> None:
    """Raise ValueError naming the argument when shapes, dtypes or values are not as documented."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"`{name}` must be a 4-D tensor (batch, heads, length, dim), got {describe(t)}")
        if not t.is_floating_point():
            raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"`q`, `k` and `v` must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    b, h, _, d = q.shape
    if k.shape[0] != b or k.shape[1] != h or k.shape[3] != d:
        raise ValueError(f"`k` must have shape ({b}, {h}, Lk, {d}) to match `q` {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"`v` must have shape ({b}, {h}, {k.shape[2]}, Dv) to match `k`, got {tuple(v.shape)}")
    if k.shape[2] == 0 or q.shape[2] == 0:
        raise ValueError(f"`q` and `k` must hold at least one position, got Lq={q.shape[2]}, Lk={k.shape[2]}")
    if rel is not None:
        if not isinstance(rel, Tensor) or rel.dim() not in (2, 3):
            raise ValueError(f"`rel` must be a tensor of shape (heads, 2h+1, dim) or (2h+1, dim), got {describe(rel)}")
        if rel.dtype != q.dtype:
            raise ValueError(f"`rel` must have the dtype of `q` ({q.dtype}), got {rel.dtype}")
        if rel.shape[-1] != d or rel.shape[-2] % 2 != 1 or (rel.dim() == 3 and rel.shape[0] != h):
            expected = f"({h}, 2h+1, {d}) or (2h+1, {d})"
            raise ValueError(f"`rel` must have shape {expected} with an odd number of rows, got {tuple(rel.shape)}")
    check_key_mask(key_mask, b, k.shape[2])
    if isinstance(query_offset, bool) or not isinstance(query_offset, int) or query_offset < 0:
        raise ValueError(f"`query_offset` must be a non-negative int, got {query_offset!r}")
    if mode not in ATTENTION_MODES:
        raise ValueError(f"`mode` must be one of {ATTENTION_MODES}, got {mode!r}")
