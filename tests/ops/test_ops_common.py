"""The helpers every op shares: the relative index convention, the Toeplitz table order, visible keys and
the normalisers, against their definitions written as loops."""

import pytest
import torch

from modeling_scaleformer.ops_common import (
    guarded_normalise,
    normalise,
    relative_index,
    rows_by_distance,
    visible_keys,
)


@pytest.mark.parametrize("horizon", [0, 1, 3])
def test_relative_index_and_toeplitz_rows(horizon):
    """Row h + t of a table is distance p_i - j = t, clipped; the Toeplitz bias holds offset j - p_i = r - h."""
    queries, keys = torch.arange(4) + 5, torch.arange(11)
    index = relative_index(queries, keys, horizon)
    bias = torch.randn(2, 2 * horizon + 1, dtype=torch.float64)
    by_distance = rows_by_distance(bias)
    for i, p in enumerate(queries.tolist()):
        for j in keys.tolist():
            assert index[i, j] == min(max(p - j, -horizon), horizon) + horizon
            offset_row = min(max(j - p, -horizon), horizon) + horizon
            assert torch.equal(by_distance[:, index[i, j]], bias[:, offset_row])


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
def test_visible_keys(causal, masked):
    lq, lk, offset = 5, 9, 2
    key_mask = torch.tensor([[1, 0, 1, 1, 0, 1, 1, 1, 1], [0] * 9]) if masked else None
    keep = visible_keys(lq, lk, causal=causal, key_mask=key_mask, query_offset=offset, device="cpu")
    assert keep.dtype == torch.bool and keep.dim() == 4
    keep = keep.expand(2, 1, lq, lk)
    for b in range(2):
        for i in range(lq):
            for j in range(lk):
                expected = not (causal and j > i + offset) and (key_mask is None or bool(key_mask[b, j]))
                assert bool(keep[b, 0, i, j]) == expected


def test_normalisers_give_zero_rows_without_keys():
    num = torch.tensor([[2.0, 4.0], [3.0, 3.0], [1.0, 1.0]], dtype=torch.float64)
    den = torch.tensor([[2.0], [0.0], [-0.001]], dtype=torch.float64)
    torch.testing.assert_close(normalise(num, den), torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]], dtype=num.dtype))
    visible = torch.tensor([[True], [False], [True]])
    torch.testing.assert_close(normalise(num, den, visible)[2], num[2] / -0.001)
    # the guard: |den| >= eps M keeps den, otherwise sign(den) eps M; M == 0 gives 0
    big = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
    out = guarded_normalise(num, den, big, 0.01)
    torch.testing.assert_close(out, torch.stack([num[0] / 2.0, torch.zeros(2, dtype=num.dtype), num[2] / -0.01]))
