"""Model configurations, with fields named as TransformerLens names them.

A config is plain data: it serialises to JSON beside a checkpoint's safetensors file and
converts to and from `transformer_lens.config.TransformerBridgeConfig` where that makes sense.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

ActFn = Literal["gelu", "relu", "silu", "gelu_new"]  # gelu_new: the tanh approximation (GPT-2)
NormType = Literal["LN", "RMS", None]  # RMS: RMSNorm, a scale without centring or bias (Llama)
LMHead = Literal["unembed", "mlm", None]  # encoders: plain unembedding, BERT's MLM transform + unembedding, or none
PosEmbedType = Literal["standard", "rotary"]


def _check_choice(name: str, value: Any, literal: Any) -> None:
    allowed = get_args(literal)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {list(allowed)}.")


def check_seed_field(seed: Any) -> None:
    """A config's `seed`: a whole number in [0, 2**64) (what torch.manual_seed takes) or None."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise ValueError(f"seed={seed!r} must be a whole number in [0, 2**64) or null (torch's global generator).")


@dataclass(frozen=True)
class GPTConfig:
    """Shape and behaviour of a `HookedGPT` (a causal decoder)."""

    n_layers: int = 2  # number of transformer blocks
    n_heads: int = 4  # attention heads per layer
    d_model: int = 64  # width of the residual stream
    # d_head and d_mlp: None in the constructor means the default, which __post_init__ writes in, so a
    # config's readers always see an int (a dataclass cannot type a field's input and stored value apart)
    d_head: int = None  # type: ignore[assignment]  # width of one head; default d_model // n_heads
    n_ctx: int = 128  # longest sequence the model accepts
    d_vocab: int = 64  # number of token ids
    attn_only: bool = False  # True: no MLPs (the induction-circuit setting of Olsson et al.)
    d_mlp: int = None  # type: ignore[assignment]  # MLP hidden width; default 4 * d_model
    act_fn: ActFn = "gelu"  # MLP non-linearity
    normalization_type: NormType = "LN"  # "LN" (pre-norm LayerNorm) or None
    positional_embedding_type: PosEmbedType = "standard"  # learned absolute or rotary
    rotary_base: float = 10000.0  # rotary frequency base (rotary only)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon
    init_range: float = 0.02  # std of the normal initialisation of weights
    seed: int | None = None  # seed for weight initialisation; None uses torch's global RNG
    model_name: str = "HookedGPT"  # label used in reports
    # architecture variants, named as TransformerLens names them; the defaults are the
    # original HookedGPT, so checkpoints saved before these fields existed load unchanged
    n_key_value_heads: int | None = None  # key/value heads (grouped-query attention); None: n_heads
    rotary_dim: int | None = None  # leading dims of each head that rotary rotates (partial rotary); None: d_head
    gated_mlp: bool = False  # MLP out = (act(x W_gate) * (x W_in)) W_out, SwiGLU (Llama)
    parallel_attn_mlp: bool = False  # attention and MLP both read resid_pre (GPT-NeoX); no hook_resid_mid
    window_size: int | None = None  # sliding-window attention: a query sees its last window_size keys (Mistral)
    post_norm: bool = False  # norm after each residual add (BERT) instead of before each sublayer
    original_architecture: str | None = None  # the Hugging Face class a converted model came from
    tie_word_embeddings: bool = False  # W_U is W_E^T, one tensor (no unembed.W_U of its own): saved and updated once
    # Llama 3's rotary scaling ("NTK by parts", rope_type "llama3"): low frequencies divided by the factor
    use_NTK_by_parts_rope: bool = False
    NTK_by_parts_factor: float = 8.0  # divisor of the low frequencies
    NTK_by_parts_low_freq_factor: float = 1.0  # wavelengths above NTK_original_ctx_len / this are scaled
    NTK_by_parts_high_freq_factor: float = 4.0  # wavelengths below NTK_original_ctx_len / this are kept
    NTK_original_ctx_len: int = 8192  # the context length the model was pretrained with

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "d_model", "n_ctx", "d_vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        check_seed_field(self.seed)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "pass d_head explicitly."
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        _check_choice("act_fn", self.act_fn, ActFn)
        _check_choice("normalization_type", self.normalization_type, NormType)
        _check_choice("positional_embedding_type", self.positional_embedding_type, PosEmbedType)
        if self.positional_embedding_type == "rotary" and self.d_head % 2:
            raise ValueError(f"rotary embeddings need an even d_head, got {self.d_head}.")
        self._check_variants()

    def _check_variants(self) -> None:
        n_kv = self.n_key_value_heads
        if n_kv is not None and (not isinstance(n_kv, int) or n_kv < 1 or self.n_heads % n_kv):
            raise ValueError(
                f"n_key_value_heads={n_kv!r} must be a positive divisor of n_heads={self.n_heads} "
                "(each key/value head serves n_heads // n_key_value_heads query heads)."
            )
        rd = self.rotary_dim
        if rd is not None and (not isinstance(rd, int) or rd < 2 or rd % 2 or rd > self.d_head):
            raise ValueError(f"rotary_dim={rd!r} must be an even integer in [2, d_head={self.d_head}].")
        if self.window_size is not None and (not isinstance(self.window_size, int) or self.window_size < 1):
            raise ValueError(f"window_size={self.window_size!r} must be a positive integer or None.")
        if self.parallel_attn_mlp and (self.post_norm or self.attn_only):
            raise ValueError("parallel_attn_mlp needs an MLP and pre-norm blocks (attn_only=False, post_norm=False).")

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer (n_heads unless grouped-query attention)."""
        return self.n_key_value_heads or self.n_heads

    causal = True
    # TransformerLens's switches, runtime state (no fields: never saved); `HookedGPT.set_use_*` sets them.
    # Our hooks fire whenever watched, so result and mlp_in are always available; the split q/k/v inputs
    # too, and the switch only adds them to an unfiltered `run_with_cache`.
    use_split_qkv_input = False
    use_attn_result = True
    use_hook_mlp_in = True
    use_attn_in = False  # one residual copy per head for all of q, k, v: not built (the split inputs are)

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": type(self).__name__, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        data = dict(data)
        arch = data.pop("architecture", cls.__name__)
        if arch != cls.__name__:
            raise ValueError(f"config describes a {arch}, not a {cls.__name__}.")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(
                f"unknown {cls.__name__} fields {unknown}; expected a subset of {sorted(fields)}."
            )
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_bridge_config(self):
        """The matching `TransformerBridgeConfig`, e.g. for `TransformerBridge.boot_native`."""
        from transformer_lens.config import TransformerBridgeConfig

        return TransformerBridgeConfig(
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_model=self.d_model,
            d_head=self.d_head,
            n_ctx=self.n_ctx,
            d_vocab=self.d_vocab,
            d_mlp=self.d_mlp,
            act_fn=self.act_fn,
            attn_only=self.attn_only,
            normalization_type=self.normalization_type,
            positional_embedding_type=self.positional_embedding_type,
            rotary_base=self.rotary_base,
            eps=self.layer_norm_eps,
        )

    @classmethod
    def from_bridge_config(cls, bridge_cfg, **overrides):
        """Read the shared fields of a TransformerLens config; raise on a setting we cannot build."""
        names = ("n_layers", "n_heads", "d_model", "d_head", "n_ctx", "d_vocab", "d_mlp", "act_fn",
                 "attn_only", "positional_embedding_type", "rotary_base")
        values = {n: getattr(bridge_cfg, n) for n in names if getattr(bridge_cfg, n, None) is not None}
        values["normalization_type"] = getattr(bridge_cfg, "normalization_type", "LN")  # None (no norm) is a value
        if getattr(bridge_cfg, "eps", None) is not None:
            values["layer_norm_eps"] = bridge_cfg.eps
        for name, literal in (("act_fn", ActFn), ("normalization_type", NormType),
                              ("positional_embedding_type", PosEmbedType)):
            if name in values and name not in overrides:
                _check_choice(name, values[name], literal)
        return cls(**{**values, **overrides})


@dataclass(frozen=True)
class EncoderConfig(GPTConfig):
    """Shape of a `HookedEncoder`: bidirectional attention with a padding mask (BERT-style)."""

    pad_token_id: int = 0  # token id used to fill padded positions
    model_name: str = "HookedEncoder"
    n_token_types: int = 0  # token-type (segment) embeddings, BERT's token_type_ids; 0: none
    embed_norm: bool = False  # LayerNorm on the summed embeddings (BERT)
    lm_head: LMHead = "unembed"  # None: forward returns the final residual stream (a bare encoder)

    def _check_variants(self) -> None:
        super()._check_variants()
        _check_choice("lm_head", self.lm_head, LMHead)

    causal = False
