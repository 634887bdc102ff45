"""What one training step and greedy decoding ask of the host on CUDA, counted on CPU: the operations they dispatch
and the kernels they launch, Scaleformer beside BART of the same size.

At batch 1 a training step's eager time on a GPU is the host's: Python and PyTorch's dispatcher issue one operation
after another faster than the device runs them only while there are few of them (on one H100 the small model's eager
step at 16k took 0.103 s, all of it host time, against 0.026 s under CUDA graphs, benchmarks/README.md). What sets
the host's time is how many operations a step dispatches and how many kernels it launches, which this script counts
without a GPU.

How: each model of `--models` (default `scaleformer bart`; the names of `models.py`) at the small size (d_model 512,
6 + 6 layers, 8 heads; `--quick`: a tiny one) takes one training step, forward with labels under bf16 autocast
(`--fp32`: without) and backward, on random ids of `--length` source tokens (default 1024: the counts do not depend
on the length once the default attention takes its linear path, nor does BART's one attention call a layer) and 128
target tokens, after one step that is not counted. The optimizer's step is left out: AdamW runs a few multi-tensor
kernels on CUDA and one loop per parameter on CPU. The step runs as on CUDA where the two differ: the default
attention takes its Triton kernels (`ops_local_softmax_triton`), which are recorded and not run (their outputs stay as
allocated, so the loss means nothing), and the value checks that only CPU makes are skipped
(`ops_common.checks_values`); the model's other device-dependent branches (the count block's grouping of token ids)
take CPU's. Every ATen operation below autograd is counted (a `TorchDispatchMode`; the attention keeps its eager path,
which the mode would otherwise turn into the traced one), as one that launches a kernel on CUDA (it computes or writes:
a product, a reduction, a cast, a copy, a fill) or one that does not (a view, an allocation, a dtype query), by phase
(forward, backward), and apart for the ones the default attention's op issues itself (its calls, from
`ops_local_softmax*.py`); a Triton launch counts as a kernel of its own. Then the model decodes DECODED tokens
greedily from the same source (eval mode, its cache; the decoding steps' kernels chosen as on CUDA too), and the
operations and launches of each call of the model are counted: the first (the encoder and the first token) and the
median of the others, one token each, which at batch 1 set the time per token on a GPU as the step's set its time.

The step's sequential passes over the states' chunks (the walks, `_states` and `_states_backward`, or the parallel
passes' scans, `_scan_sums`, `_scan_products`, `_scan_recurrence`) are counted too: for each launch, the chunks' slots
that each direction's pass goes through one after another, of those the ones whose states a query block reads (the
blocks' own, nq of them; the others only carry their sums on to them), and the slots that a scan folds at once
before them (the chunks before the first query block, `ops_local_softmax_triton._fold_prefix`). A pass takes its time
by the slots it goes through, and on a GPU at batch 1 it is bound by their latency (benchmarks/README.md).

    python benchmarks/bench_dispatch.py                       # scaleformer and bart, the small size, bf16 autocast
    python benchmarks/bench_dispatch.py --models scaleformer bart led --json dispatch.json
    python benchmarks/bench_dispatch.py --quick               # the tiny size: a smoke test

The counts are exact for the step as it runs on CPU; on CUDA the same step dispatches the same operations but for the
device-dependent branches above and autocast's rules, which differ slightly between the two devices.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import choose_kernels_as_on_cuda
from models import (
    ALL_BASELINES, MODEL_SIZE, TRAIN_MODEL_NAMES, ModelSize, add_models_argument, build_model, check_models,
    model_configs,
)


TARGET_LENGTH = 128
DECODED = 8  # tokens generated greedily after the training step: the first call and 7 steps of one token
QUICK_SIZE = ModelSize(vocab_size=1000, d_model=64, layers=2, heads=4, ffn_dim=128)
ALLOCATIONS = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}
NO_KERNEL = ALLOCATIONS | {"promote_types", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "is_same_size"}
ATTENTION_FILES = ("ops_local_softmax.py", "ops_local_softmax_triton.py")
# the kernels that pass over the states' chunks one slot (or one step of slots) after another
SEQUENTIAL_PASSES = ("_states", "_states_backward", "_scan_sums", "_scan_products", "_scan_recurrence")
SCANS = SEQUENTIAL_PASSES[2:]  # the parallel passes' scans, which fold the chunks before the first query block
PHASES = ("forward", "backward")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_models_argument(parser, ALL_BASELINES)
    parser.add_argument("--length", type=int, default=1024, help="source tokens (default: 1024)")
    parser.add_argument("--fp32", action="store_true", help="without bf16 autocast")
    parser.add_argument("--quick", action="store_true", help="a tiny model (d_model 64, 2 + 2 layers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the counts to PATH")
    args = parser.parse_args(argv)
    args.models = check_models(parser, args.models, TRAIN_MODEL_NAMES)
    if args.length < 1:
        parser.error(f"--length must be at least 1, got {args.length}")
    return args


def launches_kernel(func) -> bool:
    """Whether ATen operation `func` launches a kernel on CUDA: not a view (`is_view`: views, detach, aliases) nor an
    allocation or a query of metadata."""
    return not func.is_view and func.overloadpacket.__name__ not in NO_KERNEL


def issued_by_attention() -> bool:
    """Whether the operation being dispatched comes from the default attention's op (a frame of its files)."""
    return any(Path(frame.filename).name in ATTENTION_FILES and "modeling_scaleformer" in frame.filename
               for frame in traceback.extract_stack())


