"""bench_train.py: a training step and a forward pass of every Scaleformer attention_type, BART and T5.

Smoke runs, narrowed so that each takes seconds; timings are not checked. What is checked: every model of
`--models` has figures in the JSON and a column in the stdout table, `--max-quadratic-length` skips the quadratic
models, and the memory subprocess builds every kind of model.
"""

import json

import pytest
import torch


MODELS = ["scaleformer", "scaleformer:softmax", "bart", "t5"]


@pytest.mark.parametrize("extra", [["--no-memory"]], ids=["no-memory"])
def test_bench_train_quick(run_report, extra):
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "128", "--repeats", "1",
                                 *extra])
    assert report


def test_bench_train_bf16_on_a_device(run_report):
    """`--device` and `--bf16`: the same steps under bfloat16 autocast, recorded in the settings (on CPU here;
    on CUDA the device's peak memory is read around a step)."""
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--repeats", "1",
                                 "--no-memory", "--models", "scaleformer", "bart", "--device", "cpu", "--bf16"])
    assert report["settings"]["device"] == "cpu" and report["settings"]["bf16"] is True
    assert {t["model"] for t in report["timings"] if t["median_s"] > 0} == {"scaleformer", "bart"}
    assert "fp32 under bf16 autocast" in stdout and report["cuda_peak_extra_mib"] == []


@pytest.mark.slow  # options beyond the quick run: `pytest -m slow`
def test_bench_train_profile(run_report):
    """`--profile L`: one profiled training step per model after the timings, its table printed and recorded."""
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--repeats", "1",
                                 "--no-memory", "--models", "scaleformer", "bart", "--profile", "64"])
    assert set(report["profiles"]) == {"scaleformer", "bart"}
    assert all("Self CPU" in p["table"] and p["length"] == 64 for p in report["profiles"].values())
    assert "## Profile: scaleformer, one training step at source length 64" in stdout


@pytest.mark.slow  # options beyond the quick run
def test_bench_train_steps_only(run_report):
    """`--steps-only`: training steps timed, no forward pass (no forward table, slopes or figures in the JSON)."""
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "128", "--repeats", "1",
                                 "--no-memory", "--models", "scaleformer", "bart", "--steps-only"])
    assert report["settings"]["steps_only"] is True
    assert {t["model"] for t in report["timings"] if t["median_s"] > 0} == {"scaleformer", "bart"}
    assert report["forward_timings"] == [] and {s["pass"] for s in report["slopes"]} == {"step"}
    assert "## One forward pass" not in stdout and "Forward passes were not timed (--steps-only)." in stdout
    assert "1 timed step(s) per model and length" in stdout
    # the time until each step returned, before the device finished it (on CPU, nearly its wall time)
    assert all(0 < issued <= wall for t in report["timings"] for issued, wall in zip(t["issued_s"], t["wall_s"]))
    assert "| wall s | issued s | user CPU s |" in stdout
    # each timed step's loss, read after the clocks: near log(vocabulary) at random init, one per step
    for timing in report["timings"]:
        assert len(timing["loss"]) == len(timing["wall_s"]) and all(5 < x < 12 for x in timing["loss"]), timing
        assert f"| {', '.join(f'{x:.4f}' for x in timing['loss'])} |" in stdout


