"""TransformerLens's model surface on a user's own model hooked by interception (`hook_sdpa`, `hook_attention`).

TransformerLens's tools read `model.cfg` (shapes, device, dtype), `to_tokens` / `to_str_tokens`, and, for weight
and logit attributions, the stacked per-head weights (`W_Q` ... `W_O`), the unembedding and the final norm's
scale (`cache.logit_attrs`). A model hooked by interception gets:

- `cfg`, an `ObservedConfig` of what interception observed (n_layers, n_heads, d_head, d_model) and of the context
  and vocabulary its own config or embeddings give, unless the model has a `cfg` of its own. Anything else
  (`normalization_type` ...) is not known for a user's model: asking raises an AttributeError naming what is;
- `to_tokens`, `to_str_tokens`, `to_string` through `model.tokenizer`, when its factory attached one
  (`interp.models.tokenizers.TokenMethods`);
- only on a nanoGPT / minGPT layout (`FusedLayout`: fused `c_attn` and `c_proj` Linears in every attention
  module, `transformer.wte`, `transformer.ln_f`, `lm_head`): `W_Q`, `W_K`, `W_V`, `W_O`, `b_Q` ... `b_O`,
  `W_E`, `W_pos`, `W_U`, `b_U`, `tokens_to_residual_directions` and a `ln_final.hook_scale` hook on the final
  LayerNorm, so `cache.logit_attrs` gives each component's share of a logit. Elsewhere the per-head maps are not
  where a reading of the weights can find them (separate or other projections, rotary embeddings, a norm of
  another kind), and asking for one raises an AttributeError saying so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import einops
import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from interp.modelconfig import context_length, vocab_size
from interp.models.components import hook_is_live

WEIGHT_NAMES = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_E", "W_pos", "W_U", "b_U")
FINAL_SCALE = "ln_final.hook_scale"  # TransformerLens's name of the final norm's scale, which logit_attrs divides by


class ObservedConfig:
    """`model.cfg` for a user's model hooked by interception: the shapes interception observed (see the module).

    Not a dataclass on purpose: nothing may rebuild a user's model from it (the random-init control refuses)."""

    KNOWN = ("n_layers", "n_heads", "d_head", "d_model", "n_ctx", "d_vocab", "model_name", "normalization_type")

    def __init__(self, model: nn.Module, shapes: list[tuple[int, int]], d_model: int | None, layer_norm: bool):
        heads = {n for n, _ in shapes}
        self.n_layers = len(shapes)
        self.n_heads = heads.pop() if len(heads) == 1 else None  # layers of different widths: no one number
        self.d_head = shapes[0][1] if shapes and len({d for _, d in shapes}) == 1 else None
        self.d_model = d_model
        self.n_ctx = context_length(model)
        self.d_vocab = vocab_size(model)
        self.model_name = getattr(model, "_interp_original_class", type(model)).__name__
        if layer_norm:
            self.normalization_type = "LN"  # the final LayerNorm's scale is hooked: ln_final.hook_scale
        self._parameter = next(iter(model.parameters()), None)

    @property
    def device(self) -> torch.device:
        return self._parameter.device if self._parameter is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return self._parameter.dtype if self._parameter is not None else torch.float32

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        known = ", ".join(k for k in self.KNOWN if k in self.__dict__)
        raise AttributeError(f"cfg.{name}: interception observed only {known}, device and dtype of this user's model; "
                             f"{name} is not known for it (a HookedGPT's cfg has every TransformerLens field).")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={self.__dict__[k]!r}" for k in self.KNOWN if k in self.__dict__)
        return f"ObservedConfig({fields})"


@dataclass(frozen=True)
class FusedLayout:
    """A nanoGPT / minGPT model: where its weights are (see the module)."""

    attention: tuple[nn.Module, ...]  # per layer: the module holding c_attn and c_proj
    n_heads: int
    d_head: int
    wte: nn.Embedding
    wpe: nn.Embedding | None
    ln_f: nn.Module
    lm_head: nn.Linear


@dataclass
class Surface:
    """What `attach` gave a model, so `detach` can take it back and `weight` can answer or say why not."""

    layout: FusedLayout | None
    why_not: str  # why the model has no stacked weights ("" when it has them)
    added_cfg: bool


def attach(model: nn.Module, attention: list[tuple[nn.Module, int, int]], d_model: int | None = None) -> None:
    """Give a freshly intercepted `model` its TransformerLens surface, before its `setup()` indexes the hooks.

    `attention`: per layer, in forward order, (the module computing attention, n_heads, d_head); `d_model`: the
    residual width where interception saw it (an output projection's width)."""
    layout, why_not = fused_layout(model, attention)
    if layout is not None and not _hook_final_norm(layout.ln_f):
        layout, why_not = None, "its final norm transformer.ln_f is not a LayerNorm this toolkit can reproduce"
    added = "cfg" not in dir(model)
    if added:
        d_model = layout.wte.embedding_dim if layout is not None else d_model or _d_model(attention)
        model.__dict__["cfg"] = ObservedConfig(model, [(n, d) for _, n, d in attention], d_model, layout is not None)
    model.__dict__["_interp_surface"] = Surface(layout, why_not, added)


