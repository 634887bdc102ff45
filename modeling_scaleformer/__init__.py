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
