"""What the benchmark scripts share: the machine a report was made on, timing with CPU counters, peak memory in a
fresh process, growth slopes, targets, the runs of a `--json` file, the options and the choice of the default
attention's kernels, a training step and plots.

Every `bench_*.py` script imports this module and `models.py` (the models it compares), and the kernels' tools
(`kernel_*.py`) this one, never another script; nothing here measures anything by itself.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import fcntl
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch


MIB = 2**20
GIB = 2**30
GRAD_CLIP = 1.0  # gradient norm of every training benchmark
WEIGHT_DECAY = 0.01  # AdamW's, in bench_quality and bench_extrapolation


# ---------------------------------------------------------------------------------------------- the machine


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(threads: int) -> dict:
    return {
        "command": shlex.join(sys.orig_argv),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }


def start_report(threads: int) -> dict:
    """Set torch's intra-op threads; the machine facts of the report (`machine_info`)."""
    torch.set_num_threads(threads)
    return machine_info(torch.get_num_threads())


def print_machine(info: dict, threads: str = "torch threads") -> None:
    """The command, date, versions, threads, CPU and load average lines of a report header; `threads` follows the
    thread count on its line."""
    print(f"- command: `{info['command']}`")
    print(f"- date: {info['date']}")
    print(f"- torch {info['torch']}, python {info['python']}, {info['threads']} {threads}")
    print(f"- CPU: {info['cpu_model']} ({info['cpu_count']} logical CPUs), load average "
          + " / ".join(f"{x:.2f}" for x in info["load_average_at_start"]) + " (1 / 5 / 15 min)")


def load_summary(info: dict) -> str:
    """The end of a summary line; `info` holds `load_average_at_end`."""
    return (f"1-min load average {info['load_average_at_start'][0]:.2f} at start, "
            f"{info['load_average_at_end'][0]:.2f} at end")


# ------------------------------------------------------------------------------------ timing and memory


class Sample(NamedTuple):
    wall_s: float
    user_s: float
    sys_s: float
    minor_faults: int
    issued_s: float | None = None  # with `timed(..., finish=)`: until `work` returned, before `finish`


def timed(work: Callable[[], object], finish: Callable[[], object] | None = None) -> Sample:
    """Run `work()`, then `finish()` if given (waiting for a device), and return the wall time of both, user and
    system CPU time and minor page faults, and with `finish` the wall time until `work` returned (the host's time to
    issue it). What `work` returns is freed after the clocks are read."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    result = work()
    issued = time.perf_counter() - t0
    if finish is not None:
        finish()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    del result
    return Sample(wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt,
                  None if finish is None else issued)


def median_of(runs: list[Sample] | None, field: str = "wall_s") -> float | None:
    """The median of a field over the samples that have it (None where none has)."""
    values = [value for s in runs or () if (value := getattr(s, field)) is not None]
    return statistics.median(values) if values else None


def sample_record(runs: list[Sample]) -> dict:
    """The JSON fields of some samples: their median wall time and every figure of each (but `issued_s` where
    none has it)."""
    fields = {field: [getattr(s, field) for s in runs] for field in Sample._fields}
    return {"median_s": median_of(runs), **{field: values for field, values in fields.items()
                                            if any(value is not None for value in values)}}


def rotated(names: Sequence[str], turn: int) -> list[str]:
    """`names` starting at index `turn` mod len: over len(names) turns each model goes first once."""
    k = turn % len(names) if names else 0
    return [*names[k:], *names[:k]]


def describe_error(error: BaseException) -> str:
    first_line = (str(error).strip().splitlines() or [""])[0][:160]
    return f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__


# ru_maxrss survives execve: a process started straight from this one would begin with this one's
# high-water mark. This launcher, small itself, forks the measuring process so that it starts low. It
# also puts itself and that process first in line for the kernel's out-of-memory killer (the setting is
# inherited), so that a point that does not fit kills the measurement, not the benchmark beside it that
# holds every model, and it dies by the signal that killed the measuring process.
MEMORY_LAUNCHER = """
import os, subprocess, sys
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
code = subprocess.run(sys.argv[1:]).returncode
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def memory_baseline() -> tuple[int, int]:
    """Resident bytes now, and the resolution floor of a peak measured from them: ru_maxrss only rises, so a
    high-water mark already above the baseline hides any smaller peak."""
    baseline = current_rss_bytes()
    return baseline, max(0, peak_rss_bytes() - baseline)


