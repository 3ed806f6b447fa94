"""Tiny Hugging Face models built from configs (nothing downloaded), weights drawn from a fixed
seed at a scale where attention patterns are far from uniform. All correct: the causal ones
must pass the audit, `bert` must pass as a declared encoder (with or without --bidirectional).

`attn_implementation`: transformers defaults to "sdpa" for these families; the `_eager` factories
ask for "eager" (softmax(q k^T) v written out in torch ops).
"""
from __future__ import annotations

import torch
import transformers

from leakzoo import N_EMBD, N_LAYER, VOCAB, seeded

CONTEXT = 16


def _randomise(model: torch.nn.Module) -> torch.nn.Module:
    """Every weight N(0, 0.15), norm gains 1 + N(0, 0.15): biases, norms and heads all matter."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            gain = param.ndim == 1 and name.endswith("weight")
            param.copy_(torch.randn(param.shape) * 0.15 + (1.0 if gain else 0.0))
    return model.eval()


def _gpt2(impl: str):
    seeded()
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=N_EMBD, n_layer=N_LAYER, n_head=4,
                                     bos_token_id=0, eos_token_id=0, attn_implementation=impl)
    return _randomise(transformers.GPT2LMHeadModel(config))


def _decoder(family: str, impl: str, **extra):
    seeded()
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[family]
    config = config_class(vocab_size=VOCAB, max_position_embeddings=CONTEXT, hidden_size=N_EMBD,
                          num_hidden_layers=N_LAYER, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=64, bos_token_id=0, eos_token_id=0, attn_implementation=impl, **extra)
    return _randomise(model_class(config))


def _neox(impl: str):
    seeded()
    config = transformers.GPTNeoXConfig(vocab_size=VOCAB, max_position_embeddings=CONTEXT, hidden_size=N_EMBD,
                                        num_hidden_layers=N_LAYER, num_attention_heads=4, intermediate_size=64,
                                        bos_token_id=0, eos_token_id=0, attn_implementation=impl)
    return _randomise(transformers.GPTNeoXForCausalLM(config))


def gpt2_eager():
    return _gpt2("eager")


def gpt2_sdpa():
    return _gpt2("sdpa")


def llama_eager():
    return _decoder("llama", "eager")


def llama_sdpa():
    return _decoder("llama", "sdpa")


def qwen2_sdpa():
    return _decoder("qwen2", "sdpa")


def mistral_sdpa():
    return _decoder("mistral", "sdpa", sliding_window=8)


def neox_eager():
    return _neox("eager")


def neox_sdpa():
    return _neox("sdpa")


def bert():
    seeded()
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=N_EMBD, num_hidden_layers=N_LAYER,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=CONTEXT,
                                     type_vocab_size=2, attn_implementation="sdpa")
    return _randomise(transformers.BertModel(config))
