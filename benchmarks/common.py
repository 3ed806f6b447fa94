"""Helpers shared by the benchmarks: pinned threads, interleaved timing, peak memory, tables.

This machine is shared: two busy processes with torch's default threads slow each other
10-20x. So threads are pinned, candidates are timed in interleaved rounds (A B C, A B C, ...)
so that load changes hit all of them alike, and medians are reported. Ratios measured in the
same run are the figures to trust; absolute times move with the load.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch


def pin_threads(default: int = 2) -> int:
    """Use BENCH_THREADS threads (default 2) for torch's intra-op pool; returns the count."""
    n = int(os.environ.get("BENCH_THREADS", default))
    torch.set_num_threads(n)
    return n


@dataclass(frozen=True)
class Timing:
    name: str
    median_s: float  # median over the repetitions
    min_s: float
    times_s: tuple[float, ...]  # every repetition, in order
    cpu_median_s: float = float("nan")  # median CPU time of this process (all threads)


def interleaved(
    candidates: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
    budget_s: float | None = None, min_repeats: int = 3,
) -> dict[str, Timing]:
    """Time each candidate `repeats` times in interleaved rounds, after `warmup` untimed rounds.

    Each round runs every candidate once, in a rotated order, so that neither a slow spell of
    the machine nor running first favours one candidate. With `budget_s`, rounds stop early
    once the budget is spent and `min_repeats` timed rounds are done (a loaded machine).
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be at least 1.")
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu_times: dict[str, list[float]] = {name: [] for name in names}
    started = time.perf_counter()
    for round_index in range(warmup + repeats):
        done = round_index - warmup
        if budget_s is not None and done >= min_repeats and time.perf_counter() - started > budget_s:
            break
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start, cpu_start = time.perf_counter(), time.process_time()
            candidates[name]()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            if round_index >= warmup:
                times[name].append(elapsed)
                cpu_times[name].append(cpu)
    return {
        name: Timing(name, statistics.median(ts), min(ts), tuple(ts), statistics.median(cpu_times[name]))
        for name, ts in times.items()
    }


def peak_rss_mb(module: str, function: str, *args: str, timeout: float = 300.0) -> dict[str, float]:
    """Run `module.function(*args)` in a fresh Python process and return its memory figures.

    The function returns a dict of its own figures (e.g. RSS before its step and the peak since
    `reset_peak_rss()`); this adds `peak_rss_mb`, the process's maximum resident set size
    (`ru_maxrss`; on Linux it follows the same high-water mark, so after a reset it is the peak
    since the reset). tracemalloc cannot see torch's allocations, and torch's profiler counts
    allocations rather than pages in use; resident pages are what the machine had to provide.
    """
    code = (
        "import json, resource, sys, importlib\n"
        f"result = getattr(importlib.import_module({module!r}), {function!r})(*{list(args)!r}) or {{}}\n"
        "result['peak_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print('RESULT ' + json.dumps(result))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"memory probe {module}.{function}{args} failed:\n{completed.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def current_rss_mb() -> float:
    """Resident set size of this process now (Linux /proc), in MiB."""
    return _status_mb("VmRSS")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False if refused.

    Without it, the peak a step reports may date from before the step (imports peak high).
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset_mb() -> float:
    """Peak RSS (VmHWM) since the last `reset_peak_rss`, or since the process started, in MiB."""
    return _status_mb("VmHWM")


@dataclass(frozen=True)
class Ratio:
    label: str  # what is compared, e.g. "HookedGPT no hooks / plain GPT"
    numerator: str  # Timing names
    denominator: str
    target: float | None = None  # pass if ratio <= target


def print_table(title: str, timings: dict[str, Timing], ratios: list[Ratio], tokens_per_call: int | None = None,
                notes: list[str] | None = None) -> list[dict]:
    """Print the timings and the ratios (with targets) as rich tables; return the ratio rows."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=title)
    table.add_column("candidate")
    table.add_column("median s", justify="right")
    table.add_column("min s", justify="right")
    table.add_column("CPU s", justify="right")
    if tokens_per_call:
        table.add_column("tokens/s", justify="right")
    for timing in timings.values():
        row = [timing.name, f"{timing.median_s:.3f}", f"{timing.min_s:.3f}", f"{timing.cpu_median_s:.3f}"]
        if tokens_per_call:
            row.append(f"{tokens_per_call / timing.median_s:,.0f}")
        table.add_row(*row)
    console.print(table)

    # the target is judged on wall-clock medians; beside it, the ratio of minimums (each
    # candidate's least disturbed run) and of median CPU time (cycles this process used, blind to
    # time spent waiting for a core), steadier on a loaded machine
    ratio_table = Table(title=f"{title}: ratios (same run)")
    for column in ("comparison", "ratio", "ratio of mins", "CPU-time ratio", "target", "met"):
        ratio_table.add_column(column, justify="right" if column != "comparison" else "left")
    rows = []
    for ratio in ratios:
        value = timings[ratio.numerator].median_s / timings[ratio.denominator].median_s
        of_mins = timings[ratio.numerator].min_s / timings[ratio.denominator].min_s
        of_cpu = timings[ratio.numerator].cpu_median_s / timings[ratio.denominator].cpu_median_s
        met = None if ratio.target is None else value <= ratio.target
        rows.append({"comparison": ratio.label, "ratio": value, "ratio_of_mins": of_mins, "cpu_ratio": of_cpu,
                     "target": ratio.target, "met": met})
        ratio_table.add_row(
            ratio.label, f"{value:.2f}x", f"{of_mins:.2f}x", f"{of_cpu:.2f}x",
            "-" if ratio.target is None else f"<= {ratio.target:.2f}",
            "-" if met is None else ("yes" if met else "NO"),
        )
    console.print(ratio_table)
    for note in notes or []:
        console.print(note)
    return rows
