"""The leakage audit's own test bed: small models, each labelled with the truth about its causality.

Every model maps a LongTensor (batch, seq) to logits (batch, seq, d_vocab), is built from a
seed (same seed, same weights) and is small enough to audit in well under a second. The
correct ones are causal by construction; the leaky ones carry one bug each, of the kinds real
models have had: a missing or off-by-one mask, a mask applied after the softmax, normalisation
or convolution over the time axis, a pooled context vector, a wrong `view` that mixes the
examples of a batch, a padding mask applied to the wrong axis. `ZOO[name]` says what an audit
must find: whether the model is causal, which kind of leak it has and the first module (or
hook) whose output leaks, in forward order.

Vocabulary: a *mixer* is the part of a block that moves information between positions
(attention, convolution); everything else acts on one position at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, get_args

import einops
import torch
import torch.nn.functional as F
from torch import nn

from interp.models.config import GPTConfig
from interp.models.gpt import HookedGPT

LeakKind = Literal["future", "batch", "padding"]
AttentionKind = Literal[
    "masked_fill",  # scores.masked_fill(future, -inf) before the softmax: correct
    "sdpa",  # F.scaled_dot_product_attention(is_causal=True): correct
    "after_softmax_renorm",  # softmax, zero the future, renormalise: correct in exact arithmetic
    "none",  # no mask at all
    "off_by_one",  # tril(diagonal=1): position t also sees t + 1
    "after_softmax",  # softmax over every key, then zero the future: the normaliser leaks
    "single_pair",  # correct mask except that query 2 may read position 5
    "tiny",  # correct attention plus a leak of about 1e-4 of the output scale
    "view_bug",  # (batch, seq) -> (seq, batch) by .view instead of .transpose: mixes the batch
    "encoder",  # bidirectional, padded keys masked: correct for an encoder
    "encoder_pad_bug",  # bidirectional, the padding mask applied to queries instead of keys
    "fast_path",  # correct, except that an all-ones padding mask takes a "fast path" with no causal mask
    "masked_pool",  # correct, except that given a padding mask it adds the mean over every real position
    "small",  # correct attention plus a leak of SMALL_LEAK (about 2e-3 of the output's spread)
]
SINGLE_PAIR = (2, 5)  # (query, source) that the "single_pair" mask lets through
TINY_LEAK = 5e-5  # weight of the future mean in the "tiny" mixer: about 1e-4 of the output scale
SMALL_LEAK = 1e-3  # weight of the future mean in the "small" mixer: about 2e-3 of the output's spread
OFFSET = -300.0  # unembedding bias of the "offset" models: a common offset 100x the logits' spread
POOL_WEIGHT = 1e-2  # weight of the masked mean in the "masked_pool" mixer


@dataclass(frozen=True)
class ZooConfig:
    """Shape of a zoo model; field names as TransformerLens names them, so audits infer them."""

    d_vocab: int = 13  # number of token ids
    n_ctx: int = 16  # longest sequence
    d_model: int = 16  # residual width
    n_heads: int = 2  # attention heads (attention mixers only)
    n_layers: int = 1  # blocks
    causal: bool = True  # what the model is meant to be (False: a bidirectional encoder)
    pad_token_id: int = 0  # token id used for padding

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


def _parameter(generator: torch.Generator, *shape: int, fan_in: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, generator=generator) / math.sqrt(fan_in))


class ZooAttention(nn.Module):
    """Multi-head attention with raw per-head weights; `kind` picks the (possibly broken) mask.

    No submodule runs after the mixing, so the first module output that carries a leak is this
    module's own output.
    """

    def __init__(self, cfg: ZooConfig, kind: AttentionKind, generator: torch.Generator):
        super().__init__()
        if kind not in get_args(AttentionKind):
            raise ValueError(f"attention kind {kind!r} is unknown; expected one of {list(get_args(AttentionKind))}.")
        self.kind, self.n_heads = kind, cfg.n_heads
        d_model = cfg.d_model
        self.W_QKV = _parameter(generator, 3, d_model, d_model, fan_in=d_model)
        self.W_O = _parameter(generator, d_model, d_model, fan_in=d_model)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (batch, pos, d_model); key_mask: (batch, pos), True for real tokens."""
        if self.kind == "view_bug":
            batch, n_pos, d_model = x.shape
            # BUG (deliberate): .view reinterprets memory; x.transpose(0, 1) was meant
            x_seq_first = x.view(n_pos, batch, d_model)
            mixed = self._attend(x_seq_first.transpose(0, 1), None)  # (batch', pos', d_model)
            return mixed.transpose(0, 1).contiguous().view(batch, n_pos, d_model)  # BUG: the reverse .view
        return self._attend(x, key_mask)

    def _attend(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = (
            einops.rearrange(x @ w, "batch pos (head d_head) -> batch head pos d_head", head=self.n_heads)
            for w in self.W_QKV
        )
        n_pos = x.shape[1]
        if self.kind == "sdpa" and key_mask is None:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            z = self._explicit(q, k, v, key_mask, n_pos)
        return einops.rearrange(z, "batch head pos d_head -> batch pos (head d_head)") @ self.W_O

    def _explicit(self, q, k, v, key_mask, n_pos: int) -> torch.Tensor:
        scores = einops.einsum(q, k, "batch head query d, batch head key d -> batch head query key")
        scores = scores / math.sqrt(q.shape[-1])
        causal = torch.ones(n_pos, n_pos, dtype=torch.bool, device=q.device).tril()  # (query, key)
        keys = None if key_mask is None else einops.rearrange(key_mask.bool(), "batch key -> batch 1 1 key")
        kind = self.kind
        if kind == "fast_path" and key_mask is not None and bool(key_mask.all()):
            # BUG (deliberate): "nothing is padded, so no mask is needed" drops the causal mask as well
            kind = "none"
        if kind in ("masked_fill", "sdpa", "tiny", "small", "single_pair", "off_by_one", "none", "encoder",
                    "view_bug", "fast_path", "masked_pool"):
            allowed = {
                "none": torch.ones_like(causal),
                "encoder": torch.ones_like(causal),
                "off_by_one": torch.ones_like(causal).tril(diagonal=1),
            }.get(kind, causal)
            if kind == "single_pair" and n_pos > SINGLE_PAIR[1]:
                allowed = allowed.clone()
                allowed[SINGLE_PAIR] = True
            if keys is not None:
                allowed = allowed & keys
            pattern = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
        elif kind == "encoder_pad_bug":
            # BUG (deliberate): padded *queries* are masked, padded keys stay visible
            queries = 1.0 if key_mask is None else einops.rearrange(key_mask.float(), "batch query -> batch 1 query 1")
            pattern = scores.softmax(-1) * queries
        elif kind in ("after_softmax", "after_softmax_renorm"):
            allowed = causal if keys is None else causal & keys
            pattern = scores.softmax(-1) * allowed  # rows no longer sum to one: the normaliser saw the future
            if kind == "after_softmax_renorm":
                pattern = pattern / pattern.sum(-1, keepdim=True).clamp_min(1e-30)
        else:
            raise AssertionError(f"unhandled attention kind {kind!r}")  # unreachable: kinds checked in __init__
        z = einops.einsum(pattern, v, "batch head query key, batch head key d -> batch head query d")
        if kind in ("tiny", "small"):
            # mean of the values at strictly later positions, scaled down: a 1e-4- (or 2e-3-) sized leak
            future = torch.ones_like(causal).triu(diagonal=1).to(v.dtype)  # (query, key)
            future = future / future.sum(-1, keepdim=True).clamp_min(1.0)
            weight = TINY_LEAK if kind == "tiny" else SMALL_LEAK
            z = z + weight * einops.einsum(future, v, "query key, batch head key d -> batch head query d")
        if kind == "masked_pool" and key_mask is not None:
            # BUG (deliberate): a pooled summary over every real position, the future included
            real = einops.rearrange(key_mask.to(v.dtype), "batch key -> batch 1 key 1")
            pooled = (v * real).sum(dim=2, keepdim=True) / real.sum(dim=2, keepdim=True).clamp_min(1.0)
            z = z + POOL_WEIGHT * pooled  # (batch, head, 1, d) broadcast over queries
        return z


class MHAMixer(nn.Module):
    """`nn.MultiheadAttention` (batch_first) with a boolean causal `attn_mask`."""

    def __init__(self, cfg: ZooConfig, generator: torch.Generator):
        super().__init__()
        self.mha = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, batch_first=True)
        with torch.no_grad():
            for param in self.mha.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(cfg.d_model))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        n_pos = x.shape[1]
        future = torch.ones(n_pos, n_pos, dtype=torch.bool, device=x.device).triu(diagonal=1)  # True = may not attend
        padding = None if key_mask is None else ~key_mask.bool()
        out, _ = self.mha(x, x, x, attn_mask=future, key_padding_mask=padding, need_weights=False)
        return out.nan_to_num(0.0)


