"""The work of the default attention's Triton kernels per 64 positions, counted on CPU, beside fla's chunk linear
attention: multiply-adds in products and transcendental evaluations.

The op runs forward and backward once in each direction at batch 1, one head, D = Dv = 64 and h = 16 (`--dim`,
`--horizon`), on `--length` positions (default 1,024: the counts per position do not depend on it past a few
blocks), with its kernels chosen as on CUDA and run by Triton's interpreter (`TRITON_INTERPRET=1`), at the blocks and
tiles the kernels take on a GPU. Every product a kernel takes (`tl.dot` of (M, K) x (K, N)) counts M N K
multiply-adds; every element of an `exp`, `exp2`, `log` or `log2` counts one transcendental evaluation. Both are
counted as the code runs them: masked rows and columns of a tile, which a GPU computes as well, included. The
figures are the work the kernels ask for, not a timing: a product runs on the tensor cores, a transcendental on the
special function units (on sm90, 16 results a clock per multiprocessor for exp2 and log2, CUDA C++ Programming
Guide, arithmetic instructions' throughput), and how fast either goes depends on how the kernel keeps them fed.

fla's figures come from its source (fla-core 0.6.0, `chunk_linear_attn(q, k, v, normalize=False)`, causal, D = Dv =
64, chunks of 64, the tiles it takes on an H100 or H200): forward `chunk_fwd_kernel_h` (k^T v, one 64 x 64 x 64
product a chunk) and `chunk_fwd_kernel_o` (q h, q k^T, A v: three), backward `chunk_fwd_kernel_h` again,
`chunk_bwd_kernel_dh` (one), `chunk_bwd_kernel_dqkwg` (five) and `chunk_bwd_kernel_dv` (three), and no
transcendental: 4 x 64^3 multiply-adds forward and 10 x 64^3 backward per 64 positions (its forward's output kernel
at its 64 x 64 tiles; autotuned to 128 x 128 it computes more, padded, for the same result).

    python benchmarks/kernel_work.py
    python benchmarks/kernel_work.py --kernel-options "TAIL_TILES=()"     # windows in whole tiles
    python benchmarks/kernel_work.py --length 256 --json work.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import torch

from common import choose_kernels_as_on_cuda, kernel_options, parse_kernel_options


POSITIONS = 64  # the figures are per this many positions
FLA = {"forward": 4 * 64 ** 3, "backward": 10 * 64 ** 3}  # fla's multiply-adds per 64 positions (module docstring)
TRANSCENDENTAL = ("create_exp", "create_exp2", "create_log", "create_log2")  # the interpreter's builders counted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024, help="positions (default: 1024)")
    parser.add_argument("--dim", type=int, default=64, help="D = Dv (default: 64)")
    parser.add_argument("--horizon", type=int, default=16, help="h (default: 16)")
    parser.add_argument("--kernel-options", nargs="+", default=[], metavar="NAME=VALUE",
                        help="module options of ops_local_softmax_triton for the run, each VALUE a Python literal, "
                             "e.g. \"TAIL_TILES=()\" or SCAN_PRODUCTS=True")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the counts to PATH")
    args = parser.parse_args(argv)
    if args.length < 1 or args.dim < 1 or args.horizon < 0:
        parser.error(f"--length and --dim must be positive and --horizon at least 0, got {args.length}, "
                     f"{args.dim}, {args.horizon}")
    try:
        args.kernel_options = parse_kernel_options(args.kernel_options)
    except ValueError as error:
        parser.error(str(error))
    return args


class Counts:
    """Multiply-adds and transcendental evaluations by kernel, and launches, of the interpreted kernels."""

    def __init__(self):
        self.macs, self.transcendental, self.launches = (collections.Counter() for _ in range(3))
        self.kernel = None

    def install(self) -> None:
        """Count every interpreted launch's products and transcendentals (Triton's interpreter, patched)."""
        from triton.runtime import interpreter

        run = interpreter.InterpretedFunction.run

        def counted_run(function, *args, **kwargs):
            self.kernel = function.fn.__name__
            self.launches[self.kernel] += 1
            return run(function, *args, **kwargs)

        dot = interpreter.InterpreterBuilder.create_dot

        def counted_dot(builder, a, b, *rest):
            self.macs[self.kernel] += a.data.shape[-2] * a.data.shape[-1] * b.data.shape[-1]
            return dot(builder, a, b, *rest)

        def counting(original):
            def counted(builder, arg, *rest):
                self.transcendental[self.kernel] += arg.data.size
                return original(builder, arg, *rest)
            return counted

        interpreter.InterpretedFunction.run = counted_run
        interpreter.InterpreterBuilder.create_dot = counted_dot
        for name in TRANSCENDENTAL:
            setattr(interpreter.InterpreterBuilder, name, counting(getattr(interpreter.InterpreterBuilder, name)))

    def snapshot(self) -> tuple[dict, dict]:
        return dict(self.macs), dict(self.transcendental)


def count_direction(causal: bool, args: argparse.Namespace, counts: Counts) -> dict:
    """One forward and backward of the op in one direction: each kernel's launches, multiply-adds and transcendentals
    per POSITIONS positions, forward and backward."""
    from modeling_scaleformer.ops_local_softmax import chunk_local_softmax_decay_attention

    for counter in (counts.macs, counts.transcendental, counts.launches):
        counter.clear()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, args.length, args.dim, generator=gen) for _ in range(3))
    table = torch.randn(1, 2 * args.horizon + 1, args.dim, generator=gen) * 0.1
    leaves = [x.requires_grad_() for x in (q, k, v, table, torch.tensor([0.1]))]
    out = chunk_local_softmax_decay_attention(*leaves, causal=causal, horizon=args.horizon)
    forward_macs, forward_transcendental = counts.snapshot()
    out.backward(torch.ones_like(out))
    per = POSITIONS / args.length
    kernels = {}
    for kernel, launches in counts.launches.items():
        kernels[kernel] = {
            "launches": launches,
            "forward_macs": forward_macs.get(kernel, 0) * per,
            "backward_macs": (counts.macs[kernel] - forward_macs.get(kernel, 0)) * per,
            "forward_transcendental": forward_transcendental.get(kernel, 0) * per,
            "backward_transcendental": (counts.transcendental[kernel] - forward_transcendental.get(kernel, 0)) * per,
        }
    keys = ("forward_macs", "backward_macs", "forward_transcendental", "backward_transcendental")
    totals = {key: sum(row[key] for row in kernels.values()) for key in keys}
    return {"kernels": kernels, "totals": totals}


def main(argv: list[str] | None = None) -> int:
    # before Triton is first imported (by the check of --kernel-options among others): the kernels as interpreted
    # functions
    os.environ["TRITON_INTERPRET"] = "1"
    args = parse_args(argv)
    choose_kernels_as_on_cuda()
    with kernel_options(args.kernel_options):
        return report_work(args)


def report_work(args: argparse.Namespace) -> int:
    """The kernels' work in both directions, as a table and (`--json`) a file."""
    counts = Counts()
    counts.install()
    fla = {"forward": FLA["forward"], "backward": FLA["backward"], "both": FLA["forward"] + FLA["backward"]}
    report = {"length": args.length, "dim": args.dim, "horizon": args.horizon, "positions": POSITIONS,
              "kernel_options": {name: repr(value) for name, value in args.kernel_options.items()}, "fla_macs": fla}
    options = ", ".join(f"{name} = {value!r}" for name, value in args.kernel_options.items())
    print(f"# The default attention's kernels' work per {POSITIONS} positions: L = {args.length}, D = Dv = "
          f"{args.dim}, h = {args.horizon}, batch 1, one head{'; ' + options if options else ''}\n")
    for causal in (True, False):
        direction = "causal" if causal else "bidirectional"
        result = report[direction] = count_direction(causal, args, counts)
        print(f"## {direction}\n")
        print("| kernel | launches | forward MACs | backward MACs | forward transcendentals | "
              "backward transcendentals |")
        print("|:---|---:|---:|---:|---:|---:|")
        for kernel, row in [*result["kernels"].items(), ("total", {"launches": "", **result["totals"]})]:
            print(f"| {kernel} | {row['launches']} | {row['forward_macs']:,.0f} | {row['backward_macs']:,.0f} | "
                  f"{row['forward_transcendental']:,.0f} | {row['backward_transcendental']:,.0f} |")
        total = result["totals"]["forward_macs"] + result["totals"]["backward_macs"]
        result["against_fla"] = total / fla["both"]
        print(f"\nMultiply-adds in all: {total:,.0f}, {result['against_fla']:.2f}x fla's chunk linear attention "
              f"(causal: {fla['forward']:,} forward, {fla['backward']:,} backward, no transcendental)\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
