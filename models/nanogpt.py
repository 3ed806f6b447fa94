"""nanoGPT checkpoints (`ckpt.pt`: `model_args` + `model` state dict) converted into `HookedGPT`.

nanoGPT's layout (Karpathy's `model.py`): `transformer.wte` / `wpe` embeddings, blocks
`transformer.h.{l}` with `ln_1`, `attn.c_attn` (one Linear for q, k, v), `attn.c_proj`, `ln_2`,
`mlp.c_fc`, `mlp.c_proj` (exact GELU), a final `transformer.ln_f` and `lm_head` (tied to `wte`,
no bias). `bias=False` checkpoints have no LayerNorm or Linear biases: they become zeros.
A model compiled with `torch.compile` saves its keys under `_orig_mod.`: the prefix is dropped.

The file is read with `torch.load(weights_only=True)`: tensors, numbers, strings and
containers only, never arbitrary pickled objects. Anything that is not this layout (missing
`model_args`, unknown or missing keys, shapes that disagree) raises a ValueError that names
what was found and what was expected.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal, Mapping, overload

import einops
import torch

from interp.models.config import GPTConfig
from interp.models.gpt import HookedGPT

REQUIRED_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
_COMPILED_PREFIX = "_orig_mod."


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(model_args, state dict) of a nanoGPT checkpoint file, without unpickling code."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # weights_only refuses pickled objects other than tensors and plain data
        raise ValueError(
            f"{path} cannot be read as a nanoGPT checkpoint with torch.load(weights_only=True): {error}. "
            "Expected a file saved by nanoGPT's train.py (a dict with 'model_args' and 'model')."
        ) from None
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("model_args"), Mapping) \
            or not isinstance(checkpoint.get("model"), Mapping):
        found = sorted(map(str, checkpoint))[:10] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise ValueError(
            f"{path} is not a nanoGPT checkpoint: expected a dict with 'model_args' and 'model' (the state dict), "
            f"found {found}. Save it as nanoGPT does: torch.save({{'model': model.state_dict(), "
            "'model_args': model_args}, path)."
        )
    return dict(checkpoint["model_args"]), dict(checkpoint["model"])


def config_from_args(model_args: Mapping[str, Any]) -> GPTConfig:
    """The HookedGPT config of a nanoGPT `model_args` dict."""
    missing = [name for name in REQUIRED_ARGS if name not in model_args]
    if missing:
        raise ValueError(f"nanoGPT model_args lack {missing}; expected the keys {list(REQUIRED_ARGS)} (and 'bias').")
    for name in REQUIRED_ARGS:  # int("2") or int(2.7) would quietly make another model
        value = model_args[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"nanoGPT model_args {name}={value!r} must be a positive integer.")
    return GPTConfig(
        n_layers=model_args["n_layer"], n_heads=model_args["n_head"], d_model=model_args["n_embd"],
        n_ctx=model_args["block_size"], d_vocab=model_args["vocab_size"], d_mlp=4 * model_args["n_embd"],
        act_fn="gelu", normalization_type="LN", layer_norm_eps=1e-5, model_name="nanoGPT",
    )


class _Keys:
    """The state dict, consumed key by key, so that missing and left-over keys are both reported."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self.state = {k.removeprefix(_COMPILED_PREFIX): v for k, v in state.items()}
        self.used: set[str] = set()

    @overload
    def take(self, key: str, shape: tuple[int, ...], optional: Literal[False] = False) -> torch.Tensor: ...
    @overload
    def take(self, key: str, shape: tuple[int, ...], optional: bool) -> torch.Tensor | None: ...

    def take(self, key: str, shape: tuple[int, ...], optional: bool = False) -> torch.Tensor | None:
        if key not in self.state:
            if optional:
                return None
            raise ValueError(f"nanoGPT state dict has no {key!r} (shape {shape} expected); is this a nanoGPT checkpoint?")
        tensor = self.state[key]
        self.used.add(key)
        if not isinstance(tensor, torch.Tensor) or not tensor.dtype.is_floating_point:
            what = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"nanoGPT state dict: {key!r} is {what}; weights must be floating point (cast to float, "
                             "integers would make another model).")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"nanoGPT state dict: {key!r} has shape {tuple(tensor.shape)}, model_args imply {shape}.")
        return tensor.float()

    def check_all_used(self) -> None:
        # the manual attention path's causal-mask buffer (attn.bias, 4-D) carries no weights
        left = [k for k in self.state if k not in self.used and not (k.endswith(".attn.bias") and self.state[k].dim() == 4)]
        if left:
            raise ValueError(f"nanoGPT state dict has keys this layout does not know: {left[:8]}; it is not a nanoGPT model.")


