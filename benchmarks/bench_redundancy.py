"""Benchmark: head-redundancy analyses on the benchmark model (4 layers, d_model 256, 8 heads, vocab 5,000).

1. Single-head mean-ablation importance of all 32 heads on 16 x 128 tokens: the resuming
   `AblationEngine` (clean run cached once, each ablation resumed from its head's layer) against
   one `run_with_hooks` forward per head. The numbers must agree to 1e-5; target >= 1.5x.
   Batched ablations (`batched_head_ablations`, the batch expanded per head) are timed too.
2. Pattern similarity (JS divergence of all 496 head pairs) over prompts of 128 tokens:
   seconds and peak memory (resident set sampled every 5 ms, above the level before the call),
   on `--similarity-prompts` prompts, extrapolated linearly to 1,024 when fewer are run (the
   forward and the pairwise sums are both linear in the number of prompts; memory is flat).

Run: `OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_redundancy` (about 1-2 minutes).
Repetitions are interleaved and the best of each is kept (other processes share the CPU).
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import torch

BENCH_CONFIG = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=128, seed=0)
TARGET_SPEEDUP = 1.5


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak resident memory above the level at entry, sampled in a background thread."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes() - self.base)
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.base = _rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes() - self.base)


def bench_importance(model, prompts, repeats: int = 2) -> dict:
    from analyses.redundancy import AblationEngine
    from interp.interventions import HeadAblation, all_heads, batched_head_ablations, reference_activations

    heads = all_heads(model)
    reference = reference_activations(model, prompts, site="z")
    tokens = prompts.tokens

    def per_head_forwards() -> torch.Tensor:
        out = []
        with torch.no_grad():
            clean = model(tokens, return_type="loss", loss_per_token=True).mean(-1)
            for head in heads:
                hooks = HeadAblation((head,), "mean").hooks(model, reference)
                out.append(model.run_with_hooks(tokens, return_type="loss", loss_per_token=True, fwd_hooks=hooks).mean(-1))
        return torch.stack(out).double() - clean.double()

    def resuming() -> torch.Tensor:
        engine = AblationEngine(model, prompts, "mean", reference=reference, batch_size=len(prompts))
        clean, ablated = engine.losses([[h] for h in heads])
        return ablated - clean

    def batched() -> torch.Tensor:
        with torch.no_grad():
            clean = model(tokens, return_type="loss", loss_per_token=True).mean(-1)
            out = batched_head_ablations(model, prompts, heads, "mean", reference=reference, chunk_size=8,
                                         return_type="loss", loss_per_token=True).mean(-1)
        return out.double() - clean.double()

    times = {"per_head": [], "resuming": [], "batched": []}
    results = {}
    for _ in range(repeats):
        for name, fn in (("per_head", per_head_forwards), ("resuming", resuming), ("batched", batched)):
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    difference = float((results["resuming"] - results["per_head"]).abs().max())
    difference_batched = float((results["batched"] - results["per_head"]).abs().max())
    if difference > 1e-5:
        raise AssertionError(f"resuming importance differs from per-head forwards by {difference:.2e} > 1e-5")
    best = {name: min(t) for name, t in times.items()}
    return {
        "heads": len(heads),
        "per_head_s": best["per_head"],
        "per_head_s_per_head": best["per_head"] / len(heads),
        "resuming_s": best["resuming"],
        "batched_s": best["batched"],
        "speedup": best["per_head"] / best["resuming"],
        "batched_speedup": best["per_head"] / best["batched"],
        "max_abs_difference": difference,
        "max_abs_difference_batched": difference_batched,
    }


def bench_pattern_similarity(model, n_prompts: int, batch_size: int = 16) -> dict:
    from analyses.redundancy import pattern_similarity
    from interp.data import random_tokens

    prompts = random_tokens(n_prompts, 128, model.cfg.d_vocab, seed=1)
    pattern_similarity(model, prompts[:batch_size], batch_size=batch_size)  # warm up
    with PeakMemory() as memory:
        start = time.perf_counter()
        frame = pattern_similarity(model, prompts, batch_size=batch_size)
        seconds = time.perf_counter() - start
    return {
        "prompts_run": n_prompts,
        "pairs": len(frame),
        "seconds": seconds,
        "seconds_per_1024_prompts": seconds * 1024 / n_prompts,
        "extrapolated": n_prompts != 1024,
        "peak_memory_mb": memory.peak / 2**20,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--similarity-prompts", type=int, default=256,
                        help="prompts for the pattern-similarity timing (extrapolated to 1,024); default 256")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from interp.data import random_tokens
    from models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(**BENCH_CONFIG)).eval()
    prompts = random_tokens(16, 128, model.cfg.d_vocab, seed=0)
    importance = bench_importance(model, prompts, repeats=args.repeats)
    print(f"importance, {importance['heads']} single-head mean ablations on 16 x 128 tokens:")
    print(f"  one run_with_hooks forward per head  {importance['per_head_s']:.2f} s ({importance['per_head_s_per_head']:.3f} s a head)")
    print(f"  resuming from the cached clean run   {importance['resuming_s']:.2f} s  -> {importance['speedup']:.2f}x "
          f"(target >= {TARGET_SPEEDUP}x), max |difference| {importance['max_abs_difference']:.1e}")
    print(f"  batch expanded per head (8 a pass)   {importance['batched_s']:.2f} s  -> {importance['batched_speedup']:.2f}x, "
          f"max |difference| {importance['max_abs_difference_batched']:.1e}")
    similarity = bench_pattern_similarity(model, args.similarity_prompts)
    note = f" (extrapolated from {similarity['prompts_run']})" if similarity["extrapolated"] else ""
    print(f"pattern similarity, {similarity['pairs']} head pairs, 128 tokens a prompt:")
    print(f"  {similarity['seconds']:.1f} s for {similarity['prompts_run']} prompts; "
          f"{similarity['seconds_per_1024_prompts']:.1f} s per 1,024 prompts{note}; "
          f"peak memory {similarity['peak_memory_mb']:.0f} MB above baseline")
    return {"importance": importance, "pattern_similarity": similarity}


if __name__ == "__main__":
    main()
