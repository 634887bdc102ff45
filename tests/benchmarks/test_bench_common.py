"""The shared modules of the benchmarks (`common.py`, `models.py`) and the rule that keeps them shared: a script
(a bench_* script or a tool such as kernel_work.py) imports them, never another script, nor anything of examples/ or
model_cards/; the shared modules and the data modules import no benchmark module."""

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SHARED = {"common", "models"}
DATA_MODULES = {"bench_listops": {"listops"}}  # benchmarks/listops.py: the ListOps generator, a data module


def top_level_imports(path: Path) -> set[str]:
    """The first component of every module a file imports (relative imports included, as "")."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("" if node.level else node.module.partition(".")[0])
    return names


# optional packages a script imports inside `try`, for a baseline that exists only on a GPU machine
OPTIONAL = {"fla"}  # flash-linear-attention, in bench_attention_gpu.py


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_import_only_the_shared_modules(path):
    local = {p.stem for p in BENCHMARKS.glob("*.py")}
    imported = top_level_imports(path)
    assert "sys.path" not in path.read_text(), f"{path.name} changes sys.path"
    assert "" not in imported, f"{path.name} has a relative import"
    data_modules = set().union(*DATA_MODULES.values())
    if path.stem in SHARED | data_modules:  # the shared modules and the data modules import no benchmark module
        assert not imported & local, f"{path.name} imports {sorted(imported & local)}"
    else:  # a script: the bench_* scripts and the kernels' tools
        allowed = SHARED | DATA_MODULES.get(path.stem, set())
        assert imported & local <= allowed, f"{path.name} imports {sorted(imported & local - allowed)}"
    for name in sorted(imported - local - {"__future__"} - OPTIONAL):
        spec = importlib.util.find_spec(name)
        assert spec is not None, f"{path.name} imports {name}, which is not installed (a module of examples/?)"
        origin = Path(spec.origin).resolve() if spec.origin else None
        for folder in ("examples", "model_cards"):
            assert origin is None or not origin.is_relative_to(ROOT / folder), f"{path.name} imports {origin}"


def test_save_runs_merges_what_other_processes_wrote(tmp_path, import_benchmark):
    """Two processes filling one JSON: each save keeps the other's runs, and a run made here replaces the file's."""
    save_runs = import_benchmark("common").save_runs

    path = tmp_path / "runs.json"
    settings = {"size": 1}
    key = lambda run: (run["model"], run["seed"])  # noqa: E731
    first = {("a", 0): {"model": "a", "seed": 0, "value": 1}}
    save_runs(path, {"benchmark": "bench_x", "settings": settings}, first, {("a", 0)}, key, settings, "bench_x")
    # a second process started before "a" existed, made "b", and re-made "a" with --overwrite
    second = {("b", 0): {"model": "b", "seed": 0, "value": 2}, ("a", 0): {"model": "a", "seed": 0, "value": 3}}
    report = {"benchmark": "bench_x", "settings": settings}
    save_runs(path, report, second, {("b", 0), ("a", 0)}, key, settings, "bench_x")
    on_disk = {key(r): r["value"] for r in json.loads(path.read_text())["runs"]}
    assert on_disk == {("a", 0): 3, ("b", 0): 2}
    # the first process saves again without having re-made "a": it takes the file's newer "a"
    save_runs(path, {"benchmark": "bench_x", "settings": settings}, first, set(), key, settings, "bench_x")
    assert first[("a", 0)]["value"] == 3 and ("b", 0) in first
    assert {key(r): r["value"] for r in json.loads(path.read_text())["runs"]} == {("a", 0): 3, ("b", 0): 2}


def test_timed_until_issued_and_until_finished(import_benchmark):
    """`timed(work, finish=)`: the wall time covers `finish` (the device's wait), `issued_s` only `work`; without
    `finish` there is no issued time, and the medians skip the samples without the field."""
    import time

    common = import_benchmark("common")
    sample = common.timed(lambda: time.sleep(0.01), finish=lambda: time.sleep(0.05))
    assert 0.01 <= sample.issued_s < 0.05 <= sample.wall_s
    plain = common.timed(lambda: None)
    assert plain.issued_s is None
    assert common.median_of([plain, sample], "issued_s") == sample.issued_s
    assert common.median_of([plain], "issued_s") is None and common.median_of([], "wall_s") is None


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="needs Linux /proc")
def test_memory_launcher_volunteers_for_the_oom_killer_and_passes_on_its_exit(import_benchmark):
    launcher = import_benchmark("common").MEMORY_LAUNCHER

    def launch(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", launcher, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60)

    # the measuring process inherits the launcher's score: first in line, before the benchmark beside it
    assert launch('print(open("/proc/self/oom_score_adj").read())').stdout.strip() == "1000"
    assert launch("import os, signal; os.kill(os.getpid(), signal.SIGKILL)").returncode == -9
    assert launch("raise SystemExit(3)").returncode == 3


def test_bench_quality_model_names(import_benchmark):
    models = import_benchmark("models")
    ModelSpec, parse_model_name = models.ModelSpec, models.parse_model_name

    assert parse_model_name("scaleformer") == ModelSpec("scaleformer", None, False, None, "pre")
    assert parse_model_name("scaleformer+cross_rpe+sinusoidal") == ModelSpec("scaleformer", None, True, "sinusoidal")
    assert parse_model_name("scaleformer:softmax+sinusoidal+post_ln") == ModelSpec(
        "scaleformer", "softmax", False, "sinusoidal", "post")
    assert parse_model_name("scaleformer+post_ln").layer_norm_position == "post"
    assert parse_model_name("t5") == ModelSpec("t5", None)
    assert parse_model_name("scaleformer:kernelized_decay+cross_rpe+fast_decay+post_ln") == ModelSpec(
        "scaleformer", "kernelized_decay", True, None, "post", models.FAST_DECAY_RATE_RANGE)
    assert parse_model_name("scaleformer:kernelized_decay_gated+cross_rpe").cross_attention_rpe
    assert parse_model_name("scaleformer:kernelized_decay_gated+cross_rpe+slow_decay+relu+joint+post_ln") == ModelSpec(
        "scaleformer", "kernelized_decay_gated", True, None, "post", models.SLOW_DECAY_RATE_RANGE, "relu", "joint")
    assert parse_model_name("scaleformer:kernelized_decay+relu").feature_map == "relu"
    assert parse_model_name("scaleformer:kernelized_decay_gated+cross_rpe+count").decoder_attention == "count"
    assert parse_model_name("scaleformer+cross_rpe+count+post_ln") == ModelSpec(
        "scaleformer", None, True, None, "post", None, "elu", "count")
    assert parse_model_name("scaleformer:kernelized_decay+count").decoder_attention == "count"
    assert parse_model_name("scaleformer:local_softmax_decay+cross_rpe+count_block+post_ln") == ModelSpec(
        "scaleformer", "local_softmax_decay", True, None, "post", None, "elu", "count_block")
    assert parse_model_name("scaleformer+cross_rpe+count_block16+post_ln") == ModelSpec(
        "scaleformer", None, True, None, "post", None, "elu", "count_block", 16)
    assert parse_model_name("scaleformer+cross_rpe+count_block64+count_embeddings+post_ln") == ModelSpec(
        "scaleformer", None, True, None, "post", None, "elu", "count_block", 64, True)
    zero_init = parse_model_name("scaleformer+cross_rpe+count_block64+zero_init+post_ln")
    assert zero_init == ModelSpec("scaleformer", None, True, None, "post", None, "elu", "count_block", 64, False, True)
    narrow = parse_model_name("scaleformer+cross_rpe+count_block64x2+zero_init+post_ln")
    assert narrow == ModelSpec("scaleformer", None, True, None, "post", None, "elu", "count_block", 64, False, True, 2)
    assert parse_model_name("scaleformer+cross_rpe+count_block64+post_ln").count_block_head_dim is None
    assert parse_model_name("scaleformer+cross_rpe+count_block64x2+zero_init+detach+post_ln").count_block_detach
    assert not narrow.count_block_detach
    table = parse_model_name("scaleformer+cross_rpe+count_block64+count_embeddings16+post_ln")
    assert table == ModelSpec("scaleformer", None, True, None, "post", None, "elu", "count_block", 64, True,
                              count_block_embedding_dim=16)
    full_table = parse_model_name("scaleformer+cross_rpe+count_block64+count_embeddings+post_ln")
    assert full_table.count_block_embedding_dim is None
    scaled = parse_model_name("scaleformer+cross_rpe+count_block64x2+count_embeddings32+layer_scale0.1+post_ln")
    assert (scaled.count_block_layer_scale, scaled.count_block_embedding_dim) == (0.1, 32)
    assert parse_model_name("scaleformer+count_block+layer_scale.3").count_block_layer_scale == 0.3
    assert parse_model_name("scaleformer+count_block+layer_scale2").count_block_layer_scale == 2.0
    assert table.count_block_layer_scale is None
    counted = parse_model_name(
        "scaleformer+cross_rpe+count_block64x2+count_embeddings32+layer_scale0.1+remaining3+post_ln"
    )
    assert (counted.remaining_count_max, counted.count_block_layer_scale) == (3, 0.1)
    assert parse_model_name("scaleformer+remaining1+sinusoidal").remaining_count_max == 1
    assert table.remaining_count_max is None
    for bad in ("scaleformer+sinusoidal+cross_rpe", "scaleformer:softmax+cross_rpe", "bart+sinusoidal",
                "scaleformer+fast_decay", "scaleformer:kernelized_decay+fast_decay+cross_rpe",
                "scaleformer:kernelized_decay+fast_decay+slow_decay", "scaleformer+relu",
                "scaleformer:kernelized_decay+cross_rpe+joint", "scaleformer:kernelized_decay_gated+joint",
                "scaleformer:kernelized_decay_gated+cross_rpe+joint+relu",
                "scaleformer:kernelized_decay_gated+cross_rpe+joint+count", "scaleformer:kernelized_decay_gated+count",
                "scaleformer+count+count_block", "scaleformer+count_block+count_block16", "scaleformer+count_block0",
                "scaleformer+count_block08", "scaleformer+count_block64x0", "scaleformer+count_block64x",
                "scaleformer+count_blockx2", "scaleformer+count16", "scaleformer+count_embeddings",
                "scaleformer+count_block+count_embeddings0", "scaleformer+count_embeddings16",
                "scaleformer+count+count_embeddings", "scaleformer+count_embeddings+count_block",
                "scaleformer+count+zero_init", "scaleformer+count+detach",
                "scaleformer+count_block+count_embeddings+detach",
                "scaleformer+count_block+detach+zero_init", "scaleformer+count_block+zero_init+count_embeddings",
                "scaleformer+layer_scale0.1", "scaleformer+count+layer_scale0.1", "scaleformer+count_block+layer_scale",
                "scaleformer+count_block+layer_scale0", "scaleformer+count_block+layer_scale0.0",
                "scaleformer+count_block+layer_scale-1", "scaleformer+count_block+layer_scale1e-1",
                "scaleformer+count_block+layer_scale0.1+detach", "scaleformer+remaining", "scaleformer+remaining0",
                "scaleformer+remaining-1", "scaleformer+remaining1.5", "scaleformer+remaining2+count_block",
                "scaleformer+post_ln+remaining2",
                "scaleformer:kernelized_decay_gated+count_block",
                "scaleformer:nope", "scaleformer+cross_rpe+cross_rpe", "scaleformer+post_ln+sinusoidal",
                "scaleformer+", "t5+post_ln"):
        with pytest.raises(ValueError, match="unknown model"):
            parse_model_name(bad)


@pytest.mark.parametrize("script", ["bench_generate.py", "bench_train.py"])
def test_unknown_model(run_main, script):
    result = run_main([f"benchmarks/{script}", "--quick", "--models", "scaleformer", "scaleformer:nope",
                       "--threads", "1"])
    assert result.returncode == 2
    assert "--models" in result.stderr and "'scaleformer:nope'" in result.stderr
    assert "scaleformer:softmax" in result.stderr and "t5" in result.stderr


def test_kernel_options_hold_within_their_block(import_benchmark):
    """`common.kernel_options` sets the kernels' module options inside its block and restores them after it, an
    error included; `parse_kernel_options` gives the values of their own type."""
    pytest.importorskip("triton")
    common = import_benchmark("common")
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    before = kernels.SCAN_PRODUCTS, kernels.TAIL_TILES
    options = common.parse_kernel_options([f"SCAN_PRODUCTS={not before[0]}", "TAIL_TILES=()"])
    assert options == {"SCAN_PRODUCTS": not before[0], "TAIL_TILES": ()}
    with pytest.raises(RuntimeError, match="inside"):
        with common.kernel_options(options):
            assert (kernels.SCAN_PRODUCTS, kernels.TAIL_TILES) == (not before[0], ())
            raise RuntimeError("inside")
    assert (kernels.SCAN_PRODUCTS, kernels.TAIL_TILES) == before
    assert common.parse_kernel_options([]) == {}


def test_kernel_options_without_the_kernels_module(import_benchmark, monkeypatch):
    """Where `ops_local_softmax_triton` cannot be imported (no Triton), `parse_kernel_options` raises the ValueError
    that the scripts report as a usage error, naming the option; without options it imports nothing."""
    import modeling_scaleformer

    common = import_benchmark("common")
    monkeypatch.setitem(sys.modules, "modeling_scaleformer.ops_local_softmax_triton", None)  # its import then fails
    monkeypatch.delattr(modeling_scaleformer, "ops_local_softmax_triton", raising=False)  # even once imported
    with pytest.raises(ValueError, match=r"^--kernel-options: .*ops_local_softmax_triton"):
        common.parse_kernel_options(["SCAN_PRODUCTS=True"])
    assert common.parse_kernel_options([]) == {}
