"""The default attention on a GPU against FlashAttention and flash-linear-attention, forward plus backward.

What is measured, at B=4, H=16, D=64, horizon 16, bf16 by default, each causal and bidirectional:

* `scaleformer`: `local_softmax_decay_attention(..., mode="linear")`, the op of the default configuration (on
  CUDA it runs in the Triton kernels of `ops_local_softmax_triton`);
* `sdpa`: `torch.nn.functional.scaled_dot_product_attention` restricted to the flash backend on CUDA (the
  math backend on CPU), the softmax attention a user would otherwise pick;
* `fla`: flash-linear-attention's `chunk_linear_attn` (causal; no relative term, no normaliser), the speed
  ceiling of linear attention, when `fla` imports; its causal time is compared with both directions.

First the op, as it will be timed, is checked against the float64 quadratic reference at 1,024 tokens (output and
every gradient, both directions); a setting that fails is not timed and the script exits with status 1. Every call
is timed after a warm-up, the device synchronised before and after, as the median of `--repeats`; the peak memory is
`torch.cuda.max_memory_allocated` over the call, minus what the inputs hold. The report ends with log-log slopes
of time against L and the targets: at 16k, at least 4x faster than SDPA and within 1.5x of fla; slope 4k-64k at
most 1.1. With `--device cpu` (`--quick`) the same code runs on small shapes, as a smoke test; it says nothing
about GPUs.

    python benchmarks/bench_attention_gpu.py --json benchmarks/results/bench_attention_gpu.json
    python benchmarks/bench_attention_gpu.py --kernel-block 32 --lengths 16384   # the kernels' blocks of 32
    python benchmarks/bench_attention_gpu.py --parallel-walks --lengths 16384  # the walks' parallel passes
    python benchmarks/bench_attention_gpu.py --key-tile 128 --key-block 64 --lengths 16384  # windows in one tile
    python benchmarks/bench_attention_gpu.py --variants wide_tiles parallel_walks keep_states  # beside the kernels
    python benchmarks/bench_attention_gpu.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import (
    cuda_peak_extra_mib, machine_info, parse_device, print_machine, profile_call, slope_fit, synchronize, write_json,
)
from modeling_scaleformer.ops_local_softmax import local_softmax_decay_attention
from modeling_scaleformer.ops_naive import naive_local_softmax_decay_attention


METHODS = ("scaleformer", "sdpa", "fla")
DEFAULT_LENGTHS = (4096, 8192, 16384, 32768, 65536)
QUICK_LENGTHS = (256, 512)
SLOPE_RANGE = (4096, 65536)
SLOPE_MAX = 1.1
TARGET_LENGTH = 16384
SDPA_SPEEDUP_MIN = 4.0
FLA_RATIO_MAX = 1.5
# the check's length (at most the longest timed): 16 blocks of 64, so that the kernels it compiles (Triton
# specialises integer arguments divisible by 16) are those the timed lengths use
CHECK_LENGTH = 1024
CHECK_TOLERANCE = 3e-2  # of the reference's largest magnitude: 16-bit operands
# other settings of the default attention's Triton kernels (options of `ops_local_softmax_triton`), each timed beside
# the kernels as they are with --variants, in the same process, against the same baselines
VARIANTS = {
    "wide_tiles": {"KEY_TILE": 128, "KEY_BLOCK": 64},  # a query block's window in one tile, 64 keys per backward
    "parallel_walks": {"PARALLEL_WALKS": True},
    "keep_states": {"KEEP_STATES": True},  # forward's states kept for backward instead of recomputed
    "walk_tiles16": {"WALK_TILE": 16},  # the walks in (16, 16) tiles of the states: 16 programs per row at D = 64
    "walk_tiles32": {"WALK_TILE": 32},
    "block32": {"BLOCK": 32},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", metavar="L")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: lengths {QUICK_LENGTHS} unless --lengths, 1 repeat, B=1, H=2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-sdpa-length", type=int, default=65536, metavar="L")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every raw figure to PATH")
    parser.add_argument("--profile", type=int, metavar="L",
                        help="also profile one scaleformer forward + backward per direction at length L and print "
                             "where its device time goes, by kernel")
    parser.add_argument("--kernel-block", type=int, metavar="N",
                        help="queries per block and keys per chunk of the default attention's Triton kernels "
                             "(ops_local_softmax_triton.BLOCK, a power of two >= 16; default: theirs)")
    parser.add_argument("--parallel-walks", action="store_true",
                        help="the states and their gradient by the parallel passes (`_chunk_sums`, `_query_sums`, "
                             "`_scan_sums`) instead of the sequential walks of `_states` and `_states_backward` "
                             "(ops_local_softmax_triton.PARALLEL_WALKS = True)")
    parser.add_argument("--key-tile", type=int, metavar="N",
                        help="keys per tile of a query block's window in the forward and backward kernels by queries "
                             "(ops_local_softmax_triton.KEY_TILE, a power of two >= 16; default: theirs)")
    parser.add_argument("--key-block", type=int, metavar="N",
                        help="keys per program of the backward kernel by keys (ops_local_softmax_triton.KEY_BLOCK, a "
                             "power of two >= 16; default: theirs)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=[],
                        help="also time the kernels with these settings, each beside the kernels as set by the "
                             "options above: " + "; ".join(f"{name} {options}" for name, options in VARIANTS.items()))
    parser.add_argument("--check-only", action="store_true",
                        help="check the kernels against the reference (which compiles them) and time nothing")
    args = parser.parse_args(argv)
    for name in ("kernel_block", "key_tile", "key_block"):
        value = getattr(args, name)
        if value is not None and (value < 16 or value & (value - 1)):
            parser.error(f"--{name.replace('_', '-')} must be a power of two >= 16, got {value}")
    args.device = parse_device(parser, args.device)
    if args.quick:
        args.lengths, args.repeats, args.batch, args.heads = args.lengths or list(QUICK_LENGTHS), 1, 1, 2
    args.lengths = sorted(set(args.lengths or DEFAULT_LENGTHS))
    if args.repeats < 1 or min(args.lengths) < 1:
        parser.error("--repeats and --lengths must be positive")
    args.dtype = getattr(torch, args.dtype)
    return args


def fla_linear_attention():
    """flash-linear-attention's chunk linear attention, or None when it does not import (no GPU driver, not
    installed)."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception:  # fla raises more than ImportError without a driver
        return None
    return chunk_linear_attn


