"""Accuracy, as an ``evaluate`` metric that loads offline.

``evaluate.load("<path to this folder>")`` imports this file without the Hugging Face Hub; run from
``examples/metrics``, ``evaluate.load("accuracy")`` finds it too (transformers' ``run_clm.py`` loads it
by that name). Inputs, options and the result key follow the Hub's ``accuracy`` metric.
"""

from __future__ import annotations

import datasets
import evaluate


_DESCRIPTION = """\
The fraction of predictions equal to their reference label, optionally weighted per example.
With `normalize=False`, the (weighted) count of correct predictions instead.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[int]`): predicted labels (token ids for language modelling).
    references (`list[int]`): one reference label per prediction.
    normalize (`bool`, defaults to `True`): return the fraction; `False` returns the count.
    sample_weight (`list[float]`, *optional*): a weight per example.

Returns:
    `accuracy` (`float`): the (weighted) fraction, or count, of correct predictions.

Example:
    >>> metric = evaluate.load("examples/metrics/accuracy")
    >>> metric.compute(predictions=[0, 1, 2, 3], references=[0, 1, 1, 3])
    {'accuracy': 0.75}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    """Fraction of predictions equal to their reference label."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}
            ),
        )

    def _compute(
        self,
        predictions: list[int],
        references: list[int],
        normalize: bool = True,
        sample_weight: list[float] | None = None,
    ) -> dict[str, float]:
        if len(predictions) != len(references):
            raise ValueError(
                f"`predictions` and `references` must have the same length, got {len(predictions)} and "
                f"{len(references)}"
            )
        if sample_weight is None:
            sample_weight = [1.0] * len(predictions)
        elif len(sample_weight) != len(predictions):
            raise ValueError(
                f"`sample_weight` must hold one weight per prediction ({len(predictions)}), got {len(sample_weight)}"
            )
        correct = sum(w for p, r, w in zip(predictions, references, sample_weight) if p == r)
        if not normalize:
            return {"accuracy": float(correct)}
        total = sum(sample_weight)
        if total == 0:
            raise ValueError("`sample_weight` sums to 0: accuracy is undefined")
        return {"accuracy": float(correct / total)}
