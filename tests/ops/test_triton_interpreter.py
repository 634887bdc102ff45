"""The interpreter the kernel tests run in: tests/conftest.py maps triton.language onto Triton's interpreter once a
launch (`patch_the_language_once_a_launch`), not again at each call of a jit function inside the kernel. Run by
test_triton_interpreted.py with TRITON_INTERPRET=1, like the kernel tests."""

import os

import pytest
import torch


if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by test_triton_interpreted.py with TRITON_INTERPRET=1", allow_module_level=True)
triton = pytest.importorskip("triton")
pytest.importorskip("numpy")

import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _nested_calls(X, Y, N: tl.constexpr, CALLS: tl.constexpr):
    x = tl.load(X + tl.arange(0, N))
    for _ in range(CALLS):
        x = _twice(x)
    tl.store(Y + tl.arange(0, N), x)


def launch_mappings(monkeypatch, calls: int) -> tuple[torch.Tensor, int]:
    """A launch of `_nested_calls` with `calls` calls of `_twice`: its output, and how many times the interpreter
    mapped a language module's builtins (`_patch_builtin`) meanwhile."""
    mapped = []
    patch_builtin = interpreter._patch_builtin
    x = torch.arange(8, dtype=torch.float32)
    y = torch.empty_like(x)
    with monkeypatch.context() as patched:
        patched.setattr(interpreter, "_patch_builtin", lambda *args: (mapped.append(args[0]), patch_builtin(*args)))
        _nested_calls[(1,)](x, y, N=8, CALLS=calls)
    return y, len(mapped)


def test_the_language_is_mapped_once_a_launch(monkeypatch):
    """A launch with five calls of a jit function maps the language as often as one without any, and computes the
    same as Python does; after it, triton.language is Triton's own again."""
    assert getattr(interpreter._patch_lang, "once_a_launch", False), "tests/conftest.py's mapping is not installed"
    y, with_calls = launch_mappings(monkeypatch, 5)
    torch.testing.assert_close(y, torch.arange(8, dtype=torch.float32) * 32)
    y, without = launch_mappings(monkeypatch, 0)
    torch.testing.assert_close(y, torch.arange(8, dtype=torch.float32))
    assert with_calls == without > 0
    assert tl.core.is_builtin(tl.full) and tl.core.is_builtin(tl.load)
