"""Length extrapolation: train on short inputs, test at 2x, 4x and 8x the training length.

What is measured: each model is trained from random weights on a synthetic sequence-to-sequence task whose
inputs have `--min_length` to `--max_length` symbols (default 8-32), then decoded greedily on fresh inputs of
growing length: the training range itself (1x) and the bins (F/2 x max, F x max] for F in `--factors`
(default 2 4 8: 33-64, 65-128 and 129-256 symbols). Per bin: exact match (the whole output equals the
reference, end of sequence included) and token accuracy (the share of reference positions whose symbol is
right, a missing symbol counting as wrong), on `--test_examples` inputs per bin.

Tasks (`--tasks`), over an alphabet of `--symbols` symbols drawn uniformly (repeats allowed):

* `copy`: the output is the input;
* `reverse`: the output is the input reversed;
* `sort`: the output is the input sorted by symbol id.

Models, all d_model 128, 2 + 2 layers, 4 heads, FFN 512, no dropout, fp32 by default (`--d_model` ...), built
by `models.build_seq2seq` (as in `bench_quality.py`):

* `scaleformer`: attention_type `kernelized_rpe` (clipped relative positions, horizon 16) in encoder and
  decoder self-attention, plain kernelized cross-attention;
* `scaleformer+cross_rpe`: the same with relative positions in cross-attention too (`cross_attention_rpe`);
* `scaleformer:kernelized`: kernelized attention without any position information (the decoder's causal
  mask is its only sense of order);
* `scaleformer:TYPE`: any other attention_type;
* `t5`: T5ForConditionalGeneration, relative attention buckets at their defaults (32 buckets, max distance
  128: distances beyond 128 share one bucket);
* `bart`: BartForConditionalGeneration, learned absolute positions. Its position table must hold the
  longest test sequence, so it gets `max_position_embeddings` = the longest test length + 2 (rounded up to
  64); the positions past the training length are in the table but never trained. The report says so.

How: per seed, the weights come from `torch.manual_seed(seed)` and every training batch from a
`random.Random(seed)` (the same batches for every model of a seed), `--steps` steps of `--batch_size`
examples each, AdamW (`--lr`, weight decay 0.01), gradients clipped to norm 1.0, linear warm-up over
`--warmup_steps` then inverse square root. The test inputs come from `--test_seed` and are the same for
every model and seed. Decoding is greedy (no repetition guard: the tasks repeat symbols), at most the
reference length + 8 new tokens.

Target: Scaleformer holds its short-length quality at 4x: exact match in the 4x bin at least 90% of the 1x
bin's, for a model that learned the task (1x exact match >= 50%), N/A otherwise; checked for every Scaleformer
model of the report.

Runs accumulate: with `--json PATH`, the (task, model, seed) runs already in PATH are skipped (unless
`--overwrite`) and each finished run is merged into PATH at once; a file made with other settings is refused.

    PYTHONPATH=. python benchmarks/bench_extrapolation.py --json benchmarks/results/extrapolation.json \\
        --plot benchmarks/results/extrapolation.png                        # 2 tasks x 5 models, about 1 h
    PYTHONPATH=. python benchmarks/bench_extrapolation.py --quick --json /tmp/e.json --plot /tmp/e.png  # < 1 min

`--threads` defaults to 1: on the shared 2-core machines these defaults were written for, two runs with
one thread each (different `--models`, separate JSON files) use the machine better than one with two.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import Counter
from operator import itemgetter
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from common import (
    WEIGHT_DECAY, RunFile, Target, add_run_file_arguments, inverse_sqrt_lr, machine_info, optimizer_step,
    print_targets, pyplot, save_figure, start_report,
)
from models import (
    BOS_ID, DECAY_TYPES, EOS_ID, PAD_ID, ModelSize, add_model_size_arguments, bart_table_size, build_seq2seq, collate,
    count_parameters, parse_model_name,
)


BENCHMARK = "bench_extrapolation"
FIRST_SYMBOL = 3  # after pad, bos and eos
TASKS = ("copy", "reverse", "sort")
HOLD_RATIO = 0.9  # exact match at 4x at least this share of the 1x exact match
LEARNED = 0.5  # 1x exact match needed for the target to apply
TARGET_FACTOR = 4
EXTRA_NEW_TOKENS = 8

DEFAULTS = dict(
    tasks=["copy", "sort"], models=["scaleformer", "scaleformer+cross_rpe", "scaleformer:kernelized", "t5", "bart"],
    seeds=[0], steps=2000, batch_size=32, lr=1e-3, warmup_steps=200, d_model=128, layers=2, heads=4, ffn_dim=512,
    dropout=0.0, symbols=16, min_length=8, max_length=32, factors=[2, 4, 8], test_examples=100,
)
QUICK = dict(
    tasks=["copy"], models=["scaleformer", "t5", "bart"], seeds=[0], steps=5, batch_size=8, lr=1e-3, warmup_steps=2,
    d_model=32, layers=1, heads=2, ffn_dim=64, dropout=0.0, symbols=8, min_length=4, max_length=8, factors=[2],
    test_examples=4,
)
SETTING_KEYS = ("quick", "steps", "batch_size", "lr", "warmup_steps", "d_model", "layers", "heads", "ffn_dim",
                "dropout", "symbols", "min_length", "max_length", "factors", "test_examples", "test_seed", "threads")
run_key = itemgetter("task", "model", "seed")  # what identifies a run of the --json file


# ----------------------------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train on short copy/reverse/sort inputs, report exact match and token accuracy at 1x, 2x, 4x "
        "and 8x the training length for Scaleformer (with and without relative positions), T5 and BART.",
    )
    parser.add_argument("--tasks", nargs="+", choices=TASKS, help=f"(default: {' '.join(DEFAULTS['tasks'])})")
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="scaleformer, scaleformer+cross_rpe, scaleformer:TYPE, t5, bart "
                        f"(default: {' '.join(DEFAULTS['models'])})")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="S", help="weights and training batches (default: 0)")
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny models, 5 steps, 4 test inputs per bin")
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, help="training steps per run (default: 2000)")
    train.add_argument("--batch_size", type=int, help="examples per step (default: 32)")
    train.add_argument("--lr", type=float, help="peak AdamW learning rate (default: 1e-3)")
    train.add_argument("--warmup_steps", type=int, help="linear warm-up, then inverse square root (default: 200)")
    train.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    add_model_size_arguments(parser, DEFAULTS)
    data = parser.add_argument_group("data")
    data.add_argument("--symbols", type=int, help="alphabet size (default: 16)")
    data.add_argument("--min_length", type=int, help="shortest training input (default: 8)")
    data.add_argument("--max_length", type=int, help="longest training input, the 1x length (default: 32)")
    data.add_argument("--factors", type=int, nargs="+", metavar="F",
                      help="test bins (F/2 x max, F x max] (default: 2 4 8)")
    data.add_argument("--test_examples", type=int, help="test inputs per bin (default: 100)")
    data.add_argument("--test_seed", type=int, default=12345, help="seed of the test inputs (default: 12345)")
    add_run_file_arguments(parser, plot_help="write a PNG of exact match against input length",
                           overwrite_help="run (task, model, seed) triples already in --json",
                           json_help="merge the runs into PATH and write every figure")
    args = parser.parse_args(argv)

    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.tasks = list(dict.fromkeys(args.tasks))
    args.models = list(dict.fromkeys(args.models))
    args.seeds = list(dict.fromkeys(args.seeds))
    args.factors = sorted(set(args.factors))
    for name in args.models:
        try:
            parse_model_name(name)
        except ValueError as error:
            parser.error(f"--models: {error}")
    for name in ("steps", "batch_size", "d_model", "layers", "heads", "ffn_dim", "symbols", "min_length",
                 "test_examples", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.d_model % args.heads:
        parser.error(f"--heads must divide --d_model ({args.d_model}), got {args.heads}")
    if args.max_length < args.min_length:
        parser.error(f"--max_length must be >= --min_length ({args.min_length}), got {args.max_length}")
    if any(f < 2 for f in args.factors):
        parser.error(f"--factors must be at least 2 (1x is always tested), got {args.factors}")
    if args.lr <= 0 or args.warmup_steps < 0 or not 0 <= args.dropout < 1:
        parser.error("--lr must be positive, --warmup_steps >= 0 and --dropout in [0, 1)")
    return args


# ----------------------------------------------------------------------------------------------------- data


def target_of(task: str, source: list[int]) -> list[int]:
    if task == "copy":
        return list(source)
    if task == "reverse":
        return source[::-1]
    if task == "sort":
        return sorted(source)
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def make_example(task: str, length: int, symbols: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(source ids, label ids ending with EOS) for `length` symbols drawn uniformly."""
    source = [FIRST_SYMBOL + rng.randrange(symbols) for _ in range(length)]
    return source, target_of(task, source) + [EOS_ID]


