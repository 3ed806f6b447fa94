"""The models and known answers that several test modules share (imported by name: tests/ is on sys.path)."""
import contextlib
from typing import Iterator

import pytest
import torch

import interp
from interp.models.config import GPTConfig
from interp.models.gpt import HookedGPT

# the hand-set circuit's edges (interp.models.constructed.induction_circuit): L0H0's value reads the token
# (its query and key read positions, which resampling leaves equal), L1H0's query and value read the token,
# its key reads L0H0's `prev`, and only L1H0 writes to `out`, which the unembedding reads
INDUCTION_EDGES = {"embed -> L0H0 via v", "L0H0 -> L1H0 via k", "embed -> L1H0 via q", "embed -> L1H0 via v",
                   "L1H0 -> logits"}


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight random (norm gains around one), so biases, norms and heads all matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * 0.15
            gain = param.ndim == 1 and name.endswith("weight") and "embed" not in name
            param.copy_(noise + 1.0 if gain else noise)
    return model.eval()


CONSTRUCTED_VOCAB = 64  # the constructed models' default vocabulary (interp.models.constructed); BOS is 63


def induction_prompts(n: int = 16) -> interp.PromptSet:
    """Repeated random tokens for the constructed circuits: BOS, 10 tokens, the same 10 again."""
    return interp.data.repeated_tokens(n, 10, CONSTRUCTED_VOCAB - 1, bos=CONSTRUCTED_VOCAB - 1)


GROUPED_INDUCTION_EDGES = {"embed -> L0KV0 via v", "L0H0 -> L1KV0 via k", "embed -> L1H0 via q", "embed -> L1KV0 via v",
                           "L1H0 -> logits"}


def grouped_induction_circuit() -> HookedGPT:
    """The constructed induction circuit with grouped-query attention (2 key/value heads, groups of 2): key/value
    head g is head 2g's, and every head but L0H0 and L1H0 writes nothing (W_O = 0), so the truth is
    `GROUPED_INDUCTION_EDGES` (INDUCTION_EDGES with the key and value inputs named by L0KV0 / L1KV0). L1H1 reads
    L1KV0 too: a query head that shares the induction head's key input."""
    import dataclasses

    from interp.models import constructed

    plain = constructed.induction_circuit()
    grouped = HookedGPT(dataclasses.replace(plain.cfg, n_key_value_heads=2)).eval()
    state = {}
    for name, tensor in plain.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("W_K", "W_V", "b_K", "b_V"):
            name, tensor = name[: -len(leaf)] + "_" + leaf, tensor[0::2]  # kv head g = head 2g
        elif leaf == "W_O":
            tensor = tensor.clone()
            tensor[1:] = 0
        state[name] = tensor
    grouped.load_state_dict(state)
    return grouped


def period3_prompts(n: int = 16) -> interp.PromptSet:
    """Period-3 prompts for the V-composition circuit: BOS and 3 tokens repeated 6 times."""
    return interp.data.repeated_tokens(n, 3, CONSTRUCTED_VOCAB - 1, bos=CONSTRUCTED_VOCAB - 1, n_repeats=6)


def random_gpt(normalization_type="LN", seed: int = 0, **overrides) -> HookedGPT:
    """A small random model whose norm gains and biases are random too, so every term of the maths matters."""
    cfg = GPTConfig(n_layers=3, n_heads=2, d_model=12, d_head=4, n_ctx=16, d_vocab=20, d_mlp=16,
                    normalization_type=normalization_type, seed=seed, **overrides)
    model = HookedGPT(cfg).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".w"):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith((".b", "b_O", "b_out", "b_U", "b_Q", "b_K", "b_V", "b_in")):
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def converted_hf(family: str) -> HookedGPT:
    """A converted Hugging Face model with random weights (`randomise`, as the conversion tests), offline:
    "gpt2" (LayerNorm with gain and bias, learned positions, MLP biases) or "llama" (RMSNorm, rotary, gated MLP,
    grouped-query attention: 6 query heads, 2 kv heads)."""
    transformers = pytest.importorskip("transformers")
    from interp.models.convert import convert_model

    if family == "gpt2":
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=24,
                                                                  n_layer=2, n_head=3))
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=50, max_position_embeddings=32, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, intermediate_size=40, attention_bias=True))
    return convert_model(randomise(hf, 0)).eval()


@contextlib.contextmanager
def ablating(model: torch.nn.Module, heads, kind: str = "mean", *, reference=None, site: str = "z", seed: int = 0,
            prompts=None) -> Iterator[torch.nn.Module]:
    """A forward by hand with heads ablated, the oracle Run's numbers are checked against: `HeadAblation`'s
    hooks (what `interp.ablate` did before it was removed), removed on exit."""
    from interp.interventions import HeadAblation

    with interp.hooked(model, HeadAblation(heads, kind, site).hooks(model, reference, seed, prompts=prompts)):
        yield model
