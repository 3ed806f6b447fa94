"""HookedGPT: a small causal decoder whose every attention step carries a TransformerLens hook.

Built on `transformer_lens.HookedRootModule`, so `run_with_cache`, `run_with_hooks`,
`hooks()`, `ActivationCache`, `head_detector` and `patching` work on it unchanged.
Hook names per layer `l` (shapes in the comments of `interp.models.components`):
`blocks.{l}.hook_resid_pre`, `blocks.{l}.attn.hook_q|hook_k|hook_v`, `hook_attn_scores`,
`hook_pattern`, `hook_z`, `hook_result`, `blocks.{l}.hook_attn_out`, `blocks.{l}.hook_resid_mid`,
`blocks.{l}.hook_mlp_out`, `blocks.{l}.hook_resid_post`; plus `hook_embed`, `hook_pos_embed`.
Variants (converted Hugging Face models, `interp.models.convert`) add only what their components need:
`blocks.{l}.mlp.hook_pre_linear` (gated MLP), no `hook_pos_embed` (rotary), no `hook_resid_mid`
(parallel attention + MLP); `hook_k` / `hook_v` carry the key/value heads under grouped-query
attention (see `interp.models.components.Attention`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

import einops
import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import FactoredMatrix
from transformer_lens.hook_points import HookPoint

from interp.models.components import (
    CachingRoot,
    Embed,
    ModuleStack,
    PosEmbed,
    TiedUnembed,
    TransformerBlock,
    Unembed,
    init_weights,
    make_norm,
    make_unembed,
)
from interp.models.config import GPTConfig
from interp.models.tokenizers import TokenMethods

ReturnType = Literal["logits", "loss", "both", None]
FUSED_CHUNK = 256  # positions per block in the fused unembedding + cross-entropy (fits in cache here)


class TokenTypeError(TypeError, ValueError):
    """Tokens of the wrong type or dtype: a TypeError, and a ValueError so that callers treating bad
    input values alike (the `interp` command: exit 2) catch it too."""


class HookedGPT(TokenMethods, CachingRoot):
    """Causal decoder: token (+ learned position) embeddings, pre-norm blocks, unembedding."""

    config_class = GPTConfig
    # set by the loaders (interp.models.io, interp.models.nanogpt, interp.models.constructed); absent on a model built from a config
    metadata: dict[str, Any]  # how the model was made
    load_notes: list[str]  # what loading an older checkpoint adjusted
    truth: dict[str, str]  # a constructed model's head roles, e.g. {"L0H0": "previous_token"}
    head_is_random: bool  # a converted model whose task head was not in the checkpoint (interp.loading)
    tokenizer: Any  # encodes strings for to_tokens: a CharTokenizer or a Hugging Face tokenizer

    def __init__(self, cfg: GPTConfig | None = None, **overrides):
        super().__init__()
        if cfg is None:
            cfg = self.config_class(**overrides)
        if not isinstance(cfg, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(cfg).__name__}.")
        # a private copy: the runtime device and dtype are written onto it
        self.cfg = cfg = dataclasses.replace(cfg, **overrides)
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # (batch, pos, d_model)
        if cfg.positional_embedding_type == "standard":
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()  # (batch, pos, d_model)
        self.build_embedding_extras(cfg)
        self.blocks: ModuleStack[TransformerBlock] = ModuleStack(
            TransformerBlock(cfg, causal=cfg.causal) for _ in range(cfg.n_layers))
        # a post-norm model's last block already ends in a norm
        self.ln_final = nn.Identity() if cfg.post_norm else make_norm(cfg)
        self.build_head(cfg)
        init_weights(self, cfg)
        self.setup()
        self._apply(lambda t: t)  # records device and dtype on cfg

    def build_embedding_extras(self, cfg: GPTConfig) -> None:
        """Embeddings beyond token and position (an encoder adds token types and a norm)."""

    def embed_extras(self, resid: torch.Tensor, tokens: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        if token_type_ids is not None:
            raise ValueError(f"{type(self).__name__} has no token-type embeddings; drop token_type_ids.")
        return resid

    def build_head(self, cfg: GPTConfig) -> None:
        self.unembed = make_unembed(cfg, self.embed)

    def head(self, resid: torch.Tensor) -> torch.Tensor:
        """Final residual stream (batch, pos, d_model) -> logits (batch, pos, d_vocab)."""
        return self.logits_from_hidden(self.ln_final(resid))

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden state, after `ln_final` (..., d_model) -> logits (..., d_vocab)."""
        return self.unembed(hidden)

    # TransformerLens's tools read cfg.device and cfg.dtype
    @property
    def device(self) -> torch.device:
        return self.embed.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.W_E.dtype

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        object.__setattr__(self.cfg, "device", self.embed.W_E.device)
        object.__setattr__(self.cfg, "dtype", self.embed.W_E.dtype)
        return module

    def _pads_right_safely(self) -> bool:
        """A causal model's real positions never read right padding (`TokenMethods.to_tokens`); an encoder's do."""
        return bool(self.cfg.causal)

    # -- TransformerLens's weight surface: per-layer parameters stacked over layers, as HookedTransformer names them

    def _stack(self, get) -> torch.Tensor:
        return torch.stack([get(block) for block in self.blocks])

    def _attn_param(self, name: str) -> torch.Tensor:
        return self._stack(lambda block: getattr(block.attn, name))

    # key/value maps and biases are per *query* head: under grouped-query attention key/value head g is
    # repeated for its query heads (TransformerLens's `repeat_interleave` layout); the stored key/value
    # heads are `blocks[l].attn._W_K`
    W_Q = property(lambda self: self._attn_param("W_Q"), doc="(n_layers, n_heads, d_model, d_head) query maps.")
    W_K = property(lambda self: self._attn_param("W_K"), doc="(n_layers, n_heads, d_model, d_head) key maps, per query head.")
    W_V = property(lambda self: self._attn_param("W_V"), doc="(n_layers, n_heads, d_model, d_head) value maps, per query head.")
    W_O = property(lambda self: self._attn_param("W_O"), doc="(n_layers, n_heads, d_head, d_model) output maps.")
    b_Q = property(lambda self: self._attn_param("b_Q"), doc="(n_layers, n_heads, d_head).")
    b_K = property(lambda self: self._attn_param("b_K"), doc="(n_layers, n_heads, d_head), per query head.")
    b_V = property(lambda self: self._attn_param("b_V"), doc="(n_layers, n_heads, d_head), per query head.")
    b_O = property(lambda self: self._attn_param("b_O"), doc="(n_layers, d_model).")

    def _mlp_param(self, name: str) -> torch.Tensor:
        if self.cfg.attn_only:
            raise AttributeError(f"{name}: this model is attention-only (cfg.attn_only), it has no MLPs.")
        if name == "W_gate" and not self.cfg.gated_mlp:
            raise AttributeError("W_gate: this model's MLPs are not gated (cfg.gated_mlp is False).")
        return self._stack(lambda block: getattr(block.mlp, name))

    W_in = property(lambda self: self._mlp_param("W_in"), doc="(n_layers, d_model, d_mlp) MLP input maps.")
    b_in = property(lambda self: self._mlp_param("b_in"), doc="(n_layers, d_mlp).")
    W_gate = property(lambda self: self._mlp_param("W_gate"), doc="(n_layers, d_model, d_mlp), gated MLPs only.")
    W_out = property(lambda self: self._mlp_param("W_out"), doc="(n_layers, d_mlp, d_model) MLP output maps.")
    b_out = property(lambda self: self._mlp_param("b_out"), doc="(n_layers, d_model).")

    @property
    def W_E(self) -> torch.Tensor:
        """(d_vocab, d_model) token embeddings."""
        return self.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor:
        """(n_ctx, d_model) learned position embeddings; rotary models have none (AttributeError)."""
        if self.cfg.positional_embedding_type != "standard":
            raise AttributeError(f"W_pos: this model's positions are {self.cfg.positional_embedding_type}, "
                                 "not a learned table.")
        return self.pos_embed.W_pos

    def _unembed_or_raise(self) -> Unembed | TiedUnembed:
        if not isinstance(getattr(self, "unembed", None), (Unembed, TiedUnembed)):
            raise AttributeError(f"{type(self).__name__} has no unembedding (cfg.lm_head is None): no W_U / b_U.")
        return self.unembed

    @property
    def W_U(self) -> torch.Tensor:
        """(d_model, d_vocab) unembedding."""
        return self._unembed_or_raise().W_U

    @property
    def b_U(self) -> torch.Tensor:
        """(d_vocab,) unembedding bias."""
        return self._unembed_or_raise().b_U

    @property
    def QK(self) -> FactoredMatrix:
        """(n_layers, n_heads, d_model, d_model) QK circuits W_Q W_K^T, factored (per query head)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """(n_layers, n_heads, d_model, d_model) OV circuits W_V W_O, factored (per query head)."""
        return FactoredMatrix(self.W_V, self.W_O)

    def tokens_to_residual_directions(self, tokens: str | int | torch.Tensor) -> torch.Tensor:
        """Each token's direction in the normalised final residual stream, (*tokens.shape, d_model)
        (TransformerLens's method): its unembedding column times `ln_final`'s gain, the column
        TransformerLens's default (LayerNorm-folded) models hold in W_U. So `cache.logit_attrs`, which
        centres and divides by the cached final scale, gives each component's exact share of the logit
        (the logit minus b_U and ln_final's bias term, summed over a full decomposition)."""
        self._require_linear_readout("tokens_to_residual_directions")
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        gain = getattr(self.ln_final, "w", None)
        W_U = self.W_U if gain is None else gain[:, None] * self.W_U  # (d_model, d_vocab)
        if not isinstance(tokens, torch.Tensor) or tokens.numel() == 1:  # one token, as TransformerLens treats it
            return W_U[:, int(tokens)]  # (d_model,)
        directions = W_U[:, torch.as_tensor(tokens, device=W_U.device)]  # (d_model, *tokens.shape)
        return einops.rearrange(directions, "d_model ... -> ... d_model")

    def _require_linear_readout(self, what: str) -> None:
        """Logits must be ln_final(resid) @ W_U + b_U for residual-stream attribution to mean anything."""
        head = getattr(self.cfg, "lm_head", "unembed")
        if head != "unembed":
            raise ValueError(f"{what}: this model's logits are not ln_final(resid) @ W_U + b_U (cfg.lm_head={head!r}: "
                             "an MLM transform or no head), so residual directions of tokens do not exist.")

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """(d_model,) sum of the biases written to the residual stream before block `layer`'s attention
        (`mlp_input=True`: before its MLP, so its own b_O too); TransformerLens's method, which
        `ActivationCache.get_full_resid_decomposition` calls. Post-norm blocks rescale the stream, so
        no sum of biases is part of it there: refused."""
        if self.cfg.post_norm:
            raise ValueError("accumulated_bias: post-norm blocks (BERT) normalise the residual stream after each "
                             "sublayer, so it is not a sum of component outputs and biases.")
        if not 0 <= layer <= self.cfg.n_layers or (mlp_input and layer == self.cfg.n_layers):
            raise ValueError(f"accumulated_bias(layer={layer}, mlp_input={mlp_input}); expected 0 <= layer <= "
                             f"{self.cfg.n_layers} (< with mlp_input).")
        total = torch.zeros(self.cfg.d_model, device=self.device, dtype=self.dtype)
        for block in self.blocks[:layer]:
            total = total + block.attn.b_O
            if include_mlp_biases and not self.cfg.attn_only:
                total = total + block.mlp.b_out
        if mlp_input:
            total = total + self.blocks[layer].attn.b_O
        return total

    # -- TransformerLens's switches (its tools flip them in a context manager and restore them)

    def setup(self) -> None:
        """Register the hook points, and `blocks.{l}.hook_q_input`... as aliases of the split inputs
        `blocks.{l}.attn.hook_q_input`... (TransformerLens's bridge has both names; its tools use the latter)."""
        super().setup()
        self.set_hook_aliases({f"blocks.{layer}.hook_{branch}_input": f"blocks.{layer}.attn.hook_{branch}_input"
                               for layer in range(len(self.blocks)) for branch in "qkv"})

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """TransformerLens's switch of the per-head q/k/v inputs, which `get_act_patch_direct_path` and edge
        attribution patching turn on. They fire here whenever watched; the switch adds them to an unfiltered
        `run_with_cache`. Post-norm models refuse it: a head's write is normalised before a later head reads
        it, so adding the write to that input (what those tools do) is no edge patch there."""
        if use_split_qkv_input and self.cfg.post_norm:
            raise ValueError("set_use_split_qkv_input(True): this model's blocks are post-norm (BERT), so a head's write "
                             "reaches later heads only through a norm and the residual stream is no sum of head writes; "
                             "TransformerLens's direct-path and edge attribution patching do not apply. Patch heads "
                             "(patching.get_act_patch_attn_head_*) instead.")
        object.__setattr__(self.cfg, "use_split_qkv_input", bool(use_split_qkv_input))

    def _always_on(self, switch: str, use: bool) -> None:
        if not use:
            raise ValueError(f"set_{switch}(False): {type(self).__name__}'s hooks fire whenever watched and cost nothing "
                             "otherwise, so there is nothing to switch off; leave it on.")

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens's switch of `attn.hook_result`: always on here (materialised only when watched)."""
        self._always_on("use_attn_result", use_attn_result)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """TransformerLens's switch of `hook_mlp_in`: always on here (it fires whenever watched)."""
        self._always_on("use_hook_mlp_in", use_hook_mlp_in)

    def check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Validate a (batch, pos) batch of token ids; raise an error that says how to fix it."""
        if not isinstance(tokens, torch.Tensor):
            raise TokenTypeError(f"tokens must be a torch.LongTensor of shape (batch, pos), got {type(tokens).__name__}.")
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TokenTypeError(
                f"tokens must be integer ids (torch.long), got dtype {tokens.dtype}; "
                "convert with tokens.long() if they are ids stored as floats."
            )
        if tokens.ndim == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (batch, pos), got shape {tuple(tokens.shape)} (rank {tokens.ndim}).")
        batch, n_pos = tokens.shape
        if batch == 0 or n_pos == 0:
            raise ValueError(f"tokens is empty (shape {tuple(tokens.shape)}); pass at least one token in one sequence.")
        if n_pos > self.cfg.n_ctx:
            raise ValueError(
                f"sequence length {n_pos} exceeds the model's context n_ctx={self.cfg.n_ctx}; "
                f"truncate to tokens[:, :{self.cfg.n_ctx}]."
            )
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.cfg.d_vocab:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.cfg.d_vocab}); check the tokenizer.")
        return tokens.long().to(self.device)

    def embed_tokens(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual stream at layer 0, and the position ids (padding-aware, as Hugging Face does)."""
        positions = self.position_ids(tokens.shape, attention_mask, device=tokens.device)
        resid = self.hook_embed(self.embed(tokens))
        if self.cfg.positional_embedding_type == "standard":
            resid = resid + self.hook_pos_embed(self.pos_embed(positions))
        return self.embed_extras(resid, tokens, token_type_ids), positions  # (batch, pos, d_model), (batch, pos)

    @staticmethod
    def position_ids(shape: tuple[int, ...], attention_mask: torch.Tensor | None, *, device=None) -> torch.Tensor:
        """(batch, pos) position ids: 0, 1, ... over the real tokens, padding-aware as Hugging Face counts them."""
        if attention_mask is None:
            return torch.arange(shape[1], device=device).expand(tuple(shape[:2]))
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def check_attention_mask(self, attention_mask: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor | None:
        if attention_mask is None:
            return None
        attention_mask = torch.as_tensor(attention_mask, device=tokens.device)
        if attention_mask.shape != tokens.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but tokens have shape "
                f"{tuple(tokens.shape)}; pass one 0/1 entry per token (1 = real, 0 = padding)."
            )
        if attention_mask.dtype != torch.bool and not ((attention_mask == 0) | (attention_mask == 1)).all():
            bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)].flatten()[0].item()
            raise ValueError(
                f"attention_mask holds {bad}; expected 1 for real tokens and 0 for padding. An additive "
                "mask (0 = keep, -inf = drop) converts with `(mask == 0).long()`."
            )
        return attention_mask.bool()

    def check_weights(self, *, cached: bool = False) -> None:
        """Raise if any parameter holds NaN or inf (the fused kernel can hide them in its output).

        `cached=True` skips the scan while no parameter changed since the last passing one (each
        in-place edit bumps a tensor's version counter), so every forward can afford the check.
        """
        key = tuple((p.data_ptr(), p._version) for p in self.parameters())
        if cached and key == getattr(self, "_finite_weights_key", None):
            return
        # a sum is NaN or inf if any entry is (or, rarely, if it overflows): only then look closer
        bad = [name for name, param in self.named_parameters()
               if not torch.isfinite(param.detach().sum()) and not torch.isfinite(param).all()]
        if bad:
            raise ValueError(f"non-finite weights (NaN or inf) in {bad[:8]}; fix or re-train the model before analysing it.")
        self._finite_weights_key = key

    def forward(
        self,
        tokens: torch.Tensor,
        return_type: ReturnType = "logits",
        *,
        attention_mask: torch.Tensor | None = None,
        stop_at_layer: int | None = None,
        loss_per_token: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ):
        """tokens (batch, pos) -> logits (batch, pos, d_vocab), next-token loss, both, or None.

        `stop_at_layer=n` runs only blocks 0..n-1 and returns the residual stream after them:
        analyses that read early layers stop there. `attention_mask` (batch, pos) marks real
        tokens with 1 and padding with 0; padded keys are masked out.
        """
        if return_type not in get_args(ReturnType):
            raise ValueError(f"return_type={return_type!r}; expected one of {list(get_args(ReturnType))}.")
        tokens = self.check_tokens(tokens)
        if stop_at_layer is not None and not 0 <= stop_at_layer <= self.cfg.n_layers:
            raise ValueError(f"stop_at_layer={stop_at_layer}; expected 0..{self.cfg.n_layers} (the number of blocks to run).")
        if return_type in ("loss", "both") and tokens.shape[1] < 2:
            raise ValueError("the next-token loss needs sequences of at least 2 tokens; got 1.")
        attention_mask = self.check_attention_mask(attention_mask, tokens)
        if not getattr(self, "allow_non_finite_weights", False):
            # the fused kernel skips masked keys, so NaN weights can give finite, wrong logits: refuse them
            # (`interp.verify_hooks` sets the flag to show what NaN does at every hook)
            self.check_weights(cached=True)
        resid, positions = self.embed_tokens(tokens, attention_mask, token_type_ids)
        for block in self.blocks[:stop_at_layer]:
            resid = block(resid, attention_mask, positions)
        if stop_at_layer is not None:
            return resid
        if return_type is None:
            return None
        logits = self.head(resid)
        if return_type == "logits":
            return logits
        loss = self.loss(logits, tokens, attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    # -- what analyses need from the forward: resuming it, each head's write, the loss from the residual

    @property
    def resumable(self) -> bool:
        """Whether `run_from(layer, resid_mid, after_attention=True)` equals the full forward: every block
        sequential pre-norm. Post-norm (BERT) and parallel (GPT-NeoX) blocks are not; callers run the hooked
        full forward there. (Resuming at `hook_resid_pre` is exact for every block type.)"""
        return all(block.resumes_after_attention for block in self.blocks)

    def run_from(
        self,
        layer: int,
        resid: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        after_attention: bool = False,
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Resume the forward from a cached residual stream (batch, pos, d_model); the residual stream
        after block `stop_at_layer - 1` (default: the last, before `ln_final`; `head` makes logits of it).

        `resid` is `blocks.{layer}.hook_resid_pre`, or with `after_attention=True` `blocks.{layer}.hook_resid_mid`
        (that layer's attention is not rerun: only where `resumable`). Hooks attached to the later blocks fire
        as in the full forward. `positions` default to those the full forward gives for `attention_mask`.
        """
        last = self.cfg.n_layers if stop_at_layer is None else stop_at_layer
        if not 0 <= layer < self.cfg.n_layers or not layer < last <= self.cfg.n_layers:
            raise ValueError(f"run_from(layer={layer}, stop_at_layer={stop_at_layer}); expected 0 <= layer < "
                             f"stop_at_layer <= {self.cfg.n_layers}.")
        if resid.ndim != 3 or resid.shape[-1] != self.cfg.d_model:
            raise ValueError(f"resid has shape {tuple(resid.shape)}; expected (batch, pos, {self.cfg.d_model}), "
                             f"e.g. a cached blocks.{layer}.hook_resid_pre.")
        if after_attention and not self.blocks[layer].resumes_after_attention:
            raise ValueError(f"block {layer} is not sequential pre-norm, so it cannot resume after its attention; "
                             f"resume from blocks.{layer}.hook_resid_pre, or run the full forward.")
        attention_mask = self.check_attention_mask(attention_mask, resid[..., 0])
        if positions is None:
            positions = self.position_ids(resid.shape, attention_mask, device=resid.device)
        if after_attention:
            resid = self.blocks[layer].after_attention(resid)
            layer += 1
        for block in self.blocks[layer:last]:
            resid = block(resid, attention_mask, positions)
        return resid

    def head_write(self, layer: int, head: int, z: torch.Tensor) -> torch.Tensor:
        """Head `head` of block `layer`: its write to the residual stream for z (batch, pos, d_head) ->
        (batch, pos, d_model), what `blocks.{layer}.attn.hook_result` carries for it."""
        return self.blocks[layer].attn.head_write(head, z)

    def next_token_loss_from_resid(
        self, resid: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, *, chunk: int = FUSED_CHUNK
    ) -> torch.Tensor:
        """Per-prompt weighted next-token cross-entropy (batch,) from the final residual stream
        (batch, pos, d_model): sum over predictions q of weights[b, q] * CE(q predicts token q + 1).

        With weights = mask / mask.sum(-1) this is `masked_next_token_loss(self.head(resid), tokens, mask)`
        (to float tolerance), computed fused: the unembedding and cross-entropy run a block of `chunk`
        positions at a time and only where a weight is non-zero, so the (batch, pos, d_vocab) logits never exist.
        """
        rows = weights.nonzero(as_tuple=True)
        x = self.ln_final(resid[:, :-1][rows])  # (scored, d_model)
        targets = tokens.to(resid.device)[:, 1:][rows]  # (scored,)
        dtype = torch.promote_types(resid.dtype, torch.float32)
        per = torch.empty(len(targets), dtype=dtype, device=resid.device)
        for start in range(0, len(targets), chunk):
            part = slice(start, start + chunk)
            logits = self.logits_from_hidden(x[part]).to(dtype)  # (chunk, d_vocab)
            per[part] = torch.logsumexp(logits, -1) - logits.gather(-1, targets[part, None])[:, 0]
        loss = torch.zeros(resid.shape[0], dtype=dtype, device=resid.device)
        loss.index_add_(0, rows[0], per * weights[rows])
        return loss

    @staticmethod
    def loss(
        logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, per_token: bool = False
    ) -> torch.Tensor:
        """Next-token cross-entropy: mean over scored predictions, or (batch, pos - 1) with `per_token=True`.

        A prediction is scored when both the query and the target are real tokens
        (`next_token_targets`); the toolkit's behaviour `interp.behaviour.next_token_loss` is this loss.
        """
        per = next_token_cross_entropy(logits, tokens)
        if per_token:
            return per
        if attention_mask is None:
            return per.mean()
        weights = next_token_targets(attention_mask).to(per.dtype)
        return (per * weights).sum() / weights.sum().clamp(min=1.0)


def next_token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(batch, pos, d_vocab) logits, (batch, pos) tokens -> (batch, pos - 1) cross-entropy of each next token.

    Position q predicts token q + 1. Half-precision logits are upcast to float32 (a stable softmax);
    float32 and float64 keep their dtype.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    tokens = tokens.to(logits.device)
    per = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    return per.view(tokens.shape[0], -1)  # (batch, pos - 1)


def masked_next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The one masked next-token loss: (batch,) mean cross-entropy over the (batch, pos - 1) `mask` of scored
    predictions, summed in float64 and returned in the logits' (upcast) dtype; 0 for a prompt with nothing scored."""
    per = next_token_cross_entropy(logits, tokens)  # (batch, pos - 1)
    weights = mask.to(per.device, torch.float64)
    mean = (per.double() * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)
    return mean.to(per.dtype)


def next_token_targets(attention_mask: torch.Tensor | None, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """(batch, pos - 1) bool: the next-token predictions worth scoring, query and target both real tokens.

    With left padding the first real token is "predicted" from a padded query, which sees nothing:
    that prediction is left out. `shape` (batch, pos) is needed when there is no mask.
    """
    if attention_mask is None:
        if shape is None:
            raise ValueError("next_token_targets needs the (batch, pos) shape when there is no attention mask.")
        return torch.ones(shape[0], shape[1] - 1, dtype=torch.bool)
    real = attention_mask.bool()
    return real[:, 1:] & real[:, :-1]
