"""Smoke tests of the benchmark scripts: `--quick`, narrowed further, runs to the end and writes its report.

Timings are not checked here (they need an idle machine); the scripts' own correctness checks are: a
benchmark whose fast path disagrees with its reference exits with status 1.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def run_script(args: list[str], tmp_path: Path) -> tuple[str, dict]:
    report = tmp_path / "report.json"
    plot = tmp_path / "plot.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, *args, "--json", str(report), "--plot", str(plot)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert plot.stat().st_size > 1000
    return result.stdout, json.loads(report.read_text())


def test_bench_attention_quick(tmp_path):
    stdout, report = run_script(
        ["benchmarks/bench_attention.py", "--quick", "--lengths", "128", "256", "--no-memory", "--max-length", "256"],
        tmp_path,
    )
    assert report["verification"]["passed"]
    variants = {c["mode"].split()[0] for c in report["verification"]["checks"]}
    assert {"kernelized", "fourier", "toeplitz", "shaw_softmax", "xl_relative"} <= variants
    timed = {(t["method"], t["length"]) for t in report["timings"]}
    assert ("toeplitz", 256) in timed and ("sdpa", 128) in timed
    assert "## Variants, fwd+bwd" in stdout and "Summary: verification PASS" in stdout


def test_bench_generate_quick(tmp_path):
    stdout, report = run_script(
        ["benchmarks/bench_generate.py", "--quick", "--source-length", "64", "--new-tokens", "32",
         "--positions", "16", "32", "--window", "4"],
        tmp_path,
    )
    assert "settings" in report and report["settings"]["quick"] is True


@pytest.mark.parametrize("extra", [["--no-memory"]], ids=["no-memory"])
def test_bench_train_quick(tmp_path, extra):
    stdout, report = run_script(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "64", "128", "--repeats", "1", *extra], tmp_path
    )
    assert report


def test_bench_listops_quick(tmp_path):
    stdout, report = run_script(["benchmarks/bench_listops.py", "--quick"], tmp_path)
    runs = {(r["attention_type"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("kernelized_rpe", 0), ("softmax", 0)}
    for run in runs.values():
        assert run["steps"] >= 1 and run["curve"] and 0.0 <= run["test_accuracy"] <= 1.0
    majority = report["majority_baseline"]
    assert 0 <= majority["label"] < 10 and 0.0 <= majority["test_accuracy"] <= 1.0
    assert "| majority class (label" in stdout and "Summary: 2 run(s) trained now" in stdout

    # a second call with the same --json skips the runs it holds and reports them unchanged
    stdout, again = run_script(["benchmarks/bench_listops.py", "--quick"], tmp_path)
    assert again["runs"] == report["runs"]
    assert "Summary: 0 run(s) trained now, 2 reported" in stdout


def test_bench_quality_quick(tmp_path):
    import math

    stdout, report = run_script(["benchmarks/bench_quality.py", "--quick"], tmp_path)
    runs = {(r["model"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("scaleformer", 0), ("bart", 0), ("t5", 0)}
    for run in runs.values():
        assert run["steps"] >= 1 and len(run["curve"]) >= 2
        first, last = run["curve"][0], run["curve"][-1]
        assert first["train_seconds"] == 0 and last["tokens_seen"] == run["tokens_seen"] > 0
        assert all(math.isfinite(p["heldout_loss_per_token"]) and p["heldout_loss_per_char"] > 0
                   for p in run["curve"])
        assert 0.0 <= run["test"]["bleu"] <= 100.0 and 0.0 <= run["test"]["chrf"] <= 100.0
    copy = report["copy_baseline"]
    assert 0.0 <= copy["bleu"] <= 100.0 and copy["chrf"] > 0.0
    # every model shares one tokenizer, cached beside the report
    assert list(tmp_path.glob("bench_quality_tokenizer_*/tokenizer.json"))
    assert "| copy the source |" in stdout and "Scaleformer vs best baseline at equal wall-clock: loss ratio" in stdout
    assert "N/A verses:" in stdout

    # a second call with the same --json skips the runs it holds and reports them unchanged
    stdout, again = run_script(["benchmarks/bench_quality.py", "--quick"], tmp_path)
    assert again["runs"] == report["runs"]
    assert "Summary: 0 run(s) trained now, 3 reported" in stdout


def test_bench_quality_docstrings_quick(tmp_path):
    stdout, report = run_script(
        ["benchmarks/bench_quality.py", "--quick", "--task", "docstrings", "--models", "scaleformer", "bart"], tmp_path
    )
    assert {(r["model"], r["seed"]) for r in report["runs"]} == {("scaleformer", 0), ("bart", 0)}
    rouge = ("rouge1", "rouge2", "rougeL")
    for run in report["runs"]:
        assert set(run["test"]) == set(rouge) and all(0.0 <= run["test"][k] <= 100.0 for k in rouge)
    # copying a function's source shares words with its docstring
    assert set(report["copy_baseline"]) == set(rouge) and report["copy_baseline"]["rouge1"] > 0.0
    assert report["settings"]["data_dir"].endswith("standard library") and report["targets"] == []
    assert report["data"]["splits"]["test"]["used"] == 8
    assert report["data"]["splits"]["train"]["source_tokens_kept"][1] <= 256
    assert "| ROUGE-1 | ROUGE-2 | ROUGE-L |" in stdout and "- none for docstrings" in stdout


def test_bench_quality_rejects_data_dir_for_docstrings(tmp_path):
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_quality.py", "--task", "docstrings", "--data_dir", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "--data_dir does not apply to --task docstrings" in result.stderr


def test_bench_extrapolation_quick(tmp_path):
    stdout, report = run_script(["benchmarks/bench_extrapolation.py", "--quick"], tmp_path)
    runs = {(r["task"], r["model"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("copy", "scaleformer", 0), ("copy", "t5", 0), ("copy", "bart", 0)}
    for run in runs.values():
        assert [(b["factor"], b["low"], b["high"]) for b in run["bins"]] == [(1, 4, 8), (2, 9, 16)]
        for b in run["bins"]:
            assert 0.0 <= b["exact_match"] <= 1.0 and 0.0 <= b["token_accuracy"] <= 1.0
    assert "never trained" in runs[("copy", "bart", 0)]["description"]
    assert "| copy | scaleformer | 0 |" in stdout and "N/A copy, scaleformer: exact match at 4x" in stdout

    # a second call with the same --json skips the runs it holds and reports them unchanged
    stdout, again = run_script(["benchmarks/bench_extrapolation.py", "--quick"], tmp_path)
    assert again["runs"] == report["runs"]
    assert "Summary: 0 run(s) trained now, 3 reported" in stdout


def test_extrapolation_data_and_scoring():
    import random
    import types

    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_extrapolation as be

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
    assert be.score_bin(stub(right), examples, 8) == {"exact_match": 1.0, "token_accuracy": 1.0}
    # one wrong symbol in the second answer, and a first answer that stops early (no EOS, one symbol short)
    wrong = [right[0][:2], right[1][:2] + [right[1][2] + 1] + right[1][3:]]
    scored = be.score_bin(stub(wrong), examples, 8)
    assert scored == {"exact_match": 0.0, "token_accuracy": (2 + 4) / (3 + 5)}
    # symbols after the first EOS do not count; an answer that runs on without EOS is not exact
    assert be.score_bin(stub([right[0] + [7, 7], right[1][:-1] + [7]]), examples, 8) == {
        "exact_match": 0.5, "token_accuracy": 1.0}


def test_save_runs_merges_what_other_processes_wrote(tmp_path):
    """Two processes filling one JSON: each save keeps the other's runs, and a run made here replaces the file's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_listops import save_runs

    path = tmp_path / "runs.json"
    settings = {"size": 1}
    key = lambda run: (run["model"], run["seed"])  # noqa: E731
    first = {("a", 0): {"model": "a", "seed": 0, "value": 1}}
    save_runs(path, {"benchmark": "bench_x", "settings": settings}, first, {("a", 0)}, key, settings, "bench_x")
    # a second process started before "a" existed, made "b", and re-made "a" with --overwrite
    second = {("b", 0): {"model": "b", "seed": 0, "value": 2}, ("a", 0): {"model": "a", "seed": 0, "value": 3}}
    report = {"benchmark": "bench_x", "settings": settings}
    save_runs(path, report, second, {("b", 0), ("a", 0)}, key, settings, "bench_x")
    on_disk = {key(r): r["value"] for r in json.loads(path.read_text())["runs"]}
    assert on_disk == {("a", 0): 3, ("b", 0): 2}
    # the first process saves again without having re-made "a": it takes the file's newer "a"
    save_runs(path, {"benchmark": "bench_x", "settings": settings}, first, set(), key, settings, "bench_x")
    assert first[("a", 0)]["value"] == 3 and ("b", 0) in first
    assert {key(r): r["value"] for r in json.loads(path.read_text())["runs"]} == {("a", 0): 3, ("b", 0): 2}


