r"""ListOps (Nangia & Bowman 2018) as in the Long Range Arena (Tay et al. 2020): a seeded generator, an evaluator,
a fixed vocabulary and a JSONL writer.

An example is a nested list of operations on single digits, written with whitespace between tokens,

    [MAX 2 9 [MIN 4 7 ] 0 ]        ->  9

and its target is the value, a digit, so the task is 10-way classification. The operators are `[MIN`,
`[MAX`, `[MED` (median) and `[SM` (sum modulo 10); each opening token carries its bracket and `]` closes
the list.

Generation follows `lra_benchmarks/data/listops.py` of the LRA repository: a node at depth d (the root
has depth 1) is an operator with probability 0.25 while d < `max_depth`, otherwise a uniform digit; an
operator draws its number of arguments uniformly from 2 to `max_args` and its operator uniformly from
the four. Trees are drawn until one has a length (its number of tokens) in range, and duplicates are
dropped, as LRA does with a set. The deviations from that script:

* the length range is inclusive (`min_length <= length <= max_length`; LRA keeps 500 < length < 2000);
* sources are written without the `(` and `)` of LRA's TSV files, which LRA's length does not count;
* a tree is abandoned as soon as it grows past `max_length` (the same examples come out, faster);
* targets come from `evaluate_listops`, which parses the written source, not from the tree;
* files are JSONL with `source` and `target`, and the vocabulary is fixed (`LISTOPS_VOCAB`).

`[MED` is `int(np.median(values))` as in LRA: for an even count, the mean of the two middle values of
the sorted list rounded down, which may be a digit absent from the list (`[MED 2 4 ]` is 3).

The labels are skewed (MIN and MAX favour the extreme digits, MED the middle ones); the CLI prints the
distribution and the majority-class rate, the accuracy of always predicting the most common label.

Run from the repository root:

    python benchmarks/listops.py --out data/listops --train 2000 --valid 200 --test 200 \
        --min_length 500 --max_length 2000 --seed 0
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path


MIN, MAX, MED, SUM_MOD, CLOSE = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
DIGITS = tuple(str(d) for d in range(10))
PAD = "<pad>"
# id 0 is padding; sources never contain it
LISTOPS_VOCAB = (PAD, *OPERATORS, CLOSE, *DIGITS)
TOKEN_TO_ID = {token: i for i, token in enumerate(LISTOPS_VOCAB)}
PAD_ID = TOKEN_TO_ID[PAD]
NUM_LABELS = 10
# probability that a node above the depth limit is an operator (VALUE_P of the LRA script)
OPERATOR_PROBABILITY = 0.25
# draws per requested example before giving up on a length range that (almost) no tree reaches
ATTEMPTS_PER_EXAMPLE = 10_000


def tokenize(source: str) -> list[int]:
    """Token ids of a ListOps source: one id per whitespace-separated token of `LISTOPS_VOCAB`.

    Args:
        source (`str`):
            A source such as `"[MAX 2 9 [MIN 4 7 ] 0 ]"`.

    Returns:
        `list[int]`: the ids, as many as the source has tokens (no padding, no special tokens).
    """
    ids = []
    for token in source.split():
        if token not in TOKEN_TO_ID or token == PAD:
            raise ValueError(
                f"`source` may contain only the tokens {LISTOPS_VOCAB[1:]} separated by whitespace, got {token!r}"
            )
        ids.append(TOKEN_TO_ID[token])
    return ids


def detokenize(ids: Iterable[int]) -> str:
    """The source of token ids, padding ids dropped: `detokenize(tokenize(s)) == " ".join(s.split())`.

    Args:
        ids (`Iterable[int]`):
            Ids of `LISTOPS_VOCAB`.
    """
    tokens = []
    for i in ids:
        i = int(i)
        if not 0 <= i < len(LISTOPS_VOCAB):
            raise ValueError(f"`ids` must be in [0, {len(LISTOPS_VOCAB)}), got {i}")
        if i != PAD_ID:
            tokens.append(LISTOPS_VOCAB[i])
    return " ".join(tokens)


def apply_operator(operator: str, values: list[int]) -> int:
    """The value of `operator` over `values` (digits), with LRA's integer median."""
    if operator == MIN:
        return min(values)
    if operator == MAX:
        return max(values)
    if operator == SUM_MOD:
        return sum(values) % 10
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    # int(np.median(...)) of non-negative integers: the mean of the two middle values, rounded down
    return (ordered[middle - 1] + ordered[middle]) // 2


