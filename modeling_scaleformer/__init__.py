"""Scaleformer: transformers with linear-time, relative-position-aware kernelized attention."""

from .ops_kernelized import (
    KernelizedRPECrossSummary,
    KernelizedRPEState,
    choose_mode,
    chunk_kernelized_rpe_attention,
    kernelized_rpe_attention,
    kernelized_rpe_cross_step,
    kernelized_rpe_cross_summary,
    kernelized_rpe_initial_state,
    kernelized_rpe_prefill_state,
    kernelized_rpe_step,
)
from .ops_fourier import (
    FourierState,
    fourier_attention,
    fourier_initial_state,
    fourier_prefill_state,
    fourier_step,
    naive_fourier_attention,
)
from .ops_naive import naive_kernelized_rpe_attention
from .ops_registry import ATTENTION_TYPES, ATTENTION_VARIANTS, AttentionVariant, get_attention_variant
from .ops_softmax import (
    SoftmaxKVState,
    naive_shaw_softmax_attention,
    naive_softmax_attention,
    naive_xl_relative_attention,
    shaw_softmax_attention,
    softmax_attention,
    softmax_cross_state,
    softmax_cross_step,
    softmax_initial_state,
    softmax_prefill_state,
    softmax_step,
    xl_relative_attention,
)
from .ops_toeplitz import (
    ToeplitzState,
    fft_toeplitz_attention,
    naive_toeplitz_attention,
    toeplitz_attention,
    toeplitz_initial_state,
    toeplitz_prefill_state,
    toeplitz_step,
)


__all__ = [
    "ATTENTION_TYPES",
    "ATTENTION_VARIANTS",
    "AttentionVariant",
    "FourierState",
    "SoftmaxKVState",
    "ToeplitzState",
    "fft_toeplitz_attention",
    "fourier_attention",
    "fourier_initial_state",
    "fourier_prefill_state",
    "fourier_step",
    "get_attention_variant",
    "naive_fourier_attention",
    "naive_shaw_softmax_attention",
    "naive_softmax_attention",
    "naive_toeplitz_attention",
    "naive_xl_relative_attention",
    "shaw_softmax_attention",
    "softmax_attention",
    "softmax_cross_state",
    "softmax_cross_step",
    "softmax_initial_state",
    "softmax_prefill_state",
    "softmax_step",
    "toeplitz_attention",
    "toeplitz_initial_state",
    "toeplitz_prefill_state",
    "toeplitz_step",
    "xl_relative_attention",
    "KernelizedRPECrossSummary",
    "KernelizedRPEState",
    "choose_mode",
    "chunk_kernelized_rpe_attention",
    "kernelized_rpe_attention",
    "kernelized_rpe_cross_step",
    "kernelized_rpe_cross_summary",
    "kernelized_rpe_initial_state",
    "kernelized_rpe_prefill_state",
    "kernelized_rpe_step",
    "naive_kernelized_rpe_attention",
]

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from .cache import ScaleformerCache
from .configuration_scaleformer import ScaleformerConfig
from .modeling_scaleformer import (
    ScaleformerForCausalLM,
    ScaleformerForConditionalGeneration,
    ScaleformerForSequenceClassification,
    ScaleformerModel,
    ScaleformerPreTrainedModel,
)


AutoConfig.register("scaleformer", ScaleformerConfig, exist_ok=True)
AutoModel.register(ScaleformerConfig, ScaleformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(ScaleformerConfig, ScaleformerForConditionalGeneration, exist_ok=True)
AutoModelForCausalLM.register(ScaleformerConfig, ScaleformerForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(ScaleformerConfig, ScaleformerForSequenceClassification, exist_ok=True)
# save_pretrained copies the code next to the weights, so folders load with trust_remote_code=True
ScaleformerConfig.register_for_auto_class("AutoConfig")
ScaleformerModel.register_for_auto_class("AutoModel")
ScaleformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
ScaleformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")
ScaleformerForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ += [
    "ScaleformerCache",
    "ScaleformerConfig",
    "ScaleformerForCausalLM",
    "ScaleformerForConditionalGeneration",
    "ScaleformerForSequenceClassification",
    "ScaleformerModel",
    "ScaleformerPreTrainedModel",
]