def test_bench_quality_model_names():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_quality import ModelSpec, parse_model_name

    assert parse_model_name("scaleformer") == ModelSpec("scaleformer", None, False, None, "pre")
    assert parse_model_name("scaleformer+cross_rpe+sinusoidal") == ModelSpec("scaleformer", None, True, "sinusoidal")
    assert parse_model_name("scaleformer:softmax+sinusoidal+post_ln") == ModelSpec(
        "scaleformer", "softmax", False, "sinusoidal", "post")
    assert parse_model_name("scaleformer+post_ln").layer_norm_position == "post"
    assert parse_model_name("t5") == ModelSpec("t5", None)
    for bad in ("scaleformer+sinusoidal+cross_rpe", "scaleformer:softmax+cross_rpe", "bart+sinusoidal",
                "scaleformer:nope", "scaleformer+cross_rpe+cross_rpe", "scaleformer+post_ln+sinusoidal",
                "scaleformer+", "t5+post_ln"):
        with pytest.raises(ValueError, match="unknown model"):
            parse_model_name(bad)


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="needs Linux /proc")
def test_memory_launcher_volunteers_for_the_oom_killer_and_passes_on_its_exit():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_attention import MEMORY_LAUNCHER

    def launch(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", MEMORY_LAUNCHER, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60)

    # the measuring process inherits the launcher's score: first in line, before the benchmark beside it
    assert launch('print(open("/proc/self/oom_score_adj").read())').stdout.strip() == "1000"
    assert launch("import os, signal; os.kill(os.getpid(), signal.SIGKILL)").returncode == -9
    assert launch("raise SystemExit(3)").returncode == 3
