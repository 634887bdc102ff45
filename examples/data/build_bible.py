"""Build English-Spanish Bible translation pairs from two public-domain SWORD modules.

English: King James Version (module ``engKJV2006eb``, Debian package ``sword-text-kjv``).
Spanish: Reina-Valera 1909 (module ``spaRV1909eb``, Debian package ``sword-text-sparv``).
Both are read with the ``pysword`` reader; OSIS markup (Strong's numbers, footnotes, tags, pilcrows)
is stripped, and verses are paired by (book, chapter, verse).

The two translations do not always number verses alike. A whole chapter is dropped when

* the two sides disagree on its verse count, or either side has an empty verse; or
* its verse lengths disagree: the spread of log(len(es) / len(en)) over its verses exceeds
  ``MAX_LOG_RATIO_STD``, or at least ``MAX_OUTLIER_VERSES`` of its verses are more than a factor of
  two longer or shorter than the typical ratio. This catches chapters whose Spanish numbering is
  shifted by a verse carried over from the previous chapter (Numbers 13, Jonah 2, Job 39, ...).

Splits are by book: test = Esther, Joel, Galatians, James; validation = Ruth, Haggai, Titus, Philemon,
Jude; train = every other book (or only ``--train_books``).

Example::

    apt-get install -y sword-text-kjv sword-text-sparv && pip install pysword
    python examples/data/build_bible.py --output_dir outputs/bible --level verse
    python examples/data/build_bible.py --output_dir outputs/bible_chapters --level chapter
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: examples.*, model_cards.*

from examples.common import SPLITS, write_jsonl  # noqa: E402

Ref = tuple[str, int, int]
"""A verse reference: (book name as pysword spells it, chapter, verse)."""

EN_MODULE = "engKJV2006eb"
ES_MODULE = "spaRV1909eb"
DEBIAN_PACKAGES = {EN_MODULE: "sword-text-kjv", ES_MODULE: "sword-text-sparv"}
DEFAULT_SWORD_PATH = "/usr/share/sword"

TEST_BOOKS: tuple[str, ...] = ("Esther", "Joel", "Galatians", "James")
VALIDATION_BOOKS: tuple[str, ...] = ("Ruth", "Haggai", "Titus", "Philemon", "Jude")

MAX_LOG_RATIO_STD = 0.35
OUTLIER_LOG_RATIO = math.log(2.0)
MAX_OUTLIER_VERSES = 2
MIN_VERSES_FOR_STD = 3

_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.DOTALL)
_EMPTY_ELEMENT = re.compile(r"<[^<>]*/>")
_TAG = re.compile(r"<[^<>]*>")
# Psalm 119 acrostic headings are written "ב BETH." in the KJV module; the Spanish has "BETH".
_HEBREW_LETTER = re.compile(r"[\u0590-\u05FF]")


def clean_osis(text: str) -> str:
    """Return the plain text of one OSIS verse.

    Footnotes are removed with their content. Milestones and other empty elements
    (``<div .../>``, ``<l .../>``, ``<lb/>``) become a space; every other tag is removed and its
    content kept: words (``<w lemma="strong:H7225">``), words added by the translators
    (``<transChange>``), ``<divineName>``, quotations and canonical titles (the Psalm
    superscriptions, which the Spanish module has inline in verse 1). Pilcrows and Hebrew letters
    are removed, and whitespace is collapsed.
    """
    text = _NOTE.sub(" ", text)
    text = _EMPTY_ELEMENT.sub(" ", text)
    text = _TAG.sub("", text)
    text = _HEBREW_LETTER.sub("", text.replace("\u00b6", " "))
    return " ".join(text.split())


@dataclass
class PairingResult:
    """Verse pairs that passed the checks, and the chapters that were dropped.

    Attributes:
        pairs (`dict[Ref, tuple[str, str]]`): (en, es) texts per reference, in the order of the
            English input.
        dropped (`dict[tuple[str, int], str]`): the reason each dropped (book, chapter) was dropped.
    """

    pairs: dict[Ref, tuple[str, str]] = field(default_factory=dict)
    dropped: dict[tuple[str, int], str] = field(default_factory=dict)


def _group_by_chapter(verses: Mapping[Ref, str]) -> dict[tuple[str, int], dict[int, str]]:
    chapters: dict[tuple[str, int], dict[int, str]] = {}
    for (book, chapter, verse), text in verses.items():
        chapters.setdefault((book, chapter), {})[verse] = text
    return chapters


def _log_ratio(en: str, es: str) -> float:
    return math.log(len(es) / len(en))


def pair_verses(
    en: Mapping[Ref, str], es: Mapping[Ref, str], *, check_lengths: bool = True
) -> PairingResult:
    """Pair English and Spanish verses by reference and drop chapters that do not align.

    Args:
        en (`Mapping[Ref, str]`):
            English verse texts by (book, chapter, verse), already cleaned.
        es (`Mapping[Ref, str]`):
            Spanish verse texts, keyed the same way.
        check_lengths (`bool`, *optional*, defaults to `True`):
            Also drop chapters whose verse lengths disagree (see the module docstring). The typical
            ratio is the median log length ratio over all verses of the chapters that pass the
            structural checks.

    Returns:
        `PairingResult`: the kept pairs and, for every dropped chapter, one of the reasons
        ``"verse count"``, ``"empty verse"`` or ``"length ratio"``. A chapter present on one side
        only is dropped for its verse count.
    """
    en_chapters = _group_by_chapter(en)
    es_chapters = _group_by_chapter(es)
    result = PairingResult()
    candidates: dict[tuple[str, int], list[tuple[int, str, str]]] = {}
    for key in list(en_chapters) + [key for key in es_chapters if key not in en_chapters]:
        en_verses = en_chapters.get(key, {})
        es_verses = es_chapters.get(key, {})
        if set(en_verses) != set(es_verses):
            result.dropped[key] = "verse count"
        elif any(not text.strip() for text in (*en_verses.values(), *es_verses.values())):
            result.dropped[key] = "empty verse"
        else:
            candidates[key] = [(verse, en_verses[verse].strip(), es_verses[verse].strip()) for verse in en_verses]

    if check_lengths and candidates:
        typical = statistics.median(_log_ratio(e, s) for verses in candidates.values() for _, e, s in verses)
        for key, verses in list(candidates.items()):
            ratios = [_log_ratio(e, s) for _, e, s in verses]
            outliers = sum(abs(ratio - typical) > OUTLIER_LOG_RATIO for ratio in ratios)
            spread = statistics.pstdev(ratios) if len(ratios) >= MIN_VERSES_FOR_STD else 0.0
            if outliers >= MAX_OUTLIER_VERSES or spread > MAX_LOG_RATIO_STD:
                result.dropped[key] = "length ratio"
                del candidates[key]

    for (book, chapter), verses in candidates.items():
        for verse, en_text, es_text in verses:
            result.pairs[(book, chapter, verse)] = (en_text, es_text)
    return result


def split_of_book(book: str) -> str:
    """Return the split of a book: "test", "validation" or "train"."""
    if book in TEST_BOOKS:
        return "test"
    if book in VALIDATION_BOOKS:
        return "validation"
    return "train"


def verse_records(pairs: Mapping[Ref, tuple[str, str]], osis_ids: Mapping[str, str]) -> list[dict]:
    """Return one record per verse pair: ``id`` (OSIS, e.g. ``Gen.1.1``), book, chapter, verse, en, es."""
    return [
        {
            "id": f"{osis_ids[book]}.{chapter}.{verse}",
            "book": book,
            "chapter": chapter,
            "verse": verse,
            "en": en_text,
            "es": es_text,
        }
        for (book, chapter, verse), (en_text, es_text) in pairs.items()
    ]


def chapter_records(pairs: Mapping[Ref, tuple[str, str]], osis_ids: Mapping[str, str]) -> list[dict]:
    """Return one record per chapter, each side being its verses joined by single spaces."""
    chapters: dict[tuple[str, int], list[tuple[int, str, str]]] = {}
    for (book, chapter, verse), (en_text, es_text) in pairs.items():
        chapters.setdefault((book, chapter), []).append((verse, en_text, es_text))
    records = []
    for (book, chapter), verses in chapters.items():
        verses.sort()
        records.append(
            {
                "id": f"{osis_ids[book]}.{chapter}",
                "book": book,
                "chapter": chapter,
                "en": " ".join(en_text for _, en_text, _ in verses),
                "es": " ".join(es_text for _, _, es_text in verses),
            }
        )
    return records


def split_records(records: Iterable[dict], train_books: Sequence[str] | None = None) -> dict[str, list[dict]]:
    """Split records by book; with ``train_books``, the train split keeps only those books."""
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for record in records:
        split = split_of_book(record["book"])
        if split == "train" and train_books is not None and record["book"] not in train_books:
            continue
        splits[split].append(record)
    return splits


def _import_pysword() -> type:
    """Return pysword's ``SwordModules`` class, or exit naming the package to install."""
    try:
        from pysword.modules import SwordModules
    except ImportError as error:
        raise SystemExit("build_bible.py needs the pysword reader: pip install pysword") from error
    return SwordModules


