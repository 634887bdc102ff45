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


ROOT = Path(__file__).resolve().parents[1]


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