@pytest.mark.slow
def test_bench_train_compile(run_report, monkeypatch):
    """`--compile [MODE]`: the steps of a model under torch.compile, said in the header and recorded in the settings.
    Dynamo is switched off here (compiling on CPU takes a minute; test_conformance.py compiles a model and checks
    it against eager), so this checks the option's path through the script."""
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--repeats", "1",
                                 "--no-memory", "--models", "scaleformer", "--compile"])
    assert report["settings"]["compile"] == "default"
    assert [t["model"] for t in report["timings"] if t["median_s"] > 0] == ["scaleformer"]
    assert "fp32, torch.compile," in stdout
    assert "target 128; 2 warm-up + 1 timed step(s)" in stdout  # one compiles, one records CUDA graphs
    assert [len(t["wall_s"]) for t in report["timings"] if t["model"] == "scaleformer"] == [1]
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--repeats", "1",
                                 "--no-memory", "--models", "scaleformer", "--compile", "reduce-overhead"])
    assert report["settings"]["compile"] == "reduce-overhead"
    assert "fp32, torch.compile (mode reduce-overhead)," in stdout
    # a baseline left eager beside the compiled models
    stdout, report = run_report(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--repeats", "1",
                                 "--no-memory", "--models", "scaleformer", "bart", "--compile", "reduce-overhead",
                                 "--eager", "bart", "--steps-only"])
    assert report["settings"]["eager"] == ["bart"]
    assert "fp32, torch.compile (mode reduce-overhead) (bart eager)," in stdout
    assert {t["model"] for t in report["timings"] if t["median_s"] > 0} == {"scaleformer", "bart"}


@pytest.mark.parametrize("flags, message", [
    (["--eager", "bart"], "--eager names models to leave out of --compile"),
    (["--compile", "--eager", "led"], "--eager takes models of --models (scaleformer, bart), got led"),
])
def test_bench_train_eager_errors(flags, message, capsys, import_benchmark):
    with pytest.raises(SystemExit):
        import_benchmark("bench_train").parse_args(["--models", "scaleformer", "bart", *flags])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    ("FOO=1", "--kernel-options takes NAME=VALUE with NAME an option of ops_local_softmax_triton"),
    ("SCAN_PRODUCTS", "--kernel-options takes NAME=VALUE"),
    ("SCAN_PRODUCTS=yes", "the value of SCAN_PRODUCTS must be a Python literal, got 'yes'"),
    ("SCAN_PRODUCTS=1", "SCAN_PRODUCTS takes a bool (default False), got 1"),
])
def test_bench_train_kernel_options_errors(option, message, capsys, import_benchmark):
    pytest.importorskip("triton")
    with pytest.raises(SystemExit):
        import_benchmark("bench_train").parse_args(["--kernel-options", option])
    assert message in capsys.readouterr().err


def test_bench_train_kernel_options(tmp_path, monkeypatch, import_benchmark, capsys):
    """--kernel-options sets the kernels' module options for the run (and restores them after it), and the header
    and the JSON say so."""
    pytest.importorskip("triton")
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    monkeypatch.setattr(kernels, "SCAN_PRODUCTS", False)
    monkeypatch.setattr(kernels, "PRODUCT_SLOTS", 32)
    bench_train = import_benchmark("bench_train")
    during = []
    run_benchmark = bench_train.run_benchmark
    monkeypatch.setattr(bench_train, "run_benchmark", lambda args: during.append(
        (kernels.SCAN_PRODUCTS, kernels.PRODUCT_SLOTS)) or run_benchmark(args))
    path = tmp_path / "report.json"
    assert bench_train.main([
        "--quick", "--lengths", "32", "--repeats", "1", "--no-memory", "--models", "scaleformer", "--steps-only",
        "--threads", "1", "--kernel-options", "SCAN_PRODUCTS=True", "PRODUCT_SLOTS=16", "--json", str(path)]) == 0
    assert during == [(True, 16)] and (kernels.SCAN_PRODUCTS, kernels.PRODUCT_SLOTS) == (False, 32)
    assert "options of the default attention's Triton kernels: SCAN_PRODUCTS = True, PRODUCT_SLOTS = 16" in (
        capsys.readouterr().out)
    settings = json.loads(path.read_text())["settings"]
    assert settings["kernel_options"] == {"SCAN_PRODUCTS": "True", "PRODUCT_SLOTS": "16"}


