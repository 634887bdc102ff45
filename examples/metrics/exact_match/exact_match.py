"""Exact match rate, as an ``evaluate`` metric that loads offline.

``evaluate.load("<path to this folder>")`` imports this file without the Hugging Face Hub. Options and the
result key follow the Hub's ``exact_match`` metric.
"""

from __future__ import annotations

import re
import string

import datasets
import evaluate


_DESCRIPTION = """\
The fraction of predictions that equal their reference, character for character, after the optional
normalisations below. The value is in [0, 1].
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): system outputs.
    references (`list[str]`): one reference per prediction.
    regexes_to_ignore (`list[str]`, *optional*): regular expressions whose matches are removed from both,
        in order, before comparing.
    ignore_case (`bool`, defaults to `False`): lowercase both.
    ignore_punctuation (`bool`, defaults to `False`): remove `string.punctuation` from both.
    ignore_numbers (`bool`, defaults to `False`): remove the digits 0-9 from both.

Returns:
    `exact_match` (`float`): the fraction of exact matches.

Example:
    >>> metric = evaluate.load("examples/metrics/exact_match")
    >>> metric.compute(predictions=["a b", "c"], references=["a b", "d"])
    {'exact_match': 0.5}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ExactMatch(evaluate.Metric):
    """Fraction of predictions equal to their reference."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string", id="sequence"),
                    "references": datasets.Value("string", id="sequence"),
                }
            ),
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[str],
        regexes_to_ignore: list[str] | None = None,
        ignore_case: bool = False,
        ignore_punctuation: bool = False,
        ignore_numbers: bool = False,
    ) -> dict[str, float]:
        if not predictions:
            raise ValueError("`predictions` is empty: the exact match rate needs at least one example")

        def normalise(text: str) -> str:
            for pattern in regexes_to_ignore or ():
                text = re.sub(pattern, "", text)
            if ignore_case:
                text = text.lower()
            if ignore_punctuation:
                text = text.translate(str.maketrans("", "", string.punctuation))
            if ignore_numbers:
                text = text.translate(str.maketrans("", "", string.digits))
            return text

        matches = [normalise(p) == normalise(r) for p, r in zip(predictions, references)]
        return {"exact_match": sum(matches) / len(matches)}
