"""KV caches and incremental decoding: the logits of a prefill followed by decoding (one token or a chunk
at a time) must equal the full forward at every position, and no token of a call may move the outputs
of the positions before it.

Caches in the Hugging Face manner (`forward(input_ids, ..., past_key_values=None, use_cache=False)`,
with transformers' `DynamicCache` or legacy tuples of (key, value) per layer) and in the nanoGPT
manner (`step(tokens, cache) -> (logits, cache)`), including a rotating buffer of W slots for a
sliding-window model, as mistral-src keeps one.

Correct: `hf_dynamic`, `hf_legacy`, `nano_step`, `ring_window` (prefills longer than the window too).
Bugs, each on its `# BUG: name` line: `top_left_causal` (SDPA's `is_causal` is top-left aligned, so with
fewer queries than keys a decoding query sees the wrong keys), `decode_noop_mask` (no mask once a cache
exists: a decoded chunk reads its own later tokens), `ring_prefill_overwrite` (a call of several tokens, a
prefill longer than the window above all, writes the ring before reading it, the mask truncated by length:
early queries read later tokens), `ring_mask_by_slot`
(the decode mask built from the slot order, not the slots' absolute positions).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers import DynamicCache

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


class CacheAttention(Projections):
    def forward(self, x, positions, allowed, cache=None):
        q, k, v = self.project(x, positions)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        return self.merge(self.attend(q, k, v, allowed))

    def attend(self, q, k, v, allowed):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # SITE: cache-sdpa


class TopLeftAttention(CacheAttention):
    def attend(self, q, k, v, allowed):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # BUG: top_left_causal


class CacheLM(Decoder):
    """Hugging Face style with transformers' `DynamicCache`; the mask covers the cache and the new tokens."""

    def __init__(self, config: Config, attention=CacheAttention):
        super().__init__(config, attention)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                **kwargs) -> LMOutput:
        cache = self.open_cache(past_key_values, use_cache)
        batch, n_new = input_ids.shape
        past = 0 if cache is None else cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n_new, device=input_ids.device)[None]
        allowed = causal(n_new, past + n_new, input_ids.device)[None, None]  # bottom-right: the new tokens are last
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        logits = self.run(input_ids, position_ids.expand(batch, -1), allowed, cache)
        return LMOutput(logits, self.close_cache(cache) if use_cache else None)

    def open_cache(self, past_key_values, use_cache):
        if past_key_values is None and use_cache:
            return DynamicCache()
        return past_key_values

    def close_cache(self, cache):
        return cache


class TupleCache:
    """Legacy tuples in and out: ((key, value), ...) one pair per layer, each (batch, head, pos, d_head)."""

    def __init__(self, legacy=None):
        self.pairs = [list(pair) for pair in legacy or ()]

    def get_seq_length(self) -> int:
        return self.pairs[0][0].shape[-2] if self.pairs else 0

    def update(self, k, v, layer_idx):
        if layer_idx == len(self.pairs):
            self.pairs.append([k, v])
        else:
            self.pairs[layer_idx] = [torch.cat([self.pairs[layer_idx][0], k], dim=-2),
                                     torch.cat([self.pairs[layer_idx][1], v], dim=-2)]
        return tuple(self.pairs[layer_idx])

    def to_legacy(self) -> tuple:
        return tuple((k, v) for k, v in self.pairs)


class LegacyCacheLM(CacheLM):
    def open_cache(self, past_key_values, use_cache):
        return TupleCache(past_key_values) if (past_key_values is not None or use_cache) else None

    def close_cache(self, cache):
        return cache.to_legacy()


# ---------------------------------------------------------------------------------------------
# nanoGPT style: `step(idx, cache) -> (logits, cache)`, the cache a list of [k, v] per layer
# ---------------------------------------------------------------------------------------------

class StepAttention(NanoAttention):
    def forward(self, x, allowed, cache=None):
        q, k, v = self.split(x)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # SITE: step-sdpa
        return self.merge(y)


class StepGPT(GPT):
    def __init__(self, config: GPTConfig):
        super().__init__(config, StepAttention)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        logits = self.run(idx, pos, causal(t, t, idx.device)[None, None])
        return logits, self.loss(logits, targets)

    def step(self, idx, cache=None):
        """Feed the new tokens idx (B, T) after those in the cache: (logits (B, T, vocab), cache)."""
        cache = cache if cache is not None else [[] for _ in self.transformer.h]
        past = cache[0][0].size(2) if cache[0] else 0
        t = idx.size(1)
        pos = torch.arange(past, past + t, dtype=torch.long, device=idx.device)
        return self.run(idx, pos, self.step_mask(t, past), cache), cache

    def step_mask(self, t, past):
        """(1, 1, T, past + T): the new tokens read the cache and, causally, each other."""
        return causal(t, past + t)[None, None]


class NoopDecodeMask(StepGPT):
    def step_mask(self, t, past):
        if past:
            return None  # BUG: decode_noop_mask (past the cache length no mask: a chunk reads its own later tokens)
        return causal(t, t)[None, None]


# ---------------------------------------------------------------------------------------------
# A sliding window of W keys with a rotating buffer of W slots (mistral-src's RotatingBufferCache)
# ---------------------------------------------------------------------------------------------

