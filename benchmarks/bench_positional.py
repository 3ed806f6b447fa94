"""Benchmark: positional metrics for every head, streamed, against detect_head and a plain forward.

Model: HookedGPT, 4 layers, d_model 256, 8 heads, vocab 5,000 (n_ctx 256, random weights:
speed does not depend on what the weights learned). Prompts: random tokens, 128 per prompt.
Every measurement runs single-threaded in a fresh subprocess, so peak RSS belongs to it alone.

- ours: `interp.analyses.positional.focus_per_prompt` (all 11 metrics x 32 heads, per prompt),
  batch 32, stopping after the last needed hook. Memory: a fresh process streams `--small`
  and another `--prompts` prompts; their peak RSS is the memory check (it should not grow
  with the number of prompts). The bootstrap CIs `focus()` adds are timed after that, with
  their own peak.
- detect_head: `transformer_lens.head_detector.detect_head(model, prompt, "previous_token_head")`,
  one detector (TransformerLens reruns the model with a full cache per prompt), measured on
  `--detect-prompts` prompts per round and reported per token (it is linear in prompts).
- forward: `model(tokens)` with no hooks (the fused SDPA path, full logits), batch 32.
Throughput: detect_head, ours and forward run interleaved in one process, `--rounds` times,
so all three share the machine's load (the cores are shared; sequential runs are not comparable).

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


def _setup(n_prompts: int):
    import torch

    torch.set_num_threads(1)
    from interp.data import random_tokens
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(**MODEL)).eval()
    return model, random_tokens(n_prompts, SEQ_LEN, MODEL["d_vocab"], seed=0)


def _speed(rounds: int, detect_prompts: int, ours_prompts: int, forward_prompts: int) -> dict:
    """Interleaved throughput: each round runs detect_head, ours and the plain forward once, so
    all three see the same machine load (the cores are shared)."""
    import torch
    from transformer_lens.head_detector import detect_head

    from interp.analyses.positional import focus_per_prompt

    model, prompts = _setup(max(detect_prompts, ours_prompts, forward_prompts) * rounds)

    def ours(p):
        focus_per_prompt(model, p, batch_size=32)

    def detect(p):
        for row in p.tokens:
            detect_head(model, row[None], "previous_token_head")

    def forward(p):
        with torch.no_grad():
            for batch in p.batches(32):
                model(batch.tokens)

    jobs = {"detect_head": (detect, detect_prompts), "ours": (ours, ours_prompts), "forward": (forward, forward_prompts)}
    for fn, _ in jobs.values():  # warm-up, unmeasured
        fn(prompts[0:2])
    seconds = {name: 0.0 for name in jobs}
    for r in range(rounds):
        for name, (fn, n) in jobs.items():
            part = prompts[r * n : (r + 1) * n]
            start = time.perf_counter()
            fn(part)
            seconds[name] += time.perf_counter() - start
    return {name: {"n_prompts": n * rounds, "tokens": n * rounds * SEQ_LEN, "seconds": seconds[name],
                   "tokens_per_s": n * rounds * SEQ_LEN / seconds[name]} for name, (_, n) in jobs.items()}


def _memory(n_prompts: int, with_ci: bool) -> dict:
    """Streaming focus_per_prompt over n_prompts in a fresh process: time and peak RSS; then
    (optionally) the bootstrap CIs of focus(), whose peak is recorded separately after."""
    from interp.analyses.positional import focus_per_prompt, nan_aware_frame

    model, prompts = _setup(n_prompts)
    focus_per_prompt(model, prompts[0:2])  # warm-up
    before = _rss_mb()
    start = time.perf_counter()
    per_prompt = focus_per_prompt(model, prompts, batch_size=32)
    seconds = time.perf_counter() - start
    result = {"n_prompts": n_prompts, "seconds": seconds, "tokens_per_s": n_prompts * SEQ_LEN / seconds,
              "peak_rss_mb": _peak_mb(), "rss_growth_mb": _peak_mb() - before}
    if with_ci:
        start = time.perf_counter()
        nan_aware_frame(per_prompt)
        result.update(ci_seconds=time.perf_counter() - start, peak_rss_with_ci_mb=_peak_mb())
    return result


def _run(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=2048, help="prompts for the large memory run (default 2048)")
    parser.add_argument("--small", type=int, default=256, help="prompts for the small memory run (default 256)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds (default 3)")
    parser.add_argument("--detect-prompts", type=int, default=16, help="detect_head prompts per round (default 16)")
    parser.add_argument("--ours-prompts", type=int, default=128, help="our prompts per round (default 128)")
    parser.add_argument("--forward-prompts", type=int, default=128, help="plain-forward prompts per round (default 128)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        values = [int(v) for v in rest]
        result = _speed(*values) if kind == "speed" else _memory(values[0], bool(values[1]))
        print(json.dumps(result))
        return result
    if args.quick:
        args.prompts, args.small, args.rounds, args.detect_prompts, args.ours_prompts, args.forward_prompts = 64, 32, 1, 4, 32, 32
    speed = _run("speed", str(args.rounds), str(args.detect_prompts), str(args.ours_prompts), str(args.forward_prompts))
    small = _run("memory", str(args.small), "0")
    large = _run("memory", str(args.prompts), "1")
    detect, ours, forward = speed["detect_head"], speed["ours"], speed["forward"]
    summary = {
        "model": MODEL, "seq_len": SEQ_LEN, "speed": speed, "memory_small": small, "memory_large": large,
        "speedup_vs_detect_head": ours["tokens_per_s"] / detect["tokens_per_s"],
        "fraction_of_forward": ours["tokens_per_s"] / forward["tokens_per_s"],
    }
    print(f"positional metrics (11 per head, all 32 heads), HookedGPT {MODEL}, {SEQ_LEN} tokens/prompt, 1 thread")
    print(f"throughput, {args.rounds} interleaved rounds:")
    print(f"  {'run':<13}{'prompts':>8}{'tokens/s':>10}{'seconds':>9}")
    for name, run in (("detect_head", detect), ("ours", ours), ("forward", forward)):
        print(f"  {name:<13}{run['n_prompts']:>8}{run['tokens_per_s']:>10.0f}{run['seconds']:>9.1f}")
    print(f"  ours / detect_head (one detector; per token, detect_head on {detect['n_prompts']} prompts): "
          f"{summary['speedup_vs_detect_head']:.2f}x (target >= 1.5x)")
    print(f"  ours / plain forward (full logits): {summary['fraction_of_forward']:.2f}")
    print("memory, fresh process per size (peak RSS = ru_maxrss; growth = peak - RSS before streaming):")
    for run in (small, large):
        print(f"  {run['n_prompts']:>5} prompts: {run['tokens_per_s']:>6.0f} tokens/s, {run['seconds']:.1f} s, "
              f"peak RSS {run['peak_rss_mb']:.0f} MB, growth {run['rss_growth_mb']:.1f} MB")
    print(f"  bootstrap CIs of focus() on {large['n_prompts']} prompts: {large['ci_seconds']:.1f} s, "
          f"peak RSS with them {large['peak_rss_with_ci_mb']:.0f} MB")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=2)
    return summary


if __name__ == "__main__":
    main()
