"""One training step and one forward pass of Scaleformer against BART and T5 of the same size: time and peak memory
against source length.

What is measured, for batch 1, fp32, train mode (dropout on), random weights (`torch.manual_seed`), for each
model of `--models` (default: `scaleformer bart`; the builders of `models.py`, as in `bench_generate.py`):

* `scaleformer`: `ScaleformerForConditionalGeneration`, default configuration (`local_softmax_decay`, horizon 16,
  `attention_mode="auto"`; figures recorded before 2026-11-23 ran `kernelized_rpe`);
* `scaleformer:TYPE`: the same with another `attention_type` (`ops_registry.ATTENTION_TYPES`); the softmax types
  are quadratic in L;
* `bart`: `transformers.BartForConditionalGeneration` with its default attention implementation;
* `t5`: `transformers.T5ForConditionalGeneration`, d_kv = d_model / heads, ReLU FFN, tied embeddings,
  relative attention buckets at their defaults (32 buckets, max distance 128). Its attention is quadratic:
  in transformers 5.23 its default implementation is `sdpa`, and the relative position bias goes to SDPA
  as a dense float mask of shape (1, heads, L, L) in every self-attention layer (the header says which
  implementation was used);
* `led` (opt-in): `transformers.LEDForConditionalGeneration`, encoder attention window 512 in every layer, no
  global tokens (linear in L; LED pads the source to a multiple of the window itself, so L below 512 costs as
  much as 512), `max_encoder_position_embeddings` the longest source length of the run rounded up to the window,
  `max_decoder_position_embeddings` fitting the target;
* `longt5` (opt-in): `transformers.LongT5ForConditionalGeneration` with `encoder_attention_type="transient-global"`,
  local radius 127, global blocks of 16 tokens, relative attention buckets like T5's (linear in L);

all d_model 512, 6 + 6 layers, 8 heads, FFN 2048, vocabulary 32000. One step is `zero_grad`, forward
with `labels` (cross-entropy), backward and the step of AdamW as `transformers.Trainer` builds it by default (its
`optim` adamw_torch_fused: one fused update of every parameter), on a random source of L tokens
and a random target of 128 tokens, without attention masks (nothing is padded). One forward pass is the
same forward with `labels` in eval mode (no dropout) under `torch.inference_mode()`: what scoring or the
encoder pass of generation costs. BART has learned
absolute positions, so its `max_position_embeddings` is set to the largest source length it runs at
(the header says which value was used); its position tables then hold more parameters than the
default 1024 would.

How: for each length, every model takes one warm-up step and forward pass (two under --compile), then `--repeats`
rounds of one step and one forward pass each, rotating which model goes first; the median wall time is reported,
with user and system CPU time and minor page faults. Peak memory is measured in a fresh subprocess per (model,
length), run before the timed steps of that length: the subprocess builds the model and its optimizer, takes one step at
source length 128 (so that AdamW's state exists and every code path is loaded), builds the inputs,
reads its resident memory from /proc/self/statm as the baseline, takes one step at length L and
reports the high-water mark `ru_maxrss` minus that baseline as the peak extra. A model that raises
MemoryError or RuntimeError, or whose subprocess dies, is reported as skipped, with the reason, at
that length and above; `--max-bart-length` skips BART above a length on purpose, and `--max-quadratic-length`
every model whose attention is quadratic in length (BART, T5 and the softmax types: xl_relative,
shaw_softmax, softmax), so that a run reaches the long lengths in hours rather than days. The tables
give each model's figures and, for every other model, its time over that of the first Scaleformer
model of `--models`. The report ends with log2-log2 slopes of time against length per model, for the
step and for the forward pass (least squares over 2048-16384), and the project's targets (PASS or FAIL
with the figure, N/A when `scaleformer` is not in `--models`); the exit status is 0 whether or not a
target is met.

Run from the repository root with the package installed (`pip install -e ".[bench]"`):

    python benchmarks/bench_train.py                          # L = 512 ... 16384, ~20 min idle, mostly BART at 16384
    python benchmarks/bench_train.py --quick                  # smoke test: small models, L = 256 ... 1024, ~1 min
    python benchmarks/bench_train.py --max-bart-length 8192 --json train.json --plot train.png
    # every attention type against both baselines, up to 32k or until a model runs out of memory (hours)
    python benchmarks/bench_train.py --lengths 512 2048 8192 16384 32768 --max-quadratic-length 16384 \
        --models scaleformer scaleformer:kernelized scaleformer:fourier scaleformer:toeplitz scaleformer:softmax bart t5
    # the long-input baselines LED and LongT5 (not skipped by --max-quadratic-length: their attention is local)
    python benchmarks/bench_train.py --lengths 512 2048 8192 16384 32768 --max-quadratic-length 16384 \
        --models scaleformer bart t5 led longt5

The machines this was written for are shared 2-core CPUs: absolute times move by 20% or more between
runs, so compare the models within one run, and keep `--threads` fixed when comparing runs.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import PreTrainedModel

from common import (
    GIB, MIB, Sample, Target, count_targets, cuda_peak_extra_mib, describe_error, kernel_options, load_summary,
    log2_axis, machine_info, measure_in_fresh_process, median_of, memory_baseline, parse_device, parse_kernel_options,
    peak_rss_bytes, print_machine, print_slopes, print_targets, profile_call, pyplot, rotated, sample_record,
    save_figure, slope_fit, synchronize, timed, write_json,
)
from models import (
    ALL_BASELINES, FIRST_PLAIN_ID, MODEL_SIZE, TRAIN_MODEL_NAMES, ModelSize, add_models_argument, build_model,
    check_models, describe_model, model_configs, quadratic_in_length, reference_model,
)
from modeling_scaleformer.ops_registry import SOFTMAX_TYPES


BATCH = 1
TARGET_LENGTH = 128
DEFAULT_LENGTHS = (512, 2048, 8192, 16384)
QUICK_LENGTHS = (256, 512, 1024)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")  # torch.compile's `mode`
QUICK_SIZE = ModelSize(vocab_size=8000, d_model=256, layers=3, heads=4, ffn_dim=1024)
LEARNING_RATE = 1e-4

MEMORY_WARMUP_LENGTH = 128

SLOPE_RANGE = (2048, 16384)
SLOPE_MAX = 1.15
MEMORY_LIMIT_BYTES = 24 * 2**30
# on a GPU: the small model's step at this source length at least this many times faster than BART's (with SDPA)
DEVICE_SPEEDUP_LENGTH = 16384
DEVICE_SPEEDUP_MIN = 3.0


class Skip(NamedTuple):
    short: str  # for the table
    detail: str  # for the notes


class Trainer(NamedTuple):
    model: PreTrainedModel
    optimizer: torch.optim.Optimizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark one training step (forward, backward, AdamW) of Scaleformer (any attention_type) "
        "against BART and T5 (and LED, LongT5) of the same size: time and peak memory against source length, growth "
        "slopes and the "
        "project's targets.",
    )
    add_models_argument(parser, ALL_BASELINES)
    parser.add_argument("--lengths", type=int, nargs="+", metavar="L",
                        help=f"source lengths (default: {', '.join(map(str, DEFAULT_LENGTHS))})")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: lengths {', '.join(map(str, QUICK_LENGTHS))}, memory at the largest "
                        f"only, and smaller models (d_model "
                        f"{QUICK_SIZE.d_model}, {QUICK_SIZE.layers}+{QUICK_SIZE.layers} layers, {QUICK_SIZE.heads} "
                        f"heads, FFN {QUICK_SIZE.ffn_dim}, vocabulary {QUICK_SIZE.vocab_size})")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed steps per model and length after the warm-up; the median is reported (default: 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default: 2)")
    parser.add_argument("--max-bart-length", type=int, metavar="L",
                        help="skip BART above source length L (default: run it at every length)")
    parser.add_argument("--max-quadratic-length", type=int, metavar="L",
                        help="skip the models with attention quadratic in length (bart, t5, scaleformer:"
                        f"{{{','.join(SOFTMAX_TYPES)}}}) above source length L (default: run them at every length)")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory subprocesses (on CUDA the peak is read in-process instead)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the models and batches, e.g. cpu, cuda (default: cpu)")
    parser.add_argument("--bf16", action="store_true", help="steps and forward passes under bfloat16 autocast")
    parser.add_argument("--profile", type=int, metavar="L",
                        help="after the timings, profile one training step of each model at source length L: the "
                             "kernels (CPU ops on CPU) with the most self time, and how many kernels the device ran")
    parser.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE",
                        help="every model under torch.compile (not fullgraph; where the Triton kernels run, "
                             "Scaleformer's default attention is traced through their operators, the count block's "
                             "sums everywhere, other attention ops run eagerly inside it) in MODE, one of "
                             + ", ".join(COMPILE_MODES) + " (default: default; reduce-overhead replays the compiled "
                             "parts as CUDA graphs); two warm-up rounds compile and record")
    parser.add_argument("--eager", nargs="+", default=[], metavar="MODEL",
                        help="under --compile, these models run eagerly: a baseline whose eager step is its fastest")
    parser.add_argument("--steps-only", action="store_true",
                        help="time the training steps only, not the forward passes: under --compile one graph to "
                             "compile and record per model instead of two")
    parser.add_argument("--kernel-options", nargs="+", default=[], metavar="NAME=VALUE",
                        help="module options of the default attention's Triton kernels (ops_local_softmax_triton, "
                             "which CUDA runs) for the whole run, each VALUE a Python literal, e.g. SCAN_PRODUCTS=True")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the inputs (default: 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every raw figure to PATH")
    parser.add_argument("--plot", type=Path, metavar="PATH",
                        help="write a log-log PNG of step time and peak extra memory against length to PATH")
    parser.add_argument("--measure-memory", nargs=2, metavar=("MODEL", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    args.models = check_models(parser, args.models, TRAIN_MODEL_NAMES)
    args.device = parse_device(parser, args.device)
    if args.eager and not args.compile:
        parser.error("--eager names models to leave out of --compile; without --compile every model runs eagerly")
    if unknown := sorted(set(args.eager) - set(args.models)):
        parser.error(f"--eager takes models of --models ({', '.join(args.models)}), got {', '.join(unknown)}")
    if args.device.type == "cuda":
        args.no_memory = True  # resident memory says nothing of the GPU's: its peak is read around each step
    if args.lengths is None:
        args.lengths = list(QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    args.lengths = sorted(set(args.lengths))
    args.size = QUICK_SIZE if args.quick else MODEL_SIZE
    if args.lengths[0] < 1:
        parser.error(f"--lengths must be positive, got {args.lengths[0]}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    for flag in ("max_bart_length", "max_quadratic_length"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    try:
        args.kernel_options = parse_kernel_options(args.kernel_options)
    except ValueError as error:
        parser.error(str(error))
    if args.measure_memory is not None:
        model, length = args.measure_memory
        if model not in TRAIN_MODEL_NAMES or not length.isdigit():
            parser.error(f"--measure-memory takes MODEL in {', '.join(TRAIN_MODEL_NAMES)} and a length, got "
                         f"{args.measure_memory}")
    return args


def planned_skip(model: str, length: int, args: argparse.Namespace) -> Skip | None:
    if model == "bart" and args.max_bart_length is not None and length > args.max_bart_length:
        reason = f"skipped (--max-bart-length {args.max_bart_length})"
        return Skip(reason, reason)
    # BART, T5 and the softmax types; not LED and LongT5, whose encoder attention is local
    if quadratic_in_length(model) and args.max_quadratic_length is not None and length > args.max_quadratic_length:
        reason = f"skipped (--max-quadratic-length {args.max_quadratic_length})"
        return Skip(reason, reason)
    return None


def bart_max_positions(args: argparse.Namespace) -> int:
    """The largest source length BART runs at (and at least the target length)."""
    return max([TARGET_LENGTH] + [n for n in args.lengths if planned_skip("bart", n, args) is None])


def long_baseline_lengths(args: argparse.Namespace) -> dict:
    """LED's position tables: the longest source length of the run (LED is never skipped on purpose) and the
    target."""
    return dict(longest_source=args.lengths[-1], longest_target=TARGET_LENGTH)


def build_trainer(name: str, args: argparse.Namespace) -> Trainer:
    config = model_configs(args.size, bart_max_positions(args), [name], **long_baseline_lengths(args))[name]
    model = build_model(name, config, args.seed).to(args.device).train()
    return Trainer(torch.compile(model, mode=args.compile) if compiled(name, args) else model, build_optimizer(model))


def build_optimizer(model: PreTrainedModel) -> torch.optim.Optimizer:
    """The optimizer `transformers.Trainer` builds by default (`TrainingArguments.optim`, AdamW with fused=True), at
    LEARNING_RATE: what a training run with the defaults steps."""
    from transformers import Trainer as HFTrainer, TrainingArguments

    optimizer, options = HFTrainer.get_optimizer_cls_and_kwargs(TrainingArguments(learning_rate=LEARNING_RATE,
                                                                                  report_to=[]))
    return optimizer(model.parameters(), **options)


def compiled(name: str, args: argparse.Namespace) -> bool:
    """Whether model `name` runs under torch.compile (--compile, less --eager)."""
    return args.compile is not None and name not in args.eager


def timed_on_device(work, args: argparse.Namespace) -> Sample:
    """`work` under bfloat16 autocast with --bf16, timed until the device finished it (so that the clocks hold the
    device's time), and until it returned to the host (`Sample.issued_s`)."""

    def run() -> None:
        with torch.autocast(args.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            work()

    return timed(run, finish=lambda: synchronize(args.device))


def make_batch(length: int, vocab_size: int, seed: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Random source ids (B, length) and labels (B, TARGET_LENGTH), no special token of any model."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + length)
    input_ids = torch.randint(FIRST_PLAIN_ID, vocab_size, (BATCH, length), generator=g)
    labels = torch.randint(FIRST_PLAIN_ID, vocab_size, (BATCH, TARGET_LENGTH), generator=g)
    return input_ids.to(device), labels.to(device)


def train_step(trainer: Trainer, input_ids: Tensor, labels: Tensor, args: argparse.Namespace,
               losses: list[Tensor] | None = None) -> Sample:
    """zero_grad, forward with labels, backward, AdamW step; timed. The loss (detached, on the device: reading it
    would wait for the device) is appended to `losses` if given."""

    def step() -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        loss = trainer.model(input_ids=input_ids, labels=labels, use_cache=False).loss
        loss.backward()
        trainer.optimizer.step()
        if losses is not None:
            losses.append(loss.detach())

    return timed_on_device(step, args)


def forward_pass(trainer: Trainer, input_ids: Tensor, labels: Tensor, args: argparse.Namespace) -> Sample:
    """One forward with labels in eval mode under inference_mode (no dropout, no autograd graph); timed."""

    def forward() -> None:
        with torch.inference_mode():
            trainer.model(input_ids=input_ids, labels=labels, use_cache=False)

    trainer.model.eval()
    try:
        return timed_on_device(forward, args)
    finally:
        trainer.model.train()


def profile_steps(length: int, args: argparse.Namespace, top: int = 20) -> dict:
    """One training step of each model at `length` under torch.profiler, after `warmup_rounds` unprofiled steps (two
    under --compile, so that reduce-overhead's CUDA graphs are recorded and the profiled step replays them;
    `common.profile_call`): the `top` kernels (CPU ops on CPU) by self time, and the number of device kernels."""
    input_ids, labels = make_batch(length, args.size.vocab_size, args.seed, args.device)
    profiles = {}
    for name in args.models:
        step = functools.partial(train_step, build_trainer(name, args), input_ids, labels, args)
        table, kernels = profile_call(step, args.device, top, warmup=warmup_rounds(args))
        profiles[name] = {"length": length, "device_kernels": kernels, "table": table}
        print(f"## Profile: {name}, one training step at source length {length}"
              + (f", {kernels:,} device kernels" if kernels is not None else "") + "\n")
        print(table)
        del step  # and its trainer
        gc.collect()
    return profiles


def measure_memory_here(name: str, length: int, args: argparse.Namespace) -> dict:
    """Peak extra resident memory of one step at `length`, in this (fresh) process."""
    trainer = build_trainer(name, args)
    train_step(trainer, *make_batch(MEMORY_WARMUP_LENGTH, args.size.vocab_size, args.seed), args)
    input_ids, labels = make_batch(length, args.size.vocab_size, args.seed)
    gc.collect()
    baseline, floor = memory_baseline()
    try:
        sample = train_step(trainer, input_ids, labels, args)
    except (MemoryError, RuntimeError) as error:
        return {"error": describe_error(error)}
    peak = peak_rss_bytes()
    return {"baseline_bytes": baseline, "floor_bytes": floor, "peak_bytes": peak, "extra_bytes": peak - baseline,
            "step_s": sample.wall_s}


def measure_memory(name: str, length: int, args: argparse.Namespace) -> dict:
    """`measure_memory_here` in a fresh process (this script's hidden `--measure-memory`)."""
    arguments = ["--measure-memory", name, str(length), "--lengths", *map(str, args.lengths),
                 "--threads", str(args.threads), "--seed", str(args.seed)]
    if args.quick:
        arguments.append("--quick")
    if args.bf16:
        arguments.append("--bf16")
    if compiled(name, args):
        arguments += ["--compile", args.compile]
    if args.max_bart_length is not None:
        arguments += ["--max-bart-length", str(args.max_bart_length)]
    if args.max_quadratic_length is not None:
        arguments += ["--max-quadratic-length", str(args.max_quadratic_length)]
    if args.kernel_options:
        arguments += ["--kernel-options", *(f"{key}={value!r}" for key, value in args.kernel_options.items())]
    return {"model": name, "length": length, **measure_in_fresh_process(__file__, arguments, f"{name} L={length}")}


def warmup_rounds(args: argparse.Namespace) -> int:
    """Untimed rounds before the timed ones: one, or two under --compile (the first compiles, the second records
    reduce-overhead's CUDA graphs, which the timed rounds replay)."""
    return 2 if args.compile else 1


Samples = dict[tuple[str, int], list[Sample]]
Losses = dict[tuple[str, int], list[float]]
def run_benchmark(args: argparse.Namespace) -> tuple[Samples, Samples, dict[tuple[str, int], dict],
                                                      dict[tuple[str, int], Skip], dict[tuple[str, int], float],
                                                      Losses]:
    """Per length: memory subprocesses, then warm-up rounds (`warmup_rounds`) and `--repeats` interleaved rounds of
    a timed step and a timed forward pass per model. A model that fails is dropped, its trainer freed, and skipped
    at the longer lengths. Returns (steps, forward passes, memory, skipped, device peaks, the timed steps' losses)."""
    trainers = {name: build_trainer(name, args) for name in args.models}
    samples: Samples = {}
    forwards: Samples = {}
    memory: dict[tuple[str, int], dict] = {}
    skipped: dict[tuple[str, int], Skip] = {}
    cuda_peaks: dict[tuple[str, int], float] = {}  # (model, L) -> MiB a step allocated on the device (--device cuda)
    failed: dict[str, tuple[int, str]] = {}  # model -> (length, error) where it stopped; skipped above
    losses: Losses = {}  # (model, L) -> the loss of each timed step
    for length in args.lengths:
        running = []
        for name in args.models:
            skip = planned_skip(name, length, args)
            if skip is None and name in failed:
                at, error = failed[name]
                skip = Skip(f"skipped (failed at L={at})", f"skipped, as it failed at L={at} ({error})")
            if skip is not None:
                skipped[(name, length)] = skip
                continue
            if not args.no_memory and (not args.quick or length == args.lengths[-1]):
                record = measure_memory(name, length, args)
                memory[(name, length)] = record
                if "error" in record:
                    failed[name] = (length, record["error"])
                    skipped[(name, length)] = Skip("skipped (memory subprocess failed)",
                                                   f"skipped: the memory subprocess failed ({record['error']})")
                    del trainers[name]
                    gc.collect()
                    continue
            running.append(name)
        input_ids, labels = make_batch(length, args.size.vocab_size, args.seed, args.device)
        start = time.perf_counter()
        warmups = warmup_rounds(args)
        for round_index in range(warmups + args.repeats):
            for name in rotated(running, round_index):
                if name not in running:
                    continue
                try:
                    loss = []
                    sample = train_step(trainers[name], input_ids, labels, args, loss)
                    forward = None if args.steps_only else forward_pass(trainers[name], input_ids, labels, args)
                    if round_index == warmups + args.repeats - 1 and args.device.type == "cuda":
                        cuda_peaks[(name, length)] = cuda_peak_extra_mib(
                            lambda: train_step(trainers[name], input_ids, labels, args), args.device)
                except (MemoryError, RuntimeError) as error:
                    failed[name] = (length, describe_error(error))
                    skipped[(name, length)] = Skip(f"skipped ({type(error).__name__})",
                                                   f"skipped: the step or forward pass raised {describe_error(error)}")
                    samples.pop((name, length), None)
                    forwards.pop((name, length), None)
                    running.remove(name)
                    del trainers[name]
                    gc.collect()
                    continue
                if round_index >= warmups:
                    samples.setdefault((name, length), []).append(sample)
                    losses.setdefault((name, length), []).append(loss[0].item())  # read after the clocks
                    if forward is not None:
                        forwards.setdefault((name, length), []).append(forward)
        passes = "steps" if args.steps_only else "steps and forward passes"
        print(f"[time] L={length}: {len(running)} model(s) x ({warmups} warm-up + {args.repeats}) {passes} in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return samples, forwards, memory, skipped, cuda_peaks, losses


def median_at(samples: Samples, name: str, length: int, field: str = "wall_s") -> float | None:
    return median_of(samples.get((name, length)), field)


def fmt_s(seconds: float | None, missing: str = "–") -> str:
    return missing if seconds is None else f"{seconds:,.3f}"


def memory_cell(memory: dict[tuple[str, int], dict], name: str, length: int) -> str:
    record = memory.get((name, length))
    if record is None or "error" in record:
        return "–"
    return f"{record['extra_bytes'] / MIB:,.0f}"


def print_time_table(samples: Samples, memory: dict[tuple[str, int], dict] | None,
                     skipped: dict[tuple[str, int], Skip], args: argparse.Namespace) -> None:
    """Median wall time per model and length, the ratios to the reference model and (with `memory`) peak memory."""
    ref = reference_model(args.models)
    others = [name for name in args.models if name != ref]
    columns = [f"{name} s" for name in args.models] + [f"{name} / {ref}" for name in others]
    if memory is not None:
        columns += [f"{name} peak extra MiB" for name in args.models]
    print("| source L | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for length in args.lengths:
        t = {name: median_at(samples, name, length) for name in args.models}
        cells = [str(length)] + [fmt_s(t[name], skipped[(name, length)].short if (name, length) in skipped else "–")
                                 for name in args.models]
        cells += ["–" if t[name] is None or t[ref] is None else f"{t[name] / t[ref]:.2f}x" for name in others]
        if memory is not None:
            cells += [memory_cell(memory, name, length) for name in args.models]
        print("| " + " | ".join(cells) + " |")
    print()


def print_tables(samples: Samples, forwards: Samples, memory: dict[tuple[str, int], dict],
                 skipped: dict[tuple[str, int], Skip], losses: Losses, args: argparse.Namespace) -> None:
    ref = reference_model(args.models)
    others = [name for name in args.models if name != ref]
    print(f"## One training step (forward + backward + AdamW), target {TARGET_LENGTH} tokens: median wall time of "
          f"{args.repeats} step(s)")
    print()
    print_time_table(samples, memory, skipped, args)
    if not args.steps_only:
        print(f"## One forward pass (eval mode, inference_mode, with labels), target {TARGET_LENGTH} tokens: median "
              f"wall time of {args.repeats} pass(es)")
        print()
        print_time_table(forwards, None, skipped, args)
    print("| source L | model | pass | wall s | issued s | user CPU s | system CPU s | minor page faults | losses |")
    print("|---:|:---|:---|---:|---:|---:|---:|---:|:---|")
    for length in args.lengths:
        for name in args.models:
            for label, runs in (("step", samples), ("forward", forwards)):
                if (name, length) not in runs:
                    continue
                faults = median_at(runs, name, length, "minor_faults")
                print(f"| {length} | {name} | {label} | {fmt_s(median_at(runs, name, length))} | "
                      f"{fmt_s(median_at(runs, name, length, 'issued_s'))} | "
                      f"{fmt_s(median_at(runs, name, length, 'user_s'))} | "
                      f"{fmt_s(median_at(runs, name, length, 'sys_s'))} | {faults:,.0f} | "
                      + (", ".join(f"{x:.4f}" for x in losses.get((name, length), [])) if label == "step" else "")
                      + " |")
    print()
    notes = ["Peak extra MiB: the high-water mark of resident memory during one step at L, over the baseline, in a "
             "fresh process per (model, L). The baseline holds the weights, AdamW's state (after one step at L="
             f"{MEMORY_WARMUP_LENGTH}) and the inputs; gradients are set to None before each step, so the extra "
             "includes them."]
    if others:
        notes.insert(0, f"MODEL / {ref}: the model's step time over {ref}'s at the same L (above 1: {ref} is "
                        "faster).")
    notes.append("Losses: the loss of each timed step, in order (the same batch every step).")
    notes.append("Issued s: the wall time until the step (or pass) returned to the host, its work issued to the device "
                 "but not necessarily finished (on CPU, the whole of it); near the wall time, the host sets the pace.")
    if args.steps_only:
        notes.append("Forward passes were not timed (--steps-only).")
    if args.no_memory:
        notes.append("Memory was not measured (--no-memory).")
    else:
        if args.quick:
            notes.append(f"With --quick, memory is measured at L={args.lengths[-1]} only.")
        baselines = {name: [r["baseline_bytes"] for (m, _), r in memory.items() if m == name and "error" not in r]
                     for name in args.models}
        spans = {name: sorted({round(x / MIB) for x in b}) for name, b in baselines.items() if b}
        cells = [f"{name} {span[0]:,}" + (f"-{span[-1]:,}" if len(span) > 1 else "") + " MiB"
                 for name, span in spans.items()]
        if cells:
            notes.append("Baseline resident memory: " + "; ".join(cells) + ".")
    for (name, length), skip in skipped.items():
        notes.append(f"{name} at L={length}: {skip.detail}.")
    for note in notes:
        print(f"- {note}")
    print()


def compute_slopes(samples: Samples, lengths: list[int], models: list[str], kind: str = "step") -> list[dict]:
    """Least-squares slope of log2(time) against log2(L) over SLOPE_RANGE (all measured lengths if < 2 there),
    per model and time (wall, user CPU); `kind` ("step" or "forward") labels the rows."""
    rows = []
    for name in models:
        for field in ("wall_s", "user_s"):
            points = [(n, t) for n in lengths if (t := median_at(samples, name, n, field)) is not None and t > 0]
            rows.append({"model": name, "pass": kind, "time": field,
                         **slope_fit(points, SLOPE_RANGE, fit_all_if_few=True)})
    return rows


def print_slope_table(rows: list[dict], lengths: list[int]) -> None:
    print_slopes(rows, lengths, SLOPE_RANGE, ("model", "pass", "time"),
                 lambda r: [r["model"], r["pass"], "wall" if r["time"] == "wall_s" else "user CPU"])


def evaluate_targets(samples: dict[tuple[str, int], list[Sample]], slopes: list[dict],
                     memory: dict[tuple[str, int], dict], skipped: dict[tuple[str, int], Skip],
                     args: argparse.Namespace) -> list[Target]:
    lo, hi = SLOPE_RANGE
    top = args.lengths[-1]
    names = [f"(a) scaleformer step time: slope {lo}-{hi} <= {SLOPE_MAX}",
             f"(b) scaleformer trains at L={top} (ran, peak resident memory < {MEMORY_LIMIT_BYTES / GIB:g} GiB)"]
    if "scaleformer" not in args.models:
        return [Target(name, "N/A", "scaleformer is not in --models") for name in names]
    targets = []
    row = next(r for r in slopes if r["model"] == "scaleformer" and r["pass"] == "step" and r["time"] == "wall_s")
    name = names[0]
    if row["slope"] is None:
        targets.append(Target(name, "N/A", "fewer than 2 lengths measured"))
    else:
        partial = "" if row["range"] == [lo, hi] else f" (fit over {row['range'][0]}-{row['range'][1]} only)"
        status = "PASS" if row["slope"] <= SLOPE_MAX else "FAIL"
        targets.append(Target(name, status, f"slope {row['slope']:.2f}{partial}"))
    name = names[1]
    step = median_at(samples, "scaleformer", top)
    record = memory.get(("scaleformer", top))
    if step is None:
        skip = skipped.get(("scaleformer", top))
        targets.append(Target(name, "FAIL", "did not run" if skip is None else skip.detail))
    elif record is None:
        targets.append(Target(name, "N/A", f"ran ({step:,.2f} s per step); memory not measured"))
    else:
        peak = record["peak_bytes"]
        targets.append(Target(name, "PASS" if peak < MEMORY_LIMIT_BYTES else "FAIL",
                              f"ran ({step:,.2f} s per step), peak {peak / GIB:.2f} GiB "
                              f"({record['extra_bytes'] / MIB:,.0f} MiB over the baseline)"))
    if args.device.type != "cpu":
        targets.append(device_speedup_target(samples, args))
    return targets


def device_speedup_target(samples: Samples, args: argparse.Namespace) -> Target:
    """(c), on a device: Scaleformer's step at DEVICE_SPEEDUP_LENGTH at least DEVICE_SPEEDUP_MIN times faster than
    BART's, each as it ran (compiled or eager, `--compile`, `--eager`)."""
    n = DEVICE_SPEEDUP_LENGTH
    name = f"(c) scaleformer step at L={n} at least {DEVICE_SPEEDUP_MIN:g}x faster than bart's on {args.device.type}"
    ours, bart = median_at(samples, "scaleformer", n), median_at(samples, "bart", n)
    if ours is None or bart is None:
        return Target(name, "N/A", f"needs both scaleformer and bart timed at L={n}")
    how = {model: "compiled" if compiled(model, args) else "eager" for model in ("scaleformer", "bart")}
    ratio = bart / ours
    return Target(name, "PASS" if ratio >= DEVICE_SPEEDUP_MIN else "FAIL",
                  f"{ratio:.2f}x (scaleformer {ours:.3f} s {how['scaleformer']}, bart {bart:.3f} s {how['bart']})")


def write_plot(path: Path, samples: Samples, forwards: Samples, memory: dict[tuple[str, int], dict],
               args: argparse.Namespace) -> None:
    fig, (ax_time, ax_forward, ax_mem) = pyplot().subplots(1, 3, figsize=(16, 4.8))
    ref = reference_model(args.models)
    for ax, runs in ((ax_time, samples), (ax_forward, forwards)):
        for name in args.models:
            points = [(n, t) for n in args.lengths if (t := median_at(runs, name, n)) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        measured = [(n, t) for n in args.lengths if (t := median_at(runs, ref, n)) is not None]
        if measured:
            n0, t0 = measured[0]
            ax.plot(args.lengths, [t0 * n / n0 for n in args.lengths], linestyle="--", linewidth=1, color="black",
                    label=f"slope 1 (from {ref})")
            if len(args.models) > 2:
                ax.plot(args.lengths, [t0 * (n / n0) ** 2 for n in args.lengths], linestyle=":", linewidth=1,
                        color="black", label=f"slope 2 (from {ref})")
    for name in args.models:
        mem = [(n, r["extra_bytes"] / MIB) for n in args.lengths
               if (r := memory.get((name, n))) is not None and "error" not in r]
        if mem:
            ax_mem.plot(*zip(*mem), marker="o", label=name)
    for ax in (ax_time, ax_forward, ax_mem):
        log2_axis(ax, args.lengths)
        ax.set_yscale("log")
        ax.set_xlabel("source length L")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # nothing to label without memory figures
            ax.legend(fontsize="small" if len(args.models) > 2 else None)
    ax_time.set_ylabel("median training-step time (s)")
    ax_forward.set_ylabel("median forward-pass time (s)")
    ax_mem.set_ylabel("peak extra resident memory of a step (MiB)")
    size = args.size
    save_figure(fig, path, f"training step and forward pass, target {TARGET_LENGTH}, d_model {size.d_model}, "
                f"{size.layers}+{size.layers} layers, fp32, {torch.get_num_threads()} threads")


def print_header(info: dict, args: argparse.Namespace) -> None:
    size = args.size
    descriptions = []
    for name, config in model_configs(size, bart_max_positions(args), args.models,
                                      **long_baseline_lengths(args)).items():
        with torch.device("meta"):
            model = build_model(name, config, args.seed)
        descriptions.append(describe_model(name, model, "the largest source length it runs at", decoding=False))
    print(f"# Training-step and forward-pass benchmark: {', '.join(args.models)}")
    print()
    print_machine(info)
    quick = " (smaller models: --quick)" if args.quick else ""
    precision = "fp32" + (" under bf16 autocast" if args.bf16 else "") + (
        "" if not args.compile else ", torch.compile" if args.compile == "default" else
        f", torch.compile (mode {args.compile})") + (f" ({', '.join(args.eager)} eager)" if args.eager else "")
    print(f"- every model: d_model {size.d_model}, {size.layers}+{size.layers} layers, {size.heads} heads, FFN "
          f"{size.ffn_dim}, vocabulary {size.vocab_size}{quick}; random init (seed {args.seed}), train mode (dropout "
          f"0.1), {precision}, batch {BATCH}, AdamW lr {LEARNING_RATE:g} (fused, Trainer's default); "
          f"device {args.device}"
          + (f" ({torch.cuda.get_device_name(args.device)})" if args.device.type == "cuda" else ""))
    if args.kernel_options:
        print("- options of the default attention's Triton kernels: "
              + ", ".join(f"{name} = {value!r}" for name, value in args.kernel_options.items()))
    for description in descriptions:
        print(f"- {description}")
    print(f"- source lengths {', '.join(map(str, args.lengths))}, target {TARGET_LENGTH}; {warmup_rounds(args)} "
          f"warm-up + {args.repeats} timed step(s){'' if args.steps_only else ' and forward pass(es)'} per model and "
          "length, the models taking turns to go first; median")
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with kernel_options(args.kernel_options):
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    """The run that `args` asks for: every model at every length (or one memory measurement), its tables, targets
    and files."""
    if args.measure_memory is not None:
        name, length = args.measure_memory
        print(json.dumps(measure_memory_here(name, int(length), args)))
        return 0

    info = machine_info(torch.get_num_threads())
    print_header(info, args)
    samples, forwards, memory, skipped, cuda_peaks, losses = run_benchmark(args)
    print_tables(samples, forwards, memory, skipped, losses, args)
    if cuda_peaks:
        print("| source L | model | device peak extra MiB (one step) |")
        print("|---:|:---|---:|")
        for (name, length), mib in cuda_peaks.items():
            print(f"| {length} | {name} | {mib:,.0f} |")
        print()
    slopes = compute_slopes(samples, args.lengths, args.models, "step")
    if not args.steps_only:
        slopes += compute_slopes(forwards, args.lengths, args.models, "forward")
    print_slope_table(slopes, args.lengths)
    targets = evaluate_targets(samples, slopes, memory, skipped, args)
    print_targets(targets)
    profiles = profile_steps(args.profile, args) if args.profile else None

    info["load_average_at_end"] = os.getloadavg()
    if args.json is not None:
        write_json(args.json, {
            "machine": info,
            "settings": {"model_size": args.size._asdict(), "quick": args.quick, "batch": BATCH,
                         "target_length": TARGET_LENGTH, "lengths": args.lengths, "repeats": args.repeats,
                         "seed": args.seed, "learning_rate": LEARNING_RATE, "max_bart_length": args.max_bart_length,
                         "max_quadratic_length": args.max_quadratic_length,
                         "models": args.models, "bart_max_position_embeddings": bart_max_positions(args),
                         "device": str(args.device), "bf16": args.bf16,
                         "compile": args.compile, "eager": args.eager, "steps_only": args.steps_only,
                         "kernel_options": {name: repr(value) for name, value in args.kernel_options.items()}},
            "cuda_peak_extra_mib": [{"model": name, "length": length, "mib": mib}
                                    for (name, length), mib in cuda_peaks.items()],
            "timings": [{"model": name, "length": length, **sample_record(runs), "loss": losses[(name, length)]}
                        for (name, length), runs in samples.items()],
            "forward_timings": [{"model": name, "length": length, **sample_record(runs)}
                                for (name, length), runs in forwards.items()],
            "skipped": [{"model": name, "length": length, "reason": skip.detail}
                        for (name, length), skip in skipped.items()],
            "memory": list(memory.values()),
            "slopes": slopes,
            "targets": [t._asdict() for t in targets],
            "profiles": profiles,
        })
        print(f"- raw figures written to {args.json}")
    if args.plot is not None:
        write_plot(args.plot, samples, forwards, memory, args)

    print(f"Summary: {count_targets(targets)}; {load_summary(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
