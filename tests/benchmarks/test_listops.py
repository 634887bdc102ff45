"""ListOps generator (benchmarks/listops.py): LRA's process, lengths, depth, labels, vocabulary, files, CLI."""

import itertools
import random
import re
import statistics

import pytest


INNERMOST = re.compile(r"\[(MIN|MAX|MED|SM)((?: \d)+) \]")


def brute_force_value(expr: str) -> int:
    """Reduce innermost lists to their value until a digit remains; LRA's median is int(np.median)."""
    reduce = {
        "MIN": min,
        "MAX": max,
        "MED": lambda values: int(statistics.median(values)),
        "SM": lambda values: sum(values) % 10,
    }
    while not expr.isdigit():
        expr, count = INNERMOST.subn(lambda m: str(reduce[m.group(1)]([int(d) for d in m.group(2).split()])), expr)
        assert count, f"no innermost list left in {expr!r}"
    return int(expr)


def structure(expr: str) -> tuple[int, list[int]]:
    """(1 + deepest list nesting, argument count of every list), from the brackets alone."""
    depth = deepest = 0
    open_counts, counts = [], []
    for token in expr.split():
        if token.startswith("["):
            if open_counts:
                open_counts[-1] += 1
            open_counts.append(0)
            depth += 1
            deepest = max(deepest, depth)
        elif token == "]":
            counts.append(open_counts.pop())
            depth -= 1
        elif open_counts:
            open_counts[-1] += 1
    return deepest + 1, counts


def lra_trees(seed: int, max_depth: int, max_args: int):
    """Endless trees of the LRA script's process (`generate_tree` of lra_benchmarks/data/listops.py), as
    (source without parentheses, value by LRA's rules), drawing from one `random.Random(seed)` in its order."""
    rng = random.Random(seed)
    operators = ["[MIN", "[MAX", "[MED", "[SM"]

    def tree(depth):
        if depth < max_depth and rng.random() <= 0.25:
            args = [tree(depth + 1) for _ in range(rng.randint(2, max_args))]
            op = rng.choice(operators)
            values = [value for _, value in args]
            value = {
                "[MIN": min(values),
                "[MAX": max(values),
                "[MED": int(statistics.median(values)),
                "[SM": sum(values) % 10,
            }[op]
            return " ".join([op, *(source for source, _ in args), "]"]), value
        digit = rng.choice(range(10))
        return str(digit), digit

    while True:
        yield tree(1)


HAND_WRITTEN = [
    pytest.param("7", 7, id="digit"),
    pytest.param("[MAX 2 9 [MIN 4 7 ] 0 ]", 9, id="issue-example"),
    pytest.param("[MIN 4 7 ]", 4, id="min"),
    pytest.param("[SM 9 9 9 ]", 7, id="sum-mod"),
    pytest.param("[MED 7 3 5 ]", 5, id="med-odd"),
    # even count: int(np.median) is the floor of the mean of the two middle values, neither middle element
    pytest.param("[MED 2 4 ]", 3, id="med-even-mean"),
    pytest.param("[MED 1 2 ]", 1, id="med-even-floor"),
    pytest.param("[MED 9 0 ]", 4, id="med-even-unsorted"),
    pytest.param("[MED 1 5 2 9 ]", 3, id="med-four"),
    pytest.param("[MED 8 8 1 1 ]", 4, id="med-ties"),
    pytest.param("[SM [MAX 1 2 ] [MED 3 4 5 6 ] 9 ]", 5, id="nested"),
    pytest.param("[MIN [MAX [MED [SM 5 5 ] 9 ] 3 ] 8 ]", 4, id="deep"),
]


@pytest.mark.parametrize("expr, value", HAND_WRITTEN)
def test_evaluate_hand_written(listops, expr, value):
    assert listops.evaluate_listops(expr) == value
    assert brute_force_value(expr) == value


def test_evaluate_all_two_and_three_argument_lists(listops):
    for op, n in itertools.product(listops.OPERATORS, (1, 2, 3)):
        for digits in itertools.product(range(10), repeat=n):
            expr = " ".join([op, *map(str, digits), "]"])
            assert listops.evaluate_listops(expr) == brute_force_value(expr), expr


@pytest.mark.parametrize(
    "expr", ["", "[MAX 1 2", "[MAX ]", "1 2", "]", "[MAX 1 x ]", "[MAX 1 ] ]", "[MAX 1 ] 3", "[max 1 ]"]
)
def test_evaluate_rejects_malformed(listops, expr):
    with pytest.raises(ValueError, match="`expr`"):
        listops.evaluate_listops(expr)


def test_generator_follows_lra_process(listops):
    # with no tree cut short, the accepted trees are exactly those of LRA's process, filtered and deduplicated
    kwargs = dict(seed=3, min_length=8, max_length=10**6, max_depth=6, max_args=5)
    ours = listops.generate_listops(150, **kwargs)
    expected, seen = [], set()
    for source, value in lra_trees(kwargs["seed"], kwargs["max_depth"], kwargs["max_args"]):
        if len(expected) == 150:
            break
        if kwargs["min_length"] <= len(source.split()) <= kwargs["max_length"] and source not in seen:
            seen.add(source)
            expected.append({"source": source, "target": value})
    assert ours == expected


