"""kernel_resources.py compiles kernels of the default attention for sm90 without a GPU and reports what ptxas
says of them, marking the launch options and key tile the op uses."""

import pytest


def test_kernel_resources_reports_ptxas_figures(run_command):
    pytest.importorskip("triton")
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    other_tile = 16 if kernels.KEY_TILE != 16 else 32
    warps, stages = kernels.LAUNCH["_forward"].get("num_warps", 4), kernels.LAUNCH["_forward"].get("num_stages", 3)
    # so that the `_states` row is not marked
    assert (kernels.LAUNCH["_states"].get("num_warps", 4), kernels.LAUNCH["_states"].get("num_stages", 3)) != (
        warps, stages)
    result = run_command(["benchmarks/kernel_resources.py", "--kernels", "_states", "_forward", "--blocks", "64",
                          "--warps", str(warps), "--stages", str(stages),
                          "--tiles", str(kernels.KEY_TILE), str(other_tile)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| _")]
    assert len(rows) == 3
    walk, chosen, other = rows
    assert walk.startswith(f"| _states | 64 | - | {warps} | {stages} |")  # the walks take no key tile
    assert chosen.startswith(f"| _forward * | 64 | {kernels.KEY_TILE} | {warps} | {stages} |")
    assert other.startswith(f"| _forward | 64 | {other_tile} | {warps} | {stages} |")
    for row in rows:
        registers, spills, shared = (cell.strip() for cell in row.split("|")[6:9])
        assert 0 < int(registers) <= 255 and " / " in spills and int(shared.replace(",", "")) > 0
