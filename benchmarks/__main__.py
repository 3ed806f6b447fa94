"""Run every benchmarks/bench_*.py module's `main()`: `python -m benchmarks [name ...]`.

Names select modules (`forward` or `bench_forward`); with none, all run, in name order, but those in
`ON_REQUEST` (`peers`, which builds its own environment). Options after one name go to its `main`
(`python -m benchmarks peers --dry-run`).
A benchmark that fails is reported and the others still run; the exit code is 1 if any failed.

`python -m benchmarks --device cuda [--out DIR] [--dry-run]` runs the device suite instead
(benchmarks/suite.py: forward and cache, positional, importance, leakage, scaling; JSON as it goes).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import time
import traceback
from pathlib import Path


def discover() -> list[str]:
    """Module names of the benchmarks, `bench_*`, sorted."""
    folder = Path(__file__).resolve().parent
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if m.name.startswith("bench_"))


# benchmarks that run only when named (they build their own environment): `python -m benchmarks peers`
ON_REQUEST = ("bench_peers",)


def run(names: list[str]) -> int:
    available = discover()
    first = next((i for i, n in enumerate(names) if n.startswith("-")), len(names))
    names, options = names[:first], names[first:]  # options go to a single named benchmark, e.g. --dry-run
    if options and len(names) != 1:
        print(f"options {options} go to one named benchmark, e.g. `python -m benchmarks peers --dry-run`.", file=sys.stderr)
        return 2
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in names] or [
        n for n in available if n not in ON_REQUEST]
    unknown = [n for n in wanted if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    failed = []
    for name in wanted:
        print(f"\n=== benchmarks.{name} ===", flush=True)
        start = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            main = module.main
            # mains that parse their own arguments get none from this command line
            main(options) if inspect.signature(main).parameters else main()
        except Exception:  # one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
        print(f"=== {name}: {time.perf_counter() - start:.1f} s ===", flush=True)
    if failed:
        print(f"\nfailed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    if any(arg == "--device" or arg.startswith("--device=") for arg in sys.argv[1:]):
        from benchmarks.suite import main as suite_main

        sys.exit(suite_main(sys.argv[1:]))
    sys.exit(run(sys.argv[1:]))
