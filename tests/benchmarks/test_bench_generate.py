"""bench_generate.py: greedy decoding of every Scaleformer attention_type, BART and T5 in one run.

Smoke runs, narrowed so that each takes seconds; timings are not checked. What is checked: every model of
`--models` has figures in the JSON and a column in the stdout table, and the targets that need a missing model
are N/A.
"""

import pytest


MODELS = ["scaleformer", "scaleformer:softmax", "bart", "t5"]


@pytest.mark.slow  # test_bench_generate_models runs the script with more
def test_bench_generate_quick(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_generate.py", "--quick", "--source-length", "64", "--new-tokens", "32",
         "--positions", "16", "32", "--window", "4", "--device", "cpu"]
    )
    assert "settings" in report and report["settings"]["quick"] is True and report["settings"]["device"] == "cpu"
    assert "device cpu" in stdout


def test_bench_generate_models(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_generate.py", "--quick", "--source-length", "32", "--new-tokens", "24",
         "--positions", "16", "24", "--window", "4", "--models", *MODELS, "--threads", "1", "--device", "cpu"]
    )
    assert report["settings"]["models"] == MODELS and report["settings"]["device"] == "cpu" and "device cpu" in stdout
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


@pytest.mark.slow
def test_bench_generate_targets_without_bart(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_generate.py", "--quick", "--source-length", "16", "--new-tokens", "16",
         "--positions", "8", "16", "--window", "4", "--models", "scaleformer", "t5", "--threads", "1"]
    )
    by_target = {t["name"][:3]: t["status"] for t in report["targets"]}
    assert by_target["(a)"] != "N/A" and by_target["(c)"] == "N/A"
    assert "bart is not in --models" in stdout
