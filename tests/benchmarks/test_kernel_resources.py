"""kernel_resources.py compiles a kernel of the default attention for sm90 without a GPU and reports what ptxas
says of it, marking the launch options the op uses."""

import pytest


def test_kernel_resources_reports_ptxas_figures(run_command):
    pytest.importorskip("triton")
    result = run_command(["benchmarks/kernel_resources.py", "--kernels", "_states", "--blocks", "64", "--warps", "8",
                          "--stages", "3", "1"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| _states")]
    assert len(rows) == 2
    chosen, other = rows
    assert chosen.startswith("| _states * | 64 | 8 | 3 |") and other.startswith("| _states | 64 | 8 | 1 |")
    registers, spills, shared = (cell.strip() for cell in chosen.split("|")[5:8])
    assert 0 < int(registers) <= 255 and " / " in spills and int(shared.replace(",", "")) > 0
