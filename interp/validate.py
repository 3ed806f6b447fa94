"""Argument validation for every public entry point: one helper per kind of argument.

Each helper returns the checked (normalised) value or raises `BadType` / `BadInput` (exit 2)
with a message naming the argument, what was expected and the fix. `where` names the entry
point the user called ("focus", "test_claims"), so the message says where the value went.

- `check_model(model, where)`: an `nn.Module` (not a prompt set passed first, not a spec string),
  with its weights off the meta device.
- `check_prompt_arg(prompts, where)`: an `interp.data.PromptSet` (a tensor, a list, None or a model
  get the constructor to use), non-empty.
- `check_inputs(where, model, prompts, layers=, seed=)`: the four above at once, for an analysis entry point.
- `check_layers(layers, where)`: None or whole-number layer indices (sorted, unique).
- `check_seed(seed, where)`: an integer in [0, SEED_MAX] (the CLI's `--seed` range).
- `check_head_pair(a, b, what)`: two different heads (a claim pairing a head with itself is refused).
- `check_claims(claims, Claim, where)`: a list of `Claim` objects; a single Claim is accepted as one.
- `check_unit_interval(value, name, owner)` / `check_whole(value, name, owner)`: numbers of a head type.
- `as_real(value, name, where)` / `check_fraction(value, name, where)`: a real number (numpy scalars and 0-d
  tensors too), and one in [0, 1) (a circuit's threshold: a fraction of the clean-vs-patched gap).
- `select_output(model, output)` / `model_logits(model, output)`: which part of a forward's output is
  the logits (`interp.modelinfo.output_logits`, the one place outputs are read).

Standard library at import (the CLI imports `SEED_MAX` before torch); torch is imported when a check runs.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from interp.errors import BadInput, BadType
from interp.heads import head_label

SEED_MAX = 2**32 - 1  # torch generators take 64 bits; analyses add small offsets to a seed, so 32 leave room
PROMPT_HELP = "build one with interp.data.repeated_tokens, random_tokens, text_prompts or pad"


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _is_whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_model(model: Any, where: str = "") -> Any:
    """`model` if it is an nn.Module whose weights hold values; BadType / BadInput naming the fix otherwise."""
    from torch import nn

    from interp.data import PromptSet

    if isinstance(model, PromptSet):
        raise BadType(f"{_at(where)}the model argument is a PromptSet: the arguments are swapped; call "
                      f"{where or 'it'}(model, prompts), the model first.")
    if isinstance(model, str):
        raise BadType(f"{_at(where)}model={model!r} is a string; load it first: model = interp.load({model!r}).")
    if not isinstance(model, nn.Module):
        raise BadType(f"{_at(where)}expected a model (a torch nn.Module, e.g. interp.load('toy-induction')), got "
                      f"{type(model).__name__}.")
    check_not_meta(model, where)
    return model


def check_not_meta(model: Any, where: str = "") -> None:
    """BadInput when the model's parameters or buffers are on the meta device (shapes without values)."""
    tensors = [*model.parameters(), *model.buffers()] if hasattr(model, "parameters") else []
    if any(t.device.type == "meta" for t in tensors):
        raise BadInput(f"{_at(where)}the {type(model).__name__}'s weights are on the meta device (shapes without values, "
                       "e.g. built under torch.device('meta')); materialise and fill them first: "
                       "model.to_empty(device='cpu') then model.load_state_dict(weights).")


