"""tune_kernels.py on CPU (`--device cpu --quick`): the settings are checked in two processes at once, then timed
against the baseline; on CPU the op takes its PyTorch path, so this checks the script's path, not the kernels."""

import json


def test_tune_kernels_quick(run_command, tmp_path):
    report_path = tmp_path / "report.json"
    result = run_command(["benchmarks/tune_kernels.py", "--device", "cpu", "--quick", "--dtype", "float32",
                          "--kernels", "_forward", "_backward_keys", "--warps", "4", "--stages", "2",
                          "--json", str(report_path)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert [(r["kernel"], r["num_warps"], r["num_stages"]) for r in report["rows"]] == [
        ("_forward", 4, 2), ("_backward_keys", 4, 2)]
    assert all(r["check"]["ok"] and r["seconds"]["causal"] > 0 and r["seconds"]["bidir"] > 0 for r in report["rows"])
    assert len(report["baselines"]) == 3
    assert "[check] 2 settings in 2 process(es)" in result.stderr
    assert "| _backward_keys | 4 | 2 |" in result.stdout


def test_tune_kernels_skips_the_kernels_own_setting_and_refuses_unknown_kernels(import_benchmark):
    tune = import_benchmark("tune_kernels")
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    args = tune.parse_args(["--device", "cpu", "--kernels", "_forward", "--warps", "4", "8", "--stages", "1", "2"])
    found = tune.settings(args)
    assert ("_forward", {"num_stages": 3, **LAUNCH["_forward"]}) not in found and len(found) == 3
    try:
        tune.parse_args(["--device", "cpu", "--kernels", "_nope"])
    except SystemExit as error:
        assert error.code == 2
    else:
        raise AssertionError("an unknown kernel was accepted")
