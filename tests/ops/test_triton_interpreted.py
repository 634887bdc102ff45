"""The Triton kernels' tests (test_local_softmax_triton.py, test_decay_triton.py, and the models on them in
tests/models/test_triton_paths.py) through Triton's interpreter, in a fresh process with TRITON_INTERPRET=1: on a
machine without CUDA, in the default test run. Triton's own library functions (tl.sum among them) are interpreted
only if the variable was set when Triton was first imported, so the kernels cannot share a process with tests that
imported it before. The process starts as soon as the tests are collected (`start`, called by tests/conftest.py), so
that it runs beside the rest of the suite, on another core, rather than after it."""

import atexit
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch


KERNEL_TESTS = [Path(__file__).with_name(name) for name in ("test_local_softmax_triton.py", "test_decay_triton.py")]
KERNEL_TESTS.append(Path(__file__).parents[1] / "models" / "test_triton_paths.py")  # the models on those kernels
TIMEOUT = 900
RUN = {}  # the process and the file holding its output, once started


def runnable() -> bool:
    """Whether the interpreted run applies: no CUDA (there the kernel tests run in the main process, on the GPU),
    and Triton and NumPy installed."""
    return not torch.cuda.is_available() and all(importlib.util.find_spec(name) for name in ("triton", "numpy"))


def start() -> None:
    """Starts the interpreted run (once)."""
    if RUN or not runnable():
        return
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    output = tempfile.TemporaryFile(mode="w+")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, KERNEL_TESTS)]
    RUN.update(process=subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, text=True),
               output=output)
    atexit.register(RUN["process"].kill)  # a session that ends early does not leave it running


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernel tests run in this process, on the GPU")
def test_triton_kernels_through_the_interpreter():
    if not runnable():
        pytest.skip("needs triton and numpy")
    start()
    try:
        returncode = RUN["process"].wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        RUN["process"].kill()
        raise
    RUN["output"].seek(0)
    output = RUN["output"].read()
    assert returncode == 0, output[-6000:]
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
