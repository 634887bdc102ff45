"""Registers, spills and shared memory of the default attention's Triton kernels, compiled here for a CUDA target.

Each kernel of `ops_local_softmax_triton` is compiled by Triton for the target (sm90 by default: an H100) with the
host's block sizes for the given horizon, head dimensions and dtype, then assembled by the ptxas Triton uses for
that target (`ptxas -v`), for every block size, key tile (or, for the scans, rows and slots a step), warp count,
pipeline depth and cap on registers asked for. No GPU is needed. Each kernel is compiled as a launch at B=4, H=16,
L=16384, D=64 specialises it: every pointer 16-byte aligned and every integer argument a multiple of 16, which
Triton's launches mark (`tt.divisibility`) and which lets it vectorise loads and drop masks. `--unaligned` compiles
without any of those marks: on 2026-11-28 the window kernels then had about twice the instructions (a launch whose
lengths alone are not multiples of 16 had 2-5% more; benchmarks/README.md). The table gives what ptxas reports:
registers per thread (255 at most), bytes spilled to local memory (stores / loads) and the shared memory Triton
allocates; `*` marks the launch options the op uses (`LAUNCH`) at the block size it uses (`BLOCK`). This is not a
timing: a kernel that spills is slower than the same kernel without spills, and one that asks for more shared memory
than a multiprocessor holds does not launch, but which options are fastest only a GPU can say
(`bench_attention_gpu.py --kernel-block`, `--tune`). Run from the repository root with the package and Triton
installed (`pip install -e ".[gpu]"`):

    python benchmarks/kernel_resources.py                      # blocks of 32 and 64, 4 and 8 warps, 1-3 stages
    python benchmarks/kernel_resources.py --blocks 64 --warps 8 --stages 2 --kernels _forward
    python benchmarks/kernel_resources.py --blocks 64 --kernels _scan_sums --scans 4x8 2x16   # rows x slots a step
    python benchmarks/kernel_resources.py --blocks 64 --warps 4 --stages 1 --instructions  # and the machine code's mix
    python benchmarks/kernel_resources.py --blocks 64 --warps 4 --stages 1 --registers 168 128  # spills under caps
    python benchmarks/kernel_resources.py --blocks 64 --warps 4 --stages 1 --causal --kernel-options MIN_TABLE_TILE=32

`--instructions` also disassembles each kernel (the nvdisasm beside that ptxas) and counts, in its machine code (SASS),
the instructions that say how Triton laid its work out: the tensor cores' products as warpgroup MMAs (HGMMA, sm90's
own) or warp MMAs (HMMA, mma.sync), warp shuffles (SHFL, reductions across a warp's lanes and gathers), barriers
(BAR, reductions across warps and layout changes through shared memory), special-function instructions (MUFU: exp,
log, reciprocal), the total, and the instructions of the longest loop's body (in the window kernels, one tile of a
window: what each warp issues again for every tile). These are counts of the code as written, not of what runs: a
loop's body counts once.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from common import kernel_options, parse_kernel_options


TILED = ("_forward", "_backward_queries", "_backward_keys")  # those taking KEY_TILE or KEY_BLOCK
KERNELS = ("_states", "_chunk_sums", "_scan_sums", "_scan_products", "_scan_recurrence", "_row_terms",
           "_states_backward", "_query_sums", "_forward", "_backward_queries", "_backward_keys")
SCANS = {"_scan_sums": ("SCAN_ROWS", "SCAN_SLOTS"), "_scan_products": ("PRODUCT_ROWS", "PRODUCT_SLOTS"),
         "_scan_recurrence": ("SCAN_ROWS", "RECURRENCE_SLOTS")}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
POINTERS = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--blocks", type=int, nargs="+", default=[32, 64], help="BLOCK sizes (default: 32 64)")
    parser.add_argument("--tiles", type=int, nargs="+", metavar="N",
                        help="keys per tile of `_forward`'s and `_backward_queries`' windows and per program of "
                             "`_backward_keys` (KEY_TILE and KEY_BLOCK, powers of two >= 16; default: theirs)")
    parser.add_argument("--scans", nargs="+", metavar="ROWSxSLOTS",
                        help="the scans' rows of the states per program and chunks' slots per step, e.g. 4x16 16x1 "
                             "(`_scan_sums`' SCAN_ROWS and SCAN_SLOTS, `_scan_products`' PRODUCT_ROWS and "
                             "PRODUCT_SLOTS, `_scan_recurrence`'s SCAN_ROWS and RECURRENCE_SLOTS; default: theirs)")
    parser.add_argument("--forward-scans", action="store_true",
                        help="the scans as forward runs them (the states, after folding the chunks before the first "
                             "query block, `_fold_prefix`) rather than as backward does (the states' gradients)")
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8], help="num_warps (default: 4 8)")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3], help="num_stages (default: 1 2 3)")
    parser.add_argument("--registers", type=int, nargs="+", metavar="N",
                        help="caps on registers per thread (Triton's maxnreg launch option; default: none)")
    parser.add_argument("--unaligned", action="store_true",
                        help="compile without marking pointers aligned and integers multiples of 16 (see above)")
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64, help="D, the queries' and keys' head dimension")
    parser.add_argument("--value-dim", type=int, default=64, help="Dv, the values' head dimension")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="the inputs' dtype (default: bf16)")
    parser.add_argument("--causal", action="store_true", help="the causal kernels (default: bidirectional)")
    parser.add_argument("--no-table", action="store_true",
                        help="the kernels without a relative table (HAS_TABLE false), as a configuration without one "
                             "takes them: what the table's products and gathers cost (default: with a table)")
    tails = parser.add_mutually_exclusive_group()
    tails.add_argument("--tail-tiles", nargs="+", choices=("_forward", "_backward_queries"), metavar="KERNEL",
                       help="the window kernels that end a window in a narrower last tile where it has one "
                            "(ops_local_softmax_triton.TAIL_TILES; default: the module's)")
    tails.add_argument("--whole-tiles", action="store_true",
                       help="every window in whole tiles (TAIL_TILES empty)")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90, 80 (default: 90)")
    parser.add_argument("--instructions", action="store_true",
                        help="also count instructions of the machine code by kind (see above)")
    parser.add_argument("--kernel-options", nargs="+", default=[], metavar="NAME=VALUE",
                        help="module options of ops_local_softmax_triton for the compiles, each VALUE a Python "
                             "literal, e.g. MIN_TABLE_TILE=32")
    args = parser.parse_args(argv)
    try:
        args.kernel_options = parse_kernel_options(args.kernel_options)
    except ValueError as error:
        parser.error(str(error))
    return args


OPCODES = ("HGMMA", "HMMA", "SHFL", "BAR", "MUFU")  # the kinds `--instructions` counts, beside the total
SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)\b")
SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
SASS_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def instruction_counts(sass: str) -> dict:
    """The count of each kind of `OPCODES` in nvdisasm's listing `sass`, the total of instructions, and the
    instructions of its longest loop's body ("loop": from a label to a branch back to it, 0 without a loop; not the
    branch to itself that ends every kernel): in the window kernels, what one tile of keys takes (in
    `_backward_keys`, one query block of a program's keys)."""
    opcodes, labels, loop = [], {}, 0
    for line in sass.splitlines():
        label = SASS_LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(opcodes)
            continue
        match = SASS_LINE.match(line)
        if match:
            opcodes.append(match.group(1))
            target = SASS_TARGET.search(line)
            start = labels.get(target.group(1)) if match.group(1) == "BRA" and target else None
            # a branch back to an earlier instruction: not one forward (its label is not read yet), nor one to
            # itself (the idle loop that ends every kernel's code)
            if start is not None and start < len(opcodes) - 1:
                loop = max(loop, len(opcodes) - start)
    return {**{kind: opcodes.count(kind) for kind in OPCODES}, "total": len(opcodes), "loop": loop}


def constexprs(kernels, name: str, args: argparse.Namespace) -> dict:
    """The compile-time arguments the host passes to kernel `name` (with a key mask, and a table unless --no-table)."""
    from modeling_scaleformer.ops_decay_triton import dot_precision

    dtype = DTYPES[args.dtype]
    sizes = kernels._sizes(args.horizon, args.dim, args.value_dim, args.causal)
    dot = dot_precision(torch.float32, half_inputs=dtype != torch.float32)
    walk = dict(HORIZON=args.horizon, HAS_MASK=True, BLOCK=sizes["BLOCK"], BLOCK_D=sizes["BLOCK_D"],
                BLOCK_V=sizes["BLOCK_V"], DOT=dot)
    if name in ("_states", "_chunk_sums"):
        return walk
    if name in SCANS:
        rows, slots = (getattr(kernels, option) for option in SCANS[name])
        scan = dict(BLOCK=sizes["BLOCK"], BLOCK_SD=rows, BLOCK_V=sizes["BLOCK_V"], SLOTS=slots,
                    FOLD=kernels.FOLD_SLOTS, REVERSE=not args.forward_scans)
        return dict(scan, DOT=dot_precision(torch.float32, half_inputs=False)) if name == "_scan_products" else scan
    if name == "_row_terms":
        return {key: walk[key] for key in ("BLOCK", "BLOCK_D", "BLOCK_V")}
    if name in ("_query_sums", "_states_backward"):
        fold = dict(FOLD=kernels.FOLD_SLOTS) if name == "_query_sums" else {}
        return {**{key: walk[key] for key in ("BLOCK", "BLOCK_D", "BLOCK_V", "DOT")}, **fold}
    pairs = {} if name == "_forward" else dict(STORED_PAIRS=kernels.STORED_PAIRS)
    if name == "_backward_keys":
        return dict(walk, CAUSAL=args.causal, HAS_TABLE=not args.no_table, **kernels._key_blocks(),
                    BLOCK_R=sizes["BLOCK_R"], **pairs)
    return dict(sizes, **kernels._window_tiles(name, args.horizon, args.causal), HORIZON=args.horizon,
                CAUSAL=args.causal, HAS_MASK=True, HAS_TABLE=not args.no_table, DOT=dot, **pairs)


def ptxas(arch: int):
    """The ptxas Triton assembles its kernels for sm`arch` with (`.path`, `.version`)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch)


def resources(kernel, dtype: torch.dtype, fixed: dict, options: dict, arch: int, instructions: bool = False,
              aligned: bool = True) -> tuple[int, int, int, int, dict | None]:
    """(registers, spill store bytes, spill load bytes, shared bytes, `instruction_counts` when `instructions`, else
    None) of `kernel` compiled for sm`arch`, its pointers and integer arguments marked multiples of 16 when
    `aligned`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from modeling_scaleformer.ops_local_softmax_triton import INPUT_POINTERS

    names = list(inspect.signature(kernel.fn).parameters)
    signature = {name: "constexpr" if name in fixed else
                 (POINTERS[dtype] if name in INPUT_POINTERS else "*fp32") if name.isupper() else
                 "fp32" if name == "scale" else "i32" for name in names}
    attrs = {(index,): [["tt.divisibility", 16]] for index, name in enumerate(names)
             if aligned and name not in fixed and name != "scale"}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in fixed.items()}, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.TemporaryDirectory() as scratch:
        ptx = os.path.join(scratch, "kernel.ptx")
        Path(ptx).write_text(compiled.asm["ptx"])
        cubin = os.path.join(scratch, "kernel.cubin")
        report = subprocess.run([ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{'a' if arch == 90 else ''}", ptx, "-o",
                                 cubin], capture_output=True, text=True, check=True)
        counts = None
        if instructions:
            nvdisasm = Path(ptxas(arch).path).with_name("nvdisasm")
            counts = instruction_counts(subprocess.run([str(nvdisasm), "-c", cubin], capture_output=True, text=True,
                                                       check=True).stdout)
    registers = int(re.search(r"Used (\d+) registers", report.stderr).group(1))
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report.stderr)
    return registers, int(spills.group(1)), int(spills.group(2)), compiled.metadata.shared, counts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with kernel_options(args.kernel_options):
        return report_resources(args)


