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
from .ops_naive import naive_kernelized_rpe_attention


__all__ = [
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

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from .cache import ScaleformerCache
from .configuration_scaleformer import ScaleformerConfig
from .modeling_scaleformer import (
    ScaleformerForCausalLM,
    ScaleformerForConditionalGeneration,
    ScaleformerModel,
    ScaleformerPreTrainedModel,
)


AutoConfig.register("scaleformer", ScaleformerConfig, exist_ok=True)
AutoModel.register(ScaleformerConfig, ScaleformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(ScaleformerConfig, ScaleformerForConditionalGeneration, exist_ok=True)
AutoModelForCausalLM.register(ScaleformerConfig, ScaleformerForCausalLM, exist_ok=True)
# save_pretrained copies the code next to the weights, so folders load with trust_remote_code=True
ScaleformerConfig.register_for_auto_class("AutoConfig")
ScaleformerModel.register_for_auto_class("AutoModel")
ScaleformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
ScaleformerForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ += [
    "ScaleformerCache",
    "ScaleformerConfig",
    "ScaleformerForCausalLM",
    "ScaleformerForConditionalGeneration",
    "ScaleformerModel",
    "ScaleformerPreTrainedModel",
]
