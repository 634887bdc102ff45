"""Greedy generation with Scaleformer against BART and T5 of the same size: ms per token and cache bytes.

What is measured, for batch 1, fp32, eval mode, random weights (`torch.manual_seed`), for each model of
`--models` (default: `scaleformer bart`):

* `scaleformer`: `ScaleformerForConditionalGeneration`, default configuration (`local_softmax_decay`, horizon 16;
  figures recorded before 2026-11-23 ran `kernelized_rpe`), decoding from its constant-size `ScaleformerCache`;
* `scaleformer:TYPE`: the same with another `attention_type` (`ops_registry.ATTENTION_TYPES`). The softmax types (softmax, shaw_softmax, xl_relative) keep every key
  and value in their `ScaleformerCache`, so their cache grows by one token a step, as BART's does;
* `bart`: `transformers.BartForConditionalGeneration` with its default attention implementation,
  decoding from its key/value `EncoderDecoderCache` (self-attention keys and values grow by one
  token a step; cross-attention keys and values are computed once);
* `t5`: `transformers.T5ForConditionalGeneration`, d_kv = d_model / heads, ReLU FFN, tied embeddings,
  relative attention buckets at their defaults (32 buckets, max distance 128), decoding from the same
  kind of `EncoderDecoderCache` as BART. Its attention is quadratic: in transformers 5.23 its default
  implementation is `sdpa`, and the relative position bias goes to SDPA as a dense float mask of shape
  (1, heads, Lq, Lk), so every decoding step attends over the whole history (the header says which
  implementation was used);

all d_model 512, 6 + 6 layers, 8 heads, FFN 2048, vocabulary 32000, special ids pad 0, bos 1, eos 2 and
decoder start 1 for Scaleformer and T5 (BART keeps its own, also below 4). BART has learned absolute
positions, so its `max_position_embeddings` is set to max(source length, new tokens), 4096 by default
(the header says which value was used).

How: one random source of `--source-length` tokens is encoded once per model, then each model decodes
greedily `--new-tokens` tokens in a hand-written loop, one decoder call per token with the cache the
model's own forward returns (`use_cache=True`); end-of-sequence is suppressed, as `generate()` does
with `min_new_tokens == max_new_tokens`. The loops advance in lockstep, rotating which model goes
first, so that a change in machine load hits every model alike. Every step (decoder call, argmax and
the next input) is timed with `time.perf_counter`. Position p is the step that feeds the decoder its
p-th input (the start token is input 1) and returns new token p; the reported ms/token at p is the
median over the `--window` steps ending at p (single steps are noisy on shared machines). Cache bytes
are read after step p: for Scaleformer `ScaleformerCache.nbytes` (all) and `.self_attention_nbytes`,
for BART and T5 the bytes of all key and value tensors of the self-attention and cross-attention
caches. A model whose step raises MemoryError or RuntimeError stops there and is reported as skipped
at that position and above. The tables give each model's figures and, for every other model, its
ms/token over that of the first Scaleformer model of `--models`.

Before timing, the script checks for every model that 16 tokens of the hand-written loop equal
`model.generate(..., do_sample=False)` on the same source, that the raw logits of every step agree
(random weights often repeat one token, so equal tokens alone prove little) and that both leave caches
of the same size; it exits with status 1 if not. The report ends with the targets, PASS or FAIL with
the figure (N/A when `scaleformer` or `bart` is not in `--models`): Scaleformer's ms/token at the last
position within 1.15x of the first (4096 against 128), its self-attention state and its whole cache the
same number of bytes at every step in between, and Scaleformer faster than BART at every position from
a quarter of the new tokens on (1024, 2048, 4096). The exit status is 0 whether or not a target is met.

Run from the repository root with the package installed (`pip install -e ".[bench]"`):

    python benchmarks/bench_generate.py                     # source 2048, 4096 new tokens, ~5 min idle
    python benchmarks/bench_generate.py --quick             # smoke test: source 256, 512 tokens, ~1 min
    python benchmarks/bench_generate.py --json gen.json --plot gen.png
    # every attention type against both baselines, up to 8k decoded positions
    python benchmarks/bench_generate.py --new-tokens 8192 --positions 128 512 1024 2048 4096 8192 \
        --models scaleformer scaleformer:kernelized scaleformer:fourier scaleformer:toeplitz scaleformer:softmax bart t5

The machines this was written for are shared 2-core CPUs: with another job running, 2 torch threads
can collapse, so `--threads` defaults to 1; keep it fixed when comparing runs, and compare the
models within one run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, EncoderDecoderCache

from common import (
    MIB, Target, count_targets, describe_error, load_summary, log2_axis, parse_device, print_machine, print_targets,
    pyplot, rotated, save_figure, start_report, synchronize, write_json,
)
from models import (
    DTYPE, FIRST_PLAIN_ID, MODEL_SIZE, add_models_argument, attention_type_of, build_model, check_models,
    describe_model, grows_with_position, model_configs, reference_model,
)
from modeling_scaleformer import ScaleformerCache


BATCH = 1

DEFAULT_SOURCE_LENGTH = 2048
DEFAULT_NEW_TOKENS = 4096
DEFAULT_POSITIONS = (128, 512, 1024, 2048, 4096)
QUICK_SOURCE_LENGTH = 256
QUICK_NEW_TOKENS = 512
QUICK_POSITIONS = (64, 128, 256, 512)
DEFAULT_WINDOW = 32
VERIFY_TOKENS = 16
VERIFY_LOGITS_TOLERANCE = 1e-4  # the same computation in fp32; a wrong cache moves logits far more

GROWTH_MAX = 1.15  # Scaleformer ms/token at the last position over the first
FASTER_FROM_FRACTION = 4  # Scaleformer must beat BART at positions >= new_tokens / 4 (1024 of 4096)


class CacheBytes(NamedTuple):
    total: int
    self_attention: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark greedy generation of Scaleformer (any attention_type) against BART and T5 of the "
        "same size: ms per token and cache bytes at several decoder positions, and the project's targets.",
    )
    add_models_argument(parser)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: source {QUICK_SOURCE_LENGTH}, {QUICK_NEW_TOKENS} new tokens, positions "
                        f"{', '.join(map(str, QUICK_POSITIONS))}; the models keep their full size")
    parser.add_argument("--source-length", type=int, metavar="N",
                        help=f"source tokens (default: {DEFAULT_SOURCE_LENGTH}, {QUICK_SOURCE_LENGTH} with --quick)")
    parser.add_argument("--new-tokens", type=int, metavar="N",
                        help=f"tokens decoded per model (default: {DEFAULT_NEW_TOKENS}, {QUICK_NEW_TOKENS} with "
                        "--quick)")
    parser.add_argument("--positions", type=int, nargs="+", metavar="P",
                        help="decoder positions to report (default: "
                        f"{', '.join(map(str, DEFAULT_POSITIONS))}; {', '.join(map(str, QUICK_POSITIONS))} "
                        "with --quick)")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help=f"steps ending at each position whose median is reported (default: {DEFAULT_WINDOW})")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument("--device", default="cpu", help="torch device of the models, e.g. cpu, cuda (default: cpu)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the source (default: 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every raw figure to PATH")
    parser.add_argument("--plot", type=Path, metavar="PATH",
                        help="write a PNG of ms/token and cache MiB against position to PATH")
    args = parser.parse_args(argv)

    args.models = check_models(parser, args.models)
    args.device = parse_device(parser, args.device)
    if args.source_length is None:
        args.source_length = QUICK_SOURCE_LENGTH if args.quick else DEFAULT_SOURCE_LENGTH
    if args.new_tokens is None:
        args.new_tokens = QUICK_NEW_TOKENS if args.quick else DEFAULT_NEW_TOKENS
    if args.positions is None:
        args.positions = list(QUICK_POSITIONS if args.quick else DEFAULT_POSITIONS)
    args.positions = sorted(set(args.positions))
    if args.source_length < 1:
        parser.error(f"--source-length must be positive, got {args.source_length}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.window < 1:
        parser.error(f"--window must be at least 1, got {args.window}")
    if args.new_tokens < VERIFY_TOKENS:
        parser.error(f"--new-tokens must be at least {VERIFY_TOKENS}, got {args.new_tokens}")
    if args.positions[0] < args.window:
        parser.error(f"--positions must be >= --window ({args.window}) so that every window is full, "
                     f"got {args.positions[0]}")
    if args.positions[-1] > args.new_tokens:
        parser.error(f"--positions must be <= --new-tokens ({args.new_tokens}), got {args.positions[-1]}")
    return args


def bart_max_positions(args: argparse.Namespace) -> int:
    """BART's learned positions must cover the source and every decoder position."""
    return max(args.source_length, args.new_tokens)


