"""An interactive attention viewer embedded in `report.html`: offline, no CDN, a few prompts.

`viewer_data(model, prompts, heads)` captures the per-prompt attention patterns of a few
prompts (not the mean: a reader hovers one real sentence) and quantises every weight to one
byte (uint8, weight * 255 rounded; the error is at most 1/510), so 4 prompts x 72 heads x
40 x 40 tokens weigh about 450 KB before base64. Padding is dropped: each prompt keeps only
its real tokens, whose strings come from the model's tokenizer when it has one (else the ids).

`viewer_html(data)` returns the HTML section: the data as an inline JSON script, the script
and style shipped as package data (`analyses/report/assets/viewer.js`, `viewer.css`), both inlined,
so the report still opens from a folder with no network.

The page: choose a prompt and a head; hover (or focus) a token to see its attention over the
other tokens with the actual token strings (the shade and the number under each token); keys
`j` / `k` (or arrow down / up) switch heads, arrow left / right move the query.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from interp.data import PromptSet
from interp.heads import head_label
from interp.hooks import attention_sites, hooked

MAX_PROMPTS = 4  # prompts embedded in the page
MAX_TOKENS = 48  # tokens kept per prompt (the first ones)
LEVELS = 255  # uint8 quantisation: weight = byte / 255


@dataclass
class ViewerData:
    """What the page's viewer shows: token strings per prompt, head labels, quantised patterns."""

    tokens: list[list[str]]  # per prompt, the real tokens' strings
    heads: list[str]  # head labels L{l}H{h}, in the order of the patterns' head axis
    patterns: list[np.ndarray] = field(repr=False)  # per prompt (head, query, key) uint8
    causal: bool = True

    def payload(self) -> dict[str, Any]:
        """JSON-ready: the bytes of every prompt's (head, query, key) block, base64, one string each."""
        return {
            "heads": self.heads, "tokens": self.tokens, "levels": LEVELS, "causal": self.causal,
            "patterns": [base64.b64encode(np.ascontiguousarray(p).tobytes()).decode("ascii") for p in self.patterns],
        }

    @property
    def n_bytes(self) -> int:
        return int(sum(p.nbytes for p in self.patterns))


def token_strings(model: nn.Module, ids: Sequence[int]) -> list[str]:
    """The tokens as the model's tokenizer writes them ([CLS], ##ing, ...); ids as text without one."""
    tokenizer = getattr(model, "tokenizer", None)
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        return [str(t) for t in convert([int(i) for i in ids])]
    decode = getattr(tokenizer, "decode", None)
    if decode is not None:
        try:
            return [str(decode([int(i)])) for i in ids]
        except Exception:  # a tokenizer that decodes only whole sequences: fall back to ids
            pass
    return [str(int(i)) for i in ids]


def capture_patterns(model: nn.Module, prompts: PromptSet, heads: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Attention patterns of `heads` on every prompt: (prompt, head, query, key), float32."""
    from interp.interventions import run_stopping_after

    sites = {s.layer: s for s in attention_sites(model)}
    layers = sorted({l for l, _ in heads})
    captured: dict[int, torch.Tensor] = {}

    def make_hook(layer: int):
        def hook(pattern, hook):  # (batch, head, query, key)
            captured[layer] = pattern.detach().float().cpu()
        return hook

    with torch.no_grad(), hooked(model, [(sites[l].hook("pattern"), make_hook(l)) for l in layers]):
        run_stopping_after(model, prompts, max(layers))
    return torch.stack([captured[l][:, h] for l, h in heads], dim=1).nan_to_num(0.0)


def viewer_data(model: nn.Module, prompts: PromptSet, heads: Sequence[tuple[int, int]], *,
                n_prompts: int = MAX_PROMPTS, max_tokens: int = MAX_TOKENS) -> ViewerData:
    """The first `n_prompts` prompts' patterns for `heads`, padding dropped, quantised to uint8."""
    if not heads:
        raise ValueError("the viewer needs at least one head; pass heads=[(layer, head), ...].")
    chosen = prompts[torch.arange(min(n_prompts, len(prompts)))]
    patterns = capture_patterns(model, chosen, heads)  # (prompt, head, query, key)
    mask = chosen.attention_mask if chosen.attention_mask is not None else torch.ones_like(chosen.tokens)
    tokens, blocks = [], []
    for i in range(len(chosen)):
        real = mask[i].bool().nonzero().flatten()[:max_tokens]  # (real,) positions
        block = patterns[i][:, real][:, :, real]  # (head, query, key) over real tokens only
        blocks.append(np.rint(block.clamp(0, 1).numpy() * LEVELS).astype(np.uint8))
        tokens.append(token_strings(model, chosen.tokens[i, real].tolist()))
    causal = bool(attention_sites(model)[0].causal)
    return ViewerData(tokens, list(map(head_label, heads)), blocks, causal)


def _asset(name: str) -> str:
    return resources.files("interp.analyses.report").joinpath("assets", name).read_text(encoding="utf-8")


def _script_json(payload: dict[str, Any]) -> str:
    """JSON that is safe inside <script>: no '</' can close the element early."""
    return json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")


def viewer_html(data: ViewerData) -> str:
    """The viewer section: controls, the data (inline JSON), the inlined script and style."""
    return (
        f"<style>{_asset('viewer.css')}</style>\n"
        '<div id="attn-viewer" class="attn-viewer" tabindex="0" aria-label="attention viewer">'
        '<div class="av-controls"><label>prompt <select id="av-prompt"></select></label> '
        '<label>head <select id="av-head"></select></label> '
        '<span class="av-help">hover a token (the query) to see where it attends; j / k or arrow up / down: '
        "previous / next head; arrow left / right: move the query</span></div>"
        '<div id="av-status" class="av-status" aria-live="polite"></div>'
        '<div id="av-tokens" class="av-tokens"></div>'
        '<canvas id="av-grid" class="av-grid" width="320" height="320" aria-label="pattern of the chosen head"></canvas>'
        "</div>\n"
        f'<script type="application/json" id="av-data">{_script_json(data.payload())}</script>\n'
        f"<script>{_asset('viewer.js')}</script>"
    )
