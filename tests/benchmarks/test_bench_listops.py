"""bench_listops.py: `--quick` trains two classifiers on ListOps and reports them; a second call reuses the JSON.

The generator itself (`benchmarks/listops.py`) is tested in test_listops.py.
"""


def test_bench_listops_quick(run_report):
    stdout, report = run_report(["benchmarks/bench_listops.py", "--quick"])
    runs = {(r["attention_type"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("kernelized_rpe", 0), ("softmax", 0)}
    for run in runs.values():
        assert run["steps"] >= 1 and run["curve"] and 0.0 <= run["test_accuracy"] <= 1.0
    majority = report["majority_baseline"]
    assert 0 <= majority["label"] < 10 and 0.0 <= majority["test_accuracy"] <= 1.0
    assert "| majority class (label" in stdout and "Summary: 2 run(s) trained now" in stdout

    # a second call with the same --json skips the runs it holds and reports them unchanged
    stdout, again = run_report(["benchmarks/bench_listops.py", "--quick"], in_process=True)
    assert again["runs"] == report["runs"]
    assert "Summary: 0 run(s) trained now, 2 reported" in stdout
