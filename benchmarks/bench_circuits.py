"""Benchmark: circuit discovery on the benchmark model (4 layers, d_model 256, 8 heads = 32 heads, vocab 5,000).

1. Exact path patching of every sender x receiver x {q, k, v} edge into a head (1,248 edges on this shape;
   `--every N` times every N-th, spread over the layers alike) on 16 x 128 tokens: `edge_effects` (the
   clean run cached per batch, each edge resumed from its receiver's layer with `run_from`, `--stack` edges
   along the batch axis) against one hooked forward per edge (`run.effect(EdgePatch([edge]))`). The values
   must agree to 1e-4. The ratio is reported next to the bound resuming allows on this shape: the full
   forward's cost over the resumed one's, summed over the edges' receiver layers, from measured block and
   unembedding times.
2. EAP (`attribution_patching`) on the same prompts: the forward and backward passes it makes per batch
   (counted at the first block's hook; target: at most 3) and its time against one clean forward.

Run: `OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_circuits` (`--tiny`: a 2-layer smoke shape, all
edges). Timings are medians of interleaved rounds (the machine is shared).
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import Ratio, interleaved, pin_threads, print_table

BENCH_CONFIG = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=128, seed=0)
TINY_CONFIG = dict(n_layers=2, d_model=64, n_heads=4, d_vocab=500, n_ctx=32, seed=0)
MAX_PASSES = 3


def _setup(config: dict, n_prompts: int, seq_len: int):
    import interp
    from interp.data import random_tokens
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(**config)).eval()
    prompts = random_tokens(n_prompts, seq_len, config["d_vocab"], seed=0)
    return interp.Run(model, prompts, batch_size=n_prompts), model


def _head_edges(model, every: int):
    from interp.paths import graph

    edges = [e for e in graph(model) if e.receiver.kind == "head"]
    return edges[::every]


def resume_bound(model, run, edges) -> float:
    """Full forward cost over resumed cost, summed over the edges, from measured block and head (unembed + loss) times."""
    tokens = run.prompts.tokens
    n = model.cfg.n_layers
    with torch.no_grad():
        times = interleaved({"full": lambda: model(tokens, return_type="loss"),
                             "blocks": lambda: model(tokens, stop_at_layer=n)}, repeats=3)
    block = times["blocks"].median_s / n
    head = max(times["full"].median_s - times["blocks"].median_s, 0.0)
    full = n * block + head
    resumed = sum((n - e.receiver.layer) * block + head for e in edges)
    return len(edges) * full / resumed


def bench_edges(config: dict, n_prompts: int, seq_len: int, every: int, stack: int) -> dict:
    from interp.analyses.circuits import edge_effects
    from interp.paths import EdgePatch

    run, model = _setup(config, n_prompts, seq_len)
    edges = _head_edges(model, every)
    results: dict[str, torch.Tensor] = {}

    def hooked() -> None:
        run.forget()
        results["hooked"] = torch.stack([run.effect(EdgePatch((edge,))).values for edge in edges])

    def resumed() -> None:
        results["resumed"] = torch.stack([e.values for e in edge_effects(run, edges, stack=stack)])

    def resumed_single() -> None:
        results["resumed, stack 1"] = torch.stack([e.values for e in edge_effects(run, edges, stack=1)])

    timings = interleaved({"one hooked forward per edge": hooked, f"edge_effects (stack {stack})": resumed,
                           "edge_effects (stack 1)": resumed_single}, repeats=1, warmup=0)
    difference = max(float((results[k] - results["hooked"]).abs().max()) for k in ("resumed", "resumed, stack 1"))
    if difference > 1e-4:
        raise AssertionError(f"edge_effects differs from hooked EdgePatch forwards by {difference:.2e} > 1e-4")
    bound = resume_bound(model, run, edges)
    ratios = print_table(
        f"exact path patching: {len(edges)} head edges (q/k/v), {n_prompts} x {seq_len} tokens, "
        f"{config['n_layers']} layers x {config['n_heads']} heads", timings,
        [Ratio(f"edge_effects (stack {stack}) / hooked", f"edge_effects (stack {stack})", "one hooked forward per edge"),
         Ratio("edge_effects (stack 1) / hooked", "edge_effects (stack 1)", "one hooked forward per edge")],
        notes=[f"max |edge_effects - hooked| = {difference:.1e} (must be <= 1e-4)",
               f"the bound resuming allows on this shape: {bound:.2f}x"],
    )
    speedup = timings["one hooked forward per edge"].median_s / timings[f"edge_effects (stack {stack})"].median_s
    speedup_single = timings["one hooked forward per edge"].median_s / timings["edge_effects (stack 1)"].median_s
    print(f"edge_effects vs one hooked forward per edge: {speedup:.2f}x (stack {stack}), {speedup_single:.2f}x "
          f"(stack 1); bound from resuming alone {bound:.2f}x")
    return {"edges": len(edges), "speedup": speedup, "speedup_stack_1": speedup_single, "bound": bound,
            "max_abs_difference": difference, "ratios": ratios,
            "seconds": {name: t.median_s for name, t in timings.items()}}


def bench_eap(config: dict, n_prompts: int, seq_len: int) -> dict:
    from interp.analyses.circuits import attribution_patching
    from interp.hooks import hooked

    run, model = _setup(config, n_prompts, seq_len)
    forwards = []
    with hooked(model, [("blocks.0.hook_resid_pre", lambda act, hook: forwards.append(1))]):
        start = time.perf_counter()
        result = attribution_patching(run)
        seconds = time.perf_counter() - start
    batches = -(-n_prompts // run.batch_size)
    with torch.no_grad():
        clean = interleaved({"clean forward": lambda: model(run.prompts.tokens, return_type="loss")}, repeats=3)
    per_batch = len(forwards) / batches
    print(f"EAP: {len(result.edges)} edges, {per_batch:.0f} forwards per batch (one with a backward; target <= "
          f"{MAX_PASSES}), {seconds:.2f} s = {seconds / clean['clean forward'].median_s:.1f} clean forwards")
    if per_batch > MAX_PASSES:
        raise AssertionError(f"EAP made {per_batch} passes per batch > {MAX_PASSES}")
    return {"edges": len(result.edges), "passes_per_batch": per_batch, "seconds": seconds,
            "clean_forward_s": clean["clean forward"].median_s}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer smoke shape, every edge")
    parser.add_argument("--every", type=int, default=4, help="time every N-th head edge at the real shape (default 4)")
    parser.add_argument("--stack", type=int, default=8, help="edges resumed together along the batch, timed beside 1 (default 8)")
    args = parser.parse_args(argv)
    pin_threads(1)
    config, n_prompts, seq_len, every = (TINY_CONFIG, 8, 32, 1) if args.tiny else (BENCH_CONFIG, 16, 128, args.every)
    edges = bench_edges(config, n_prompts, seq_len, every, args.stack)
    eap = bench_eap(config, n_prompts, seq_len)
    return {"shape": "tiny" if args.tiny else "benchmark", "edges": edges, "eap": eap}


if __name__ == "__main__":
    main()
