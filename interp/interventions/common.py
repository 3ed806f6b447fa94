"""What every intervention shares: the ablation kinds and sites, heads parsed and checked against a model,
prompts as a `PromptSet`, a forward stopped after a layer, and the digest that names a tensor in a memo key.

Vocabulary (as in `interp.models.components`): a head is `(layer, head)` (an `interp.heads.Head`),
labelled `L{layer}H{head}`; `z` (batch, pos, head, d_head) is pattern @ v, `result` (batch, pos,
head, d_model) is a head's write to the residual stream, `pattern` (batch, head, query, key) is
the post-softmax weights. Hook names always come from `interp.hooks.attention_sites(model)`.
"""
from __future__ import annotations

import collections.abc
import hashlib
from typing import TYPE_CHECKING, Iterable, Literal, get_args

import torch
from torch import nn

from interp.capture import stop_after
from interp.data import PromptSet
from interp.errors import BadType
from interp.heads import Head, HeadLike, head_label, parse_head
from interp.hooks import AttentionSite, attention_sites

if TYPE_CHECKING:
    from typing_extensions import TypeIs

AblationKind = Literal["zero", "mean", "resample", "auto"]
AblationSite = Literal["z", "result"]

ABLATION_KINDS: tuple[str, ...] = get_args(AblationKind)
ABLATION_SITES: tuple[str, ...] = get_args(AblationSite)


# ---------------------------------------------------------------------------------------------
# heads


def _is_one_head(heads: HeadLike | Iterable[HeadLike]) -> TypeIs[HeadLike]:
    """A label, or one (layer, head) pair of integers, rather than a collection of heads."""
    return isinstance(heads, str) or (
        isinstance(heads, (tuple, list)) and len(heads) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in heads)
    )


def parse_heads(heads: HeadLike | Iterable[HeadLike]) -> tuple[Head, ...]:
    """A tuple of Heads from one head or many (pairs or labels), duplicates removed, order kept."""
    if not (_is_one_head(heads) or isinstance(heads, collections.abc.Iterable)) or isinstance(heads, bytes):
        raise BadType(f"heads={heads!r} ({type(heads).__name__}) is not a head or a list of heads; pass an "
                      "'L{layer}H{head}' label, a (layer, head) pair of integers, or a list of them, e.g. "
                      "HeadAblation(['L1H2', (0, 3)]).")
    many = [heads] if _is_one_head(heads) else heads
    parsed = tuple(dict.fromkeys(parse_head(h) for h in many))
    if not parsed:
        raise ValueError("no heads given; pass at least one (layer, head) pair or 'L{layer}H{head}' label.")
    return parsed


def all_heads(model: nn.Module) -> tuple[Head, ...]:
    """Every (layer, head) of the model, in forward order."""
    return tuple(Head(site.layer, h) for site in attention_sites(model) for h in range(site.n_heads))


def check_heads(model: nn.Module, heads: HeadLike | Iterable[HeadLike]) -> tuple[Head, ...]:
    """Parse heads and check each exists in `model`; the error says which heads do."""
    parsed = parse_heads(heads)
    sites = {site.layer: site for site in attention_sites(model)}
    for layer, index in parsed:
        site = sites.get(layer)
        if site is None or not 0 <= index < site.n_heads:
            shape = ", ".join(f"layer {s.layer}: heads 0..{s.n_heads - 1}" for s in sites.values())
            raise ValueError(
                f"head {head_label((layer, index))} = ({layer}, {index}) does not exist in this "
                f"{type(model).__name__}; it has {len(sites)} attention layers ({shape})."
            )
    return parsed


def _sites_by_layer(model: nn.Module) -> dict[int, AttentionSite]:
    return {site.layer: site for site in attention_sites(model)}


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {list(allowed)}.")


# ---------------------------------------------------------------------------------------------
# running a model over prompts


def as_prompts(prompts: PromptSet | torch.Tensor) -> PromptSet:
    """A PromptSet from a PromptSet or a (prompt, pos) token tensor."""
    if isinstance(prompts, PromptSet):
        if len(prompts) == 0:
            raise ValueError("the prompt set is empty; pass at least one prompt.")
        return prompts
    if isinstance(prompts, torch.Tensor):
        return PromptSet(prompts if prompts.ndim == 2 else prompts.unsqueeze(0))
    raise BadType(f"prompts must be an interp.data.PromptSet or a (prompt, pos) token tensor, got {type(prompts).__name__}.")


def run_stopping_after(model: nn.Module, prompts: PromptSet, last_layer: int) -> None:
    """Forward `prompts` through the model, stopping after block `last_layer` where the model allows it
    (`interp.capture.stop_after`)."""
    kwargs = prompts.model_kwargs()
    tokens = prompts.tokens.to(getattr(model, "device", prompts.tokens.device))
    kwargs = {k: v.to(tokens.device) for k, v in kwargs.items()}
    model(tokens, **stop_after(model, [last_layer]), **kwargs)


# ---------------------------------------------------------------------------------------------
# sources computed per batch (PatternSource, TargetSource) and their digests


def _is_source(value: object) -> bool:
    """A TargetSource / PatternSource: callable as (run, batch), with a callable spec()."""
    return callable(value) and callable(getattr(value, "spec", None))


def tensor_digest(tensor: torch.Tensor) -> str:
    """blake2b of a tensor's shape, dtype and bytes: equal content, equal digest."""
    tensor = tensor.detach().cpu().contiguous()
    digest = hashlib.blake2b(f"{tuple(tensor.shape)}{tensor.dtype}".encode(), digest_size=16)
    digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()
