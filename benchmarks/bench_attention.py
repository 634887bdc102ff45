"""Time and memory of kernelized attention with relative positions against naive attention and SDPA.

What is measured, for B=1, H=8, D=64, float32 and a horizon of h=16 (rel of shape (8, 33, 64)):

* `linear`: `kernelized_rpe_attention(..., mode="linear")`, the chunked O(L) algorithm;
* `naive`: `kernelized_rpe_attention(..., mode="naive")`, the O(L^2) reference that forms all scores;
* `sdpa`: `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)`, the
  softmax baseline a user would otherwise pick;

each causal and bidirectional, for the forward pass alone (under `torch.no_grad()`) and for forward
plus backward (gradients of q, k, v and, for the kernelized methods, rel, against a random upstream
gradient made once per configuration, outside the timer).

How: the script first checks `mode="linear"` and `mode="naive"` against
`naive_kernelized_rpe_attention` in float64 on one small padded shape, outputs and gradients, and
exits with status 1 if they differ. It then times every configuration of one length in turn
(round-robin, after one warm-up call each) and reports the median wall time of `--repeats` calls.
Peak extra memory is measured in a fresh subprocess per (method, causal, L): resident memory after
the inputs exist is the baseline, and the high-water mark `ru_maxrss` after the forward pass, then
after forward plus backward, minus that baseline is the peak extra. The report ends with log-log
slopes of time against L, the project's targets (PASS or FAIL with the figure) and a check that
`mode="auto"` is never much slower than the better of its two choices. The exit status is 0 whether
or not a target is met; only a failed correctness check gives 1.

Run from the repository root, with the package installed (`pip install -e ".[bench]"`) or with
`PYTHONPATH=.` in front of the command:

    python benchmarks/bench_attention.py                       # L = 256 ... 32768
    python benchmarks/bench_attention.py --quick               # smoke test, L = 256 ... 2048
    python benchmarks/bench_attention.py --max-length 4096 --json bench.json --plot bench.png

The full run takes about a quarter of an hour on an idle 2-core CPU, most of it in SDPA at 16384,
and several times that when another job shares the machine. On such shared machines absolute times
move by 20% or more between runs, and 2 torch threads can collapse under load: compare methods
within one run, keep `--threads` fixed when comparing runs, and read the load average printed at
the top and in the summary before trusting a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from common import (
    MIB, Sample, Target, count_targets, load_summary, log2_axis, machine_info, measure_in_fresh_process, median_of,
    memory_baseline, peak_rss_bytes, print_machine, print_slopes, print_targets, pyplot, sample_record, save_figure,
    slope_fit, timed, write_json,
)
from modeling_scaleformer.ops_kernelized import choose_mode, kernelized_rpe_attention
from modeling_scaleformer.ops_naive import naive_kernelized_rpe_attention
from modeling_scaleformer.ops_registry import ATTENTION_VARIANTS, decay_spectrum, inverse_softplus, rotary_spectrum


BATCH = 1
HEADS = 8
DIM = 64
HORIZON = 16
DTYPE = torch.float32
DEFAULT_LENGTHS = tuple(256 * 2**i for i in range(8))  # 256 ... 32768
QUICK_LENGTHS = (256, 512, 1024, 2048)
AUTO_LENGTHS = tuple(64 * 2**i for i in range(10))  # 64 ... 32768
METHODS = ("linear", "naive", "sdpa")
# the other attention_type variants, each through its fast path (the op the model calls)
VARIANTS = ("kernelized", "kernelized_decay", "kernelized_decay_gated", "local_softmax_decay", "fourier", "toeplitz",
            "shaw_softmax", "xl_relative")
VARIANT_MODE = {"kernelized": "linear", "kernelized_decay": "linear", "kernelized_decay_gated": "linear",
                "local_softmax_decay": "linear", "fourier": "linear", "toeplitz": "linear",
                "shaw_softmax": "auto", "xl_relative": "auto"}
QUADRATIC_VARIANTS = ("shaw_softmax", "xl_relative")  # an L x L float bias goes to SDPA
ALL_METHODS = METHODS + VARIANTS
PASSES = ("fwd", "fwd+bwd")
CAUSAL_ORDER = (False, True)

VERIFY_BATCH = 2
VERIFY_LENGTH = 300
VERIFY_PADDING = 37  # keys masked at the end of the second sequence
VERIFY_TOLERANCE = 1e-9
FP32_TOLERANCE = 1e-4

AUTO_SHORT_LENGTH = 1024  # up to here calls take milliseconds: more repeats
AUTO_SHORT_REPEATS = 7
AUTO_RATIO_MAX = 1.2

MEMORY_WARMUP_LENGTH = 128  # loads every code path before the baseline is read

SLOPE_RANGE = (4096, 32768)
LINEAR_SLOPE_MAX = 1.15
SPEEDUP_LENGTH = 16384
SPEEDUP_MIN = {True: 5.0, False: 10.0}  # sdpa / linear, fwd+bwd, by causal
MEMORY_LENGTH = 32768
MEMORY_RATIO_MAX = 8.0  # peak extra of linear fwd+bwd, in multiples of the bytes of q+k+v


class Inputs(NamedTuple):
    q: Tensor  # (B, H, L, D)
    k: Tensor  # (B, H, L, D)
    v: Tensor  # (B, H, L, D)
    rel: Tensor  # (H, 2h+1, D)
    params: dict[str, dict[str, Tensor]]  # variant -> its parameters, as the model holds them


class Config(NamedTuple):
    method: str
    causal: bool
    pass_name: str
    length: int


def causal_label(causal: bool) -> str:
    return "causal" if causal else "bidir"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark kernelized RPE attention (linear and naive modes) against PyTorch SDPA: "
        "time, peak memory, growth with length and the project's targets.",
    )
    parser.add_argument("--lengths", type=int, nargs="+", metavar="L",
                        help=f"sequence lengths (default: {', '.join(map(str, DEFAULT_LENGTHS))})")
    parser.add_argument("--max-length", type=int, metavar="L",
                        help="drop lengths above L, here and in the auto-check")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: lengths {QUICK_LENGTHS[0]}..{QUICK_LENGTHS[-1]}, 1 repeat, "
                        "memory at the largest length only")
    parser.add_argument("--repeats", type=int,
                        help="timed calls per configuration after one warm-up; the median is reported "
                        "(default: 3, 1 with --quick)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default: 2)")
    parser.add_argument("--max-naive-length", type=int, default=4096, metavar="L",
                        help="skip naive above L: each score tensor is B*H*L*L*4 bytes and autograd "
                        "keeps several (default: 4096)")
    parser.add_argument("--max-sdpa-length", type=int, default=16384, metavar="L",
                        help="skip sdpa above L: its fwd+bwd at 32768 takes minutes (default: 16384)")
    parser.add_argument("--max-toeplitz-length", type=int, default=16384, metavar="L",
                        help="skip toeplitz above L: its FFT path holds L*D*(D+1) numbers per head "
                        "(default: 16384)")
    parser.add_argument("--methods", nargs="+", choices=ALL_METHODS, default=list(ALL_METHODS), metavar="M",
                        help=f"what to time: {', '.join(METHODS)} (the core op and its baselines) and the "
                        f"variants {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--auto-check", action=argparse.BooleanOptionalAction, default=True,
                        help=f"time mode='auto' against naive and linear over L = {AUTO_LENGTHS[0]}.."
                        f"{AUTO_LENGTHS[-1]} (default: on)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every raw figure to PATH")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="write a log-log PNG of fwd+bwd time to PATH")
    parser.add_argument("--measure-memory", nargs=3, metavar=("METHOD", "CAUSAL", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.lengths is None:
        args.lengths = list(QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    if args.max_length is not None:
        args.lengths = [n for n in args.lengths if n <= args.max_length]
    args.lengths = sorted(set(args.lengths))
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.measure_memory is None:
        if not args.lengths:
            parser.error("no length left to run (check --lengths and --max-length)")
        if args.lengths[0] < 1:
            parser.error(f"--lengths must be positive, got {args.lengths[0]}")
    else:
        method, causal, length = args.measure_memory
        if method not in ALL_METHODS or causal not in ("causal", "bidir") or not length.isdigit():
            parser.error(f"--measure-memory takes METHOD in {ALL_METHODS}, causal|bidir and a length, "
                         f"got {args.measure_memory}")
    return args


def variant_parameters(variant: str, g: torch.Generator, dtype: torch.dtype) -> dict[str, Tensor]:
    """Parameters of the shapes the model gives `variant`, at its initialisation plus noise."""
    specs = ATTENTION_VARIANTS[variant].parameters(HEADS, DIM, HORIZON, False)
    params = {}
    for name, spec in specs.items():
        noise = 0.1 * torch.randn(spec.shape, generator=g, dtype=dtype)
        if spec.init == "ones":
            noise += 1
        elif spec.init == "frequencies":
            noise = rotary_spectrum(DIM, dtype)[None, :, None].expand(spec.shape).clone()
        elif spec.init == "decay_rates":
            noise += inverse_softplus(decay_spectrum(spec.shape[0], dtype=dtype))
        params[name] = noise
    return params


def make_inputs(length: int, *, seed: int, requires_grad: bool, batch: int = BATCH,
                dtype: torch.dtype = DTYPE) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, HEADS, length, DIM, generator=g, dtype=dtype) for _ in range(3))
    rel = torch.randn(HEADS, 2 * HORIZON + 1, DIM, generator=g, dtype=dtype)
    params = {name: variant_parameters(name, g, dtype) for name in VARIANTS}
    for t in [q, k, v, rel] + [p for ps in params.values() for p in ps.values()]:
        t.requires_grad_(requires_grad)
    return Inputs(q, k, v, rel, params)


def make_grad_out(config: Config, seed: int) -> Tensor:
    """Random upstream gradient, one per configuration, seeded from it."""
    index = ALL_METHODS.index(config.method) if config.method in ALL_METHODS else len(ALL_METHODS)
    g = torch.Generator().manual_seed(seed * 1_000_003 + config.length * 8 + index * 2 + config.causal)
    return torch.randn(BATCH, HEADS, config.length, DIM, generator=g, dtype=DTYPE)


def attend(method: str, x: Inputs, causal: bool) -> Tensor:
    if method == "sdpa":
        return F.scaled_dot_product_attention(x.q, x.k, x.v, is_causal=causal)
    if method in VARIANTS:
        return ATTENTION_VARIANTS[method].attention(
            x.q, x.k, x.v, x.params[method], causal=causal, key_mask=None, query_offset=0, mode=VARIANT_MODE[method]
        )
    return kernelized_rpe_attention(x.q, x.k, x.v, x.rel, causal=causal, mode=method)


def differentiable(method: str, x: Inputs) -> tuple[Tensor, ...]:
    if method in VARIANTS:
        return (x.q, x.k, x.v, *x.params[method].values())
    return (x.q, x.k, x.v) if method == "sdpa" else (x.q, x.k, x.v, x.rel)


def time_call(method: str, x: Inputs, causal: bool, pass_name: str, grad_out: Tensor | None) -> Sample:
    """One call, timed: fwd under no_grad, or fwd then the gradients of every input."""

    def call() -> Tensor:
        if pass_name == "fwd":
            with torch.no_grad():
                return attend(method, x, causal)
        out = attend(method, x, causal)
        torch.autograd.grad(out, differentiable(method, x), grad_out)
        return out

    return timed(call)


def skip_reason(method: str, length: int, args: argparse.Namespace) -> str | None:
    if method not in args.methods:
        return "not selected"
    if method in ("naive",) + QUADRATIC_VARIANTS and length > args.max_naive_length:
        return "skipped (memory)"
    if method == "toeplitz" and length > args.max_toeplitz_length:
        return "skipped (memory)"
    if method == "sdpa" and length > args.max_sdpa_length:
        return "skipped (time)"
    return None


def verify(seed: int, methods: list[str]) -> dict:
    """mode='linear' and mode='naive' against the float64 reference, with padding, both directions; each
    selected variant's fast path against its own naive reference likewise."""
    x = make_inputs(VERIFY_LENGTH, seed=seed, requires_grad=True, batch=VERIFY_BATCH, dtype=torch.float64)
    core = (x.q, x.k, x.v, x.rel)
    key_mask = torch.ones(VERIFY_BATCH, VERIFY_LENGTH, dtype=torch.bool)
    key_mask[-1, -VERIFY_PADDING:] = False
    checks = []
    for causal in CAUSAL_ORDER:
        ref = naive_kernelized_rpe_attention(x.q, x.k, x.v, x.rel, causal=causal, key_mask=key_mask)
        grad_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed + causal), dtype=torch.float64)
        ref_grads = torch.autograd.grad(ref, core, grad_out)
        for mode in ("linear", "naive"):
            out = kernelized_rpe_attention(x.q, x.k, x.v, x.rel, causal=causal, key_mask=key_mask, mode=mode)
            grads = torch.autograd.grad(out, core, grad_out)
            grad_err = max((a - b).abs().max().item() for a, b in zip(grads, ref_grads))
            checks.append({"dtype": "float64", "mode": mode, "causal": causal,
                           "output_err": (out - ref).abs().max().item(), "grad_err": grad_err,
                           "tolerance": VERIFY_TOLERANCE})
        # the dtype that is timed, for the record of its accuracy
        x32 = [t.detach().float() for t in core]
        with torch.no_grad():
            out32 = kernelized_rpe_attention(*x32, causal=causal, key_mask=key_mask, mode="linear")
        checks.append({"dtype": "float32", "mode": "linear", "causal": causal,
                       "output_err": (out32.double() - ref).abs().max().item(), "grad_err": None,
                       "tolerance": FP32_TOLERANCE})
        for variant in (m for m in VARIANTS if m in methods):
            inputs = differentiable(variant, x)
            outs = [
                ATTENTION_VARIANTS[variant].attention(
                    x.q, x.k, x.v, x.params[variant], causal=causal, key_mask=key_mask, query_offset=0, mode=mode
                )
                for mode in (VARIANT_MODE[variant], "naive")
            ]
            grads = [torch.autograd.grad(o, inputs, grad_out) for o in outs]
            grad_err = max((a - b).abs().max().item() for a, b in zip(*grads))
            checks.append({"dtype": "float64", "mode": f"{variant} {VARIANT_MODE[variant]}", "causal": causal,
                           "output_err": (outs[0] - outs[1]).abs().max().item(), "grad_err": grad_err,
                           "tolerance": VERIFY_TOLERANCE})
    for c in checks:
        errors = [c["output_err"]] + ([] if c["grad_err"] is None else [c["grad_err"]])
        c["passed"] = all(e < c["tolerance"] for e in errors)
    return {"batch": VERIFY_BATCH, "length": VERIFY_LENGTH, "padded_keys": VERIFY_PADDING,
            "checks": checks, "passed": all(c["passed"] for c in checks)}


