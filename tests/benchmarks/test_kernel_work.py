"""kernel_work.py counts, through Triton's interpreter, the multiply-adds and transcendentals of the default
attention's kernels per 64 positions, beside fla's chunk linear attention."""

import json

import pytest


def kernel_work(run_command, tmp_path, *extra):
    """kernel_work.py's JSON report and its output at L = 256, with the options `extra`."""
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    path = tmp_path / f"work{len(extra)}.json"
    result = run_command(["benchmarks/kernel_work.py", "--length", "256", "--json", str(path), *extra])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(path.read_text()), result.stdout


def test_kernel_work_counts_the_products_of_each_kernel(run_command, tmp_path):
    """`_forward`'s products per query block of 64, as its code takes them: the queries against the table (64 x 64
    table rows x D), then for each key of the window the logits, the kernel features and the values (3 x 64 x D), and
    one product with each direction's state (64 x D x Dv). Causal, the window's 80 keys in tiles of 32, 32 and 16
    (`TAIL_TILES`, the default), the last in the band only without the kernel features (`ONE_SIDED_TILES`, 2 x 64 x D
    a key); bidirectional 96 keys and two states. `_chunk_sums` takes one (D, 64) x (64, Dv)
    product a chunk and direction. The scan takes no product; fla's figures are those of its source."""
    d = 64
    report, stdout = kernel_work(run_command, tmp_path)
    causal, bidirectional = report["causal"]["kernels"], report["bidirectional"]["kernels"]
    assert causal["_forward"]["forward_macs"] == 64 * 64 * d + 3 * 64 * d * 64 + 2 * 64 * d * 16 + 64 * d * d
    assert bidirectional["_forward"]["forward_macs"] == 64 * 64 * d + 3 * 64 * d * 96 + 2 * 64 * d * d
    assert causal["_chunk_sums"]["forward_macs"] == d * 64 * d
    assert bidirectional["_chunk_sums"]["forward_macs"] == 2 * d * 64 * d
    assert causal["_scan_sums"]["forward_macs"] == causal["_scan_sums"]["backward_macs"] == 0
    for kernels in (causal, bidirectional):
        assert kernels["_forward"]["backward_macs"] == 0 and kernels["_backward_keys"]["forward_macs"] == 0
        assert kernels["_forward"]["forward_transcendental"] > 0
        assert kernels["_backward_queries"]["backward_macs"] > kernels["_forward"]["forward_macs"]
    assert report["fla_macs"] == {"forward": 4 * 64 ** 3, "backward": 10 * 64 ** 3, "both": 14 * 64 ** 3}
    totals = report["causal"]["totals"]
    assert report["causal"]["against_fla"] == pytest.approx(
        (totals["forward_macs"] + totals["backward_macs"]) / (14 * 64 ** 3))
    assert "| _forward | 1 | 1,441,792 | 0 |" in stdout and "x fla's chunk linear attention" in stdout


@pytest.mark.slow  # a second count through the interpreter
def test_kernel_work_takes_kernel_options(run_command, tmp_path):
    """`--kernel-options`: the kernels counted with the module's options set, named in the header and the JSON; in
    whole tiles (`TAIL_TILES=()`) `_forward`'s causal window of 80 keys takes three tiles of 32, 96 keys, the last in
    the band only (2 products a key, 3 with `ONE_SIDED_TILES=False`)."""
    d = 64
    whole, stdout = kernel_work(run_command, tmp_path, "--kernel-options", "TAIL_TILES=()")
    assert whole["causal"]["kernels"]["_forward"]["forward_macs"] == (
        64 * 64 * d + 3 * 64 * d * 64 + 2 * 64 * d * 32 + 64 * d * d)
    assert whole["kernel_options"] == {"TAIL_TILES": "()"} and "TAIL_TILES = ()" in stdout
    two_sided, _ = kernel_work(run_command, tmp_path, "--kernel-options", "TAIL_TILES=()", "ONE_SIDED_TILES=False")
    assert two_sided["causal"]["kernels"]["_forward"]["forward_macs"] == 64 * 64 * d + 3 * 64 * d * 96 + 64 * d * d


@pytest.mark.parametrize("option, message", [
    ("FOO=1", "--kernel-options takes NAME=VALUE with NAME an option of ops_local_softmax_triton"),
    # the literal and type errors of `common.parse_kernel_options`, which bench_train.py's parser gives in this
    # process too (test_bench_train_kernel_options_errors)
    pytest.param("TAIL_TILES=forward", "the value of TAIL_TILES must be a Python literal, got 'forward'",
                 marks=pytest.mark.slow),
    pytest.param("TAIL_TILES=1", "TAIL_TILES takes a tuple (default ('_forward',)), got 1", marks=pytest.mark.slow),
])
def test_kernel_work_refuses_a_bad_option(option, message, run_command):
    result = run_command(["benchmarks/kernel_work.py", "--kernel-options", option])
    assert result.returncode == 2 and message in result.stderr
