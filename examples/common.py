"""What the example scripts share: paths, JSON-lines files, tokenized pairs and their batches, text metrics.

The scripts import it from the repository root (``from examples.common import ...``): each puts the root on
``sys.path`` first, so that they run as ``python examples/<script>.py`` without installing ``examples/``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import datasets
import torch
from transformers import PreTrainedTokenizerBase


ROOT = Path(__file__).resolve().parents[1]
BIBLE_DIR = ROOT / "examples" / "data" / "bible"
TOKENIZER_DIR = ROOT / "examples" / "tokenizer"
METRICS_DIR = ROOT / "examples" / "metrics"
SPLITS: tuple[str, ...] = ("train", "validation", "test")
ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines file, in order; blank lines are skipped."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(records: Iterable[dict], path: str | os.PathLike) -> None:
    """Write records as UTF-8 JSON lines (non-ASCII characters written as they are, not escaped)."""
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def load_jsonl_splits(data_dir: str | os.PathLike) -> datasets.DatasetDict:
    """Load ``{train,validation,test}.jsonl`` from a folder as a ``DatasetDict``; absent splits are left out.

    Uses the ``json`` builder that ships with ``datasets``, so nothing is downloaded: it runs with
    ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``.

    Raises:
        ValueError: when ``data_dir`` holds none of the three files.
    """
    root = Path(data_dir)
    data_files = {split: str(root / f"{split}.jsonl") for split in SPLITS if (root / f"{split}.jsonl").is_file()}
    if not data_files:
        raise ValueError(f"data_dir {str(root)!r} holds none of {[f'{split}.jsonl' for split in SPLITS]}")
    return datasets.load_dataset("json", data_files=data_files)


def check_fields(dataset: datasets.Dataset, split: str, source_field: str, target_field: str) -> None:
    """Raise ``ValueError`` naming ``--source_field`` or ``--target_field`` when a split lacks that column."""
    for flag, column in (("--source_field", source_field), ("--target_field", target_field)):
        if column not in dataset.column_names:
            raise ValueError(f"{flag} {column!r} is not a field of {split}.jsonl; fields: {dataset.column_names}")


@dataclass
class Seq2SeqExamples:
    """(source, target) pairs of one split, in file order: their texts and token ids (never truncated)."""

    sources: list[str]
    references: list[str]
    source_ids: list[list[int]]
    target_ids: list[list[int]]

    @classmethod
    def tokenize(
        cls, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], references: Sequence[str]
    ) -> Seq2SeqExamples:
        return cls(
            list(sources),
            list(references),
            tokenizer(list(sources), truncation=False)["input_ids"],
            tokenizer(list(references), truncation=False)["input_ids"],
        )

    def __len__(self) -> int:
        return len(self.source_ids)

    def lengths(self) -> list[int]:
        """Source plus target tokens per example."""
        return [len(s) + len(t) for s, t in zip(self.source_ids, self.target_ids)]

    def subset(self, indices: Sequence[int]) -> Seq2SeqExamples:
        return Seq2SeqExamples(
            [self.sources[i] for i in indices],
            [self.references[i] for i in indices],
            [self.source_ids[i] for i in indices],
            [self.target_ids[i] for i in indices],
        )

    def batch(self, indices: Sequence[int], pad_token_id: int) -> dict[str, torch.Tensor]:
        """Right-padded `input_ids`, `attention_mask` and `labels` (-100 on padding) of the given examples."""
        sources = [self.source_ids[i] for i in indices]
        targets = [self.target_ids[i] for i in indices]
        input_ids = torch.full((len(sources), max(map(len, sources))), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        labels = torch.full((len(targets), max(map(len, targets))), -100, dtype=torch.long)
        for row, (s, t) in enumerate(zip(sources, targets)):
            input_ids[row, : len(s)] = torch.tensor(s)
            attention_mask[row, : len(s)] = 1
            labels[row, : len(t)] = torch.tensor(t)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def tokenize_split(
    dataset: datasets.Dataset, split: str, tokenizer: PreTrainedTokenizerBase, source_field: str, target_field: str
) -> Seq2SeqExamples:
    """Tokenize the source and target fields of a split, without truncation."""
    check_fields(dataset, split, source_field, target_field)
    return Seq2SeqExamples.tokenize(tokenizer, dataset[source_field], dataset[target_field])


@dataclass
class LengthFilter:
    """Which examples fit the length limits (`None`: no limit), and how many exceed each limit."""

    keep: list[int]
    too_long_source: int
    too_long_target: int

    @classmethod
    def of(
        cls,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_source_length: int | None,
        max_target_length: int | None,
    ) -> LengthFilter:
        long_source = [max_source_length is not None and n > max_source_length for n in source_lengths]
        long_target = [max_target_length is not None and n > max_target_length for n in target_lengths]
        keep = [i for i, (s, t) in enumerate(zip(long_source, long_target)) if not (s or t)]
        return cls(keep, sum(long_source), sum(long_target))


def filter_by_length(
    examples: Seq2SeqExamples, max_source_length: int | None, max_target_length: int | None
) -> tuple[Seq2SeqExamples, int]:
    """Keep the examples within both limits (`None`: no limit); return them and how many were dropped."""
    lengths = LengthFilter.of(
        [len(ids) for ids in examples.source_ids], [len(ids) for ids in examples.target_ids],
        max_source_length, max_target_length,
    )
    return examples.subset(lengths.keep), len(examples) - len(lengths.keep)


def token_config(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    """The config fields a tokenizer fixes: vocabulary size and special ids; decoding starts with ``<s>``
    (with ``<pad>`` where the tokenizer has no ``<s>``)."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    return dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=start,
    )


def text_scorer(
    metric: Literal["sacrebleu", "rouge"],
    metrics_dir: str | os.PathLike = METRICS_DIR,
    rouge_types: Sequence[str] = ROUGE_TYPES,
) -> Callable[[list[str], list[str]], dict[str, float]]:
    """Load a metric module of ``examples/metrics/`` and return ``score(predictions, references) -> dict``.

    Texts are stripped, one reference per prediction. ``sacrebleu`` gives ``bleu`` and ``chrf`` (sacreBLEU's
    corpus BLEU and chrF, 0-100); ``rouge`` gives the ``rouge_types`` F-measures of ``rouge_score`` with Porter
    stemming, averaged over the examples, times 100.
    """
    # evaluate imports transformers' pipelines, seconds of start-up that the data builders do without
    import evaluate

    path = Path(metrics_dir) / metric
    if not (path / f"{metric}.py").is_file():
        raise ValueError(f"--metrics_dir {str(metrics_dir)!r} holds no {metric}/{metric}.py")
    module = evaluate.load(str(path.resolve()))

    def score(predictions: list[str], references: list[str]) -> dict[str, float]:
        predictions = [p.strip() for p in predictions]
        references = [r.strip() for r in references]
        if metric == "sacrebleu":
            result = module.compute(predictions=predictions, references=[[r] for r in references])
            return {"bleu": result["score"], "chrf": result["chrf"]}
        result = module.compute(
            predictions=predictions, references=references, rouge_types=list(rouge_types), use_stemmer=True
        )
        return {name: 100 * value for name, value in result.items()}

    return score