def test_bench_train_kernel_options_reach_the_memory_subprocess(import_benchmark, monkeypatch):
    """The memory subprocess takes the run's --kernel-options, each value as a literal that parses back to it."""
    pytest.importorskip("triton")
    bench_train = import_benchmark("bench_train")
    args = bench_train.parse_args(["--models", "scaleformer", "--kernel-options", "SCAN_PRODUCTS=True",
                                   "TAIL_TILES=('_forward', '_backward_queries')"])
    seen = []
    monkeypatch.setattr(bench_train, "measure_in_fresh_process", lambda script, arguments, label: seen.append(
        arguments) or {})
    bench_train.measure_memory("scaleformer", 64, args)
    (arguments,) = seen
    options = arguments[arguments.index("--kernel-options") + 1:]
    assert bench_train.parse_args(["--kernel-options", *options]).kernel_options == {
        "SCAN_PRODUCTS": True, "TAIL_TILES": ("_forward", "_backward_queries")}


@pytest.mark.slow  # every model beside the quick run's two
def test_bench_train_models(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "64", "--repeats", "1", "--no-memory",
         "--models", *MODELS, "--threads", "1"]
    )
    assert report["settings"]["models"] == MODELS
    for key in ("timings", "forward_timings"):
        timed = {(t["model"], t["length"]) for t in report[key] if t["median_s"] > 0}
        assert timed == {(name, length) for name in MODELS for length in (32, 64)}
    assert {(r["model"], r["pass"], r["time"]) for r in report["slopes"] if r["slope"] is not None} == {
        (name, kind, time) for name in MODELS for kind in ("step", "forward") for time in ("wall_s", "user_s")}
    assert "## One forward pass" in stdout and "| 64 | t5 | forward |" in stdout
    header = next(line for line in stdout.splitlines() if line.startswith("| source L | scaleformer s"))
    for name in MODELS:
        assert f"| {name} s |" in header and f"| {name} peak extra MiB |" in header
    for name in MODELS[1:]:
        assert f"| {name} / scaleformer |" in header
        assert f"| {name} | step | wall |" in stdout and f"| {name} | forward | wall |" in stdout
    assert "- t5: " in stdout and "quadratic in length" in stdout
    # (a) is fitted over the lengths measured; (b) needs the memory figure that --no-memory leaves out
    assert report["targets"][0]["status"] in ("PASS", "FAIL") and report["targets"][1]["status"] == "N/A"


@pytest.mark.slow
def test_bench_train_max_quadratic_length(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "64", "--repeats", "1", "--no-memory",
         "--max-quadratic-length", "32", "--models", "scaleformer", "scaleformer:softmax", "bart", "t5",
         "--threads", "1"]
    )
    timed = {(t["model"], t["length"]) for t in report["forward_timings"]}
    assert timed == {("scaleformer", 32), ("scaleformer", 64), ("scaleformer:softmax", 32), ("bart", 32), ("t5", 32)}
    skipped = {(s["model"], s["length"]): s["reason"] for s in report["skipped"]}
    assert set(skipped) == {("scaleformer:softmax", 64), ("bart", 64), ("t5", 64)}
    assert all("--max-quadratic-length 32" in reason for reason in skipped.values())
    assert report["settings"]["bart_max_position_embeddings"] == 128  # the table fits the target, not L=64


@pytest.mark.slow
def test_bench_train_targets_without_scaleformer(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "--repeats", "1", "--no-memory",
         "--models", "scaleformer:kernelized", "t5", "--threads", "1"]
    )
    assert [t["status"] for t in report["targets"]] == ["N/A", "N/A"]
    assert "| t5 / scaleformer:kernelized |" in stdout


