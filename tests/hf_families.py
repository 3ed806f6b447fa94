"""Every family the native converter supports, as a small Hugging Face model with random weights, converted
offline (`converted(family)`): GPT-2, GPT-NeoX with partial rotary and parallel or sequential blocks, Llama with
biases and grouped-query attention, Mistral with a sliding window, Qwen2, Gemma (multi-query, wide heads),
Phi-3 (partial rotary, window). Three layers each, so a last-layer head reads heads, MLPs and biases."""
import pytest
import torch
from factories import randomise

VOCAB, N_CTX = 50, 32


def _neox(transformers, rotary: float, parallel: bool):
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=VOCAB, max_position_embeddings=N_CTX, hidden_size=40, num_hidden_layers=3, num_attention_heads=5,
        intermediate_size=56, use_parallel_residual=parallel, attention_bias=True,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": rotary, "rope_type": "default"}))


def _llama_like(transformers, kind: str, heads: int, kv: int):
    common = dict(vocab_size=VOCAB, max_position_embeddings=N_CTX, hidden_size=heads * 8, num_hidden_layers=3,
                  num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=40,
                  rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attention_bias=True, mlp_bias=True))
    if kind == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=4))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if kind == "gemma":
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(**common, head_dim=10, attention_bias=True))
    common["rope_parameters"]["partial_rotary_factor"] = 0.5
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**common, sliding_window=5, pad_token_id=0,
                                                                eos_token_id=0))


FAMILIES = {
    "gpt2": lambda t: t.GPT2LMHeadModel(t.GPT2Config(vocab_size=VOCAB, n_positions=N_CTX, n_embd=24, n_layer=3,
                                                     n_head=3)),
    "neox-partial-rotary-parallel": lambda t: _neox(t, 0.25, parallel=True),
    "neox-half-rotary-sequential": lambda t: _neox(t, 0.5, parallel=False),
    "llama-gqa-biases": lambda t: _llama_like(t, "llama", 6, 2),
    "mistral-gqa-window": lambda t: _llama_like(t, "mistral", 6, 3),
    "qwen2-gqa": lambda t: _llama_like(t, "qwen2", 3, 1),
    "gemma-mqa": lambda t: _llama_like(t, "gemma", 3, 1),
    "phi3-gqa-partial-rotary-window": lambda t: _llama_like(t, "phi3", 4, 2),
}


def converted(family: str):
    """A converted Hugging Face model of `family` with random weights (norm gains around one, biases nonzero)."""
    transformers = pytest.importorskip("transformers")
    from interp.models.convert import convert_model

    torch.manual_seed(0)
    return convert_model(randomise(FAMILIES[family](transformers), seed=len(family))).eval()