class Conv(nn.Module):
    """Convolution over time: `causal` pads on the left only; otherwise centred (reads the future)."""

    def __init__(self, cfg: ZooConfig, causal: bool, generator: torch.Generator, width: int = 3):
        super().__init__()
        self.causal, self.width = causal, width
        self.weight = _parameter(generator, cfg.d_model, cfg.d_model, width, fan_in=cfg.d_model * width)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        if key_mask is not None:
            x = x * key_mask[..., None]  # padded positions contribute nothing
        channels_first = einops.rearrange(x, "batch pos d_model -> batch d_model pos")
        if self.causal:
            out = F.conv1d(F.pad(channels_first, (self.width - 1, 0)), self.weight)
        else:
            out = F.conv1d(channels_first, self.weight, padding=self.width // 2)
        return einops.rearrange(out, "batch d_model pos -> batch pos d_model")


class SeqNorm(nn.Module):
    """Normalisation over the sequence axis (each feature standardised across positions): leaks."""

    def __init__(self, cfg: ZooConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=1, keepdim=True)  # mean over positions: the future is in it
        return centred / (centred.pow(2).mean(dim=1, keepdim=True) + 1e-5).sqrt() * self.weight


class MeanContext(nn.Module):
    """Adds a projection of the mean over all positions to every position: leaks."""

    def __init__(self, cfg: ZooConfig, generator: torch.Generator):
        super().__init__()
        self.W = _parameter(generator, cfg.d_model, cfg.d_model, fan_in=cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x.mean(dim=1, keepdim=True) @ self.W


class Block(nn.Module):
    def __init__(self, cfg: ZooConfig, mixer: nn.Module, norm: nn.Module, generator: torch.Generator):
        super().__init__()
        self.norm = norm
        self.mixer = mixer
        self.W_in = _parameter(generator, cfg.d_model, 2 * cfg.d_model, fan_in=cfg.d_model)
        self.W_out = _parameter(generator, 2 * cfg.d_model, cfg.d_model, fan_in=2 * cfg.d_model)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.mixer(self.norm(x), key_mask)
        return x + F.gelu(x @ self.W_in) @ self.W_out  # position-wise MLP


class ZooModel(nn.Module):
    """Token + position embeddings, optional context module, blocks, unembedding: (batch, seq) -> logits."""

    def __init__(self, cfg: ZooConfig, blocks: list[Block], context: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.context = context
        self.blocks = nn.ModuleList(blocks)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.ndim != 2 or tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"tokens must have shape (batch, seq) with seq <= n_ctx={self.cfg.n_ctx}, got {tuple(tokens.shape)}."
            )
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        if attention_mask is not None:
            # positions count real tokens only, so left padding leaves real positions unchanged
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        x = self.embed(tokens) + self.pos_embed(positions)  # (batch, pos, d_model)
        if self.context is not None:
            x = self.context(x)
        key_mask = None if attention_mask is None else attention_mask.bool()
        for block in self.blocks:
            x = block(x, key_mask)
        return self.unembed(x)  # (batch, pos, d_vocab)


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _build(seed: int, mixers: list[Callable], *, causal: bool = True, n_layers: int | None = None,
           norm: Callable | None = None, context: Callable | None = None, offset: float = 0.0) -> ZooModel:
    """A ZooModel whose weights all come from one seeded generator."""
    cfg = ZooConfig(causal=causal, n_layers=n_layers or len(mixers))
    generator = _seeded(seed)
    blocks = [
        Block(cfg, make(cfg, generator), (norm or (lambda c: nn.LayerNorm(c.d_model)))(cfg), generator)
        for make in mixers
    ]
    model = ZooModel(cfg, blocks, None if context is None else context(cfg, generator))
    with torch.no_grad():  # embeddings and unembedding from the same generator
        for module in (model.embed, model.pos_embed):
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator))
        model.unembed.weight.copy_(torch.randn(model.unembed.weight.shape, generator=generator) / math.sqrt(cfg.d_model))
        model.unembed.bias.fill_(offset)  # a common offset of every logit (0 but for the "offset" models)
    return model.eval()


