"""bench_quality.py: `--quick` on verses and on docstrings trains every model and scores it; a second call reuses
the JSON and the cached tokenizer."""

import math
import re

import pytest


def test_bench_quality_quick(run_report, import_benchmark, tmp_path):
    default = import_benchmark("models").DEFAULT_CONFIG_MODEL
    stdout, report = run_report(["benchmarks/bench_quality.py", "--quick"])
    runs = {(r["model"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {(default, 0), ("bart", 0), ("t5", 0)}
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
    assert "| copy the source |" in stdout and "(the default configuration) vs best baseline at equal wall-clock: loss ratio" in stdout
    assert "N/A verses:" in stdout

    # a second call with the same --json skips the runs it holds and reports them unchanged
    stdout, again = run_report(["benchmarks/bench_quality.py", "--quick"], in_process=True)
    assert again["runs"] == report["runs"]
    assert "Summary: 0 run(s) trained now, 3 reported" in stdout


@pytest.mark.parametrize("task, losses, status", [
    ("verses", {"default": [4.40, 4.42], "bart": [4.37, 4.39]}, "PASS"),  # 0.7% above BART
    ("verses", {"default": [4.45, 4.47], "bart": [4.37, 4.39]}, "FAIL"),  # 1.8% above
    ("verses", {"scaleformer": [4.0], "bart": [4.4]}, "N/A"),  # the first configuration is not the default
    ("chapters", {"default": [5.0], "bart": [5.3], "led": [5.6], "longt5": [6.6]}, "PASS"),
    ("chapters", {"default": [5.0], "bart": [5.1], "led": [5.6], "longt5": [6.6]}, "FAIL"),  # 2.0% below BART
    ("chapters", {"default": [5.0], "bart": [5.3], "led": [5.6]}, "N/A"),  # LongT5 missing
], ids=["verses-pass", "verses-fail", "verses-not-the-default", "chapters-pass", "chapters-fail", "chapters-missing"])
def test_targets_are_the_default_configuration_s(import_benchmark, task, losses, status):
    """The targets judge ScaleformerConfig's default by its name, against the means over seeds of BART (verses)
    or of BART, LED and LongT5 (chapters)."""
    bench = import_benchmark("bench_quality")
    name = {"default": bench.DEFAULT_CONFIG_MODEL}
    runs = [{"model": name.get(model, model), "seed": seed, "final_heldout_loss_per_token": loss}
            for model, values in losses.items() for seed, loss in enumerate(values)]
    args = bench.parse_args(["--task", task])
    _, targets = bench.evaluate_targets(runs, args)
    assert [t.status for t in targets] == [status], targets


def test_default_config_model_is_the_default_configuration(import_benchmark):
    """The name the quality targets judge builds what `ScaleformerConfig()` gives, field by field."""
    from modeling_scaleformer import ScaleformerConfig

    models = import_benchmark("models")
    size = models.ModelSize(vocab_size=100, d_model=32, layers=1, heads=2, ffn_dim=64)
    built = models.build_seq2seq(models.DEFAULT_CONFIG_MODEL, 0, size, 0.1, 128).config
    default = ScaleformerConfig()
    for field in ("attention_type", "cross_attention_rpe", "layer_norm_position", "absolute_positions", "rpe_horizon",
                  "decay_rate_range", "rpe_shared_across_heads", "attention_mode", "feature_map", "decoder_attention",
                  "count_block_heads", "count_block_head_dim", "count_block_embeddings", "count_block_embedding_dim",
                  "count_block_zero_init", "count_block_detach", "count_block_layer_scale", "remaining_count_max"):
        assert getattr(built, field) == getattr(default, field), field


@pytest.mark.slow  # the other task's data and metrics: `pytest -m slow`
def test_bench_quality_docstrings_quick(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_quality.py", "--quick", "--task", "docstrings", "--models", "scaleformer", "bart"]
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


@pytest.mark.slow  # a process for one message of the parser
def test_bench_quality_rejects_data_dir_for_docstrings(run_command, tmp_path):
    result = run_command(["benchmarks/bench_quality.py", "--task", "docstrings", "--data_dir", str(tmp_path)],
                         timeout=120)
    assert result.returncode == 2 and "--data_dir does not apply to --task docstrings" in result.stderr


@pytest.mark.slow  # the long baselines: `pytest -m slow`
def test_bench_quality_long_baselines_quick(run_report):
    """LED and LongT5 (opt-in) train with BART's recipe on the quick verses and get a loss and scores."""
    stdout, report = run_report(["benchmarks/bench_quality.py", "--quick", "--models", "led", "longt5",
                                 "--threads", "1"])
    runs = {(r["model"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("led", 0), ("longt5", 0)}
    for run in runs.values():
        assert run["steps"] >= 1 and len(run["curve"]) >= 2 and run["sources_cut"] == {}
        assert all(math.isfinite(p["heldout_loss_per_token"]) for p in run["curve"])
        assert 0.0 <= run["test"]["bleu"] <= 100.0 and 0.0 <= run["test"]["chrf"] <= 100.0
    assert "encoder attention window 512 per layer" in runs[("led", 0)]["description"]
    assert "transient-global, local_radius 127, global_block_size 16" in runs[("longt5", 0)]["description"]
    assert "| led | 0 |" in stdout and "| longt5 | 0 |" in stdout


@pytest.mark.slow  # about a minute: a few steps on chapters of up to 3,200 tokens
def test_bench_quality_long_baselines_chapters(run_report):
    """On chapters LED and LongT5 read full sources, where BART's are cut to its 1,024 positions."""
    stdout, report = run_report(["benchmarks/bench_quality.py", "--quick", "--task", "chapters", "--models", "led",
                                 "longt5", "--max_steps", "1", "--threads", "1"])
    runs = {r["model"]: r for r in report["runs"]}
    assert set(runs) == {"led", "longt5"}
    for run in runs.values():
        assert run["sources_cut"] == {} and "full sources" in run["description"] and run["steps"] == 1
    assert max(s["source_tokens_kept"][1] for s in report["data"]["splits"].values()) > 1024
    table = int(re.search(r"max_encoder_position_embeddings (\d+)", runs["led"]["description"]).group(1))
    assert table > 1024 and table % 512 == 0
