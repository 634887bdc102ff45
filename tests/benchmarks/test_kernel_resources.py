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
        cap, registers, spills, shared = (cell.strip() for cell in row.split("|")[6:10])
        assert cap == "-"
        assert 0 < int(registers) <= 255 and " / " in spills and int(shared.replace(",", "")) > 0


def test_kernel_resources_counts_instructions(run_command, import_benchmark):
    """`--instructions`: the machine code's instructions by kind, from nvdisasm's listing (a predicated instruction
    counts as its opcode; labels, comments and control words do not), and its longest loop's body (a branch back to
    a label, not one forward nor the branch to itself that ends a kernel); `_forward` at BLOCK 64 multiplies its
    tiles with sm90's warpgroup MMAs in its window's loop, and compiled without its arguments marked multiples of 16
    (`--unaligned`) it takes more instructions."""
    pytest.importorskip("triton")
    counts = import_benchmark("kernel_resources").instruction_counts(
        "\t.text._forward:\n.L_x_0:\n        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
        "                                                                      /* 0x00000a00ff017b82 */\n"
        "        /*0010*/               @!P0 BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
        "        /*0020*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], R24 ;\n"
        "        /*0030*/               @UP0 SHFL.BFLY PT, R3, R2, 0x1, 0x1f ;\n"
        ".L_x_1:\n        /*0040*/                   MUFU.EX2 R4, R3 ;\n"
        "        /*0050*/               @P1 BRA `(.L_x_2) ;\n"
        "        /*0060*/               @P0 BRA `(.L_x_1) ;\n"
        ".L_x_2:\n        /*0070*/                   EXIT ;\n"
        ".L_x_3:\n        /*0080*/                   BRA `(.L_x_3);\n")
    assert counts == {"HGMMA": 1, "HMMA": 0, "SHFL": 1, "BAR": 1, "MUFU": 1, "total": 9, "loop": 3}
    result = run_command(["benchmarks/kernel_resources.py", "--kernels", "_forward", "--blocks", "64", "--warps", "4",
                          "--stages", "1", "--instructions"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "| shared (bytes) | HGMMA | HMMA | SHFL | BAR | MUFU | instructions | loop body |" in result.stdout

    def counted(stdout):
        row = next(line for line in stdout.splitlines() if line.startswith("| _forward"))
        return [int(cell.replace(",", "")) for cell in row.split("|")[10:17]]

    hgmma, hmma, shfl, bar, mufu, total, loop = counted(result.stdout)
    assert hgmma > 0 and mufu > 0 and total > hgmma + hmma + shfl + bar + mufu
    assert 0 < loop < total
    unaligned = run_command(["benchmarks/kernel_resources.py", "--kernels", "_forward", "--blocks", "64", "--warps",
                             "4", "--stages", "1", "--instructions", "--unaligned"])
    assert unaligned.returncode == 0, unaligned.stdout[-2000:] + unaligned.stderr[-3000:]
    assert counted(unaligned.stdout)[-2] > total


@pytest.mark.slow  # the default run compiles with the script's other options
def test_kernel_resources_caps_registers(run_command):
    """`--registers N`: the kernels compiled with Triton's maxnreg, at most N registers a thread, the rest spilled."""
    pytest.importorskip("triton")
    result = run_command(["benchmarks/kernel_resources.py", "--kernels", "_forward", "--blocks", "64", "--warps", "4",
                          "--stages", "1", "--registers", "128"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| _forward"))
    cap, registers, spills = (cell.strip() for cell in row.split("|")[6:9])
    assert cap == "128" and int(registers) <= 128 and int(spills.split(" / ")[0]) > 0


@pytest.mark.slow  # four compiles of the window kernels, about a minute
def test_kernel_resources_tail_tiles(run_command):
    """`--tail-tiles` and `--whole-tiles`: causal at h = 16, `_forward`'s window of 80 keys in tiles of 32, 32 and 16
    (the module's default), whose code the kernel then holds beside the loop's, takes more instructions than in three
    tiles of 32; `_backward_queries` likewise when named."""
    pytest.importorskip("triton")

    def instructions(kernel, *extra):
        result = run_command(["benchmarks/kernel_resources.py", "--kernels", kernel, "--blocks", "64", "--warps",
                              "4", "--stages", "1", "--causal", "--instructions", *extra])
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        row = next(line for line in result.stdout.splitlines() if line.startswith(f"| {kernel}"))
        return int(row.split("|")[-3].replace(",", "")), result.stdout  # the instructions, before the loop's

    whole, stdout = instructions("_forward", "--whole-tiles")
    assert "narrower last tile in: none" in stdout
    tails, stdout = instructions("_forward")
    assert tails > whole and "narrower last tile in: _forward" in stdout
    whole, _ = instructions("_backward_queries")
    tails, stdout = instructions("_backward_queries", "--tail-tiles", "_backward_queries")
    assert tails > whole and "narrower last tile in: _backward_queries" in stdout


@pytest.mark.slow  # two compiles of `_backward_queries`
def test_kernel_resources_without_a_table(run_command):
    """`--no-table`: the window kernels as a configuration without a relative table takes them, without the table's
    products and gathers: fewer instructions and warp shuffles than with the table."""
    pytest.importorskip("triton")

    def cells(*extra):
        result = run_command(["benchmarks/kernel_resources.py", "--kernels", "_backward_queries", "--blocks", "64",
                              "--warps", "4", "--stages", "1", "--instructions", *extra])
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        row = next(line for line in result.stdout.splitlines() if line.startswith("| _backward_queries"))
        cells = [cell.strip().replace(",", "") for cell in row.split("|")]
        return (int(cells[-6]), int(cells[-3])), result.stdout  # SHFL, the total

    (shuffles, total), _ = cells()
    (fewer_shuffles, fewer), stdout = cells("--no-table")
    assert fewer_shuffles < shuffles and fewer < total and "without a relative table" in stdout


@pytest.mark.slow  # the options' parsing (common.py) and setting are checked in the default run elsewhere
def test_kernel_resources_kernel_options(run_command):
    """`--kernel-options`: module options of ops_local_softmax_triton for the compiles, named in the header; a name
    that is not one is refused."""
    pytest.importorskip("triton")
    result = run_command(["benchmarks/kernel_resources.py", "--kernels", "_forward", "--blocks", "64", "--warps", "4",
                          "--stages", "1", "--causal", "--kernel-options", "MIN_TABLE_TILE=32"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[0].endswith(", MIN_TABLE_TILE = 32")
    assert sum(line.startswith("| _forward") for line in result.stdout.splitlines()) == 1
    refused = run_command(["benchmarks/kernel_resources.py", "--kernel-options", "MIN_TABLE=32"])
    assert refused.returncode == 2 and "NAME an option of ops_local_softmax_triton" in refused.stderr