def read_sword_bible(
    module: str, sword_path: str = DEFAULT_SWORD_PATH, books: Sequence[str] | None = None
) -> tuple[dict[Ref, str], dict[str, str]]:
    """Read and clean every verse of a SWORD Bible module.

    Args:
        module (`str`): the module name, e.g. ``"engKJV2006eb"``.
        sword_path (`str`, *optional*, defaults to ``"/usr/share/sword"``): the SWORD data path
            (the folder holding ``mods.d/``), where Debian's ``sword-text-*`` packages install.
        books (`Sequence[str]`, *optional*): read only these books (pysword names, e.g. ``"Jude"``).

    Returns:
        `tuple[dict[Ref, str], dict[str, str]]`: the cleaned verse texts in canonical order, and the
        OSIS abbreviation of every book of the versification (``{"Genesis": "Gen", ...}``).

    Raises:
        SystemExit: when pysword or the module is not installed, naming what to install.
    """
    sword_modules_cls = _import_pysword()
    package = DEBIAN_PACKAGES.get(module, "the package providing it")
    if not (Path(sword_path) / "mods.d").is_dir():
        raise SystemExit(
            f"no SWORD modules under --sword_path {sword_path!r} (missing mods.d/): "
            f"apt-get install -y {' '.join(DEBIAN_PACKAGES.values())}"
        )
    modules = sword_modules_cls(sword_path)
    found = modules.parse_modules()
    if module not in found:
        raise SystemExit(
            f"SWORD module {module!r} not found under {sword_path!r} (found: {sorted(found) or 'none'}): "
            f"apt-get install -y {package}"
        )
    bible = modules.get_bible_from_module(module)
    # pysword decompresses the whole book block for every verse it reads; keeping the last few
    # blocks makes reading the Bible take seconds instead of a minute. Text is unchanged.
    if hasattr(bible, "_decompressed_text"):
        bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)

    structure = bible.get_structure().get_books()
    osis_ids = {book.name: book.osis_name for testament in structure.values() for book in testament}
    if books is not None:
        unknown = sorted(set(books) - set(osis_ids))
        if unknown:
            raise ValueError(f"books {unknown} are not in module {module!r}; known: {list(osis_ids)}")
    verses: dict[Ref, str] = {}
    for testament in structure.values():
        for book in testament:
            if books is not None and book.name not in books:
                continue
            for chapter, n_verses in enumerate(book.chapter_lengths, start=1):
                texts = list(bible.get_iter(books=book.name, chapters=chapter, clean=False))
                if len(texts) != n_verses:
                    raise RuntimeError(
                        f"{module}: {book.name} {chapter} returned {len(texts)} verses, expected {n_verses}"
                    )
                for verse, text in enumerate(texts, start=1):
                    verses[(book.name, chapter, verse)] = clean_osis(text)
    return verses, osis_ids