def sdpa_backend(device: torch.device):
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def command_options(args: argparse.Namespace) -> dict:
    """The options of `ops_local_softmax_triton` that the command line sets for the whole run."""
    options = {name: value for name, value in (("BLOCK", args.kernel_block), ("KEY_TILE", args.key_tile),
                                               ("KEY_BLOCK", args.key_block)) if value is not None}
    return {**options, "PARALLEL_WALKS": True} if args.parallel_walks else options


def method_options(method: str) -> dict:
    """The options of `ops_local_softmax_triton` that `method` ("scaleformer:VARIANT") names (`VARIANTS`), none for
    the other methods."""
    return VARIANTS[method.split(":")[1]] if method.startswith("scaleformer:") else {}


@contextlib.contextmanager
def kernel_options(options: dict):
    """Within the block, the module options of `ops_local_softmax_triton` set to `options` (nothing is imported
    without them)."""
    if not options:
        yield
        return
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    saved = {name: getattr(kernels, name) for name in options}
    for name, value in options.items():
        setattr(kernels, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(kernels, name, value)


def make_call(method: str, causal: bool, length: int, args: argparse.Namespace, fla):
    """A function that runs forward and backward once, and the tensors it holds."""
    g = torch.Generator(device=args.device).manual_seed(length)
    shape = (args.batch, args.heads, length, args.dim)
    q, k, v = (torch.randn(shape, generator=g, device=args.device).to(args.dtype).requires_grad_() for _ in range(3))
    rel = (0.1 * torch.randn(args.heads, 2 * args.horizon + 1, args.dim, generator=g, device=args.device))
    rel = rel.to(args.dtype).requires_grad_()
    decay = torch.linspace(0.25, 1 / 256, args.heads, device=args.device).to(args.dtype).requires_grad_()
    grad = torch.randn(shape, generator=g, device=args.device).to(args.dtype)

    def call():
        if method.startswith("scaleformer"):
            out = local_softmax_decay_attention(q, k, v, rel, decay, causal=causal, mode="linear")
        elif method == "sdpa":
            with sdpa_backend(args.device):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:  # fla's layout is (B, T, H, D); causal only
            out, _ = fla(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), normalize=False)
            out = out.transpose(1, 2)
        out.backward(grad)
        for x in (q, k, v, rel, decay):
            x.grad = None

    return call


