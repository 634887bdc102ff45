"""Fixtures for every test."""

import os

import pytest
import torch


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        patch_the_language_once_a_launch()


def patch_the_language_once_a_launch() -> None:
    """Triton's interpreter maps triton.language onto its NumPy semantics (`_patch_lang`, which inspects every member
    of tl, tl.tensor and tl.math) when a kernel is launched, and again at every call of a jit function inside the
    kernel, where the mapping still holds and the second pass changes nothing: over a third of the interpreted tests'
    time (16,278 passes, 27 of 78 s under cProfile, in test_triton_attention_over_blocks). Inside a launch, a call
    whose function sees only language modules already mapped (their builtins replaced) skips it; the launch's own
    mapping, and a call that sees a module still unmapped, are left as they are, as is a Triton without these
    internals."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    executor, scope = getattr(interpreter, "GridExecutor", None), getattr(interpreter, "_LangPatchScope", None)
    tl = interpreter.tl
    if (original is None or executor is None or scope is None or getattr(original, "once_a_launch", False)
            or not tl.core.is_builtin(getattr(tl.core, "full", None))):
        return
    launches = []  # one entry a launch under way: False until its own mapping is done

    def mapped(fn) -> bool:
        """Whether `fn` sees a language module, and every one it sees has its builtins mapped (tl.full as the
        witness); one that sees none is left to `_patch_lang`, which refuses it."""
        languages = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        return bool(languages) and all(not tl.core.is_builtin(language.full) for language in languages)

    def patch_lang(fn):
        if launches and launches[-1] and mapped(fn):
            return scope()  # nothing to change or restore
        if launches:
            launches[-1] = True  # the launch's own mapping comes first
        return original(fn)

    launch = executor.__call__

    def launch_mapping_once(self, *args, **kwargs):
        launches.append(False)
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_lang.once_a_launch = True
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch_mapping_once


def interpreted_markers(item) -> str | None:
    """The marker expression of the interpreted kernel tests that `item` waits for (`INTERPRETED_RUNS` of
    tests/ops/test_triton_interpreted.py), or None."""
    return getattr(getattr(item, "module", None), "INTERPRETED_RUNS", {}).get(item.name)


def pytest_collection_finish(session):
    """Starts the interpreted Triton tests in their own process as soon as collection ends when they were selected,
    so that they run beside the rest of the suite."""
    for item in session.items:
        markers = interpreted_markers(item)
        if markers is not None:
            item.module.start(markers)


def pytest_collection_modifyitems(items):
    """The tests that wait for the interpreted run go last, so that the rest of the suite runs while it works."""
    waiting = [item for item in items if interpreted_markers(item) is not None]
    items[:] = [item for item in items if item not in waiting] + waiting


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from the same global random state, whatever ran before it or beside it, so that inputs
    drawn with the global generator (upstream gradients, initial weights) do not depend on the order of the run."""
    torch.manual_seed(0)
    yield


@pytest.fixture
def triton_paths(monkeypatch):
    """`triton_paths(chunk=16)`: every kernel choice of the default attention made as on CUDA, for tensors on any
    device (on CPU the kernels run in Triton's interpreter): the attention's kernels (in blocks of `chunk` positions,
    so that short inputs span several, their windows in tiles of at most `chunk` keys, the states' scan in parts of
    2 rows), the tails of the
    other decayed attentions (in chunks of `chunk`) and the two decoding steps. Returns the set that collects the
    names of the kernels' entry points as they are chosen."""

    def use(chunk: int = 16) -> set:
        from modeling_scaleformer import ops_decay, ops_decay_triton, ops_local_softmax, ops_local_softmax_triton

        used = set()

        def chosen(entry):
            if entry is not None:
                used.add(entry.__name__)
            return entry

        for name, entry in (("_decode_function", "decode_step"), ("_cross_decode_function", "cross_decode")):
            monkeypatch.setattr(ops_local_softmax, name,
                                lambda device, entry=entry: chosen(getattr(ops_local_softmax_triton, entry)))
        attention = ops_local_softmax._attention_function
        monkeypatch.setattr(ops_local_softmax, "_attention_function",
                            lambda device, *sizes: chosen(attention(torch.device("cuda"), *sizes)))
        choose = ops_decay._tail_kernel
        monkeypatch.setattr(ops_decay, "_tail_kernel", lambda device, dim: chosen(choose(torch.device("cuda"), dim)))
        monkeypatch.setattr(ops_decay_triton, "CHUNK", chunk)
        monkeypatch.setattr(ops_local_softmax_triton, "BLOCK", chunk)
        for name in ("KEY_TILE", "KEY_BLOCK"):
            monkeypatch.setattr(ops_local_softmax_triton, name, min(chunk, getattr(ops_local_softmax_triton, name)))
        # the parallel walks' scan in parts of 2 rows of the states and steps of 2 chunks, so that small head
        # dimensions take several parts and short inputs several steps
        monkeypatch.setattr(ops_local_softmax_triton, "SCAN_ROWS", 2)
        monkeypatch.setattr(ops_local_softmax_triton, "SCAN_SLOTS", 2)
        # the sequential walks, which the op takes beyond PARALLEL_WALK_PROGRAMS programs, at the tests' few rows
        # too (test_parallel_walks_equal_the_sequential_walks holds the parallel passes to them)
        monkeypatch.setattr(ops_local_softmax_triton, "PARALLEL_WALKS", False)
        return used

    return use