def print_verification(result: dict) -> None:
    print(f"## Verification against the naive references (float64), B={result['batch']}, H={HEADS}, "
          f"L={result['length']}, D={DIM}, h={HORIZON}, last {result['padded_keys']} keys of sequence 2 padded")
    print()
    for c in result["checks"]:
        grads = "" if c["grad_err"] is None else f", grads (q, k, v, parameters) max abs err {c['grad_err']:.2e}"
        print(f"- {'PASS' if c['passed'] else 'FAIL'} mode={c['mode']} {c['dtype']} {causal_label(c['causal'])}: "
              f"output max abs err {c['output_err']:.2e}{grads} (< {c['tolerance']:.0e})")
    print()


def round_robin(configs: list[Config], repeats: int, seed: int, progress: str) -> dict[Config, list[Sample]]:
    """One warm-up call per configuration, then `repeats` rounds over all of them in turn."""
    length = configs[0].length
    x = make_inputs(length, seed=seed, requires_grad=True)
    grad_outs = {c: make_grad_out(c, seed) if c.pass_name == "fwd+bwd" else None for c in configs}
    samples: dict[Config, list[Sample]] = {c: [] for c in configs}
    start = time.perf_counter()
    for c in configs:
        time_call(c.method, x, c.causal, c.pass_name, grad_outs[c])
    for _ in range(repeats):
        for c in configs:
            samples[c].append(time_call(c.method, x, c.causal, c.pass_name, grad_outs[c]))
    print(f"[{progress}] L={length}: {len(configs)} configurations x (1 warm-up + {repeats}) "
          f"in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return samples


def run_benchmark(args: argparse.Namespace) -> dict[Config, list[Sample]]:
    samples: dict[Config, list[Sample]] = {}
    for length in args.lengths:
        configs = [Config(m, causal, p, length) for p in PASSES for causal in CAUSAL_ORDER for m in ALL_METHODS
                   if skip_reason(m, length, args) is None]
        samples.update(round_robin(configs, args.repeats, args.seed, "time"))
    return samples


def measure_memory_here(method: str, causal: bool, length: int, seed: int) -> dict:
    """Peak extra resident memory of fwd, then fwd+bwd, in this (fresh) process."""
    warm = make_inputs(MEMORY_WARMUP_LENGTH, seed=seed, requires_grad=True)
    warm_grad = make_grad_out(Config(method, causal, "fwd+bwd", MEMORY_WARMUP_LENGTH), seed)
    for pass_name in PASSES:
        time_call(method, warm, causal, pass_name, warm_grad)
    del warm, warm_grad
    x = make_inputs(length, seed=seed, requires_grad=True)
    grad_out = make_grad_out(Config(method, causal, "fwd+bwd", length), seed)
    baseline, floor = memory_baseline()
    time_call(method, x, causal, "fwd", None)
    fwd = peak_rss_bytes() - baseline
    time_call(method, x, causal, "fwd+bwd", grad_out)
    fwd_bwd = peak_rss_bytes() - baseline
    return {"baseline_bytes": baseline, "floor_bytes": floor, "fwd_extra_bytes": fwd, "fwd+bwd_extra_bytes": fwd_bwd}


def measure_memory(method: str, causal: bool, length: int, args: argparse.Namespace) -> dict:
    """`measure_memory_here` in a fresh process (this script's hidden `--measure-memory`)."""
    result = measure_in_fresh_process(
        __file__, ["--measure-memory", method, causal_label(causal), str(length), "--threads", str(args.threads),
                   "--seed", str(args.seed)], f"{method} {causal_label(causal)} L={length}")
    return {"method": method, "causal": causal, "length": length, "qkv_bytes": qkv_bytes(length), **result}


def run_memory(args: argparse.Namespace) -> list[dict]:
    lengths = args.lengths[-1:] if args.quick else args.lengths
    return [measure_memory(m, causal, length, args) for length in lengths for causal in CAUSAL_ORDER
            for m in ALL_METHODS if skip_reason(m, length, args) is None]


def qkv_bytes(length: int) -> int:
    return 3 * BATCH * HEADS * length * DIM * torch.finfo(DTYPE).bits // 8


def median_s(samples: dict[Config, list[Sample]], config: Config) -> float | None:
    return median_of(samples.get(config))


def fmt_ms(seconds: float | None, missing: str = "–") -> str:
    return missing if seconds is None else f"{seconds * 1e3:,.1f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    return "–" if num is None or den is None else f"{num / den:.2f}x"


def memory_cell(memory: dict, method: str, causal: bool, length: int, pass_name: str,
                args: argparse.Namespace) -> str:
    reason = skip_reason(method, length, args)
    if reason is not None:
        return reason
    record = memory.get((method, causal, length))
    if record is None:
        return "–"
    if "error" in record:
        return "failed"
    extra = record[f"{pass_name}_extra_bytes"]
    return f"{extra / MIB:,.1f} ({extra / record['qkv_bytes']:.2f}x)"


def print_tables(samples: dict[Config, list[Sample]], memory_records: list[dict], args: argparse.Namespace) -> None:
    memory = {(r["method"], r["causal"], r["length"]): r for r in memory_records}
    for pass_name in PASSES:
        print(f"## {pass_name}: median wall time of {args.repeats} call(s)")
        print()
        print("| L | causal | linear ms | naive ms | sdpa ms | sdpa/linear | naive/linear "
              "| linear peak MiB (x q+k+v) | sdpa peak MiB | naive peak MiB |")
        print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for length in args.lengths:
            for causal in CAUSAL_ORDER:
                t = {m: median_s(samples, Config(m, causal, pass_name, length)) for m in METHODS}
                cells = [str(length), causal_label(causal)]
                cells += [fmt_ms(t[m], skip_reason(m, length, args) or "–") for m in METHODS]
                cells += [fmt_ratio(t["sdpa"], t["linear"]), fmt_ratio(t["naive"], t["linear"])]
                cells += [memory_cell(memory, m, causal, length, pass_name, args) for m in ("linear", "sdpa", "naive")]
                print("| " + " | ".join(cells) + " |")
        print()
    variants = [m for m in VARIANTS if m in args.methods]
    if variants:
        print_variant_tables(samples, memory, variants, args)
    notes = ["Peak MiB: extra resident memory over the inputs at the high-water mark, measured in a fresh "
             "process per (method, causal, L); (Nx) is that extra in multiples of the bytes of q+k+v "
             f"({qkv_bytes(args.lengths[-1]) / MIB:,.0f} MiB at L={args.lengths[-1]})."]
    if args.no_memory:
        notes.append("Memory was not measured (--no-memory).")
    elif args.quick:
        notes.append(f"With --quick, memory is measured at L={args.lengths[-1]} only.")
    if args.lengths[-1] > args.max_naive_length:
        big = args.lengths[-1]
        notes.append(f"naive is skipped above L={args.max_naive_length} (--max-naive-length): each fp32 score "
                     f"tensor is B*H*L*L*4 bytes ({BATCH * HEADS * big * big * 4 / 2**30:,.0f} GiB at L={big}) "
                     "and autograd keeps several.")
    if args.lengths[-1] > args.max_sdpa_length:
        notes.append(f"sdpa is skipped above L={args.max_sdpa_length} (--max-sdpa-length): its fwd+bwd at "
                     "32768 takes minutes per call on this CPU.")
    for note in notes:
        print(f"- {note}")
    print()


def print_variant_tables(samples: dict[Config, list[Sample]], memory: dict, variants: list[str],
                         args: argparse.Namespace) -> None:
    """Each attention_type variant's fast path beside kernelized_rpe (`linear`): time, ratio, peak memory."""
    for pass_name in PASSES:
        print(f"## Variants, {pass_name}: median wall time in ms (ratio to linear kernelized_rpe)")
        print()
        print("| L | causal | linear ms | " + " | ".join(f"{m} ms" for m in variants) + " | "
              + " | ".join(f"{m} peak MiB" for m in variants) + " |")
        print("|---:|:---|---:|" + "---:|" * (2 * len(variants)))
        for length in args.lengths:
            for causal in CAUSAL_ORDER:
                base = median_s(samples, Config("linear", causal, pass_name, length))
                cells = [str(length), causal_label(causal), fmt_ms(base, skip_reason("linear", length, args) or "–")]
                for m in variants:
                    t = median_s(samples, Config(m, causal, pass_name, length))
                    cell = fmt_ms(t, skip_reason(m, length, args) or "–")
                    if t is not None and base is not None:
                        cell += f" ({t / base:.2f}x)"
                    cells.append(cell)
                cells += [memory_cell(memory, m, causal, length, pass_name, args) for m in variants]
                print("| " + " | ".join(cells) + " |")
        print()


def compute_slopes(samples: dict[Config, list[Sample]], lengths: list[int]) -> list[dict]:
    """Per method, pass and direction that was timed: the fit over SLOPE_RANGE and the pairwise slopes."""
    rows = []
    for pass_name in PASSES:
        for causal in CAUSAL_ORDER:
            for method in ALL_METHODS:
                points = [(n, t) for n in lengths
                          if (t := median_s(samples, Config(method, causal, pass_name, n))) is not None]
                if points:
                    rows.append({"method": method, "pass": pass_name, "causal": causal,
                                 **slope_fit(points, SLOPE_RANGE, fit_all_if_few=False)})
    return rows


def print_slope_table(rows: list[dict], lengths: list[int]) -> None:
    print_slopes(rows, lengths, SLOPE_RANGE, ("method", "pass", "causal"),
                 lambda r: [r["method"], r["pass"], causal_label(r["causal"])])


def evaluate_targets(
    samples: dict[Config, list[Sample]], slopes: list[dict], memory_records: list[dict]
) -> list[Target]:
    lo, hi = SLOPE_RANGE
    targets = []
    for r in slopes:
        if r["method"] != "linear":
            continue
        name = f"(a) linear {r['pass']} {causal_label(r['causal'])}: slope {lo}-{hi} <= {LINEAR_SLOPE_MAX}"
        if r["slope"] is None:
            targets.append(Target(name, "N/A", f"fewer than 2 lengths in {lo}-{hi}"))
        else:
            partial = "" if r["range"] == [lo, hi] else f" (only {r['range'][0]}-{r['range'][1]} measured)"
            status = "PASS" if r["slope"] <= LINEAR_SLOPE_MAX else "FAIL"
            targets.append(Target(name, status, f"slope {r['slope']:.2f}{partial}"))
    for causal in (True, False):
        need = SPEEDUP_MIN[causal]
        name = f"(b) L={SPEEDUP_LENGTH} fwd+bwd {causal_label(causal)}: sdpa / linear >= {need:g}x"
        linear = median_s(samples, Config("linear", causal, "fwd+bwd", SPEEDUP_LENGTH))
        sdpa = median_s(samples, Config("sdpa", causal, "fwd+bwd", SPEEDUP_LENGTH))
        if linear is None or sdpa is None:
            targets.append(Target(name, "N/A", f"not measured at L={SPEEDUP_LENGTH}"))
        else:
            status = "PASS" if sdpa / linear >= need else "FAIL"
            figure = f"{sdpa / linear:.2f}x (sdpa {fmt_ms(sdpa)} ms, linear {fmt_ms(linear)} ms)"
            targets.append(Target(name, status, figure))
    memory = {(r["method"], r["causal"], r["length"]): r for r in memory_records}
    for causal in (True, False):
        name = (f"(c) L={MEMORY_LENGTH} fwd+bwd {causal_label(causal)}: linear peak extra memory "
                f"< {MEMORY_RATIO_MAX:g}x q+k+v")
        record = memory.get(("linear", causal, MEMORY_LENGTH))
        if record is None or "error" in record:
            reason = record["error"] if record else f"not measured at L={MEMORY_LENGTH}"
            targets.append(Target(name, "N/A", reason))
        else:
            extra = record["fwd+bwd_extra_bytes"]
            ratio = extra / record["qkv_bytes"]
            status = "PASS" if ratio < MEMORY_RATIO_MAX else "FAIL"
            targets.append(Target(name, status, f"{ratio:.2f}x ({extra / MIB:,.0f} MiB over "
                                                f"{record['qkv_bytes'] / MIB:,.0f} MiB)"))
    return targets


def run_auto_check(args: argparse.Namespace) -> dict:
    """mode='auto' against the better of naive and linear, fwd+bwd, both directions."""
    top = args.lengths[-1]
    lengths = [n for n in AUTO_LENGTHS if n <= top]
    rows, samples_out = [], []
    for length in lengths:
        repeats = max(args.repeats, AUTO_SHORT_REPEATS) if length <= AUTO_SHORT_LENGTH else args.repeats
        picked = {
            causal: choose_mode(length, length, DIM, DIM, HORIZON, causal=causal, batch_heads=BATCH * HEADS)
            for causal in CAUSAL_ORDER
        }
        naive_ok = skip_reason("naive", length, args) is None
        configs = []
        for causal in CAUSAL_ORDER:
            # auto would build the L x L scores it was asked to avoid: do not run it, report it
            runnable = ("auto", "linear") if naive_ok or picked[causal] == "linear" else ("linear",)
            configs += [Config(m, causal, "fwd+bwd", length) for m in runnable + (("naive",) if naive_ok else ())]
        samples = round_robin(configs, repeats, args.seed, "auto-check")
        for c, runs in samples.items():
            samples_out.append(config_record(c, runs))
        for causal in CAUSAL_ORDER:
            t = {m: median_s(samples, Config(m, causal, "fwd+bwd", length)) for m in ("auto", "naive", "linear")}
            best = min(v for m, v in t.items() if m != "auto" and v is not None)
            ratio = None if t["auto"] is None else t["auto"] / best
            rows.append({"length": length, "causal": causal, "picked": picked[causal], "repeats": repeats,
                         "auto_s": t["auto"], "naive_s": t["naive"], "linear_s": t["linear"], "ratio": ratio,
                         "passed": ratio is not None and ratio <= AUTO_RATIO_MAX})
    return {"lengths": lengths, "rows": rows, "samples": samples_out, "passed": all(r["passed"] for r in rows)}


def print_auto_check(result: dict, args: argparse.Namespace) -> None:
    print("## Auto-check: mode='auto' against min(naive, linear), fwd+bwd, median wall time")
    print()
    print("| L | causal | choose_mode | repeats | auto ms | naive ms | linear ms | auto / min | status |")
    print("|---:|:---|:---|---:|---:|---:|---:|---:|:---|")
    for r in result["rows"]:
        naive = fmt_ms(r["naive_s"], skip_reason("naive", r["length"], args) or "–")
        auto = fmt_ms(r["auto_s"], "not run (picks naive)")
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"| {r['length']} | {causal_label(r['causal'])} | {r['picked']} | {r['repeats']} | {auto} | {naive} "
              f"| {fmt_ms(r['linear_s'])} | {ratio} | {'PASS' if r['passed'] else 'FAIL'} |")
    print()
    ratios = [r["ratio"] for r in result["rows"] if r["ratio"] is not None]
    worst = f"max ratio {max(ratios):.2f}" if ratios else "no ratio"
    print(f"- {'PASS' if result['passed'] else 'FAIL'} auto / min(naive, linear) <= {AUTO_RATIO_MAX} "
          f"at every length ({worst})")
    print()