def check(args: argparse.Namespace) -> dict:
    """The op as timed (the kernels on CUDA, with the kernel options asked for) against the float64 quadratic
    reference on the same inputs, at batch 1 and `CHECK_LENGTH` tokens, each direction: the largest error of the
    output and of the gradients of q, k, v, the table and the decay rates, each over the reference's largest
    magnitude. Timings of a path that computes something else would mean nothing: main stops when one passes
    `CHECK_TOLERANCE`."""
    length = min(CHECK_LENGTH, max(args.lengths))
    errors = {}
    for causal in (True, False):
        g = torch.Generator(device=args.device).manual_seed(0)
        shape = (1, args.heads, length, args.dim)
        q, k, v = (torch.randn(shape, generator=g, device=args.device).to(args.dtype) for _ in range(3))
        rel = (0.1 * torch.randn(args.heads, 2 * args.horizon + 1, args.dim, generator=g, device=args.device))
        decay = torch.linspace(0.25, 1 / 256, args.heads, device=args.device)
        leaves = [x.to(args.dtype).requires_grad_() for x in (q, k, v, rel, decay)]
        upstream = torch.randn(shape, generator=g, device=args.device, dtype=torch.float64)
        out = local_softmax_decay_attention(*leaves, causal=causal, mode="linear")
        got = [out, *torch.autograd.grad(out, leaves, upstream.to(out.dtype))]
        wide = [x.detach().double().requires_grad_() for x in leaves]
        reference = naive_local_softmax_decay_attention(*wide, causal=causal)
        expected = [reference, *torch.autograd.grad(reference, wide, upstream)]
        errors["causal" if causal else "bidir"] = {
            name: float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-30))
            for name, a, b in zip(("out", "q", "k", "v", "rel", "decay"), got, expected)}
    return {"length": length, "tolerance": CHECK_TOLERANCE, "errors": errors,
            "ok": all(e <= CHECK_TOLERANCE for row in errors.values() for e in row.values())}


def measure(call, args: argparse.Namespace) -> dict:
    """Median seconds of `repeats` calls after one warm-up, and the peak memory of one call over what was held
    before it."""
    call()
    synchronize(args.device)
    times = []
    for _ in range(args.repeats):
        synchronize(args.device)
        start = time.perf_counter()
        call()
        synchronize(args.device)
        times.append(time.perf_counter() - start)
    peak = cuda_peak_extra_mib(call, args.device) if args.device.type == "cuda" else None
    return {"median_s": statistics.median(times), "times_s": times, "peak_extra_mib": peak}


def skip_reason(method: str, causal: bool, length: int, args: argparse.Namespace, fla) -> str | None:
    if method == "fla" and fla is None:
        return "fla does not import here"
    if method == "fla" and not causal:
        return "causal only (its causal time is the ceiling of both)"
    if method == "sdpa" and length > args.max_sdpa_length:
        return "above --max-sdpa-length"
    return None


