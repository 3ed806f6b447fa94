"""What a model says about itself: vocabulary size, context length, its config.

One place that every analysis and the CLI ask, so `max_len` / `d_vocab` are requested from
the user only when the model truly does not say.
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


def vocab_size(model: Any) -> int | None:
    """cfg.d_vocab, a Hugging Face config's vocab_size, or the largest nn.Embedding's rows."""
    found = _positive_int_field(model_config(model), VOCAB_FIELDS)
    if found is not None or not isinstance(model, nn.Module):
        return found
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    return max(sizes) if sizes else None


def context_length(model: Any) -> int | None:
    """The longest sequence the model takes: cfg.n_ctx, n_positions, max_position_embeddings,
    block_size (nanoGPT), or the rows of a positional nn.Embedding (a second, smaller embedding
    beside the token embedding, or one whose name says `pos`). None when the model does not say."""
    found = _positive_int_field(model_config(model), CONTEXT_FIELDS)
    if found is not None or not isinstance(model, nn.Module):
        return found
    embeddings = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    positional = [m for name, m in embeddings if "pos" in name.rsplit(".", 1)[-1].lower()]
    if positional:
        return positional[0].num_embeddings
    if len(embeddings) == 2:
        return min(m.num_embeddings for _, m in embeddings)
    return None


def check_finite_weights(model: Any) -> None:
    """A ModelError naming the parameters that hold NaN or inf.

    Every analysis that runs a model asks here first: NaN weights give NaN metric rows (or, in a
    fused kernel that skips masked keys, finite wrong outputs), and an audit would blame the NaN
    on something else.
    """
    import torch

    from interp.errors import ModelError

    if not isinstance(model, nn.Module):
        return
    bad = [name for name, param in model.named_parameters() if not bool(torch.isfinite(param).all())]
    if bad:
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        raise ModelError(f"the model has non-finite weights (NaN or inf) in {bad[:8]}{more}; "
                         "fix or re-train it before analysing it.")
