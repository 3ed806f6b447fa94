"""Benchmark: naming the line of code where a leak appears (`interp.analyses.leakage.origin`), against the audit itself.

1. Cost on the benchmark model (HookedGPT, 4 layers, d_model 256, 8 heads, vocab 5,000, n_ctx
   128, random weights) whose last layer lost its causal mask: the default audit without
   localisation (`localise_leaks=False`) against the same audit with it (hook sites and the op
   and line), timed in interleaved rounds. Target: the localisation costs at most 2x the audit.
2. Memory at a GPT-2-small shape (12 layers, d_model 768, 12 heads, vocab 50,257) at 1,024 tokens,
   the last layer unmasked: the op-level search for one future pair (cut at 511), in a fresh
   process, against one plain forward of the same tokens in another. The reference's restricted
   outputs are kept a window at a time (`MAX_BYTES`), so the search's peak stays near a forward's.

Run: `python -m benchmarks origin`; BENCH_THREADS sets the threads (2).
"""
from __future__ import annotations

import time

import torch

from benchmarks.common import Ratio, interleaved, peak_rss_mb, pin_threads, print_table, reset_peak_rss
from interp.analyses.leakage import audit
from interp.analyses.leakage.origin import MAX_BYTES, OpPair, find_origin
from interp.models import GPTConfig, HookedGPT

SHAPE = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=128, d_mlp=1024, seed=0)
GPT2_SMALL = dict(n_layers=12, d_model=768, n_heads=12, d_vocab=50257, n_ctx=1024, d_mlp=3072, seed=0)
LONG, CUT = 1024, 511


def leaky(shape: dict) -> HookedGPT:
    model = HookedGPT(GPTConfig(**shape)).eval()
    model.blocks[-1].attn.causal = False  # planted: the last layer reads the future
    return model


def _long_pair() -> OpPair:
    tokens = torch.randint(0, GPT2_SMALL["d_vocab"], (1, LONG), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, CUT + 1:] = (changed[:, CUT + 1:] + 1) % GPT2_SMALL["d_vocab"]
    return OpPair("future", tokens, changed, 0, torch.arange(CUT + 1), lambda q: f"row {q} moved")


def _timed_in_fresh_process(step) -> dict:
    """Build the GPT-2-small-shaped model, reset the peak RSS, run `step(model)`: its seconds and what it found."""
    torch.set_num_threads(1)
    model = leaky(GPT2_SMALL)
    reset_peak_rss()
    start = time.perf_counter()
    with torch.no_grad():
        found = step(model)
    return {"seconds": time.perf_counter() - start, "found": str(found)}


def memory_origin() -> dict:
    """In a fresh process: the op-level search at 1,024 tokens (its peak RSS after the model is built)."""
    return _timed_in_fresh_process(lambda model: find_origin(model, _long_pair(), 1e-5))


def memory_forward() -> dict:
    """In a fresh process: one plain forward of the same 1,024 tokens."""
    return _timed_in_fresh_process(lambda model: model(_long_pair().reference).shape)


def main() -> None:
    threads = pin_threads()
    model = leaky(SHAPE)
    timings = interleaved({
        "audit, no localisation": lambda: audit(model, n_prompts=2, localise_leaks=False),
        "audit + sites + origin": lambda: audit(model, n_prompts=2),
    }, repeats=3, budget_s=120)
    print_table(f"Leak localisation on the 4-layer benchmark model, 128 tokens, {threads} threads", timings,
                [Ratio("with localisation / without", "audit + sites + origin", "audit, no localisation", 3.0)],
                notes=["target: localisation at most 2x the audit, i.e. the ratio at most 3.0"])
    print(audit(model, n_prompts=2).origin)
    forward = peak_rss_mb("benchmarks.bench_origin", "memory_forward", timeout=600)
    search = peak_rss_mb("benchmarks.bench_origin", "memory_origin", timeout=900)
    print(f"GPT-2-small shape at {LONG} tokens, window {MAX_BYTES / 2**20:.0f} MiB: plain forward peak "
          f"{forward['peak_rss_mb']:.0f} MiB in {forward['seconds']:.1f} s; op-level search peak "
          f"{search['peak_rss_mb']:.0f} MiB in {search['seconds']:.1f} s; found: {search['found']}")


if __name__ == "__main__":
    main()
