"""kernel_specialisations.py counts the specialisations Triton would compile for each kernel of the default attention
in a training run, on CPU, the kernels recorded and not run."""

import json

import pytest


def test_kernel_specialisations_counts_a_quick_run(run_command, tmp_path):
    """The quick run (the tiny model, 2 steps, 4 examples evaluated) launches the forward, backward and decoding
    kernels; each has at least one specialisation and no fewer than it would have with the lengths unspecialised; the
    window kernels see Lq both as 1 (generation's first step) and as neither 1 nor a multiple of 16."""
    pytest.importorskip("triton")
    report_path = tmp_path / "report.json"
    result = run_command(["benchmarks/kernel_specialisations.py", "--quick", "--json", str(report_path)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    kernels = json.loads(report_path.read_text())["kernels"]
    assert {"_forward", "_backward_queries", "_backward_keys", "_row_terms", "_decode_step", "_cross_decode"} <= set(
        kernels)
    for name, row in kernels.items():
        assert row["launches"] > 0 and row["specialisations"] >= row["without_lengths"] >= 1, name
    assert kernels["_forward"]["varying"]["lq"] == ["1", "int"]
    assert kernels["_forward"]["specialisations"] > kernels["_forward"]["without_lengths"]
    assert "| _forward | " in result.stdout and "compiles in all" in result.stdout


def test_kernel_specialisations_kinds(import_benchmark):
    """An integer specialises as 1, a multiple of 16 or neither; a tensor by dtype and 16-byte alignment."""
    pytest.importorskip("triton")
    specialisation = import_benchmark("kernel_specialisations").specialisation
    import torch

    assert [specialisation(n) for n in (1, 32, 0, 17)] == ["1", "multiple of 16", "multiple of 16", "int"]
    x = torch.zeros(8)
    assert specialisation(x) == ("torch.float32", True) and specialisation(x[1:]) == ("torch.float32", False)