def check_prompt_arg(prompts: Any, where: str = "", *, n_ctx: int | None = None, d_vocab: int | None = None):
    """`prompts` if it is a non-empty PromptSet (within `n_ctx` / `d_vocab` when given); else a BadType naming
    the constructor that builds one from what was passed."""
    import torch
    from torch import nn

    from interp.data import PromptSet
    from interp.data import check_prompts as check_contents

    if isinstance(prompts, PromptSet):
        return check_contents(prompts, n_ctx=n_ctx, d_vocab=d_vocab)
    if isinstance(prompts, torch.Tensor):
        hint = (f"a torch.Tensor of shape {tuple(prompts.shape)}; wrap token ids (prompt, pos) in a PromptSet: "
                "interp.data.PromptSet(tokens)")
    elif isinstance(prompts, (list, tuple)):
        hint = (f"a {type(prompts).__name__}; token-id rows become a PromptSet with interp.data.pad(rows) (rows of any "
                "length) or interp.data.PromptSet(torch.tensor(rows))")
    elif prompts is None:
        hint = f"None; pass a PromptSet ({PROMPT_HELP}, e.g. interp.data.repeated_tokens(64, 8, d_vocab))"
    elif isinstance(prompts, nn.Module):
        hint = (f"a model ({type(prompts).__name__}): the arguments look swapped; call {where or 'it'}(model, prompts), "
                "the model first")
    else:
        hint = f"a {type(prompts).__name__}; {PROMPT_HELP}"
    raise BadType(f"{_at(where)}prompts must be an interp.data.PromptSet, got {hint}.")


def check_inputs(where: str, model: Any, prompts: Any, *, layers: Any = None, seed: Any = 0) -> tuple[tuple[int, ...] | None, int]:
    """What an analysis entry point `where(model, prompts, layers=, seed=)` checks first: the model, the prompts,
    the layers and the seed (in that order: a swapped call is named as such); returns (layers, seed)."""
    check_model(model, where)
    check_prompt_arg(prompts, where)
    return check_layers(layers, where), check_seed(seed, where)


def check_layers(layers: Any, where: str = "") -> tuple[int, ...] | None:
    """None, or the sorted unique layer indices: one whole number or an iterable of them."""
    if layers is None:
        return None
    if _is_whole(layers):
        return (int(layers),)
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise BadType(f"{_at(where)}layers={layers!r} must be layer indices, e.g. layers=[0, 1].")
    values = list(layers)
    bad = [v for v in values if not _is_whole(v)]
    if bad:
        raise BadType(f"{_at(where)}layers={values!r}: layer {bad[0]!r} is not a whole number; pass integer layer "
                      "indices, e.g. layers=[0, 1].")
    if not values:
        raise BadInput(f"{_at(where)}layers=[] selects no layer; pass None for all of them or at least one index.")
    return tuple(sorted(set(int(v) for v in values)))


def check_seed(seed: Any, where: str = "") -> int:
    """`seed` as an int in [0, SEED_MAX]; BadType for a non-integer, BadInput outside the range."""
    if not _is_whole(seed):
        raise BadType(f"{_at(where)}seed={seed!r} must be a whole number in [0, 2**32 - 1], e.g. seed=0.")
    if not 0 <= seed <= SEED_MAX:
        raise BadInput(f"{_at(where)}seed={seed} is outside [0, 2**32 - 1] (torch's generators overflow beyond it); "
                       "pass a smaller non-negative seed.")
    return int(seed)


def check_head_pair(a: tuple[int, int], b: tuple[int, int], what: str) -> None:
    """A claim about two heads needs two different heads."""
    if tuple(a) == tuple(b):
        label = head_label(a)
        raise BadInput(f"a {what} claim pairs {label} with itself; name two different heads, e.g. \"{label} ~ {head_label((a[0], a[1] + 1))}\".")


def check_claims(claims: Any, claim_type: type, where: str = "test_claims") -> list:
    """A non-empty list of `claim_type` objects (`interp.claims.Claim`, passed in: this module sits below
    interp.claims); a single Claim counts as one."""
    Claim = claim_type  # noqa: N806

    if isinstance(claims, Claim):
        return [claims]
    if isinstance(claims, (str, bytes)) or not hasattr(claims, "__iter__"):
        raise BadType(f"{where}: claims must be a Claim or a list of Claim objects, got {type(claims).__name__}; build "
                      "claims with interp.analyses.claims (e.g. previous_token_head(0, 1)).")
    claims = list(claims)
    if not claims:
        raise BadInput(f"{where}: no claims to test; pass a list of Claim objects (see interp.analyses.claims).")
    bad = [c for c in claims if not isinstance(c, Claim)]
    if bad:
        raise BadType(f"{where}: expected Claim objects, got {type(bad[0]).__name__} ({bad[0]!r}); build claims with "
                      "interp.analyses.claims (e.g. previous_token_head(0, 1)).")
    return claims