class Counter(TorchDispatchMode):
    """Counts each ATen operation by (phase, origin, launches a kernel); `phase` is set by the caller."""

    def __init__(self):
        super().__init__()
        self.phase = PHASES[0]
        self.counts = collections.Counter()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        origin = "attention" if issued_by_attention() else "model"
        self.counts[self.phase, origin, launches_kernel(func)] += 1
        self.names[self.phase, origin, func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def emulate_cuda(launches: collections.Counter) -> None:
    """The step as on CUDA (module docstring): the default attention's kernels, and the decoding steps', chosen and
    recorded in `launches` (by phase, `launches.phase`, and kernel), not run; the CPU-only value checks skipped; the
    attention's eager path kept under the counting mode."""
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: the kernels as interpreted functions
    from triton.runtime.interpreter import InterpretedFunction

    from modeling_scaleformer import modeling_scaleformer, ops_common, ops_decay, ops_local_softmax_triton

    def run(self, *args, grid, warmup, **options):
        name = self.fn.__name__
        launches[f"{launches.phase} {name}"] += 1
        if name in SEQUENTIAL_PASSES:
            bound = inspect.signature(self.fn).bind_partial(*args).arguments
            nq, starts = bound["nq"], (bound["start0"], bound["start1"])[:grid[1]]  # grid: (rows, directions[, parts])
            if name in SCANS:  # the chunks before the first query block folded, or left (`_scan_extent`)
                extents = [ops_local_softmax_triton._scan_extent(nq, start, options["REVERSE"]) for start in starts]
            elif name == "_states_backward":  # back to G_0, the slot before block 0, whatever FOLD_SLOTS
                extents = [(nq + (start < 0), 0) for start in starts]
            else:
                extents = [(nq - start, 0) for start in starts]
            launches.passes.append({"phase": launches.phase, "kernel": name, "read": nq,
                                    "slots": [slots for slots, _ in extents],
                                    "folded": [folded for _, folded in extents]})

    InterpretedFunction.run = run
    choose_kernels_as_on_cuda()
    for module in (ops_common, ops_decay, modeling_scaleformer):
        module.checks_values = lambda t: False
    ops_local_softmax_triton._traced = torch.compiler.is_compiling


class Launches(collections.Counter):
    """Triton launches by phase and kernel, and the sequential passes (`SEQUENTIAL_PASSES`) in `passes`."""
    phase = PHASES[0]

    def __init__(self):
        super().__init__()
        self.passes = []

    def clear(self):
        super().clear()
        self.passes = []


def pass_counts(passes: list[dict]) -> dict:
    """The step's sequential passes: how many launches, the slots they go through one after another (a launch's
    longest direction, its programs running side by side), the slots that query blocks read, the slots the scans fold
    before them (a launch's most), and the launches of 64 slots or more with how many of their slots are read."""
    long = [p for p in passes if max(p["slots"]) >= 64]
    return {"pass_launches": len(passes), "pass_slots": sum(max(p["slots"]) for p in passes),
            "pass_slots_read": sum(p["read"] for p in passes),
            "pass_slots_folded": sum(max(p["folded"]) for p in passes), "long_passes": len(long),
            "long_pass_slots": sum(max(p["slots"]) for p in long),
            "long_pass_slots_read": sum(p["read"] for p in long)}


def count_step(name: str, args: argparse.Namespace, launches: Launches) -> dict:
    """One training step of model `name`, counted (after one that is not)."""
    size = QUICK_SIZE if args.quick else MODEL_SIZE
    model = build_model(name, model_configs(size, max(args.length, TARGET_LENGTH), [name])[name], args.seed).train()
    generator = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(4, size.vocab_size, (1, args.length), generator=generator)
    labels = torch.randint(4, size.vocab_size, (1, TARGET_LENGTH), generator=generator)
    counter = Counter()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.fp32):
            counter.phase = launches.phase = "forward"
            loss = model(input_ids=input_ids, labels=labels, use_cache=False).loss
        counter.phase = launches.phase = "backward"
        loss.backward()

    step()
    launches.clear()
    with counter:
        step()
    row = {"model": name, "launches": dict(sorted(launches.items()))}
    for phase in PHASES:
        for origin in ("model", "attention"):
            row[f"{phase}_{origin}_kernels"] = counter.counts[phase, origin, True]
            row[f"{phase}_{origin}_other"] = counter.counts[phase, origin, False]
        row[f"{phase}_triton"] = sum(n for key, n in launches.items() if key.startswith(phase))
    row["operations"] = sum(counter.counts.values())
    row["kernels"] = sum(n for (_, _, kernel), n in counter.counts.items() if kernel) + sum(launches.values())
    row["top"] = [[*key, n] for key, n in counter.names.most_common(12)]
    row["passes"] = list(launches.passes)  # the step's, before decoding adds its own
    row.update(pass_counts(row["passes"]))
    return {**row, **count_decoding(model, input_ids, args, launches)}


