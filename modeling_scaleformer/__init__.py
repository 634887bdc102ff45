"""Scaleformer: transformers with linear-time, relative-position-aware attention."""

# the ops, by module: each attention's functions, its naive reference, and the registry of variants
from .ops_fourier import FourierState, chunk_fourier_attention, fourier_attention, fourier_choose_mode
from .ops_fourier import fourier_initial_state, fourier_prefill_state, fourier_step
from .ops_kernelized import KernelizedRPECrossSummary, KernelizedRPEState, chunk_kernelized_rpe_attention
from .ops_kernelized import choose_mode, kernelized_rpe_attention, kernelized_rpe_choose_mode
from .ops_kernelized import kernelized_rpe_cross_step, kernelized_rpe_cross_summary, kernelized_rpe_initial_state
from .ops_kernelized import kernelized_rpe_prefill_state, kernelized_rpe_step
from .ops_local_softmax import LocalSoftmaxDecayCrossSummary, LocalSoftmaxDecayState
from .ops_local_softmax import chunk_local_softmax_decay_attention, local_softmax_decay_attention
from .ops_local_softmax import local_softmax_decay_cross_step, local_softmax_decay_cross_summary
from .ops_local_softmax import local_softmax_decay_initial_state, local_softmax_decay_prefill_state
from .ops_local_softmax import local_softmax_decay_step
from .ops_naive import naive_local_softmax_decay_attention
from .ops_naive import naive_fourier_attention, naive_kernelized_rpe_attention, naive_shaw_softmax_attention
from .ops_naive import naive_softmax_attention, naive_toeplitz_attention, naive_xl_relative_attention
from .ops_registry import ATTENTION_TYPES, ATTENTION_VARIANTS, SOFTMAX_TYPES, AttentionVariant
from .ops_registry import cross_attention_type, get_attention_variant
from .ops_softmax import SoftmaxKVState, shaw_softmax_attention, softmax_attention, softmax_cross_state
from .ops_softmax import softmax_cross_step, softmax_initial_state, softmax_prefill_state, softmax_step
from .ops_softmax import xl_relative_attention
from .ops_toeplitz import ToeplitzState, fft_toeplitz_attention, toeplitz_attention, toeplitz_choose_mode
from .ops_toeplitz import toeplitz_initial_state, toeplitz_prefill_state, toeplitz_step


__all__ = [
    # ops_fourier
    "FourierState", "chunk_fourier_attention", "fourier_attention", "fourier_choose_mode", "fourier_initial_state",
    "fourier_prefill_state", "fourier_step",
    # ops_kernelized
    "KernelizedRPECrossSummary", "KernelizedRPEState", "choose_mode", "chunk_kernelized_rpe_attention",
    "kernelized_rpe_attention", "kernelized_rpe_choose_mode", "kernelized_rpe_cross_step",
    "kernelized_rpe_cross_summary", "kernelized_rpe_initial_state", "kernelized_rpe_prefill_state",
    "kernelized_rpe_step",
    # ops_local_softmax
    "LocalSoftmaxDecayCrossSummary", "LocalSoftmaxDecayState", "chunk_local_softmax_decay_attention",
    "local_softmax_decay_attention", "local_softmax_decay_cross_step", "local_softmax_decay_cross_summary",
    "local_softmax_decay_initial_state", "local_softmax_decay_prefill_state", "local_softmax_decay_step",
    # ops_naive
    "naive_local_softmax_decay_attention", "naive_fourier_attention", "naive_kernelized_rpe_attention", "naive_shaw_softmax_attention",
    "naive_softmax_attention", "naive_toeplitz_attention", "naive_xl_relative_attention",
    # ops_registry
    "ATTENTION_TYPES", "ATTENTION_VARIANTS", "SOFTMAX_TYPES", "AttentionVariant", "cross_attention_type",
    "get_attention_variant",
    # ops_softmax
    "SoftmaxKVState", "shaw_softmax_attention", "softmax_attention", "softmax_cross_state", "softmax_cross_step",
    "softmax_initial_state", "softmax_prefill_state", "softmax_step", "xl_relative_attention",
    # ops_toeplitz
    "ToeplitzState", "fft_toeplitz_attention", "toeplitz_attention", "toeplitz_choose_mode", "toeplitz_initial_state",
    "toeplitz_prefill_state", "toeplitz_step",
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
    ScaleformerEncoderModel,
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
    "ScaleformerEncoderModel",
    "ScaleformerForCausalLM",
    "ScaleformerForConditionalGeneration",
    "ScaleformerForSequenceClassification",
    "ScaleformerModel",
    "ScaleformerPreTrainedModel",
]
