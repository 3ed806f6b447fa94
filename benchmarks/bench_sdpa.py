"""Benchmark: SDPA interception (`interp.hook_sdpa`) against the model it intercepts and against HookedGPT.

Shape: bench_forward's (4 layers, d_model 256, 8 heads, vocab 5,000, MLPs of 1,024) at
batch 16 x 128 tokens, random weights, eval mode, `torch.no_grad()`, interleaved rounds.

Candidates:
- nanoGPT-style: a plain nanoGPT-layout model (fused `c_attn`, `F.scaled_dot_product_attention`
  with `is_causal=True`), not intercepted;
- intercepted, no hooks: the same model after `hook_sdpa` with no hook live (targets <= 1.05x
  of the plain model: the model's own forward runs, no mode is entered);
- intercepted, attention cache / pattern cache: `run_with_cache` of every attention hook of
  every site (q, k, v, attn_scores, pattern, z, result) / of `hook_pattern` only;
- HookedGPT, no hooks / attention cache / pattern cache: the same weights converted with
  `interp.models.nanogpt.from_nanogpt` (checked to give the same logits), HookedGPT's own hooks.
The cache comparison: intercepted attention cache / HookedGPT attention cache (target 1.05x),
beside each model's own cache / no-hooks ratio.

Then the equality figures: max abs logit difference of each intercepted model (the nanoGPT
layout above, a small random Hugging Face GPT-2 and Llama with grouped-query attention, both
in SDPA mode) from the model itself, with no hook live and with every attention hook cached;
and of the nanoGPT weights converted into HookedGPT.

Run: `python -m benchmarks sdpa` (about a minute on a quiet machine). BENCH_THREADS (2),
BENCH_REPEATS (5), BENCH_BUDGET_S (90) as in bench_forward.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import Ratio, interleaved, pin_threads, print_table

BATCH, SEQ = 16, 128
ARGS = dict(n_layer=4, n_head=8, n_embd=256, block_size=128, vocab_size=5000, bias=True, dropout=0.0)
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "90"))


class _Attention(nn.Module):
    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.c_attn, self.c_proj, self.n_head = nn.Linear(width, 3 * width), nn.Linear(width, width), n_head

    def forward(self, x):
        batch, n_pos, width = x.shape
        q, k, v = (t.view(batch, n_pos, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(width, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, head, pos, d_head)
        return self.c_proj(y.transpose(1, 2).reshape(batch, n_pos, width))


class _Block(nn.Module):
    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(width), _Attention(width, n_head), nn.LayerNorm(width)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(width, 4 * width), c_proj=nn.Linear(4 * width, width)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class NanoLayoutGPT(nn.Module):
    """nanoGPT's module layout and state-dict keys, flash path only."""

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, **_):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(_Block(n_embd, n_head) for _ in range(n_layer)), ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _attention_names(model) -> tuple[list[str], list[str]]:
    from interp.hooks import attention_sites

    sites = attention_sites(model)
    return [name for site in sites for name in site.hooks.values()], [site.hook("pattern") for site in sites]


def check_same_caches(first, first_names: list[str], second, second_names: list[str]) -> None:
    """The two attention caches compared hold the same hooks (role by role, in site order), shapes and dtypes."""
    def layout(cache, names):
        return [(name.rsplit("hook_", 1)[-1], tuple(cache[name].shape), cache[name].dtype) for name in names]

    if layout(first, first_names) != layout(second, second_names):
        raise AssertionError(f"the caches differ: {layout(first, first_names)} vs {layout(second, second_names)}")


def build():
    """(plain, intercepted, hooked GPT, tokens): three models with one set of weights."""
    from interp.models.nanogpt import from_nanogpt
    from interp.sdpa import hook_sdpa

    torch.manual_seed(0)
    plain = NanoLayoutGPT(**ARGS).eval()
    for param in plain.parameters():
        nn.init.normal_(param, std=0.05)
    hooked_gpt = from_nanogpt(ARGS, plain.state_dict())
    intercepted = hook_sdpa(NanoLayoutGPT(**ARGS).eval())
    intercepted.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, ARGS["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = plain(tokens)
        for name, model in (("intercepted", intercepted), ("HookedGPT", hooked_gpt)):
            diff = (model(tokens) - reference).abs().max().item()
            assert diff < 1e-3, f"{name} logits differ from the plain model's by {diff}"
    return plain, intercepted, hooked_gpt, tokens


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _hf_models() -> dict[str, nn.Module]:
    """Small random GPT-2 and Llama (grouped-query) in SDPA mode, built offline."""
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=1000, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    gpt2 = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, **common)
    llama = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                                     intermediate_size=128, max_position_embeddings=64, pad_token_id=0, **common)
    return {"HF GPT-2 (sdpa)": transformers.GPT2LMHeadModel(gpt2).eval(),
            "HF Llama GQA (sdpa)": transformers.LlamaForCausalLM(llama).eval()}