def build_bible_pairs(
    sword_path: str = DEFAULT_SWORD_PATH,
    level: Literal["verse", "chapter"] = "verse",
    train_books: Sequence[str] | None = None,
) -> tuple[dict[str, list[dict]], PairingResult]:
    """Read both modules, pair them and split the records by book.

    Args:
        sword_path (`str`, *optional*, defaults to ``"/usr/share/sword"``): the SWORD data path.
        level (`str`, *optional*, defaults to ``"verse"``): ``"verse"`` or ``"chapter"`` records.
        train_books (`Sequence[str]`, *optional*): keep only these books in the train split.

    Returns:
        `tuple[dict[str, list[dict]], PairingResult]`: the records per split, and the pairing result
        (all verse pairs and the dropped chapters).
    """
    if level not in ("verse", "chapter"):
        raise ValueError(f"level must be 'verse' or 'chapter', got {level!r}")
    en, osis_ids = read_sword_bible(EN_MODULE, sword_path)
    es, _ = read_sword_bible(ES_MODULE, sword_path)
    if train_books is not None:
        unknown = sorted(set(train_books) - set(osis_ids))
        held_out = sorted(set(train_books) & set(TEST_BOOKS + VALIDATION_BOOKS))
        if unknown or held_out:
            raise ValueError(
                f"train_books must be train books of the KJV versification; unknown {unknown}, held out {held_out}"
            )
    result = pair_verses(en, es)
    records = verse_records(result.pairs, osis_ids) if level == "verse" else chapter_records(result.pairs, osis_ids)
    return split_records(records, train_books), result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, type=Path, help="where to write {train,validation,test}.jsonl")
    parser.add_argument(
        "--level", choices=("verse", "chapter"), default="verse", help="one record per verse or per chapter"
    )
    parser.add_argument("--sword_path", default=DEFAULT_SWORD_PATH, help="SWORD data path holding mods.d/")
    parser.add_argument(
        "--train_books",
        nargs="+",
        default=None,
        help='keep only these books in the train split (pysword names, e.g. Genesis "I Samuel")',
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Build the pairs and write one JSON-lines file per split."""
    args = parse_args(argv)
    try:
        splits, result = build_bible_pairs(args.sword_path, args.level, args.train_books)
    except ValueError as error:
        raise SystemExit(f"--train_books: {error}") from error
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for split, records in splits.items():
        write_jsonl(records, args.output_dir / f"{split}.jsonl")
        books = sorted({record["book"] for record in records})
        print(f"{split}: {len(records)} {args.level} pairs from {len(books)} books")
    reasons: dict[str, list[str]] = {}
    for (book, chapter), reason in result.dropped.items():
        reasons.setdefault(reason, []).append(f"{book} {chapter}")
    print(f"verse pairs kept: {len(result.pairs)}; chapters dropped: {len(result.dropped)}")
    for reason, chapters in reasons.items():
        print(f"  {reason} ({len(chapters)}): {', '.join(chapters)}")


if __name__ == "__main__":
    main()