def length_bins(args: argparse.Namespace) -> list[dict]:
    """1x is the training range; factor F is (F/2 x max, F x max]."""
    bins = [{"factor": 1, "low": args.min_length, "high": args.max_length}]
    bins += [{"factor": f, "low": f * args.max_length // 2 + 1, "high": f * args.max_length} for f in args.factors]
    return bins


def test_sets(task: str, args: argparse.Namespace) -> list[dict]:
    """Per bin: `test_examples` inputs with lengths uniform in the bin, from `--test_seed` and the task only."""
    sets = []
    for index, b in enumerate(length_bins(args)):
        rng = random.Random(f"{args.test_seed}-{task}-{index}")
        examples = [make_example(task, rng.randint(b["low"], b["high"]), args.symbols, rng)
                    for _ in range(args.test_examples)]
        sets.append({**b, "examples": examples})
    return sets


def training_batches(task: str, seed: int, args: argparse.Namespace):
    rng = random.Random(f"{seed}-{task}-train")
    while True:
        yield [make_example(task, rng.randint(args.min_length, args.max_length), args.symbols, rng)
               for _ in range(args.batch_size)]


# ------------------------------------------------------------------------------------------- train and test


def bart_positions(args: argparse.Namespace) -> int:
    """BART's position table holds the longest test source and its decoding (start token, reference, extra)."""
    return bart_table_size(max(args.factors) * args.max_length + 1 + EXTRA_NEW_TOKENS)


def describe(name: str, model: PreTrainedModel, args: argparse.Namespace) -> str:
    config = model.config
    if name.startswith("scaleformer"):
        positions = ("none (no relative or absolute positions)" if config.attention_type == "kernelized" else
                     f"relative, horizon {config.rpe_horizon}")
        decay = (f", decay rates from {config.decay_rate_range[0]:g} to {config.decay_rate_range[1]:g} beyond the "
                 f"horizon" if config.attention_type in DECAY_TYPES else "")
        return (f"attention_type {config.attention_type}, positions {positions}{decay}, cross_attention_rpe "
                f"{config.cross_attention_rpe}, feature_map {config.feature_map}, decoder_attention "
                f"{config.decoder_attention}, layer_norm_position {config.layer_norm_position}")
    if name == "t5":
        return (f"relative attention buckets: {config.relative_attention_num_buckets}, max distance "
                f"{config.relative_attention_max_distance}")
    return (f"learned absolute positions, max_position_embeddings {config.max_position_embeddings}: enlarged to hold "
            f"the longest test sequence; positions {args.max_length + 1} and up (0-based) are never trained")


def symbol_counts(output: list[int], reference: list[int]) -> dict:
    """How an output (without its end of sequence) differs from its reference beyond exact match: whether it is
    in sorted order, holds the reference's set of symbols, has its length, and each symbol's count error (output
    count minus reference count, over the symbols of either)."""
    got, want = Counter(output), Counter(reference)
    return {"sorted": output == sorted(output), "right_symbols": set(got) == set(want),
            "right_length": len(output) == len(reference),
            "count_errors": [got[x] - want[x] for x in sorted(set(got) | set(want))]}


@torch.no_grad()
def score_bin(model: PreTrainedModel, examples: list[tuple[list[int], list[int]]], batch_size: int) -> dict:
    """Exact match and token accuracy, and the output analysis of `symbol_counts`: the shares of sorted
    outputs, of outputs with the right set of symbols and with the right length, and a histogram of the
    per-symbol count errors."""
    model.eval()
    exact = correct = total = 0
    shares = Counter()
    errors = Counter()
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        input_ids, attention_mask, _ = collate([source for source, _ in chunk], [target for _, target in chunk])
        longest = max(len(t) for _, t in chunk)
        generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1,
                                   max_new_tokens=longest + EXTRA_NEW_TOKENS, decoder_start_token_id=BOS_ID,
                                   eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        for row, (_, target) in enumerate(chunk):
            out = generated[row, 1:].tolist()  # drop the decoder start
            if EOS_ID in out:
                out = out[:out.index(EOS_ID) + 1]
            exact += out == target
            correct += sum(a == b for a, b in zip(out, target[:-1]))
            total += len(target) - 1
            analysis = symbol_counts([x for x in out if x not in (EOS_ID, PAD_ID)], target[:-1])
            errors.update(analysis.pop("count_errors"))
            shares.update(key for key, value in analysis.items() if value)
    model.train()
    return {"exact_match": exact / len(examples), "token_accuracy": correct / total,
            **{f"{key}_share": shares[key] / len(examples) for key in ("sorted", "right_symbols", "right_length")},
            "count_error_histogram": {str(k): errors[k] for k in sorted(errors)}}


def train_one(task: str, name: str, seed: int, tests: list[dict], args: argparse.Namespace) -> dict:
    info = machine_info(torch.get_num_threads())
    vocabulary = FIRST_SYMBOL + args.symbols
    size = ModelSize(vocabulary, args.d_model, args.layers, args.heads, args.ffn_dim)
    model = build_seq2seq(name, seed, size, args.dropout, bart_positions(args)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=WEIGHT_DECAY)
    batches = training_batches(task, seed, args)
    losses: list[float] = []
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc=f"{task} {name} seed {seed}", file=sys.stderr, mininterval=2.0,
               dynamic_ncols=True)
    for step in bar:
        lr = inverse_sqrt_lr(step, args.lr, args.warmup_steps)
        batch = next(batches)
        input_ids, attention_mask, labels = collate([source for source, _ in batch], [target for _, target in batch])
        losses.append(optimizer_step(model, optimizer, lr, input_ids=input_ids, attention_mask=attention_mask,
                                     labels=labels, use_cache=False))
        if step % 50 == 0:
            bar.set_postfix_str(f"loss {statistics.fmean(losses[-50:]):.3f}")
    train_seconds = time.perf_counter() - start
    bar.close()
    start = time.perf_counter()
    results = []
    for b in tests:
        results.append({"factor": b["factor"], "low": b["low"], "high": b["high"],
                        **score_bin(model, b["examples"], args.batch_size)})
    test_seconds = time.perf_counter() - start
    info["load_average_at_end"] = os.getloadavg()
    line = ", ".join(f"{r['factor']}x {100 * r['exact_match']:.0f}%" for r in results)
    print(f"[{task} {name} seed {seed}] {args.steps} steps in {train_seconds:.0f} s, final train loss "
          f"{statistics.fmean(losses[-50:]):.4f}; exact match {line}", file=sys.stderr, flush=True)
    return {
        "task": task, "model": name, "seed": seed, "description": describe(name, model, args),
        "parameters": count_parameters(model), "train_seconds": train_seconds,
        "test_seconds": test_seconds, "final_train_loss": statistics.fmean(losses[-50:]),
        "train_loss_every_50": [statistics.fmean(losses[i:i + 50]) for i in range(0, len(losses), 50)],
        "bins": results, "machine": info,
    }


# ------------------------------------------------------------------------------------------------ reporting


def grouped(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(task, model) -> runs, tasks and models in a stable order."""
    def order(r: dict) -> tuple:
        kind = parse_model_name(r["model"]).kind
        return TASKS.index(r["task"]), ("scaleformer", "t5", "bart").index(kind), r["model"], r["seed"]
    out: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(runs, key=order):
        out.setdefault((r["task"], r["model"]), []).append(r)
    return out


def mean_bins(rs: list[dict], key: str) -> list[float]:
    return [statistics.fmean(r["bins"][i][key] for r in rs) for i in range(len(rs[0]["bins"]))]


def print_report(info: dict, args: argparse.Namespace, runs: list[dict], ran_now: set) -> list[Target]:
    print("# Length extrapolation: train on short inputs, test on longer ones")
    print()
    print(f"- command: `{info['command']}`")
    print(f"- date: {info['date']}; torch {info['torch']}, {info['threads']} torch threads; CPU {info['cpu_model']} "
          f"({info['cpu_count']} logical CPUs), load average {info['load_average_at_start'][0]:.2f} at start")
    print(f"- tasks: {', '.join(sorted({r['task'] for r in runs}, key=TASKS.index))} over {args.symbols} symbols; "
          f"training inputs of {args.min_length}-{args.max_length} symbols, {args.steps} steps of {args.batch_size} "
          f"fresh examples, AdamW lr {args.lr:g} (warm-up {args.warmup_steps}, then inverse square root)")
    print(f"- models: d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, FFN "
          f"{args.ffn_dim}, dropout {args.dropout:g}, fp32; greedy decoding; {args.test_examples} test inputs per "
          "length bin, the same for every model" + (" (--quick)" if args.quick else ""))
    print()
    bins = length_bins(args)
    header = " | ".join(f"{b['factor']}x ({b['low']}-{b['high']})" for b in bins)
    rule = "|".join("---:" for _ in bins)
    for key, title in (("exact_match", "Exact match (%)"), ("token_accuracy", "Token accuracy (%)")):
        print(f"## {title}, mean over seeds")
        print()
        print(f"| task | model | seeds | {header} | train s |")
        print(f"|:---|:---|:---|{rule}|---:|")
        for (task, name), rs in grouped(runs).items():
            cells = " | ".join(f"{100 * v:.1f}" for v in mean_bins(rs, key))
            seconds = statistics.fmean(r["train_seconds"] for r in rs)
            print(f"| {task} | {name} | {', '.join(str(r['seed']) for r in rs)} | {cells} | {seconds:,.0f} |")
        print()
    analysed = [r for r in runs if "count_error_histogram" in r["bins"][0]]  # runs recorded before had none
    if analysed:
        print("## How the outputs differ from their references (seed by seed)")
        print()
        print("Share of outputs in sorted order / with the reference's set of symbols / of the reference's length, "
              "and the most common per-symbol count errors (output count minus reference count) with their share "
              "of the symbols.")
        print()
        print("| task | model | seed | bin | sorted | right symbols | right length | count errors |")
        print("|:---|:---|---:|:---|---:|---:|---:|:---|")
        for r in analysed:
            for b in r["bins"]:
                histogram = {int(k): v for k, v in b["count_error_histogram"].items()}
                common = sorted(histogram, key=histogram.get, reverse=True)[:3]
                errors = ", ".join(f"{k:+d}: {100 * histogram[k] / sum(histogram.values()):.0f}%" for k in common)
                print(f"| {r['task']} | {r['model']} | {r['seed']} | {b['factor']}x | {100 * b['sorted_share']:.0f}% "
                      f"| {100 * b['right_symbols_share']:.0f}% | {100 * b['right_length_share']:.0f}% | {errors} |")
        print()
    described = {}
    for r in runs:
        described.setdefault(r["model"], r["description"])
    for name, text in described.items():
        print(f"- {name}: {text}")
    old = [r for r in runs if run_key(r) not in ran_now]
    if old:
        print(f"- {len(old)} run(s) read from {args.json}, made with the same settings earlier")
    print()
    targets = []
    for (task, name), rs in grouped(runs).items():
        if not name.startswith("scaleformer"):
            continue
        exact = dict(zip([b["factor"] for b in rs[0]["bins"]], mean_bins(rs, "exact_match")))
        target = f"{task}, {name}: exact match at {TARGET_FACTOR}x >= {HOLD_RATIO:.0%} of the 1x exact match"
        if TARGET_FACTOR not in exact or args.quick:
            status, figure = "N/A", "--quick smoke settings" if args.quick else f"no {TARGET_FACTOR}x bin"
        elif exact[1] < LEARNED:
            status, figure = "N/A", f"1x exact match {100 * exact[1]:.1f}% < {LEARNED:.0%}: the task was not learned"
        else:
            ratio = exact[TARGET_FACTOR] / exact[1]
            status = "PASS" if ratio >= HOLD_RATIO else "FAIL"
            figure = f"{100 * exact[TARGET_FACTOR]:.1f}% vs {100 * exact[1]:.1f}% (ratio {ratio:.2f})"
        targets.append(Target(target, status, figure))
    print_targets(targets)
    return targets


def write_plot(path: Path, runs: list[dict], args: argparse.Namespace) -> None:
    tasks = sorted({r["task"] for r in runs}, key=TASKS.index)
    fig, axes = pyplot().subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    colours: dict[str, str] = {}
    for (task, name), rs in grouped(runs).items():
        ax = axes[0][tasks.index(task)]
        colour = colours.setdefault(name, f"C{len(colours)}")
        factors = [b["factor"] for b in rs[0]["bins"]]
        ax.plot(factors, [100 * v for v in mean_bins(rs, "exact_match")], "o-", color=colour,
                label=f"{name} ({len(rs)} seed{'s' * (len(rs) > 1)})")
        ax.plot(factors, [100 * v for v in mean_bins(rs, "token_accuracy")], "x:", color=colour, alpha=0.6)
    for ax, task in zip(axes[0], tasks):
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, *args.factors], [f"{f}x" for f in [1, *args.factors]])
        ax.set_ylim(-2, 102)
        ax.set_xlabel(f"input length (1x = {args.min_length}-{args.max_length} symbols, the training range)")
        ax.set_ylabel("exact match (o-) / token accuracy (x:), %")
        ax.set_title(task)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path, f"Length extrapolation: d_model {args.d_model}, {args.layers}+{args.layers} layers, "
                f"{args.steps} steps of {args.batch_size}", fontsize=10)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = start_report(args.threads)
    settings = {key: getattr(args, key) for key in SETTING_KEYS}
    store = RunFile(BENCHMARK, args, settings, run_key)
    report = {"benchmark": BENCHMARK, "settings": settings, "machine": info, "runs": list(store.runs.values())}
    keys = [(task, name, seed) for task in args.tasks for seed in args.seeds for name in args.models]
    tests = {task: test_sets(task, args) for task in args.tasks}
    store.run_missing(keys, lambda task, name, seed: train_one(task, name, seed, tests[task], args),
                      lambda k: f"{k[0]} {k[1]} seed {k[2]}", report)
    all_runs = list(store.runs.values())
    targets = print_report(info, args, all_runs, store.ran_now) if all_runs else []
    report["targets"] = [t._asdict() for t in targets]
    store.write(report)
    if args.plot is not None and all_runs:
        write_plot(args.plot, all_runs, args)
    print(f"Summary: {store.summary()}; "
          + "; ".join(f"{t.status} {t.name.split(': exact match')[0]}" for t in targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
