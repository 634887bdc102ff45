"""Quality per CPU-minute: learning curves of Scaleformer, BART and T5 of one size under one wall-clock budget.

What is measured: each model is trained from random weights for `--minutes` of training wall-clock time on
English -> Spanish Bible pairs (`examples/data/bible/`) or on Python functions -> their docstrings, and its
held-out cross-entropy is measured every `--eval_every_seconds` of training time (and before the first step
and after the last). The curve is recorded against training seconds and against tokens seen (non-padding
source + target tokens). At the end, greedy decoding on the test split gives BLEU and chrF (sacreBLEU), or
ROUGE-1/2/L for docstrings, beside the copy-the-source baseline.

Models, all d_model 256, 3 + 3 layers, 4 heads, FFN 1024, dropout 0.1, fp32 by default (`--d_model` ...):

* `scaleformer`: `ScaleformerForConditionalGeneration`, attention_type `kernelized_rpe` (horizon 16);
  `scaleformer:TYPE` runs another attention_type (e.g. `scaleformer:softmax`), `scaleformer+cross_rpe` adds
  relative positions to cross-attention (`cross_attention_rpe`), then `+sinusoidal` adds sinusoidal absolute
  positions to the embeddings (`absolute_positions`) and `+post_ln` makes every block post-norm
  (`layer_norm_position="post"`), e.g. `scaleformer:softmax+sinusoidal+post_ln`;
* `bart`: `transformers.BartForConditionalGeneration` (the builder of `models.py`), learned absolute
  positions; `max_position_embeddings` fits the longest sequence of the task (128 for verses of at most 96
  tokens); for chapters see `--bart_long`;
* `t5`: `transformers.T5ForConditionalGeneration`, d_kv = d_model / heads, relative attention buckets at
  their defaults (32 buckets, max distance 128), ReLU FFN, tied embeddings;
* `led` (opt-in): `transformers.LEDForConditionalGeneration`, encoder attention window 512 in every layer, no
  global tokens; LED pads sources to a multiple of the window itself, its encoder position table holds the
  longest source of the task rounded up to the window, its decoder table the longest target or decoded sequence;
  full sources on every task (never cut, unlike BART's with `--bart_long truncate`);
* `longt5` (opt-in): `transformers.LongT5ForConditionalGeneration`, `encoder_attention_type="transient-global"`,
  local radius 127, global blocks of 16 tokens, relative attention like T5's; full sources on every task.

Both long-input baselines take the same recipe as BART (optimizer, schedule, batches, dropout).

Every model uses the same tokenizer: a byte-level BPE (8000 tokens) trained on the training split's source and
target text by `examples/data/train_tokenizer.py` (run as a command), saved once in the output folder
(`--output_dir`, by default the folder of `--json`) and loaded from there by every later run; its SHA-256 is part
of the settings.
Special ids: pad 0, bos 1 (the decoder start of every model), eos 2.

How: per seed, the weights come from `torch.manual_seed(seed)` and the training batches from a
`random.Random(seed)`, independent of the model: batches of `--batch_size` pairs grouped by source length
(sorted with random tie-breaks, cut into batches, batches shuffled; a new order per epoch), so that every
model sees the same pairs in the same order. AdamW (`--lr`, weight decay 0.01), gradients clipped to norm
1.0, learning rate rising linearly over `--warmup_steps` and then decaying as the inverse square root of the
step (the recipe of `../shared/PERF_NOTES.md`), `--threads` torch threads. Training time counts batching,
forward, backward and the optimizer; evaluation and decoding are timed separately and are not in the budget.
The last evaluation follows the step that crosses the budget, so a run overshoots it by less than one step
(the table gives each model's training seconds); "equal wall-clock" figures are those of that evaluation.
Held-out loss is the summed cross-entropy (nats) of a fixed subset of the held-out split, in batches sorted
by length, divided by its target tokens (per token) and by its target characters (per character, so that
figures stay comparable with other tokenizations).

Tasks (`--task`):

* `verses`: verse pairs; train on `train.jsonl`, curves on `validation.jsonl`, final scores on
  `test.jsonl`. Pairs with more than `--max_tokens` (96) source or target tokens are left out (not cut).
* `chapters`: the verses of one (book, chapter) joined with spaces, from the same files (the shipped
  sample holds whole chapters). Chapters whose source has `--min_source_tokens` to `--max_source_tokens`
  tokens (800-3200) are kept; targets are cut to `--max_target_tokens` (1024) for every model alike. BART
  cannot read past its position table: `--bart_long table` enlarges `max_position_embeddings` to the longest
  sequence, `--bart_long truncate` keeps 1024 positions and cuts BART's sources (train, held-out and test) to
  1024 tokens. T5 reads full sources; its attention cost grows quadratically with length. The report says
  what each baseline did and how many sources were cut.
* `docstrings`: code-to-docstring summarisation: the functions and methods of the running interpreter's
  standard library (`examples/data/build_docstrings.py --kinds function`, run as a command; split by package,
  so no package spans two splits):
  source without its docstring -> the docstring's first paragraph. Train on `train`, curves on
  `validation`, ROUGE-1/2/L F-measure (x100, mean over examples, as `examples/main_job.py` computes it) on a
  seeded sample of `--test_examples` (200) `test` functions. Pairs with more than `--max_source_tokens`
  (256) source or `--max_target_tokens` (64) target tokens are left out (not cut).

The report is a markdown table per model (mean and spread over seeds) and the project's targets, for the
default configuration (`DEFAULT_CONFIG_MODEL` of `models.py`, what `ScaleformerConfig()` gives;
`scaleformer` alone is the first configuration, kept so that recorded rows keep their meaning): on verses its
mean final held-out loss per token at most 1% above BART's at equal wall-clock; on chapters at least 3% below
each of BART's, LED's and LongT5's; none on docstrings. Each is PASS, FAIL or N/A (a model missing, or `--quick`).

Runs accumulate: with `--json PATH`, the (model, seed) runs already in PATH are skipped (unless
`--overwrite`), each finished run is merged into PATH at once, and the tables and the plot cover every run
in the file. A file made with other data, model or training settings is refused. Several processes may
fill one file at once (each with its own models or seeds): a run is merged under a lock with what the others
wrote meanwhile. So the full verse
benchmark (3 models x 3 seeds x 20 minutes of training; with evaluation, about 12 s per held-out pass on a
loaded 2-core machine, and decoding, about 4 hours in all) is run one (model, seed) at a time, possibly across
sessions:

    for seed in 0 1 2; do for model in scaleformer bart t5; do
        PYTHONPATH=. python benchmarks/bench_quality.py --task verses --models $model --seeds $seed --minutes 20 \\
            --json benchmarks/results/quality_verses.json --plot benchmarks/results/quality_verses.png
    done; done

or, on 2 cores, two such loops at once with `--threads 1` each (one core per run; the figures in the README
were made that way).

The docstring task runs the same way (`--task docstrings`, a JSON of its own). The long-input comparison
runs the same way (test decoding of 8 chapters of up to 1024 new tokens adds
minutes per run; `--bart_long table` for the other BART setting, in its own JSON):

    PYTHONPATH=. python benchmarks/bench_quality.py --task chapters --models scaleformer --seeds 0 --minutes 20 \\
        --bart_long truncate --json benchmarks/results/quality_chapters.json \\
        --plot benchmarks/results/quality_chapters.png

    PYTHONPATH=. python benchmarks/bench_quality.py --quick --json /tmp/q.json --plot /tmp/q.png   # smoke test, < 1 min

LED and LongT5 run the same way, one (model, seed) at a time into the task's JSON, e.g. `--models led` and
`--models longt5` in the loops above (for chapters they read full sources whatever `--bart_long` says).

The figures go into the README with the date and the machine (CPU model, threads, load average), which the
report prints per run. The machines these defaults were written for are shared 2-core CPUs on which
absolute times move by 20% or more: a run under load buys fewer steps, so compare models whose runs had a
similar load, and read the load average recorded per run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path

import sacrebleu
import torch
import torch.nn.functional as F
from rouge_score import rouge_scorer
from torch import Tensor
from tqdm import tqdm
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from common import (
    GRAD_CLIP, WEIGHT_DECAY, RunFile, Target, add_run_file_arguments, budget_text, inverse_sqrt_lr, load_summary,
    machine_info, optimizer_step, print_machine, print_targets, pyplot, save_figure, start_report,
)
from models import (
    ALL_BASELINES, BART_DEFAULT_POSITIONS, BOS_ID, DECAY_TYPES, DEFAULT_CONFIG_MODEL, EOS_ID, PAD_ID, ModelSize,
    add_model_size_arguments, bart_table_size, build_seq2seq, collate, count_parameters, parse_model_name,
)


BENCHMARK = "bench_quality"
ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "examples" / "data" / "bible"
DATA_BUILDERS = ROOT / "examples" / "data"  # build_docstrings.py and train_tokenizer.py, run as commands
VERSE_TARGET_RATIO = 1.01  # verses: the default's held-out loss at most 1% above BART's
CHAPTER_TARGET_RATIO = 0.97  # chapters: at least 3% below each of BART, LED and LongT5
CHAPTER_BASELINES = ("bart", "led", "longt5")
REPETITION_GUARD = dict(no_repeat_ngram_size=3, repetition_penalty=1.2)  # examples/main_job.py's

DEFAULTS = dict(
    models=[DEFAULT_CONFIG_MODEL, "bart", "t5"], seeds=[0], minutes=20.0, max_steps=None, eval_every_seconds=60.0,
    d_model=256, layers=3, heads=4, ffn_dim=1024, dropout=0.1, vocab_size=8000, lr=5e-4, warmup_steps=200,
    train_examples=0, heldout_examples=0,
)
TASK_DEFAULTS = {
    "verses": dict(batch_size=32, max_tokens=96, test_examples=0, max_new_tokens=96),
    "chapters": dict(batch_size=2, test_examples=8, max_new_tokens=1024, min_source_tokens=800,
                     max_source_tokens=3200, max_target_tokens=1024),
    "docstrings": dict(batch_size=16, heldout_examples=400, test_examples=200, max_new_tokens=64,
                       max_source_tokens=256, max_target_tokens=64),
}
METRICS = {  # test scores of each task: (key, name) in the order of the tables
    "verses": (("bleu", "BLEU"), ("chrf", "chrF")),
    "chapters": (("bleu", "BLEU"), ("chrf", "chrF")),
    "docstrings": (("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"), ("rougeL", "ROUGE-L")),
}
QUICK = dict(
    models=[DEFAULT_CONFIG_MODEL, "bart", "t5"], seeds=[0], minutes=0.25, max_steps=6, eval_every_seconds=0.5,
    d_model=32, layers=1, heads=2, ffn_dim=64, dropout=0.1, vocab_size=1000, lr=1e-3, warmup_steps=2,
    train_examples=64, heldout_examples=16, batch_size=16, max_tokens=64, test_examples=8, max_new_tokens=16,
)
# what a run's result depends on, apart from the model and the seed: runs in one file must agree on all
SETTING_KEYS = ("task", "quick", "minutes", "max_steps", "eval_every_seconds", "d_model", "layers", "heads", "ffn_dim",
                "dropout", "vocab_size", "lr", "warmup_steps", "batch_size", "threads", "train_examples",
                "heldout_examples", "test_examples", "max_tokens", "min_source_tokens", "max_source_tokens",
                "max_target_tokens", "max_new_tokens", "bart_long", "repetition_guard", "data_dir")
run_key = itemgetter("model", "seed")  # what identifies a run of the --json file


# ----------------------------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Held-out loss against training wall-clock and tokens seen, then BLEU and chrF (ROUGE for "
        "docstrings), for Scaleformer, BART and T5 of the same size on English -> Spanish Bible pairs or Python "
        "functions -> docstrings; one (model, seed) run merged into --json at a time.",
    )
    parser.add_argument("--task", choices=tuple(TASK_DEFAULTS), default="verses",
                        help="verse pairs, chapter pairs of 800-3200 source tokens, or standard-library functions -> "
                        "docstrings (default: verses)")
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="scaleformer, scaleformer:TYPE (another attention_type), bart, t5, led, longt5 "
                        f"(default: {' '.join(DEFAULTS['models'])})")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="S",
                        help="seeds of the weights, dropout and data order; one run per model and seed (default: 0)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 64 training pairs, d_model 32, 1+1 layers, a few steps, 8 test pairs; "
                        "explicit flags still apply")
    budget = parser.add_argument_group("budget and curves")
    budget.add_argument("--minutes", type=float, help="training wall-clock per run, evaluation excluded (default: 20)")
    budget.add_argument("--max_steps", type=int, help="also stop after this many steps (default: none)")
    budget.add_argument("--eval_every_seconds", type=float,
                        help="training seconds between held-out evaluations (default: 60)")
    model = add_model_size_arguments(parser, DEFAULTS)
    model.add_argument("--vocab_size", type=int, help="BPE vocabulary trained on the training split (default: 8000)")
    model.add_argument("--bart_long", choices=("table", "truncate"), default="truncate",
                       help="chapters: enlarge BART's position table to the longest sequence (table), or cut BART's "
                       "sources at 1024 tokens (truncate) (default: truncate)")
    train = parser.add_argument_group("training")
    train.add_argument("--lr", type=float, help="peak AdamW learning rate (default: 5e-4)")
    train.add_argument("--warmup_steps", type=int, help="linear warm-up, then inverse square root (default: 200)")
    train.add_argument("--batch_size", type=int, help="pairs per step (default: 32 verses, 2 chapters)")
    train.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default: 2)")
    data = parser.add_argument_group("data")
    data.add_argument("--train_examples", type=int, help="use only the first N training pairs, 0 for all (default: 0)")
    data.add_argument("--heldout_examples", type=int,
                      help="fixed held-out subset for the curves (a seeded sample), 0 for all (default: 0; 400 "
                      "docstrings)")
    data.add_argument("--test_examples", type=int,
                      help="test pairs decoded (a seeded sample), 0 for all (default: all verses, 8 chapters, 200 "
                      "docstrings)")
    data.add_argument("--max_tokens", type=int,
                      help="verses: leave out pairs with a longer source or target (default: 96)")
    data.add_argument("--min_source_tokens", type=int,
                      help="chapters: shortest source kept (default: 800)")
    data.add_argument("--max_source_tokens", type=int,
                      help="chapters and docstrings: longest source kept (default: 3200 chapters, 256 docstrings)")
    data.add_argument("--max_target_tokens", type=int,
                      help="chapters: targets cut to this many tokens, for every model (default: 1024); docstrings: "
                      "longer targets left out (default: 64)")
    decode = parser.add_argument_group("decoding")
    decode.add_argument("--max_new_tokens", type=int,
                        help="greedy decoding limit (default: 96 verses, 1024 chapters, 64 docstrings)")
    decode.add_argument("--no_repetition_guard", action="store_true",
                        help="plain greedy decoding, without examples/main_job.py's no_repeat_ngram_size=3 and "
                        "repetition_penalty=1.2 (default: with them, for every model alike)")
    data.add_argument("--data_dir", type=Path, default=DATA_DIR,
                      help="verses and chapters: folder of {train,validation,test}.jsonl with en, es, book, chapter "
                      "(and verse) fields (default: the shipped sample, examples/data/bible)")
    parser.add_argument("--output_dir", type=Path,
                        help="where the tokenizer is cached (default: the folder of --json, else "
                        "outputs/bench_quality)")
    add_run_file_arguments(parser,
                           plot_help="write a PNG of held-out loss against training seconds and against tokens seen",
                           overwrite_help="run (model, seed) pairs already in --json again")
    args = parser.parse_args(argv)

    preset = {**DEFAULTS, **TASK_DEFAULTS[args.task], **(QUICK if args.quick else {})}
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.models = list(dict.fromkeys(args.models))
    args.seeds = list(dict.fromkeys(args.seeds))
    for name in args.models:
        try:
            parse_model_name(name, ALL_BASELINES)
        except ValueError as error:
            parser.error(f"--models: {error}")
    for name in ("d_model", "layers", "heads", "ffn_dim", "batch_size", "threads", "vocab_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.d_model % args.heads:
        parser.error(f"--heads must divide --d_model ({args.d_model}), got {args.heads}")
    if args.eval_every_seconds <= 0 or args.lr <= 0:
        parser.error("--eval_every_seconds and --lr must be positive")
    if args.minutes < 0 or args.warmup_steps < 0 or not 0 <= args.dropout < 1:
        parser.error("--minutes and --warmup_steps must be >= 0 and --dropout in [0, 1)")
    if args.minutes == 0 and args.max_steps is None:
        parser.error("--minutes 0 (no time budget) needs --max_steps")
    # settings of other tasks do not apply, and must not split files
    if args.task == "verses":
        args.min_source_tokens = args.max_source_tokens = args.max_target_tokens = args.bart_long = None
    else:
        args.max_tokens = None
    if args.task == "docstrings":
        args.min_source_tokens = args.bart_long = None
        if args.data_dir != DATA_DIR:
            parser.error("--data_dir does not apply to --task docstrings, which builds its data from the standard "
                         "library of the running interpreter")
    if args.task == "chapters" and args.min_source_tokens > args.max_source_tokens:
        parser.error("--min_source_tokens must be <= --max_source_tokens")
    args.repetition_guard = not args.no_repetition_guard
    if args.output_dir is None:
        args.output_dir = args.json.parent if args.json is not None else ROOT / "outputs" / "bench_quality"
    return args


# ----------------------------------------------------------------------------------------------------- data


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_data_builder(script: str, *arguments: str | Path) -> None:
    """Run `python examples/data/SCRIPT ARGUMENTS`, the builder's own command line; what it prints goes to stderr."""
    command = [sys.executable, str(DATA_BUILDERS / script), *map(str, arguments)]
    proc = subprocess.run(command, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        print(f"[{script}] {line}", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"`{shlex.join(command)}` failed with exit status {proc.returncode}:\n{proc.stderr[-3000:]}")


def docstring_splits() -> dict[str, list[dict]]:
    """The function records of `build_docstrings.py` (train, validation and test), from the running interpreter's
    standard library."""
    with tempfile.TemporaryDirectory() as folder:
        run_data_builder("build_docstrings.py", "--output_dir", folder, "--kinds", "function")
        return {file: read_jsonl(Path(folder) / f"{file}.jsonl") for file in ("train", "validation", "test")}


def chapter_pairs(rows: list[dict]) -> list[dict]:
    """The verses of each (book, chapter), in file order, joined with spaces (as `build_bible.py --level chapter`
    writes them, whose records pass through unchanged); the verses of a chapter must be 1..n in order."""
    if rows and "verse" not in rows[0]:
        return rows
    chapters: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        chapters.setdefault((r["book"], r["chapter"]), []).append(r)
    pairs = []
    for (book, chapter), verses in chapters.items():
        numbers = [v["verse"] for v in verses]
        if numbers != list(range(1, len(verses) + 1)):
            raise ValueError(f"{book} {chapter}: verses {numbers[:5]}... are not 1..n in order")
        pairs.append({"id": f"{book} {chapter}", "en": " ".join(v["en"] for v in verses),
                      "es": " ".join(v["es"] for v in verses), "verses": len(verses)})
    return pairs


def raw_splits(args: argparse.Namespace) -> dict[str, list[dict]]:
    """{"train", "heldout", "test"}: rows with `source` and `target` text."""
    built = docstring_splits() if args.task == "docstrings" else None
    splits = {}
    for name, file in (("train", "train"), ("heldout", "validation"), ("test", "test")):
        if built is not None:
            splits[name] = [{"source": r["source"], "target": r["docstring"]} for r in built[file]]
            continue
        rows = read_jsonl(args.data_dir / f"{file}.jsonl")
        rows = chapter_pairs(rows) if args.task == "chapters" else rows
        splits[name] = [{"source": r["en"], "target": r["es"]} for r in rows]
    if args.train_examples:
        splits["train"] = splits["train"][:args.train_examples]
    return splits


def get_tokenizer(train_rows: list[dict], args: argparse.Namespace) -> tuple[PreTrainedTokenizerFast, Path, str]:
    """The BPE of the training text, trained once by `train_tokenizer.py` and cached under --output_dir (keyed by
    its text and size)."""
    texts = [text for r in train_rows for text in (r["source"], r["target"])]
    text_hash = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    folder = args.output_dir / f"bench_quality_tokenizer_{args.vocab_size}_{text_hash}"
    if (folder / "tokenizer.json").exists():
        print(f"[tokenizer] loading from {folder}", file=sys.stderr, flush=True)
    else:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:  # the training text, as the pairs the builder reads
            text_file = Path(scratch) / "train.jsonl"
            text_file.write_text("".join(json.dumps({"source": r["source"], "target": r["target"]}, ensure_ascii=False)
                                         + "\n" for r in train_rows), encoding="utf-8")
            run_data_builder("train_tokenizer.py", "--files", text_file, "--fields", "source", "target",
                             "--vocab_size", str(args.vocab_size), "--output_dir", folder)
        print(f"[tokenizer] trained in {time.perf_counter() - start:.1f} s, saved to {folder}", file=sys.stderr,
              flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) != (PAD_ID, BOS_ID, EOS_ID):
        raise SystemExit(f"tokenizer in {folder} has unexpected special ids")
    sha = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    return tokenizer, folder, sha


def encode_split(rows: list[dict], tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace,
                 name: str) -> tuple[list[dict], dict]:
    """Token ids of the pairs kept, and what was kept or cut."""
    src_ids = tokenizer([r["source"] for r in rows]).input_ids
    tgt_ids = tokenizer([r["target"] for r in rows]).input_ids
    kept, cut_targets = [], 0
    for r, src, tgt in zip(rows, src_ids, tgt_ids):
        if args.task == "chapters":
            if not args.min_source_tokens <= len(src) <= args.max_source_tokens:
                continue
            if len(tgt) > args.max_target_tokens:
                tgt, cut_targets = tgt[:args.max_target_tokens - 1] + [EOS_ID], cut_targets + 1
        else:
            max_source, max_target = ((args.max_tokens, args.max_tokens) if args.task == "verses"
                                      else (args.max_source_tokens, args.max_target_tokens))
            if len(src) > max_source or len(tgt) > max_target:
                continue
        reference = tokenizer.decode(tgt, skip_special_tokens=True)
        kept.append({"source": r["source"], "reference": reference, "src": src, "tgt": tgt, "chars": len(reference)})
    src_lengths = sorted(len(s) for s in src_ids)
    info = {"split": name, "pairs": len(rows), "kept": len(kept), "targets_cut": cut_targets,
            "source_tokens_all": [src_lengths[0], src_lengths[len(src_lengths) // 2], src_lengths[-1]] if rows else [],
            "source_tokens_kept": ([min(len(p["src"]) for p in kept), max(len(p["src"]) for p in kept)]
                                   if kept else []),
            "target_tokens_kept": ([min(len(p["tgt"]) for p in kept), max(len(p["tgt"]) for p in kept)]
                                   if kept else [])}
    return kept, info


def make_data(args: argparse.Namespace) -> tuple[dict[str, list[dict]], dict, PreTrainedTokenizerFast]:
    raw = raw_splits(args)
    tokenizer, folder, sha = get_tokenizer(raw["train"], args)
    splits, described = {}, {}
    for name, rows in raw.items():
        splits[name], described[name] = encode_split(rows, tokenizer, args, name)
    sample_sizes = {"heldout": args.heldout_examples, "test": args.test_examples}
    for name, size in sample_sizes.items():
        if size and size < len(splits[name]):
            picked = sorted(random.Random(1234).sample(range(len(splits[name])), size))
            splits[name] = [splits[name][i] for i in picked]
        described[name]["used"] = len(splits[name])
    described["train"]["used"] = len(splits["train"])
    for name in ("train", "heldout", "test"):
        if not splits[name]:
            raise SystemExit(f"no {name} pair is left after the length limits: {described[name]}")
    data = {"splits": described, "tokenizer": {"folder": str(folder), "sha256": sha, "vocabulary": len(tokenizer)},
            "notes": data_notes(splits, args)}
    return splits, data, tokenizer


def data_notes(splits: dict[str, list[dict]], args: argparse.Namespace) -> list[str]:
    """Warnings about chapter data too small or too short for what the task is meant to show."""
    if args.task != "chapters":
        return []
    notes = []
    few = {name: len(pairs) for name, pairs in splits.items() if len(pairs) < (200 if name == "train" else 20)}
    if few and args.data_dir.resolve() == DATA_DIR.resolve():
        notes.append("few chapters: " + ", ".join(f"{n} {name}" for name, n in few.items()) + " (the shipped sample "
                     "has 161 train, 11 validation and 24 test chapters before the length limits); "
                     "`python examples/data/build_bible.py --level chapter --output_dir DIR` builds all 1,167 where "
                     "the SWORD packages are installed, then pass `--data_dir DIR`")
    elif few:
        notes.append("few chapters: " + ", ".join(f"{n} {name}" for name, n in few.items()) + " within the length "
                     "limits (the validation and test books of build_bible.py are short ones)")
    for name in ("heldout", "test"):
        longer = sum(len(p["src"]) > BART_DEFAULT_POSITIONS for p in splits[name])
        if longer < len(splits[name]) / 2:
            notes.append(f"only {longer} of {len(splits[name])} {name} sources exceed {BART_DEFAULT_POSITIONS} tokens: "
                         f"the {name} figures say little about inputs beyond BART's default position table")
    return notes


# --------------------------------------------------------------------------------------------------- models


def bart_positions(splits: dict[str, list[dict]], args: argparse.Namespace) -> int:
    """BART's position table: 1024 with `--bart_long truncate`; otherwise the longest source, target or decoded
    sequence (+2, BART's offset), rounded up to a multiple of 64, so that the table holds what the task needs."""
    if args.task == "chapters" and args.bart_long == "truncate":
        return BART_DEFAULT_POSITIONS
    longest = max(len(p[k]) for s in splits.values() for p in s for k in ("src", "tgt"))
    return bart_table_size(max(longest, args.max_new_tokens + 1))


def long_baseline_lengths(splits: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    """LED's position tables: the longest full source of any split, and the longest target or decoded sequence."""
    pairs = [p for s in splits.values() for p in s]
    return dict(longest_source=max(len(p["src"]) for p in pairs),
                longest_target=max(max(len(p["tgt"]) for p in pairs), args.max_new_tokens + 1))


def bart_source_limit(args: argparse.Namespace) -> int | None:
    return BART_DEFAULT_POSITIONS if args.task == "chapters" and args.bart_long == "truncate" else None


def describe_model(name: str, model: PreTrainedModel, args: argparse.Namespace, cut: dict) -> str:
    config = model.config
    if name.startswith("scaleformer"):
        return (f"attention_type {config.attention_type}, rpe_horizon {config.rpe_horizon}, cross_attention_rpe "
                f"{config.cross_attention_rpe}, absolute_positions {config.absolute_positions}, layer_norm_position "
                f"{config.layer_norm_position}, attention_mode {config.attention_mode}, decoder_attention "
                f"{config.decoder_attention}, remaining_count_max {config.remaining_count_max}"
                + (f", decay_rate_range {tuple(config.decay_rate_range)}" if config.attention_type in DECAY_TYPES else "")
                + "; full sources")
    if name == "led":
        return (f"encoder attention window {'/'.join(map(str, sorted(set(config.attention_window))))} per layer, no "
                f"global tokens (sources padded to a multiple of the window), max_encoder_position_embeddings "
                f"{config.max_encoder_position_embeddings} (the longest source, rounded up to the window), "
                f"max_decoder_position_embeddings {config.max_decoder_position_embeddings}; full sources")
    if name == "longt5":
        return (f"encoder_attention_type {config.encoder_attention_type}, local_radius {config.local_radius}, "
                f"global_block_size {config.global_block_size}, d_kv {config.d_kv}, relative attention "
                f"{config.relative_attention_num_buckets} buckets, max distance "
                f"{config.relative_attention_max_distance}, FFN {config.feed_forward_proj}; full sources (attention "
                "cost linear in length)")
    if name == "t5":
        return (f"d_kv {config.d_kv}, relative attention {config.relative_attention_num_buckets} buckets, max "
                f"distance {config.relative_attention_max_distance}, FFN {config.feed_forward_proj}; full sources "
                "(attention cost quadratic in length)")
    text = f"max_position_embeddings {config.max_position_embeddings}"
    if args.task == "chapters":
        if args.bart_long == "table":
            text += " (--bart_long table: enlarged to fit the longest sequence); full sources"
        else:
            text += (" (--bart_long truncate): sources cut to the first 1024 tokens: "
                     + ", ".join(f"{k} {v[0]} of {v[1]}" for k, v in cut.items()))
    else:
        text += " (the longest sequence of the task, rounded up to 64); full sources"
    return text


# ------------------------------------------------------------------------------------------------- training


def batch_of(pairs: list[dict], indices: list[int], source_limit: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, labels) of the pairs at `indices`, sources cut to `source_limit` tokens."""
    return collate([pairs[i]["src"][:source_limit] for i in indices], [pairs[i]["tgt"] for i in indices])


def training_batches(pairs: list[dict], batch_size: int, seed: int):
    """Endless batches of indices, the same for every model of a seed: per epoch, indices sorted by source
    length with random tie-breaks, cut into batches of `batch_size`, the batches shuffled."""
    rng = random.Random(seed)
    while True:
        order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i]["src"]), rng.random()))
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        rng.shuffle(batches)
        yield from batches


@torch.no_grad()
def heldout_loss(model: PreTrainedModel, pairs: list[dict], batch_size: int, source_limit: int | None) -> dict:
    """Summed target cross-entropy (nats) over `pairs`, per target token and per target character."""
    model.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]["src"]))
    total = 0.0
    tokens = chars = 0
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        input_ids, attention_mask, labels = batch_of(pairs, indices, source_limit)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False).logits
        total += F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                 reduction="sum").item()
        tokens += int((labels != -100).sum())
        chars += sum(pairs[i]["chars"] for i in indices)
    model.train()
    return {"loss_per_token": total / tokens, "loss_per_char": total / max(chars, 1), "tokens": tokens, "chars": chars}


@torch.no_grad()
def greedy_decode(model: PreTrainedModel, pairs: list[dict], batch_size: int, source_limit: int | None,
                  tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> list[str]:
    model.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i]["src"]))
    out: dict[int, str] = {}
    guard = REPETITION_GUARD if args.repetition_guard else {}
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        input_ids, attention_mask, _ = batch_of(pairs, indices, source_limit)
        generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1,
                                   max_new_tokens=args.max_new_tokens, decoder_start_token_id=BOS_ID,
                                   eos_token_id=EOS_ID, pad_token_id=PAD_ID, **guard)
        for i, text in zip(indices, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            out[i] = text.strip()
    return [out[i] for i in range(len(pairs))]


def scores(hypotheses: list[str], references: list[str], task: str) -> dict:
    """The task's test scores (METRICS): ROUGE F-measures for docstrings, corpus BLEU and chrF otherwise."""
    if task == "docstrings":  # mean F-measure over examples, x100
        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
        per_example = [scorer.score(reference, hypothesis) for hypothesis, reference in zip(hypotheses, references)]
        return {key: 100 * sum(s[key].fmeasure for s in per_example) / max(1, len(hypotheses))
                for key in ("rouge1", "rouge2", "rougeL")}
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}


def format_scores(values: dict, task: str) -> str:
    return ", ".join(f"{name} {values[key]:.2f}" for key, name in METRICS[task])


def train_one(name: str, seed: int, splits: dict[str, list[dict]], tokenizer: PreTrainedTokenizerFast,
              args: argparse.Namespace) -> dict:
    info = machine_info(torch.get_num_threads())
    start = time.perf_counter()
    limit = bart_source_limit(args) if name == "bart" else None
    size = ModelSize(len(tokenizer), args.d_model, args.layers, args.heads, args.ffn_dim)
    model = build_seq2seq(name, seed, size, args.dropout, bart_positions(splits, args),
                          **long_baseline_lengths(splits, args)).train()
    parameters = count_parameters(model)
    cut = {s: (sum(len(p["src"]) > limit for p in splits[s]), len(splits[s])) for s in splits} if limit else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=WEIGHT_DECAY)
    batches = training_batches(splits["train"], args.batch_size, seed)
    budget_s = 60 * args.minutes if args.minutes > 0 else math.inf
    steps = source_tokens = target_tokens = 0
    train_seconds = eval_seconds = 0.0
    losses: list[float] = []
    curve: list[dict] = []
    bar = tqdm(total=round(budget_s) if budget_s < math.inf else None, desc=f"{name} seed {seed}", unit="s",
               file=sys.stderr, mininterval=2.0, dynamic_ncols=True,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total_fmt} train s [{elapsed}<{remaining}]"
               "{postfix}")

    def evaluate() -> None:
        nonlocal eval_seconds
        t0 = time.perf_counter()
        loss = heldout_loss(model, splits["heldout"], args.batch_size, limit)
        eval_seconds += time.perf_counter() - t0
        curve.append({"step": steps, "train_seconds": train_seconds, "tokens_seen": source_tokens + target_tokens,
                      "target_tokens_seen": target_tokens, "heldout_loss_per_token": loss["loss_per_token"],
                      "heldout_loss_per_char": loss["loss_per_char"],
                      "train_loss": statistics.fmean(losses) if losses else None, "eval_seconds": eval_seconds})
        losses.clear()
        bar.set_postfix_str(f"step {steps}, held-out {loss['loss_per_token']:.3f} nats/token", refresh=True)

    evaluate()
    next_eval = args.eval_every_seconds
    stopped_by = None
    while stopped_by is None:
        t0 = time.perf_counter()
        lr = inverse_sqrt_lr(steps, args.lr, args.warmup_steps)
        input_ids, attention_mask, labels = batch_of(splits["train"], next(batches), limit)
        losses.append(optimizer_step(model, optimizer, lr, input_ids=input_ids, attention_mask=attention_mask,
                                     labels=labels, use_cache=False))
        elapsed = time.perf_counter() - t0
        train_seconds += elapsed
        steps += 1
        source_tokens += int(attention_mask.sum())
        target_tokens += int((labels != -100).sum())
        bar.update(min(elapsed, max(0.0, bar.total - bar.n)) if bar.total else elapsed)
        if args.max_steps is not None and steps >= args.max_steps:
            stopped_by = "max_steps"
        elif train_seconds >= budget_s:
            stopped_by = "minutes"
        if stopped_by is not None or train_seconds >= next_eval:
            evaluate()
            while next_eval <= train_seconds:
                next_eval += args.eval_every_seconds
    bar.close()

    t0 = time.perf_counter()
    hypotheses = greedy_decode(model, splits["test"], args.batch_size, limit, tokenizer, args)
    decode_seconds = time.perf_counter() - t0
    test = scores(hypotheses, [p["reference"] for p in splits["test"]], args.task)
    info["load_average_at_end"] = os.getloadavg()
    final = curve[-1]
    print(f"[{name} seed {seed}] {steps} steps in {train_seconds:.1f} s of training, {eval_seconds:.1f} s of "
          f"evaluation, {decode_seconds:.1f} s of decoding; held-out {final['heldout_loss_per_token']:.3f} nats/token; "
          f"{format_scores(test, args.task)}", file=sys.stderr, flush=True)
    return {
        "model": name, "seed": seed, "parameters": parameters, "description": describe_model(name, model, args, cut),
        "sources_cut": {k: list(v) for k, v in cut.items()},
        "steps": steps, "tokens_seen": source_tokens + target_tokens, "target_tokens_seen": target_tokens,
        "train_seconds": train_seconds, "eval_seconds": eval_seconds, "decode_seconds": decode_seconds,
        "total_seconds": time.perf_counter() - start, "ms_per_step": 1000 * train_seconds / steps,
        "stopped_by": stopped_by, "final_heldout_loss_per_token": final["heldout_loss_per_token"],
        "final_heldout_loss_per_char": final["heldout_loss_per_char"], "test": test,
        "examples": [{"source": p["source"][:300], "generated": h[:300], "reference": p["reference"][:300]}
                     for p, h in list(zip(splits["test"], hypotheses))[:3]],
        "curve": curve, "machine": info,
    }


# ------------------------------------------------------------------------------------------------ reporting


def settings_of(args: argparse.Namespace) -> dict:
    settings = {key: getattr(args, key) for key in SETTING_KEYS}
    if args.task == "docstrings":
        settings["data_dir"] = f"Python {sys.version_info.major}.{sys.version_info.minor} standard library"
        return settings
    data_dir = args.data_dir.resolve()
    settings["data_dir"] = str(data_dir.relative_to(ROOT) if data_dir.is_relative_to(ROOT) else data_dir)
    return settings


def model_order(name: str) -> tuple[int, str]:
    return (0 if name.startswith("scaleformer") else 1 + ALL_BASELINES.index(name), name)


def spread(values: list[float], digits: int = 3) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return (f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def task_title(args: argparse.Namespace) -> str:
    return "Python functions -> docstrings" if args.task == "docstrings" else f"Bible en->es {args.task}"


def print_header(info: dict, args: argparse.Namespace, data: dict) -> None:
    print(f"# Quality per CPU-minute: Scaleformer against BART and T5 ({args.task})")
    print()
    print_machine(info)
    tok = data["tokenizer"]
    print(f"- tokenizer: byte-level BPE of {tok['vocabulary']} tokens trained on the training split, shared by every "
          f"model ({tok['folder']}, sha256 {tok['sha256'][:12]})")
    what = {
        "verses": f"en -> es verse pairs, sources and targets of at most {args.max_tokens} tokens (longer pairs left "
                  "out)",
        "chapters": f"en -> es chapter pairs (verses of one chapter joined), sources of {args.min_source_tokens}-"
                    f"{args.max_source_tokens} tokens, targets cut to {args.max_target_tokens} tokens for every model",
        "docstrings": "functions and methods (source without docstring -> first docstring paragraph), split by "
                      f"package, sources of at most {args.max_source_tokens} and targets of at most "
                      f"{args.max_target_tokens} tokens (longer pairs left out)",
    }[args.task]
    print(f"- data: {settings_of(args)['data_dir']}, {what}" + (" (--quick)" if args.quick else ""))
    for name, d in data["splits"].items():
        counts = f"{d['pairs']} {'chapters' if args.task == 'chapters' else 'pairs'}"
        lengths = d["source_tokens_all"]
        extra = f", source tokens min/median/max {lengths[0]}/{lengths[1]}/{lengths[2]}" if lengths else ""
        cut = f", {d['targets_cut']} targets cut" if d["targets_cut"] else ""
        print(f"  - {name}: {counts}{extra}; {d['kept']} within the limits{cut}; {d['used']} used")
    for note in data["notes"]:
        print(f"  - note: {note}")
    print(f"- models: d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, FFN "
          f"{args.ffn_dim}, dropout {args.dropout:g}, fp32, random init from the seed")
    print(f"- training: batch {args.batch_size} pairs grouped by source length, the same order per seed for every "
          f"model; AdamW lr {args.lr:g} (warm-up {args.warmup_steps} steps, then inverse square root), weight decay "
          f"{WEIGHT_DECAY:g}, gradient norm clipped to {GRAD_CLIP:g}; budget per run: "
          f"{budget_text(args.minutes, args.max_steps)}; held-out loss every {args.eval_every_seconds:g} s of training "
          "(evaluation not counted)")
    guard = "no_repeat_ngram_size 3, repetition_penalty 1.2" if args.repetition_guard else "no repetition guard"
    metrics = ("ROUGE-1/2/L F-measure x100, mean over examples" if args.task == "docstrings"
               else "BLEU and chrF (sacreBLEU)")
    print(f"- test: greedy decoding, at most {args.max_new_tokens} new tokens, {guard}; {metrics}")
    print()


def aggregate(runs: list[dict]) -> dict[str, list[dict]]:
    by_model: dict[str, list[dict]] = {}
    for r in sorted(runs, key=lambda r: (model_order(r["model"]), r["seed"])):
        by_model.setdefault(r["model"], []).append(r)
    return by_model


def print_results(runs: list[dict], copy: dict, args: argparse.Namespace, ran_now: set, json_path: Path | None) -> None:
    by_model = aggregate(runs)
    metrics = METRICS[args.task]
    names = " | ".join(name for _, name in metrics)
    print(f"## Held-out loss at the end of the budget (equal wall-clock), test {' and '.join(n for _, n in metrics)}")
    print()
    print(f"| model | seeds | held-out nats/token: mean ± sd (min-max) | nats/char | {names} | steps | tokens seen "
          "| train s | ms/step | parameters |")
    print("|:---|:---|---:|---:|" + "---:|" * len(metrics) + "---:|---:|---:|---:|---:|")
    for name, rs in by_model.items():
        mean = lambda key: statistics.fmean(r[key] for r in rs)  # noqa: E731
        print(f"| {name} | {', '.join(str(r['seed']) for r in rs)} "
              f"| {spread([r['final_heldout_loss_per_token'] for r in rs])} "
              f"| {spread([r['final_heldout_loss_per_char'] for r in rs], 4)} "
              + "".join(f"| {spread([r['test'][key] for r in rs], 2)} " for key, _ in metrics)
              + f"| {mean('steps'):,.0f} | {mean('tokens_seen'):,.0f} | {mean('train_seconds'):,.1f} "
              f"| {mean('ms_per_step'):,.0f} | {rs[0]['parameters']:,} |")
    print("| copy the source | – | – | – " + "".join(f"| {copy[key]:.2f} " for key, _ in metrics)
          + "| – | – | – | – | – |")
    print()
    print(f"| model | seed | held-out nats/token | {names} | steps | train s | eval s | decode s | stopped by "
          "| load avg start, end (1 min) | date |")
    print("|:---|---:|---:|" + "---:|" * len(metrics) + "---:|---:|---:|---:|:---|:---|:---|")
    for name, rs in by_model.items():
        for r in rs:
            m = r["machine"]
            note = "" if (r["model"], r["seed"]) in ran_now else " (from the JSON)"
            print(f"| {name} | {r['seed']} | {r['final_heldout_loss_per_token']:.3f} "
                  + "".join(f"| {r['test'][key]:.2f} " for key, _ in metrics)
                  + f"| {r['steps']:,} | {r['train_seconds']:,.1f} | {r['eval_seconds']:,.1f} "
                  f"| {r['decode_seconds']:,.1f} | {r['stopped_by']} | {m['load_average_at_start'][0]:.2f}, "
                  f"{m['load_average_at_end'][0]:.2f} | {m['date']}{note} |")
    print()
    for name, rs in by_model.items():
        print(f"- {name}: {rs[0]['description']}")
    if json_path is not None and len(ran_now) < len(runs):
        print(f"- Runs marked (from the JSON) were read from {json_path}, made with the same settings earlier.")
    print()


def evaluate_targets(runs: list[dict], args: argparse.Namespace) -> tuple[str, list[Target]]:
    """The ratio line and the targets of this task, for ScaleformerConfig's default (`DEFAULT_CONFIG_MODEL`):
    on verses its mean held-out loss at most 1% above BART's, on chapters at least 3% below each of BART's,
    LED's and LongT5's; none on docstrings. Means are over each model's seeds."""
    by_model = aggregate(runs)
    loss = {name: statistics.fmean(r["final_heldout_loss_per_token"] for r in rs) for name, rs in by_model.items()}
    baselines = {name: loss[name] for name in ALL_BASELINES if name in loss}
    sf = loss.get(DEFAULT_CONFIG_MODEL)
    if sf is None or not baselines:
        line = (f"{DEFAULT_CONFIG_MODEL} (the default configuration) vs best baseline at equal wall-clock: loss "
                "ratio N/A (the default or every baseline missing)")
    else:
        best = min(baselines, key=baselines.get)
        seeds = {name: len(by_model[name]) for name in [DEFAULT_CONFIG_MODEL, *baselines]}
        line = (f"{DEFAULT_CONFIG_MODEL} (the default configuration) vs best baseline at equal wall-clock: loss "
                f"ratio {sf / baselines[best]:.3f} ({sf:.3f} / {best} {baselines[best]:.3f} nats/token; seeds "
                + ", ".join(f"{k} {v}" for k, v in seeds.items()) + ")")
    if args.task == "docstrings":  # a measurement without a target
        return line, []
    if args.task == "verses":
        name = f"verses: the default's held-out loss at most {100 * (VERSE_TARGET_RATIO - 1):.0f}% above BART's"
        compared = ("bart",)
    else:
        name = (f"chapters: the default's held-out loss at least {100 * (1 - CHAPTER_TARGET_RATIO):.0f}% below each "
                f"of {', '.join(CHAPTER_BASELINES)}")
        compared = CHAPTER_BASELINES
    missing = [m for m in (DEFAULT_CONFIG_MODEL, *compared) if m not in loss]
    if args.quick:
        return line, [Target(name, "N/A", "--quick smoke settings")]
    if missing:
        return line, [Target(name, "N/A", f"no run of {', '.join(missing)} in the report")]
    ratios = {m: sf / loss[m] for m in compared}
    ok = (ratios["bart"] <= VERSE_TARGET_RATIO if args.task == "verses"
          else all(r <= CHAPTER_TARGET_RATIO for r in ratios.values()))
    figure = ", ".join(f"{sf:.3f} vs {m} {loss[m]:.3f} (ratio {r:.3f})" for m, r in ratios.items())
    return line, [Target(name, "PASS" if ok else "FAIL", figure)]


def curve_band(rs: list[dict], axis: str):
    """Grid, mean and min/max of held-out loss across seeds, each run interpolated onto the grid."""
    import numpy as np

    end = min(r["curve"][-1][axis] for r in rs)
    grid = np.linspace(0.0, end, 60) if end > 0 else np.zeros(1)
    ys = np.array([np.interp(grid, [p[axis] for p in r["curve"]], [p["heldout_loss_per_token"] for p in r["curve"]])
                   for r in rs])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def write_plot(path: Path, runs: list[dict], args: argparse.Namespace) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for index, (name, rs) in enumerate(aggregate(runs).items()):
        for ax, axis in zip(axes, ("train_seconds", "tokens_seen")):
            grid, mean, low, high = curve_band(rs, axis)
            ax.plot(grid, mean, color=f"C{index}", label=f"{name} ({len(rs)} seed{'s' * (len(rs) > 1)})")
            if len(rs) > 1:
                ax.fill_between(grid, low, high, color=f"C{index}", alpha=0.2)
    axes[0].set_xlabel("training wall-clock (s, evaluation excluded)")
    axes[1].set_xlabel("tokens seen (source + target, no padding)")
    axes[0].set_ylabel("held-out cross-entropy (nats / target token)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    threads = f"{args.threads} thread" + "s" * (args.threads != 1)
    save_figure(fig, path, f"{task_title(args)}: d_model {args.d_model}, {args.layers}+{args.layers} layers, batch "
                f"{args.batch_size}, {threads}; mean and min-max across seeds", fontsize=10)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = start_report(args.threads)
    splits, data, tokenizer = make_data(args)
    settings = {**settings_of(args), "tokenizer_sha256": data["tokenizer"]["sha256"]}
    store = RunFile(BENCHMARK, args, settings, run_key)
    print_header(info, args, data)

    copy = scores([p["source"] for p in splits["test"]], [p["reference"] for p in splits["test"]], args.task)
    report = {"benchmark": BENCHMARK, "settings": settings, "machine": info, "data": data,
              "copy_baseline": copy, "runs": list(store.runs.values())}
    keys = [(name, seed) for seed in args.seeds for name in args.models]
    store.run_missing(keys, lambda name, seed: train_one(name, seed, splits, tokenizer, args),
                      lambda k: f"{k[0]} seed {k[1]}", report)
    all_runs = list(store.runs.values())
    if all_runs:
        print_results(all_runs, copy, args, store.ran_now, args.json)
    line, targets = evaluate_targets(all_runs, args)
    print(line)
    print()
    print_targets(targets, none=f"none for {args.task}")
    info["load_average_at_end"] = os.getloadavg()
    report.update(ratio_line=line, targets=[t._asdict() for t in targets])
    store.write(report)
    if args.plot is not None and all_runs:
        write_plot(args.plot, all_runs, args)
    print(f"Summary: {store.summary()}; copy baseline {format_scores(copy, args.task)}; {load_summary(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
