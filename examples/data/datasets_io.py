"""Load the JSON-lines splits written by the builders in this folder as a ``datasets.DatasetDict``."""

from __future__ import annotations

import os
from pathlib import Path

import datasets

SPLITS: tuple[str, ...] = ("train", "validation", "test")


def load_jsonl_splits(data_dir: str | os.PathLike) -> datasets.DatasetDict:
    """Load ``{train,validation,test}.jsonl`` from a folder.

    Uses the ``json`` builder that ships with ``datasets``, so nothing is downloaded; it runs with
    ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``. Splits whose file is absent are left out.

    Args:
        data_dir (`str` or `os.PathLike`): the folder holding the files.

    Returns:
        `datasets.DatasetDict`: one ``Dataset`` per split found.

    Raises:
        ValueError: when ``data_dir`` holds none of the three files.
    """
    root = Path(data_dir)
    data_files = {split: str(root / f"{split}.jsonl") for split in SPLITS if (root / f"{split}.jsonl").is_file()}
    if not data_files:
        raise ValueError(f"data_dir {str(root)!r} holds none of {[f'{split}.jsonl' for split in SPLITS]}")
    return datasets.load_dataset("json", data_files=data_files)
