"""What the contract zoos (`packed`, `kvcache`, `windows`, `backends`) share: a tiny modern decoder
(RMS norms, rotary positions, an MLP) in the Hugging Face manner, whose attention each zoo module
writes itself, so that every line building a mask, choosing a kernel or touching a cache, the lines
that carry the bugs, lives in the zoo file that marks it (`# BUG:` / `# SITE:`).

Conventions used by all four zoos:
- `allowed` is a boolean (batch, 1, query, key) tensor, True where a query may read a key;
- a window W counts the keys a query sees including itself: key j is visible from query i iff
  i - W < j <= i (the convention of `transformers`' `sliding_window` and `GPTConfig.window_size`);
- the end-of-document token is `EOS`; nothing else is special.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from leakzoo import N_EMBD, N_LAYER, VOCAB, seeded

EOS = 1
N_HEAD = 4
CONTEXT = 64


@dataclass
class Config:
    """A Hugging Face-like config: the field names `transformers` uses, so readers of the model find them."""

    vocab_size: int = VOCAB
    hidden_size: int = N_EMBD
    num_hidden_layers: int = N_LAYER
    num_attention_heads: int = N_HEAD
    max_position_embeddings: int = CONTEXT
    rope_theta: float = 10000.0
    eos_token_id: int = EOS
    sliding_window: int | None = None  # keys a windowed query sees, itself included
    layer_types: list[str] = field(default_factory=list)  # "sliding_attention" | "full_attention" per layer
    attention_chunk_size: int | None = None  # chunked local attention (Llama 4 style): same chunk only
    attn_implementation: str = "sdpa"  # "eager" | "sdpa" | "flex_attention"
    use_cache: bool = False
    is_decoder: bool = True

    def __post_init__(self) -> None:
        if not self.layer_types:
            kind = "full_attention" if self.sliding_window is None else "sliding_attention"
            self.layer_types = [kind] * self.num_hidden_layers


@dataclass
class LMOutput:
    """What a Hugging Face causal LM returns, reduced to the two fields the contracts read."""

    logits: torch.Tensor  # (batch, pos, vocab)
    past_key_values: object = None


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate-half rotary embedding of x (batch, head, pos, d_head) at positions (batch, pos)."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, dtype=x.dtype, device=x.device) / half)  # (half,)
    angle = positions[:, None, :, None].to(x.dtype) * freq  # (batch, 1, pos, half)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * angle.cos() - second * angle.sin(), first * angle.sin() + second * angle.cos()], dim=-1)


def causal(n_query: int, n_key: int, device: torch.device | None = None) -> torch.Tensor:
    """(query, key) bool, aligned bottom-right: the queries are the last `n_query` of `n_key` positions."""
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).tril(diagonal=n_key - n_query)


def same_document(document: torch.Tensor, n_key: int | None = None) -> torch.Tensor:
    """(batch, 1, query, key) bool from document ids (batch, pos): True where query and key share a document."""
    keys = document if n_key is None else document[:, -n_key:]
    return (document[:, :, None] == keys[:, None, :])[:, None]


def documents_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """Document ids (batch, pos) from position ids that restart at 0 where a document starts."""
    return (position_ids == 0).long().cumsum(-1)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 2 * width, bias=False)
        self.down = nn.Linear(2 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Projections(nn.Module):
    """q, k, v with rotary positions, and the output projection; the zoo's attention classes subclass it
    and write `forward` (mask, kernel and cache) themselves."""

    def __init__(self, config: Config, layer_idx: int):
        super().__init__()
        width = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(width, width, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(width, width, bias=False)
        self.n_heads = config.num_attention_heads
        self.layer_idx = layer_idx
        self.config = config

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (batch, pos, width), positions (batch, pos) -> q, k, v each (batch, head, pos, d_head)."""
        batch, n_pos, width = x.shape
        q, k, v = (p(x).view(batch, n_pos, self.n_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        theta = self.config.rope_theta
        return rotary(q, positions, theta), rotary(k, positions, theta), v

    def merge(self, z: torch.Tensor) -> torch.Tensor:
        """z (batch, head, pos, d_head) -> (batch, pos, width) through the output projection."""
        batch, _, n_pos, _ = z.shape
        return self.o_proj(z.transpose(1, 2).reshape(batch, n_pos, -1))


class Layer(nn.Module):
    def __init__(self, config: Config, attention: type[nn.Module], layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size)
        self.self_attn = attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size)
        self.mlp = MLP(config.hidden_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, allowed, cache=None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, allowed, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embedding, layers, final norm and head; `run` takes the mask (one, or one per layer) the subclass built."""

    def __init__(self, config: Config, attention: type[nn.Module]):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Layer(config, attention, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, allowed, cache=None) -> torch.Tensor:
        """Logits (batch, pos, vocab); `allowed` is one mask for every layer or a list with one per layer."""
        masks = allowed if isinstance(allowed, list) else [allowed] * len(self.layers)
        x = self.embed_tokens(input_ids)
        for layer, mask in zip(self.layers, masks):
            x = layer(x, positions, mask, cache)
        return self.lm_head(self.norm(x))


def randomise(model: nn.Module, std: float = 0.3) -> nn.Module:
    """Fixed random weights N(0, std) (norm gains 1 + N(0, std)), sharp enough that every visible key matters."""
    seeded()
    with torch.no_grad():
        for name, param in model.named_parameters():
            gain = name.endswith("norm.weight") or name.endswith("layernorm.weight")
            param.copy_(torch.randn(param.shape) * std + (1.0 if gain else 0.0))
    return model.eval()


# ---------------------------------------------------------------------------------------------
# nanoGPT style: fused `c_attn`, learned positions `wpe`, `forward(idx, targets=None)` -> (logits, loss)
# ---------------------------------------------------------------------------------------------

@dataclass
class GPTConfig:
    block_size: int = CONTEXT
    vocab_size: int = VOCAB
    n_layer: int = N_LAYER
    n_head: int = N_HEAD
    n_embd: int = N_EMBD
    window_size: int | None = None  # keys a query sees, itself included (None: every earlier key)
    attn_impl: str = "sdpa"  # "eager" | "sdpa" | "flex_attention"
    eot_token: int = EOS


class NanoAttention(nn.Module):
    """nanoGPT's fused projections; the zoo's attention classes subclass it and write `forward`."""

    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.layer_idx = layer_idx
        self.config = config

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q, k, v each (B, nh, T, hs)."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        return tuple(t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = y.size()
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, self.n_embd))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention: type[nn.Module], layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config.n_embd)

    def forward(self, x: torch.Tensor, allowed, cache=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), allowed, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The nanoGPT skeleton; `run` takes the mask the subclass built and the cache list (one entry per layer)."""

    def __init__(self, config: GPTConfig, attention: type[nn.Module]):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config, attention, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def run(self, idx: torch.Tensor, pos: torch.Tensor, allowed, cache: list | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) for tokens idx (B, T) at positions pos (T,)."""
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for i, block in enumerate(self.transformer.h):
            x = block(x, allowed, None if cache is None else cache[i])
        return self.lm_head(self.transformer.ln_f(x))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor | None:
        if targets is None:
            return None
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