def run(args: argparse.Namespace, failed: set[str]) -> list[dict]:
    """Every method's timings (the variants that `failed` their check skipped)."""
    fla = fla_linear_attention()
    rows = []
    methods = [METHODS[0], *(f"scaleformer:{name}" for name in args.variants), *METHODS[1:]]
    for method in methods:  # method by method, so that a slow baseline's first call (autotuning) comes last
        for length in args.lengths:
            for causal in (True, False):
                reason = "failed its check" if method in failed else skip_reason(method, causal, length, args, fla)
                row = {"method": method, "causal": causal, "length": length, "skipped": reason}
                if reason is None:
                    try:
                        with kernel_options(method_options(method)):
                            row.update(measure(make_call(method, causal, length, args, fla), args))
                    except torch.OutOfMemoryError:
                        row["skipped"] = "out of memory"
                        torch.cuda.empty_cache()
                rows.append(row)
                print(f"[L={length} {'causal' if causal else 'bidir'} {method}] "
                      f"{row.get('median_s', row['skipped'])}", file=sys.stderr, flush=True)
    return rows


def seconds(rows: list[dict], method: str, causal: bool, length: int) -> float | None:
    for r in rows:
        if (r["method"], r["causal"], r["length"]) == (method, causal, length) and r.get("median_s") is not None:
            return r["median_s"]
    return None


