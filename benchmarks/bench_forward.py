"""Benchmark: the forward pass of HookedGPT against a plain PyTorch GPT and TransformerLens's bridge.

Shape (issue 2): batch 32 x 128 tokens, 4 layers, d_model 256, 8 heads, vocab 5,000, MLPs
of width 1,024, LayerNorm, GELU; random weights (speed does not depend on what they learned).

Candidates, all in eval mode under `torch.no_grad()`, timed in interleaved rounds (medians):
- plain GPT: the same weights in a plain module with fused qkv matrices and
  `F.scaled_dot_product_attention(is_causal=True)` (checked to give the same logits);
- HookedGPT, no hooks (the fused SDPA path);
- HookedGPT, attention cache: `run_with_cache` of every attention hook (q, k, v, attn_scores,
  pattern, z, result at every layer), which forces the explicit path;
- HookedGPT, pattern cache: only `hook_pattern` at every layer;
- bridge: `TransformerBridge.boot_native` of the same shape (its own random weights), with no
  hooks and with every attention hook it exposes (q, k, v, attn_scores, pattern, z: it has
  no per-head result without `use_attn_result`).

Targets (issue 26), with the default allocator: no hooks / plain <= 1.05, attention cache / no hooks
<= 1.15, ours / bridge (both caching attention) <= 0.9. `run_with_cache` reaches them without
tuning glibc: on CPU without autograd it writes the attention tensors into ones kept from the
previous call (`interp.models.components.BufferPool`), so a loop of caches stops faulting in
fresh pages; the first call of a shape still does.

The timings are then repeated in a child process with glibc told to keep freed blocks
(`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`): a full attention cache holds tensors of
32 MiB a layer, above glibc's mmap threshold, so by default every forward maps and faults in
fresh pages; that, not the arithmetic, is most of what the cache costs here.

Peak memory: a fresh subprocess builds the model and the batch, runs a one-sequence warm-up,
resets its peak RSS (Linux `clear_refs`), runs one forward and reads the peak RSS since the
reset (`VmHWM`); growth = that peak minus the RSS before the forward: what the forward needed,
the logits and the cache included (the cache's own tensor bytes are shown beside it).

Run: `python -m benchmarks forward`: about a minute on a quiet machine. BENCH_THREADS sets the
threads (2), BENCH_REPEATS the rounds (5); after BENCH_BUDGET_S seconds (90) of timing, rounds
stop once 3 are done, so a loaded machine takes about 2-3 minutes, with noisier figures.
"""
from __future__ import annotations

import os
import subprocess
import sys

import einops
import torch
import torch.nn.functional as F
from torch import nn

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

BATCH, SEQ = 32, 128
SHAPE = dict(n_layers=4, d_model=256, n_heads=8, d_vocab=5000, n_ctx=128, d_mlp=1024, seed=0)
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "90"))  # fewer rounds (>= 3) when the machine is slow


class PlainGPT(nn.Module):
    """A plain PyTorch GPT (nanoGPT-style fused qkv, SDPA) holding a HookedGPT's weights."""

    def __init__(self, hooked):
        super().__init__()
        cfg = hooked.cfg
        self.n_heads, self.eps = cfg.n_heads, cfg.layer_norm_eps
        self.W_E = hooked.embed.W_E.detach().clone()
        self.W_pos = hooked.pos_embed.W_pos.detach().clone()
        self.layers = []
        for block in hooked.blocks:
            attn = block.attn
            w_qkv = torch.cat([einops.rearrange(w.detach(), "head d_model d_head -> d_model (head d_head)")
                               for w in (attn.W_Q, attn.W_K, attn.W_V)], dim=1)
            b_qkv = torch.cat([b.detach().flatten() for b in (attn.b_Q, attn.b_K, attn.b_V)])
            w_o = einops.rearrange(attn.W_O.detach(), "head d_head d_model -> (head d_head) d_model")
            self.layers.append(dict(
                ln1=(block.ln1.w.detach(), block.ln1.b.detach()), w_qkv=w_qkv.contiguous(), b_qkv=b_qkv,
                w_o=w_o.contiguous(), b_o=attn.b_O.detach(), ln2=(block.ln2.w.detach(), block.ln2.b.detach()),
                w_in=block.mlp.W_in.detach(), b_in=block.mlp.b_in.detach(),
                w_out=block.mlp.W_out.detach(), b_out=block.mlp.b_out.detach(),
            ))
        self.ln_final = (hooked.ln_final.w.detach(), hooked.ln_final.b.detach())
        self.W_U, self.b_U = hooked.unembed.W_U.detach(), hooked.unembed.b_U.detach()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, n_pos = tokens.shape
        d_model = self.W_E.shape[1]
        x = self.W_E[tokens] + self.W_pos[:n_pos]  # (batch, pos, d_model)
        for p in self.layers:
            h = F.layer_norm(x, (d_model,), *p["ln1"], eps=self.eps)
            q, k, v = (h @ p["w_qkv"] + p["b_qkv"]).split(d_model, dim=-1)
            q, k, v = (t.view(batch, n_pos, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))  # (batch, head, pos, d_head)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, n_pos, -1)
            x = x + z @ p["w_o"] + p["b_o"]
            h = F.layer_norm(x, (d_model,), *p["ln2"], eps=self.eps)
            x = x + F.gelu(h @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]
        return F.layer_norm(x, (d_model,), *self.ln_final, eps=self.eps) @ self.W_U + self.b_U


