"""Benchmark: head-redundancy analyses on the benchmark model (4 layers, d_model 256, 8 heads, vocab 5,000).

1. Single-head mean-ablation importance of all 32 heads on 16 x 128 tokens: the resuming
   `AblationEngine` (clean run cached once, each ablation resumed from its head's layer) against
   one `run_with_hooks` forward per head. The numbers must agree to 1e-5; target >= 1.5x.
   Batched ablations (Run's strategy "batched": the batch expanded per head) are timed too.
2. Pattern similarity (JS divergence of all 496 head pairs) over prompts of 128 tokens:
   seconds and peak memory, each size in a fresh single-threaded process (`benchmarks.common.
   peak_rss_mb`), at `--similarity-small` and `--similarity-prompts` prompts (memory should not
   grow), the time extrapolated linearly to 1,024 prompts (forward and pairwise sums are both
   linear in the number of prompts).

Run: `OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_redundancy` (about 1.5 minutes of
CPU; one thread). Timings are medians of interleaved rounds (the machine is shared).
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import (
    Ratio,
    current_rss_mb,
    interleaved,
    peak_rss_mb,
    peak_rss_since_reset_mb,
    pin_threads,
    print_table,
    reset_peak_rss,
)

BENCH_CONFIG = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=128, seed=0)
SEQ_LEN = 128
TARGET_SPEEDUP = 1.5


def _model():
    from interp.models import GPTConfig, HookedGPT

    return HookedGPT(GPTConfig(**BENCH_CONFIG)).eval()


def bench_importance(repeats: int = 2) -> dict:
    """Time the three ways to get every single-head mean-ablation loss change; check they agree."""
    from interp.ablation import AblationEngine
    from interp.data import random_tokens
    from interp.interventions import HeadAblation, all_heads, reference_activations
    from interp.interventions.ablation import _batched_head_ablations  # internal: Run's strategy "batched"

    model = _model()
    prompts = random_tokens(16, SEQ_LEN, BENCH_CONFIG["d_vocab"], seed=0)
    heads = all_heads(model)
    reference = reference_activations(model, prompts, site="z")
    tokens = prompts.tokens
    results: dict[str, torch.Tensor] = {}

    def per_head_forwards() -> None:
        out = []
        with torch.no_grad():
            clean = model(tokens, return_type="loss", loss_per_token=True).mean(-1)
            for head in heads:
                hooks = HeadAblation((head,), "mean").hooks(model, reference)
                out.append(model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=hooks).mean(-1))
        results["per_head"] = torch.stack(out).double() - clean.double()

    def resuming() -> None:
        engine = AblationEngine(model, prompts, "mean", reference=reference, batch_size=len(prompts))
        clean, ablated = engine._losses([[h] for h in heads])
        results["resuming"] = ablated - clean

    def batched() -> None:
        with torch.no_grad():
            clean = model(tokens, return_type="loss", loss_per_token=True).mean(-1)
            out = _batched_head_ablations(model, prompts, heads, "mean", reference=reference, chunk_size=8,
                                          return_type="loss", loss_per_token=True).mean(-1)
        results["batched"] = out.double() - clean.double()

    timings = interleaved({"per-head forwards": per_head_forwards, "resuming": resuming}, repeats=repeats, warmup=0)
    # the expanded batch is informative only (slower on a CPU): timed once
    timings.update(interleaved({"batched (8 heads a pass)": batched}, repeats=1, warmup=0))
    difference = float((results["resuming"] - results["per_head"]).abs().max())
    difference_batched = float((results["batched"] - results["per_head"]).abs().max())
    if difference > 1e-5:
        raise AssertionError(f"resuming importance differs from per-head forwards by {difference:.2e} > 1e-5")
    ratios = print_table(
        f"importance: {len(heads)} single-head mean ablations, 16 x {SEQ_LEN} tokens", timings,
        [Ratio("resuming / per-head forwards", "resuming", "per-head forwards", target=round(1 / TARGET_SPEEDUP, 3)),
         Ratio("batched / per-head forwards", "batched (8 heads a pass)", "per-head forwards")],
        notes=[f"max |resuming - per-head| = {difference:.1e} nats (must be <= 1e-5); "
               f"max |batched - per-head| = {difference_batched:.1e}",
               f"per-head forwards: {timings['per-head forwards'].median_s / len(heads):.3f} s a head"],
    )
    speedup = timings["per-head forwards"].median_s / timings["resuming"].median_s
    cpu_speedup = timings["per-head forwards"].cpu_median_s / timings["resuming"].cpu_median_s
    return {"heads": len(heads), "speedup": speedup, "cpu_speedup": cpu_speedup, "max_abs_difference": difference,
            "max_abs_difference_batched": difference_batched, "ratios": ratios,
            "seconds": {name: t.median_s for name, t in timings.items()}}


def similarity_probe(n_prompts: str, batch_size: str = "16") -> dict:
    """Run in a fresh process by `peak_rss_mb`: pattern similarity on n prompts, its time and memory."""
    torch.set_num_threads(1)
    from interp.analyses.redundancy import pattern_similarity
    from interp.data import random_tokens

    model = _model()
    prompts = random_tokens(int(n_prompts), SEQ_LEN, BENCH_CONFIG["d_vocab"], seed=1)
    pattern_similarity(model, prompts[:2], batch_size=2)  # warm up outside the measured step
    before = current_rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    frame = pattern_similarity(model, prompts, batch_size=int(batch_size))
    seconds = time.perf_counter() - start
    return {"n_prompts": int(n_prompts), "pairs": len(frame), "seconds": seconds, "rss_before_mb": before,
            "peak_since_reset_mb": peak_rss_since_reset_mb()}


def bench_pattern_similarity(small: int, large: int) -> dict:
    runs = [peak_rss_mb("benchmarks.bench_redundancy", "similarity_probe", str(n)) for n in (small, large)]
    per_1024 = runs[-1]["seconds"] * 1024 / runs[-1]["n_prompts"]
    print(f"pattern similarity, {runs[-1]['pairs']} head pairs (JS divergence), {SEQ_LEN} tokens a prompt, 1 thread:")
    for run in runs:
        growth = run["peak_since_reset_mb"] - run["rss_before_mb"]
        print(f"  {run['n_prompts']:>5} prompts: {run['seconds']:6.1f} s, peak RSS {run['peak_since_reset_mb']:.0f} MB "
              f"(+{growth:.0f} MB during the step)")
    note = "" if runs[-1]["n_prompts"] == 1024 else f" (extrapolated linearly from {runs[-1]['n_prompts']} prompts)"
    print(f"  1,024 prompts: {per_1024:.0f} s{note}")
    return {"runs": runs, "seconds_per_1024_prompts": per_1024, "extrapolated": runs[-1]["n_prompts"] != 1024}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--similarity-prompts", type=int, default=128,
                        help="prompts for the pattern-similarity timing, extrapolated to 1,024 (default 128)")
    parser.add_argument("--similarity-small", type=int, default=32, help="prompts for the memory comparison (default 32)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    pin_threads(1)
    importance = bench_importance(repeats=args.repeats)
    # single-threaded, CPU time is the work done; wall time also counts waiting for a shared core
    print(f"resuming importance vs one run_with_hooks forward per head (target >= {TARGET_SPEEDUP}x): "
          f"{importance['cpu_speedup']:.2f}x in CPU time, {importance['speedup']:.2f}x in wall-clock medians")
    similarity = bench_pattern_similarity(args.similarity_small, args.similarity_prompts)
    return {"importance": importance, "pattern_similarity": similarity}


if __name__ == "__main__":
    main()
