"""The registry of attention variants: named functions, facts stated once, what is derived from them."""

import inspect

import pytest

from modeling_scaleformer import ops_registry
from modeling_scaleformer.ops_registry import (
    ATTENTION_TYPES,
    ATTENTION_VARIANTS,
    SOFTMAX_TYPES,
    AttentionVariant,
    cross_attention_type,
    get_attention_variant,
)


ROLES = ("parameters", "attention", "prefill_state", "step", "cross_summary", "cross_step")


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_every_role_is_a_named_function_of_the_registry(attention_type):
    variant = ATTENTION_VARIANTS[attention_type]
    assert isinstance(variant, AttentionVariant)
    for role in ROLES:
        fn = getattr(variant, role)
        if fn is None:
            assert role.startswith("cross_"), (attention_type, role)
            continue
        assert inspect.isfunction(fn) and fn.__name__ != "<lambda>", (attention_type, role)
        assert getattr(ops_registry, fn.__name__) is fn, (attention_type, role)  # a module-level name
    assert variant.description and "\n" not in variant.description


def test_facts_and_what_is_derived_from_them():
    assert ATTENTION_TYPES == tuple(ATTENTION_VARIANTS)
    assert SOFTMAX_TYPES == ("xl_relative", "shaw_softmax", "softmax")
    for name, variant in ATTENTION_VARIANTS.items():
        assert set(variant.modes) == ({"auto", "naive"} if variant.softmax else {"auto", "linear", "naive"}), name
        assert variant.constant_state != variant.softmax, name
        cross = ATTENTION_VARIANTS[cross_attention_type(name, False)]
        assert cross.softmax == variant.softmax and cross.parameters(2, 4, 3, False) == {}, name
        if variant.cross_attention_rpe:  # cross attention is the variant itself, relative positions included
            assert cross_attention_type(name, True) == name and variant.cross_step is not None, name
        else:
            with pytest.raises(ValueError, match="`cross_attention_rpe` does not apply"):
                cross_attention_type(name, True)
        assert variant.normalised or not variant.softmax, name
    assert [n for n, v in ATTENTION_VARIANTS.items() if v.cross_attention_rpe] == [
        "kernelized_rpe", "kernelized_decay", "kernelized_decay_gated", "kernelized_gated", "kernelized_sum",
        "local_softmax_decay",
    ]
    assert [n for n, v in ATTENTION_VARIANTS.items() if not v.normalised] == [
        "kernelized_decay_gated", "kernelized_gated", "kernelized_sum"
    ]
    assert ops_registry.DECAY_TYPES == (
        "kernelized_decay", "kernelized_decay_gated", "kernelized_gated", "local_softmax_decay"
    )
    with pytest.raises(ValueError, match="`attention_type`"):
        get_attention_variant("linear")
