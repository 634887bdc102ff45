"""The Triton kernels' tests (test_local_softmax_triton.py, test_decay_triton.py, and the models on them in
tests/models/test_triton_paths.py, with test_triton_interpreter.py on the interpreter they run in) through Triton's
interpreter, in a fresh process with TRITON_INTERPRET=1: on a machine without CUDA, in the default test run. Triton's
own library functions (tl.sum among them) are interpreted only if the variable was set when Triton was first imported,
so the kernels cannot share a process with tests that imported it before. The process starts as soon as the tests are
collected (`start`, called by tests/conftest.py), so that it runs beside the rest of the suite, on another core,
rather than after it, and the test that waits for it runs last (`pytest_collection_modifyitems` there). It runs the
kernel tests that the run selects by marker: the default run those not marked `slow`, `pytest -m slow` the slow ones
(wider shapes, the models' other paths, compilation)."""

import atexit
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch


KERNEL_TESTS = [Path(__file__).with_name(name)
                for name in ("test_local_softmax_triton.py", "test_decay_triton.py", "test_triton_interpreter.py")]
KERNEL_TESTS.append(Path(__file__).parents[1] / "models" / "test_triton_paths.py")  # the models on those kernels
# seconds each run may take: on 2 CPU cores, the default run took about 6 minutes, and the slow one 26 beside the other
# slow tests (2026-11-29)
TIMEOUT = {"not slow": 900, "slow": 3600}
RUN = {}  # marker expression -> the process and the file holding its output, once started


def runnable() -> bool:
    """Whether the interpreted run applies: no CUDA (there the kernel tests run in the main process, on the GPU),
    and Triton and NumPy installed."""
    return not torch.cuda.is_available() and all(importlib.util.find_spec(name) for name in ("triton", "numpy"))


def start(markers: str = "not slow") -> None:
    """Starts the interpreted run of the kernel tests selected by `markers` (once)."""
    if markers in RUN or not runnable():
        return
    # one thread: the interpreter's work is Python's, and the rest of the suite has the cores' other threads
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    output = tempfile.TemporaryFile(mode="w+")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markers, *map(str, KERNEL_TESTS)]
    process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
    RUN[markers] = dict(process=process, output=output)
    atexit.register(process.kill)  # a session that ends early does not leave it running


def check_run(markers: str) -> None:
    if not runnable():
        pytest.skip("needs triton and numpy")
    start(markers)
    run = RUN[markers]
    try:
        returncode = run["process"].wait(timeout=TIMEOUT[markers])
    except subprocess.TimeoutExpired:
        run["process"].kill()
        raise
    run["output"].seek(0)
    output = run["output"].read()
    assert returncode == 0, output[-6000:]
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary


NOT_ON_CUDA = pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="with CUDA the kernel tests run in this process, on the GPU")


# each test's marker expression for the kernel tests it runs (tests/conftest.py starts the selected ones)
INTERPRETED_RUNS = {"test_triton_kernels_through_the_interpreter": "not slow",
                    "test_slow_triton_kernels_through_the_interpreter": "slow"}


@NOT_ON_CUDA
def test_triton_kernels_through_the_interpreter():
    check_run(INTERPRETED_RUNS["test_triton_kernels_through_the_interpreter"])


@NOT_ON_CUDA
@pytest.mark.slow
def test_slow_triton_kernels_through_the_interpreter():
    check_run(INTERPRETED_RUNS["test_slow_triton_kernels_through_the_interpreter"])
