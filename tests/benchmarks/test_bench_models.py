"""`--models` of the generation and training benchmarks: every Scaleformer attention_type, BART and T5 in one run.

Smoke runs, narrowed so that each takes seconds; timings are not checked. What is checked: every model of
`--models` has figures in the JSON and a column in the stdout table, the memory subprocess builds the new
models, and an unknown name is a usage error.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
MODELS = ["scaleformer", "scaleformer:softmax", "bart", "t5"]


def run(args: list[str], tmp_path: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    outputs = [] if tmp_path is None else ["--json", str(tmp_path / "report.json"),
                                           "--plot", str(tmp_path / "plot.png")]
    return subprocess.run([sys.executable, *args, "--threads", "1", *outputs], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def run_report(args: list[str], tmp_path: Path) -> tuple[str, dict]:
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert (tmp_path / "plot.png").stat().st_size > 1000
    return result.stdout, json.loads((tmp_path / "report.json").read_text())


def test_bench_generate_models(tmp_path):
    stdout, report = run_report(
        ["benchmarks/bench_generate.py", "--quick", "--source-length", "32", "--new-tokens", "24",
         "--positions", "16", "24", "--window", "4", "--models", *MODELS],
        tmp_path,
    )
    assert report["settings"]["models"] == MODELS
    assert [c["model"] for c in report["verification"]] == MODELS and all(c["passed"] for c in report["verification"])
    for row in report["rows"]:
        for name in MODELS:
            assert row[f"{name}_ms"] > 0 and row[f"{name}_bytes"] >= row[f"{name}_self_bytes"] > 0
    assert set(report["step_s"]) == set(MODELS) and all(len(s) == 24 for s in report["step_s"].values())
    # kernelized_rpe keeps a constant-size state; softmax attention, BART and T5 gain keys and values every step
    for name in MODELS:
        first, last = report["rows"]
        grows = last[f"{name}_self_bytes"] > first[f"{name}_self_bytes"]
        assert grows == (name != "scaleformer"), name
    header = next(line for line in stdout.splitlines() if line.startswith("| position |"))
    for name in MODELS:
        assert f"| {name} ms/token |" in header and f"| {name} cache MiB (self-attn) |" in header
    for name in MODELS[1:]:
        assert f"| {name} / scaleformer |" in header
    assert "- t5: " in stdout and "attention implementation sdpa" in stdout
    statuses = {t["name"]: t["status"] for t in report["targets"]}
    assert all(s in ("PASS", "FAIL") for s in statuses.values()) and any(n.startswith("(c)") for n in statuses)


def test_bench_generate_targets_without_bart(tmp_path):
    stdout, report = run_report(
        ["benchmarks/bench_generate.py", "--quick", "--source-length", "16", "--new-tokens", "16",
         "--positions", "8", "16", "--window", "4", "--models", "scaleformer", "t5"],
        tmp_path,
    )
    by_target = {t["name"][:3]: t["status"] for t in report["targets"]}
    assert by_target["(a)"] != "N/A" and by_target["(c)"] == "N/A"
    assert "bart is not in --models" in stdout


def test_bench_train_models(tmp_path):
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "64", "--repeats", "1", "--no-memory",
         "--models", *MODELS],
        tmp_path,
    )
    assert report["settings"]["models"] == MODELS
    for key in ("timings", "forward_timings"):
        timed = {(t["model"], t["length"]) for t in report[key] if t["median_s"] > 0}
        assert timed == {(name, length) for name in MODELS for length in (32, 64)}
    assert {(r["model"], r["pass"], r["time"]) for r in report["slopes"] if r["slope"] is not None} == {
        (name, kind, time) for name in MODELS for kind in ("step", "forward") for time in ("wall_s", "user_s")}
    assert "## One forward pass" in stdout and "| 64 | t5 | forward |" in stdout
    header = next(line for line in stdout.splitlines() if line.startswith("| source L | scaleformer s"))
    for name in MODELS:
        assert f"| {name} s |" in header and f"| {name} peak extra MiB |" in header
    for name in MODELS[1:]:
        assert f"| {name} / scaleformer |" in header
        assert f"| {name} | step | wall |" in stdout and f"| {name} | forward | wall |" in stdout
    assert "- t5: " in stdout and "quadratic in length" in stdout
    # (a) is fitted over the lengths measured; (b) needs the memory figure that --no-memory leaves out
    assert report["targets"][0]["status"] in ("PASS", "FAIL") and report["targets"][1]["status"] == "N/A"


def test_bench_train_max_quadratic_length(tmp_path):
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "64", "--repeats", "1", "--no-memory",
         "--max-quadratic-length", "32", "--models", "scaleformer", "scaleformer:softmax", "bart", "t5"],
        tmp_path,
    )
    timed = {(t["model"], t["length"]) for t in report["forward_timings"]}
    assert timed == {("scaleformer", 32), ("scaleformer", 64), ("scaleformer:softmax", 32), ("bart", 32), ("t5", 32)}
    skipped = {(s["model"], s["length"]): s["reason"] for s in report["skipped"]}
    assert set(skipped) == {("scaleformer:softmax", 64), ("bart", 64), ("t5", 64)}
    assert all("--max-quadratic-length 32" in reason for reason in skipped.values())
    assert report["settings"]["bart_max_position_embeddings"] == 128  # the table fits the target, not L=64


def test_bench_train_targets_without_scaleformer(tmp_path):
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "--repeats", "1", "--no-memory",
         "--models", "scaleformer:kernelized", "t5"],
        tmp_path,
    )
    assert [t["status"] for t in report["targets"]] == ["N/A", "N/A"]
    assert "| t5 / scaleformer:kernelized |" in stdout


@pytest.mark.parametrize("model", ["scaleformer:softmax", "t5"])
def test_bench_train_measure_memory(model):
    result = run(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--measure-memory", model, "64"])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["extra_bytes"] > 0 and record["step_s"] > 0


@pytest.mark.parametrize("script", ["bench_generate.py", "bench_train.py"])
def test_unknown_model(script):
    result = run([f"benchmarks/{script}", "--quick", "--models", "scaleformer", "scaleformer:nope"])
    assert result.returncode == 2
    assert "--models" in result.stderr and "'scaleformer:nope'" in result.stderr
    assert "scaleformer:softmax" in result.stderr and "t5" in result.stderr