def equality_figures(plain, intercepted, hooked_gpt, tokens) -> list[dict]:
    """Max abs logit differences: intercepted (no hook / every attention hook cached) vs the model itself,
    and the nanoGPT-layout weights converted into HookedGPT vs the original."""
    import copy

    from interp.hooks import attention_sites
    from interp.sdpa import hook_sdpa

    rows = []
    models = {"nanoGPT layout": (plain, intercepted, tokens)}
    for name, model in _hf_models().items():
        models[name] = (model, hook_sdpa(copy.deepcopy(model)), tokens[:4, :64] % 1000)
    with torch.no_grad():
        for name, (original, hooked, x) in models.items():
            reference = original(x)
            reference = getattr(reference, "logits", reference)
            names = [n for site in attention_sites(hooked) for n in site.hooks.values()]
            out, _ = hooked.run_with_cache(x, names_filter=names)
            no_hook = hooked(x)
            rows.append({"model": name, "no hook": _max_diff(getattr(no_hook, "logits", no_hook), reference),
                         "attention cache": _max_diff(getattr(out, "logits", out), reference),
                         "logit scale": reference.abs().max().item()})
        rows.append({"model": "nanoGPT layout -> HookedGPT (from_nanogpt)", "no hook": _max_diff(hooked_gpt(tokens), plain(tokens)),
                     "attention cache": float("nan"), "logit scale": plain(tokens).abs().max().item()})
    return rows


def _print_equality(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Logits equality: max abs difference from the original model")
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in rows:
        table.add_row(row["model"], *(f"{row[c]:.2e}" for c in list(row)[1:]))
    Console().print(table)


def main() -> list[dict]:
    threads = pin_threads()
    plain, intercepted, hooked_gpt, tokens = build()
    every, patterns = _attention_names(intercepted)
    gpt_every, gpt_patterns = _attention_names(hooked_gpt)
    with torch.no_grad():
        logits, theirs = intercepted.run_with_cache(tokens, names_filter=every)
        equal = (logits - plain(tokens)).abs().max().item()
        _, ours = hooked_gpt.run_with_cache(tokens, names_filter=gpt_every)
    check_same_caches(theirs, every, ours, gpt_every)
    candidates = {
        "nanoGPT-style": lambda: plain(tokens),
        "intercepted, no hooks": lambda: intercepted(tokens),
        "intercepted, attention cache": lambda: intercepted.run_with_cache(tokens, names_filter=every),
        "intercepted, pattern cache": lambda: intercepted.run_with_cache(tokens, names_filter=patterns),
        "HookedGPT, no hooks": lambda: hooked_gpt(tokens),
        "HookedGPT, attention cache": lambda: hooked_gpt.run_with_cache(tokens, names_filter=gpt_every),
        "HookedGPT, pattern cache": lambda: hooked_gpt.run_with_cache(tokens, names_filter=gpt_patterns),
    }
    with torch.no_grad():
        timings = interleaved(candidates, repeats=REPEATS, budget_s=BUDGET_S)
    ratios = [
        Ratio("intercepted no hooks / nanoGPT-style", "intercepted, no hooks", "nanoGPT-style", 1.05),
        Ratio("intercepted attention cache / HookedGPT attention cache", "intercepted, attention cache",
              "HookedGPT, attention cache", 1.05),
        Ratio("intercepted pattern cache / HookedGPT pattern cache", "intercepted, pattern cache", "HookedGPT, pattern cache"),
        Ratio("intercepted attention cache / intercepted no hooks", "intercepted, attention cache", "intercepted, no hooks"),
        Ratio("HookedGPT attention cache / HookedGPT no hooks", "HookedGPT, attention cache", "HookedGPT, no hooks"),
    ]
    notes = [f"{threads} threads, batch {BATCH} x {SEQ}, {ARGS}; attention-cache logits vs the plain model: "
             f"max abs diff {equal:.2e}"]
    rows = print_table("SDPA interception", timings, ratios, tokens_per_call=BATCH * SEQ, notes=notes)
    _print_equality(equality_figures(plain, intercepted, hooked_gpt, tokens))
    return rows


if __name__ == "__main__":
    main()