def build_models(args: argparse.Namespace) -> dict[str, PreTrainedModel]:
    """The models of `--models` at the same size, random weights seeded from `--seed`, eval mode, fp32."""
    configs = model_configs(MODEL_SIZE, bart_max_positions(args), args.models)
    return {name: build_model(name, config, args.seed).to(args.device).eval() for name, config in configs.items()}


def make_source(args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    """Random source ids (no special token of any model) and its all-ones attention mask."""
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(FIRST_PLAIN_ID, MODEL_SIZE.vocab_size, (BATCH, args.source_length), generator=g)
    input_ids = input_ids.to(args.device)
    return input_ids, torch.ones_like(input_ids)


def eos_ids(model: PreTrainedModel) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def cache_bytes(cache: Cache) -> CacheBytes:
    """Bytes held by a ScaleformerCache, or by the key/value tensors of an EncoderDecoderCache."""
    if isinstance(cache, ScaleformerCache):
        return CacheBytes(cache.nbytes, cache.self_attention_nbytes)
    if isinstance(cache, EncoderDecoderCache):
        self_bytes = kv_bytes(cache.self_attention_cache)
        return CacheBytes(self_bytes + kv_bytes(cache.cross_attention_cache), self_bytes)
    raise TypeError(f"cannot count the bytes of a {type(cache).__name__}")


def kv_bytes(cache: Cache) -> int:
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, Tensor):
                total += t.numel() * t.element_size()
    return total