def test_bench_train_device_speedup_target(import_benchmark):
    """On a device, target (c): Scaleformer's step at 16k at least 3x faster than BART's, each as it ran; N/A
    without both figures; not listed on CPU."""
    import argparse

    import torch

    bench = import_benchmark("bench_train")
    common = import_benchmark("common")
    args = argparse.Namespace(device=torch.device("cuda"), compile="reduce-overhead", eager=["bart"],
                              lengths=[16384], models=["scaleformer", "bart"])

    def samples(ours, bart):
        return {(name, 16384): [common.Sample(wall_s=t, user_s=t, sys_s=0.0, minor_faults=0)]
                for name, t in (("scaleformer", ours), ("bart", bart)) if t is not None}

    target = bench.device_speedup_target(samples(0.024, 0.074), args)
    assert target.name == "(c) scaleformer step at L=16384 at least 3x faster than bart's on cuda"
    assert (target.status, target.figure) == ("PASS", "3.08x (scaleformer 0.024 s compiled, bart 0.074 s eager)")
    assert bench.device_speedup_target(samples(0.030, 0.074), args).status == "FAIL"
    assert bench.device_speedup_target(samples(0.024, None), args).status == "N/A"
    slopes = [{"model": "scaleformer", "pass": "step", "time": "wall_s", "slope": None, "range": None}]
    targets = bench.evaluate_targets(samples(0.024, 0.074), slopes, {}, {}, argparse.Namespace(
        **{**vars(args), "device": torch.device("cpu")}))
    assert [t.name[:3] for t in targets] == ["(a)", "(b)"]


@pytest.mark.parametrize("model", ["scaleformer:softmax", *(pytest.param(name, marks=pytest.mark.slow)
                                                            for name in ("t5", "led", "longt5"))])
def test_bench_train_measure_memory(run_command, model):
    result = run_command(["benchmarks/bench_train.py", "--quick", "--lengths", "64", "--measure-memory", model, "64",
                          "--threads", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["extra_bytes"] > 0 and record["step_s"] > 0


LONG_BASELINES = ["scaleformer", "led", "longt5"]


@pytest.mark.slow
def test_bench_train_long_baselines(run_report):
    """LED and LongT5 (opt-in) get a row of figures; --max-quadratic-length leaves them (local attention) running."""
    stdout, report = run_report(
        ["benchmarks/bench_train.py", "--quick", "--lengths", "32", "64", "--repeats", "1", "--no-memory",
         "--max-quadratic-length", "32", "--models", *LONG_BASELINES, "--threads", "1"]
    )
    assert report["settings"]["models"] == LONG_BASELINES
    for key in ("timings", "forward_timings"):
        timed = {(t["model"], t["length"]) for t in report[key] if t["median_s"] > 0}
        assert timed == {(name, length) for name in LONG_BASELINES for length in (32, 64)}
    assert report["skipped"] == []
    header = next(line for line in stdout.splitlines() if line.startswith("| source L | scaleformer s"))
    for name in LONG_BASELINES[1:]:
        assert f"| {name} s |" in header and f"| {name} / scaleformer |" in header
        assert f"| 64 | {name} | step |" in stdout and f"| 64 | {name} | forward |" in stdout
    assert "- led: " in stdout and "encoder attention window 512 per layer" in stdout
    assert "max_encoder_position_embeddings 512" in stdout  # L=64 padded to one window
    assert "- longt5: " in stdout and "encoder_attention_type transient-global, local_radius 127" in stdout
    assert "global_block_size 16" in stdout


def test_bench_train_steps_the_optimizer_trainer_builds(import_benchmark):
    """The timed step updates the weights with the optimizer `transformers.Trainer` builds by default: AdamW with
    fused=True (one fused update of every parameter) at the benchmark's learning rate, Trainer's betas and eps."""
    bench_train = import_benchmark("bench_train")
    model = torch.nn.Linear(3, 2)
    optimizer = bench_train.build_optimizer(model)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["fused"] is True
    assert (optimizer.defaults["lr"], optimizer.defaults["betas"], optimizer.defaults["eps"]) == (
        bench_train.LEARNING_RATE, (0.9, 0.999), 1e-8)
    model(torch.ones(1, 3)).sum().backward()
    before = model.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(model.weight, before)