def _attention(kind: AttentionKind) -> Callable:
    return lambda cfg, generator: ZooAttention(cfg, kind, generator)


def hooked_gpt(seed: int, leaky_layer: int | None = None) -> HookedGPT:
    """A 2-layer HookedGPT; `leaky_layer` removes the causal mask of that layer's attention."""
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=13, n_ctx=16, seed=seed, init_range=0.3))
    if leaky_layer is not None:
        model.blocks[leaky_layer].attn.causal = False  # planted leak: cfg still says causal
    return model.eval()


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model and the truth an audit must recover."""

    name: str
    factory: Callable[[int], nn.Module]  # seed -> model
    causal: bool  # True: no position reads a later one, no example reads another, padding is inert
    leak: LeakKind | None = None  # the kind of leak, None for correct models
    first_leaking_site: str | None = None  # earliest module / hook output in forward order that leaks
    bidirectional: bool = False  # an encoder: bidirectional by design (its padding is what is audited)
    description: str = ""

    def build(self, seed: int = 0) -> nn.Module:
        return self.factory(seed)


def _entries() -> list[ZooEntry]:
    attn = _attention
    return [
        ZooEntry("masked_fill", lambda s: _build(s, [attn("masked_fill")] * 2), True,
                 description="manual -inf mask before the softmax, 2 layers"),
        ZooEntry("sdpa_causal", lambda s: _build(s, [attn("sdpa")]), True,
                 description="F.scaled_dot_product_attention(is_causal=True)"),
        ZooEntry("mha_causal", lambda s: _build(s, [lambda c, g: MHAMixer(c, g)]), True,
                 description="nn.MultiheadAttention with a boolean causal attn_mask"),
        ZooEntry("causal_conv", lambda s: _build(s, [lambda c, g: Conv(c, True, g)]), True,
                 description="convolution over time padded on the left only"),
        ZooEntry("mask_after_softmax_renorm", lambda s: _build(s, [attn("after_softmax_renorm")]), True,
                 description="softmax, future zeroed, rows renormalised: causal, but float rounding sees the future"),
        ZooEntry("hooked_gpt", lambda s: hooked_gpt(s), True, description="HookedGPT, 2 layers"),
        ZooEntry("encoder", lambda s: _build(s, [attn("encoder")], causal=False), True, bidirectional=True,
                 description="bidirectional encoder with a correct key padding mask"),
        ZooEntry("batch_mixing", lambda s: _build(s, [attn("view_bug")]), False, "batch", "blocks.0.mixer",
                 description="(batch, seq) reshaped to (seq, batch) with .view: examples read each other"),
        ZooEntry("no_mask", lambda s: _build(s, [attn("none")]), False, "future", "blocks.0.mixer",
                 description="attention without a causal mask"),
        ZooEntry("off_by_one", lambda s: _build(s, [attn("off_by_one")]), False, "future", "blocks.0.mixer",
                 description="tril(diagonal=1): position t also reads t + 1"),
        ZooEntry("mask_after_softmax", lambda s: _build(s, [attn("after_softmax")]), False, "future", "blocks.0.mixer",
                 description="future zeroed after the softmax, not renormalised: triangular pattern, leaky normaliser"),
        ZooEntry("seq_norm", lambda s: _build(s, [attn("masked_fill")], norm=SeqNorm), False, "future", "blocks.0.norm",
                 description="normalisation over the sequence axis before a correct attention"),
        ZooEntry("centred_conv", lambda s: _build(s, [lambda c, g: Conv(c, False, g)]), False, "future", "blocks.0.mixer",
                 description="convolution over time with centred (symmetric) padding"),
        ZooEntry("mean_context", lambda s: _build(s, [attn("masked_fill")], context=MeanContext), False, "future", "context",
                 description="a mean-pooled context vector added to every position"),
        ZooEntry("one_layer_unmasked", lambda s: _build(s, [attn("masked_fill"), attn("none")]), False, "future",
                 "blocks.1.mixer", description="2 layers, the second without a mask"),
        ZooEntry("single_pair", lambda s: _build(s, [attn("single_pair")]), False, "future", "blocks.0.mixer",
                 description=f"correct mask except that query {SINGLE_PAIR[0]} reads position {SINGLE_PAIR[1]}"),
        ZooEntry("tiny_leak", lambda s: _build(s, [attn("tiny")]), False, "future", "blocks.0.mixer",
                 description="correct attention plus a future mean weighted 5e-5 (about 1e-4 of the output scale)"),
        ZooEntry("hooked_gpt_unmasked_layer", lambda s: hooked_gpt(s, leaky_layer=1), False, "future",
                 "blocks.1.attn.hook_attn_scores", description="HookedGPT whose layer 1 attention lost its mask"),
        ZooEntry("offset_causal", lambda s: _build(s, [attn("masked_fill")], offset=OFFSET), True,
                 description=f"correct attention, every logit offset by {OFFSET:g} (100x the logits' spread)"),
        ZooEntry("offset_small_leak", lambda s: _build(s, [attn("small")], offset=OFFSET), False, "future",
                 "blocks.0.mixer", description=f"a leak of about 2e-3 of the logits' spread under an offset of {OFFSET:g}"),
        ZooEntry("mask_fast_path", lambda s: _build(s, [attn("fast_path")]), False, "future", "blocks.0.mixer",
                 description="causal, except that an all-ones attention_mask takes a fast path without the causal mask"),
        ZooEntry("masked_pooling", lambda s: _build(s, [attn("masked_pool")]), False, "future", "blocks.0.mixer",
                 description="causal, except that given an attention_mask it adds the mean over every real position"),
        ZooEntry("encoder_padding_bug", lambda s: _build(s, [attn("encoder_pad_bug")], causal=False), False, "padding",
                 "blocks.0.mixer", bidirectional=True,
                 description="encoder whose padding mask hides padded queries instead of padded keys"),
    ]


ZOO: dict[str, ZooEntry] = {entry.name: entry for entry in _entries()}


def build(name: str, seed: int = 0) -> nn.Module:
    """The zoo model `name`, with weights drawn from `seed`."""
    if name not in ZOO:
        raise KeyError(f"no zoo model {name!r}; expected one of {sorted(ZOO)}.")
    return ZOO[name].build(seed)
