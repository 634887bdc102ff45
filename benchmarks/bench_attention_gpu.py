"""The default attention on a GPU against FlashAttention and flash-linear-attention, forward plus backward.

What is measured, at B=4, H=16, D=64, horizon 16, bf16 by default, each causal and bidirectional:

* `scaleformer`: `local_softmax_decay_attention(..., mode="linear")`, the op of the default configuration (on
  CUDA it runs in the Triton kernels of `ops_local_softmax_triton`);
* `sdpa`: `torch.nn.functional.scaled_dot_product_attention` restricted to the flash backend on CUDA (the
  math backend on CPU), the softmax attention a user would otherwise pick;
* `fla`: flash-linear-attention's `chunk_linear_attn` (causal; no relative term, no normaliser), the speed
  ceiling of linear attention, when `fla` imports, on inputs in its own layout (B, T, H, D); its causal time is
  compared with both directions.

First the op, as it will be timed, is checked against the float64 quadratic reference at 1,024 tokens (output and
every gradient, both directions); a setting that fails is not timed and the script exits with status 1. Every call
is timed after a warm-up, the device synchronised before and after, as the median of `--repeats`; the peak memory is
`torch.cuda.max_memory_allocated` over the call, minus what the inputs hold. The report ends with log-log slopes
of time against L and the targets: at 16k, at least 4x faster than SDPA and within 1.5x of fla; slope 4k-64k at
most 1.1. With `--device cpu` (`--quick`) the same code runs on small shapes, as a smoke test; it says nothing
about GPUs.

`--tune` times launch settings of the kernels instead (`ops_local_softmax_triton.LAUNCH`: warps and pipeline stages
per kernel, and caps on registers per thread with `--registers`, Triton's maxnreg: fewer registers let more programs
share a multiprocessor, at the cost of spills): for each kernel of `--tune-kernels` and each setting of `--warps` x
`--stages` (x no cap and each of `--registers`) other than its own, the
op at `--tune-length` with that kernel so launched and the others as they are, against the op as it is, timed at
the start, the middle and the end of the run (their median is the baseline; the three show drift). Each setting is
checked first as above, which compiles its kernels, in `--workers` processes at once (compiling is the host's work);
one that fails is not timed. The end gives the best setting of each kernel as a `LAUNCH` entry.

    python benchmarks/bench_attention_gpu.py --json benchmarks/results/bench_attention_gpu.json
    python benchmarks/bench_attention_gpu.py --kernel-block 32 --lengths 16384   # the kernels' blocks of 32
    python benchmarks/bench_attention_gpu.py --parallel-walks --lengths 16384  # the walks' parallel passes
    python benchmarks/bench_attention_gpu.py --key-tile 128 --key-block 64 --lengths 16384  # windows in one tile
    python benchmarks/bench_attention_gpu.py --variants wide_tiles recomputed_states  # beside the kernels
    python benchmarks/bench_attention_gpu.py --tune --tune-kernels _backward_keys --warps 2 4 8 16 --stages 1 2 3
    python benchmarks/bench_attention_gpu.py --device cpu --quick

`--ncu-run L` runs, under Nsight Compute, what the timings time at L (the op causal and bidirectional, and fla's
chunk linear attention when it imports): each call compiled and run twice, then once each between
`cudaProfilerStart` and `cudaProfilerStop`, so that `ncu --profile-from-start off` counts those kernels alone.
`--ncu-summary CSV` prints, from ncu's raw CSV, one row per kernel launch: its duration, the compute (SM) and memory
throughput as shares of the device's peak, the achieved occupancy, registers per thread, the cycles a warp takes per
instruction it issues and the largest reasons for its waits (ncu's warp stall reasons, in cycles per issued
instruction). Counters of one run, not timings (run_gpu.sh's `ncu` step):

    ncu --profile-from-start off --clock-control none --csv --page raw --log-file OUT/ncu_attention.csv \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        python3 benchmarks/bench_attention_gpu.py --ncu-run 16384
    python3 benchmarks/bench_attention_gpu.py --ncu-summary OUT/ncu_attention.csv
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import cProfile
import csv
import functools
import io
import itertools
import json
import multiprocessing
import pstats
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import (
    cuda_peak_extra_mib, kernel_options, machine_info, parse_device, print_machine, profile_call, slope_fit,
    synchronize, write_json,
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
TUNE_KERNELS = ("_states", "_forward", "_states_backward", "_backward_queries", "_backward_keys")  # the default path's
TRITON_DEFAULT_STAGES = 3  # a launch without num_stages gets Triton's default
# other settings of the default attention's Triton kernels (options of `ops_local_softmax_triton`), each timed beside
# the kernels as they are with --variants, in the same process, against the same baselines
VARIANTS = {
    "wide_tiles": {"KEY_TILE": 128, "KEY_BLOCK": 64},  # a query block's window in one tile, 64 keys per backward
    "parallel_walks": {"PARALLEL_WALKS": True},
    "recomputed_states": {"KEEP_STATES": False},  # forward's states recomputed in backward instead of kept
    "sequential_walks": {"PARALLEL_WALKS": False},  # the walks at every number of rows
    "block32": {"BLOCK": 32},
    "scan_by_slot": {"SCAN_ROWS": 16, "SCAN_SLOTS": 1},  # the parallel passes' scan one chunk a step, 16 rows a program
    "operators": {"EAGER_FUNCTION": False},  # eager calls through the torch.library operators' dispatch
    # `_backward_keys`' blocks from key 0, not in step with the windows and the walks' chunks (`_key_origin`): at h = 16
    # and offset 0, causal, the op before its blocks started at the windows' first keys
    "key_blocks_from_0": {"ALIGNED_KEY_BLOCKS": False},
    # a window that would end in a tile mostly past its end (80 keys, causal at h = 16) in whole tiles of 32 keys in
    # both kernels, or in a tile of 16 keys in `_backward_queries` too, beside `_forward` (the default)
    "whole_tiles": {"TAIL_TILES": ()},
    # the windows' last tiles in the band only (causal) with the kernel's products, as every other tile: the op before
    # `ONE_SIDED_TILES`
    "two_sided_tiles": {"ONE_SIDED_TILES": False},
    "tail_tiles_backward": {"TAIL_TILES": ("_forward", "_backward_queries")},
    # the parallel passes' scan as products (2 rows of the states a program, 32 chunks a step; or 1 row), in steps of
    # 16 chunks by `_scan_sums`, and the passes with the products where the op takes the walks (128 programs or more)
    "scan_products": {"SCAN_PRODUCTS": True},
    "scan_products_1x32": {"SCAN_PRODUCTS": True, "PRODUCT_ROWS": 1},
    "scan_steps_of_16": {"SCAN_SLOTS": 16},
    "scan_products_everywhere": {"SCAN_PRODUCTS": True, "PARALLEL_WALKS": True},
    # the scan as the walks' recurrence over each step's slots, read at once (`_scan_recurrence`)
    "scan_recurrence": {"SCAN_RECURRENCE": True},
    # that scan and backward's pairs stored, together
    "stored_pairs_scan_recurrence": {"STORED_PAIRS": True, "SCAN_RECURRENCE": True},
    # the causal table in a tile of 32 rows, the 17 the band reads at h = 16 (`MIN_TABLE_TILE`): the windows' gathers
    # of the table half as wide; bidirectional, its 33 rows keep a tile of 64
    "narrow_table": {"MIN_TABLE_TILE": 32},
    # and bidirectional, the band's last row of the table apart from a tile of 32 rows for the other 32 (`EDGE_APART`)
    "narrow_table_edge": {"MIN_TABLE_TILE": 32, "EDGE_APART": True},
    # `_backward_keys` reading the window's pairs that `_backward_queries` stores, instead of forming them again
    "stored_pairs": {"STORED_PAIRS": True},
    # and `_backward_keys` by 16 keys a program: 146-152 registers a thread against 252, three programs an SM
    "stored_pairs_key_block_16": {"STORED_PAIRS": True, "KEY_BLOCK": 16},
    "unspecialised_lengths": "the kernels' length arguments not specialised (see `unspecialised_kernels`)",
    # the op without its relative table (the kernels' HAS_TABLE false): what the table's products and gathers cost;
    # another computation than the default's, checked against the reference without a table
    "no_table": "the op without a relative table (see `uses_table`)",
}
LAUNCHED_KERNELS = ("_states", "_chunk_sums", "_scan_sums", "_scan_products", "_scan_recurrence", "_row_terms",
                    "_states_backward", "_query_sums", "_forward", "_backward_queries", "_backward_keys",
                    "_decode_step", "_cross_decode")


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
    parser.add_argument("--host-profile", type=int, metavar="L",
                        help="also time, at length L (causal), how long the host takes to issue the op's forward and "
                             "its backward, and profile the forward's Python calls (cProfile: the op's wrappers, "
                             "Triton's launches, PyTorch's operators)")
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
    parser.add_argument("--launch", type=Path, metavar="PATH",
                        help="launch the kernels with the best settings that a --tune run wrote to PATH (its JSON's "
                             "\"best\"), the others as they are, for the whole run")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=[],
                        help="also time the kernels with these settings, each beside the kernels as set by the "
                             "options above: " + "; ".join(f"{name} {options}" for name, options in VARIANTS.items()))
    parser.add_argument("--ncu-run", type=int, metavar="L",
                        help="run the calls timed at L once each inside the CUDA profiler's range, for ncu (see "
                             "above), and time nothing")
    parser.add_argument("--ncu-summary", type=Path, metavar="CSV",
                        help="print the summary of ncu's raw CSV at CSV (see above) and exit")
    parser.add_argument("--check-only", action="store_true",
                        help="check the kernels against the reference (which compiles them) and time nothing")
    parser.add_argument("--tune", action="store_true",
                        help="time launch settings of the kernels, one kernel at a time, instead (see above)")
    parser.add_argument("--tune-kernels", nargs="+", default=list(TUNE_KERNELS), metavar="NAME",
                        help="with --tune: kernels of ops_local_softmax_triton.LAUNCH (default: those of the default "
                             "path, " + " ".join(TUNE_KERNELS) + ")")
    parser.add_argument("--tune-length", type=int, default=TARGET_LENGTH, metavar="L",
                        help=f"with --tune: the length timed (default: {TARGET_LENGTH}; --quick: {QUICK_LENGTHS[0]})")
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8], metavar="N", help="with --tune (default: 4 8)")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], metavar="N",
                        help="with --tune (default: 1 2 3)")
    parser.add_argument("--registers", type=int, nargs="+", default=[], metavar="N",
                        help="with --tune: caps on registers per thread to try beside none (maxnreg; default: none)")
    parser.add_argument("--workers", type=int, default=8,
                        help="with --tune: processes that check (and so compile) the settings at once (default: 8; "
                             "--quick: at most 2)")
    args = parser.parse_args(argv)
    if args.ncu_summary:  # reads a file: no device needed
        return args
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
    if args.tune:
        check_tune_arguments(parser, args)
    args.launch_path, args.launch = args.launch, read_launch(parser, args.launch) if args.launch else None
    args.dtype = getattr(torch, args.dtype)
    return args


def read_launch(parser: argparse.ArgumentParser, path: Path) -> dict:
    """`ops_local_softmax_triton.LAUNCH` with the best settings of the --tune report at `path` in place of its
    own."""
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    try:
        best = json.loads(path.read_text())["best"]
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"--launch takes the JSON of a --tune run (with its \"best\" settings), got {path}: {error!r}")
    unknown = sorted(set(best) - set(LAUNCH))
    if unknown:
        parser.error(f"--launch: {path} tunes kernels that ops_local_softmax_triton.LAUNCH does not have: "
                     f"{', '.join(unknown)}")
    return {**LAUNCH, **best}


def check_tune_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--tune's arguments: known kernels, warps in powers of two, positive counts; --quick's length and workers; the
    check and the timings at the tuned length."""
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    unknown = sorted(set(args.tune_kernels) - set(LAUNCH))
    if unknown:
        parser.error(f"--tune-kernels takes names of ops_local_softmax_triton.LAUNCH ({', '.join(LAUNCH)}), got "
                     f"{', '.join(unknown)}")
    if min(args.warps) < 1 or any(w & (w - 1) for w in args.warps):
        parser.error(f"--warps must be powers of two, got {args.warps}")
    if min(args.stages) < 1 or args.workers < 1 or args.tune_length < 1:
        parser.error("--stages, --workers and --tune-length must be positive")
    if any(not 24 <= cap <= 255 for cap in args.registers):
        parser.error(f"--registers must lie between 24 and 255, got {args.registers}")
    if args.quick:
        args.tune_length, args.workers = QUICK_LENGTHS[0], min(args.workers, 2)
    args.lengths = [args.tune_length]


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
                                               ("KEY_BLOCK", args.key_block), ("LAUNCH", args.launch))
               if value is not None}
    return {**options, "PARALLEL_WALKS": True} if args.parallel_walks else options


