"""Build a code-to-docstring summarisation data set from the Python standard library.

Every function, method and class that has a docstring, and every module that has one, becomes one
record: the input is the source of the definition with its docstring removed, the target is the first
paragraph of the docstring. The source comes from the standard library of the running interpreter
(``sysconfig.get_paths()["stdlib"]``), so the data set needs no download and is rebuilt in seconds.

Records are split by module with a deterministic hash of the top-level package name, so that no
module, and no package, spans two splits (hash buckets 90/5/5 train/validation/test).

Example::

    python examples/data/build_docstrings.py --output_dir outputs/docstrings
    python examples/data/build_docstrings.py --output_dir outputs/docstrings_long --kinds class,module
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import os
import sys
import sysconfig
import textwrap
import tokenize
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: examples.*, model_cards.*

from examples.common import SPLITS, write_jsonl  # noqa: E402

Kind = Literal["function", "class", "module"]

KINDS: tuple[Kind, ...] = ("function", "class", "module")
# Directory names that are never read: test suites, IDLE, lib2to3, installed third-party packages.
SKIP_DIRS: frozenset[str] = frozenset(
    {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__"}
)
MIN_TARGET_WORDS = 3
# Percent of the hash buckets for train and validation; test takes the rest.
TRAIN_PERCENT = 90
VALIDATION_PERCENT = 5


def split_of_module(module: str) -> str:
    """Return the split ("train", "validation" or "test") of a module.

    The split is chosen by a SHA-256 hash of the top-level package name (``email`` for
    ``email.mime.text``), so the assignment is the same on every machine and Python version, no
    module spans two splits, and the modules of one package always share a split.
    """
    package = module.split(".", 1)[0]
    bucket = int(hashlib.sha256(package.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < TRAIN_PERCENT:
        return "train"
    if bucket < TRAIN_PERCENT + VALIDATION_PERCENT:
        return "validation"
    return "test"


def first_paragraph(docstring: str) -> str:
    """Return the first paragraph of a docstring with its whitespace collapsed to single spaces."""
    cleaned = inspect.cleandoc(docstring).strip()
    paragraph = cleaned.split("\n\n", 1)[0]
    # A line holding only spaces also ends a paragraph.
    lines: list[str] = []
    for line in paragraph.splitlines():
        if not line.strip():
            break
        lines.append(line)
    return " ".join(" ".join(lines).split())


def _docstring_node(node: ast.AST) -> ast.Expr | None:
    """Return the statement holding the docstring of ``node``, or None when it has none."""
    body = getattr(node, "body", None)
    if not body:
        return None
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first
    return None


def _char_col(line: str, byte_col: int) -> int:
    """Convert an ``ast`` column offset (UTF-8 bytes) to a character index into ``line``."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))


