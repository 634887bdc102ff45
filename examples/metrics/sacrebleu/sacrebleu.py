"""Corpus BLEU and chrF from the ``sacrebleu`` package, as an ``evaluate`` metric that loads offline.

``evaluate.load("<path to this folder>")`` imports this file without the Hugging Face Hub. The inputs,
options and BLEU keys are those of the Hub's ``sacrebleu`` metric, so scripts written for
``evaluate.load("sacrebleu")`` (transformers' ``run_translation.py``) work with it unchanged; the result
also carries ``"chrf"``, sacreBLEU's ``corpus_chrf`` on the same inputs.
"""

from __future__ import annotations

from typing import Any

import datasets
import evaluate
import sacrebleu as scb


_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}
"""

_DESCRIPTION = """\
Corpus-level BLEU (Papineni et al. 2002, as computed by sacreBLEU, Post 2018) and chrF (Popovic 2015) of
detokenized predictions against one or more references per prediction. Both scores are on a 0-100 scale.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): detokenized system outputs, one per segment.
    references (`list[list[str]]` or `list[str]`): the references of each prediction; every prediction must
        have the same number of references. A flat list means one reference per prediction.
    smooth_method (`str`, defaults to `"exp"`): BLEU smoothing, `"none"`, `"floor"`, `"add-k"` or `"exp"`.
    smooth_value (`float`, *optional*): value for `"floor"` (default 0.1) or `"add-k"` (default 1).
    tokenize (`str`, *optional*): BLEU tokenizer, sacreBLEU's default (`"13a"`) when not given.
    lowercase (`bool`, defaults to `False`): lowercase before scoring (BLEU and chrF).
    force (`bool`, defaults to `False`): score text that looks tokenized without a warning.
    use_effective_order (`bool`, defaults to `False`): leave out n-gram orders with no match (sentence BLEU).
    chrf_char_order (`int`, defaults to 6): character n-gram order of chrF.
    chrf_word_order (`int`, defaults to 0): word n-gram order (0 gives chrF, 2 gives chrF++).
    chrf_beta (`int`, defaults to 2): weight of recall against precision in chrF.

Returns:
    `score` (BLEU), `counts`, `totals`, `precisions`, `bp`, `sys_len`, `ref_len` (BLEU statistics), and
    `chrf` (chrF score).

Example:
    >>> metric = evaluate.load("examples/metrics/sacrebleu")
    >>> result = metric.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on the mat"]])
    >>> round(result["score"], 1), round(result["chrf"], 1)
    (100.0, 100.0)
"""


TEXT = datasets.Value("string", id="sequence")


def _features(references: datasets.Value | datasets.Sequence) -> datasets.Features:
    """The inputs: a text per prediction, and a text or a list of texts (several references) per reference."""
    return datasets.Features({"predictions": TEXT, "references": references})


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Sacrebleu(evaluate.Metric):
    """sacreBLEU corpus BLEU plus chrF."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            homepage="https://github.com/mjpost/sacreBLEU",
            features=[_features(datasets.Sequence(TEXT, id="references")), _features(TEXT)],
            codebase_urls=["https://github.com/mjpost/sacreBLEU"],
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[list[str]] | list[str],
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        tokenize: str | None = None,
        lowercase: bool = False,
        force: bool = False,
        use_effective_order: bool = False,
        chrf_char_order: int = 6,
        chrf_word_order: int = 0,
        chrf_beta: int = 2,
    ) -> dict[str, Any]:
        if not predictions:
            raise ValueError("`predictions` is empty: corpus BLEU needs at least one segment")
        if isinstance(references[0], str):
            references = [[reference] for reference in references]
        per_prediction = len(references[0])
        counts = sorted({len(refs) for refs in references})
        if len(counts) > 1:
            raise ValueError(
                f"`references` must give every prediction the same number of references, got counts {counts}"
            )
        # sacreBLEU takes one stream per reference position: streams[j][i] is reference j of segment i
        streams = [[refs[j] for refs in references] for j in range(per_prediction)]
        bleu = scb.corpus_bleu(
            predictions,
            streams,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            lowercase=lowercase,
            use_effective_order=use_effective_order,
            **({"tokenize": tokenize} if tokenize else {}),
        )
        chrf = scb.metrics.CHRF(
            char_order=chrf_char_order, word_order=chrf_word_order, beta=chrf_beta, lowercase=lowercase
        ).corpus_score(predictions, streams)
        return {
            "score": bleu.score,
            "counts": bleu.counts,
            "totals": bleu.totals,
            "precisions": bleu.precisions,
            "bp": bleu.bp,
            "sys_len": bleu.sys_len,
            "ref_len": bleu.ref_len,
            "chrf": chrf.score,
        }
