"""ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum from ``rouge_score``, as an ``evaluate`` metric that loads offline.

``evaluate.load("<path to this folder>")`` imports this file without the Hugging Face Hub. Inputs, options
and result keys are those of the Hub's ``rouge`` metric (transformers' ``run_summarization.py`` works with
it unchanged). One difference: the aggregate is the plain mean of the per-example F-measures, where the Hub
metric reports the median of a bootstrap resampling, which is random and close to the mean.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import datasets
import evaluate
from rouge_score import rouge_scorer, tokenizers


_CITATION = """\
@inproceedings{lin-2004-rouge,
    title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
    author = "Lin, Chin-Yew",
    booktitle = "Text Summarization Branches Out",
    year = "2004",
    pages = "74--81",
}
"""

_DESCRIPTION = """\
ROUGE F-measures (Lin 2004) between predictions and references, computed by Google's `rouge_score`
package: unigram (rouge1) and bigram (rouge2) overlap, longest common subsequence over the whole text
(rougeL) and over newline-separated sentences (rougeLsum). Values are in [0, 1].
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): system outputs.
    references (`list[str]` or `list[list[str]]`): one reference per prediction, or several (the best
        scoring reference counts, as `rouge_score`'s `score_multi`).
    rouge_types (`list[str]`, *optional*): defaults to `["rouge1", "rouge2", "rougeL", "rougeLsum"]`.
    use_aggregator (`bool`, defaults to `True`): return the mean F-measure per type, else per-example lists.
    use_stemmer (`bool`, defaults to `False`): Porter-stem words before matching.
    tokenizer (`Callable[[str], list[str]]`, *optional*): replaces `rouge_score`'s default tokenizer, which
        lowercases and keeps only the characters [a-z0-9] (accented letters are dropped).

Returns:
    one entry per ROUGE type: a float (aggregated) or a list of floats.

Example:
    >>> metric = evaluate.load("examples/metrics/rouge")
    >>> metric.compute(predictions=["the cat sat"], references=["the cat sat"])["rougeL"]
    1.0
"""

DEFAULT_ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL", "rougeLsum")


TEXT = datasets.Value("string", id="sequence")


def _features(references: datasets.Value | datasets.Sequence) -> datasets.Features:
    """The inputs: a text per prediction, and a text or a list of texts (several references) per reference."""
    return datasets.Features({"predictions": TEXT, "references": references})


class _CallableTokenizer(tokenizers.Tokenizer):
    """Adapts a plain function to the tokenizer interface of ``rouge_score``."""

    def __init__(self, tokenize: Callable[[str], list[str]]):
        self._tokenize = tokenize

    def tokenize(self, text: str) -> list[str]:
        return self._tokenize(text)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Rouge(evaluate.Metric):
    """ROUGE F-measures through ``rouge_score``."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[_features(datasets.Sequence(TEXT)), _features(TEXT)],
            codebase_urls=["https://github.com/google-research/google-research/tree/master/rouge"],
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[str] | list[list[str]],
        rouge_types: list[str] | None = None,
        use_aggregator: bool = True,
        use_stemmer: bool = False,
        tokenizer: Callable[[str], list[str]] | None = None,
    ) -> dict[str, float | list[float]]:
        if not predictions:
            raise ValueError("`predictions` is empty: ROUGE needs at least one example")
        rouge_types = list(DEFAULT_ROUGE_TYPES if rouge_types is None else rouge_types)
        unknown = [name for name in rouge_types if not re.fullmatch(r"rouge[1-9]|rougeL|rougeLsum", name)]
        if unknown:
            raise ValueError(f"`rouge_types` must be among rouge1..rouge9, rougeL, rougeLsum; got {unknown}")
        scorer = rouge_scorer.RougeScorer(
            rouge_types=rouge_types,
            use_stemmer=use_stemmer,
            tokenizer=None if tokenizer is None else _CallableTokenizer(tokenizer),
        )
        per_example: dict[str, list[float]] = {name: [] for name in rouge_types}
        for reference, prediction in zip(references, predictions):
            if isinstance(reference, str):
                scores = scorer.score(reference, prediction)
            else:
                scores = scorer.score_multi(reference, prediction)
            for name in rouge_types:
                per_example[name].append(scores[name].fmeasure)
        if not use_aggregator:
            return per_example
        return {name: sum(values) / len(values) for name, values in per_example.items()}
