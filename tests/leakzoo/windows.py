"""Sliding windows: a layer declared to see W keys must see no more. W counts the keys a query sees,
itself included: key j is visible from query i iff i - W < j <= i (transformers' `sliding_window`,
`GPTConfig.window_size`). With every layer windowed, an output cannot depend on tokens more than
L * (W - 1) positions back.

Windows declared in the Hugging Face manner (`config.sliding_window`, per-layer `config.layer_types`)
and in the nanoGPT manner (`GPTConfig.window_size`, an additive bias buffer on the manual path).

Correct: `hf_window` (every layer windowed), `hf_mixed` (a windowed layer, then a full one), `nano_window`.
Bugs, each on its `# BUG: name` line: `noncausal_when_short` (no mask at all when the prompt fits in the
window), `additive_multiplied` (an additive 0 / -1e4 mask multiplied into the scores as if it were 0/1),
`off_by_one` (W + 1 keys), `two_sided_window` (the encoders' two-sided band: |i - j| < W), `one_layer_wide`
(W + 2 keys in the second layer only: the per-layer check must name that layer), `hidden_by_full_layer` (W + 1
keys in a windowed layer followed by a full-attention one: no output can show it, only the layer's weights).
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from leakzoo.stack import (
    GPT,
    Config,
    Decoder,
    GPTConfig,
    LMOutput,
    NanoAttention,
    Projections,
    causal,
    randomise,
)

WINDOW = 4


class WindowAttention(Projections):
    def forward(self, x, positions, allowed, cache=None):
        q, k, v = self.project(x, positions)
        return self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))  # SITE: window-sdpa


class WindowLM(Decoder):
    """Hugging Face style: one mask per layer type, as transformers builds them."""

    def __init__(self, config: Config):
        super().__init__(config, WindowAttention)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                **kwargs) -> LMOutput:
        if use_cache or past_key_values is not None:
            raise NotImplementedError(f"{type(self).__name__} keeps no KV cache: call it with use_cache=False")
        batch, n = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(n, device=input_ids.device)[None]
        keep = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        masks = [self.layer_mask(n, kind, layer) for layer, kind in enumerate(self.config.layer_types)]
        masks = [mask if keep is None or mask is None else mask & keep for mask in masks]
        return LMOutput(self.run(input_ids, position_ids.expand(batch, -1), masks))

    def layer_mask(self, n: int, kind: str, layer: int) -> torch.Tensor | None:
        """(1, 1, query, key) bool for layer `layer`, of `kind` ("sliding_attention" or "full_attention")."""
        if kind == "sliding_attention":
            return self.sliding(n, self.config.sliding_window)[None, None]
        return causal(n, n)[None, None]

    def sliding(self, n: int, window: int) -> torch.Tensor:
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        return (j <= i) & (j > i - window)


class NonCausalWhenShort(WindowLM):
    def layer_mask(self, n, kind, layer):
        if kind == "sliding_attention" and n <= self.config.sliding_window:
            return None  # BUG: noncausal_when_short (the window covers the prompt, so no mask is built at all)
        return super().layer_mask(n, kind, layer)


class HiddenByFullLayer(WindowLM):
    def sliding(self, n, window):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        return (j <= i) & (j > i - window - 1)  # BUG: hidden_by_full_layer (W + 1 keys, then a full layer)


class OneLayerWide(WindowLM):
    def layer_mask(self, n, kind, layer):
        if layer == 1:
            return self.sliding(n, self.config.sliding_window + 2)[None, None]  # BUG: one_layer_wide (layer 1 only)
        return super().layer_mask(n, kind, layer)


class OffByOne(WindowLM):
    def sliding(self, n, window):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        return (j <= i) & (j >= i - window)  # BUG: off_by_one (W + 1 keys)


class TwoSidedWindow(WindowLM):
    def sliding(self, n, window):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        return (i - j).abs() < window  # BUG: two_sided_window (the bidirectional band of an encoder)


# ---------------------------------------------------------------------------------------------
# nanoGPT style: the manual path with an additive bias buffer (0 inside the window, -1e4 outside)
# ---------------------------------------------------------------------------------------------

class WindowSelfAttention(NanoAttention):
    def __init__(self, config: GPTConfig, layer_idx=0):
        super().__init__(config, layer_idx)
        size, window = config.block_size, config.window_size
        i, j = torch.arange(size)[:, None], torch.arange(size)[None, :]
        inside = (j <= i) & (j > i - window)
        self.register_buffer("bias", torch.zeros(size, size).masked_fill(~inside, -1e4).view(1, 1, size, size))

    def forward(self, x, allowed, cache=None):
        q, k, v = self.split(x)
        T = x.size(1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = self.masked(att, T)
        att = F.softmax(att, dim=-1)  # SITE: nano-window-softmax
        return self.merge(att @ v)

    def masked(self, att, T):
        return att + self.bias[:, :, :T, :T]  # SITE: nano-window-bias


class MultipliedBias(WindowSelfAttention):
    def masked(self, att, T):
        return att * self.bias[:, :, :T, :T]  # BUG: additive_multiplied (an additive mask used as a 0/1 one)


class WindowGPT(GPT):
    def __init__(self, config: GPTConfig, attention=WindowSelfAttention):
        super().__init__(config, attention)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        logits = self.run(idx, torch.arange(0, t, dtype=torch.long, device=idx.device), None)
        return logits, self.loss(logits, targets)


def _hf(model_class=WindowLM, **overrides):
    return randomise(model_class(Config(**{"sliding_window": WINDOW, **overrides})))


def hf_window():
    return _hf()


def hf_mixed():
    return _hf(layer_types=["sliding_attention", "full_attention"])


def nano_window():
    return randomise(WindowGPT(GPTConfig(window_size=WINDOW)))


def noncausal_when_short():
    return _hf(NonCausalWhenShort)


def additive_multiplied():
    return randomise(WindowGPT(GPTConfig(window_size=WINDOW), MultipliedBias))


def off_by_one():
    return _hf(OffByOne)


def two_sided_window():
    return _hf(TwoSidedWindow)


def one_layer_wide():
    return _hf(OneLayerWide)


def hidden_by_full_layer():
    return _hf(HiddenByFullLayer, layer_types=["sliding_attention", "full_attention"])
