"""Benchmark: data parallel over prompts, 1 process vs 2 processes at 1 thread each.

Workload: `interp.analyses.positional.focus_per_prompt` (11 metrics x every head, per prompt) on the
HookedGPT of bench_positional (4 layers, d_model 256, 8 heads, vocab 5,000), random prompts of
128 tokens, batch 32. Each configuration runs in fresh spawned processes (`interp.distributed.
spawn_local`, a gloo group for 2), every process pinned to 1 torch thread.

Reported per configuration: `compute` = from a barrier after set-up (imports, model, prompts)
to the merged result on every rank, the slowest rank (what data parallel speeds up); `wall` =
the whole call including process start-up and imports (what a user waits for on a short job).
Rounds alternate 1, 2, 1, 2 ... so load changes hit both; medians are reported. The target is
a compute speed-up >= 1.7x on 2 free cores; on a shared machine the ratio says as much about
the other tenants as about the code. The merged results of 1 and 2 processes are also checked
to be equal (they must be bit-identical: same batches, same kernels).

Run: `python -m benchmarks scaling` or `python benchmarks/bench_scaling.py [--prompts N] [--rounds R]`.
"""
from __future__ import annotations

import argparse
import statistics
import time

MODEL = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=256, seed=0)
SEQ_LEN = 128


def _focus_worker(n_prompts: int):
    import torch

    from interp import distributed
    from interp.analyses.positional import focus_per_prompt
    from interp.data import random_tokens
    from interp.models import GPTConfig, HookedGPT

    torch.set_num_threads(1)
    model = HookedGPT(GPTConfig(**MODEL)).eval()
    prompts = random_tokens(n_prompts, SEQ_LEN, MODEL["d_vocab"], seed=0)
    focus_per_prompt(model, prompts[:2], batch_size=2)  # warm-up outside the timing (in a group: shards of 2)
    if distributed.active():
        torch.distributed.barrier()
    start = time.perf_counter()
    result = focus_per_prompt(model, prompts, batch_size=32)
    seconds = time.perf_counter() - start
    return seconds, {name: value.clone() for name, value in result.items()}


def run_config(workers: int, n_prompts: int) -> tuple[float, float, dict]:
    """(compute seconds of the slowest rank, wall seconds, rank 0's merged result)."""
    from interp.distributed import spawn_local

    start = time.perf_counter()
    results = spawn_local(_focus_worker, (n_prompts,), workers=workers, threads=1, return_all=True)
    wall = time.perf_counter() - start
    return max(seconds for seconds, _ in results), wall, results[0][1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    merged: dict[int, dict] = {}
    for _ in range(args.rounds):
        for workers in (1, 2):
            compute, wall, result = run_config(workers, args.prompts)
            times[workers].append((compute, wall))
            merged[workers] = result
    equal = all(torch.equal(merged[1][name], merged[2][name]) or
                torch.allclose(merged[1][name], merged[2][name], rtol=1e-6, atol=0, equal_nan=True) for name in merged[1])
    rows = {w: (statistics.median(c for c, _ in t), statistics.median(w_ for _, w_ in t)) for w, t in times.items()}
    tokens = args.prompts * SEQ_LEN
    print(f"positional metrics, {args.prompts} prompts x {SEQ_LEN} tokens, 1 thread per process, "
          f"median of {args.rounds} rounds")
    print(f"{'processes':>9} {'compute s':>10} {'tokens/s':>10} {'speed-up':>9} {'wall s':>8} {'wall speed-up':>14}")
    for workers, (compute, wall) in rows.items():
        print(f"{workers:>9} {compute:>10.2f} {tokens / compute:>10.0f} {rows[1][0] / compute:>8.2f}x "
              f"{wall:>8.1f} {rows[1][1] / wall:>13.2f}x")
    print(f"2-process result equal to 1-process (rtol 1e-6): {equal}")
    return {"rows": rows, "equal": equal}


if __name__ == "__main__":
    main()
