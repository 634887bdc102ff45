"""Fixtures of the benchmark tests: run a script's command line, or import a module of `benchmarks/` as the scripts
import each other's shared modules (the folder is not a package)."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def run_command():
    """`run(args, timeout=600)`: `python ARGS` from the repository root, with the package on PYTHONPATH and the Hub
    offline; returns the CompletedProcess (text output captured)."""

    def run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)

    return run


@pytest.fixture
def run_report(run_command, tmp_path):
    """`run(args)`: a benchmark's command line with `--json` and `--plot` in `tmp_path`; asserts that it exits with
    status 0 and draws a plot, and returns (stdout, the JSON report)."""

    def run(args: list[str]) -> tuple[str, dict]:
        report, plot = tmp_path / "report.json", tmp_path / "plot.png"
        result = run_command([*args, "--json", str(report), "--plot", str(plot)])
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        assert plot.stat().st_size > 1000
        return result.stdout, json.loads(report.read_text())

    return run


@pytest.fixture
def import_benchmark(monkeypatch):
    """`import_benchmark(name)`: the module `benchmarks/NAME.py`, imported with `benchmarks/` on sys.path."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module


@pytest.fixture
def listops(import_benchmark):
    """`benchmarks/listops.py`, the ListOps generator that bench_listops.py imports."""
    return import_benchmark("listops")