class Ring:
    """One layer's W slots: slot s holds the key and value of absolute position p with p % W == s."""

    def __init__(self, size: int):
        self.size = size
        self.k = self.v = None
        self.pos = torch.full((size,), -1)  # -1: never written

    def write(self, k, v, positions):
        """Keep the last `size` of the new keys and values (batch, head, T, d_head) at positions (T,)."""
        if self.k is None:
            shape = (*k.shape[:2], self.size, k.shape[-1])
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
        slots = positions[-self.size:] % self.size
        self.k[:, :, slots], self.v[:, :, slots] = k[:, :, -self.size:], v[:, :, -self.size:]
        self.pos[slots] = positions[-self.size:]


class RingCache:
    def __init__(self, n_layers: int, size: int):
        self.rings = [Ring(size) for _ in range(n_layers)]
        self.seen = 0
        self.positions = torch.arange(0)  # the absolute positions of the tokens being fed

    def __getitem__(self, layer_idx: int) -> tuple[Ring, torch.Tensor]:
        return self.rings[layer_idx], self.positions


def window_mask(query_pos, key_pos, window):
    """(query, key) bool from absolute positions: i - W < j <= i."""
    distance = query_pos[:, None] - key_pos[None, :]
    return (distance >= 0) & (distance < window) & (key_pos[None, :] >= 0)


def additive(allowed, dtype):
    """0 where allowed, the dtype's minimum elsewhere (a fully masked row then reads every key evenly)."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


class RingAttention(NanoAttention):
    def forward(self, x, allowed, cache=None):
        q, k, v = self.split(x)
        if cache is None:  # the full forward
            return self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))  # SITE: ring-full
        ring, positions = cache
        return self.merge(self.cached(q, k, v, ring, positions))

    def cached(self, q, k, v, ring, positions):
        """Read the ring's slots and the new keys, mask by absolute position, then write the new keys."""
        if ring.k is None:
            keys, values, key_pos = k, v, positions
        else:
            keys, values = torch.cat([ring.k, k], dim=2), torch.cat([ring.v, v], dim=2)
            key_pos = torch.cat([ring.pos, positions])
        allowed = window_mask(positions, key_pos, self.config.window_size)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=additive(allowed, q.dtype))  # SITE: ring-sdpa
        ring.write(k, v, positions)
        return y


class RingOverwrite(RingAttention):
    def cached(self, q, k, v, ring, positions):
        ring.write(k, v, positions)  # BUG: ring_prefill_overwrite (written before it is read)
        n_seen = int(positions[-1]) + 1
        allowed = window_mask(positions, torch.arange(n_seen), self.config.window_size)[:, -ring.size:]
        allowed = F.pad(allowed, (0, ring.size - allowed.shape[1]))  # the slots not yet written
        return F.scaled_dot_product_attention(q, ring.k, ring.v, attn_mask=additive(allowed, q.dtype))  # SITE: ring-overwrite-sdpa


class RingMaskBySlot(RingAttention):
    def cached(self, q, k, v, ring, positions):
        if ring.k is None:
            return super().cached(q, k, v, ring, positions)
        keys, values = torch.cat([ring.k, k], dim=2), torch.cat([ring.v, v], dim=2)
        start = int(positions[0])
        by_slot = torch.arange(start - ring.size, start)  # BUG: ring_mask_by_slot (slot s taken as the s-th oldest)
        allowed = window_mask(positions, torch.cat([by_slot, positions]), self.config.window_size)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=additive(allowed, q.dtype))  # SITE: ring-slot-sdpa
        ring.write(k, v, positions)
        return y


class RingGPT(GPT):
    """A window of `window_size` keys; `step` keeps only a ring of that many slots per layer."""

    def __init__(self, config: GPTConfig, attention=RingAttention):
        super().__init__(config, attention)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        logits = self.run(idx, pos, window_mask(pos, pos, self.config.window_size)[None, None])
        return logits, self.loss(logits, targets)

    def step(self, idx, cache=None):
        cache = cache if cache is not None else RingCache(self.config.n_layer, self.config.window_size)
        t = idx.size(1)
        cache.positions = torch.arange(cache.seen, cache.seen + t, dtype=torch.long, device=idx.device)
        logits = self.run(idx, cache.positions, None, cache)
        cache.seen += t
        return logits, cache


def _hf(model_class=CacheLM, attention=CacheAttention):
    return randomise(model_class(Config(), attention))


def hf_dynamic():
    return _hf()


def hf_legacy():
    return _hf(LegacyCacheLM)


def nano_step():
    return randomise(StepGPT(GPTConfig()))


def ring_window():
    return randomise(RingGPT(GPTConfig(window_size=WINDOW)))


def top_left_causal():
    return _hf(attention=TopLeftAttention)


def decode_noop_mask():
    return randomise(NoopDecodeMask(GPTConfig()))


def ring_prefill_overwrite():
    return randomise(RingGPT(GPTConfig(window_size=WINDOW), RingOverwrite))


def ring_mask_by_slot():
    return randomise(RingGPT(GPTConfig(window_size=WINDOW), RingMaskBySlot))
