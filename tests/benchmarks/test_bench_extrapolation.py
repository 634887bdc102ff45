"""bench_extrapolation.py: `--quick` end to end, and its data and scoring checked in process."""

import random
import types
from collections import Counter

import torch


def test_bench_extrapolation_quick(run_report):
    stdout, report = run_report(["benchmarks/bench_extrapolation.py", "--quick"])
    runs = {(r["task"], r["model"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("copy", "scaleformer", 0), ("copy", "t5", 0), ("copy", "bart", 0)}
    for run in runs.values():
        assert [(b["factor"], b["low"], b["high"]) for b in run["bins"]] == [(1, 4, 8), (2, 9, 16)]
        for b in run["bins"]:
            assert 0.0 <= b["exact_match"] <= 1.0 and 0.0 <= b["token_accuracy"] <= 1.0
    assert "never trained" in runs[("copy", "bart", 0)]["description"]
    assert "| copy | scaleformer | 0 |" in stdout and "N/A copy, scaleformer: exact match at 4x" in stdout
    for run in runs.values():
        for b in run["bins"]:
            assert 0.0 <= b["right_length_share"] <= 1.0 and sum(b["count_error_histogram"].values()) > 0
    assert "## How the outputs differ from their references" in stdout and "| copy | bart | 0 | 2x |" in stdout

    # a second call with the same --json skips the runs it holds and reports them unchanged
    stdout, again = run_report(["benchmarks/bench_extrapolation.py", "--quick"], in_process=True)
    assert again["runs"] == report["runs"]
    assert "Summary: 0 run(s) trained now, 3 reported" in stdout


def test_extrapolation_data_and_scoring(import_benchmark):
    be = import_benchmark("bench_extrapolation")

    args = be.parse_args([])
    assert [(b["factor"], b["low"], b["high"]) for b in be.length_bins(args)] == [
        (1, 8, 32), (2, 33, 64), (4, 65, 128), (8, 129, 256)]
    source = [5, 3, 9, 3]
    assert be.target_of("copy", source) == [5, 3, 9, 3]
    assert be.target_of("reverse", source) == [3, 9, 3, 5]
    assert be.target_of("sort", source) == [3, 3, 5, 9]
    args.test_examples = 20
    sets = be.test_sets("sort", args)
    assert sets[0]["examples"] == be.test_sets("sort", args)[0]["examples"]  # fixed by --test_seed
    assert sets[0]["examples"] != be.test_sets("copy", args)[0]["examples"]
    for b in sets:
        for src, tgt in b["examples"]:
            assert b["low"] <= len(src) <= b["high"]
            assert min(src) >= be.FIRST_SYMBOL and max(src) < be.FIRST_SYMBOL + args.symbols
            assert tgt == sorted(src) + [be.EOS_ID]

    examples = [be.make_example("copy", n, 16, random.Random(n)) for n in (3, 5)]

    def stub(answers):
        def generate(input_ids, **kwargs):
            rows = [[be.BOS_ID, *a] for a in answers]
            width = max(map(len, rows))
            return torch.tensor([r + [be.PAD_ID] * (width - len(r)) for r in rows])
        return types.SimpleNamespace(generate=generate, eval=lambda: None, train=lambda: None)

    right = [t for _, t in examples]
    scored = be.score_bin(stub(right), examples, 8)
    assert (scored["exact_match"], scored["token_accuracy"], scored["right_symbols_share"],
            scored["right_length_share"]) == (1.0, 1.0, 1.0, 1.0)
    assert set(scored["count_error_histogram"]) == {"0"}
    # one wrong symbol in the second answer, and a first answer that stops early (no EOS, one symbol short)
    wrong = [right[0][:2], right[1][:2] + [right[1][2] + 1] + right[1][3:]]
    scored = be.score_bin(stub(wrong), examples, 8)
    assert (scored["exact_match"], scored["token_accuracy"]) == (0.0, (2 + 4) / (3 + 5))
    assert scored["right_length_share"] == 0.5
    expected = [be.symbol_counts(w[:len(t) - 1], t[:-1]) for w, t in zip(wrong, right)]
    assert scored["count_error_histogram"] == {
        str(k): v for k, v in sorted(Counter(e for x in expected for e in x["count_errors"]).items())}
    assert scored["count_error_histogram"] != {"0": sum(scored["count_error_histogram"].values())}
    # symbols after the first EOS do not count; an answer that runs on without EOS is not exact
    scored = be.score_bin(stub([right[0] + [7, 7], right[1][:-1] + [7]]), examples, 8)
    assert (scored["exact_match"], scored["token_accuracy"], scored["right_length_share"]) == (0.5, 1.0, 0.5)


def test_symbol_counts(import_benchmark):
    """The output analysis: order, set of symbols, length and per-symbol count errors."""
    be = import_benchmark("bench_extrapolation")
    assert be.symbol_counts([3, 3, 5], [3, 5, 5, 9]) == {
        "sorted": True, "right_symbols": False, "right_length": False, "count_errors": [1, -1, -1]}
    assert be.symbol_counts([5, 3, 3], [3, 3, 5]) == {
        "sorted": False, "right_symbols": True, "right_length": True, "count_errors": [0, 0]}
