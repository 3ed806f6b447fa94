"""Users' own models, written as a user would write them, for the tests and the CLI
(`interp report own_models:encoder_lm` with tests/ on PYTHONPATH).

- `NanoStyleGPT`: a GPT in the style of nanoGPT (fused `c_attn`, `c_proj`, weight-tied head,
  `block_size`), whose attention takes either the fused kernel (`flash=True`,
  `F.scaled_dot_product_attention`) or the hand-written path (`flash=False`).
- `EncoderLM`: a causal language model on `nn.TransformerEncoder` with a causal mask.
- `DirectSDPA`: one module calling `scaled_dot_product_attention` (imported by name) itself.
- `RotaryGPT` (`rotary_gpt_trained()`): a nanoGPT fork as modded-nanogpt writes them (nanoGPT's module names,
  rotary positions instead of `wpe`, an untied head), attention-only, carrying the trained weights of the shipped
  `toy-induction` checkpoint (trained on varied-length repeats): a user's own model with real induction heads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import scaled_dot_product_attention


@dataclass
class NanoArgs:
    """nanoGPT's `model_args`: the keys its checkpoints store."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    block_size: int = 32
    vocab_size: int = 61
    bias: bool = True
    dropout: float = 0.0


class NanoAttention(nn.Module):
    def __init__(self, args: NanoArgs, flash: bool):
        super().__init__()
        self.c_attn = nn.Linear(args.n_embd, 3 * args.n_embd, bias=args.bias)
        self.c_proj = nn.Linear(args.n_embd, args.n_embd, bias=args.bias)
        self.attn_dropout = nn.Dropout(args.dropout)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.n_head, self.n_embd, self.dropout = args.n_head, args.n_embd, args.dropout
        self.flash = flash
        if not flash:
            lower = torch.tril(torch.ones(args.block_size, args.block_size))
            self.register_buffer("bias", lower.view(1, 1, args.block_size, args.block_size))

    def forward(self, x):
        batch, n_pos, width = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        heads = lambda t: t.view(batch, n_pos, self.n_head, width // self.n_head).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)  # (batch, head, pos, d_head)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :n_pos, :n_pos] == 0, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(batch, n_pos, width)
        return self.resid_dropout(self.c_proj(y))


class NanoBlock(nn.Module):
    def __init__(self, args: NanoArgs, flash: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.n_embd, bias=args.bias)
        self.attn = NanoAttention(args, flash)
        self.ln_2 = nn.LayerNorm(args.n_embd, bias=args.bias)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(args.n_embd, 4 * args.n_embd, bias=args.bias),
            gelu=nn.GELU(),
            c_proj=nn.Linear(4 * args.n_embd, args.n_embd, bias=args.bias),
            dropout=nn.Dropout(args.dropout),
        ))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        m = self.mlp
        return x + m.dropout(m.c_proj(m.gelu(m.c_fc(self.ln_2(x)))))