def method_options(method: str) -> dict:
    """The options of `ops_local_softmax_triton` that `method` ("scaleformer:VARIANT") names (`VARIANTS`), none for
    the other methods."""
    if not method.startswith("scaleformer:"):
        return {}
    variant = method.split(":")[1]
    if variant == "no_table":
        return {}
    return unspecialised_kernels() if variant == "unspecialised_lengths" else VARIANTS[variant]


def uses_table(method: str) -> bool:
    """Whether `method` calls the op with the relative table (all but the `no_table` variant)."""
    return method != "scaleformer:no_table"


@functools.cache
def unspecialised_kernels() -> dict:
    """Each kernel of `ops_local_softmax_triton` compiled anew with its `LENGTH_ARGUMENTS` (that module's) marked
    do_not_specialize:
    one compile whatever a batch's lengths, without the marks of those that are multiples of 16."""
    import triton

    from modeling_scaleformer import ops_local_softmax_triton as kernels

    return {name: triton.jit(getattr(kernels, name).fn, do_not_specialize=[
        argument for argument in kernels.LENGTH_ARGUMENTS if argument in getattr(kernels, name).arg_names])
        for name in LAUNCHED_KERNELS}


def timing_inputs(length: int, args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """q, k, v, the relative table and the decay rates (leaves taking gradients) and an upstream gradient, at
    `length`, drawn from a generator seeded by it."""
    g = torch.Generator(device=args.device).manual_seed(length)
    shape = (args.batch, args.heads, length, args.dim)
    q, k, v = (torch.randn(shape, generator=g, device=args.device).to(args.dtype).requires_grad_() for _ in range(3))
    rel = (0.1 * torch.randn(args.heads, 2 * args.horizon + 1, args.dim, generator=g, device=args.device))
    rel = rel.to(args.dtype).requires_grad_()
    decay = torch.linspace(0.25, 1 / 256, args.heads, device=args.device).to(args.dtype).requires_grad_()
    grad = torch.randn(shape, generator=g, device=args.device).to(args.dtype)
    return q, k, v, rel, decay, grad


def make_call(method: str, causal: bool, length: int, args: argparse.Namespace, fla):
    """A function that runs forward and backward once, and the tensors it holds."""
    q, k, v, rel, decay, grad = timing_inputs(length, args)
    if method == "fla":  # in fla's own layout, (B, T, H, D), so that its time holds no copies between layouts
        q, k, v = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        grad = grad.transpose(1, 2).contiguous()

    table = rel if uses_table(method) else None

    def call():
        if method.startswith("scaleformer"):
            out = local_softmax_decay_attention(q, k, v, table, decay, causal=causal, mode="linear",
                                                horizon=args.horizon)
        elif method == "sdpa":
            with sdpa_backend(args.device):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:  # causal only
            out, _ = fla(q, k, v, normalize=False)
        out.backward(grad)
        for x in (q, k, v, rel, decay):
            x.grad = None

    return call


def check(args: argparse.Namespace, table: bool = True) -> dict:
    """The op as timed (the kernels on CUDA, with the kernel options asked for) against the float64 quadratic
    reference on the same inputs, at batch 1 and `CHECK_LENGTH` tokens, each direction: the largest error of the
    output and of the gradients of q, k, v, the table (0 without one: `table` false, both without) and the decay
    rates, each over the reference's largest magnitude. Timings of a path that computes something else would mean
    nothing: main stops when one passes `CHECK_TOLERANCE`."""
    length = min(CHECK_LENGTH, max(args.lengths))
    errors = {}
    for causal in (True, False):
        g = torch.Generator(device=args.device).manual_seed(0)
        shape = (1, args.heads, length, args.dim)
        q, k, v = (torch.randn(shape, generator=g, device=args.device).to(args.dtype) for _ in range(3))
        rel = (0.1 * torch.randn(args.heads, 2 * args.horizon + 1, args.dim, generator=g, device=args.device))
        decay = torch.linspace(0.25, 1 / 256, args.heads, device=args.device)
        leaves = [x.to(args.dtype).requires_grad_() for x in (q, k, v, rel, decay)]
        if not table:
            leaves[3] = torch.zeros_like(leaves[3]).requires_grad_()  # unused: the op and the reference take None
        upstream = torch.randn(shape, generator=g, device=args.device).to(args.dtype)
        out = local_softmax_decay_attention(*leaves[:3], leaves[3] if table else None, leaves[4], causal=causal,
                                            mode="linear", horizon=args.horizon)
        got = [out, *torch.autograd.grad(out, leaves, upstream, allow_unused=not table)]
        # the reference takes the same inputs and upstream gradient, in float64: a gradient that sums terms of both
        # signs (the slow head's decay rate's) would otherwise hold the upstream's rounding to 16 bits, 5% of its size
        # at L = 512 on CPU in bf16
        wide = [x.detach().double().requires_grad_() for x in leaves]
        reference = naive_local_softmax_decay_attention(*wide[:3], wide[3] if table else None, wide[4], causal=causal,
                                                        horizon=args.horizon)
        expected = [reference, *torch.autograd.grad(reference, wide, upstream.double(), allow_unused=not table)]
        got, expected = ([torch.zeros_like(leaves[3]) if x is None else x for x in xs] for xs in (got, expected))
        errors["causal" if causal else "bidir"] = {
            name: float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-30))
            for name, a, b in zip(("out", "q", "k", "v", "rel", "decay"), got, expected)}
    return {"length": length, "tolerance": CHECK_TOLERANCE, "errors": errors,
            "ok": all(e <= CHECK_TOLERANCE for row in errors.values() for e in row.values())}


