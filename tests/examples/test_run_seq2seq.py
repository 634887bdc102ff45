"""Tests of ``examples/run_seq2seq.py`` and of the offline metric modules in ``examples/metrics/``.

The script runs in-process on a tiny Scaleformer (width 32, one encoder and one decoder layer) and 64
training verses of the shipped Bible sample; the Hub is replaced by a local folder (``fake_hub`` of conftest.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import evaluate
import pytest
import sacrebleu
import torch
import transformers.trainer
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

ROOT = Path(__file__).resolve().parents[2]
METRICS_DIR = ROOT / "examples" / "metrics"
BIBLE_DIR = ROOT / "examples" / "data" / "bible"
TOKENIZER_DIR = ROOT / "examples" / "tokenizer"


@pytest.fixture(autouse=True)
def restore_log_levels():
    """``main`` sets the transformers and datasets log levels, as the upstream scripts do; undo it."""
    levels = transformers_logging.get_verbosity(), datasets.logging.get_verbosity()
    yield
    transformers_logging.set_verbosity(levels[0])
    datasets.logging.set_verbosity(levels[1])


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory, tiny_config_fields: dict) -> Path:
    path = tmp_path_factory.mktemp("config") / "scaleformer-test.json"
    path.write_text(json.dumps({**tiny_config_fields, "dropout": 0.1}))
    return path


def common_args(config: Path, output_dir: Path) -> list[str]:
    return [
        "--config_name", str(config), "--tokenizer_name", str(TOKENIZER_DIR), "--output_dir", str(output_dir),
        "--max_train_samples", "64", "--max_target_length", "64", "--per_device_train_batch_size", "16",
        "--learning_rate", "1e-3", "--logging_steps", "1", "--use_cpu", "--report_to", "none",
        "--disable_tqdm", "true",
    ]


def test_train_evaluate_predict_card_and_push(run_seq2seq, card_module, fake_hub, tiny_config: Path, tmp_path: Path,
                                              monkeypatch, caplog):
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: fake_hub)
    out = tmp_path / "run"
    caplog.set_level("INFO", logger=run_seq2seq.__name__)
    results = run_seq2seq.main(
        common_args(tiny_config, out)
        + ["--do_train", "--do_eval", "--do_predict", "--predict_with_generate", "--max_steps", "4",
           "--max_eval_samples", "16", "--max_predict_samples", "8", "--per_device_eval_batch_size", "16",
           "--generation_max_length", "16", "--save_strategy", "no",
           "--push_to_hub", "--hub_model_id", "tester/tiny-bible"]
    )

    for name in ("eval_bleu", "eval_chrf", "eval_loss", "predict_bleu", "predict_chrf", "copy_source_bleu",
                 "copy_source_chrf"):
        assert math.isfinite(results[name]), name
    # four steps of training may still decode empty strings (chrF 0); the copy baseline scores real text
    assert results["eval_chrf"] >= 0 and results["copy_source_chrf"] > 0
    assert results["eval_samples"] == 16 and results["predict_samples"] == 8
    saved = json.loads((out / "all_results.json").read_text())
    assert saved["eval_bleu"] == results["eval_bleu"] and saved["copy_source_chrf"] == results["copy_source_chrf"]
    assert len((out / "generated_predictions.txt").read_text(encoding="utf-8").splitlines()) == 8

    # long examples are dropped and counted, not truncated
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    verses = [json.loads(line) for line in (BIBLE_DIR / "validation.jsonl").read_text(encoding="utf-8").splitlines()]
    too_long = sum(len(tokenizer(text_target=v["es"]).input_ids) > 64 for v in verses)
    assert too_long > 0
    assert f"validation: read {len(verses)} examples" in caplog.text
    assert f"{too_long} with more than 64 target tokens" in caplog.text

    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert type(model).__name__ == "ScaleformerForConditionalGeneration"
    generated = model.generate(**tokenizer(["In the beginning"], return_tensors="pt"), max_new_tokens=4)
    assert generated.shape[0] == 1

    card = (out / "README.md").read_text(encoding="utf-8")
    fmt = card_module.format_metric_value
    assert f"| eval_bleu | {fmt(results['eval_bleu'])} | {fmt(results['copy_source_bleu'])} |" in card
    assert f"| eval_chrf | {fmt(results['eval_chrf'])} | {fmt(results['copy_source_chrf'])} |" in card
    assert f"| predict_chrf | {fmt(results['predict_chrf'])} |" in card
    assert "examples/run_seq2seq.py --config_name" in card
    assert "more information needed" not in card.lower()

    pushed = tmp_path / "hub" / "tester" / "tiny-bible"
    assert (pushed / "README.md").read_text(encoding="utf-8") == card
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modeling_scaleformer.py"):
        assert (pushed / name).is_file(), name


def test_resume_from_checkpoint_continues_with_the_same_losses(run_seq2seq, tiny_config: Path, tmp_path: Path):
    # bitwise equality asks for deterministic kernels (transformers' `--full_determinism`): with more than one thread,
    # the default decoder's counting tables sum the gradients of many positions into few rows in a thread-dependent
    # order
    args = ["--do_train", "--max_steps", "4", "--save_steps", "2", "--per_device_train_batch_size", "8",
            "--full_determinism", "true"]
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    run_seq2seq.main(common_args(tiny_config, first) + args)
    run_seq2seq.main(
        common_args(tiny_config, resumed) + args + ["--resume_from_checkpoint", str(first / "checkpoint-2")]
    )

    # the second run started at step 2: it never wrote a checkpoint of its own there
    assert not (resumed / "checkpoint-2").exists() and (resumed / "checkpoint-4").is_dir()

    def losses(folder: Path) -> dict[int, tuple[float, float]]:
        history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
        return {entry["step"]: (entry["loss"], entry["grad_norm"]) for entry in history if "loss" in entry}

    expected, got = losses(first), losses(resumed)
    assert sorted(expected) == [1, 2, 3, 4]
    assert got[3] == expected[3] and got[4] == expected[4]
    a = AutoModelForSeq2SeqLM.from_pretrained(first).state_dict()
    b = AutoModelForSeq2SeqLM.from_pretrained(resumed).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_arguments_are_checked(run_seq2seq, tiny_config: Path, tmp_path: Path):
    base = common_args(tiny_config, tmp_path / "out")
    with pytest.raises(ValueError, match="--source_field 'english'"):
        run_seq2seq.main(base + ["--do_train", "--source_field", "english"])
    with pytest.raises(ValueError, match="--max_target_length"):
        run_seq2seq.main(base + ["--do_train", "--max_target_length", "0"])
    with pytest.raises(ValueError, match="--resume_from_checkpoint"):
        run_seq2seq.main(base + ["--do_train", "--resume_from_checkpoint", str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="--config_name"):
        run_seq2seq.main(["--output_dir", str(tmp_path / "out"), "--do_train", "--use_cpu"])


def test_arguments_from_a_json_file(run_seq2seq, tiny_config: Path, tmp_path: Path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"config_name": str(tiny_config), "output_dir": str(tmp_path / "o"),
                                "do_eval": True, "metric": "rouge", "max_source_length": 48}))
    model_args, data_args, training_args = run_seq2seq.parse_arguments([str(path)])
    assert model_args.config_name == str(tiny_config)
    assert (data_args.metric, data_args.max_source_length, training_args.do_eval) == ("rouge", 48, True)


# ---- metric modules ----


def test_sacrebleu_module_offline():
    metric = evaluate.load(str(METRICS_DIR / "sacrebleu"))
    same = metric.compute(predictions=["the cat sat on the mat", "a b c d"],
                          references=[["the cat sat on the mat"], ["a b c d"]])
    assert same["score"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)

    predictions = ["hello there general kenobi", "on our way to ankh morpork"]
    references = [["hello there general kenobi", "hello there !"], ["goodbye ankh morpork", "ankh morpork"]]
    result = metric.compute(predictions=predictions, references=references)
    assert round(result["score"], 1) == 39.8  # the value documented for the Hub's sacrebleu metric
    streams = [[refs[i] for refs in references] for i in range(2)]
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(predictions, streams).score)
    flat = metric.compute(predictions=["a b c d e"], references=["a b c d f"])
    assert flat["score"] == pytest.approx(sacrebleu.corpus_bleu(["a b c d e"], [["a b c d f"]]).score)
    with pytest.raises(ValueError, match="same number of references"):
        metric.compute(predictions=["a", "b"], references=[["a"], ["b", "c"]])


def test_rouge_module_offline():
    metric = evaluate.load(str(METRICS_DIR / "rouge"))
    same = metric.compute(predictions=["the cat sat"], references=["the cat sat"])
    assert same == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "rougeLsum": 1.0}
    result = metric.compute(predictions=["the cat sat on the mat"], references=["the cat sat on a mat"])
    # 5 of 6 unigrams and 3 of 5 bigrams match; the longest common subsequence has 5 words
    assert result["rouge1"] == pytest.approx(5 / 6)
    assert result["rouge2"] == pytest.approx(3 / 5)
    assert result["rougeL"] == pytest.approx(5 / 6)
    per_example = metric.compute(predictions=["the cat", "x"], references=[["a dog", "the cat"], ["y"]],
                                 use_aggregator=False)
    assert per_example["rouge1"] == [1.0, 0.0]


def test_exact_match_module_offline():
    metric = evaluate.load(str(METRICS_DIR / "exact_match"))
    predictions, references = ["A b", "c!", "x1"], ["a b", "c", "x2"]
    assert metric.compute(predictions=predictions, references=references) == {"exact_match": 0.0}
    assert metric.compute(predictions=predictions, references=references, ignore_case=True)["exact_match"] == 1 / 3
    both = metric.compute(predictions=predictions, references=references, ignore_case=True, ignore_punctuation=True)
    assert both["exact_match"] == 2 / 3
    everything = metric.compute(predictions=predictions, references=references, ignore_case=True,
                                ignore_punctuation=True, ignore_numbers=True)
    assert everything["exact_match"] == 1.0


def test_hub_names_resolve_to_the_local_modules(monkeypatch):
    """transformers' example scripts call evaluate.load("sacrebleu"): run from examples/metrics it works offline."""
    monkeypatch.chdir(METRICS_DIR)
    bleu = evaluate.load("sacrebleu")
    assert bleu.compute(predictions=["a b c d"], references=[["a b c d"]])["chrf"] == pytest.approx(100.0)
    rouge = evaluate.load("rouge")
    assert rouge.compute(predictions=["a b"], references=["a b"])["rougeL"] == 1.0
    accuracy = evaluate.load("accuracy")
    assert accuracy.compute(predictions=[0, 1, 2, 3], references=[0, 1, 1, 3]) == {"accuracy": 0.75}
    weighted = accuracy.compute(predictions=[0, 1], references=[0, 2], sample_weight=[3.0, 1.0])
    assert weighted == {"accuracy": 0.75}
    assert accuracy.compute(predictions=[0, 1], references=[0, 2], normalize=False) == {"accuracy": 1.0}