def config_record(c: Config, runs: list[Sample]) -> dict:
    return {"method": c.method, "causal": c.causal, "pass": c.pass_name, "length": c.length, **sample_record(runs)}


def write_plot(path: Path, samples: dict[Config, list[Sample]], lengths: list[int]) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, causal in zip(axes, CAUSAL_ORDER):
        curves = {}
        for method in ALL_METHODS:
            points = [(n, t) for n in lengths if (t := median_s(samples, Config(method, causal, "fwd+bwd", n)))]
            if points:
                curves[method] = points
                ax.plot(*zip(*points), marker="o", label=method)
        for slope, anchor in ((1, "linear"), (2, "sdpa" if "sdpa" in curves else "naive")):
            if anchor in curves:
                n0, t0 = curves[anchor][0]
                ax.plot(lengths, [t0 * (n / n0) ** slope for n in lengths], linestyle="--", linewidth=1,
                        color="black" if slope == 1 else "grey", label=f"slope {slope} (from {anchor})")
        log2_axis(ax, lengths)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_title(f"fwd+bwd, {'causal' if causal else 'bidirectional'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("median wall time (s)")
    save_figure(fig, path, f"B={BATCH}, H={HEADS}, D={DIM}, fp32, h={HORIZON}, {torch.get_num_threads()} threads")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure_memory is not None:
        method, causal, length = args.measure_memory
        print(json.dumps(measure_memory_here(method, causal == "causal", int(length), args.seed)))
        return 0

    info = machine_info(torch.get_num_threads())
    print("# Kernelized RPE attention benchmark")
    print()
    print_machine(info)
    print(f"- B={BATCH}, H={HEADS}, D={DIM}, fp32, horizon h={HORIZON} (rel {HEADS}x{2 * HORIZON + 1}x{DIM}); "
          f"lengths {', '.join(map(str, args.lengths))}; {args.repeats} repeat(s), interleaved, median")
    print()

    verification = verify(args.seed, args.methods)
    print_verification(verification)
    if not verification["passed"]:
        print("Summary: verification FAIL, nothing timed")
        return 1

    samples = run_benchmark(args)
    memory = [] if args.no_memory else run_memory(args)
    print_tables(samples, memory, args)
    slopes = compute_slopes(samples, args.lengths)
    print_slope_table(slopes, args.lengths)
    targets = evaluate_targets(samples, slopes, memory)
    print_targets(targets)
    auto = run_auto_check(args) if args.auto_check else None
    if auto is not None:
        print_auto_check(auto, args)

    info["load_average_at_end"] = os.getloadavg()
    if args.json is not None:
        write_json(args.json, {
            "machine": info,
            "settings": {"batch": BATCH, "heads": HEADS, "dim": DIM, "dtype": str(DTYPE), "horizon": HORIZON,
                         "lengths": args.lengths, "repeats": args.repeats, "seed": args.seed,
                         "max_naive_length": args.max_naive_length, "max_sdpa_length": args.max_sdpa_length},
            "verification": verification,
            "timings": [config_record(c, runs) for c, runs in samples.items()],
            "skipped": [{"method": m, "length": n, "reason": skip_reason(m, n, args)}
                        for n in args.lengths for m in ALL_METHODS if skip_reason(m, n, args)],
            "memory": memory,
            "slopes": slopes,
            "targets": [t._asdict() for t in targets],
            "auto_check": auto,
        })
        print(f"- raw figures written to {args.json}")
    if args.plot is not None:
        write_plot(args.plot, samples, args.lengths)

    auto_summary = "skipped" if auto is None else ("PASS" if auto["passed"] else "FAIL")
    print(f"Summary: verification PASS; {count_targets(targets)}; auto-check {auto_summary}; {load_summary(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
