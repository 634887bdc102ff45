"""Launch settings of the default attention's Triton kernels, timed one kernel at a time on a GPU.

`ops_local_softmax_triton.LAUNCH` gives each kernel its warps and pipeline stages. For each kernel of `--kernels`
and each setting of `--warps` x `--stages` other than its own, this script times the op (forward + backward, both
directions, B=4, H=16, D=64, horizon 16, bf16 by default, at `--length`) with that kernel so launched and the others
as they are, against the op as it is timed at the start, the middle and the end of the run (the baseline's median
of those three, so that drift shows). Each setting is first checked against the float64 reference
(`bench_attention_gpu.check`, 1,024 tokens), which also compiles its kernels: the checks run in `--workers` processes
at once (compiling is the host's work), the timings after them in this process. A setting that fails its check is
not timed. The table gives each setting's time over the baseline's (below 1: faster), and the end the best setting
of each kernel as a `LAUNCH` entry.

    python benchmarks/tune_kernels.py --json benchmarks/results/tune_kernels.json
    python benchmarks/tune_kernels.py --kernels _backward_keys --warps 2 4 8 16 --stages 1 2 3 4
    python benchmarks/tune_kernels.py --device cpu --quick   # the code path on small shapes; it says nothing about GPUs
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import statistics
import sys
from pathlib import Path

import torch

from bench_attention_gpu import CHECK_TOLERANCE, check, kernel_options, make_call, measure
from common import machine_info, parse_device, print_machine, write_json


DEFAULT_KERNELS = ("_states", "_forward", "_states_backward", "_backward_queries", "_backward_keys")
QUICK_LENGTH = 256
TRITON_DEFAULT_STAGES = 3  # a launch without num_stages gets Triton's default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--length", type=int, default=16384, metavar="L")
    parser.add_argument("--kernels", nargs="+", default=list(DEFAULT_KERNELS), metavar="NAME",
                        help="kernels of ops_local_softmax_triton.LAUNCH to tune (default: those of the default "
                             "path: " + " ".join(DEFAULT_KERNELS) + ")")
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8], metavar="N")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], metavar="N")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per setting and direction (median)")
    parser.add_argument("--workers", type=int, default=8,
                        help="processes that check (and so compile) the settings at once (default: 8)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: L={QUICK_LENGTH}, batch 1, 2 heads, one repeat, at most 2 workers")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every raw figure to PATH")
    args = parser.parse_args(argv)
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    unknown = sorted(set(args.kernels) - set(LAUNCH))
    if unknown:
        parser.error(f"--kernels takes names of ops_local_softmax_triton.LAUNCH ({', '.join(LAUNCH)}), got "
                     f"{', '.join(unknown)}")
    if min(args.warps) < 1 or any(w & (w - 1) for w in args.warps):
        parser.error(f"--warps must be powers of two, got {args.warps}")
    if min(args.stages) < 1 or args.repeats < 1 or args.workers < 1 or args.length < 1:
        parser.error("--stages, --repeats, --workers and --length must be positive")
    args.device = parse_device(parser, args.device)
    if args.quick:
        args.length, args.batch, args.heads, args.repeats = QUICK_LENGTH, 1, 2, 1
        args.workers = min(args.workers, 2)
    args.lengths = [args.length]  # what bench_attention_gpu's check reads
    args.dtype = getattr(torch, args.dtype)
    return args


def settings(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(kernel, launch options) for every kernel of --kernels and every warps x stages but its own."""
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    found = []
    for kernel in args.kernels:
        current = {"num_stages": TRITON_DEFAULT_STAGES, **LAUNCH[kernel]}
        for warps in args.warps:
            for stages in args.stages:
                options = dict(num_warps=warps, num_stages=stages)
                if options != current:
                    found.append((kernel, options))
    return found


def launch_options(kernel: str | None, options: dict | None) -> dict:
    """`kernel_options` that launch `kernel` with `options` (none: the kernels as they are)."""
    if kernel is None:
        return {}
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    return {"LAUNCH": {**LAUNCH, kernel: options}}


def check_setting(args: argparse.Namespace, kernel: str | None, options: dict | None) -> dict:
    """`bench_attention_gpu.check` of the op with `kernel` launched with `options`."""
    with kernel_options(launch_options(kernel, options)):
        return check(args)