def evaluate_listops(expr: str) -> int:
    """The value of a ListOps expression, by one left-to-right pass with a stack.

    Args:
        expr (`str`):
            A digit or an operator list such as `"[MAX 2 9 [MIN 4 7 ] 0 ]"`; an operator needs at least one
            argument.

    Returns:
        `int`: the value, a digit in [0, 9].
    """
    stack: list[tuple[str, list[int]]] = []
    result = None
    for position, token in enumerate(expr.split()):
        if result is not None:
            raise ValueError(f"`expr` continues after its complete expression, at token {position} ({token!r})")
        if token in OPERATORS:
            stack.append((token, []))
            continue
        if token == CLOSE:
            if not stack:
                raise ValueError(f"`expr` has an unmatched {CLOSE!r} at token {position}")
            operator, values = stack.pop()
            if not values:
                raise ValueError(f"`expr` has an operator without arguments, {operator!r} closed at token {position}")
            value = apply_operator(operator, values)
        elif token in DIGITS:
            value = int(token)
        else:
            raise ValueError(f"`expr` may contain only the tokens {LISTOPS_VOCAB[1:]}, got {token!r} at {position}")
        if stack:
            stack[-1][1].append(value)
        else:
            result = value
    if stack or result is None:
        raise ValueError(f"`expr` is incomplete: {len(stack)} unclosed operator(s) in {expr[:80]!r}")
    return result


def listops_depth(expr: str) -> int:
    """Depth of the tree of `expr` as the generator counts it: 1 for a digit, 1 + the deepest nesting of lists."""
    depth = deepest = 0
    for token in expr.split():
        if token in OPERATORS:
            depth += 1
            deepest = max(deepest, depth)
        elif token == CLOSE:
            depth -= 1
    return deepest + 1


class _TooLong(Exception):
    pass


def _grow(rng: random.Random, depth: int, max_depth: int, max_args: int, tokens: list[str], limit: int) -> None:
    """Append a random tree (LRA's process) to `tokens`; raise `_TooLong` once `tokens` exceeds `limit`."""
    if depth >= max_depth or rng.random() >= OPERATOR_PROBABILITY:
        tokens.append(DIGITS[rng.randrange(10)])
        return
    slot = len(tokens)
    tokens.append(CLOSE)  # replaced by the operator, drawn after the arguments as in LRA
    for _ in range(rng.randint(2, max_args)):
        _grow(rng, depth + 1, max_depth, max_args, tokens, limit)
        if len(tokens) >= limit:  # the closing bracket still has to come
            raise _TooLong
    tokens[slot] = OPERATORS[rng.randrange(len(OPERATORS))]
    tokens.append(CLOSE)


def generate_listops(
    n: int, *, seed: int, min_length: int, max_length: int, max_depth: int = 10, max_args: int = 10
) -> list[dict]:
    """Draw `n` distinct ListOps examples whose lengths lie in [min_length, max_length].

    Deterministic for a seed, and the examples for `n` are the first `n` of those for any larger count.

    Args:
        n (`int`):
            Number of examples.
        seed (`int`):
            Seed of the generator's own `random.Random` (the global random state is not used).
        min_length (`int`):
            Fewest tokens of an example (inclusive; LRA: 500).
        max_length (`int`):
            Most tokens of an example (inclusive; LRA: 2000).
        max_depth (`int`, *optional*, defaults to 10):
            Maximum depth of a tree, counting the root as 1 and the digits (see `listops_depth`).
        max_args (`int`, *optional*, defaults to 10):
            Maximum number of arguments of an operator (at least 2).

    Returns:
        `list[dict]`: `{"source": str, "target": int}` per example, the target given by `evaluate_listops`.
    """
    lower_bounds = (("n", n, 0), ("min_length", min_length, 1), ("max_depth", max_depth, 1), ("max_args", max_args, 2))
    for name, value, low in lower_bounds:
        if not isinstance(value, int) or value < low:
            raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")
    if not isinstance(max_length, int) or max_length < min_length:
        raise ValueError(f"`max_length` must be an integer >= `min_length` ({min_length}), got {max_length!r}")
    rng = random.Random(seed)
    seen: set[str] = set()
    examples = []
    attempts = 0
    while len(examples) < n:
        attempts += 1
        if attempts > ATTEMPTS_PER_EXAMPLE * n:
            raise ValueError(
                f"`min_length`/`max_length`: only {len(examples)} distinct trees of {min_length} to {max_length} "
                f"tokens came out of {attempts - 1} draws (max_depth={max_depth}, max_args={max_args}); widen the range"
            )
        tokens: list[str] = []
        try:
            _grow(rng, 1, max_depth, max_args, tokens, max_length)
        except _TooLong:
            continue
        if len(tokens) < min_length:
            continue
        source = " ".join(tokens)
        if source in seen:
            continue
        seen.add(source)
        examples.append({"source": source, "target": evaluate_listops(source)})
    return examples