def detach(model: nn.Module) -> None:
    """Undo `attach` (`unhook_sdpa`)."""
    surface = model.__dict__.pop("_interp_surface", None)
    if surface is None:
        return
    if surface.added_cfg:
        model.__dict__.pop("cfg", None)
    if surface.layout is not None:
        _unhook_final_norm(surface.layout.ln_f)


def aliases(model: nn.Module) -> dict[str, str]:
    """TransformerLens's names this surface adds: the final norm's scale, where hooked."""
    surface = model.__dict__.get("_interp_surface")
    if surface is None or surface.layout is None:
        return {}
    path = next(name for name, module in model.named_modules() if module is surface.layout.ln_f)
    return {FINAL_SCALE: f"{path}.hook_scale"}


def fused_layout(model: nn.Module, attention: list[tuple[nn.Module, int, int]]) -> tuple[FusedLayout | None, str]:
    """The model's nanoGPT / minGPT layout, or None and why it has none."""
    transformer = getattr(model, "transformer", None)
    wte, wpe = getattr(transformer, "wte", None), getattr(transformer, "wpe", None)
    ln_f, lm_head = getattr(transformer, "ln_f", None), getattr(model, "lm_head", None)
    if not isinstance(wte, nn.Embedding) or not isinstance(lm_head, nn.Linear) or not isinstance(ln_f, nn.Module):
        return None, "it is not laid out as nanoGPT / minGPT (transformer.wte, transformer.ln_f, lm_head)"
    shapes = {(n, d) for _, n, d in attention}
    if len(shapes) != 1:
        return None, "its attention layers differ in shape"
    (n_heads, d_head), width = shapes.pop(), wte.embedding_dim
    for module, _, _ in attention:
        c_attn, c_proj = getattr(module, "c_attn", None), getattr(module, "c_proj", None)
        fused = isinstance(c_attn, nn.Linear) and c_attn.in_features == width and c_attn.out_features == 3 * n_heads * d_head
        if not fused or not isinstance(c_proj, nn.Linear) or c_proj.weight.shape != (width, n_heads * d_head):
            return None, ("its attention does not compute q, k and v with one fused Linear c_attn (d_model -> 3 x "
                          "n_heads x d_head) and write through c_proj")
    wpe = wpe if isinstance(wpe, nn.Embedding) else None
    return FusedLayout(tuple(m for m, _, _ in attention), n_heads, d_head, wte, wpe, ln_f, lm_head), ""


def weight(model: nn.Module, name: str) -> torch.Tensor:
    """A stacked TransformerLens weight of a fused-layout model (see the module); AttributeError elsewhere."""
    layout = _layout(model, name)
    if name in ("W_E", "W_pos", "W_U", "b_U"):
        return _embedding_weight(layout, name)
    per_layer = [_layer_weight(layout, module, name) for module in layout.attention]
    return torch.stack(per_layer)


def residual_directions(model: nn.Module, tokens: Any) -> torch.Tensor:
    """Each token's direction in the normalised final residual stream, (*tokens.shape, d_model): its unembedding
    column times the final LayerNorm's gain (as HookedGPT's `tokens_to_residual_directions`)."""
    layout = _layout(model, "tokens_to_residual_directions")
    if isinstance(tokens, str):
        tokens = model.to_single_token(tokens)  # type: ignore[operator]
    gain = getattr(layout.ln_f, "weight", None)
    W_U = layout.lm_head.weight.t()  # (d_model, d_vocab)
    W_U = W_U if gain is None else gain[:, None] * W_U
    if not isinstance(tokens, torch.Tensor) or tokens.numel() == 1:
        return W_U[:, int(tokens)]  # (d_model,)
    return einops.rearrange(W_U[:, tokens.to(W_U.device)], "d_model ... -> ... d_model")


def _layout(model: nn.Module, name: str) -> FusedLayout:
    surface = model.__dict__.get("_interp_surface")
    if surface is not None and surface.layout is not None:
        return surface.layout
    why = surface.why_not if surface is not None else "it was not hooked by interception"
    raise AttributeError(
        f"{type(model).__name__}.{name}: stacked per-head weights (and logit attributions) are read only from a "
        f"nanoGPT / minGPT layout (a fused c_attn Linear per attention, transformer.wte, transformer.ln_f, lm_head), "
        f"and {why}. Its hooks (hook_q ... hook_result, cache['pattern', layer]) work; for weight-based tools, convert "
        "it to a HookedGPT (a Hugging Face folder through interp.load, or a nanoGPT ckpt.pt through interp.load).")