def check_unit_interval(value: Any, name: str, owner: str, *, optional: bool = False) -> None:
    """A finite real number in [0, 1] (None too with `optional`): a share of attention or of a loss."""
    if optional and value is None:
        return
    real = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if not real or not math.isfinite(value) or not 0 <= float(value) <= 1:
        raise BadInput(f"{owner}: {name}={value!r} must be a finite number in [0, 1] (a share of attention or of "
                       "the loss), e.g. 0.5.")


def as_real(value: Any, name: str, where: str = "") -> float:
    """`value` as a float: a real number (int, float, a numpy scalar) or a 0-d tensor or array holding one;
    BadType naming `name` otherwise (a string, a bool, several values). NaN and infinities pass: callers check
    the range."""
    if not isinstance(value, (bool, str, bytes)):
        if isinstance(value, numbers.Real):
            return float(value)
        if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):  # a 0-d tensor or array
            item = value.item()
            if isinstance(item, numbers.Real) and not isinstance(item, bool):
                return float(item)
    raise BadType(f"{_at(where)}{name}={value!r} is not a number; expected a real number (an int, a float, or a 0-d "
                  "tensor holding one).")


def check_fraction(value: Any, name: str, where: str = "", *, what: str = "a fraction", example: float = 0.01) -> float:
    """`value` as a float in [0, 1) (`as_real`: numbers, numpy scalars, 0-d tensors): a fraction of a whole, below it.
    NaN, infinities and values outside the range are a BadInput naming `name`."""
    number = as_real(value, name, where)
    if not (math.isfinite(number) and 0 <= number < 1):
        raise BadInput(f"{_at(where)}{name}={value!r}; expected {what} in [0, 1), e.g. {example}.")
    return number


def check_whole(value: Any, name: str, owner: str, *, minimum: int | None = None) -> int:
    """A whole number (not a bool, not 0.7 truncated to 0), at least `minimum` when given."""
    if not _is_whole(value):
        raise BadType(f"{owner}: {name}={value!r} must be a whole number (a relative position, e.g. -2), not "
                      f"{type(value).__name__}.")
    if minimum is not None and value < minimum:
        raise BadInput(f"{owner}: {name}={value!r} must be at least {minimum}.")
    return int(value)


# --------------------------------------------------------------------------- which output is the logits

OUTPUT_ATTRIBUTE = "interp_output"  # where `select_output` records the selector on the model


def check_output_selector(output: Any) -> Any:
    """None, a key / attribute name (str), a tuple index (int) or a callable; BadType otherwise."""
    if output is None or isinstance(output, str) or _is_whole(output) or callable(output):
        return int(output) if _is_whole(output) else output
    raise BadType(f"output={output!r} must name the logits in the model's output: a dict key or attribute "
                  "(output='logits'), a tuple index (output=1) or a function of the output.")


def select_output(model: Any, output: Any) -> Any:
    """Record on `model` which part of its forward's output is the logits (`interp.load(..., output=)`,
    `--logits-key`); returns the model. None clears it (tensors, `.logits`, {'logits': ...} need none)."""
    output = check_output_selector(output)
    if output is None:
        model.__dict__.pop(OUTPUT_ATTRIBUTE, None)
    else:
        object.__setattr__(model, OUTPUT_ATTRIBUTE, output)
    return model


def output_selector(model: Any) -> Any:
    """The selector recorded by `select_output` (None when none was)."""
    return getattr(model, "__dict__", {}).get(OUTPUT_ATTRIBUTE)
