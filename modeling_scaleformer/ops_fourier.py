"""Kernelized attention with a Fourier relative-position term, in linear time and memory.

The contract, per batch element and head (phi(x) = elu(x) + 1, positions P in R^n, parameters
a (D, n) frequencies, b (D,) phases, c (D,) amplitudes of the head):

    ph_ik = b_k + sum_n a_kn P_in          (query positions)
    pk_jk =       sum_n a_kn P_jn          (key positions)
    S_ij  = sum_k c_k phi(q_i)_k phi(k_j)_k cos(ph_ik - pk_jk)
          = sum_k c_k phi(q_i)_k phi(k_j)_k cos(b_k + a_k . (P_i - P_j))
    out_i = sum_j S_ij v_j / sum_j S_ij                                (over visible keys j)

so each feature k scores a pair by one harmonic of the relative position P_i - P_j. A key j is
visible to query i unless key_mask[j] == 0 or, for causal attention, j > i + query_offset (causality
always follows the token index, whatever the positions). By default the positions are the token
indices (n = 1): query i sits at i + query_offset, key j at j. The caller may give any real positions
(e.g. 2-D patch coordinates) as `q_positions` (B, Lq, n) and `k_positions` (B, Lk, n).

Guarded normaliser. Unlike plain kernelized attention, c_k cos(.) can be negative, so den_i =
sum_j S_ij can vanish or change sign. With

    M_i = sum_j m_j sum_k |c_k| phi(q_i)_k phi(k_j)_k          (>= |den_i|)

the ops return out_i = num_i / den_safe_i where den_safe_i = den_i if |den_i| >= eps M_i, and
sign(den_i) eps M_i otherwise (sign(0) = +1); out_i = 0 where M_i = 0 (no visible key). Since
|num_i| <= max_j |v_j| M_i, every output obeys |out_i| <= max|v| / eps, and it equals the exact
formula wherever the normaliser is well conditioned (|den_i| >= eps M_i). `eps` defaults to 1e-2.

Linear algorithm (`chunk_fourier_attention`, blocked in `ops_fourier_chunk`). With cos(x - y) =
cos x cos y + sin x sin y, S_ij = Qc_i . Kc_j + Qs_i . Ks_j with Qc = c * phi(q) * cos(ph),
Qs = c * phi(q) * sin(ph), Kc = phi(k) * cos(pk), Ks = phi(k) * sin(pk): plain linear attention with 2D
features on the augmented values [m_j v_j, m_j], and M_i = |c| phi(q_i) . sum_j m_j phi(k_j).
Bidirectional attention sums all keys once, O((Lq + Lk) D Dv); causal attention cuts the token indices
into chunks of c tokens, O(L (c + D) Dv) time. The work runs on blocks of at most about
`BLOCK_ELEMENTS` numbers, and the hand-written backward pass keeps only the inputs, O(L (D + Dv)) per
head (see `ops_fourier_chunk`).

Recurrent form (`fourier_step`): the state is the two D x (Dv + 1) sums of keys times cos and sin,
the sum of phi(k_j) m_j for the guard, and the number of tokens seen; its size does not depend on
the length.

Reference: kernelized attention with a Fourier (cosine) relative-position kernel, linear for masked and
unmasked attention through the product formula of the cosine; phi from Katharopoulos et al. (2020).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .ops_common import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_EPS,
    augment_values,
    check_attention_inputs,
    check_new_tokens,
    check_state,
    compute_dtype,
    describe,
    elu_feature_map,
    guarded_normalise,
    token_positions,
)
from .ops_fourier_chunk import ChunkFourierFunction, FourierChunkConfig, FourierInputs
from .ops_naive import naive_fourier_attention


def _check_eps(eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 < eps <= 1.0):
        raise ValueError(f"`eps` must be a number with 0 < eps <= 1, got {eps!r}")


def _check_parameters(q: Tensor, a: Tensor, b: Tensor, c: Tensor) -> int:
    """Check a (H, D, n), b (H, D), c (H, D) against q (B, H, L, D); return n."""
    heads, dim = q.shape[1], q.shape[-1]
    if not isinstance(a, Tensor) or a.dim() != 3 or tuple(a.shape[:2]) != (heads, dim) or a.shape[2] < 1:
        raise ValueError(f"`a` must be a tensor of shape (heads, dim, n) = ({heads}, {dim}, n), got {describe(a)}")
    for name, t in (("a", a), ("b", b), ("c", c)):
        if isinstance(t, Tensor) and not t.is_floating_point():
            raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {t.dtype}")
    for name, t in (("b", b), ("c", c)):
        if not isinstance(t, Tensor) or tuple(t.shape) != (heads, dim):
            raise ValueError(f"`{name}` must be a tensor of shape (heads, dim) = ({heads}, {dim}), got {describe(t)}")
    return a.shape[2]


def _check_positions(name: str, positions: Tensor | None, batch: int, length: int, n: int) -> None:
    if positions is None:
        if n != 1:
            raise ValueError(
                f"`{name}` is required when `a` has n = {n} position dimensions (the default, the token "
                f"index, has n = 1)"
            )
        return
    if (
        not isinstance(positions, Tensor)
        or positions.dim() != 3
        or positions.shape[0] not in (1, batch)
        or tuple(positions.shape[1:]) != (length, n)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, length, n) = ({batch}, {length}, {n}) with n = a.shape[-1] "
            f"(or batch 1), got {describe(positions)}"
        )
    if positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold real numbers, got dtype {positions.dtype}")


def _check_inputs(x: FourierInputs, query_offset: int, mode: str, eps: float) -> None:
    check_attention_inputs(x.q, x.k, x.v, None, x.key_mask, query_offset, mode)
    n = _check_parameters(x.q, x.a, x.b, x.c)
    _check_positions("q_positions", x.q_positions, x.q.shape[0], x.q.shape[2], n)
    _check_positions("k_positions", x.k_positions, x.k.shape[0], x.k.shape[2], n)
    _check_eps(eps)


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive int, got {chunk_size!r}")


class _Features(NamedTuple):
    q_cs: Tensor  # (B, H, Lq, 2D)  [c phi(q) cos(ph), c phi(q) sin(ph)]
    q_abs: Tensor  # (B, H, Lq, D)  |c| phi(q)
    k_cs: Tensor  # (B, H, Lk, 2D)  [phi(k) cos(pk), phi(k) sin(pk)]
    kf: Tensor  # (B, H, Lk, D)   phi(k)
    va: Tensor  # (B, H, Lk, Dv+1)  [m v, m]


def _query_features(q: Tensor, a: Tensor, b: Tensor, c: Tensor, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
    """positions (B or 1, Lq, n) -> ([c phi(q) cos(ph), c phi(q) sin(ph)], |c| phi(q))."""
    qf = elu_feature_map(q.to(dtype))
    a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
    ph = b[None, :, None, :] + torch.einsum("bin,hkn->bhik", positions.to(dtype), a)
    cq = c[None, :, None, :] * qf
    return torch.cat([cq * torch.cos(ph), cq * torch.sin(ph)], dim=-1), c.abs()[None, :, None, :] * qf


def _key_features(k: Tensor, a: Tensor, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
    """positions (B or 1, Lk, n) -> ([phi(k) cos(pk), phi(k) sin(pk)], phi(k))."""
    kf = elu_feature_map(k.to(dtype))
    pk = torch.einsum("bjn,hkn->bhjk", positions.to(dtype), a.to(dtype))
    return torch.cat([kf * torch.cos(pk), kf * torch.sin(pk)], dim=-1), kf


def _causal_sums(qf: Tensor, kf: Tensor, va: Tensor, query_offset: int, chunk: int) -> Tensor:
    """A_i = sum_{j <= i + query_offset} (qf_i . kf_j) va_j for rows qf (G, Lq, F), kf (G, Lk, F), va (G, Lk, E).

    Query chunks are aligned with key chunks of `chunk` tokens: query i (position p = i +
    query_offset) reads the prefix state of all key chunks before chunk p // chunk, plus masked dense
    scores inside its own chunk. Keys past the end form an extra zero chunk.
    """
    g, lq, f = qf.shape
    lk, e = kf.shape[1], va.shape[-1]
    first, lead = divmod(query_offset, chunk)
    nq, nk = math.ceil((lead + lq) / chunk), math.ceil(lk / chunk)
    qc = F.pad(qf, (0, 0, lead, nq * chunk - lead - lq)).view(g, nq, chunk, f)
    kc = F.pad(kf, (0, 0, 0, (nk + 1) * chunk - lk)).view(g, nk + 1, chunk, f)
    vc = F.pad(va, (0, 0, 0, (nk + 1) * chunk - lk)).view(g, nk + 1, chunk, e)
    summary = kc[:, :nk].transpose(2, 3) @ vc[:, :nk]  # (G, Nk, F, E)
    pre = torch.cat([summary.new_zeros(g, 1, f, e), summary.cumsum(1)], dim=1)  # sums over chunks < t
    index = (first + torch.arange(nq, device=qf.device)).clamp(max=nk)
    within = torch.ones(chunk, chunk, dtype=torch.bool, device=qf.device).tril()
    scores = (qc @ kc[:, index].transpose(2, 3)) * within.to(qf.dtype)
    out = qc @ pre[:, index] + scores @ vc[:, index]  # (G, Nq, c, E)
    return out.view(g, nq * chunk, e)[:, lead : lead + lq]


def _step_sums(feats: _Features, chunk: int) -> tuple[Tensor, Tensor]:
    """Causal augmented sums A = [num, den] (B, H, n, Dv+1) and guard sums M (B, H, n, 1) of new tokens."""
    q_cs, q_abs, k_cs, kf, va = feats
    b, h, lq, _ = q_cs.shape

    def rows(x: Tensor) -> Tensor:
        return x.expand(b, h, *x.shape[2:]).reshape(b * h, x.shape[2], x.shape[3])

    a_sum = _causal_sums(rows(q_cs), rows(k_cs), rows(va), 0, chunk)
    big = _causal_sums(rows(q_abs), rows(kf), rows(va[..., -1:]), 0, chunk)
    return a_sum.view(b, h, lq, -1), big.view(b, h, lq, 1)


def chunk_fourier_attention(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, c: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
    q_positions: Tensor | None = None, k_positions: Tensor | None = None, eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """The linear-time algorithm; same contract, shapes and guard as `fourier_attention`.

    Bidirectional: A_i = [Qc_i, Qs_i] . sum_j [Kc_j, Ks_j]^T [m_j v_j, m_j], one sum over all keys,
    O((Lq + Lk) D Dv) time per head. Causal: chunks of c = chunk_size tokens on the token index; a
    query reads the running sum of the key chunks before its own and masked dense scores inside it,
    O(Lq c (D + Dv) + (Lq + Lk) D Dv) time per head. In both, M_i = |c| phi(q_i) . sum_j m_j phi(k_j)
    over the same keys, then the guard of `fourier_attention`.

    Work is done in blocks of (batch, head) rows and spans of chunks, each creating at most about
    `BLOCK_ELEMENTS` numbers; beyond the outputs and gradients, memory is O(BLOCK_ELEMENTS) plus one
    2D x (Dv + 1) state per row (and, in the backward pass, per row and span). Autograd keeps only the
    inputs, O((Lq + Lk)(D + Dv)) per head; the backward pass recomputes each block and costs about
    three forward passes (`ops_fourier_chunk`). Gradients flow to q, k, v, a, b and c; `q_positions`,
    `k_positions` and `key_mask` receive none, and double backward is not supported.
    """
    x = FourierInputs(q, k, v, a, b, c, q_positions, k_positions, key_mask)
    _check_inputs(x, query_offset, "linear", eps)
    _check_chunk_size(chunk_size)
    return ChunkFourierFunction.apply(*x, FourierChunkConfig(causal, query_offset, chunk_size, eps))


# Fixed cost of the linear path per call, in multiply-adds: the Python and launch overhead of its
# extra tensor operations (about 5 ms on a 2-core CPU).
LINEAR_OVERHEAD = 8_000_000


def fourier_choose_mode(
    lq: int, lk: int, dim: int, value_dim: int, *, causal: bool, batch_heads: int = 1
) -> str:
    """The cheaper algorithm for one call, "naive" or "linear", from a cost model in multiply-adds.

    The quadratic path costs about 3D + Dv + 8 per score and batch*head (2D for the cos and sin
    scores, D for the guard, Dv + 1 for the values, masking). The linear path costs, per token,
    1.5 (2D + 1)(Dv + 1) for building and reading the states, per query (causal only) a dense chunk of
    c = 64 keys at twice the price per score (two passes, masking), and a fixed overhead per call.
    Fitted to forward + backward in float32 on a 2-core CPU with D = Dv = 64: the crossover is near
    L = 100 bidirectional and L = 200 - 250 causal for 8 to 64 batch*heads.
    """
    per_score = 3 * dim + value_dim + 8
    naive = batch_heads * lq * lk * per_score
    states = 1.5 * (lq + lk) * (2 * dim + 1) * (value_dim + 1)
    local = 2 * lq * DEFAULT_CHUNK_SIZE * per_score if causal else 0
    linear = batch_heads * (local + states) + LINEAR_OVERHEAD
    return "linear" if linear < naive else "naive"


def fourier_attention(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, c: Tensor,
    *, causal: bool = False, key_mask: Tensor | None = None, query_offset: int = 0,
    q_positions: Tensor | None = None, k_positions: Tensor | None = None, eps: float = DEFAULT_EPS,
    mode: str = "auto",
) -> Tensor:
    """Kernelized attention with Fourier relative positions, exact up to the normaliser guard, linear in length.

    With phi(x) = elu(x) + 1, per head:
        ph_ik = b_k + sum_n a_kn P_in,   pk_jk = sum_n a_kn P_jn
        S_ij  = sum_k c_k phi(q_i)_k phi(k_j)_k cos(ph_ik - pk_jk)
        M_i   = sum_j sum_k |c_k| phi(q_i)_k phi(k_j)_k
        out_i = sum_j S_ij v_j / den_safe_i,  den_safe_i = den_i if |den_i| >= eps M_i
                                                         = sign(den_i) eps M_i otherwise
    with den_i = sum_j S_ij, sums over visible keys (S_ij = 0 where key_mask[:, j] == 0 or, causal,
    j > i + query_offset), sign(0) = +1, and out_i = 0 where M_i = 0 (no visible key). Hence
    |out_i| <= max|v| / eps always, and out_i is the exact formula wherever |den_i| >= eps M_i. With
    a = 0, b = 0, c = 1 this is plain kernelized attention (Katharopoulos et al., 2020).

    Args:
        q (`Tensor` of shape `(B, H, Lq, D)`): queries.
        k (`Tensor` of shape `(B, H, Lk, D)`): keys; Lk may differ from Lq (cross attention).
        v (`Tensor` of shape `(B, H, Lk, Dv)`): values.
        a (`Tensor` of shape `(H, D, n)`): frequencies, in radians per unit of position, of each
            feature of each head along each of the n position dimensions.
        b (`Tensor` of shape `(H, D)`): phases, added to the query side.
        c (`Tensor` of shape `(H, D)`): amplitudes; may be negative.
        causal (`bool`, defaults to `False`): key j is visible to query i only if j <= i + query_offset
            (token indices, also when positions are given).
        key_mask (`Tensor` of shape `(B, Lk)`, *optional*): 1 (or True) for keys to attend to.
        query_offset (`int`, defaults to 0): token index of the first query; also its default position.
        q_positions (`Tensor` of shape `(B, Lq, n)` or `(1, Lq, n)`, *optional*): query positions;
            defaults to i + query_offset (then n must be 1). Used as given (not shifted by query_offset).
        k_positions (`Tensor` of shape `(B, Lk, n)` or `(1, Lk, n)`, *optional*): key positions;
            defaults to j (then n must be 1).
        eps (`float`, defaults to 1e-2): guard of the normaliser, 0 < eps <= 1.
        mode (`str`, defaults to `"auto"`): `"naive"` (quadratic reference), `"linear"` (O(L) time
            and memory, see `chunk_fourier_attention`) or `"auto"` (the cheaper, see `fourier_choose_mode`).

    Returns:
        `Tensor` of shape `(B, H, Lq, Dv)` in q's dtype. Half precision inputs are computed in float32;
        the parameters and positions are cast to that dtype (phases a . P lose absolute precision in
        float32 once |a . P| is large, about 1e-3 rad at 1e4).
    """
    _check_inputs(FourierInputs(q, k, v, a, b, c, q_positions, k_positions, key_mask), query_offset, mode, eps)
    if mode == "auto":
        mode = fourier_choose_mode(
            q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], causal=causal, batch_heads=q.shape[0] * q.shape[1]
        )
    kwargs = dict(
        causal=causal, key_mask=key_mask, query_offset=query_offset, q_positions=q_positions,
        k_positions=k_positions, eps=eps,
    )
    if mode == "naive":
        return naive_fourier_attention(q, k, v, a, b, c, **kwargs)
    return chunk_fourier_attention(q, k, v, a, b, c, **kwargs)


class FourierState(NamedTuple):
    """Recurrent state of causal Fourier attention after `seen` tokens (token indices 0..seen-1).

    Values are kept augmented as [m_j v_j, m_j] (key mask as a last channel), so each sum carries the
    numerator and the normaliser together. The sums depend on `a` (key phases pk_j = a . P_j): keep
    the parameters fixed while stepping. The size does not depend on `seen`.

    Fields:
        kv_cos (`Tensor` of shape `(B, H, D, Dv+1)`): sum_j (phi(k_j) * cos(pk_j)) [m_j v_j, m_j]^T.
        kv_sin (`Tensor` of shape `(B, H, D, Dv+1)`): sum_j (phi(k_j) * sin(pk_j)) [m_j v_j, m_j]^T.
        k_sum (`Tensor` of shape `(B, H, D)`): sum_j m_j phi(k_j), for the guard sum M.
        seen (`int`): number of tokens seen, the token index of the next token.
    """

    kv_cos: Tensor
    kv_sin: Tensor
    k_sum: Tensor
    seen: int


def fourier_initial_state(
    batch: int, heads: int, dim: int, value_dim: int, *, dtype: torch.dtype, device=None
) -> FourierState:
    """The empty state (no token seen); accumulates in `compute_dtype(dtype)`."""
    dtype = compute_dtype(dtype)
    return FourierState(
        kv_cos=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        kv_sin=torch.zeros(batch, heads, dim, value_dim + 1, dtype=dtype, device=device),
        k_sum=torch.zeros(batch, heads, dim, dtype=dtype, device=device),
        seen=0,
    )


def _state_sums(k_cs: Tensor, kf: Tensor, va: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    kv = k_cs.transpose(-1, -2) @ va  # (B, H, 2D, Dv+1)
    d = kf.shape[-1]
    return kv[..., :d, :], kv[..., d:, :], (kf * va[..., -1:]).sum(2)


def fourier_prefill_state(
    k: Tensor, v: Tensor, a: Tensor, *, key_mask: Tensor | None = None, k_positions: Tensor | None = None
) -> FourierState:
    """The state after the tokens k, v (B, H, L, .) at token indices 0..L-1, in O(L D Dv) time.

    `k_positions` (B, L, n) defaults to the token index (n = 1). Use it after a full causal call on a
    prompt, then continue with `fourier_step`.
    """
    check_attention_inputs(k, k, v, None, key_mask, 0, "linear")
    heads, dim = k.shape[1], k.shape[-1]
    if not isinstance(a, Tensor) or a.dim() != 3 or tuple(a.shape[:2]) != (heads, dim) or a.shape[2] < 1:
        raise ValueError(f"`a` must be a tensor of shape (heads, dim, n) = ({heads}, {dim}, n), got {describe(a)}")
    _check_positions("k_positions", k_positions, k.shape[0], k.shape[2], a.shape[2])
    dtype = compute_dtype(k.dtype)
    if k_positions is None:
        k_positions = token_positions(0, k.shape[2], dtype, k.device)
    k_cs, kf = _key_features(k, a, k_positions, dtype)
    va = augment_values(v.to(dtype), key_mask)
    kv_cos, kv_sin, k_sum = _state_sums(k_cs, kf, va)
    return FourierState(kv_cos.contiguous(), kv_sin.contiguous(), k_sum, k.shape[2])


def fourier_step(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, c: Tensor, state: FourierState,
    *, key_mask: Tensor | None = None, q_positions: Tensor | None = None, k_positions: Tensor | None = None,
    eps: float = DEFAULT_EPS,
) -> tuple[Tensor, FourierState]:
    """Causal attention of n new tokens on the past summarised by `state`, and the updated state.

    q, k, v have shape (B, H, n, .) and sit at token indices state.seen .. state.seen + n - 1;
    `key_mask` (B, n) masks new tokens only; `q_positions` / `k_positions` (B, n, n_pos) are the
    positions of the new tokens and default to their token indices. The result equals the matching
    rows of `fourier_attention(..., causal=True)` over the whole sequence (same positions, same eps).
    Work is O(n (c + D) Dv) with the new tokens cut in chunks of c = 64; the state keeps its size.

    Returns:
        `(out, state)`: out of shape (B, H, n, Dv) in q's dtype, and the new `FourierState`.
    """
    check_state(state, FourierState)
    _check_inputs(FourierInputs(q, k, v, a, b, c, q_positions, k_positions, key_mask), state.seen, "linear", eps)
    check_new_tokens(q, k)
    bsz, heads, n, dim = q.shape
    expected = (bsz, heads, dim, v.shape[-1] + 1)
    if (
        tuple(state.kv_cos.shape) != expected
        or tuple(state.kv_sin.shape) != expected
        or tuple(state.k_sum.shape) != expected[:3]
    ):
        raise ValueError(
            f"`state` does not fit these inputs: expected kv_cos and kv_sin of shape {expected} and k_sum of "
            f"shape {expected[:3]}, got {tuple(state.kv_cos.shape)}, {tuple(state.kv_sin.shape)} and "
            f"{tuple(state.k_sum.shape)}"
        )
    dtype = state.kv_cos.dtype
    if q_positions is None:
        q_positions = token_positions(state.seen, n, dtype, q.device)
    if k_positions is None:
        k_positions = token_positions(state.seen, n, dtype, k.device)
    q_cs, q_abs = _query_features(q, a, b, c, q_positions, dtype)
    k_cs, kf = _key_features(k, a, k_positions, dtype)
    va = augment_values(v.to(dtype), key_mask)
    feats = _Features(q_cs, q_abs, k_cs, kf, va)
    a_sum, big = _step_sums(feats, DEFAULT_CHUNK_SIZE)
    a_sum = a_sum + q_cs @ torch.cat([state.kv_cos, state.kv_sin], dim=2)
    big = big + q_abs @ state.k_sum[..., None]
    kv_cos, kv_sin, k_sum = _state_sums(k_cs, kf, va)
    new_state = FourierState(state.kv_cos + kv_cos, state.kv_sin + kv_sin, state.k_sum + k_sum, state.seen + n)
    return guarded_normalise(a_sum[..., :-1], a_sum[..., -1:], big, eps).to(q.dtype), new_state