def check_all(args: argparse.Namespace, found: list[tuple[str, dict]]) -> list[dict]:
    """Each setting's check, in `args.workers` processes at once (fresh ones: CUDA does not survive a fork)."""
    if args.workers == 1 or len(found) < 2:
        return [check_setting(args, kernel, options) for kernel, options in found]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        return list(pool.map(check_setting, [args] * len(found), *zip(*found)))


def time_setting(args: argparse.Namespace, kernel: str | None, options: dict | None) -> dict:
    """Median seconds of forward + backward per direction with `kernel` launched with `options`."""
    with kernel_options(launch_options(kernel, options)):
        return {("causal" if causal else "bidir"): measure(make_call("scaleformer", causal, args.length, args, None),
                                                           args)["median_s"]
                for causal in (True, False)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    info = machine_info(torch.get_num_threads())
    device = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    print("# Launch settings of the default attention's Triton kernels, one kernel at a time")
    print()
    print_machine(info)
    print(f"- device: {device}; B={args.batch}, H={args.heads}, D={args.dim}, horizon {args.horizon}, "
          f"{str(args.dtype).removeprefix('torch.')}, L={args.length}, forward + backward, median of {args.repeats}")
    print(f"- LAUNCH as it is: {LAUNCH}")
    print()
    found = settings(args)
    print(f"[check] {len(found)} settings in {args.workers} process(es)", file=sys.stderr, flush=True)
    checks = check_all(args, found)
    baselines = [time_setting(args, None, None)]
    rows = []
    for index, ((kernel, options), checked) in enumerate(zip(found, checks)):
        row = {"kernel": kernel, **options, "check": checked, "seconds": None}
        if checked["ok"]:
            row["seconds"] = time_setting(args, kernel, options)
        rows.append(row)
        if index == len(found) // 2:
            baselines.append(time_setting(args, None, None))
        print(f"[time] {kernel} {options}: {row['seconds'] or 'failed its check'}", file=sys.stderr, flush=True)
    baselines.append(time_setting(args, None, None))
    base = {d: statistics.median(b[d] for b in baselines) for d in ("causal", "bidir")}
    print("| kernel | warps | stages | causal ms | bidir ms | causal / baseline | bidir / baseline | check (largest "
          "error) |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| baseline (LAUNCH) | – | – | {1000 * base['causal']:.3f} | {1000 * base['bidir']:.3f} | 1.00 | 1.00 "
          "| – |")
    best = {}
    for row in rows:
        worst = max(e for errors in row["check"]["errors"].values() for e in errors.values())
        if row["seconds"] is None:
            print(f"| {row['kernel']} | {row['num_warps']} | {row['num_stages']} | – | – | – | – | FAILED "
                  f"{worst:.1e} |")
            continue
        ratios = {d: row["seconds"][d] / base[d] for d in base}
        print(f"| {row['kernel']} | {row['num_warps']} | {row['num_stages']} | {1000 * row['seconds']['causal']:.3f} "
              f"| {1000 * row['seconds']['bidir']:.3f} | {ratios['causal']:.2f} | {ratios['bidir']:.2f} | "
              f"{worst:.1e} |")
        mean = statistics.fmean(ratios.values())
        if mean < best.get(row["kernel"], (1.0, None))[0]:
            best[row["kernel"]] = (mean, dict(num_warps=row["num_warps"], num_stages=row["num_stages"]))
    print()
    print("Baseline times in the run (ms, causal / bidir): "
          + ", ".join(f"{1000 * b['causal']:.3f} / {1000 * b['bidir']:.3f}" for b in baselines))
    print(f"Best setting per kernel (mean ratio of the two directions, below 1 only; check tolerance "
          f"{CHECK_TOLERANCE}):")
    for kernel in args.kernels:
        mean, options = best.get(kernel, (1.0, None))
        print(f"- {kernel}: " + (f"{options}, {mean:.2f} of the baseline" if options else f"{LAUNCH[kernel]} stays"))
    if args.json:
        write_json(args.json, {"benchmark": "tune_kernels", "machine": {**info, "device": device},
                               "settings": {k: str(v) for k, v in vars(args).items() if k != "json"},
                               "launch": LAUNCH, "baselines": baselines, "rows": rows,
                               "best": {k: v[1] for k, v in best.items()}})
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
