"""HookedEncoder: the bidirectional (BERT-style) counterpart of `HookedGPT`.

Same hook names and per-head weights; attention is unmasked in time and masked only at
padded keys (`attention_mask`, 1 = real token, 0 = padding). Padding never influences a
real position, and a query whose every key is padding gets a zero pattern, not NaN.
The output is a logit per vocabulary entry at every position (a masked-LM head).
"""
from __future__ import annotations

import torch

from models.config import EncoderConfig
from models.gpt import HookedGPT


class HookedEncoder(HookedGPT):
    """Bidirectional encoder; `forward(tokens, attention_mask=...)`."""

    config_class = EncoderConfig

    def forward(self, tokens: torch.Tensor, return_type="logits", *, attention_mask=None, stop_at_layer=None):
        """tokens (batch, pos) -> logits (batch, pos, d_vocab); the loss is undefined here."""
        if return_type in ("loss", "both"):
            raise ValueError(
                "HookedEncoder has no next-token loss (it sees the whole sequence); "
                "use return_type='logits' and a masked-LM objective of your own."
            )
        return super().forward(tokens, return_type, attention_mask=attention_mask, stop_at_layer=stop_at_layer)