def test_generator_is_deterministic_per_seed(listops):
    kwargs = dict(min_length=20, max_length=80, max_depth=6, max_args=6)
    first = listops.generate_listops(40, seed=0, **kwargs)
    assert first == listops.generate_listops(40, seed=0, **kwargs)
    assert first[:25] == listops.generate_listops(25, seed=0, **kwargs)
    assert first != listops.generate_listops(40, seed=1, **kwargs)


@pytest.mark.parametrize(
    "min_length, max_length, max_depth, max_args",
    [
        pytest.param(1, 30, 3, 4, id="short"),
        pytest.param(20, 60, 5, 3, id="narrow-args"),
        pytest.param(40, 45, 10, 10, id="tight-range"),
        pytest.param(500, 2000, 10, 10, id="lra"),
    ],
)
def test_generated_examples_respect_limits(listops, min_length, max_length, max_depth, max_args):
    n = 30 if min_length >= 500 else 200
    examples = listops.generate_listops(
        n, seed=5, min_length=min_length, max_length=max_length, max_depth=max_depth, max_args=max_args
    )
    assert len(examples) == n
    assert len({e["source"] for e in examples}) == n
    for example in examples:
        source, target = example["source"], example["target"]
        assert min_length <= len(source.split()) <= max_length
        depth, arg_counts = structure(source)
        assert depth <= max_depth and depth == listops.listops_depth(source)
        assert all(2 <= count <= max_args for count in arg_counts)
        assert isinstance(target, int) and target == brute_force_value(source)


def test_labels_cover_all_digits_and_match_brute_force(listops):
    examples = listops.generate_listops(300, seed=11, min_length=5, max_length=60, max_depth=5)
    assert {e["target"] for e in examples} == set(range(10))
    for example in examples:
        assert example["target"] == brute_force_value(example["source"])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        pytest.param(dict(min_length=10, max_length=9), "max_length", id="empty-range"),
        pytest.param(dict(min_length=0, max_length=9), "min_length", id="zero-length"),
        pytest.param(dict(min_length=1, max_length=9, max_args=1), "max_args", id="one-arg"),
        pytest.param(dict(min_length=1, max_length=9, max_depth=0), "max_depth", id="depth-0"),
        # no tree has 2 or 3 tokens: a list needs an operator, two arguments and its bracket
        pytest.param(dict(min_length=2, max_length=3), "min_length", id="unreachable"),
    ],
)
def test_generator_rejects_bad_arguments(listops, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        listops.generate_listops(1, seed=0, **kwargs)
    with pytest.raises(ValueError, match="`n`"):
        listops.generate_listops(-1, seed=0, min_length=1, max_length=9)


def test_vocabulary_and_tokenizer_round_trip(listops):
    vocab = listops.LISTOPS_VOCAB
    assert vocab[0] == "<pad>" and listops.PAD_ID == 0
    assert len(set(vocab)) == len(vocab) == 16
    assert set(vocab) == {"<pad>", "[MIN", "[MAX", "[MED", "[SM", "]", *map(str, range(10))}
    for example in listops.generate_listops(50, seed=2, min_length=1, max_length=200):
        ids = listops.tokenize(example["source"])
        assert len(ids) == len(example["source"].split()) and 0 not in ids
        assert listops.detokenize(ids) == example["source"]
        assert listops.detokenize([0, 0, *ids, 0]) == example["source"]
    assert listops.tokenize(" [MAX  2\n9 ] ") == [2, 8, 15, 5]


def test_tokenizer_rejects_unknown_tokens(listops):
    for source in ("[MAX 2 10 ]", "[MAX 2 9]", "<pad> 1", "( [MIN 1 2 ] )"):
        with pytest.raises(ValueError, match="`source`"):
            listops.tokenize(source)
    with pytest.raises(ValueError, match="`ids`"):
        listops.detokenize([3, 16])


def test_jsonl_round_trip(listops, tmp_path):
    examples = listops.generate_listops(20, seed=4, min_length=5, max_length=50)
    path = tmp_path / "sub" / "train.jsonl"
    listops.write_jsonl(examples, path)
    assert listops.read_jsonl(path) == examples
    assert len(path.read_text().splitlines()) == 20


def test_cli_writes_disjoint_splits_and_prints_statistics(listops, tmp_path, capsys):
    listops.main([
        "--out", str(tmp_path), "--train", "40", "--valid", "10", "--test", "10",
        "--min_length", "20", "--max_length", "60", "--seed", "1",
    ])
    printed = capsys.readouterr().out
    splits = {name: listops.read_jsonl(tmp_path / f"{name}.jsonl") for name in ("train", "valid", "test")}
    assert [len(s) for s in splits.values()] == [40, 10, 10]
    sources = [e["source"] for split in splits.values() for e in split]
    assert len(set(sources)) == 60
    assert splits["train"] + splits["valid"] + splits["test"] == listops.generate_listops(
        60, seed=1, min_length=20, max_length=60
    )
    for name in ("train", "valid", "test"):
        assert f"{name}: " in printed
    assert printed.count("majority-class rate") == 3 and "labels: 0:" in printed and "length: min" in printed
