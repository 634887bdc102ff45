"""Long-range reasoning on ListOps: test accuracy of a small encoder-only classifier per attention_type.

What is measured: `ScaleformerForSequenceClassification` (the bidirectional encoder, a masked mean over
the sequence and a linear head over the 10 labels) is trained from scratch on ListOps once per
`--attention_types` entry and `--seed`, every model at the same width and depth. The defaults, sized
for a CPU, are d_model 64, 2 layers, 4 heads, FFN 128, rpe_horizon 16 (for the relative variants),
dropout 0.1, fp32. `softmax` is plain quadratic softmax attention, the "Transformer" of Long Range
Arena at our size; `kernelized` is linear attention with the elu+1 feature map (LRA's "Linear
Transformer"); `kernelized_rpe` adds clipped relative positions.

Data: `generate_listops` of `benchmarks/listops.py` (LRA's generation process), train, valid and test
drawn in one call with `--data_seed`, so that no source is in two splits; tokens are the 16 ids of
its `tokenize` (no BPE). The data do not depend on `--seed`, which sets the initial weights, dropout
and the order of the training batches.

How: training batches are drawn without sorting, consecutive slices of a fresh random permutation of
the training set per epoch, padded to their longest source (the model masks padding out of attention
and of the mean). AdamW (`--lr`, `--weight_decay`) with gradients clipped to norm 1.0 and a learning
rate that rises linearly over `--warmup_steps` and falls linearly to 0 as the budget runs out: the
decay follows whichever of `--max_steps` and `--minutes` is nearer to its end, so a run stopped by the
clock also ends at 0. `--minutes` is the budget of training time per model (steps, including
batching and the optimizer; evaluation excluded); `--max_steps` stops earlier if it is reached. Valid
accuracy is measured before the first step, every `--eval_every` steps and after the last one; the
weights of the best one (the earliest on a tie) are kept in memory, and their test accuracy is the
result. The majority-class baseline is the most common training label (the smaller on a tie) and its
accuracy on valid and test. Published figures of LRA (Tay et al. 2021, Table 1) are printed beside
ours for orientation only: they come from models 8 times wider and 2 times deeper than the defaults
here, trained on 48 times more distinct examples and for many more steps.

Runs accumulate: with `--json PATH`, the (attention_type, seed) runs already in PATH are skipped
(unless `--overwrite`), each finished run is merged into PATH at once, and the tables and the plot
cover every run in the file. A file made with other data, model or training settings is refused, so
that one table never mixes them. Long runs can thus be done one model at a time, across sessions:

    python benchmarks/bench_listops.py --attention_types kernelized_rpe --seed 0 --json listops.json
    python benchmarks/bench_listops.py --attention_types softmax --seed 0 --json listops.json --plot listops.png

Run from the repository root with the package installed (`pip install -e ".[bench]"`) or with
`PYTHONPATH=.` in front of the command:

    python benchmarks/bench_listops.py                  # 3 types x 20 min of training, ~1 h 10 min
    python benchmarks/bench_listops.py --quick          # smoke test: tiny data and models, < 1 min
    python benchmarks/bench_listops.py --attention_types kernelized_rpe softmax --minutes 2 --train 500 \\
        --min_length 200 --max_length 500 --json listops.json --plot listops.png

The full LRA setting (96k/2k/2k examples of 500-2000 tokens, d_model 512, 4 layers, 8 heads, FFN
1024, batch 32, 5k steps, LRA's 1000 warm-up steps) needs a GPU; `--device` takes any `torch.device`:

    python benchmarks/bench_listops.py --device cuda --train 96000 --valid 2000 --test 2000 \\
        --min_length 500 --max_length 2000 --d_model 512 --layers 4 --heads 8 --ffn_dim 1024 \\
        --batch_size 32 --max_steps 5000 --minutes 0 --warmup_steps 1000 --eval_every 500 \\
        --json listops_lra.json --plot listops_lra.png

Generating 100k examples of that length takes about 3 minutes of one CPU core. The machines the CPU
defaults were written for are shared 2-core CPUs, on which 2 torch threads can collapse when another
job runs (a `kernelized_rpe` step was seen to take 25 times longer with 2 threads than with 1), so
`--threads` defaults to 1; compare times only within one machine and `--threads`, and read the load
average printed per run.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import sys
import time
from operator import itemgetter
from pathlib import Path

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from common import (
    GRAD_CLIP, RunFile, add_run_file_arguments, budget_text, load_summary, machine_info, optimizer_step,
    parse_device, print_machine, pyplot, save_figure, start_report,
)
from listops import LISTOPS_VOCAB, NUM_LABELS, PAD_ID, generate_listops, tokenize  # the ListOps data module
from modeling_scaleformer import ScaleformerConfig, ScaleformerForSequenceClassification
from modeling_scaleformer.ops_registry import ATTENTION_TYPES


BENCHMARK = "bench_listops"
SPLITS = ("train", "valid", "test")
MAX_DEPTH = 10  # LRA's tree depth and arguments per operator
MAX_ARGS = 10

DEFAULTS = dict(
    attention_types=["kernelized_rpe", "kernelized", "softmax"],
    train=2000, valid=200, test=200, min_length=500, max_length=2000,
    d_model=64, layers=2, heads=4, ffn_dim=128, rpe_horizon=16, dropout=0.1,
    batch_size=16, lr=1e-3, weight_decay=0.01, warmup_steps=50, minutes=20.0, max_steps=None, eval_every=50,
)
QUICK = dict(
    attention_types=["kernelized_rpe", "softmax"],
    train=64, valid=32, test=32, min_length=50, max_length=150,
    d_model=32, layers=1, heads=2, ffn_dim=64, rpe_horizon=8, dropout=0.1,
    batch_size=8, lr=1e-3, weight_decay=0.01, warmup_steps=4, minutes=1.0, max_steps=16, eval_every=8,
)
# what a run's result depends on, apart from attention_type and seed: runs in one file must agree on all
SETTING_KEYS = ("train", "valid", "test", "min_length", "max_length", "data_seed", "d_model", "layers", "heads",
                "ffn_dim", "rpe_horizon", "dropout", "batch_size", "lr", "weight_decay", "warmup_steps", "minutes",
                "max_steps", "eval_every", "device")
run_key = itemgetter("attention_type", "seed")  # what identifies a run of the --json file

REFERENCE_SOURCE = ('Tay et al. 2021, "Long Range Arena: A Benchmark for Efficient Transformers" (ICLR 2021), '
                    "Table 1, ListOps test accuracy")
# LRA model -> (test accuracy, our attention_type of the same kind or None)
REFERENCES = {
    "Transformer": (0.3637, "softmax"),
    "Linear Transformer": (0.1613, "kernelized"),
    "Performer": (0.1801, None),
}
LRA_VALUES = dict(train=96000, valid=2000, test=2000, min_length=500, max_length=2000, d_model=512, layers=4, heads=8,
                  ffn_dim=1024, batch_size=32, warmup_steps=1000, max_steps=5000)  # LRA's setting, for --help
LRA_SIZE = (512, 4, 8, 1024, 96000, 32)  # d_model, layers, heads, FFN, training examples, batch
LRA_SETTING = ("96k training examples of 500-2000 tokens, d_model 512, 4 layers, 8 heads, FFN 1024, batch 32, "
               "5k steps, on accelerators")


class Split:
    """Token ids (one tensor per example) and labels of one split."""

    def __init__(self, examples: list[dict]):
        self.ids = [torch.tensor(tokenize(e["source"]), dtype=torch.long) for e in examples]
        self.labels = torch.tensor([e["target"] for e in examples], dtype=torch.long)
        self.lengths = [len(x) for x in self.ids]

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, indices: list[int], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(input_ids, attention_mask, labels), padded to the longest source of the batch."""
        input_ids = pad_sequence([self.ids[i] for i in indices], batch_first=True, padding_value=PAD_ID)
        attention_mask = (input_ids != PAD_ID).long()  # sources never hold the padding id
        return input_ids.to(device), attention_mask.to(device), self.labels[indices].to(device)