def measure_in_fresh_process(script: str, arguments: list[str], label: str) -> dict:
    """Run `python SCRIPT ARGUMENTS` in a fresh process (forked by MEMORY_LAUNCHER, so that ru_maxrss starts low)
    and return the JSON object of its last line of output, or `{"error": ...}` if it failed or printed nothing.
    The time it took goes to stderr as `[memory] LABEL: N s`."""
    command = [sys.executable, "-c", MEMORY_LAUNCHER, sys.executable, str(Path(script).resolve()), *arguments]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    if proc.returncode < 0:
        result = {"error": f"subprocess killed by signal {-proc.returncode}"
                  + (" (out of memory?)" if proc.returncode == -9 else "")}
    elif proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        result = {"error": f"subprocess exit status {proc.returncode}: {last}"}
    else:
        result = json.loads(lines[-1])
    print(f"[memory] {label}: {elapsed:.1f} s", file=sys.stderr, flush=True)
    return result


# ------------------------------------------------------------------------------------------- growth slopes


def least_squares_slope(points: list[tuple[int, float]]) -> float:
    xs = [math.log2(n) for n, _ in points]
    ys = [math.log2(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def slope_fit(points: list[tuple[int, float]], slope_range: tuple[int, int], *, fit_all_if_few: bool) -> dict:
    """Slope of log2(time) against log2(L) by least squares over the points in `slope_range` (over all points if
    fewer than 2 lie there and `fit_all_if_few`), and between each two consecutive points."""
    lo, hi = slope_range
    in_range = [(n, t) for n, t in points if lo <= n <= hi]
    fit = points if fit_all_if_few and len(in_range) < 2 else in_range
    return {
        "range": [fit[0][0], fit[-1][0]] if len(fit) >= 2 else None,
        "slope": least_squares_slope(fit) if len(fit) >= 2 else None,
        "pairwise": [{"from": a, "to": b, "slope": least_squares_slope([(a, ta), (b, tb)])}
                     for (a, ta), (b, tb) in zip(points, points[1:])],
    }


def print_slopes(rows: list[dict], lengths: list[int], slope_range: tuple[int, int], columns: Sequence[str],
                 labels: Callable[[dict], list[str]]) -> None:
    """The growth table: `columns` name what `labels(row)` gives per row, then the fit and the pairwise slopes."""
    lo, hi = slope_range
    pairs = list(zip(lengths, lengths[1:]))
    print("## Growth: slope of log2(time) against log2(L) (1 = linear, 2 = quadratic)")
    print()
    print(f"| {' | '.join(columns)} | {lo}-{hi} (least squares) | " + " | ".join(f"{a}-{b}" for a, b in pairs) + " |")
    print("|" + ":---|" * len(columns) + "---:|" + "---:|" * len(pairs))
    for r in rows:
        if r["slope"] is None:
            fit = "–"
        else:
            fit = f"{r['slope']:.2f}" + ("" if r["range"] == [lo, hi] else f" ({r['range'][0]}-{r['range'][1]})")
        by_pair = {(p["from"], p["to"]): p["slope"] for p in r["pairwise"]}
        cells = [f"{by_pair[p]:.2f}" if p in by_pair else "–" for p in pairs]
        print(f"| {' | '.join(labels(r))} | {fit} | " + " | ".join(cells) + " |")
    print()


# ------------------------------------------------------------------------------------------------- targets


class Target(NamedTuple):
    name: str
    status: str  # "PASS", "FAIL" or "N/A"
    figure: str


def print_targets(targets: list[Target], none: str | None = None) -> None:
    """The targets section; `none`, if given, is its one line when there is no target."""
    print("## Targets")
    print()
    for t in targets:
        print(f"- {t.status} {t.name}: {t.figure}")
    if none is not None and not targets:
        print(f"- {none}")
    print()


def count_targets(targets: list[Target]) -> str:
    counts = {s: sum(t.status == s for t in targets) for s in ("PASS", "FAIL", "N/A")}
    return f"targets {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['N/A']} N/A"


# ----------------------------------------------------------------------------- runs of a --json file


def parse_device(parser, value: str) -> torch.device:
    """`--device` as a torch.device; a parser error when it names none, or names CUDA where there is none."""
    try:
        device = torch.device(value)
    except RuntimeError as error:
        parser.error(f"--device must name a torch device, got {value!r} ({error})")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    return device


def synchronize(device: torch.device) -> None:
    """Wait until a CUDA `device` has done its queued work, so that a clock read next holds it; nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_peak_extra_mib(call, device: torch.device) -> float:
    """MiB a CUDA `device` allocated at its peak during `call()`, over what it held before."""
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    call()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - held) / 2**20


def profile_call(call, device: torch.device, top: int, warmup: int = 1) -> tuple[str, int | None]:
    """`call()` `warmup` times, then once more under torch.profiler: the table of the `top` kernels by self device
    time (CPU ops by self CPU time on CPU), as torch.profiler prints it, and the number of kernels a CUDA `device`
    ran (None on CPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    for _ in range(warmup):
        call()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        call()
        synchronize(device)
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) if cuda else None
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top), kernels


def write_json(path: Path, report: dict) -> None:
    """Write atomically, so that an interrupted run leaves the previous file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)


def refuse(message: str) -> None:
    """Print an error in argparse's style, naming the running script, and exit with status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def load_previous(path: Path | None, settings: dict, benchmark: str) -> dict | None:
    """The report of `benchmark` at `path`, if any; exit with status 2 if it was made with other settings."""
    if path is None or not path.exists():
        return None
    try:
        previous = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        refuse(f"--json {path} exists but is not JSON ({error}); move it away or choose another path")
    if not isinstance(previous, dict) or previous.get("benchmark") != benchmark:
        refuse(f"--json {path} is not a report of {benchmark}.py; choose another path")
    differ = {k: (previous["settings"].get(k), v) for k, v in settings.items() if previous["settings"].get(k) != v}
    if differ:
        lines = "; ".join(f"{k}: {there!r} there, {here!r} here" for k, (there, here) in differ.items())
        refuse(f"--json {path} holds runs made with other settings ({lines}). Runs of one file share their data, "
               "model size and training settings: choose another path, or delete the file to start again.")
    return previous


def save_runs(path: Path, report: dict, runs: dict, ran_now: set, key, settings: dict, benchmark: str) -> None:
    """Write `report` with `runs` (key -> run) to `path`, first taking in the runs that another process wrote
    there since this one started (runs made here win), under an exclusive lock on `path.lock`: several
    processes, each with its own models or seeds, can fill one file at once. `runs` is updated in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for run in (load_previous(path, settings, benchmark) or {}).get("runs", []):
            if key(run) not in ran_now:
                runs[key(run)] = run
        report["runs"] = list(runs.values())
        write_json(path, report)


RUN_FILE_JSON_HELP = "merge the runs into PATH (runs already there are skipped) and write every raw figure"


def add_run_file_arguments(parser, plot_help: str, overwrite_help: str, json_help: str = RUN_FILE_JSON_HELP) -> None:
    """`--json`, `--plot` and `--overwrite` of a benchmark whose runs gather in a `RunFile`, with their help."""
    parser.add_argument("--json", type=Path, metavar="PATH", help=json_help)
    parser.add_argument("--plot", type=Path, metavar="PATH", help=plot_help)
    parser.add_argument("--overwrite", action="store_true", help=overwrite_help)


class RunFile:
    """The runs of a `--json` file that gathers one run per key (model, seed, ...) across calls and processes.

    Created, it holds the runs already in `args.json` (a file made with other `settings` is refused);
    `run_missing` trains the keys it lacks, merging each finished run into the file at once."""

    def __init__(self, benchmark: str, args, settings: dict, key: Callable[[dict], tuple]):
        self.benchmark, self.settings, self.key = benchmark, settings, key
        self.path, self.overwrite = args.json, args.overwrite
        previous = load_previous(self.path, settings, benchmark)
        self.runs: dict = {key(r): r for r in (previous or {}).get("runs", [])}
        self.ran_now: set = set()  # the keys trained by this process

    def run_missing(self, keys: list[tuple], train: Callable[..., dict], label: Callable[[tuple], str],
                    report: dict) -> None:
        """`train(*k)` for every k of `keys` not held yet (every one with `--overwrite`), each run saved into the
        file with `report` as it finishes; at the end, the runs that parallel processes added are taken in.
        `label(k)` names a run in messages."""
        for k in keys:
            if k in self.runs and not self.overwrite:
                print(f"[{label(k)}] already in {self.path}: skipped (--overwrite runs it again)", file=sys.stderr,
                      flush=True)
                continue
            self.runs[k] = train(*k)
            self.ran_now.add(k)
            self.save(report)
        self.save(report)

    def save(self, report: dict) -> None:
        """`save_runs` into the file, if there is one."""
        if self.path is not None:
            save_runs(self.path, report, self.runs, self.ran_now, self.key, self.settings, self.benchmark)

    def write(self, report: dict) -> None:
        """The last save of the report, said on stdout."""
        if self.path is not None:
            self.save(report)
            print(f"- raw figures written to {self.path}")

    def summary(self) -> str:
        return f"{len(self.ran_now)} run(s) trained now, {len(self.runs)} reported"


# ---------------------------------------------------------------------------- the default attention's kernels


def parse_kernel_options(texts: Sequence[str]) -> dict:
    """`--kernel-options NAME=VALUE ...` as {NAME: value}: each NAME an upper-case module option of
    `ops_local_softmax_triton`, each VALUE a Python literal of the option's type (of any type where the option is
    None). The module is imported here, so a script that runs its kernels interpreted sets TRITON_INTERPRET=1 first.
    Raises ValueError naming the text that is not one, or saying why the module could not be imported (Triton
    missing)."""
    if not texts:
        return {}
    try:
        from modeling_scaleformer import ops_local_softmax_triton as kernels
    except ImportError as error:
        raise ValueError(f"--kernel-options: {error}") from None

    parsed = {}
    for text in texts:
        name, _, literal = text.partition("=")
        if not name.isupper() or not hasattr(kernels, name) or not literal:
            raise ValueError(f"--kernel-options takes NAME=VALUE with NAME an option of ops_local_softmax_triton "
                             f"(upper case, e.g. SCAN_PRODUCTS), got {text!r}")
        try:
            value = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            error = f"--kernel-options: the value of {name} must be a Python literal, got {literal!r}"
            raise ValueError(error) from None
        default = getattr(kernels, name)
        if default is not None and not isinstance(value, type(default)):
            raise ValueError(f"--kernel-options: {name} takes a {type(default).__name__} (default {default!r}), got "
                             f"{value!r}")
        parsed[name] = value
    return parsed


@contextlib.contextmanager
def kernel_options(options: dict):
    """Within the block, the module options of `ops_local_softmax_triton` set to `options` (nothing is imported
    without them)."""
    if not options:
        yield
        return
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    saved = {name: getattr(kernels, name) for name in options}
    for name, value in options.items():
        setattr(kernels, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(kernels, name, value)


def choose_kernels_as_on_cuda() -> None:
    """The default attention's kernels, and its decoding steps', chosen for CPU tensors as on CUDA, for the rest of
    the process: run by Triton's interpreter, which TRITON_INTERPRET=1 must have selected before Triton was first
    imported."""
    from modeling_scaleformer import ops_local_softmax, ops_local_softmax_triton

    choose = ops_local_softmax._attention_function
    ops_local_softmax._attention_function = lambda device, *sizes: choose(torch.device("cuda"), *sizes)
    for name, entry in (("_decode_function", "decode_step"), ("_cross_decode_function", "cross_decode")):
        setattr(ops_local_softmax, name, lambda device, entry=entry: getattr(ops_local_softmax_triton, entry))


# ------------------------------------------------------------------------------------------------ training


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr: float, **inputs) -> float:
    """Set the learning rate, then zero_grad, forward on `inputs` (labels among them), backward, clip the gradient
    norm to GRAD_CLIP and step; returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.item()  # also waits for an accelerator, so that a clock read next is honest


def budget_text(minutes: float, max_steps: int | None) -> str:
    """A training budget in words: `20 min of training`, `16 steps`, or both and `whichever comes first`."""
    budget = [b for b in (f"{minutes:g} min of training" if minutes > 0 else None,
                          f"{max_steps} steps" if max_steps is not None else None) if b]
    return " or ".join(budget) + (", whichever comes first" if len(budget) > 1 else "")


def inverse_sqrt_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up over `warmup_steps`, then decay as the inverse square root of the step."""
    if warmup_steps == 0:
        return lr
    return lr * min((step + 1) / warmup_steps, math.sqrt(warmup_steps / (step + 1)))


# --------------------------------------------------------------------------------------------------- plots


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log2_axis(ax, ticks: Sequence[int]) -> None:
    """A log2 x axis labelled at `ticks`."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(n) for n in ticks])
    ax.minorticks_off()


def save_figure(fig, path: Path, title: str | None = None, **title_options) -> None:
    """Give `fig` its `title` (`suptitle` with `title_options`), lay it out, write it to `path` as a 120-dpi PNG
    (creating the folder), close it and say so on stdout."""
    plt = pyplot()
    if title is not None:
        fig.suptitle(title, **title_options)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"- plot written to {path}")
