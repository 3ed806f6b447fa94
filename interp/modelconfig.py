"""What a model's config says about it: its vocabulary size and context length.

The part of `interp.modelinfo` that knows no way of hooking a model, so that those ways
(`interp.sdpa` probes a model with token ids from its vocabulary) can ask it while
`interp.modelinfo` reads their weights; `interp.modelinfo` re-exports every name here.
"""
from __future__ import annotations

from typing import Any

from torch import nn

CONTEXT_FIELDS = ("n_ctx", "n_positions", "max_position_embeddings", "block_size")
VOCAB_FIELDS = ("d_vocab", "vocab_size")


def model_config(model: Any) -> Any:
    """`model.cfg` (ours, TransformerLens) or `model.config` (Hugging Face), else None."""
    return getattr(model, "cfg", None) or getattr(model, "config", None)


def _positive_int_field(cfg: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _is_positional(name: str) -> bool:
    """An nn.Embedding whose own name says `pos` (pos, pos_emb, position_embeddings) holds positions."""
    return "pos" in name.rsplit(".", 1)[-1].lower()


def vocab_size(model: Any) -> int | None:
    """cfg.d_vocab, a Hugging Face config's vocab_size, or the rows of the largest nn.Embedding that is not
    positional (a positional table longer than the vocabulary is not the token embedding)."""
    found = _positive_int_field(model_config(model), VOCAB_FIELDS)
    if found is not None or not isinstance(model, nn.Module):
        return found
    embeddings = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    tokens = [m for name, m in embeddings if not _is_positional(name)] or [m for _, m in embeddings]
    return max(m.num_embeddings for m in tokens) if tokens else None


def context_length(model: Any) -> int | None:
    """The longest sequence the model takes: cfg.n_ctx, n_positions, max_position_embeddings,
    block_size (nanoGPT), or the rows of a positional nn.Embedding (a second, smaller embedding
    beside the token embedding, or one whose name says `pos`). None when the model does not say."""
    found = _positive_int_field(model_config(model), CONTEXT_FIELDS)
    if found is not None or not isinstance(model, nn.Module):
        return found
    embeddings = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    positional = [m for name, m in embeddings if _is_positional(name)]
    if positional:
        return positional[0].num_embeddings
    if len(embeddings) == 2:
        return min(m.num_embeddings for _, m in embeddings)
    return None
