"""bench_attention_gpu.py on CPU (`--device cpu --quick`): the GPU benchmark's code path runs end to end, times
the default attention and SDPA, says why fla is skipped, profiles the op and reports its targets as N/A below
16k; run_gpu.sh, which runs it with the other GPU measurements, refuses a step it does not know."""

import json
import subprocess
from pathlib import Path

import pytest


RUN_GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "run_gpu.sh"


def test_bench_attention_gpu_smoke(run_command, tmp_path):
    report_path = tmp_path / "report.json"
    result = run_command(["benchmarks/bench_attention_gpu.py", "--device", "cpu", "--quick", "--dtype", "float32",
                          "--lengths", "128", "--profile", "64", "--kernel-block", "32", "--parallel-walks",
                          "--key-tile", "16", "--key-block", "64", "--variants", "wide_tiles", "--host-profile", "64",
                          "--json", str(report_path)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    timed = {(r["method"], r["causal"]) for r in report["timings"] if r.get("median_s") is not None}
    assert timed == {(method, causal) for method in ("scaleformer", "scaleformer:wide_tiles", "sdpa")
                     for causal in (True, False)}
    assert {r["skipped"] for r in report["timings"] if r["method"] == "fla"} <= {
        "fla does not import here", "causal only (its causal time is the ceiling of both)"}
    assert [t["status"] for t in report["targets"]] == ["N/A"] * 6
    assert "| 128 | causal |" in result.stdout
    host = {(r["method"], r["causal"]): r["host_median_s"] for r in report["timings"] if "host_median_s" in r}
    assert set(host) == timed and all(0 < t for t in host.values())
    assert "scaleformer peak MiB | sdpa peak MiB | scaleformer host ms |" in result.stdout
    assert set(report["profiles"]) == {"causal", "bidir"}
    assert "## Profile: scaleformer bidir, L=64, forward + backward" in result.stdout
    assert "aten::bmm" in report["profiles"]["causal"]
    host = report["host_profile"]
    assert host["length"] == 64 and host["forward_issue_s"] > 0 and host["backward_issue_s"] > 0
    assert host["profiled_calls"] == host["calls"] == 20 and host["profiled_s"] > 0
    assert "function calls in" in host["forward_table"] and "Ordered by: internal time" in host["forward_table"]
    assert "## Host: scaleformer causal, L=64: the host issues a forward in" in result.stdout
    assert "kernel blocks of 32; key tiles of 16; 64 keys per backward program; parallel walks" in result.stdout
    assert set(report["check"]) == {"scaleformer", "scaleformer:wide_tiles"}
    for checked in report["check"].values():
        assert checked["ok"] and checked["length"] == 128 and set(checked["errors"]) == {"causal", "bidir"}
        errors = [e for row in checked["errors"].values() for e in row.values()]
        assert all(0 < e <= checked["tolerance"] for e in errors)
    assert "| scaleformer:wide_tiles | causal | " in result.stdout.split("Check against the float64 reference")[1]
    assert "| L | direction | scaleformer ms | wide_tiles ms | wide_tiles / scaleformer |" in result.stdout


@pytest.mark.parametrize("option", ["--key-tile", "--kernel-block", "--key-block"])
def test_bench_attention_gpu_refuses_a_size_the_kernels_cannot_take(option, run_main):
    result = run_main(["benchmarks/bench_attention_gpu.py", "--device", "cpu", "--quick", option, "24"])
    assert result.returncode == 2
    assert f"{option} must be a power of two >= 16, got 24" in result.stderr


def test_run_gpu_names_variants_that_exist(import_benchmark):
    """Every variant that run_gpu.sh asks bench_attention_gpu.py for is one of its VARIANTS, and every option a variant
    sets is an option of `ops_local_softmax_triton` of the same type as its default (any, where the default is None,
    the module's choice): a name misspelt here would otherwise fail only on a GPU."""
    import re

    from modeling_scaleformer import ops_local_softmax_triton as kernels

    bench = import_benchmark("bench_attention_gpu")
    script = RUN_GPU.read_text().replace("\\\n", " ")
    named = {name for match in re.finditer(r"--variants((?:\s+[a-z0-9_]+)+)", script) for name in match[1].split()}
    assert {"stored_pairs_key_block_16", "two_sided_tiles", "key_blocks_from_0"} <= named
    assert named <= set(bench.VARIANTS), named - set(bench.VARIANTS)
    for variant, options in bench.VARIANTS.items():
        for name, value in options.items() if isinstance(options, dict) else ():
            default = getattr(kernels, name)
            assert default is None or type(value) is type(default), (variant, name)
    # the training steps' options (`options=(NAME=VALUE ...)`, `--kernel-options NAME=VALUE`) likewise
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    settings = {setting for match in re.finditer(r"options=\(([^)]*)\)|--kernel-options((?:\s+[A-Z_]+=\S+)+)", code)
                for setting in (match[1] or match[2]).split()}
    assert {"FOLD_SLOTS=0", "SCAN_PRODUCTS=True"} <= settings
    for setting in settings:
        name, value = setting.split("=")
        default = getattr(kernels, name)
        assert default is None or type(eval(value)) is type(default), setting


def test_run_gpu_refuses_an_unknown_step(tmp_path):
    result = subprocess.run(["bash", str(RUN_GPU), str(tmp_path), "atention"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 64
    assert ("unknown step: atention (expected env, compile, attention, attention_variants, attention_backward, "
            "attention_table, attention_pairs, attention_scan, attention_small_batch, attention_rows, "
            "attention_block32, tune, tune_registers, tune_scan, ncu, tests, compile_tests, accelerate, "
            "accelerate_fsdp, train, train_compiled, train_graphs, train_graphs_scan, train_graphs_recurrence, "
            "train_graphs_pairs, train_graphs_candidates, train_graphs_unfolded, generate)") in result.stderr


NCU_CSV = """==PROF== Connected to process 4242 (python3)
"ID","Process ID","Process Name","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_\
elapsed","launch__registers_per_thread","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_\
active.ratio"
"","","","","usecond","%","register/thread","ratio","ratio","ratio"
"0","4242","python3","_forward","1,234.56","35.2","255","4.1","0.5","1.2"
"1","4242","python3","_backward_keys","2000","20.1","255","0","3.3","0.7"
==PROF== Disconnected from process 4242
"""


def test_bench_attention_gpu_ncu_summary(tmp_path, import_benchmark, capsys):
    """`--ncu-summary`: one row per launch of ncu's raw CSV (log lines around it, its units row skipped), the
    columns it holds with the duration's unit, the largest stall reasons first, those of zero cycles left out, and
    the columns it lacks named."""
    path = tmp_path / "ncu.csv"
    path.write_text(NCU_CSV)
    assert import_benchmark("bench_attention_gpu").main(["--ncu-summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| kernel | time (usecond) | SM % | registers | largest stalls (cycles / issue) |" in out
    assert "| _forward | 1,235 | 35.20 | 255 | long_scoreboard 4.1, wait 1.2, barrier 0.5 |" in out
    assert "| _backward_keys | 2,000 | 20.10 | 255 | barrier 3.3, wait 0.7 |" in out
    assert "(not in this CSV: gpu__compute_memory_throughput" in out
    path.write_text("==PROF== nothing profiled\n")
    with pytest.raises(SystemExit, match="no ncu CSV header"):
        import_benchmark("bench_attention_gpu").main(["--ncu-summary", str(path)])


def test_bench_attention_gpu_ncu_run_on_cpu(run_command):
    """`--ncu-run L` runs the op's calls (fla's where it imports) without timing them; on CPU, without the CUDA
    profiler."""
    result = run_command(["benchmarks/bench_attention_gpu.py", "--device", "cpu", "--quick", "--dtype", "float32",
                          "--ncu-run", "64"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.strip().endswith("profiled at L=64: scaleformer causal, scaleformer bidir")


def test_bench_attention_gpu_does_not_time_a_path_that_fails_its_check(import_benchmark, monkeypatch, tmp_path,
                                                                         capsys):
    """An op that computes something else than the reference (here the output off by 10%) fails the check: nothing
    is timed, the report keeps the check's errors and main returns 1."""
    bench = import_benchmark("bench_attention_gpu")
    op = bench.local_softmax_decay_attention
    monkeypatch.setattr(bench, "local_softmax_decay_attention", lambda *args, **kwargs: 1.1 * op(*args, **kwargs))
    report = tmp_path / "report.json"
    assert bench.main(["--device", "cpu", "--quick", "--dtype", "float32", "--lengths", "64", "--json",
                       str(report)]) == 1
    assert "check FAILED: not timed" in capsys.readouterr().out
    checked = json.loads(report.read_text())
    assert not checked["check"]["scaleformer"]["ok"] and checked["timings"] == []
    assert checked["check"]["scaleformer"]["errors"]["causal"]["out"] > 0.05


def test_bench_attention_gpu_check_only_times_nothing(import_benchmark, tmp_path, capsys):
    """`--check-only` checks the op (and so compiles its kernels) and times nothing."""
    bench = import_benchmark("bench_attention_gpu")
    report = tmp_path / "report.json"
    assert bench.main(["--device", "cpu", "--quick", "--dtype", "float32", "--lengths", "64", "--check-only",
                       "--json", str(report)]) == 0
    assert "| scaleformer |" in capsys.readouterr().out
    checked = json.loads(report.read_text())
    assert checked["check"]["scaleformer"]["ok"] and checked["timings"] == []


def test_bench_attention_gpu_check_in_bfloat16_holds_the_reference_to_the_same_upstream(import_benchmark, tmp_path):
    """In bf16 the reference takes the upstream gradient as the op took it, rounded to 16 bits: fed the unrounded one,
    the slow head's decay-rate gradient, a sum of terms of both signs, was 4.9% of the largest off (L = 512, two
    heads, the PyTorch path on CPU), past the 3% the check allows, for a difference of inputs, not of the op."""
    bench = import_benchmark("bench_attention_gpu")
    report = tmp_path / "report.json"
    assert bench.main(["--device", "cpu", "--quick", "--check-only", "--json", str(report)]) == 0
    checked = json.loads(report.read_text())["check"]["scaleformer"]
    assert checked["ok"] and checked["length"] == 512
    assert max(e for row in checked["errors"].values() for e in row.values()) < 1e-2


def test_bench_attention_gpu_no_table_variant(import_benchmark, tmp_path, monkeypatch):
    """The `no_table` variant calls the op without its relative table, checked against the reference without one (its
    table's error 0), and times that call; the other methods keep the table."""
    bench = import_benchmark("bench_attention_gpu")
    report = tmp_path / "report.json"
    assert bench.main(["--device", "cpu", "--quick", "--dtype", "float32", "--lengths", "64", "--variants", "no_table",
                       "--check-only", "--json", str(report)]) == 0
    checked = json.loads(report.read_text())["check"]["scaleformer:no_table"]
    assert checked["ok"] and all(row["rel"] == 0 and row["out"] > 0 for row in checked["errors"].values())
    tables = []
    op = bench.local_softmax_decay_attention

    def recorded(q, k, v, table, *args, **kwargs):
        tables.append(table)
        return op(q, k, v, table, *args, **kwargs)

    monkeypatch.setattr(bench, "local_softmax_decay_attention", recorded)
    args = bench.parse_args(["--device", "cpu", "--quick", "--dtype", "float32"])
    for method in ("scaleformer", "scaleformer:no_table"):
        bench.make_call(method, True, 64, args, None)()
    assert tables[0] is not None and tables[1] is None


@pytest.mark.slow  # the quick run and the tune report's reading stay in the default run
def test_bench_attention_gpu_tune(run_command, tmp_path):
    """`--tune` on CPU (`--quick`): the settings are checked in two processes at once, then timed against the
    baseline; on CPU the op takes its PyTorch path, so this checks the script's path, not the kernels."""
    report_path = tmp_path / "report.json"
    result = run_command(["benchmarks/bench_attention_gpu.py", "--device", "cpu", "--quick", "--dtype", "float32",
                          "--tune", "--tune-kernels", "_forward", "_backward_keys", "--warps", "16", "--stages", "2",
                          "--json", str(report_path)])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert [(r["kernel"], r["num_warps"], r["num_stages"]) for r in report["rows"]] == [
        ("_forward", 16, 2), ("_backward_keys", 16, 2)]
    assert all(r["check"]["ok"] and r["seconds"]["causal"] > 0 and r["seconds"]["bidir"] > 0 for r in report["rows"])
    assert len(report["baselines"]) == 3
    assert "[check] 2 settings in 2 process(es)" in result.stderr
    assert "| _backward_keys | 16 | 2 |" in result.stdout


def test_bench_attention_gpu_tune_skips_each_kernels_own_setting(import_benchmark, capsys):
    bench = import_benchmark("bench_attention_gpu")
    from modeling_scaleformer.ops_local_softmax_triton import LAUNCH

    args = bench.parse_args(["--device", "cpu", "--tune", "--tune-kernels", "_forward", "--warps", "4", "8",
                             "--stages", "1", "2"])
    found = bench.tune_settings(args)
    assert ("_forward", {"num_stages": 3, **LAUNCH["_forward"]}) not in found and len(found) == 3
    assert args.lengths == [args.tune_length] == [bench.TARGET_LENGTH]
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--tune", "--tune-kernels", "_nope"])
    assert "--tune-kernels takes names of ops_local_softmax_triton.LAUNCH" in capsys.readouterr().err
    # caps on registers: each setting also with each cap, the kernel's own setting with a cap among them
    args = bench.parse_args(["--device", "cpu", "--tune", "--tune-kernels", "_forward", "--warps", "4", "8",
                             "--stages", "1", "2", "--registers", "168"])
    found = bench.tune_settings(args)
    assert len(found) == 7 and ("_forward", {**LAUNCH["_forward"], "maxnreg": 168}) in found
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--tune", "--registers", "300"])
    assert "--registers must lie between 24 and 255, got [300]" in capsys.readouterr().err


def test_bench_attention_gpu_launches_the_kernels_as_a_tune_report_found_best(import_benchmark, tmp_path, capsys):
    bench = import_benchmark("bench_attention_gpu")
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    report = tmp_path / "tune.json"
    report.write_text(json.dumps({"best": {"_forward": {"num_warps": 4, "num_stages": 1}}}))
    args = bench.parse_args(["--device", "cpu", "--quick", "--launch", str(report)])
    launch = bench.command_options(args)["LAUNCH"]
    assert launch == {**kernels.LAUNCH, "_forward": {"num_warps": 4, "num_stages": 1}}
    saved = dict(kernels.LAUNCH)
    with bench.kernel_options(bench.command_options(args)):
        assert kernels.LAUNCH["_forward"] == {"num_warps": 4, "num_stages": 1}
        assert kernels.LAUNCH["_backward_keys"] == saved["_backward_keys"]
    assert kernels.LAUNCH == saved

    for text, expected in (("{}", "--launch takes the JSON of a --tune run"),
                           (json.dumps({"best": {"_nope": {"num_warps": 4}}}), "does not have: _nope")):
        report.write_text(text)
        with pytest.raises(SystemExit):
            bench.parse_args(["--device", "cpu", "--quick", "--launch", str(report)])
        assert expected in capsys.readouterr().err


def test_bench_attention_gpu_unspecialised_lengths_variant(import_benchmark):
    """The `unspecialised_lengths` variant: every launched kernel of the module, compiled anew with exactly its length
    arguments marked do_not_specialize (its other integers, the head sizes and strides, still specialised), built
    once for the run."""
    pytest.importorskip("triton")
    bench = import_benchmark("bench_attention_gpu")
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    twins = bench.method_options("scaleformer:unspecialised_lengths")
    assert twins is bench.unspecialised_kernels() and set(twins) == set(bench.LAUNCHED_KERNELS)
    for name, twin in twins.items():
        original = getattr(kernels, name)
        assert twin.fn is original.fn
        unspecialised = {p.name for p in twin.params if p.do_not_specialize}
        assert unspecialised == set(kernels.LENGTH_ARGUMENTS) & set(original.arg_names), name
        assert not any(p.do_not_specialize for p in original.params), name
    assert {"lq", "lk", "nq", "n_states"} <= {p.name for p in twins["_forward"].params if p.do_not_specialize}
    assert "heads" not in {p.name for p in twins["_forward"].params if p.do_not_specialize}