def report_resources(args: argparse.Namespace) -> int:
    """The table of every kernel and launch setting that `args` asks for."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    chosen = kernels.BLOCK, kernels.KEY_TILE, kernels.KEY_BLOCK
    chosen_scans = {name: tuple(getattr(kernels, option) for option in options) for name, options in SCANS.items()}
    chosen_tails = kernels.TAIL_TILES
    if args.tail_tiles or args.whole_tiles:
        kernels.TAIL_TILES = tuple(args.tail_tiles or ())
    tail_tiles = ", ".join(kernels.TAIL_TILES) or "none"
    direction = "causal" if args.causal else "bidirectional"
    import triton

    scans = "forward" if args.forward_scans else "in reverse"
    print(f"# Triton kernels of the default attention: Triton {triton.__version__}, ptxas {ptxas(args.arch).version} "
          f"-v for sm_{args.arch}, {args.dtype}, {direction}, h={args.horizon}, D={args.dim}, Dv={args.value_dim}, "
          f"the scans {scans}, "
          f"{'no argument marked' if args.unaligned else 'pointers and integers marked'} multiples of 16"
          f", a window's narrower last tile in: {tail_tiles}"
          f"{', without a relative table' if args.no_table else ''}"
          + "".join(f", {name} = {value!r}" for name, value in args.kernel_options.items()) + "\n")
    counted = "".join(f" {kind} |" for kind in (*OPCODES, "instructions", "loop body")) if args.instructions else ""
    print("| kernel | BLOCK | key tile or scan | warps | stages | register cap | registers | spill stores / loads "
          f"(bytes) | shared (bytes) |{counted}")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(OPCODES) + 2) * args.instructions)
    tiles = args.tiles or [kernels.KEY_TILE]
    scan_names = {name: "{}x{}".format(*chosen) for name, chosen in chosen_scans.items()}
    try:
        for name in args.kernels:
            for block, tile in itertools.product(args.blocks, tiles if name in TILED else
                                                 args.scans or [scan_names[name]] if name in SCANS else [None]):
                kernels.BLOCK = block
                if name in SCANS:
                    for option, value in zip(SCANS[name], map(int, tile.split("x"))):
                        setattr(kernels, option, value)
                elif tile is not None:
                    kernels.KEY_TILE = kernels.KEY_BLOCK = tile
                fixed = constexprs(kernels, name, args)
                for warps, stages, cap in itertools.product(args.warps, args.stages, args.registers or [None]):
                    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": cap} if cap else {})}
                    registers, stores, loads, shared, counts = resources(
                        getattr(kernels, name), DTYPES[args.dtype], fixed, options, args.arch, args.instructions,
                        not args.unaligned)
                    launch = {"num_warps": 4, "num_stages": 3, **kernels._launch(name, args.dim, args.value_dim)}
                    chosen_tile = (chosen[2] if name == "_backward_keys" else scan_names[name]
                                   if name in SCANS else chosen[1])
                    used = block == chosen[0] and tile in (None, chosen_tile)
                    mark = " *" if used and launch == options else ""
                    counted = "".join(f" {counts[kind]:,} |" for kind in (*OPCODES, "total", "loop")) if counts else ""
                    print(f"| {name}{mark} | {block} | {tile or '-'} | {warps} | {stages} | {cap or '-'} | "
                          f"{registers} | {stores} / {loads} | {shared:,} |{counted}", flush=True)
    finally:
        kernels.BLOCK, kernels.KEY_TILE, kernels.KEY_BLOCK = chosen
        for name, values in chosen_scans.items():
            for option, value in zip(SCANS[name], values):
                setattr(kernels, option, value)
        kernels.TAIL_TILES = chosen_tails
    return 0


if __name__ == "__main__":
    sys.exit(main())