def build():
    """HookedGPT of the benchmark shape, its plain twin, the bridge, and a batch of tokens."""
    from transformer_lens.model_bridge import TransformerBridge

    from interp.hooks import attention_sites
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(**SHAPE)).eval()
    bridge = TransformerBridge.boot_native(model.cfg.to_bridge_config()).eval()
    tokens = torch.randint(0, SHAPE["d_vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    ours = {name for site in attention_sites(model) for name in site.hooks.values()}
    theirs = {name for site in attention_sites(bridge) for name in site.hooks.values()}
    return model, PlainGPT(model), bridge, tokens, ours, theirs


def memory_probe(mode: str) -> dict:
    """Run in a fresh process by `peak_rss_mb`: one forward of the given mode."""
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    from interp.hooks import attention_sites
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(**SHAPE)).eval()
    tokens = torch.randint(0, SHAPE["d_vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    names = {name for site in attention_sites(model) for name in site.hooks.values()}
    with torch.no_grad():
        model(tokens[:1])  # first-call allocations (thread pools, kernels) are not the step's
    reset = reset_peak_rss()
    before = current_rss_mb()
    cache_bytes = 0
    with torch.no_grad():
        if mode == "no_hooks":
            logits = model(tokens)
        elif mode == "attention_cache":
            logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
            cache_bytes = sum(t.numel() * t.element_size() for t in cache.values())
        else:
            raise ValueError(f"mode={mode!r}; expected 'no_hooks' or 'attention_cache'.")
    return {"rss_before_mb": before, "step_peak_mb": peak_rss_since_reset_mb(), "peak_was_reset": reset,
            "cache_mb": cache_bytes / 2**20, "logits_mb": logits.numel() * logits.element_size() / 2**20}


MALLOC_KEEP = {"MALLOC_MMAP_THRESHOLD_": "2000000000", "MALLOC_TRIM_THRESHOLD_": "4000000000"}


def main(argv: list[str] | None = None) -> list[dict]:
    """Timings and ratios, then the same timings with glibc keeping freed blocks, then memory."""
    timing_only = bool(argv) and "--timing-only" in argv
    tuned = bool(argv) and "--tuned-allocator" in argv
    if tuned:
        from interp.launch import tune_allocator

        tune_allocator()
    rows = time_forward(title="forward pass" + (" (glibc malloc keeping freed blocks)" if timing_only and not tuned else "")
                        + (" (allocator tuned in-process by interp.launch.tune_allocator, as the CLI does)" if tuned else ""))
    if timing_only:
        return rows
    # Large activations (the per-head result is 32 MiB a layer here) are above glibc's mmap
    # threshold, so every forward maps fresh pages and faults them in: that, not the arithmetic,
    # is most of what a full cache costs on this CPU. Show it by re-timing in a child process.
    subprocess.run([sys.executable, "-m", "benchmarks.bench_forward", "--timing-only"],
                   env={**os.environ, **MALLOC_KEEP}, check=True)
    # what every `interp` command now does at start (mallopt, no environment variables needed)
    subprocess.run([sys.executable, "-m", "benchmarks.bench_forward", "--timing-only", "--tuned-allocator"],
                   env=os.environ, check=True)
    return rows + memory_table()


def time_forward(title: str) -> list[dict]:
    threads = pin_threads()
    model, plain, bridge, tokens, ours, theirs = build()
    with torch.no_grad():
        difference = (plain(tokens) - model(tokens)).abs().max().item()
    if difference > 1e-3:
        raise RuntimeError(f"the plain GPT does not reproduce HookedGPT (max logit difference {difference:.2e}).")

    def cached(m, names):
        return lambda: m.run_with_cache(tokens, names_filter=lambda n: n in names)

    patterns = {n for n in ours if n.endswith("hook_pattern")}
    shared_roles = {n for n in ours if not n.endswith("hook_result")}  # the roles the bridge exposes
    candidates = {
        "plain GPT (SDPA)": lambda: plain(tokens),
        "HookedGPT, no hooks": lambda: model(tokens),
        "HookedGPT, attention cache": cached(model, ours),
        "HookedGPT, pattern cache": cached(model, patterns),
        "HookedGPT, bridge's roles cache": cached(model, shared_roles),
        "bridge, no hooks": lambda: bridge(tokens),
        "bridge, attention cache": cached(bridge, theirs),
    }
    with torch.no_grad():
        timings = interleaved(candidates, repeats=REPEATS, warmup=1, budget_s=BUDGET_S)
    ratios = [
        Ratio("HookedGPT no hooks / plain GPT", "HookedGPT, no hooks", "plain GPT (SDPA)", 1.05),
        Ratio("HookedGPT attention cache / no hooks", "HookedGPT, attention cache", "HookedGPT, no hooks", 1.15),
        Ratio("HookedGPT pattern cache / no hooks", "HookedGPT, pattern cache", "HookedGPT, no hooks"),
        Ratio("HookedGPT / bridge, no hooks", "HookedGPT, no hooks", "bridge, no hooks", 1.0),
        Ratio("HookedGPT / bridge, attention cache", "HookedGPT, attention cache", "bridge, attention cache", 0.9),
        Ratio("HookedGPT / bridge, same roles cached", "HookedGPT, bridge's roles cache", "bridge, attention cache", 1.0),
        Ratio("bridge no hooks / plain GPT", "bridge, no hooks", "plain GPT (SDPA)"),
    ]
    notes = [
        f"{BATCH} x {SEQ} tokens, {threads} threads, {len(next(iter(timings.values())).times_s)} interleaved "
        "repetitions after 1 warm-up; "
        f"plain vs HookedGPT logits agree to {difference:.1e}.",
        f"Attention cache: ours {len(ours)} hooks (7 roles x 4 layers, per-head result included); "
        f"bridge {len(theirs)} hooks (no per-head result).",
    ]
    return print_table(title, timings, ratios, tokens_per_call=BATCH * SEQ, notes=notes)


def memory_table() -> list[dict]:
    rows = []
    memory = {mode: peak_rss_mb("benchmarks.bench_forward", "memory_probe", mode) for mode in ("no_hooks", "attention_cache")}
    from rich.console import Console
    from rich.table import Table

    table = Table(title="memory of one HookedGPT forward, 32 x 128 (fresh process each)")
    for column in ("forward", "RSS before", "peak during forward", "growth", "cache tensors", "logits"):
        table.add_column(column + (" MiB" if column != "forward" else ""), justify="right" if column != "forward" else "left")
    for mode, figures in memory.items():
        growth = figures["step_peak_mb"] - figures["rss_before_mb"]
        table.add_row(mode, f"{figures['rss_before_mb']:.0f}", f"{figures['step_peak_mb']:.0f}", f"{growth:.0f}",
                      f"{figures['cache_mb']:.0f}", f"{figures['logits_mb']:.0f}")
        rows.append({"comparison": f"peak RSS growth, {mode}", "ratio": None, "target": None, "met": None,
                     "mib": growth, "cache_mib": figures["cache_mb"]})
    Console().print(table)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