class GreedyDecoder:
    """Greedy decoding by hand: encoder once, then one decoder call per token with the model's cache.

    End-of-sequence logits are set to -inf before the argmax, as `generate()` does while fewer than
    `min_new_tokens` tokens have been produced.
    """

    def __init__(self, model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, *, keep_logits: bool = False):
        self.model = model
        self.keep_logits = keep_logits
        self.attention_mask = attention_mask
        self.suppressed = eos_ids(model)
        self.device = input_ids.device
        start = time.perf_counter()
        with torch.no_grad():
            self.encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        synchronize(self.device)
        self.encode_s = time.perf_counter() - start
        start_id = model.generation_config.decoder_start_token_id
        self.next_input = torch.full((input_ids.shape[0], 1), start_id, dtype=torch.long, device=self.device)
        self.cache: Cache | None = None
        self.tokens: list[Tensor] = []
        self.step_s: list[float] = []
        self.logits: list[Tensor] = []  # raw last-position logits of every step, with keep_logits

    def step(self) -> None:
        """One decoder call on the last token; appends the new token and the call's wall time."""
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model(
                encoder_outputs=self.encoder_outputs,
                attention_mask=self.attention_mask,
                decoder_input_ids=self.next_input,
                past_key_values=self.cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :].to(dtype=torch.float32, copy=True)
            if self.keep_logits:
                self.logits.append(logits.clone())
            if self.suppressed:
                logits[:, self.suppressed] = float("-inf")
            token = logits.argmax(dim=-1, keepdim=True)
        synchronize(self.device)
        self.step_s.append(time.perf_counter() - start)
        self.cache = out.past_key_values
        self.next_input = token
        self.tokens.append(token)

    def generated(self) -> Tensor:
        """(B, steps) tokens produced so far."""
        return torch.cat(self.tokens, dim=1)


