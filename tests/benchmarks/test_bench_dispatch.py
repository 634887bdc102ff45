"""bench_dispatch.py counts, on CPU, the operations and kernel launches of one training step and of greedy decoding as
they run on CUDA."""

import json

import pytest


def test_bench_dispatch_counts_a_quick_step(run_command, tmp_path):
    """The tiny models: Scaleformer's step launches its attention's eight kernels once per attention call (2 + 2
    layers: self attention in the encoder and decoder, cross attention, 6 calls), BART's none; the attention op's own
    operations stay few per call (278 in the 6 calls at this state: its buffers, the reductions of its gradients'
    partial sums, and in the 2 causal calls the table's rows that the band does not read, set to 0); in greedy
    decoding each token launches one decoding kernel per attention layer of the decoder."""
    pytest.importorskip("triton")
    report_path = tmp_path / "report.json"
    result = run_command(["benchmarks/bench_dispatch.py", "--quick", "--json", str(report_path)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {row["model"]: row for row in json.loads(report_path.read_text())["models"]}
    assert set(rows) == {"scaleformer", "bart"}
    scaleformer, bart = rows["scaleformer"], rows["bart"]
    forward_kernels = ("_chunk_sums", "_scan_sums", "_forward")
    backward_kernels = ("_row_terms", "_query_sums", "_scan_sums", "_backward_queries", "_backward_keys")
    expected = {**{f"forward {k}": 6 for k in forward_kernels}, **{f"backward {k}": 6 for k in backward_kernels}}
    assert scaleformer["launches"] == expected
    assert scaleformer["forward_triton"] == 18 and scaleformer["backward_triton"] == 30
    assert bart["launches"] == {} and bart["forward_attention_other"] == bart["backward_attention_kernels"] == 0
    attention = sum(scaleformer[f"{phase}_attention_{kind}"] for phase in ("forward", "backward")
                    for kind in ("kernels", "other"))
    assert 0 < attention <= 6 * 47
    for row in rows.values():
        assert row["operations"] > 500 and row["kernels"] > 200
        assert row["decode_first_operations"] > row["decode_operations"] > 50
    # a token: each of the two decoder layers' self-attention step and cross attention step, one launch each
    assert scaleformer["decode_launches"] == 4 and scaleformer["decode_first_launches"] > 4
    assert bart["decode_launches"] == bart["decode_first_launches"] == 0
    assert "| scaleformer | " in result.stdout and "| bart | " in result.stdout
    assert "operations per generated token" in result.stdout
    # the passes over the states' chunks at 1024 source tokens (16 chunks) and 128 target tokens (2), forward and
    # backward: the encoder's both ways, each chunk read; the decoder's causal; the cross attention's, whose
    # anticausal pass folds the 14 source chunks before the 2 target blocks that read it, then goes through those
    # blocks' 2 slots forward, and back through them and the slot before them
    shapes = {(p["phase"], tuple(p["slots"]), p["read"], tuple(p["folded"])) for p in scaleformer["passes"]}
    assert shapes == {(phase, *shape) for phase in ("forward", "backward")
                      for shape in (((16, 16), 16, (0, 0)), ((2,), 2, (0,)))} | {
        ("forward", (2, 2), 2, (0, 14)), ("backward", (2, 3), 2, (0, 0))}
    assert scaleformer["pass_launches"] == 12
    assert (scaleformer["pass_slots"], scaleformer["pass_slots_read"], scaleformer["pass_slots_folded"]) == (
        4 * 16 + 4 * 2 + 2 * 2 + 2 * 3, 4 * 16 + 8 * 2, 2 * 14)
    assert bart["pass_launches"] == 0
    assert "| forward | _scan_sums | 2, 2 | 2 | 0, 14 | 2 |" in result.stdout


def test_bench_dispatch_pass_counts(import_benchmark):
    """A launch's slots, and the slots it folds, are those of its longest direction; the long passes are those of 64
    slots or more."""
    pass_counts = import_benchmark("bench_dispatch").pass_counts
    passes = [{"phase": "forward", "kernel": "_scan_sums", "read": 256, "slots": [256, 256], "folded": [0, 0]},
              {"phase": "backward", "kernel": "_states_backward", "read": 2, "slots": [2, 256], "folded": [0, 0]},
              {"phase": "forward", "kernel": "_scan_sums", "read": 2, "slots": [2, 2], "folded": [0, 254]},
              {"phase": "forward", "kernel": "_scan_sums", "read": 2, "slots": [2], "folded": [0]}]
    assert pass_counts(passes) == {"pass_launches": 4, "pass_slots": 516, "pass_slots_read": 262,
                                   "pass_slots_folded": 254, "long_passes": 2, "long_pass_slots": 512,
                                   "long_pass_slots_read": 258}


def test_bench_dispatch_kinds(import_benchmark):
    """Views, detach, allocations and dtype queries launch no kernel; arithmetic, reductions and casts do."""
    pytest.importorskip("triton")
    launches_kernel = import_benchmark("bench_dispatch").launches_kernel
    import torch

    aten = torch.ops.aten
    quiet = (aten.view.default, aten.t.default, aten.detach.default, aten.new_empty.default, aten.empty_like.default,
             aten.promote_types.default, aten.transpose.int)
    busy = (aten.add.Tensor, aten.sum.dim_IntList, aten._to_copy.default, aten.mm.default, aten.fill_.Scalar)
    assert not any(map(launches_kernel, quiet)) and all(map(launches_kernel, busy))
