"""How many times Triton compiles each kernel of the default attention in a training run: once per specialisation.

Triton compiles a kernel again for each new specialisation of its arguments: the constexprs and launch options, each
tensor's dtype and whether its address is a multiple of 16 bytes, and each integer argument as 1, a multiple of 16 or
neither (unless the kernel marks it `do_not_specialize`). Lengths that vary from batch to batch (Lq, Lk, the number of
blocks) make new specialisations as a run goes on, each a compile of some seconds on a GPU, once per machine (Triton
caches them on disk). This script runs `examples/train_accelerate.py` on CPU with the attention's kernels chosen as on
CUDA but not executed, their outputs left as allocated (so the run's losses mean nothing), records each launch's
specialisation as Triton forms it, and counts the distinct ones per kernel, beside the count the same launches would
give if the integer arguments that follow the batch's lengths (`ops_local_softmax_triton.LENGTH_ARGUMENTS`) were not
specialised. No GPU is needed: the kernels are Triton's
interpreted functions here, which this script never runs.

    python benchmarks/kernel_specialisations.py -- --model_config configs/scaleformer-small.json --max_steps 30 \\
        --per_device_batch_size 16 --max_train_examples 2000 --eval_steps 30 --eval_examples 64 --logging_steps 10 \\
        --output_dir /tmp/specialisations
    python benchmarks/kernel_specialisations.py --quick
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

import torch

from common import choose_kernels_as_on_cuda


ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--model_config", str(ROOT / "configs/scaleformer-tiny.json"), "--max_steps", "2", "--per_device_batch_size",
         "4", "--max_train_examples", "64", "--eval_steps", "2", "--eval_examples", "4", "--logging_steps", "1"]


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 steps of 4 examples, 4 evaluated")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the counts to PATH")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    training = argv[split + 1:]
    if args.quick and training:
        parser.error("--quick takes no arguments for the training run")
    if not args.quick and not training:
        parser.error("give the training run's arguments after --, or --quick")
    return args, training


def specialisation(value) -> object:
    """What Triton's specialisation keeps of one argument."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return "1" if value == 1 else "multiple of 16" if value % 16 == 0 else "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, torch.Tensor):
        return str(value.dtype), value.data_ptr() % 16 == 0
    return repr(value)


class Recorder:
    """Each launch's specialisation per kernel, and the same with the integer arguments of `lengths` unspecialised."""

    def __init__(self, lengths: tuple[str, ...]):
        self.lengths = lengths
        self.launches = collections.Counter()
        self.keys = collections.defaultdict(set)
        self.without_lengths = collections.defaultdict(set)
        self.varying = collections.defaultdict(lambda: collections.defaultdict(set))

    def record(self, name: str, arg_names: list[str], args: tuple, options: dict) -> None:
        self.launches[name] += 1
        key = tuple((arg, specialisation(value)) for arg, value in zip(arg_names, args))
        key += tuple(sorted((option, repr(value)) for option, value in options.items()))
        self.keys[name].add(key)
        self.without_lengths[name].add(tuple((arg, "any" if arg in self.lengths else kept) for arg, kept in key))
        for arg, value in zip(arg_names, args):
            if isinstance(value, int) and not isinstance(value, bool):
                self.varying[name][arg].add(specialisation(value))

    def report(self) -> dict:
        return {name: {"launches": self.launches[name], "specialisations": len(self.keys[name]),
                       "without_lengths": len(self.without_lengths[name]),
                       "varying": {arg: sorted(kinds) for arg, kinds in self.varying[name].items() if len(kinds) > 1}}
                for name in sorted(self.launches)}


def record_launches(recorder: Recorder) -> None:
    """Every interpreted kernel's launch recorded, not run; the default attention's kernels chosen as on CUDA."""
    from triton.runtime.interpreter import InterpretedFunction

    def run(self, *args, grid, warmup, **options):
        recorder.record(self.fn.__name__, self.arg_names, args, options)

    InterpretedFunction.run = run
    choose_kernels_as_on_cuda()


def main(argv: list[str] | None = None) -> int:
    args, training = parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: the kernels as interpreted functions
    from modeling_scaleformer.ops_local_softmax_triton import LENGTH_ARGUMENTS

    recorder = Recorder(LENGTH_ARGUMENTS)
    record_launches(recorder)
    with tempfile.TemporaryDirectory() as scratch:
        sys.argv = ["train_accelerate.py", *(training or [*QUICK, "--output_dir", scratch])]
        runpy.run_path(str(ROOT / "examples" / "train_accelerate.py"), run_name="__main__")
    report = recorder.report()
    print(f"\n| kernel | launches | specialisations (compiles) | with {', '.join(LENGTH_ARGUMENTS)} unspecialised | "
          "integer arguments seen as more than one kind |")
    print("|:---|---:|---:|---:|:---|")
    for name, row in report.items():
        varying = "; ".join(f"{arg}: {', '.join(kinds)}" for arg, kinds in row["varying"].items()) or "-"
        print(f"| {name} | {row['launches']:,} | {row['specialisations']} | {row['without_lengths']} | {varying} |")
    total = sum(row["specialisations"] for row in report.values())
    print(f"\n{total} compiles in all; {sum(row['without_lengths'] for row in report.values())} with the lengths "
          "unspecialised.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "kernel_specialisations", "training": training or QUICK,
                                         "torch": torch.__version__, "lengths": LENGTH_ARGUMENTS, "kernels": report},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
