"""bench_attention.py: `--quick`, narrowed further, verifies every variant against its reference and times them.

Timings are not checked here (they need an idle machine); the script's own correctness check is: a fast path
that disagrees with its reference makes it exit with status 1.
"""


def test_bench_attention_quick(run_report):
    stdout, report = run_report(
        ["benchmarks/bench_attention.py", "--quick", "--lengths", "128", "256", "--no-memory", "--max-length", "256"]
    )
    assert report["verification"]["passed"]
    variants = {c["mode"].split()[0] for c in report["verification"]["checks"]}
    assert {"kernelized", "fourier", "toeplitz", "shaw_softmax", "xl_relative"} <= variants
    timed = {(t["method"], t["length"]) for t in report["timings"]}
    assert ("toeplitz", 256) in timed and ("sdpa", 128) in timed
    assert "## Variants, fwd+bwd" in stdout and "Summary: verification PASS" in stdout
