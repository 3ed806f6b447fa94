"""Benchmark: the leakage audit at a GPT-2-small-shaped HookedGPT's full 1,024-token context.

Model: HookedGPT with 12 layers, d_model 768, 12 heads, vocab 50,257, n_ctx 1,024 (random
weights). Measured, interleaved (`common.interleaved`), 2 prompts:
- `forward`: one full forward of the 2 prompts at `--len` tokens (the audit's unit of work);
- `incremental`: the KV-cache reference of `interp.analyses.leakage.fast` over the same prompts,
  compared with a full forward (what replaces the black-box truncation beyond 64 tokens);
- `prefixes (sample)`: black-box truncation forwards at a few prefix lengths, from which the
  cost of every prefix 1..T-1 is integrated (running all of them takes hours here).
Then the audit's token counts (`leakage.fast.count_tokens`) with and without the incremental
reference, and the audit time they predict from the measured seconds per token. `--audit`
also runs the whole audit and reports its wall time.

Run: `python -m benchmarks leakage_long` (a few minutes) or
`python -m benchmarks.bench_leakage_long --len 1024 --audit`.
"""
from __future__ import annotations

import argparse
import time

import torch

GPT2_SMALL = dict(n_layers=12, d_model=768, n_heads=12, d_vocab=50257, n_ctx=1024, seed=0)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--len", type=int, default=1024, dest="length")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--audit", action="store_true", help="also run the whole audit (minutes)")
    args = parser.parse_args(argv)
    from benchmarks.common import interleaved, pin_threads
    from interp.analyses import leakage
    from interp.analyses.leakage import fast as leakage_fast
    from interp.analyses.leakage.methods import _prompts
    from interp.analyses.leakage.plan import _default_lengths
    from interp.models import GPTConfig, HookedGPT

    threads = pin_threads(2)
    model = HookedGPT(GPTConfig(**GPT2_SMALL)).eval()
    adapter = leakage.ModelAdapter(model)
    tokens = _prompts(2, args.length, GPT2_SMALL["d_vocab"], 0)
    sample = [args.length // 8, args.length // 2, args.length - 1]

    def prefixes():
        for length in sample:
            adapter(tokens[:, :length])

    with torch.no_grad():
        timings = interleaved({
            "forward": lambda: adapter(tokens),
            "incremental": lambda: leakage_fast.incremental_rows(model, adapter, tokens, leakage.DEFAULT_TOL),
            "prefixes (sample)": prefixes,
        }, repeats=args.rounds, warmup=0)
    forward = timings["forward"].median_s
    incremental = timings["incremental"].median_s
    # prefix cost grows about linearly in length at these sizes: integrate the sampled rate over 1..T-1
    per_token = timings["prefixes (sample)"].median_s / (2 * sum(sample))
    every_prefix = per_token * 2 * args.length * (args.length - 1) / 2
    print(f"GPT-2-small-shaped HookedGPT, 2 prompts x {args.length} tokens, {threads} threads")
    print(f"  one full forward             {forward:8.1f} s")
    print(f"  incremental reference        {incremental:8.1f} s   ({incremental / forward:.1f}x one forward; "
          "includes its own full forward)")
    print(f"  every prefix (black box)    ~{every_prefix:8.0f} s   (integrated from prefixes {sample})")
    print(f"  truncation: incremental + 64-token black box is ~{every_prefix / incremental:.0f}x cheaper")
    lengths = _default_lengths(args.length)
    common = dict(draws=2, max_cuts=16, gradient_len=24, with_mask=True)
    for incremental_path in (False, True):
        counts = leakage_fast.count_tokens(args.length, lengths, 2, leakage.METHODS, incremental=incremental_path, **common)
        seconds = sum(counts.values()) * forward / (2 * args.length)
        print(f"  audit tokens {'with' if incremental_path else 'without':>7} the reference: {sum(counts.values()):>9,} "
              f"-> about {seconds / 60:6.1f} min at the measured forward rate ({counts})")
    out = {"forward_s": forward, "incremental_s": incremental, "every_prefix_s": every_prefix}
    if args.audit:
        start = time.perf_counter()
        report = leakage.audit(model, max_len=args.length, progress=True)
        out["audit_s"] = time.perf_counter() - start
        print(f"  whole audit: {out['audit_s'] / 60:.1f} min, verdict {report.verdict}, "
              f"max influence {report.max_influence:.3g}")
    return out


if __name__ == "__main__":
    main()