class NanoStyleGPT(nn.Module):
    """nanoGPT's layout: transformer.wte / wpe / h.{l} / ln_f, lm_head tied to wte."""

    def __init__(self, args: NanoArgs | None = None, flash: bool = True, seed: int = 0):
        super().__init__()
        self.config = args = args or NanoArgs()
        torch.manual_seed(seed)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(args.vocab_size, args.n_embd),
            wpe=nn.Embedding(args.block_size, args.n_embd),
            drop=nn.Dropout(args.dropout),
            h=nn.ModuleList(NanoBlock(args, flash) for _ in range(args.n_layer)),
            ln_f=nn.LayerNorm(args.n_embd, bias=args.bias),
        ))
        self.lm_head = nn.Linear(args.n_embd, args.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        for name, param in self.named_parameters():  # larger than nanoGPT's 0.02, so heads differ visibly
            if param.dim() == 2:
                nn.init.normal_(param, std=0.2)
            elif name.endswith("bias"):
                nn.init.normal_(param, std=0.02)

    def forward(self, idx):
        n_pos = idx.size(1)
        pos = torch.arange(0, n_pos, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


class EncoderLM(nn.Module):
    """A causal LM built on nn.TransformerEncoder: token + position embeddings, causal mask, Linear head."""

    def __init__(self, vocab: int = 53, d_model: int = 32, n_heads: int = 4, n_layers: int = 2, n_ctx: int = 48, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(n_ctx, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        n_pos = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(n_pos, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(n_pos, device=tokens.device)
        return self.head(self.encoder(x, mask=mask, is_causal=True))


class DirectSDPA(nn.Module):
    """A one-layer causal LM whose root module calls scaled_dot_product_attention itself,
    with a boolean mask and an explicit scale, output through `proj`."""

    def __init__(self, vocab: int = 37, d_model: int = 24, n_heads: int = 3, n_ctx: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(n_ctx, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.unembed = nn.Linear(d_model, vocab)
        self.n_heads = n_heads

    def forward(self, tokens):
        n_pos = tokens.shape[1]
        x = self.embed(tokens) + self.pos_embed(torch.arange(n_pos, device=tokens.device))
        q, k, v = (t.unflatten(-1, (self.n_heads, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device).tril()
        z = scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.3)
        x = x + self.proj(z.transpose(1, 2).flatten(2))
        return self.unembed(x)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) of q or k, (batch, head, pos, d_head): the pairs (i, i + d/2)
    turned by pos * 10000^(-i / (d/2)) (GPT-NeoX's halves convention)."""
    half, n_pos = x.shape[-1] // 2, x.shape[-2]
    angle = torch.arange(n_pos, device=x.device)[:, None] * 10000.0 ** (-torch.arange(half, device=x.device) / half)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)  # (pos, half)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class RotaryAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        q, k, v = (t.unflatten(-1, (self.n_head, -1)).transpose(1, 2) for t in self.c_attn(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)  # (batch, head, pos, d_head)
        return self.c_proj(y.transpose(1, 2).flatten(2))


class RotaryBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = RotaryAttention(n_embd, n_head)

    def forward(self, x):
        return x + self.attn(self.ln_1(x))


class RotaryGPT(nn.Module):
    """A nanoGPT fork as modded-nanogpt writes them: nanoGPT's names (transformer.wte / h.{l}.attn.c_attn, c_proj /
    ln_f, lm_head), rotary positions in place of `wpe`, an untied head; attention-only. No config object, nothing
    the toolkit knows: it is hooked by SDPA interception, and has no conversion (from_nanogpt needs `wpe`)."""

    def __init__(self, vocab_size: int = 256, n_embd: int = 64, n_head: int = 4, n_layer: int = 2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            h=nn.ModuleList(RotaryBlock(n_embd, n_head) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def rotary_gpt_trained() -> RotaryGPT:
    """A RotaryGPT with the weights of the shipped `toy-induction` checkpoint (a 2-layer attention-only model trained
    on repeated random tokens of varied prefix length, offset and BOS; safetensors + JSON), ported into the user's
    layout as a user ports weights: the same function (the same rotary convention) to 2e-5."""
    import einops

    from interp.loading import load

    source = load("toy-induction").state_dict()
    model = RotaryGPT(n_head=source["blocks.0.attn.W_Q"].shape[0])
    state = {"transformer.wte.weight": source["embed.W_E"], "transformer.ln_f.weight": source["ln_final.w"],
             "transformer.ln_f.bias": source["ln_final.b"], "lm_head.weight": source["unembed.W_U"].T,
             "lm_head.bias": source["unembed.b_U"]}
    for layer in range(len(model.transformer.h)):
        ours, theirs = f"transformer.h.{layer}.", f"blocks.{layer}."
        state[ours + "ln_1.weight"], state[ours + "ln_1.bias"] = source[theirs + "ln1.w"], source[theirs + "ln1.b"]
        state[ours + "attn.c_attn.weight"] = torch.cat([
            einops.rearrange(source[theirs + f"attn.W_{r}"], "head d_model d_head -> (head d_head) d_model") for r in "QKV"])
        state[ours + "attn.c_attn.bias"] = torch.cat([source[theirs + f"attn.b_{r}"].flatten() for r in "QKV"])
        state[ours + "attn.c_proj.weight"] = einops.rearrange(source[theirs + "attn.W_O"],
                                                              "head d_head d_model -> d_model (head d_head)")
        state[ours + "attn.c_proj.bias"] = source[theirs + "attn.b_O"]
    model.load_state_dict(state)
    return model.eval()


def nanogpt_flash() -> NanoStyleGPT:
    return NanoStyleGPT(flash=True).eval()


def nanogpt_manual() -> NanoStyleGPT:
    return NanoStyleGPT(flash=False).eval()


def encoder_lm() -> EncoderLM:
    return EncoderLM().eval()


def direct_sdpa() -> DirectSDPA:
    return DirectSDPA().eval()


class EinsumAttentionLM(nn.Module):
    """Attention by hand with einsum and an exp-normalisation of its own: neither an SDPA call nor the
    recognised q @ k^T / softmax / @ v form, so the toolkit can only audit it as a black box."""

    def __init__(self, vocab: int = 29, d_model: int = 16, n_heads: int = 2, n_ctx: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(n_ctx, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.unembed = nn.Linear(d_model, vocab)
        self.n_heads = n_heads

    def forward(self, tokens):
        n_pos = tokens.shape[1]
        x = self.embed(tokens) + self.pos_embed(torch.arange(n_pos, device=tokens.device))
        q, k, v = (t.unflatten(-1, (self.n_heads, -1)) for t in self.qkv(x).chunk(3, dim=-1))  # (batch, pos, head, d)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1), float("-inf"))
        weights = (scores - scores.amax(-1, keepdim=True)).exp()
        weights = weights / weights.sum(-1, keepdim=True)
        return self.unembed(x + torch.einsum("bhqk,bkhd->bqhd", weights, v).flatten(2))


def einsum_lm() -> EinsumAttentionLM:
    return EinsumAttentionLM().eval()


class FeaturesModel(nn.Module):
    """Has a vocabulary (an nn.Embedding) but its forward wants float features: token ids fail."""

    def __init__(self, attention: nn.Module | None = None):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.attention = attention
        self.proj = nn.Linear(8, 8)

    def forward(self, features):
        return self.proj(features)


def fails_on_tokens() -> nn.Module:
    return FeaturesModel().eval()


def encoder_lm_fails_on_tokens() -> nn.Module:
    """The same, with an nn.MultiheadAttention (so it takes the hook_attention route)."""
    return FeaturesModel(nn.MultiheadAttention(8, 2, batch_first=True)).eval()


def hf_gpt2() -> nn.Module:
    """A small random Hugging Face GPT-2 in SDPA mode (built offline from a config)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config).eval()