def count_decoding(model, input_ids, args: argparse.Namespace, launches: Launches) -> dict:
    """Greedy decoding of DECODED tokens from `input_ids` (eval mode, the model's cache): the operations and Triton
    launches of each call of the model, the first (the encoder and the first token) and the median of the others (one
    token each)."""
    model.eval()
    counter = Counter()
    counter.phase = launches.phase = "decode"
    calls = []
    forward = model.forward

    def counted(*inputs, **kwargs):
        before = sum(counter.counts.values()), sum(launches.values())
        output = forward(*inputs, **kwargs)
        calls.append((sum(counter.counts.values()) - before[0], sum(launches.values()) - before[1]))
        return output

    model.forward = counted
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.fp32), counter:
            model.generate(input_ids=input_ids, max_new_tokens=DECODED, min_new_tokens=DECODED, do_sample=False,
                           num_beams=1)
    finally:
        del model.forward
    steps = sorted(calls[1:])
    return {"decode_first_operations": calls[0][0], "decode_first_launches": calls[0][1],
            "decode_operations": steps[len(steps) // 2][0], "decode_launches": steps[len(steps) // 2][1]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    launches = Launches()
    emulate_cuda(launches)
    rows = [count_step(name, args, launches) for name in args.models]
    print(f"# One training step at {args.length} source and {TARGET_LENGTH} target tokens, batch 1, "
          f"{'fp32' if args.fp32 else 'bf16 autocast'}, {'tiny' if args.quick else 'small'} size, as on CUDA; "
          f"torch {torch.__version__}\n")
    print("| model | operations | of which launch kernels | Triton launches | kernels in all | forward ops | "
          "backward ops | the attention op's ops (kernels) | against the first |")
    print("|:---|---:|---:|---:|---:|---:|---:|:---|---:|")
    for row in rows:
        kernels = sum(row[f"{p}_{o}_kernels"] for p in PHASES for o in ("model", "attention"))
        triton = sum(row[f"{p}_triton"] for p in PHASES)
        phase_ops = [sum(row[f"{p}_{o}_{k}"] for o in ("model", "attention") for k in ("kernels", "other"))
                     for p in PHASES]
        attention = sum(row[f"{p}_attention_{k}"] for p in PHASES for k in ("kernels", "other"))
        attention_kernels = sum(row[f"{p}_attention_kernels"] for p in PHASES)
        print(f"| {row['model']} | {row['operations']:,} | {kernels:,} | {triton:,} | {row['kernels']:,} | "
              f"{phase_ops[0]:,} | {phase_ops[1]:,} | {attention:,} ({attention_kernels:,}) | "
              f"{row['operations'] / rows[0]['operations']:.2f}x |")
    print("\n| model | operations per generated token | Triton launches per token | against the first | "
          "the first call (the encoder and the first token): operations, launches |")
    print("|:---|---:|---:|---:|:---|")
    for row in rows:
        print(f"| {row['model']} | {row['decode_operations']:,} | {row['decode_launches']} | "
              f"{row['decode_operations'] / rows[0]['decode_operations']:.2f}x | {row['decode_first_operations']:,}, "
              f"{row['decode_first_launches']} |")
    for row in rows:
        if row["launches"]:
            print(f"\n{row['model']}'s Triton launches by phase and kernel: "
                  + ", ".join(f"{key} {n}" for key, n in row["launches"].items()))
        if row["pass_launches"]:
            print(f"\n{row['model']}'s sequential passes over the states' chunks: {row['pass_launches']} launches "
                  f"through {row['pass_slots']:,} slots, {row['pass_slots_read']:,} of them read by query blocks "
                  f"(and {row['pass_slots_folded']:,} folded at once before them); {row['long_passes']} of 64 slots "
                  f"or more, through {row['long_pass_slots']:,} slots of which {row['long_pass_slots_read']:,} are "
                  f"read")
            shapes = collections.Counter((p["phase"], p["kernel"], tuple(p["slots"]), p["read"], tuple(p["folded"]))
                                         for p in row["passes"])
            print("\n| phase | kernel | slots by direction | read by query blocks | folded by direction | launches |")
            print("|:---|:---|:---|---:|:---|---:|")
            for (phase, kernel, slots, read, folded), n in sorted(shapes.items()):
                print(f"| {phase} | {kernel} | {', '.join(f'{x:,}' for x in slots)} | {read:,} | "
                      f"{', '.join(f'{x:,}' for x in folded)} | {n} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "bench_dispatch", "length": args.length,
                                         "bf16": not args.fp32, "quick": args.quick, "torch": torch.__version__,
                                         "models": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
