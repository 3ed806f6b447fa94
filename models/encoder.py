"""HookedEncoder: the bidirectional (BERT-style) counterpart of `HookedGPT`.

Same hook names and per-head weights; attention is unmasked in time and masked only at
padded keys (`attention_mask`, 1 = real token, 0 = padding). Padding never influences a
real position, and a query whose every key is padding gets a zero pattern, not NaN.

The output follows `cfg.lm_head`: "unembed" (the default) gives a logit per vocabulary entry
at every position; "mlm" puts BERT's masked-LM transform (dense, activation, LayerNorm) before
the unembedding; None (a bare encoder such as MiniLM's sentence-embedding checkpoint) returns
the final residual stream (batch, pos, d_model), Hugging Face's `last_hidden_state`.
A converted BERT also has token-type embeddings (`hook_token_type_embed`, `token_type_ids`)
and a LayerNorm on the summed embeddings (`embed_ln`).
"""
from __future__ import annotations

import torch
from transformer_lens.hook_points import HookPoint

from interp.models.components import LayerNorm, MLMHead, TokenTypeEmbed, make_unembed
from interp.models.config import EncoderConfig, GPTConfig
from interp.models.gpt import HookedGPT, ReturnType


class HookedEncoder(HookedGPT):
    """Bidirectional encoder; `forward(tokens, attention_mask=..., token_type_ids=...)`."""

    config_class = EncoderConfig
    cfg: EncoderConfig  # HookedGPT.__init__ refuses any other config class

    def build_embedding_extras(self, cfg: GPTConfig) -> None:
        assert isinstance(cfg, EncoderConfig)  # HookedGPT.__init__ checked it against config_class
        if cfg.n_token_types:
            self.token_type_embed = TokenTypeEmbed(cfg)
            self.hook_token_type_embed = HookPoint()  # (batch, pos, d_model)
        if cfg.embed_norm:
            self.embed_ln = LayerNorm(cfg)

    def embed_extras(self, resid: torch.Tensor, tokens: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        if self.cfg.n_token_types:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(tokens)
            token_type_ids = torch.as_tensor(token_type_ids, device=tokens.device)
            if token_type_ids.shape != tokens.shape:
                raise ValueError(
                    f"token_type_ids has shape {tuple(token_type_ids.shape)} but tokens have shape {tuple(tokens.shape)}."
                )
            if int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= self.cfg.n_token_types:
                raise ValueError(f"token_type_ids must lie in [0, {self.cfg.n_token_types}).")
            resid = resid + self.hook_token_type_embed(self.token_type_embed(token_type_ids.long()))
        elif token_type_ids is not None:
            raise ValueError("this HookedEncoder has no token-type embeddings (n_token_types=0); drop token_type_ids.")
        return self.embed_ln(resid) if self.cfg.embed_norm else resid

    def build_head(self, cfg: GPTConfig) -> None:
        assert isinstance(cfg, EncoderConfig)  # HookedGPT.__init__ checked it against config_class
        if cfg.lm_head == "mlm":
            self.mlm_head = MLMHead(cfg)
        if cfg.lm_head is not None:
            self.unembed = make_unembed(cfg, self.embed)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.cfg.lm_head is None:
            return hidden  # (..., d_model): no vocabulary head
        if self.cfg.lm_head == "mlm":
            hidden = self.mlm_head(hidden)
        return self.unembed(hidden)

    # no loss_per_token: the encoder has no loss, so it takes fewer arguments than HookedGPT.forward
    def forward(  # type: ignore[override]
        self, tokens: torch.Tensor, return_type: ReturnType = "logits", *, attention_mask: torch.Tensor | None = None,
        stop_at_layer: int | None = None, token_type_ids: torch.Tensor | None = None,
    ):
        """tokens (batch, pos) -> logits (batch, pos, d_vocab), or the final residual stream
        (batch, pos, d_model) when the encoder has no head (`cfg.lm_head is None`); no loss here."""
        if return_type in ("loss", "both"):
            raise ValueError(
                "HookedEncoder has no next-token loss (it sees the whole sequence); "
                "use return_type='logits' and a masked-LM objective of your own."
            )
        return super().forward(tokens, return_type, attention_mask=attention_mask, stop_at_layer=stop_at_layer,
                               token_type_ids=token_type_ids)