def verify(models: dict[str, PreTrainedModel], input_ids: Tensor, attention_mask: Tensor) -> list[dict]:
    """The hand-written loop against `generate(do_sample=False)`: same tokens, logits and cache size.

    Random weights often repeat one token, so the raw logits of every step are compared as well. A model
    that raises MemoryError or RuntimeError here gets a check with its `error` and no verdict: it is skipped.
    """
    checks = []
    for name, model in models.items():
        try:
            with torch.no_grad():
                reference = model.generate(
                    input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1,
                    min_new_tokens=VERIFY_TOKENS, max_new_tokens=VERIFY_TOKENS,
                    return_dict_in_generate=True, output_logits=True,
                )
            decoder = GreedyDecoder(model, input_ids, attention_mask, keep_logits=True)
            for _ in range(VERIFY_TOKENS):
                decoder.step()
        except (MemoryError, RuntimeError) as error:
            checks.append({"model": name, "tokens": VERIFY_TOKENS, "error": describe_error(error), "passed": None})
            gc.collect()
            continue
        expected = reference.sequences[:, 1:]  # generate() returns the start token first
        manual = decoder.generated()
        logits_err = max((a.float() - b).abs().max().item() for a, b in zip(reference.logits, decoder.logits))
        ref_bytes, manual_bytes = cache_bytes(reference.past_key_values), cache_bytes(decoder.cache)
        checks.append({
            "model": name, "tokens": VERIFY_TOKENS,
            "generate_tokens": expected.tolist(), "manual_tokens": manual.tolist(),
            "tokens_equal": torch.equal(expected, manual),
            "distinct_tokens": len(set(manual.flatten().tolist())),
            "logits_max_abs_err": logits_err, "logits_tolerance": VERIFY_LOGITS_TOLERANCE,
            "generate_cache_bytes": ref_bytes._asdict(), "manual_cache_bytes": manual_bytes._asdict(),
            "cache_bytes_equal": ref_bytes == manual_bytes,
        })
    for c in checks:
        if "error" not in c:
            logits_ok = c["logits_max_abs_err"] <= VERIFY_LOGITS_TOLERANCE
            c["passed"] = c["tokens_equal"] and c["cache_bytes_equal"] and logits_ok
    return checks


def print_verification(checks: list[dict], source_length: int) -> None:
    print(f"## Verification: hand-written greedy loop against generate(do_sample=False), "
          f"{VERIFY_TOKENS} tokens, source {source_length}")
    print()
    for c in checks:
        if "error" in c:
            print(f"- SKIPPED {c['model']}: {c['error']}")
            continue
        manual = c["manual_cache_bytes"]
        print(f"- {'PASS' if c['passed'] else 'FAIL'} {c['model']}: tokens "
              f"{'equal' if c['tokens_equal'] else 'DIFFER'} ({c['distinct_tokens']} distinct in {c['tokens']}); "
              f"logits max abs err {c['logits_max_abs_err']:.1e} (<= {c['logits_tolerance']:.0e}); cache bytes "
              f"{'equal' if c['cache_bytes_equal'] else 'DIFFER'} ({manual['total']:,} here, "
              f"{c['generate_cache_bytes']['total']:,} from generate())")
        if not c["tokens_equal"]:
            print(f"  - generate(): {c['generate_tokens']}")
            print(f"  - loop:       {c['manual_tokens']}")
    print()


class Decoding(NamedTuple):
    decoders: dict[str, GreedyDecoder]
    bytes_after: dict[str, list[CacheBytes]]  # after every completed step
    failed: dict[str, tuple[int, str]]  # model -> (position whose step raised, error); skipped from there on


