"""Fixtures of the benchmark tests: run a script's command line, in a process of its own or in this one, or import a
module of `benchmarks/` as the scripts import each other's shared modules (the folder is not a package)."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


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
def run_main(import_benchmark, capsys):
    """`run(args)`: the command line `python benchmarks/NAME.py ARGS` (args[0] names the script) as `main(ARGS)` in
    this process, for runs that stop early (an argument refused, a report whose runs its JSON holds already), which a
    process of their own would spend importing torch and transformers; returns a CompletedProcess with the exit
    status and the text written. The environment and torch's thread count are restored after it."""

    def run(args: list[str]) -> subprocess.CompletedProcess:
        environ, threads = dict(os.environ), torch.get_num_threads()
        capsys.readouterr()
        try:
            status = import_benchmark(Path(args[0]).stem).main(args[1:])
        except SystemExit as exit:
            status = exit.code
            if isinstance(status, str):  # sys.exit(message): the message on stderr, status 1
                print(status, file=sys.stderr)
                status = 1
        finally:
            os.environ.clear()
            os.environ.update(environ)
            torch.set_num_threads(threads)
        written = capsys.readouterr()
        return subprocess.CompletedProcess(args, status or 0, written.out, written.err)

    return run


@pytest.fixture
def run_report(run_command, run_main, tmp_path):
    """`run(args, in_process=False)`: a benchmark's command line with `--json` and `--plot` in `tmp_path`, in a process
    of its own (`run_command`) or in this one (`run_main`); asserts that it exits with status 0 and draws a plot, and
    returns (stdout, the JSON report)."""

    def run(args: list[str], in_process: bool = False) -> tuple[str, dict]:
        report, plot = tmp_path / "report.json", tmp_path / "plot.png"
        result = (run_main if in_process else run_command)([*args, "--json", str(report), "--plot", str(plot)])
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
