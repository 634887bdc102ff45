"""Tests of the offline data pipeline in ``examples/data/`` and of the shipped data and tokenizer."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "examples" / "data"
BIBLE_DIR = DATA_DIR / "bible"
TOKENIZER_DIR = ROOT / "examples" / "tokenizer"
SPANISH_MARKS = "áéíóúñ¿¡"


def _normalise(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- docstrings

FAKE_MODULE = '''\
"""Tools for a fake module used in tests.

More text that is not part of the first paragraph.
"""
import os


def area(width, height):
    """Return the area of a rectangle.

    Args:
        width: the width.
    """
    # keep this comment
    return width * height


def one_liner(x): "Return x plus one, quickly."; return x + 1


def stub(a, b):
    """Compute nothing at all here."""


def short(x):
    """Too short."""
    return x


class Shape:
    """A shape with a name
    spread over two lines.

    Details.
    """

    def name(self):
        """Return the name of the shape."""
        return "shape"
'''


def test_pairs_from_source_removes_docstrings_exactly(build_docstrings):
    records = {record["id"]: record for record in build_docstrings.pairs_from_source(FAKE_MODULE, "fake.mod")}
    assert set(records) == {
        "fake.mod",
        "fake.mod:area:8",
        "fake.mod:one_liner:18",
        "fake.mod:stub:21",
        "fake.mod:Shape:30",
        "fake.mod:Shape.name:37",
    }
    area = records["fake.mod:area:8"]
    assert area["kind"] == "function"
    assert area["docstring"] == "Return the area of a rectangle."
    assert area["source"] == "def area(width, height):\n    # keep this comment\n    return width * height"
    assert area["n_chars"] == len(area["source"])
    assert records["fake.mod:one_liner:18"]["source"] == "def one_liner(x): return x + 1"
    assert records["fake.mod:stub:21"]["source"] == "def stub(a, b):"
    shape = records["fake.mod:Shape:30"]
    assert shape["kind"] == "class"
    assert shape["docstring"] == "A shape with a name spread over two lines."
    assert shape["source"] == textwrap.dedent(
        '''\
        class Shape:

            def name(self):
                """Return the name of the shape."""
                return "shape"'''
    )
    method = records["fake.mod:Shape.name:37"]
    assert method["source"] == 'def name(self):\n    return "shape"'
    module = records["fake.mod"]
    assert module["kind"] == "module"
    assert module["docstring"] == "Tools for a fake module used in tests."
    assert module["source"].startswith("import os\n\n\ndef area(width, height):")
    assert "More text" not in module["source"]


def test_first_paragraph(build_docstrings):
    doc = "\n    Summary line one\n    and two.\n    \n    Body.\n    "
    assert build_docstrings.first_paragraph(doc) == "Summary line one and two."
    assert build_docstrings.first_paragraph("One.\n\nTwo.") == "One."


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture()
def fake_stdlib(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    _write(root / "fake.py", FAKE_MODULE)
    _write(root / "pkg" / "__init__.py", '"""The package docstring of pkg."""\nX = 1\n')
    _write(root / "pkg" / "inner.py", 'def f():\n    """Return one as an int."""\n    return 1\n')
    _write(root / "broken.py", 'def f(:\n    """Never parsed at all."""\n')
    for skipped in ("test", "idlelib", "lib2to3", "site-packages", "__pycache__"):
        _write(root / skipped / "mod.py", 'def g():\n    """Should never be read."""\n    return 2\n')
    return root


def test_build_skips_directories_and_broken_files(build_docstrings, fake_stdlib: Path):
    splits = build_docstrings.build_docstring_pairs(fake_stdlib)
    records = [record for split in splits.values() for record in split]
    assert {record["module"] for record in records} == {"fake", "pkg", "pkg.inner"}
    for split, split_records in splits.items():
        for record in split_records:
            assert build_docstrings.split_of_module(record["module"]) == split
    functions = build_docstrings.build_docstring_pairs(fake_stdlib, kinds=["function"], max_source_chars=40)
    kept = [record for split in functions.values() for record in split]
    assert {record["kind"] for record in kept} == {"function"}
    assert all(record["n_chars"] <= 40 for record in kept)
    assert "fake:area:8" not in {record["id"] for record in kept}
    with pytest.raises(ValueError, match="kinds"):
        build_docstrings.build_docstring_pairs(fake_stdlib, kinds=["method"])


def test_docstrings_cli(build_docstrings, common, fake_stdlib: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture):
    out = tmp_path / "out"
    build_docstrings.main(["--output_dir", str(out), "--stdlib_dir", str(fake_stdlib), "--kinds", "class,module"])
    records = [record for split in ("train", "validation", "test")
               for record in common.read_jsonl(out / f"{split}.jsonl")]
    assert sorted(record["kind"] for record in records) == ["class", "module", "module"]
    assert "train:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_docstrings.main(["--output_dir", str(out), "--kinds", "functions"])


def test_package_modules_share_a_split(build_docstrings):
    assert build_docstrings.split_of_module("email.mime.text") == build_docstrings.split_of_module("email")
    splits = {build_docstrings.split_of_module(f"module_{i}") for i in range(200)}
    assert splits == {"train", "validation", "test"}


@pytest.fixture(scope="module")
def stdlib_pairs(build_docstrings) -> dict[str, list[dict]]:
    return build_docstrings.build_docstring_pairs()


def test_stdlib_pairs(build_docstrings, stdlib_pairs: dict[str, list[dict]]):
    records = [record for split in stdlib_pairs.values() for record in split]
    functions = [record for record in records if record["kind"] == "function"]
    assert len(functions) >= 5000
    assert all(len(stdlib_pairs[split]) > 100 for split in ("train", "validation", "test"))
    assert len({record["id"] for record in records}) == len(records)
    modules = {split: {record["module"] for record in split_records} for split, split_records in stdlib_pairs.items()}
    assert not modules["train"] & modules["validation"]
    assert not modules["train"] & modules["test"]
    assert not modules["validation"] & modules["test"]
    for record in records:
        assert len(record["docstring"].split()) >= 3
        assert record["source"].strip()
        assert record["n_chars"] == len(record["source"])
        assert not any(part in build_docstrings.SKIP_DIRS for part in record["module"].split("."))


def test_stdlib_docstrings_removed(stdlib_pairs: dict[str, list[dict]]):
    functions = [record for split in stdlib_pairs.values() for record in split if record["kind"] == "function"]
    # A target may legitimately reappear in code (os.execvpe's docstring is its own signature).
    leaked = [r for r in functions if _normalise(r["docstring"]) in _normalise(r["source"])]
    assert len(leaked) <= len(functions) // 200, [r["id"] for r in leaked[:10]]
    dumps = [record for record in functions if record["id"].startswith("json:dumps:")]
    assert len(dumps) == 1
    assert dumps[0]["docstring"] == "Serialize ``obj`` to a JSON formatted ``str``."
    assert dumps[0]["source"].startswith("def dumps(obj, *, skipkeys=False")
    assert '"""' not in dumps[0]["source"]