def report(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """Print the tables and the targets; return the targets."""
    print("| L | direction | scaleformer ms | sdpa ms | fla (causal) ms | sdpa / scaleformer | scaleformer / fla |"
          " scaleformer peak MiB | sdpa peak MiB |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        for causal in (True, False):
            s, a = (seconds(rows, m, causal, length) for m in ("scaleformer", "sdpa"))
            f = seconds(rows, "fla", True, length)
            peaks = {r["method"]: r.get("peak_extra_mib") for r in rows
                     if r["length"] == length and r["causal"] == causal}
            cells = [f"{1000 * x:.2f}" if x is not None else "–" for x in (s, a, f)]
            ratio = [f"{x / y:.2f}x" if x is not None and y is not None else "–" for x, y in ((a, s), (s, f))]
            mem = [f"{peaks[m]:.0f}" if peaks.get(m) is not None else "–" for m in ("scaleformer", "sdpa")]
            print(f"| {length} | {'causal' if causal else 'bidir'} | " + " | ".join(cells + ratio + mem) + " |")
    print()
    targets = []
    for causal in (True, False):
        direction = "causal" if causal else "bidir"
        s, a = seconds(rows, "scaleformer", causal, TARGET_LENGTH), seconds(rows, "sdpa", causal, TARGET_LENGTH)
        f = seconds(rows, "fla", True, TARGET_LENGTH)
        targets.append(target(f"{direction} at {TARGET_LENGTH}: sdpa / scaleformer >= {SDPA_SPEEDUP_MIN}",
                              None if s is None or a is None else a / s, lambda x: x >= SDPA_SPEEDUP_MIN))
        targets.append(target(f"{direction} at {TARGET_LENGTH}: scaleformer / fla <= {FLA_RATIO_MAX}",
                              None if s is None or f is None else s / f, lambda x: x <= FLA_RATIO_MAX))
        points = [(n, seconds(rows, "scaleformer", causal, n)) for n in args.lengths]
        points = [(n, t) for n, t in points if t is not None]
        fit = slope_fit(points, SLOPE_RANGE, fit_all_if_few=False)["slope"]
        targets.append(target(f"{direction}: scaleformer time slope {SLOPE_RANGE[0]}-{SLOPE_RANGE[1]} <= {SLOPE_MAX}",
                              fit, lambda x: x <= SLOPE_MAX))
    for t in targets:
        print(f"- {t['status']} {t['name']}: {'–' if t['value'] is None else format(t['value'], '.2f')}")
    if args.variants:
        names = [f"scaleformer:{name}" for name in args.variants]
        print()
        print("| L | direction | scaleformer ms | " + " | ".join(f"{name.split(':')[1]} ms" for name in names) + " | "
              + " | ".join(f"{name.split(':')[1]} / scaleformer" for name in names) + " |")
        print("|---:|:---|" + "---:|" * (1 + 2 * len(names)))
        for length in args.lengths:
            for causal in (True, False):
                base = seconds(rows, "scaleformer", causal, length)
                times = [seconds(rows, name, causal, length) for name in names]
                cells = [f"{1000 * x:.2f}" if x is not None else "–" for x in (base, *times)]
                cells += [f"{x / base:.2f}x" if x is not None and base is not None else "–" for x in times]
                print(f"| {length} | {'causal' if causal else 'bidir'} | " + " | ".join(cells) + " |")
    return targets


def profile(length: int, args: argparse.Namespace, top: int = 15) -> dict:
    """Where one scaleformer forward + backward spends its time at `length`, per direction: the `top` kernels (CPU
    ops on CPU) by total self time, as printed by torch.profiler (`common.profile_call`)."""
    tables = {}
    for causal in (True, False):
        call = make_call("scaleformer", causal, length, args, None)
        tables["causal" if causal else "bidir"] = profile_call(call, args.device, top)[0]
    for direction, table in tables.items():
        print(f"## Profile: scaleformer {direction}, L={length}, forward + backward\n")
        print(table)
    return tables


def target(name: str, value: float | None, ok) -> dict:
    return {"name": name, "value": value, "status": "N/A" if value is None else ("PASS" if ok(value) else "FAIL")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with kernel_options(command_options(args)):
        return benchmark(args)


def benchmark(args: argparse.Namespace) -> int:
    """The check, then the profile, the timings and the report; 1 when a check fails."""
    info = machine_info(torch.get_num_threads())
    device_name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    print("# Attention on a GPU: scaleformer (default attention) against SDPA flash and fla, forward + backward")
    print()
    print_machine(info)
    block = (f"; kernel blocks of {args.kernel_block}" if args.kernel_block else "") + (
        f"; key tiles of {args.key_tile}" if args.key_tile else "") + (
        f"; {args.key_block} keys per backward program" if args.key_block else "") + (
        "; parallel walks" if args.parallel_walks else "")
    print(f"- device: {device_name}; B={args.batch}, H={args.heads}, D={args.dim}, horizon {args.horizon}, "
          f"{str(args.dtype).removeprefix('torch.')}; median of {args.repeats} after a warm-up{block}")
    print()
    checked = {}
    for method in [METHODS[0], *(f"scaleformer:{name}" for name in args.variants)]:
        with kernel_options(method_options(method)):
            checked[method] = check(args)
    print(f"Check against the float64 reference at L={checked[METHODS[0]]['length']}, batch 1 (largest error over "
          f"the reference's largest value; at most {CHECK_TOLERANCE}):")
    print()
    print("| method | direction | out | dq | dk | dv | d table | d decay |")
    print("|:---|:---|---:|---:|---:|---:|---:|---:|")
    for method, result in checked.items():
        for direction, errors in result["errors"].items():
            print(f"| {method} | {direction} | " + " | ".join(f"{e:.1e}" for e in errors.values()) + " |")
    print()
    failed = {method for method, result in checked.items() if not result["ok"]}
    profiles, rows, targets = None, [], []
    if METHODS[0] in failed:
        print("check FAILED: not timed", flush=True)
    elif not args.check_only:
        if failed:
            print(f"check FAILED for {', '.join(sorted(failed))}: not timed", flush=True)
        profiles = profile(args.profile, args) if args.profile else None
        rows = run(args, failed)
        targets = report(rows, args)
    if args.json:
        write_json(args.json, {"benchmark": "bench_attention_gpu", "machine": {**info, "device": device_name},
                               "settings": {k: str(v) for k, v in vars(args).items() if k != "json"},
                               "check": checked, "timings": rows, "targets": targets, "profiles": profiles})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
