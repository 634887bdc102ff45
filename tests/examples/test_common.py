"""Tests of ``examples/common.py``, what the example scripts share: JSON-lines files, tokenized pairs, length
limits, batches and the text metrics."""

from __future__ import annotations

import datasets
import pytest
import sacrebleu
import torch
from rouge_score import rouge_scorer
from transformers import AutoTokenizer


def test_jsonl_round_trip(common, tmp_path):
    records = [{"en": "In the beginning", "es": "En el principio ¿Dónde?"}, {"en": "b", "es": "c"}]
    path = tmp_path / "split.jsonl"
    common.write_jsonl(records, path)
    assert "¿Dónde?" in path.read_text(encoding="utf-8")  # written as it is, not escaped
    path.write_text(path.read_text(encoding="utf-8") + "\n  \n", encoding="utf-8")
    assert common.read_jsonl(path) == records


def test_length_filter_drops_and_counts(common) -> None:
    examples = common.Seq2SeqExamples(
        sources=["1", "2", "3"], references=["a", "b", "c"],
        source_ids=[[1] * 3, [1] * 9, [1] * 5], target_ids=[[2] * 4, [2] * 2, [2] * 8],
    )
    kept, dropped = common.filter_by_length(examples, max_source_length=5, max_target_length=None)
    assert (len(kept), dropped, kept.references) == (2, 1, ["a", "c"])
    kept, dropped = common.filter_by_length(examples, max_source_length=5, max_target_length=4)
    assert (len(kept), dropped, kept.references) == (1, 2, ["a"])
    kept, dropped = common.filter_by_length(examples, None, None)
    assert (len(kept), dropped) == (3, 0)
    counts = common.LengthFilter.of([3, 9, 5], [4, 2, 8], max_source_length=5, max_target_length=4)
    assert (counts.keep, counts.too_long_source, counts.too_long_target) == ([0], 1, 1)


def test_batch_pads_right_and_masks_labels(common) -> None:
    examples = common.Seq2SeqExamples(["x", "y"], ["u", "v"], [[5, 6, 7], [8]], [[9], [10, 11]])
    batch = examples.batch([1, 0], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[8, 0, 0], [5, 6, 7]]
    assert batch["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch["labels"].tolist() == [[10, 11], [9, -100]]
    assert {t.dtype for t in batch.values()} == {torch.long}


def test_missing_field_is_named(common) -> None:
    tokenizer = AutoTokenizer.from_pretrained(common.TOKENIZER_DIR)
    split = datasets.Dataset.from_dict({"en": ["a b"], "es": ["c d"]})
    with pytest.raises(ValueError, match="--target_field 'docstring'"):
        common.tokenize_split(split, "train", tokenizer, "en", "docstring")
    examples = common.tokenize_split(split, "train", tokenizer, "en", "es")
    assert examples.source_ids == [tokenizer("a b").input_ids] and examples.references == ["c d"]


def test_token_config(common) -> None:
    tokenizer = AutoTokenizer.from_pretrained(common.TOKENIZER_DIR)
    assert common.token_config(tokenizer) == dict(
        vocab_size=8000, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1
    )


def test_scores_are_those_of_sacrebleu_and_rouge_score(common) -> None:
    """The metric modules give what the packages give: BLEU and chrF of sacreBLEU, the mean ROUGE F-measure."""
    hypotheses = ["the cat sat on the mat", "a dog ran in the park ", "nothing alike"]
    references = [" the cat sat on a mat", "the dog runs in the park", "reference text here"]
    bleu = common.text_scorer("sacrebleu")(hypotheses, references)
    stripped = [r.strip() for r in references]
    assert bleu == {"bleu": pytest.approx(sacrebleu.corpus_bleu(hypotheses, [stripped]).score, abs=1e-9),
                    "chrf": pytest.approx(sacrebleu.corpus_chrf(hypotheses, [stripped]).score, abs=1e-9)}
    rouge = common.text_scorer("rouge", rouge_types=("rouge1", "rouge2", "rougeL"))(hypotheses, references)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(r, h) for h, r in zip(hypotheses, references)]
    assert rouge == {name: pytest.approx(100 * sum(s[name].fmeasure for s in scores) / 3, abs=1e-9)
                     for name in ("rouge1", "rouge2", "rougeL")}
    with pytest.raises(ValueError, match="--metrics_dir"):
        common.text_scorer("rouge", metrics_dir=common.ROOT)
