"""The Triton kernels' tests (test_local_softmax_triton.py, test_decay_triton.py, and the models on them in
tests/models/test_triton_paths.py) through Triton's interpreter,
in a fresh process with TRITON_INTERPRET=1: on a machine without CUDA, in the default test run. Triton's own
library functions (tl.sum among them) are interpreted only if the variable was set when Triton was first
imported, so the kernels cannot share a process with tests that imported it before."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


KERNEL_TESTS = [Path(__file__).with_name(name) for name in ("test_local_softmax_triton.py", "test_decay_triton.py")]
KERNEL_TESTS.append(Path(__file__).parents[1] / "models" / "test_triton_paths.py")  # the models on those kernels


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernel tests run in this process, on the GPU")
def test_triton_kernels_through_the_interpreter():
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, KERNEL_TESTS)],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
