"""The README's main job, cut to seconds: trains, evaluates beside the copy baseline, saves, reloads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "task, extra, expected",
    [
        pytest.param("translation", [],
                     dict(attention_type="local_softmax_decay", cross_attention_rpe=True, layer_norm_position="post",
                          absolute_positions=None, rpe_horizon=16),
                     id="translation-defaults"),
        pytest.param("docstrings",
                     ["--config_overrides", "layer_norm_position=pre,rpe_horizon=8,absolute_positions=sinusoidal"],
                     dict(layer_norm_position="pre", absolute_positions="sinusoidal", rpe_horizon=8),
                     id="docstrings-shipped-tokenizer-overrides", marks=pytest.mark.slow),
    ],
)
def test_main_job_smoke(tmp_path, task, extra, expected):
    out = tmp_path / "main-job"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "main_job.py"), "--task", task, "--train_minutes", "0.05",
         "--eval_examples", "4", "--tokens_per_batch", "1500", "--output_dir", str(out), *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "copy input" in result.stdout and "reloaded with AutoModelForSeq2SeqLM and checked" in result.stdout
    # translation trains a BPE of the verses by default, docstrings use the shipped tokenizer
    assert ("trained on the training split" in result.stdout) == (task == "translation")
    assert f"{expected['layer_norm_position']}-norm blocks" in result.stdout
    config = json.loads((out / "config.json").read_text())
    assert {key: config[key] for key in expected} == expected
    results = json.loads((out / "main_job_results.json").read_text())
    assert results["task"] == task and results["test_examples"] == 4
    card = (out / "README.md").read_text()
    assert "copy the input" in card and "More information needed" not in card


@pytest.mark.parametrize(
    "overrides", ["no_such_field=1", *(pytest.param(overrides, marks=pytest.mark.slow) for overrides in (
        "layer_norm_position=middle", "rpe_horizon=wide", "encoder_attention_heads=3"))],  # a process each
)
def test_main_job_rejects_bad_config_overrides(tmp_path, overrides):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "main_job.py"), "--config_overrides", overrides,
         "--output_dir", str(tmp_path)],
        env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 2 and f"--config_overrides {overrides!r}" in result.stderr, result.stderr[-2000:]