def _cut_span(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> list[str]:
    """Remove the text between two (line index, byte column) positions from ``lines``.

    ``lines`` keep their line endings. When nothing but whitespace is left on the first and last
    lines around the span, those lines go entirely; otherwise the text before the span and the text
    after it are joined on one line (``def f(): "doc"; return 1`` becomes ``def f(): return 1``).
    """
    (first, first_col), (last, last_col) = start, end
    prefix = lines[first][: _char_col(lines[first], first_col)]
    suffix = lines[last][_char_col(lines[last], last_col) :]
    if not prefix.strip() and not suffix.strip():
        return lines[:first] + lines[last + 1 :]
    rest = suffix.lstrip(" \t")
    if rest.startswith(";"):
        rest = rest[1:].lstrip(" \t")
    ending = "\n" if suffix.endswith("\n") else ""
    joined = prefix.rstrip() + (" " + rest if rest.strip() else ending)
    return lines[:first] + [joined] + lines[last + 1 :]


def source_without_docstring(file_lines: list[str], node: ast.AST) -> str:
    """Return the dedented source of ``node`` with its docstring statement removed.

    Args:
        file_lines (`list[str]`):
            The lines of the whole file, line endings kept (``str.splitlines(keepends=True)``).
        node (`ast.AST`):
            A ``Module``, ``ClassDef``, ``FunctionDef`` or ``AsyncFunctionDef`` that has a docstring.

    Returns:
        `str`: the source text; everything but the docstring statement is kept exactly.
    """
    doc = _docstring_node(node)
    if doc is None:
        raise ValueError(f"node {type(node).__name__} has no docstring")
    if isinstance(node, ast.Module):
        start_line, start_col = 0, 0
        lines = list(file_lines)
    else:
        start_line, start_col = node.lineno - 1, node.col_offset
        end_line, end_col = node.end_lineno - 1, node.end_col_offset
        lines = list(file_lines[start_line : end_line + 1])
        last = lines[-1]
        lines[-1] = last[: _char_col(last, end_col)]
        # Pad the first line so that dedenting treats it like the others.
        first = lines[0]
        lines[0] = " " * _char_col(first, start_col) + first[_char_col(first, start_col) :]
    lines = _cut_span(
        lines,
        (doc.lineno - 1 - start_line, doc.col_offset),
        (doc.end_lineno - 1 - start_line, doc.end_col_offset),
    )
    text = textwrap.dedent("".join(lines))
    return text.strip("\n") if text.strip() else ""


def module_name(path: Path, stdlib_dir: Path) -> str:
    """Return the dotted module name of a file under ``stdlib_dir`` (``email/mime/text.py`` -> ``email.mime.text``)."""
    parts = list(path.relative_to(stdlib_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def iter_stdlib_files(stdlib_dir: Path) -> Iterator[Path]:
    """Yield the ``.py`` files under ``stdlib_dir`` in sorted order.

    Folders named in :data:`SKIP_DIRS` are skipped, and so are ``config-*`` and ``lib-dynload``
    (build files and compiled extensions).
    """
    for root, dirs, files in os.walk(stdlib_dir):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-") and d != "lib-dynload"
        )
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root) / name


def _walk_definitions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Yield (qualified name, node) for every class and function nested anywhere under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qualname = f"{prefix}{child.name}"
            yield qualname, child
            yield from _walk_definitions(child, qualname + ".")
        else:
            yield from _walk_definitions(child, prefix)


def pairs_from_source(source: str, module: str) -> list[dict]:
    """Return the records of one module's source text (all kinds, before any split).

    Args:
        source (`str`): the text of the module.
        module (`str`): its dotted name, used for the ``id`` and ``module`` fields.

    Returns:
        `list[dict]`: records with the fields ``id``, ``module``, ``kind``, ``source``, ``docstring``
        and ``n_chars`` (the length of ``source``). Targets of fewer than three words and inputs left
        empty by the removal of the docstring are skipped.

    Raises:
        SyntaxError: when ``source`` does not parse.
    """
    tree = ast.parse(source)
    file_lines = source.splitlines(keepends=True)
    records: list[dict] = []

    def add(kind: Kind, record_id: str, node: ast.AST) -> None:
        doc = _docstring_node(node)
        if doc is None:
            return
        target = first_paragraph(doc.value.value)
        if len(target.split()) < MIN_TARGET_WORDS:
            return
        text = source_without_docstring(file_lines, node)
        if not text.strip():
            return
        records.append(
            {
                "id": record_id,
                "module": module,
                "kind": kind,
                "source": text,
                "docstring": target,
                "n_chars": len(text),
            }
        )

    add("module", module, tree)
    for qualname, node in _walk_definitions(tree):
        kind: Kind = "class" if isinstance(node, ast.ClassDef) else "function"
        add(kind, f"{module}:{qualname}:{node.lineno}", node)
    return records


def build_docstring_pairs(
    stdlib_dir: str | os.PathLike | None = None,
    *,
    kinds: Sequence[str] = KINDS,
    max_source_chars: int | None = None,
) -> dict[str, list[dict]]:
    """Build the code-to-docstring records of a standard library, split by module.

    Args:
        stdlib_dir (`str` or `os.PathLike`, *optional*):
            Root of the library to read; defaults to ``sysconfig.get_paths()["stdlib"]``.
        kinds (`Sequence[str]`, *optional*, defaults to all of ``("function", "class", "module")``):
            Which kinds of definitions to keep.
        max_source_chars (`int`, *optional*):
            Drop records whose input is longer than this many characters (no truncation).

    Returns:
        `dict[str, list[dict]]`: ``{"train": [...], "validation": [...], "test": [...]}``, each in file
        order. Files that fail to decode or parse are skipped.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {list(KINDS)}, got {list(kinds)}")
    if max_source_chars is not None and max_source_chars <= 0:
        raise ValueError(f"max_source_chars must be positive, got {max_source_chars}")
    root = Path(stdlib_dir if stdlib_dir is not None else sysconfig.get_paths()["stdlib"]).resolve()
    if not root.is_dir():
        raise ValueError(f"stdlib_dir {str(root)!r} is not a directory")

    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for path in iter_stdlib_files(root):
        try:
            with tokenize.open(path) as handle:
                source = handle.read()
            records = pairs_from_source(source, module_name(path, root))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            # ValueError: ast.parse rejects null bytes in Python 3.11.
            continue
        for record in records:
            if record["kind"] not in kinds:
                continue
            if max_source_chars is not None and record["n_chars"] > max_source_chars:
                continue
            splits[split_of_module(record["module"])].append(record)
    return splits


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, type=Path, help="where to write {train,validation,test}.jsonl")
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="comma-separated kinds to keep, among function, class, module (default: all)",
    )
    parser.add_argument(
        "--max_source_chars", type=int, default=None, help="drop records whose input is longer than this"
    )
    parser.add_argument(
        "--stdlib_dir", default=None, help="library to read (default: the running interpreter's standard library)"
    )
    args = parser.parse_args(argv)
    args.kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown or not args.kinds:
        parser.error(f"--kinds must name some of {', '.join(KINDS)}; got {unknown or 'nothing'}")
    if args.max_source_chars is not None and args.max_source_chars <= 0:
        parser.error(f"--max_source_chars must be positive, got {args.max_source_chars}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Build the data set and write one JSON-lines file per split."""
    args = parse_args(argv)
    splits = build_docstring_pairs(args.stdlib_dir, kinds=args.kinds, max_source_chars=args.max_source_chars)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for split, records in splits.items():
        write_jsonl(records, args.output_dir / f"{split}.jsonl")
        counts = Counter(record["kind"] for record in records)
        modules = len({record["module"] for record in records})
        per_kind = ", ".join(f"{kind} {counts[kind]}" for kind in KINDS if kind in args.kinds)
        print(f"{split}: {len(records)} records from {modules} modules ({per_kind})")


if __name__ == "__main__":
    main()