def run_decoding(models: dict[str, PreTrainedModel], input_ids: Tensor, attention_mask: Tensor,
                 args: argparse.Namespace, skipped: dict[str, str]) -> Decoding:
    """The models decode `--new-tokens` tokens in lockstep, rotating which goes first; cache bytes are read
    after every step. A model whose step raises MemoryError or RuntimeError stops there; the models of
    `skipped` (name -> reason) do not run."""
    decoders = {}
    failed = {name: (1, reason) for name, reason in skipped.items()}
    for name, model in models.items():
        if name in skipped:
            continue
        try:
            decoders[name] = GreedyDecoder(model, input_ids, attention_mask)
        except (MemoryError, RuntimeError) as error:
            failed[name] = (1, f"the encoder raised {describe_error(error)}")
    bytes_after: dict[str, list[CacheBytes]] = {name: [] for name in models}
    running = list(decoders)
    start = time.perf_counter()
    report_every = max(args.new_tokens // 8, 1)
    for step in range(1, args.new_tokens + 1):
        for name in rotated(running, step - 1):
            try:
                decoders[name].step()
            except (MemoryError, RuntimeError) as error:
                failed[name] = (step, describe_error(error))
                running.remove(name)
                decoders[name].cache = None  # free what it held for the models still running
                gc.collect()
                continue
            bytes_after[name].append(cache_bytes(decoders[name].cache))
        if step % report_every == 0:
            print(f"[decode] {step}/{args.new_tokens} tokens in {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
    return Decoding(decoders, bytes_after, failed)


def window_median_s(step_s: list[float], position: int, window: int) -> float:
    """Median wall time of the `window` steps ending at `position` (1-based)."""
    return statistics.median(step_s[position - window:position])


def fmt_mib(n: int) -> str:
    return f"{n / MIB:,.2f}"


def summarize(decoding: Decoding, args: argparse.Namespace) -> list[dict]:
    """One row per position: `{name}_ms`, `{name}_bytes` and `{name}_self_bytes` of every model, None where the
    model stopped before that position."""
    rows = []
    for p in args.positions:
        row = {"position": p}
        for name, after in decoding.bytes_after.items():
            reached = len(after) >= p
            row[f"{name}_ms"] = (window_median_s(decoding.decoders[name].step_s, p, args.window) * 1e3
                                 if reached else None)
            row[f"{name}_bytes"] = after[p - 1].total if reached else None
            row[f"{name}_self_bytes"] = after[p - 1].self_attention if reached else None
        rows.append(row)
    return rows


def skipped_cell(failed: dict[str, tuple[int, str]], name: str) -> str:
    return f"skipped (failed at {failed[name][0]})" if name in failed else "–"


def print_tables(rows: list[dict], decoding: Decoding, args: argparse.Namespace) -> None:
    names = list(decoding.bytes_after)
    ref = reference_model(names)
    others = [name for name in names if name != ref]
    print(f"## Greedy decoding, source {args.source_length}: median ms/token over the {args.window} steps "
          f"ending at each position, cache after that step")
    print()
    columns = ([f"{name} ms/token" for name in names] + [f"{name} / {ref}" for name in others]
               + [f"{name} cache MiB (self-attn)" for name in names])
    print("| position | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for r in rows:
        ms = {name: r[f"{name}_ms"] for name in names}
        cells = [str(r["position"])]
        cells += [skipped_cell(decoding.failed, name) if ms[name] is None else f"{ms[name]:.2f}" for name in names]
        cells += ["–" if ms[name] is None or ms[ref] is None else f"{ms[name] / ms[ref]:.2f}x" for name in others]
        cells += [skipped_cell(decoding.failed, name) if ms[name] is None
                  else f"{fmt_mib(r[f'{name}_bytes'])} ({fmt_mib(r[f'{name}_self_bytes'])})" for name in names]
        print("| " + " | ".join(cells) + " |")
    print()
    print("| model | encoder ms (once) | step 1 ms | mean ms/token, all steps | decoding s, all steps |")
    print("|:---|---:|---:|---:|---:|")
    for name, d in decoding.decoders.items():
        if not d.step_s:
            continue
        print(f"| {name} | {d.encode_s * 1e3:,.1f} | {d.step_s[0] * 1e3:,.1f} | "
              f"{statistics.fmean(d.step_s) * 1e3:.2f} | {sum(d.step_s):,.1f} |")
    print()
    growing = [name for name in names if attention_type_of(name) is not None and grows_with_position(name)]
    notes = [
        "Position p: the decoder call that takes input p (the start token is input 1) and returns new token p; the "
        "self-attention history then holds p tokens. Step 1 also builds Scaleformer's cross-attention summary and "
        "the baselines' cross-attention keys and values.",
        "Cache MiB: Scaleformer `ScaleformerCache.nbytes` (`self_attention_nbytes`); BART and T5: bytes of all key "
        "and value tensors of the self- and cross-attention caches (self-attention alone).",
    ]
    if others:
        notes.insert(1, f"MODEL / {ref}: the model's ms/token over {ref}'s at the same position (above 1: {ref} is "
                        "faster).")
    if growing:
        notes.append(f"{', '.join(growing)}: softmax attention type(s), whose cache holds every key and value and "
                     "so grows by one token a step, as the baselines' does.")
    for name, (position, error) in decoding.failed.items():
        notes.append(f"{name}: skipped from position {position} on: {error}.")
    for note in notes:
        print(f"- {note}")
    print()


def evaluate_targets(rows: list[dict], decoding: Decoding, args: argparse.Namespace) -> list[Target]:
    first, last = rows[0], rows[-1]
    p0, p1 = first["position"], last["position"]
    faster_from = args.new_tokens / FASTER_FROM_FRACTION
    names = {
        "a": f"(a) scaleformer ms/token at position {p1} <= {GROWTH_MAX}x its ms/token at {p0}",
        "b": [f"(b) scaleformer {label} bytes constant from position {p0} to {p1}"
              for label in ("self-attention state", "total cache")],
        "c": [f"(c) scaleformer faster than bart at position {r['position']}" for r in rows
              if r["position"] >= faster_from],
    }
    absent = [name for name in ("scaleformer", "bart") if name not in decoding.bytes_after]
    if "scaleformer" in absent:
        why = "scaleformer is not in --models"
        return [Target(name, "N/A", why) for name in (names["a"], *names["b"], *names["c"])]
    targets = []
    failed = decoding.failed.get("scaleformer")
    stopped = f"stopped at position {failed[0]} ({failed[1]})" if failed else ""
    if last["scaleformer_ms"] is None:
        targets.append(Target(names["a"], "FAIL", stopped))
    else:
        ratio = last["scaleformer_ms"] / first["scaleformer_ms"]
        targets.append(Target(
            names["a"], "PASS" if ratio <= GROWTH_MAX else "FAIL",
            f"{ratio:.2f}x ({last['scaleformer_ms']:.2f} ms against {first['scaleformer_ms']:.2f} ms)",
        ))
    span = decoding.bytes_after["scaleformer"][p0 - 1:p1]
    for name, field in zip(names["b"], ("self_attention", "total")):
        sizes = sorted({getattr(b, field) for b in span})
        if len(span) < p1 - p0 + 1:
            targets.append(Target(name, "FAIL", stopped))
            continue
        constant = len(sizes) == 1
        figure = (f"{sizes[0]:,} bytes at every step" if constant
                  else f"{len(sizes)} sizes, {sizes[0]:,} to {sizes[-1]:,} bytes")
        targets.append(Target(name, "PASS" if constant else "FAIL", figure))
    for name, r in zip(names["c"], [r for r in rows if r["position"] >= faster_from]):
        if absent:
            targets.append(Target(name, "N/A", "bart is not in --models"))
        elif r["scaleformer_ms"] is None:
            targets.append(Target(name, "FAIL", stopped))
        elif r["bart_ms"] is None:
            position, error = decoding.failed["bart"]
            targets.append(Target(name, "N/A", f"bart stopped at position {position} ({error})"))
        else:
            speedup = r["bart_ms"] / r["scaleformer_ms"]
            targets.append(Target(
                name, "PASS" if speedup > 1 else "FAIL",
                f"bart / scaleformer {speedup:.2f}x ({r['scaleformer_ms']:.2f} ms against {r['bart_ms']:.2f} ms)",
            ))
    return targets


def rolling_medians_ms(step_s: list[float], window: int) -> tuple[list[int], list[float]]:
    positions = list(range(window, len(step_s) + 1))
    return positions, [window_median_s(step_s, p, window) * 1e3 for p in positions]


def write_plot(path: Path, decoding: Decoding, args: argparse.Namespace) -> None:
    fig, (ax_time, ax_mem) = pyplot().subplots(1, 2, figsize=(12, 4.5))
    for name, after in decoding.bytes_after.items():
        color = f"C{list(decoding.bytes_after).index(name) % 10}"
        if not after:
            continue
        step_s = decoding.decoders[name].step_s
        xs, ys = rolling_medians_ms(step_s, args.window)
        ax_time.plot(xs, ys, linewidth=1, color=color, label=f"{name} (rolling median of {args.window})")
        reached = [p for p in args.positions if p <= len(step_s)]
        ax_time.plot(reached, [window_median_s(step_s, p, args.window) * 1e3 for p in reached],
                     marker="o", linestyle="none", color=color)
        steps = range(1, len(after) + 1)
        ax_mem.plot(steps, [b.total / MIB for b in after], color=color, label=f"{name}, total")
        ax_mem.plot(steps, [b.self_attention / MIB for b in after], linestyle="--", color=color,
                    label=f"{name}, self-attention")
    for ax, ticks in ((ax_time, args.positions), (ax_mem, [1, *args.positions])):
        log2_axis(ax, ticks)
        ax.set_xlabel("decoder position")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small" if len(decoding.bytes_after) > 2 else None)
    ax_time.set_ylabel("ms / token")
    ax_time.set_ylim(bottom=0)
    ax_mem.set_ylabel("cache MiB")
    ax_mem.set_yscale("log")
    size = MODEL_SIZE
    save_figure(fig, path, f"greedy decoding, source {args.source_length}, d_model {size.d_model}, "
                f"{size.layers}+{size.layers} layers, fp32, {torch.get_num_threads()} thread(s)")


def print_header(info: dict, models: dict[str, PreTrainedModel], args: argparse.Namespace) -> None:
    size = MODEL_SIZE
    print(f"# Greedy generation benchmark: {', '.join(models)}")
    print()
    print_machine(info, "torch thread(s)")
    quick = " (the same with --quick)" if args.quick else ""
    print(f"- every model: d_model {size.d_model}, {size.layers}+{size.layers} layers, {size.heads} heads, FFN "
          f"{size.ffn_dim}, vocabulary {size.vocab_size}{quick}; random init (seed {args.seed}), eval, fp32, "
          f"batch {BATCH}; device {args.device}")
    for name, model in models.items():
        print(f"- {describe_model(name, model, 'max(source, new tokens)', decoding=True)}")
    print(f"- source {args.source_length} random tokens; {args.new_tokens} new tokens per model, end-of-sequence "
          f"suppressed; positions {', '.join(map(str, args.positions))}; window {args.window} steps; the "
          "models step in lockstep, rotating which goes first")
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = start_report(args.threads)
    models = build_models(args)
    input_ids, attention_mask = make_source(args)
    print_header(info, models, args)

    checks = verify(models, input_ids, attention_mask)
    print_verification(checks, args.source_length)
    if any(c["passed"] is False for c in checks):
        print("Summary: verification FAIL, nothing timed")
        return 1

    skipped = {c["model"]: f"verification raised {c['error']}" for c in checks if "error" in c}
    decoding = run_decoding(models, input_ids, attention_mask, args, skipped)
    rows = summarize(decoding, args)
    print_tables(rows, decoding, args)
    targets = evaluate_targets(rows, decoding, args)
    print_targets(targets)

    info["load_average_at_end"] = os.getloadavg()
    if args.json is not None:
        write_json(args.json, {
            "machine": info,
            "settings": {"model_size": MODEL_SIZE._asdict(), "quick": args.quick, "dtype": str(DTYPE), "batch": BATCH,
                         "device": str(args.device),
                         "source_length": args.source_length, "new_tokens": args.new_tokens,
                         "positions": args.positions, "window": args.window, "seed": args.seed,
                         "models": args.models, "bart_max_position_embeddings": bart_max_positions(args)},
            "verification": checks,
            "rows": rows,
            "encode_s": {name: d.encode_s for name, d in decoding.decoders.items()},
            "step_s": {name: d.step_s for name, d in decoding.decoders.items()},
            "cache_bytes": {name: [b._asdict() for b in after] for name, after in decoding.bytes_after.items()},
            "skipped": [{"model": name, "position": position, "reason": error}
                        for name, (position, error) in decoding.failed.items()],
            "targets": [t._asdict() for t in targets],
        })
        print(f"- raw figures written to {args.json}")
    if args.plot is not None:
        write_plot(args.plot, decoding, args)

    print(f"Summary: verification PASS; {count_targets(targets)}; {load_summary(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
