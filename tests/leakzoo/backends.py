"""Attention implementations: the same model under eager, SDPA and FlexAttention must agree, and each
must be causal. The Hugging Face models switch with `set_attn_implementation(name)` (the strings
`attn_implementation` takes); the nanoGPT one reads `GPTConfig.attn_impl`.

The mask is built once per forward in the form each implementation takes (as transformers'
`masking_utils` does): a dense boolean for eager and SDPA, a `BlockMask` for FlexAttention. On CPU
FlexAttention runs unfused (eager); that kernel evaluates `mask_mod` everywhere and ignores the block-sparse
metadata, which fused kernels use to skip blocks. Torch refuses a BlockMask built for another length.

Correct: `hf_switchable`, `hf_switchable_window` (a window of 4), `nano_switchable`.
Bugs, each on its `# BUG: name` line: `flex_cropped_block_mask` (the block mask built once for the longest
sequence and cropped by hand, its `mask_mod` lost), `sdpa_drops_window` (a square mask taken for a plain
causal one on the SDPA path), `block_sparse_window` (block-local attention carried only by the block layout,
with a merely causal `mask_mod`: a kernel ignoring the layout reads the whole triangle), `sdpa_wrong_scale`.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    flex_attention,
)

from leakzoo.stack import (
    GPT,
    Config,
    Decoder,
    GPTConfig,
    LMOutput,
    NanoAttention,
    Projections,
    randomise,
)

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
WINDOW = 4
BLOCK = 4  # the block size of `block_sparse_window`


def causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_mod(window: int):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def dense(mask_mod, n: int, device=None) -> torch.Tensor:
    """(1, 1, query, key) bool: `mask_mod` evaluated at every pair."""
    index = torch.arange(n, device=device)
    return mask_mod(0, 0, index[:, None], index[None, :])[None, None]


def check_implementation(implementation: str) -> str:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    return implementation


class SwitchAttention(Projections):
    def forward(self, x, positions, mask, cache=None):
        q, k, v = self.project(x, positions)
        kernel = {"eager": self.eager, "sdpa": self.sdpa, "flex_attention": self.flex}[self.config.attn_implementation]
        return self.merge(kernel(q, k, v, mask))

    def eager(self, q, k, v, allowed):
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (batch, head, query, key)
        scores = scores.masked_fill(~allowed, float("-inf"))  # SITE: switch-eager-mask
        return scores.softmax(-1) @ v  # SITE: switch-eager-softmax

    def sdpa(self, q, k, v, allowed):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # SITE: switch-sdpa

    def flex(self, q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)  # SITE: switch-flex


class SdpaDropsWindow(SwitchAttention):
    def sdpa(self, q, k, v, allowed):
        if q.shape[-2] == k.shape[-2]:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # BUG: sdpa_drops_window (square: "plain causal")
        return super().sdpa(q, k, v, allowed)


class SwitchLM(Decoder):
    """Hugging Face style; `config.attn_implementation` picks the kernel, `set_attn_implementation` switches it."""

    def __init__(self, config: Config, attention=SwitchAttention):
        super().__init__(config, attention)

    def set_attn_implementation(self, implementation: str) -> None:
        self.config.attn_implementation = check_implementation(implementation)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                **kwargs) -> LMOutput:
        if use_cache or past_key_values is not None:
            raise NotImplementedError(f"{type(self).__name__} keeps no KV cache: call it with use_cache=False")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("this model packs no padding: give an all-ones attention_mask or none")
        batch, n = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(n, device=input_ids.device)[None]
        return LMOutput(self.run(input_ids, position_ids.expand(batch, -1), self.mask(n, input_ids.device)))

    def mask_mod(self):
        window = self.config.sliding_window
        return causal_mod if window is None else sliding_mod(window)

    def mask(self, n: int, device):
        """The mask in the form the implementation takes: a BlockMask for flex_attention, else a dense bool."""
        if self.config.attn_implementation == "flex_attention":
            return self.flex_mask(n, device)
        return dense(self.mask_mod(), n, device)

    def flex_mask(self, n: int, device) -> BlockMask:
        return create_block_mask(self.mask_mod(), None, None, n, n, device=device)


class CroppedBlockMask(SwitchLM):
    """Builds the FlexAttention block mask once, for the longest sequence, and crops it for shorter ones."""

    def flex_mask(self, n, device):
        size = self.config.max_position_embeddings
        if not hasattr(self, "_block_mask"):
            self._block_mask = create_block_mask(self.mask_mod(), None, None, size, size, device=device)
        full = self._block_mask
        if n == size:
            return full
        rows = -(-n // full.BLOCK_SIZE[0])
        return BlockMask.from_kv_blocks(full.kv_num_blocks[:, :, :rows], full.kv_indices[:, :, :rows, :rows],
                                        BLOCK_SIZE=full.BLOCK_SIZE, seq_lengths=(n, n))  # BUG: flex_cropped_block_mask


class BlockLocal(SwitchLM):
    """Block-local attention: a query reads, causally, the keys of its own block of BLOCK and of the block before."""

    def mask_mod(self):
        def block_local(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx // BLOCK - kv_idx // BLOCK <= 1)
        return block_local

    def flex_mask(self, n, device):
        blocks = -(-n // BLOCK)
        order = [[row, *([row - 1] if row else []), *(c for c in range(blocks) if c not in (row, row - 1))]
                 for row in range(blocks)]  # each query block reads its own key block and the one before, in that order
        kv_indices = torch.tensor(order, dtype=torch.int32)[None, None]  # (1, 1, query block, key block)
        kv_num_blocks = torch.tensor([min(row, 1) + 1 for row in range(blocks)], dtype=torch.int32)[None, None]
        return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=BLOCK, mask_mod=causal_mod,
                                        seq_lengths=(n, n))  # BUG: block_sparse_window


# ---------------------------------------------------------------------------------------------
# nanoGPT style: `GPTConfig.attn_impl`
# ---------------------------------------------------------------------------------------------

class NanoSwitchAttention(NanoAttention):
    def forward(self, x, allowed, cache=None):
        q, k, v = self.split(x)
        impl = self.config.attn_impl
        if impl == "flex_attention":
            y = flex_attention(q, k, v, block_mask=allowed)  # SITE: nano-switch-flex
        elif impl == "sdpa":
            y = self.sdpa(q, k, v)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~allowed, float("-inf"))  # SITE: nano-switch-mask
            y = F.softmax(att, dim=-1) @ v  # SITE: nano-switch-softmax
        return self.merge(y)

    def sdpa(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SITE: nano-switch-sdpa


class WrongScale(NanoSwitchAttention):
    def sdpa(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / k.size(-1))  # BUG: sdpa_wrong_scale


class NanoSwitchGPT(GPT):
    def __init__(self, config: GPTConfig, attention=NanoSwitchAttention):
        super().__init__(config, attention)

    def forward(self, idx, targets=None):
        check_implementation(self.config.attn_impl)
        t = idx.size(1)
        if self.config.attn_impl == "flex_attention":
            mask = create_block_mask(causal_mod, None, None, t, t, device=idx.device)
        else:
            mask = dense(causal_mod, t, idx.device)
        logits = self.run(idx, torch.arange(0, t, dtype=torch.long, device=idx.device), mask)
        return logits, self.loss(logits, targets)


def _hf(model_class=SwitchLM, attention=SwitchAttention, **overrides):
    return randomise(model_class(Config(**overrides), attention))


def hf_switchable():
    return _hf()


def hf_switchable_window():
    return _hf(sliding_window=WINDOW)


def nano_switchable():
    return randomise(NanoSwitchGPT(GPTConfig()))


def flex_cropped_block_mask():
    return _hf(CroppedBlockMask)


def sdpa_drops_window():
    return _hf(attention=SdpaDropsWindow, sliding_window=WINDOW)


def block_sparse_window():
    return _hf(BlockLocal)


def sdpa_wrong_scale():
    return randomise(NanoSwitchGPT(GPTConfig(), WrongScale))