def add_preset_flags(group, *flags: tuple[str, type, str]) -> None:
    """Flags (name, type, help) whose default, None, is filled from DEFAULTS or QUICK; their help gives DEFAULTS'
    value and LRA's."""
    for name, kind, text in flags:
        default = "none" if DEFAULTS[name] is None else f"{DEFAULTS[name]:g}"
        lra = f"; LRA: {LRA_VALUES[name]}" if name in LRA_VALUES else ""
        group.add_argument(f"--{name}", type=kind, help=f"{text} (default: {default}{lra})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train ScaleformerForSequenceClassification on ListOps per attention_type and seed; report "
        "test accuracy against the majority class and LRA's published figures.",
    )
    parser.add_argument("--attention_types", nargs="+", choices=ATTENTION_TYPES, metavar="TYPE",
                        help=f"attention_type of each model, from {', '.join(ATTENTION_TYPES)} (default: "
                        f"{' '.join(DEFAULTS['attention_types'])}; --quick: {' '.join(QUICK['attention_types'])})")
    parser.add_argument("--seed", type=int, nargs="+", default=[0], metavar="S",
                        help="seeds of the weights, dropout and batch order; one run per type and seed (default: 0)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: tiny data and models, a few steps; explicit flags still apply")
    data = parser.add_argument_group("data (benchmarks/listops.py)")
    add_preset_flags(data, ("train", int, "training examples"), ("valid", int, "validation examples"),
                     ("test", int, "test examples"), ("min_length", int, "fewest tokens, inclusive"),
                     ("max_length", int, "most tokens, inclusive"))
    data.add_argument("--data_seed", type=int, default=0, help="seed of the generator (default: 0)")
    add_preset_flags(parser.add_argument_group("model (the same for every attention_type)"),
                     ("d_model", int, "width"), ("layers", int, "encoder layers"), ("heads", int, "attention heads"),
                     ("ffn_dim", int, "feed-forward width"), ("rpe_horizon", int, "horizon of the relative variants"),
                     ("dropout", float, "dropout"))
    add_preset_flags(parser.add_argument_group("training"),
                     ("batch_size", int, "examples per step"), ("lr", float, "peak AdamW learning rate"),
                     ("weight_decay", float, "AdamW weight decay"), ("warmup_steps", int, "steps of linear warm-up"),
                     ("minutes", float, "training-time budget per model in minutes, 0 for none"),
                     ("max_steps", int, "stop after this many steps"),
                     ("eval_every", int, "steps between valid evaluations"))
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default: cpu)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads on CPU (default: 1; see the module docstring)")
    add_run_file_arguments(
        parser, plot_help="write a PNG of valid accuracy against training seconds, one curve per run, to PATH",
        overwrite_help="run (type, seed) pairs already in --json again")
    args = parser.parse_args(argv)

    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.attention_types = list(dict.fromkeys(args.attention_types))
    args.seed = list(dict.fromkeys(args.seed))
    positive = ("train", "valid", "test", "min_length", "d_model", "layers", "heads", "ffn_dim", "batch_size",
                "eval_every", "threads")
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.max_length < args.min_length:
        parser.error(f"--max_length must be >= --min_length ({args.min_length}), got {args.max_length}")
    if args.d_model % args.heads:
        parser.error(f"--heads must divide --d_model ({args.d_model}), got {args.heads}")
    for name in ("rpe_horizon", "warmup_steps", "minutes"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0, got {getattr(args, name)}")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.lr <= 0 or args.weight_decay < 0:
        parser.error(f"--lr must be > 0 and --weight_decay >= 0, got {args.lr} and {args.weight_decay}")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error(f"--max_steps must be at least 1, got {args.max_steps}")
    if args.minutes == 0 and args.max_steps is None:
        parser.error("--minutes 0 (no time budget) needs --max_steps")
    args.device = parse_device(parser, args.device)
    return args


def settings_of(args: argparse.Namespace) -> dict:
    settings = {key: getattr(args, key) for key in SETTING_KEYS}
    settings["device"] = args.device.type
    return settings


def make_data(args: argparse.Namespace) -> tuple[dict[str, Split], dict, float]:
    """The three splits, drawn in one call (so no source is in two), and the majority-class baseline."""
    sizes = {name: getattr(args, name) for name in SPLITS}
    start = time.perf_counter()
    examples = generate_listops(sum(sizes.values()), seed=args.data_seed, min_length=args.min_length,
                                max_length=args.max_length, max_depth=MAX_DEPTH, max_args=MAX_ARGS)
    seconds = time.perf_counter() - start
    splits, offset = {}, 0
    for name, size in sizes.items():
        splits[name], offset = Split(examples[offset:offset + size]), offset + size
    counts = collections.Counter(splits["train"].labels.tolist())
    label = min(counts, key=lambda d: (-counts[d], d))
    # count / size in Python floats, as `accuracy` computes, so that equal counts compare equal
    majority = {"label": label, "train_rate": counts[label] / len(splits["train"])}
    for name in ("valid", "test"):
        majority[f"{name}_accuracy"] = int((splits[name].labels == label).sum()) / len(splits[name])
    return splits, majority, seconds


def describe_splits(splits: dict[str, Split]) -> dict:
    return {name: {"examples": len(s), "length_min": min(s.lengths), "length_mean": statistics.fmean(s.lengths),
                   "length_max": max(s.lengths),
                   "label_counts": torch.bincount(s.labels, minlength=NUM_LABELS).tolist()}
            for name, s in splits.items()}


def build_model(attention_type: str, seed: int, args: argparse.Namespace) -> ScaleformerForSequenceClassification:
    config = ScaleformerConfig(
        vocab_size=len(LISTOPS_VOCAB), d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim, dropout=args.dropout, rpe_horizon=args.rpe_horizon,
        attention_type=attention_type, num_labels=NUM_LABELS, pad_token_id=PAD_ID, use_cache=False,
    )
    torch.manual_seed(seed)
    return ScaleformerForSequenceClassification(config).to(args.device)


def training_batches(n: int, batch_size: int, seed: int):
    """Endless batches of indices: consecutive slices of one random permutation of range(n) per epoch."""
    g = torch.Generator().manual_seed(seed)
    pending: list[int] = []
    while True:
        while len(pending) < batch_size:
            pending += torch.randperm(n, generator=g).tolist()
        yield pending[:batch_size]
        pending = pending[batch_size:]


@torch.no_grad()
def accuracy(model: ScaleformerForSequenceClassification, split: Split, batch_size: int,
             device: torch.device) -> float:
    """Share of `split` whose argmax logit is the label; batches of similar length (padding only costs time)."""
    model.eval()
    order = sorted(range(len(split)), key=split.lengths.__getitem__)
    correct = 0
    for start in range(0, len(order), batch_size):
        input_ids, attention_mask, labels = split.batch(order[start:start + batch_size], device)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        correct += int((logits.argmax(-1) == labels).sum())
    model.train()
    return correct / len(split)


def learning_rate(step: int, train_seconds: float, args: argparse.Namespace) -> float:
    """Linear warm-up over `warmup_steps`, times a linear decay to 0 at the end of the nearer budget."""
    warmup = min(1.0, (step + 1) / args.warmup_steps) if args.warmup_steps else 1.0
    progress = 0.0
    if args.max_steps is not None:
        progress = step / args.max_steps
    if args.minutes > 0:
        progress = max(progress, train_seconds / (60 * args.minutes))
    return args.lr * warmup * max(0.0, 1.0 - progress)


def train_one(attention_type: str, seed: int, splits: dict[str, Split], args: argparse.Namespace) -> dict:
    """Train one model within the budget; the test accuracy of its best-valid weights, and its valid curve."""
    info = machine_info(torch.get_num_threads())
    start = time.perf_counter()
    model = build_model(attention_type, seed, args).train()
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    batches = training_batches(len(splits["train"]), args.batch_size, seed)
    budget_s = 60 * args.minutes if args.minutes > 0 else math.inf
    steps = examples_seen = 0
    train_seconds = eval_seconds = 0.0
    losses: list[float] = []
    curve: list[dict] = []
    best: dict = {"valid_accuracy": -1.0}

    bar = tqdm(total=args.max_steps, desc=f"{attention_type} seed {seed}", unit="step", file=sys.stderr,
               mininterval=2.0, dynamic_ncols=True)

    def evaluate() -> None:
        nonlocal eval_seconds
        t0 = time.perf_counter()
        valid = accuracy(model, splits["valid"], args.batch_size, args.device)
        eval_seconds += time.perf_counter() - t0
        curve.append({"step": steps, "examples_seen": examples_seen, "train_seconds": train_seconds,
                      "valid_accuracy": valid, "train_loss": statistics.fmean(losses) if losses else None})
        losses.clear()
        if valid > best["valid_accuracy"]:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best.update(valid_accuracy=valid, step=steps, train_seconds=train_seconds, state=state)
        bar.set_postfix_str(f"valid {100 * valid:.1f}% (best {100 * best['valid_accuracy']:.1f}%), "
                            f"train {train_seconds:.0f}/{budget_s:.0f} s", refresh=True)

    evaluate()
    stopped_by = None
    while stopped_by is None:
        t0 = time.perf_counter()
        lr = learning_rate(steps, train_seconds, args)
        input_ids, attention_mask, labels = splits["train"].batch(next(batches), args.device)
        losses.append(optimizer_step(model, optimizer, lr, input_ids=input_ids, attention_mask=attention_mask,
                                     labels=labels))
        train_seconds += time.perf_counter() - t0
        steps += 1
        examples_seen += len(labels)
        bar.update()
        if args.max_steps is not None and steps >= args.max_steps:
            stopped_by = "max_steps"
        elif train_seconds >= budget_s:
            stopped_by = "minutes"
        if stopped_by is not None or steps % args.eval_every == 0:
            evaluate()
    bar.close()

    model.load_state_dict(best.pop("state"))
    test = accuracy(model, splits["test"], args.batch_size, args.device)
    total_seconds = time.perf_counter() - start
    info["load_average_at_end"] = os.getloadavg()
    info["device"] = str(args.device)
    print(f"[{attention_type} seed {seed}] {steps} steps in {train_seconds:.1f} s of training "
          f"({total_seconds:.1f} s in all); best valid {100 * best['valid_accuracy']:.1f}% at step {best['step']}, "
          f"its test accuracy {100 * test:.1f}%", file=sys.stderr, flush=True)
    return {
        "attention_type": attention_type, "seed": seed, "parameters": parameters,
        "test_accuracy": test, "best_valid_accuracy": best["valid_accuracy"], "best_step": best["step"],
        "best_train_seconds": best["train_seconds"], "steps": steps, "examples_seen": examples_seen,
        "train_seconds": train_seconds, "eval_seconds": eval_seconds, "total_seconds": total_seconds,
        "ms_per_step": 1000 * train_seconds / steps, "stopped_by": stopped_by, "curve": curve, "machine": info,
    }


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return "–"
    return f"±{100 * statistics.stdev(values):.1f} ({100 * min(values):.1f}-{100 * max(values):.1f})"


def reference_cell(attention_type: str) -> str:
    for name, (value, counterpart) in REFERENCES.items():
        if counterpart == attention_type:
            return f"{pct(value)} ({name})"
    return "–"


def print_header(info: dict, args: argparse.Namespace, data: dict, majority: dict, data_seconds: float) -> None:
    print("# ListOps: ScaleformerForSequenceClassification by attention_type")
    print()
    print_machine(info, f"torch threads, device {args.device}")
    print(f"- data: ListOps (benchmarks/listops.py, LRA's process: depth <= {MAX_DEPTH}, <= {MAX_ARGS} arguments), "
          f"{args.min_length}-{args.max_length} tokens, data seed {args.data_seed}, generated in {data_seconds:.1f} s"
          + (" (--quick)" if args.quick else ""))
    for name, d in data.items():
        print(f"  - {name}: {d['examples']} examples, length {d['length_min']}-{d['length_max']} "
              f"(mean {d['length_mean']:.0f})")
    print(f"- majority class: label {majority['label']} ({pct(majority['train_rate'])}% of train)")
    print(f"- model: d_model {args.d_model}, {args.layers} encoder layer(s), {args.heads} heads, FFN {args.ffn_dim}, "
          f"rpe_horizon {args.rpe_horizon} (relative variants), dropout {args.dropout:g}, masked mean and a linear "
          f"head over {NUM_LABELS} labels, fp32")
    print(f"- training: batch {args.batch_size}, AdamW lr {args.lr:g} (warm-up {args.warmup_steps} steps, linear "
          f"decay to 0 at the budget's end), weight decay {args.weight_decay:g}, gradient norm clipped to "
          f"{GRAD_CLIP:g}; budget per model: {budget_text(args.minutes, args.max_steps)}; valid accuracy every "
          f"{args.eval_every} steps; test accuracy of the best-valid weights")
    print()


def print_results(runs: list[dict], majority: dict, args: argparse.Namespace, ran_now: set[tuple[str, int]],
                  json_path: Path | None) -> None:
    types = sorted({r["attention_type"] for r in runs}, key=ATTENTION_TYPES.index)
    print("## Test accuracy (%) of the best-valid checkpoint, per attention_type")
    print()
    print("| attention_type | seeds | test acc % (mean) | spread: sd (min-max) | best valid acc % (mean) | steps "
          "| examples seen | train s | ms/step | LRA ListOps % (same kind of model) |")
    print("|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in types:
        rs = sorted((r for r in runs if r["attention_type"] == t), key=lambda r: r["seed"])
        mean = {key: statistics.fmean(r[key] for r in rs)
                for key in ("test_accuracy", "best_valid_accuracy", "steps", "examples_seen", "train_seconds",
                            "ms_per_step")}
        print(f"| {t} | {', '.join(str(r['seed']) for r in rs)} | {pct(mean['test_accuracy'])} "
              f"| {spread([r['test_accuracy'] for r in rs])} | {pct(mean['best_valid_accuracy'])} "
              f"| {mean['steps']:,.0f} | {mean['examples_seen']:,.0f} | {mean['train_seconds']:,.1f} "
              f"| {mean['ms_per_step']:,.0f} | {reference_cell(t)} |")
    print(f"| majority class (label {majority['label']}) | – | {pct(majority['test_accuracy'])} | – "
          f"| {pct(majority['valid_accuracy'])} | – | – | – | – | – |")
    print()
    print("| attention_type | seed | parameters | test acc % | best valid acc % (at step) | steps | examples seen "
          "| train s | eval s | ms/step | stopped by | load average at start, end (1 min) | date |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|:---|:---|")
    for r in sorted(runs, key=lambda r: (types.index(r["attention_type"]), r["seed"])):
        m = r["machine"]
        loaded = "" if (r["attention_type"], r["seed"]) in ran_now else " (from the JSON)"
        print(f"| {r['attention_type']} | {r['seed']} | {r['parameters']:,} | {pct(r['test_accuracy'])} "
              f"| {pct(r['best_valid_accuracy'])} ({r['best_step']}) | {r['steps']:,} | {r['examples_seen']:,} "
              f"| {r['train_seconds']:,.1f} | {r['eval_seconds']:,.1f} | {r['ms_per_step']:,.0f} | {r['stopped_by']} "
              f"| {m['load_average_at_start'][0]:.2f}, {m['load_average_at_end'][0]:.2f} | {m['date']}{loaded} |")
    print()
    print(f"## Published reference: {REFERENCE_SOURCE} (%)")
    print()
    print("| LRA model | ListOps test acc % | our attention_type of the same kind |")
    print("|:---|---:|:---|")
    for name, (value, counterpart) in REFERENCES.items():
        print(f"| {name} | {pct(value)} | {counterpart or '– (random-feature attention, not run here)'} |")
    print()
    ours = (f"d_model {args.d_model}, {args.layers} layer(s), {args.heads} heads, FFN {args.ffn_dim}, {args.train:,} "
            f"training examples of {args.min_length}-{args.max_length} tokens, batch {args.batch_size}, "
            + (f"{args.minutes:g} min of training per model" if args.minutes > 0 else f"{args.max_steps} steps")
            + f" on {args.device.type}")
    lra_size = (args.d_model, args.layers, args.heads, args.ffn_dim, args.train, args.batch_size) == LRA_SIZE
    if lra_size:
        print(f"- Ours: {ours}; LRA: {LRA_SETTING}. The training recipes still differ (optimizer, schedule, "
              "positions, pooling), so the figures are comparable in size, not one to one.")
    else:
        print(f"- Ours are at reduced size: {ours}; LRA: {LRA_SETTING}. The published figures show where "
              "full-size models land, for orientation; they are not a target this setting can be held to.")
    print("- Test accuracy is over "
          f"{args.test} examples: one example is {100 / args.test:.2g} points. The spread is the sample standard "
          "deviation over seeds (same data, different weights, dropout and batch order).")
    if json_path is not None and len(ran_now) < len(runs):
        print(f"- Runs marked (from the JSON) were read from {json_path}, made with the same settings by an earlier "
              "command (its date and load are in the row).")
    print()


def write_plot(path: Path, runs: list[dict], majority: dict, args: argparse.Namespace) -> None:
    fig, ax = pyplot().subplots(figsize=(8, 5))
    types = sorted({r["attention_type"] for r in runs}, key=ATTENTION_TYPES.index)
    colors = {t: f"C{ATTENTION_TYPES.index(t)}" for t in types}
    styles = ("-", "--", ":", "-.")
    seeds = sorted({r["seed"] for r in runs})
    for r in sorted(runs, key=lambda r: (types.index(r["attention_type"]), r["seed"])):
        xs = [p["train_seconds"] for p in r["curve"]]
        ys = [100 * p["valid_accuracy"] for p in r["curve"]]
        ax.plot(xs, ys, marker="o", markersize=3, color=colors[r["attention_type"]],
                linestyle=styles[seeds.index(r["seed"]) % len(styles)],
                label=f"{r['attention_type']} seed {r['seed']} (test {pct(r['test_accuracy'])}%)")
    ax.axhline(100 * majority["valid_accuracy"], color="gray", linestyle="--", linewidth=1,
               label=f"majority class (label {majority['label']})")
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("valid accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"ListOps {args.min_length}-{args.max_length} tokens, {args.train:,} train; d_model {args.d_model}, "
                 f"{args.layers} layer(s), batch {args.batch_size}, {args.device.type}", fontsize=10)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = start_report(args.threads)
    settings = settings_of(args)
    store = RunFile(BENCHMARK, args, settings, run_key)
    splits, majority, data_seconds = make_data(args)
    data = describe_splits(splits)
    print_header(info, args, data, majority, data_seconds)

    report = {
        "benchmark": BENCHMARK, "settings": settings, "quick": args.quick, "machine": info, "data": data,
        "majority_baseline": majority,
        "references": {"source": REFERENCE_SOURCE, "setting": LRA_SETTING,
                       "listops_test_accuracy": {name: value for name, (value, _) in REFERENCES.items()}},
        "runs": [],
    }
    keys = [(attention_type, seed) for seed in args.seed for attention_type in args.attention_types]
    store.run_missing(keys, lambda attention_type, seed: train_one(attention_type, seed, splits, args),
                      lambda k: f"{k[0]} seed {k[1]}", report)
    info["load_average_at_end"] = os.getloadavg()
    if args.json is not None:
        print(f"- raw figures written to {args.json}")
    all_runs = list(store.runs.values())
    print_results(all_runs, majority, args, store.ran_now, args.json)
    if args.plot is not None:
        write_plot(args.plot, all_runs, majority, args)

    best = max(all_runs, key=lambda r: r["test_accuracy"], default=None)
    above = sum(r["test_accuracy"] > majority["test_accuracy"] for r in all_runs)
    print(f"Summary: {store.summary()}; "
          + (f"best test accuracy {pct(best['test_accuracy'])}% ({best['attention_type']} seed {best['seed']}), "
             if best else "")
          + f"{above} of {len(all_runs)} run(s) above the majority class ({pct(majority['test_accuracy'])}%); "
          + load_summary(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
