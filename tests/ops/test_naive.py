"""The quadratic references of `ops_naive` against the formulas written as loops (conftest), in float64."""

import pytest
import torch

from modeling_scaleformer.ops_naive import (
    naive_kernelized_decay_attention,
    naive_fourier_attention,
    naive_kernelized_rpe_attention,
    naive_shaw_softmax_attention,
    naive_softmax_attention,
    naive_toeplitz_attention,
    naive_xl_relative_attention,
)


def check_both_directions(naive, loop, inputs, offset):
    """naive against the loop formula, bidirectional and causal, for (q, k, v, table, key_mask) inputs."""
    q, k, v, table, key_mask = inputs
    for causal in (False, True):
        expected = loop(q, k, v, table, causal, key_mask, offset)
        got = naive(q, k, v, table, causal=causal, key_mask=key_mask, query_offset=offset)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_kernelized_rpe_matches_loop_formula(kernelized_case, kernelized_inputs, kernelized_loop, split_case):
    inputs, offset = split_case(kernelized_inputs, kernelized_case)
    check_both_directions(naive_kernelized_rpe_attention, kernelized_loop, inputs, offset)


def test_toeplitz_matches_loop_formula(toeplitz_case, toeplitz_inputs, toeplitz_loop, split_case):
    inputs, offset = split_case(toeplitz_inputs, toeplitz_case)
    check_both_directions(naive_toeplitz_attention, toeplitz_loop, inputs, offset)


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("normalise", [False, True], ids=["sum", "normalised"])
def test_kernelized_decay_matches_loop_formula(
    normalise, feature_map, decay_case, decay_inputs, decay_loop, split_case
):
    (q, k, v, rel, decay, key_mask, horizon), offset = split_case(decay_inputs, decay_case)
    for causal in (False, True):
        expected = decay_loop(q, k, v, rel, decay, causal, key_mask, offset, horizon, normalise, feature_map)
        got = naive_kernelized_decay_attention(
            q, k, v, rel, decay, causal=causal, key_mask=key_mask, query_offset=offset, horizon=horizon,
            normalise=normalise, feature_map=feature_map,
        )
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


FOURIER_CASES = [
    pytest.param(dict(lq=1, lk=1), 0, id="L1"),
    pytest.param(dict(lq=7, lk=4), 2, id="Lq>Lk-offset"),
    pytest.param(dict(lq=4, lk=9, mask="random"), 0, id="Lq<Lk-masked-rows"),
    pytest.param(dict(lq=6, lk=6, npos=2, mask="padding"), 0, id="2d-positions"),
]


@pytest.mark.parametrize("case, offset", FOURIER_CASES)
def test_fourier_matches_loop_formula(case, offset, fourier_inputs, fourier_loop_sums):
    """On well-conditioned inputs (c > 0, small a) the guard is idle and naive is the plain formula."""
    q, k, v, params, key_mask, positions = fourier_inputs(b=2, h=2, well_conditioned=True, **case)
    for causal in (False, True):
        num, den, big = fourier_loop_sums(q, k, v, params, causal, key_mask, offset, positions)
        visible = big > 0
        assert bool((den[visible].abs() >= 1e-2 * big[visible]).all())  # the guard must not act here
        expected = torch.where(visible[..., None], num / torch.where(visible, den, 1.0)[..., None], 0.0)
        got = naive_fourier_attention(
            q, k, v, *params, causal=causal, key_mask=key_mask, query_offset=offset,
            q_positions=positions[0], k_positions=positions[1],
        )
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


# each softmax variant: its name, its reference and its parameters in positional order
SOFTMAX_VARIANTS = [
    pytest.param("softmax", naive_softmax_attention, (), id="softmax"),
    pytest.param("shaw_softmax", naive_shaw_softmax_attention, ("rel",), id="shaw_softmax"),
    pytest.param("xl_relative", naive_xl_relative_attention, ("u", "rel", "bias"), id="xl_relative"),
]
SOFTMAX_CASES = [
    pytest.param(dict(lq=1, lk=1), id="L1"),
    pytest.param(dict(lq=6, lk=4, horizon=2), id="Lq>Lk"),
    pytest.param(dict(lq=3, lk=7, offset=4), id="Lq<Lk-offset"),
    pytest.param(dict(lq=5, lk=6, mask="random"), id="masked-rows"),
    pytest.param(dict(lq=5, lk=5, shared=True, mask="padding"), id="shared-rel-padding"),
    pytest.param(dict(lq=4, lk=5, horizon=0), id="horizon-0"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("variant, naive, parameters", SOFTMAX_VARIANTS)
@pytest.mark.parametrize("case", SOFTMAX_CASES)
def test_softmax_matches_loop_formula(
    case, variant, naive, parameters, causal, softmax_inputs, softmax_loop, split_case, assert_matches
):
    """Outputs and the gradients of q, k, v and every parameter of the variant."""
    (q, k, v, params, key_mask), offset = split_case(softmax_inputs, case)
    names = ("q", "k", "v") + parameters
    tensors = (q, k, v, *(params[n] for n in parameters))

    def loop(*leaves, causal, key_mask, query_offset):
        named = dict(zip(names[3:], leaves[3:]))
        return softmax_loop(variant, *leaves[:3], named, causal, key_mask, query_offset)

    # a fully masked output does not depend on q: its gradient is 0, not missing
    upstream = torch.randn(q.shape[:3] + v.shape[-1:], generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    assert_matches(
        naive, loop, tensors, names, causal=causal, key_mask=key_mask, query_offset=offset,
        rtol=1e-10, atol=1e-12, grad_rtol=1e-9, grad_atol=1e-11, upstream=upstream, allow_unused=True,
    )