def write_jsonl(examples: Iterable[dict], path: str | Path) -> None:
    """Write one JSON object per line (`{"source": ..., "target": ...}`), creating the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps({"source": example["source"], "target": example["target"]}) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """The examples of a file written by `write_jsonl`."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def describe(name: str, examples: list[dict], majority_label: int | None = None) -> str:
    """Lines of length statistics and label distribution of one split.

    `majority_label` (the train split's most common label) adds the accuracy of always predicting it.
    """
    lengths = sorted(len(e["source"].split()) for e in examples)
    counts = collections.Counter(e["target"] for e in examples)
    total = len(examples)
    label, top = counts.most_common(1)[0]
    deciles = statistics.quantiles(lengths, n=10) if total > 1 else lengths * 9
    lines = [
        f"{name}: {total} examples",
        f"  length: min {lengths[0]}  mean {statistics.fmean(lengths):.1f}  median {statistics.median(lengths):g}  "
        f"p10 {deciles[0]:g}  p90 {deciles[-1]:g}  max {lengths[-1]}",
        f"  depth: max {max(listops_depth(e['source']) for e in examples)}",
        "  labels: " + "  ".join(f"{d}:{counts[d]} ({100 * counts[d] / total:.1f}%)" for d in range(NUM_LABELS)),
        f"  majority-class rate: {top / total:.3f} (label {label})",
    ]
    if majority_label is not None and majority_label != label:
        lines.append(f"  accuracy of the train majority label {majority_label}: {counts[majority_label] / total:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for train.jsonl, valid.jsonl and test.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="training examples (default: 2000)")
    parser.add_argument("--valid", type=int, default=200, help="validation examples (default: 200)")
    parser.add_argument("--test", type=int, default=200, help="test examples (default: 200)")
    parser.add_argument("--min_length", type=int, default=500, help="fewest tokens, inclusive (default: 500)")
    parser.add_argument("--max_length", type=int, default=2000, help="most tokens, inclusive (default: 2000)")
    parser.add_argument("--max_depth", type=int, default=10, help="maximum tree depth (default: 10)")
    parser.add_argument("--max_args", type=int, default=10, help="maximum arguments per operator (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator (default: 0)")
    args = parser.parse_args(argv)
    sizes = {"train": args.train, "valid": args.valid, "test": args.test}
    for name, size in sizes.items():
        if size < 1:
            parser.error(f"--{name} must be >= 1, got {size}")

    start = time.perf_counter()
    # one draw for all splits: examples are distinct, so no source is in two splits
    examples = generate_listops(
        sum(sizes.values()), seed=args.seed, min_length=args.min_length, max_length=args.max_length,
        max_depth=args.max_depth, max_args=args.max_args,
    )
    elapsed = time.perf_counter() - start
    print(
        f"generated {len(examples)} examples of {args.min_length}-{args.max_length} tokens in {elapsed:.2f} s "
        f"(seed {args.seed}, max_depth {args.max_depth}, max_args {args.max_args})"
    )
    splits, offset = {}, 0
    for name, size in sizes.items():
        splits[name], offset = examples[offset : offset + size], offset + size
    majority = collections.Counter(e["target"] for e in splits["train"]).most_common(1)[0][0]
    out = Path(args.out)
    for name, split in splits.items():
        write_jsonl(split, out / f"{name}.jsonl")
        print(describe(name, split, None if name == "train" else majority))
    print(f"wrote {', '.join(str(out / f'{name}.jsonl') for name in splits)}")


if __name__ == "__main__":
    sys.exit(main())