def measure(call, args: argparse.Namespace) -> dict:
    """Median seconds of `repeats` calls after one warm-up, until the device finished (`median_s`) and until the
    call returned to the host (`host_median_s`: the time to issue its work; near `median_s`, the host sets the
    pace), and the peak memory of one call over what was held before it."""
    call()
    synchronize(args.device)
    times, host_times = [], []
    for _ in range(args.repeats):
        synchronize(args.device)
        start = time.perf_counter()
        call()
        host_times.append(time.perf_counter() - start)
        synchronize(args.device)
        times.append(time.perf_counter() - start)
    peak = cuda_peak_extra_mib(call, args.device) if args.device.type == "cuda" else None
    return {"median_s": statistics.median(times), "times_s": times, "host_median_s": statistics.median(host_times),
            "peak_extra_mib": peak}


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


def seconds(rows: list[dict], method: str, causal: bool, length: int, field: str = "median_s") -> float | None:
    for r in rows:
        if (r["method"], r["causal"], r["length"]) == (method, causal, length) and r.get(field) is not None:
            return r[field]
    return None


def report(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """Print the tables and the targets; return the targets."""
    print("| L | direction | scaleformer ms | sdpa ms | fla (causal) ms | sdpa / scaleformer | scaleformer / fla |"
          " scaleformer peak MiB | sdpa peak MiB | scaleformer host ms |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        for causal in (True, False):
            s, a = (seconds(rows, m, causal, length) for m in ("scaleformer", "sdpa"))
            f = seconds(rows, "fla", True, length)
            peaks = {r["method"]: r.get("peak_extra_mib") for r in rows
                     if r["length"] == length and r["causal"] == causal}
            cells = [f"{1000 * x:.2f}" if x is not None else "–" for x in (s, a, f)]
            ratio = [f"{x / y:.2f}x" if x is not None and y is not None else "–" for x, y in ((a, s), (s, f))]
            mem = [f"{peaks[m]:.0f}" if peaks.get(m) is not None else "–" for m in ("scaleformer", "sdpa")]
            host = seconds(rows, "scaleformer", causal, length, "host_median_s")
            host_cell = ["–" if host is None else f"{1000 * host:.2f}"]
            print(f"| {length} | {'causal' if causal else 'bidir'} | " + " | ".join(cells + ratio + mem + host_cell)
                  + " |")
    print()
    print("Host ms: until the call returned, its work issued but not finished; near the first column, the host sets "
          "the pace.")
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


def host_profile(length: int, args: argparse.Namespace, calls: int = 20, top: int = 20) -> dict:
    """How long the host takes to issue one scaleformer forward and its backward (causal, `length`; medians of
    `calls`, the device waited for between calls) and where the forward's host time goes: Python's cProfile over
    `calls` forwards with gradients, the `top` functions by their own time. The backward runs on autograd's device
    thread on CUDA, which cProfile does not see: its issue time is given whole."""
    q, k, v, rel, decay, grad = timing_inputs(length, args)

    def forward():
        return local_softmax_decay_attention(q, k, v, rel, decay, causal=True, mode="linear")

    forward().backward(grad)
    synchronize(args.device)
    forward_s, backward_s = [], []
    for _ in range(calls):
        start = time.perf_counter()
        out = forward()
        issued = time.perf_counter()
        out.backward(grad)
        forward_s.append(issued - start)
        backward_s.append(time.perf_counter() - issued)
        synchronize(args.device)
    profiler = cProfile.Profile()
    outputs = []
    profiler.enable()
    for _ in range(calls):
        outputs.append(forward())
    profiler.disable()
    synchronize(args.device)
    del outputs
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    table = "\n".join(line for line in stream.getvalue().strip().splitlines() if line.strip())
    # the op's own entry, whatever its rank by own time: how many forwards the profile saw, and their total time
    (op_calls, op_cumulative_s), = [(entry[1], entry[3]) for (_, _, name), entry in stats.stats.items()
                                    if name == local_softmax_decay_attention.__name__]
    result = {"length": length, "calls": calls, "forward_issue_s": statistics.median(forward_s),
              "backward_issue_s": statistics.median(backward_s), "forward_table": table,
              "profiled_calls": op_calls, "profiled_s": op_cumulative_s}
    print(f"## Host: scaleformer causal, L={length}: the host issues a forward in "
          f"{1000 * result['forward_issue_s']:.3f} ms and its backward in {1000 * result['backward_issue_s']:.3f} ms "
          f"(medians of {calls}); the forward's Python calls by own time (cProfile, {calls} forwards):\n")
    print("```")
    print(table)
    print("```")
    print()
    return result


def target(name: str, value: float | None, ok) -> dict:
    return {"name": name, "value": value, "status": "N/A" if value is None else ("PASS" if ok(value) else "FAIL")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ncu_summary:
        return ncu_summary(args.ncu_summary)
    with kernel_options(command_options(args)):
        if args.ncu_run:
            return ncu_run(args.ncu_run, args)
        return tune(args) if args.tune else benchmark(args)


def ncu_run(length: int, args: argparse.Namespace) -> int:
    """The calls timed at `length`, each compiled and run twice, then once each inside the CUDA profiler's range."""
    fla = fla_linear_attention() if args.device.type == "cuda" else None
    calls = {f"scaleformer {'causal' if causal else 'bidir'}": make_call("scaleformer", causal, length, args, None)
             for causal in (True, False)}
    if fla is not None:
        calls["fla causal"] = make_call("fla", True, length, args, fla)
    for call in calls.values():
        call()
        call()
    synchronize(args.device)
    profiler = torch.cuda.profiler.profile() if args.device.type == "cuda" else contextlib.nullcontext()
    with profiler:
        for call in calls.values():
            call()
        synchronize(args.device)
    print(f"profiled at L={length}: {', '.join(calls)}")
    return 0


NCU_COLUMNS = {  # ncu's raw metric: its column in the summary
    "gpu__time_duration.sum": "time",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
    "launch__registers_per_thread": "registers",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles / issue",
}
NCU_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def read_ncu_csv(path: Path) -> tuple[list[dict], dict]:
    """The kernel rows of ncu's raw CSV (`--csv --page raw`), whatever log lines precede its header, and its row of
    units."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV header (a line starting with \"ID\") in it")
    rows = list(csv.DictReader(lines[start:]))
    units = next((row for row in rows if not row.get("ID", "").strip()), {})
    return [row for row in rows if row.get("ID", "").strip().isdigit()], units


def ncu_summary(path: Path, stalls: int = 3) -> int:
    """One row per kernel launch of ncu's raw CSV at `path`: `NCU_COLUMNS` where present, and the `stalls` largest
    warp stall reasons."""
    rows, units = read_ncu_csv(path)
    present = [metric for metric in NCU_COLUMNS if rows and metric in rows[0]]
    names = [NCU_COLUMNS[metric] + (f" ({units[metric]})" if metric == "gpu__time_duration.sum" and units.get(metric)
                                    else "") for metric in present]
    print(f"| kernel | {' | '.join(names)} | largest stalls (cycles / issue) |")
    print("|:---|" + "---:|" * len(present) + ":---|")
    for row in rows:
        values = [float_or_none(row.get(metric)) for metric in present]
        cells = ["–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.2f}" for value in values]
        reasons = sorted(((float_or_none(value) or 0.0, match.group(1)) for metric, value in row.items()
                          if (match := NCU_STALL.match(metric))), reverse=True)[:stalls]
        stalled = ", ".join(f"{name} {value:.1f}" for value, name in reasons if value > 0)
        print(f"| {row.get('Kernel Name', '?')[:48]} | {' | '.join(cells)} | {stalled or '–'} |")
    missing = [metric for metric in NCU_COLUMNS if metric not in present]
    if missing:
        print(f"\n(not in this CSV: {', '.join(missing)})")
    return 0


def float_or_none(text: str | None) -> float | None:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def print_header(title: str, args: argparse.Namespace) -> tuple[dict, str]:
    """Print the report's title and the machine; return the machine's description and the device's name."""
    info = machine_info(torch.get_num_threads())
    device_name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    print(f"# {title}")
    print()
    print_machine(info)
    return info, device_name


def benchmark(args: argparse.Namespace) -> int:
    """The check, then the profile, the timings and the report; 1 when a check fails."""
    info, device_name = print_header(
        "Attention on a GPU: scaleformer (default attention) against SDPA flash and fla, forward + backward", args)
    block = (f"; kernel blocks of {args.kernel_block}" if args.kernel_block else "") + (
        f"; key tiles of {args.key_tile}" if args.key_tile else "") + (
        f"; {args.key_block} keys per backward program" if args.key_block else "") + (
        "; parallel walks" if args.parallel_walks else "") + (
        f"; launched as tuned in {args.launch_path}: {args.launch}" if args.launch else "")
    print(f"- device: {device_name}; B={args.batch}, H={args.heads}, D={args.dim}, horizon {args.horizon}, "
          f"{str(args.dtype).removeprefix('torch.')}; median of {args.repeats} after a warm-up{block}")
    print()
    checked = {}
    for method in [METHODS[0], *(f"scaleformer:{name}" for name in args.variants)]:
        with kernel_options(method_options(method)):
            checked[method] = check(args, table=uses_table(method))
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
    profiles, host, rows, targets = None, None, [], []
    if METHODS[0] in failed:
        print("check FAILED: not timed", flush=True)
    elif not args.check_only:
        if failed:
            print(f"check FAILED for {', '.join(sorted(failed))}: not timed", flush=True)
        profiles = profile(args.profile, args) if args.profile else None
        host = host_profile(args.host_profile, args) if args.host_profile else None
        rows = run(args, failed)
        targets = report(rows, args)
    if args.json:
        write_json(args.json, {"benchmark": "bench_attention_gpu", "machine": {**info, "device": device_name},
                               "settings": {k: str(v) for k, v in vars(args).items() if k != "json"},
                               "check": checked, "timings": rows, "targets": targets, "profiles": profiles,
                               "host_profile": host})
    return 1 if failed else 0


def tune_settings(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(kernel, launch options) for every kernel of --tune-kernels and every warps x stages (x no cap and each of
    --registers) but its own."""
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    found = []
    for kernel in args.tune_kernels:
        current = {"num_stages": TRITON_DEFAULT_STAGES, **LAUNCH[kernel]}
        for warps, stages, cap in itertools.product(args.warps, args.stages, [None, *args.registers]):
            options = dict(num_warps=warps, num_stages=stages, **({"maxnreg": cap} if cap else {}))
            if options != current:
                found.append((kernel, options))
    return found


def launch_options(kernel: str | None, options: dict | None) -> dict:
    """`kernel_options` that launch `kernel` with `options` (none: the kernels as they are)."""
    if kernel is None:
        return {}
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    return {"LAUNCH": {**LAUNCH, kernel: options}}


def check_setting(args: argparse.Namespace, kernel: str, options: dict) -> dict:
    """`check` of the op with `kernel` launched with `options`, under the command line's kernel options."""
    with kernel_options(command_options(args)), kernel_options(launch_options(kernel, options)):
        return check(args)


def check_settings(args: argparse.Namespace, found: list[tuple[str, dict]]) -> list[dict]:
    """Each setting's check, in `args.workers` processes at once (fresh ones: CUDA does not survive a fork)."""
    if args.workers == 1 or len(found) < 2:
        return [check_setting(args, kernel, options) for kernel, options in found]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        return list(pool.map(check_setting, [args] * len(found), *zip(*found)))


def time_setting(args: argparse.Namespace, kernel: str | None, options: dict | None) -> dict:
    """Median seconds of forward + backward per direction at --tune-length with `kernel` launched with `options`."""
    with kernel_options(launch_options(kernel, options)):
        return {("causal" if causal else "bidir"): measure(make_call("scaleformer", causal, args.tune_length, args,
                                                                     None), args)["median_s"]
                for causal in (True, False)}


def tune(args: argparse.Namespace) -> int:
    """--tune: the checks, the timings and the report; 1 when a setting fails its check."""
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    info, device_name = print_header("Launch settings of the default attention's Triton kernels, one kernel at a time",
                                     args)
    print(f"- device: {device_name}; B={args.batch}, H={args.heads}, D={args.dim}, horizon {args.horizon}, "
          f"{str(args.dtype).removeprefix('torch.')}, L={args.tune_length}, forward + backward, median of "
          f"{args.repeats}")
    print(f"- LAUNCH as it is: {LAUNCH}")
    print()
    found = tune_settings(args)
    print(f"[check] {len(found)} settings in {args.workers} process(es)", file=sys.stderr, flush=True)
    checks = check_settings(args, found)
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
    print("| kernel | warps | stages | register cap | causal ms | bidir ms | causal / baseline | bidir / baseline | "
          "check (largest error) |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| baseline (LAUNCH) | – | – | – | {1000 * base['causal']:.3f} | {1000 * base['bidir']:.3f} | 1.00 | 1.00 "
          "| – |")
    best = {}
    for row in rows:
        worst = max(e for errors in row["check"]["errors"].values() for e in errors.values())
        if row["seconds"] is None:
            print(f"| {row['kernel']} | {row['num_warps']} | {row['num_stages']} | {row.get('maxnreg', '–')} | – | – | "
                  f"– | – | FAILED {worst:.1e} |")
            continue
        ratios = {d: row["seconds"][d] / base[d] for d in base}
        print(f"| {row['kernel']} | {row['num_warps']} | {row['num_stages']} | {row.get('maxnreg', '–')} | "
              f"{1000 * row['seconds']['causal']:.3f} | {1000 * row['seconds']['bidir']:.3f} | {ratios['causal']:.2f} "
              f"| {ratios['bidir']:.2f} | {worst:.1e} |")
        mean = statistics.fmean(ratios.values())
        if mean < best.get(row["kernel"], (1.0, None))[0]:
            options = {key: row[key] for key in ("num_warps", "num_stages", "maxnreg") if key in row}
            best[row["kernel"]] = (mean, options)
    print()
    print("Baseline times in the run (ms, causal / bidir): "
          + ", ".join(f"{1000 * b['causal']:.3f} / {1000 * b['bidir']:.3f}" for b in baselines))
    print("Best setting per kernel (the mean of its two directions' ratios, below 1 only):")
    for kernel in args.tune_kernels:
        mean, options = best.get(kernel, (1.0, None))
        print(f"- {kernel}: " + (f"{options}, {mean:.2f} of the baseline" if options else f"{LAUNCH[kernel]} stays"))
    if args.json:
        write_json(args.json, {"benchmark": "bench_attention_gpu --tune", "machine": {**info, "device": device_name},
                               "settings": {k: str(v) for k, v in vars(args).items() if k != "json"},
                               "launch": LAUNCH, "baselines": baselines, "rows": rows,
                               "best": {k: v[1] for k, v in best.items()}})
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