def _copy_attention(attn, keys: _Keys, prefix: str, cfg: GPTConfig) -> None:
    width = cfg.d_model
    qkv_weight = keys.take(f"{prefix}.c_attn.weight", (3 * width, width))  # (3 * d_model, d_model), out x in
    qkv_bias = keys.take(f"{prefix}.c_attn.bias", (3 * width,), optional=True)
    for index, (w, b) in enumerate(((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V))):
        rows = slice(index * width, (index + 1) * width)
        w.copy_(einops.rearrange(qkv_weight[rows], "(head d_head) d_model -> head d_model d_head", head=cfg.n_heads))
        if qkv_bias is not None:
            b.copy_(einops.rearrange(qkv_bias[rows], "(head d_head) -> head d_head", head=cfg.n_heads))
    out_weight = keys.take(f"{prefix}.c_proj.weight", (width, width))
    attn.W_O.copy_(einops.rearrange(out_weight, "d_model (head d_head) -> head d_head d_model", head=cfg.n_heads))
    _copy_bias(attn.b_O, keys.take(f"{prefix}.c_proj.bias", (width,), optional=True))


def _copy_bias(target: torch.Tensor, source: torch.Tensor | None) -> None:
    target.copy_(source) if source is not None else target.zero_()


def _copy_norm(norm, keys: _Keys, prefix: str, width: int) -> None:
    norm.w.copy_(keys.take(f"{prefix}.weight", (width,)))
    _copy_bias(norm.b, keys.take(f"{prefix}.bias", (width,), optional=True))


def from_nanogpt(model_args: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> HookedGPT:
    """A HookedGPT computing what the nanoGPT model of `model_args` + `state_dict` computes."""
    cfg = config_from_args(model_args)
    keys = _Keys(state_dict)
    width, mlp = cfg.d_model, cfg.d_mlp
    # lm_head is tied to wte in nanoGPT (one tensor here too); a checkpoint may store it, tied or not
    wte = keys.take("transformer.wte.weight", (cfg.d_vocab, width))
    head = keys.take("lm_head.weight", (cfg.d_vocab, width), optional=True)
    model = HookedGPT(dataclasses.replace(cfg, tie_word_embeddings=head is None or torch.equal(head, wte)))
    with torch.no_grad():
        model.embed.W_E.copy_(wte)
        model.pos_embed.W_pos.copy_(keys.take("transformer.wpe.weight", (cfg.n_ctx, width)))
        for layer, block in enumerate(model.blocks):
            prefix = f"transformer.h.{layer}"
            _copy_norm(block.ln1, keys, f"{prefix}.ln_1", width)
            _copy_attention(block.attn, keys, f"{prefix}.attn", cfg)
            _copy_norm(block.ln2, keys, f"{prefix}.ln_2", width)
            block.mlp.W_in.copy_(keys.take(f"{prefix}.mlp.c_fc.weight", (mlp, width)).t())
            _copy_bias(block.mlp.b_in, keys.take(f"{prefix}.mlp.c_fc.bias", (mlp,), optional=True))
            block.mlp.W_out.copy_(keys.take(f"{prefix}.mlp.c_proj.weight", (width, mlp)).t())
            _copy_bias(block.mlp.b_out, keys.take(f"{prefix}.mlp.c_proj.bias", (width,), optional=True))
        _copy_norm(model.ln_final, keys, "transformer.ln_f", width)
        if head is not None and not model.cfg.tie_word_embeddings:
            model.unembed.W_U.copy_(head.t())
        model.unembed.b_U.zero_()
    keys.check_all_used()
    return model.eval()


def load_nanogpt(path: str | os.PathLike) -> HookedGPT:
    """`from_nanogpt` of a checkpoint file; the model remembers where it came from in `metadata`."""
    model_args, state_dict = read_checkpoint(path)
    model = from_nanogpt(model_args, state_dict)
    model.metadata = {"source": "nanoGPT checkpoint", "path": os.fspath(path),
                      "model_args": {k: v for k, v in model_args.items() if isinstance(v, (int, float, bool, str))}}
    return model
