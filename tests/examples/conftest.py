"""Fixtures of the example tests: the modules of `examples/` and `model_cards/`, imported from the repository root
as the scripts import each other; a tiny model configuration; a Hub that writes into a local folder."""

import importlib
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from fnmatch import fnmatch
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def import_example() -> Iterator:
    """`import_example("examples.common")`: a module of examples/ or model_cards/, imported with the repository
    root on sys.path, as the scripts do."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        yield importlib.import_module


def example_module(name: str):
    """A fixture of the module `name` (a dotted name from the repository root)."""

    @pytest.fixture(scope="session")
    def module(import_example) -> ModuleType:
        return import_example(name)

    return module


common = example_module("examples.common")
run_seq2seq = example_module("examples.run_seq2seq")
train_accelerate = example_module("examples.train_accelerate")
build_bible = example_module("examples.data.build_bible")
build_docstrings = example_module("examples.data.build_docstrings")
train_tokenizer = example_module("examples.data.train_tokenizer")
card_module = example_module("model_cards.write_model_card")


@pytest.fixture(scope="session")
def tiny_config_fields() -> dict:
    """A Scaleformer of width 32 with one encoder and one decoder layer, as config.json fields (copy to change)."""
    return {
        "model_type": "scaleformer",
        "d_model": 32,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "rpe_horizon": 4,
    }


class FakeHub:
    """The ``HfApi`` calls of ``PushToHubMixin.push_to_hub`` and of Trainer, writing into ``root/<repo_id>/``.

    ``commits`` lists the files of each commit, sorted.
    """

    def __init__(self, root: Path):
        self.root = root
        self.commits: list[list[str]] = []

    def create_repo(self, repo_id: str, **kwargs) -> SimpleNamespace:
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(repo_id=repo_id)

    def create_branch(self, **kwargs) -> None:
        return None

    def create_commit(self, *, repo_id: str, operations: list, **kwargs) -> SimpleNamespace:
        for op in operations:
            target = self.root / repo_id / op.path_in_repo
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(op.path_or_fileobj, target)
        self.commits.append(sorted(op.path_in_repo for op in operations))
        return SimpleNamespace(commit_url=f"file://{self.root / repo_id}")

    def upload_folder(self, *, repo_id: str, folder_path: str, path_in_repo: str | None = None,
                      ignore_patterns: list[str] | None = None, run_as_future: bool = False, **kwargs):
        target = self.root / repo_id / (path_in_repo or "")
        files = []
        for path in sorted(Path(folder_path).rglob("*")):
            relative = path.relative_to(folder_path).as_posix()
            if path.is_file() and not any(fnmatch(relative, pattern) for pattern in ignore_patterns or ()):
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target / relative)
                files.append(relative)
        self.commits.append(files)
        result = SimpleNamespace(commit_url=f"file://{target}")
        if not run_as_future:
            return result
        future: Future = Future()
        future.set_result(result)
        return future


@pytest.fixture
def fake_hub(tmp_path: Path) -> FakeHub:
    """A Hub in `tmp_path / "hub"`; patch `transformers.utils.hub.hf_api` (or Trainer's) to return it."""
    return FakeHub(tmp_path / "hub")