def _layer_weight(layout: FusedLayout, module: nn.Module, name: str) -> torch.Tensor:
    width = layout.n_heads * layout.d_head
    c_attn, c_proj = module.get_submodule("c_attn"), module.get_submodule("c_proj")
    assert isinstance(c_attn, nn.Linear) and isinstance(c_proj, nn.Linear)  # `fused_layout` checked both
    if name in ("W_O", "b_O"):
        if name == "b_O":
            return c_proj.bias if c_proj.bias is not None else torch.zeros_like(c_proj.weight[:, 0])
        return einops.rearrange(c_proj.weight, "d_model (head d_head) -> head d_head d_model", head=layout.n_heads)
    part = "QKV".index(name[-1])
    rows = slice(part * width, (part + 1) * width)
    if name.startswith("b_"):
        bias = c_attn.bias[rows] if c_attn.bias is not None else torch.zeros_like(c_attn.weight[rows, 0])
        return einops.rearrange(bias, "(head d_head) -> head d_head", head=layout.n_heads)
    return einops.rearrange(c_attn.weight[rows], "(head d_head) d_model -> head d_model d_head", head=layout.n_heads)


def _embedding_weight(layout: FusedLayout, name: str) -> torch.Tensor:
    if name == "W_E":
        return layout.wte.weight
    if name == "W_pos":
        if layout.wpe is None:
            raise AttributeError("W_pos: this model has no learned position embedding transformer.wpe.")
        return layout.wpe.weight
    head = layout.lm_head
    if name == "W_U":
        return head.weight.t()
    return head.bias if head.bias is not None else torch.zeros_like(head.weight[:, 0])


def _d_model(attention: list[tuple[nn.Module, int, int]]) -> int | None:
    """The residual width where no output projection said it: an nn.MultiheadAttention's embed_dim, else
    n_heads x d_head."""
    module, n_heads, d_head = attention[0] if attention else (None, 0, 0)
    embed_dim = getattr(module, "embed_dim", None)
    if isinstance(embed_dim, int):
        return embed_dim
    return n_heads * d_head or None


# --------------------------------------------------------------------------- the final norm's scale, hooked


class _HookedLayerNorm:
    """First base of a final LayerNorm's class once hooked: its scale passes through `hook_scale` while a hook is
    live (as HookedGPT's ln_final computes it); otherwise the module's own forward runs, unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        point = self._modules["hook_scale"]  # type: ignore[attr-defined]
        if not hook_is_live(point):
            return super().forward(x)  # type: ignore[misc]
        return _explicit_layer_norm(self, x, point)  # type: ignore[arg-type]


def _explicit_layer_norm(module: nn.Module, x: torch.Tensor, point: nn.Module) -> torch.Tensor:
    centred = x - x.mean(-1, keepdim=True)
    scale = point((centred.pow(2).mean(-1, keepdim=True) + getattr(module, "eps", 1e-5)).sqrt())  # (..., 1)
    out = centred / scale
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    out = out * weight if isinstance(weight, torch.Tensor) else out
    return out + bias if isinstance(bias, torch.Tensor) else out


_HOOKED_NORMS: dict[type, type] = {}


def _hook_final_norm(ln_f: nn.Module) -> bool:
    """Give `ln_f` a `hook_scale` when the explicit computation reproduces its forward; False otherwise."""
    weight = getattr(ln_f, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 1:
        return False
    probe = torch.randn(2, 3, weight.shape[0], generator=torch.Generator().manual_seed(0)).to(weight)
    with torch.no_grad():
        try:
            same = torch.allclose(ln_f(probe), _explicit_layer_norm(ln_f, probe, nn.Identity()), rtol=1e-4, atol=1e-5)
        except Exception:  # a norm of another signature: not hooked, said in the AttributeError
            return False
    if not same:
        return False
    cls = type(ln_f)
    if cls not in _HOOKED_NORMS:
        _HOOKED_NORMS[cls] = type(f"ScaleHooked{cls.__name__}", (_HookedLayerNorm, cls),
                                  {"_interp_original_class": cls, "__module__": cls.__module__})
    ln_f.add_module("hook_scale", HookPoint())
    ln_f.__class__ = _HOOKED_NORMS[cls]
    return True


def _unhook_final_norm(ln_f: nn.Module) -> None:
    ln_f.__class__ = getattr(ln_f, "_interp_original_class", type(ln_f))
    if "hook_scale" in ln_f._modules:
        del ln_f._modules["hook_scale"]
