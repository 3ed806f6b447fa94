"""The window contract per layer: in a windowed layer, the attention a query pays to a key outside its window (more
than W - 1 positions back, or later) must be zero. Unlike the output check, this names the layer and head that broke
the window, and it still speaks where a full-attention layer hides the window from the outputs.

The weights are observed where they exist as tensors: a hooked model's `hook_pattern` (what `interp.load` and the CLI
give: the weights the model's own mask produced), or a Hugging Face model under eager attention, called with
`output_attentions=True` (its sdpa and flex_attention kernels return no weights). Elsewhere the reason is said and the
output check decides: an unobservable weight is never a failure of the model, nor a silent skip.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from interp.analyses.leakage.contracts.common import ContractFinding, parameters
from interp.errors import BadInput

# each attention layer in forward order: where it is (a hook's module path, or "layer l"), and its weights
# (head, query, key) on the first row
Observed = list[tuple[str, torch.Tensor]]
UNOBSERVED = "the output check decides"


def observe_weights(model: Any, tokens: torch.Tensor) -> tuple[Observed | None, str | None]:
    """Each attention layer's weights on `tokens` (1, pos), or None and why they cannot be observed."""
    hooked, why = _hooked_weights(model, tokens)
    if hooked is not None or why is not None:
        return hooked, why
    return _output_attentions(model, tokens)


def _hooked_weights(model: Any, tokens: torch.Tensor) -> tuple[Observed | None, str | None]:
    """The weights at every `hook_pattern` of a hooked model; (None, None) when the model is not hooked."""
    from interp.hooks import attention_sites, hooked

    if not isinstance(model, nn.Module) or not hasattr(model, "hook_dict"):
        return None, None
    try:
        sites = [site for site in attention_sites(model) if "pattern" in site.hooks]
    except BadInput:
        return None, None
    if not sites:
        return None, None
    seen: dict[str, torch.Tensor] = {}

    def record(pattern: torch.Tensor, hook: Any) -> None:
        seen[hook.name] = pattern.detach()[0].cpu()  # (head, query, key), in the model's dtype: no copy kept

    try:
        with torch.no_grad(), hooked(model, [(site.hook("pattern"), record) for site in sites]):
            model(tokens)
    except Exception as error:  # the explicit path the hooks need failed where the kernel ran: the output check decides
        return None, f"attention weights not observed (the hooked forward raised {type(error).__name__}): {UNOBSERVED}"
    silent = [site.hook("pattern") for site in sites if site.hook("pattern") not in seen]
    if silent:
        return None, (f"attention weights not observed: {', '.join(silent[:3])}{' ...' if len(silent) > 3 else ''} did "
                      "not fire (the attention ran where no hook was installed: another implementation than the one "
                      f"hooked, or a kernel such as flex_attention): {UNOBSERVED}")
    return [(site.module, seen[site.hook("pattern")]) for site in sites], None


def _output_attentions(model: Any, tokens: torch.Tensor) -> tuple[Observed | None, str]:
    """A Hugging Face model's `output_attentions` under eager attention; None and why elsewhere."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation is None:
        return None, ("attention weights not observable: the model is neither hooked (interp.load and the CLI hook it) "
                      f"nor a Hugging Face model (output_attentions): {UNOBSERVED}")
    if implementation != "eager":
        return None, (f"attention weights not observable under {implementation}: transformers returns them under "
                      f"eager attention only (audit with --attn-impls eager,{implementation} to check each layer): "
                      f"{UNOBSERVED}")
    extra = {"use_cache": False} if "use_cache" in parameters(model) else {}
    try:
        with torch.no_grad():
            found = getattr(model(tokens, output_attentions=True, **extra), "attentions", None)
    except Exception as error:  # the model's forward refused the flag: the output check decides
        return None, f"attention weights not observed (output_attentions raised {type(error).__name__}): {UNOBSERVED}"
    if not found or any(weights is None for weights in found):
        return None, f"attention weights not observed: the model returned no `attentions` under eager: {UNOBSERVED}"
    return [(f"layer {layer}", weights.detach()[0].cpu()) for layer, weights in enumerate(found)], ""


def windows_of_layers(observed: Observed, layer_windows: Sequence[int | None]) -> list[int | None] | None:
    """The window of each observed layer: the declared ones when the counts agree, the one window of every layer when
    only one is declared (the caller's W); None when they cannot be matched."""
    if len(observed) == len(layer_windows):
        return list(layer_windows)
    if len(set(layer_windows)) == 1:
        return [layer_windows[0]] * len(observed)
    return None


def outside_window(n_query: int, n_key: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query, key) bool, the queries the last of the keys: keys after the query, and keys W or more back."""
    i = torch.arange(n_key - n_query, n_key)[:, None]
    j = torch.arange(n_key)[None, :]
    return j > i, j <= i - size


def layer_findings(observed: Observed, layer_windows: Sequence[int | None],
                   run: str) -> tuple[list[ContractFinding], str | None]:
    """For each windowed layer and head, the largest weight on a later key (kind `future`) and on a key before the
    window (kind `window`), each a candidate finding naming its layer and head (NaN counts as infinite)."""
    windows = windows_of_layers(observed, layer_windows)
    if windows is None:
        return [], (f"attention weights not checked per layer: {len(observed)} attention layers observed, "
                    f"{len(layer_windows)} declared ({list(layer_windows)}): {UNOBSERVED}")
    found: list[ContractFinding] = []
    for layer, ((_, weights), size) in enumerate(zip(observed, windows)):
        if size is None:
            continue
        weights = torch.nan_to_num(weights.double().abs(), nan=float("inf"))  # (head, query, key)
        n_query, n_key = weights.shape[-2:]
        for kind, region in zip(("future", "window"), outside_window(n_query, n_key, size)):
            if not bool(region.any()):
                continue
            for head in range(weights.shape[0]):
                part = weights[head].masked_fill(~region, -1.0)
                i, j = divmod(int(part.argmax()), n_key)
                found.append(ContractFinding(kind, run, i + n_key - n_query, j, float(part[i, j]), layer, head))
    return found, None


def layer_words(finding: ContractFinding, observed: Observed | None, size: int | None) -> str:
    """A per-layer finding in words, for the origin: where the layer is, the head, the weight and the window."""
    where = "" if observed is None or finding.layer is None else f" ({observed[finding.layer][0]})"
    side = "a later key" if finding.kind == "future" else f"outside its window of {size}"
    return (f"in layer {finding.layer}{where}, head {finding.head}, query {finding.query} pays {finding.influence:.3g} "
            f"of its attention to key {finding.key}, {side}")