# ---------------------------------------------------------------- Bible


def _verses(book: str, chapter: int, texts: list[str]) -> dict[tuple[str, int, int], str]:
    return {(book, chapter, verse): text for verse, text in enumerate(texts, start=1)}


def _text(n_chars: int, word: str) -> str:
    return (word + " ") * (n_chars // (len(word) + 1))


LENGTHS = [20, 120, 25, 110, 30, 100, 40, 90, 35, 80]


def test_pair_verses_drops_misaligned_chapters(build_bible):
    en, es = {}, {}
    # Chapter 1: aligned.
    en |= _verses("Fake", 1, [_text(n, "light") for n in LENGTHS])
    es |= _verses("Fake", 1, [_text(n, "luz") for n in LENGTHS])
    es[("Fake", 1, 2)] = "  " + es[("Fake", 1, 2)] + " "
    # Chapter 2: an empty Spanish verse.
    en |= _verses("Fake", 2, [_text(n, "water") for n in LENGTHS])
    es |= _verses("Fake", 2, [_text(n, "agua") for n in LENGTHS])
    es[("Fake", 2, 3)] = " "
    # Chapter 3: the Spanish side lacks its last verse.
    en |= _verses("Fake", 3, [_text(n, "earth") for n in LENGTHS])
    es |= _verses("Fake", 3, [_text(n, "tierra") for n in LENGTHS[:-1]])
    # Chapter 4: the Spanish numbering is shifted by one verse.
    en |= _verses("Fake", 4, [_text(n, "night") for n in LENGTHS])
    es |= _verses("Fake", 4, [_text(n, "noche") for n in [60] + LENGTHS[:-1]])
    # Chapter 5: one verse much shorter than its translation; kept.
    en |= _verses("Fake", 5, [_text(n, "day") for n in LENGTHS])
    es |= _verses("Fake", 5, [_text(n, "día") for n in [8] + LENGTHS[1:]])
    # Chapter 6: Spanish only.
    es |= _verses("Fake", 6, ["solo"])

    result = build_bible.pair_verses(en, es)
    assert result.dropped == {
        ("Fake", 2): "empty verse",
        ("Fake", 3): "verse count",
        ("Fake", 4): "length ratio",
        ("Fake", 6): "verse count",
    }
    assert list(result.pairs) == [("Fake", 1, v) for v in range(1, 11)] + [("Fake", 5, v) for v in range(1, 11)]
    assert result.pairs[("Fake", 1, 2)] == (en[("Fake", 1, 2)].strip(), es[("Fake", 1, 2)].strip())
    assert result.pairs[("Fake", 5, 1)] == (en[("Fake", 5, 1)].strip(), es[("Fake", 5, 1)].strip())

    unchecked = build_bible.pair_verses(en, es, check_lengths=False)
    assert ("Fake", 4) not in unchecked.dropped
    assert unchecked.pairs[("Fake", 4, 2)] == (en[("Fake", 4, 2)].strip(), es[("Fake", 4, 2)].strip())


def test_clean_osis(build_bible):
    raw = (
        '<div type="x-milestone" subType="x-preverse" sID="pv1"/><title canonical="true" type="psalm">'
        'A <w lemma="strong:H4210">Psalm</w>.</title> <l level="1" sID="g1"/>\u00b6 The <divineName>'
        '<w lemma="strong:H3068">LORD</w></divineName> <transChange type="added">is</transChange>'
        '<note placement="foot"><reference type="annotateRef">1.1 </reference>or, shepherd</note> '
        'good.<l eID="g1" level="1"/><title><foreign>\u05d1 BETH.</foreign></title>'
    )
    assert build_bible.clean_osis(raw) == "A Psalm. The LORD is good. BETH."


def test_records_and_splits(build_bible):
    pairs = {
        ("Esther", 1, 1): ("Now it came.", "Y aconteció."),
        ("Esther", 1, 2): ("That in those days.", "Que en aquellos días."),
        ("Ruth", 1, 1): ("Now it came to pass.", "Y aconteció en los días."),
        ("Genesis", 1, 1): ("In the beginning.", "En el principio."),
        ("Exodus", 1, 1): ("Now these are.", "Estos son."),
    }
    osis = {"Esther": "Esth", "Ruth": "Ruth", "Genesis": "Gen", "Exodus": "Exod"}
    verses = build_bible.verse_records(pairs, osis)
    assert verses[0] == {
        "id": "Esth.1.1", "book": "Esther", "chapter": 1, "verse": 1, "en": "Now it came.", "es": "Y aconteció."
    }
    chapters = build_bible.chapter_records(pairs, osis)
    assert chapters[0] == {
        "id": "Esth.1",
        "book": "Esther",
        "chapter": 1,
        "en": "Now it came. That in those days.",
        "es": "Y aconteció. Que en aquellos días.",
    }
    splits = build_bible.split_records(verses, train_books=["Genesis"])
    assert [record["id"] for record in splits["train"]] == ["Gen.1.1"]
    assert [record["id"] for record in splits["validation"]] == ["Ruth.1.1"]
    assert [record["id"] for record in splits["test"]] == ["Esth.1.1", "Esth.1.2"]


def test_missing_pysword_names_the_install(build_bible, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pysword.modules", None)
    with pytest.raises(SystemExit, match="pip install pysword"):
        build_bible.read_sword_bible(build_bible.EN_MODULE)


def _sword_modules_installed(build_bible) -> bool:
    conf = Path(build_bible.DEFAULT_SWORD_PATH) / "mods.d"
    return all((conf / f"{module}.conf").is_file() for module in (build_bible.EN_MODULE, build_bible.ES_MODULE))


def test_read_sword_modules(build_bible, tmp_path: Path):
    pytest.importorskip("pysword", reason="pysword is not installed (pip install pysword)")
    with pytest.raises(SystemExit, match="apt-get install"):
        build_bible.read_sword_bible(build_bible.EN_MODULE, sword_path=str(tmp_path))
    if not _sword_modules_installed(build_bible):
        pytest.skip("SWORD modules not installed (apt-get install sword-text-kjv sword-text-sparv)")
    en, osis = build_bible.read_sword_bible(build_bible.EN_MODULE, books=["Jude"])
    es, _ = build_bible.read_sword_bible(build_bible.ES_MODULE, books=["Jude"])
    assert osis["Jude"] == "Jude" and osis["Genesis"] == "Gen"
    assert len(en) == len(es) == 25
    assert en[("Jude", 1, 1)].startswith("Jude, the servant of Jesus Christ")
    assert es[("Jude", 1, 1)].startswith("JUDAS, siervo de Jesucristo")
    assert not any(re.search(r"[<>\u00b6]|strong:[GH]\d", text) for text in (*en.values(), *es.values()))
    result = build_bible.pair_verses(en, es)
    assert len(result.pairs) == 25 and not result.dropped


def test_shipped_bible_sample(build_bible, common):
    data = common.load_jsonl_splits(BIBLE_DIR)
    assert set(data) == {"train", "validation", "test"}
    assert data["train"].num_rows >= 5000
    assert data["validation"].num_rows >= 200
    assert data["test"].num_rows >= 490
    assert set(data["test"]["book"]) == {"Esther", "Joel", "Galatians", "James"}
    assert set(data["validation"]["book"]) == set(build_bible.VALIDATION_BOOKS)
    assert not set(data["train"]["book"]) & set(build_bible.TEST_BOOKS + build_bible.VALIDATION_BOOKS)
    ids = [record_id for split in data.values() for record_id in split["id"]]
    assert len(ids) == len(set(ids))
    spanish = ""
    for split in data.values():
        for record in split:
            assert record["en"].strip() and record["es"].strip(), record["id"]
            assert record["id"].endswith(f".{record['chapter']}.{record['verse']}")
            assert not re.search(r"[<>\u00b6\ufffd]|Ã|strong:[GH]\d", record["en"] + record["es"]), record["id"]
        spanish += "".join(split["es"])
    assert all(mark in spanish for mark in SPANISH_MARKS)
    assert sum(path.stat().st_size for path in BIBLE_DIR.glob("*.jsonl")) < 2.5e6


def test_load_jsonl_splits_needs_files(common, tmp_path: Path):
    with pytest.raises(ValueError, match="data_dir"):
        common.load_jsonl_splits(tmp_path)


# ---------------------------------------------------------------- tokenizer

TINY_CORPUS = [
    "In the beginning God created the heaven and the earth.",
    "EN el principio crió Dios los cielos y la tierra. ¿Dónde está el niño? ¡Señor!",
    "def add(a, b):\n    return a + b\n",
    "Porque de tal manera amó Dios al mundo, que ha dado á su Hijo unigénito.",
] * 20


def test_train_tiny_tokenizer_round_trips(train_tokenizer):
    tokenizer = train_tokenizer.train_bpe_tokenizer(TINY_CORPUS, vocab_size=300)
    assert 260 < len(tokenizer) <= 300
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<s>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    for text in TINY_CORPUS[:4] + ["  unseen: 漢字 🙂 ñandú\n\tend  "]:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id == 2
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer.train_bpe_tokenizer(TINY_CORPUS, vocab_size=100)


def test_tokenizer_cli(train_tokenizer, tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"en": t, "es": t.upper()}) + "\n" for t in TINY_CORPUS), encoding="utf-8")
    out = tmp_path / "tok"
    train_tokenizer.main(
        ["--files", str(corpus), "--fields", "en", "es", "--vocab_size", "300", "--output_dir", str(out)]
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.decode(tokenizer("¿Dónde?")["input_ids"], skip_special_tokens=True) == "¿Dónde?"
    with pytest.raises(SystemExit, match="--fields"):
        train_tokenizer.main(["--files", str(corpus), "--fields", "source", "--output_dir", str(out)])


def test_shipped_tokenizer(common):
    from transformers import AutoTokenizer

    assert sum(path.stat().st_size for path in TOKENIZER_DIR.iterdir()) < 1_000_000
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    assert len(tokenizer) == 8000
    special_ids = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert special_ids == [0, 1, 2, 3]
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    spanish = [record["es"] for record in common.read_jsonl(BIBLE_DIR / "test.jsonl")[:50]]
    code = [inspect.getsource(json.dumps), inspect.getsource(textwrap.dedent)]
    for text in spanish + code:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # A trained vocabulary: common Spanish words are single tokens.
    assert len(tokenizer.tokenize(" Dios")) == 1


def test_offline_loading_in_fresh_process():
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from transformers import AutoTokenizer
        from examples.common import load_jsonl_splits
        data = load_jsonl_splits({str(BIBLE_DIR)!r})
        tokenizer = AutoTokenizer.from_pretrained({str(TOKENIZER_DIR)!r})
        print(data["test"].num_rows, tokenizer("Señor")["input_ids"][-1])
        """
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    completed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split()[-2:] == ["497", "2"]
