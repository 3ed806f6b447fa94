"""Benchmark: positional metrics for every head, streamed, against detect_head and a plain forward.

Model: HookedGPT, 4 layers, d_model 256, 8 heads, vocab 5,000 (n_ctx 256, random weights:
speed does not depend on what the weights learned). Prompts: random tokens, 128 per prompt.
Every measurement runs single-threaded in a fresh subprocess, so peak RSS belongs to it alone.

- ours: `analyses.positional.focus_per_prompt` (all 11 metrics x 32 heads, per prompt),
  batch 32, stopping after the last layer; at `--small` and `--prompts` prompts. Its peak
  RSS at both sizes is the memory check (it should not grow with the number of prompts).
  `focus()` adds bootstrap CIs on top: timed and measured separately ("ours+CI").
- detect_head: `transformer_lens.head_detector.detect_head(model, prompts, "previous_token_head")`,
  one detector (TransformerLens reruns the model with a full cache per prompt), measured on
  `--detect-prompts` prompts and reported per token (it is linear in prompts).
- forward: `model(tokens)` with no hooks (the fused SDPA path, full logits), batch 32, on
  `--forward-prompts` prompts, per token.

Peak memory = the subprocess's maximum resident set size (`ru_maxrss`), and the growth of
RSS during the measured step (peak minus the RSS just before it).

Run: `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_positional.py` (about 2-3 minutes);
`--quick` for a smoke run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SEQ_LEN = 128
MODEL = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=256, seed=0)


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, n_prompts: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from interp.data import random_tokens
    from models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(**MODEL)).eval()
    prompts = random_tokens(n_prompts, SEQ_LEN, MODEL["d_vocab"], seed=0)
    # warm up (allocator, kernels) on 2 prompts, outside the measured step
    warm = random_tokens(2, SEQ_LEN, MODEL["d_vocab"], seed=1)
    if kind in ("ours", "ours_ci"):
        from analyses.positional import focus, focus_per_prompt

        focus_per_prompt(model, warm)
        step = (lambda: focus_per_prompt(model, prompts, batch_size=32)) if kind == "ours" else \
            (lambda: focus(model, prompts, batch_size=32))
    elif kind == "detect_head":
        from transformer_lens.head_detector import detect_head

        detect_head(model, warm.tokens[:1], "previous_token_head")
        step = lambda: [detect_head(model, row[None], "previous_token_head") for row in prompts.tokens]  # noqa: E731
    elif kind == "forward":
        model(warm.tokens)

        def step():
            with torch.no_grad():
                for batch in prompts.batches(32):
                    model(batch.tokens)
    else:
        raise ValueError(f"unknown benchmark kind {kind!r}")
    before = _rss_mb()
    start = time.perf_counter()
    with torch.no_grad():
        step()
    seconds = time.perf_counter() - start
    return {"kind": kind, "n_prompts": n_prompts, "tokens": n_prompts * SEQ_LEN, "seconds": seconds,
            "tokens_per_s": n_prompts * SEQ_LEN / seconds, "peak_rss_mb": _peak_mb(),
            "rss_growth_mb": _peak_mb() - before}


def _run(kind: str, n_prompts: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(n_prompts)], capture_output=True, text=True,
                         env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child {kind} {n_prompts} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=2048, help="prompts for the large run (default 2048)")
    parser.add_argument("--small", type=int, default=256, help="prompts for the small memory run (default 256)")
    parser.add_argument("--detect-prompts", type=int, default=64, help="prompts for detect_head (extrapolated per token)")
    parser.add_argument("--forward-prompts", type=int, default=512, help="prompts for the plain forward")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return {}
    if args.quick:
        args.prompts, args.small, args.detect_prompts, args.forward_prompts = 64, 16, 8, 32
    runs = [_run("detect_head", args.detect_prompts), _run("forward", args.forward_prompts),
            _run("ours", args.small), _run("ours", args.prompts), _run("ours_ci", args.prompts)]
    detect, forward, small, large, with_ci = runs
    summary = {
        "runs": runs,
        "speedup_vs_detect_head": large["tokens_per_s"] / detect["tokens_per_s"],
        "fraction_of_forward": large["tokens_per_s"] / forward["tokens_per_s"],
        "peak_rss_small_mb": small["peak_rss_mb"], "peak_rss_large_mb": large["peak_rss_mb"],
        "rss_growth_small_mb": small["rss_growth_mb"], "rss_growth_large_mb": large["rss_growth_mb"],
    }
    print(f"positional metrics, all heads, HookedGPT {MODEL}, {SEQ_LEN} tokens/prompt, 1 thread")
    print(f"{'run':<12}{'prompts':>8}{'tokens/s':>11}{'seconds':>9}{'peak RSS MB':>13}{'RSS growth MB':>15}")
    labels = ["detect_head", "forward", "ours", "ours", "ours+CI"]
    for label, run in zip(labels, runs):
        print(f"{label:<12}{run['n_prompts']:>8}{run['tokens_per_s']:>11.0f}{run['seconds']:>9.1f}"
              f"{run['peak_rss_mb']:>13.0f}{run['rss_growth_mb']:>15.1f}")
    print(f"ours / detect_head (one detector, per token, measured on {detect['n_prompts']} prompts): "
          f"{summary['speedup_vs_detect_head']:.2f}x (target >= 1.5x)")
    print(f"ours / plain forward: {summary['fraction_of_forward']:.2f}")
    print(f"peak RSS {small['n_prompts']} -> {large['n_prompts']} prompts: {small['peak_rss_mb']:.0f} -> "
          f"{large['peak_rss_mb']:.0f} MB (streaming step grew RSS by {small['rss_growth_mb']:.1f} -> "
          f"{large['rss_growth_mb']:.1f} MB)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=2)
    return summary


if __name__ == "__main__":
    main()
