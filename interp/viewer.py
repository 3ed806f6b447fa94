"""An interactive attention viewer: offline HTML (no CDN, no network) for the report and for notebooks.

`viewer_data(model, prompts, heads)` captures the per-prompt attention patterns of a few
prompts (not the mean: a reader hovers one real sentence) and quantises every weight to one
byte (uint8, weight * 255 rounded; the error is at most 1/510), so 4 prompts x 72 heads x
40 x 40 tokens weigh about 450 KB before base64. Padding is dropped: each prompt keeps only
its real tokens, whose strings come from the model's tokenizer when it has one (else the ids).

`viewer_html(data)` returns one self-contained viewer: the data as an inline JSON script, the
script and style shipped as package data (`interp/assets/viewer.js`, `viewer.css`), both
inlined. Every render has its own element id, so any number of viewers work on one page (a
report, a notebook with several cells). `show(model, prompt)` is the notebook face: it returns
an `AttentionView`, which Jupyter renders inline through `_repr_html_`.

The viewer: an overview of every head's pattern as small multiples (rows are layers; click
one to open it), the chosen head's grid labelled with the prompt's tokens (hover a cell: its
query token, key token and weight), and the tokens shaded by the hovered query's weights.
Keys `j` / `k` (or arrow down / up) switch heads, arrow left / right move the query. With `ViewerData.qk`
(the report fills it for the heads it discusses), clicking a cell of the open head's grid lists the source
pairs behind that query's preference for its highest-attention key (`interp.analyses.qk`).

It lives in `interp` (not in `interp.analyses.report`) because it needs only the hooks and
the data types below it: the report renders it, and `interp.show` stays inside the layering.
"""
from __future__ import annotations

import base64
import html
import json
import os
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput, BadType
from interp.heads import head_label
from interp.hooks import attention_sites, hooked
from interp.outdir import write_output

MAX_PROMPTS = 4  # prompts embedded in the page
MAX_TOKENS = 48  # tokens kept per prompt (the first ones)
LEVELS = 255  # uint8 quantisation: weight = byte / 255

HeadPair = tuple[int, int]  # (layer, head)


@dataclass
class ViewerData:
    """What a viewer shows: token strings per prompt, heads, quantised patterns, the head opened first."""

    tokens: list[list[str]]  # per prompt, the real tokens' strings
    heads: list[str]  # head labels L{l}H{h}, in the order of the patterns' head axis
    patterns: list[np.ndarray] = field(repr=False)  # per prompt (head, query, key) uint8
    causal: bool = True
    positions: list[HeadPair] = field(default_factory=list)  # (layer, head) per label: the overview's rows and columns
    open_head: int = 0  # index into `heads` of the head shown in the grid first
    # source pairs behind some heads' cells (the report's `analyses.report.attend.viewer_pairs`); {} for none
    qk: dict[str, Any] = field(default_factory=dict, repr=False)

    def payload(self) -> dict[str, Any]:
        """JSON-ready: the bytes of every prompt's (head, query, key) block, base64, one string each."""
        return {
            "heads": self.heads, "tokens": self.tokens, "levels": LEVELS, "causal": self.causal,
            "positions": [list(p) for p in self.positions], "open": self.open_head,
            "patterns": [base64.b64encode(np.ascontiguousarray(p).tobytes()).decode("ascii") for p in self.patterns],
            **({"qk": self.qk} if self.qk else {}),
        }

    @property
    def n_bytes(self) -> int:
        return int(sum(p.nbytes for p in self.patterns))

    def _repr_html_(self) -> str:
        return viewer_html(self)


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


def capture_patterns(model: nn.Module, prompts: PromptSet, heads: Sequence[HeadPair]) -> torch.Tensor:
    """Attention patterns of `heads` on every prompt: (prompt, head, query, key), float32."""
    from interp.interventions import run_stopping_after

    sites = {s.layer: s for s in attention_sites(model)}
    layers = sorted({l for l, _ in heads})
    captured: dict[int, torch.Tensor] = {}

    def make_hook(layer: int) -> Callable[..., None]:
        def hook(pattern: torch.Tensor, hook: Any) -> None:  # (batch, head, query, key)
            captured[layer] = pattern.detach().float().cpu()
        return hook

    with torch.no_grad(), hooked(model, [(sites[l].hook("pattern"), make_hook(l)) for l in layers]):
        run_stopping_after(model, prompts, max(layers))
    return torch.stack([captured[l][:, h] for l, h in heads], dim=1).nan_to_num(0.0)


def viewer_data(model: nn.Module, prompts: PromptSet, heads: Sequence[HeadPair], *,
                n_prompts: int = MAX_PROMPTS, max_tokens: int = MAX_TOKENS, open_head: HeadPair | None = None) -> ViewerData:
    """The first `n_prompts` prompts' patterns for `heads`, padding dropped, quantised to uint8."""
    if not heads:
        raise BadInput("the viewer needs at least one head; pass heads=[(layer, head), ...].")
    heads = [(int(l), int(h)) for l, h in heads]
    if open_head is not None and open_head not in heads:
        raise BadInput(f"open_head {open_head} is not among the heads shown ({', '.join(map(head_label, heads))}).")
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
    return ViewerData(tokens, list(map(head_label, heads)), blocks, causal, positions=list(heads),
                      open_head=heads.index(open_head) if open_head is not None else 0)


def _asset(name: str) -> str:
    return resources.files("interp").joinpath("assets", name).read_text(encoding="utf-8")


# characters of JSON text that HTML or JavaScript may read as markup or a line end: written as \uXXXX escapes
HTML_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def html_json(value: Any) -> str:
    """`value` as JSON that is safe inline in an HTML <script> element: '<', '>', '&', U+2028 and
    U+2029 written as \\uXXXX. A token string such as '</script>', '<!--' then '<script>' (which would put the
    HTML parser in its "double escaped" state, so the element never closes) or ']]>' is then inert text that
    JSON.parse reads back unchanged. Every inline JSON of the toolkit's pages goes through here."""
    text = json.dumps(value, separators=(",", ":"))
    return text.translate({ord(c): escape for c, escape in HTML_UNSAFE.items()})


def viewer_html(data: ViewerData) -> str:
    """One viewer, self-contained: style, controls, overview, grid, the data (inline JSON) and the script.

    Its elements carry classes, not ids, under one root whose id is new on every call, so a page
    holds any number of viewers; the script starts only the viewer it follows."""
    uid = f"av-{uuid.uuid4().hex[:12]}"
    return (
        f"<style>{_asset('viewer.css')}</style>\n"
        f'<div id="{uid}" class="attn-viewer" tabindex="0" aria-label="attention viewer">'
        '<div class="av-controls"><label>prompt <select class="av-prompt"></select></label> '
        '<label>head <select class="av-head"></select></label> '
        '<span class="av-help">click a head in the overview to open it; hover the grid or a token (the query); '
        "j / k or arrow up / down: previous / next head; arrow left / right: move the query</span></div>"
        '<div class="av-overview" aria-label="every head\'s pattern on this prompt"></div>'
        '<div class="av-status" aria-live="polite"></div>'
        '<div class="av-tokens"></div>'
        '<div class="av-detail"><div class="av-grid" role="img" aria-label="pattern of the chosen head"></div>'
        '<div class="av-tip" hidden></div></div>'
        '<div class="av-qk" aria-live="polite" hidden></div>'
        f'<script type="application/json" class="av-data">{html_json(data.payload())}</script>'
        "</div>\n"
        f"<script>{_asset('viewer.js')}\ninterpAttentionViewer(document.getElementById({html_json(uid)}));</script>"
    )


def page_html(body: str, title: str = "attention viewer") -> str:
    """A whole HTML page around `body` (one or more viewers): opens from disk with no network."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"</head><body>{body}</body></html>\n")


# --------------------------------------------------------------------------- the notebook face


@dataclass
class AttentionView:
    """What `interp.show` returns: Jupyter renders it inline (`_repr_html_`); `save` writes a page."""

    data: ViewerData

    def _repr_html_(self) -> str:
        return viewer_html(self.data)

    def save(self, path: str | Path) -> Path:
        """Write a standalone page with this viewer (opens from disk, offline); returns the path.

        Written whole or not at all (`interp.outdir.write_output`); a directory, a missing folder or an empty
        name is refused with a BadInput naming `path`."""
        if not isinstance(path, (str, os.PathLike)):
            raise BadType(f"AttentionView.save(path): path must be a str or a pathlib.Path, got {type(path).__name__}.")
        return write_output(path, page_html(viewer_html(self.data)), what="the viewer page")

    def __repr__(self) -> str:
        d = self.data
        return (f"AttentionView({len(d.heads)} heads, {len(d.tokens)} prompt(s) of {max(map(len, d.tokens))} tokens, "
                f"open {d.heads[d.open_head]})")


def prompt_set(model: nn.Module, prompt: str | Sequence[int] | torch.Tensor | PromptSet) -> PromptSet:
    """`prompt` as a PromptSet: a string through the model's tokenizer, token ids as they are."""
    if isinstance(prompt, PromptSet):
        return prompt
    if isinstance(prompt, str):
        return PromptSet(_encode(model, prompt))
    if isinstance(prompt, torch.Tensor):
        tokens = prompt
    elif isinstance(prompt, Sequence) and all(isinstance(t, (int, np.integer)) for t in prompt):
        tokens = torch.tensor([int(t) for t in prompt], dtype=torch.long)
    else:
        raise BadType(f"show() takes a prompt as a string, token ids (a list of ints or a tensor) or a PromptSet; "
                      f"got {type(prompt).__name__}.")
    if tokens.is_floating_point() or tokens.ndim not in (1, 2) or (tokens.ndim == 2 and tokens.shape[0] != 1):
        raise BadInput(f"show() needs one prompt's integer token ids, shape (pos,) or (1, pos); got dtype "
                       f"{tokens.dtype}, shape {tuple(tokens.shape)}. For several prompts pass a PromptSet.")
    if tokens.numel() == 0:
        raise BadInput("show() got an empty prompt; pass at least one token.")
    return PromptSet(tokens.reshape(1, -1).long())


def _encode(model: nn.Module, text: str) -> torch.Tensor:
    """(1, pos) token ids of `text`: model.to_tokens where it exists, else model.tokenizer."""
    tokenizer = getattr(model, "tokenizer", None)
    to_tokens = getattr(model, "to_tokens", None)
    if tokenizer is None:
        raise BadInput(f"{type(model).__name__} has no tokenizer to encode {text[:30]!r}; pass token ids "
                       "(a list of ints or a LongTensor), or set model.tokenizer.")
    if to_tokens is not None:
        return torch.as_tensor(to_tokens(text)).reshape(1, -1).long()
    if callable(tokenizer) and hasattr(tokenizer, "convert_ids_to_tokens"):  # a Hugging Face tokenizer
        return torch.tensor([tokenizer(text)["input_ids"]], dtype=torch.long)
    return torch.tensor([list(tokenizer.encode(text))], dtype=torch.long)


def show(model: nn.Module, prompt: str | Sequence[int] | torch.Tensor | PromptSet, layer: int | None = None,
         head: int | None = None, *, max_tokens: int = MAX_TOKENS) -> AttentionView:
    """Every head's attention on `prompt` (of `layer` only, if given), with `head` of that layer opened first.

    In Jupyter the result renders inline; elsewhere `.save("view.html")` writes a page. Offline:
    the HTML holds its data, script and style, and references no URL. The first `max_tokens`
    tokens are shown (the page grows with heads x tokens^2 bytes); a PromptSet shows its first
    `MAX_PROMPTS` prompts, one at a time."""
    layer, head, shown = _whole("layer", layer), _whole("head", head), _whole("max_tokens", max_tokens)
    if shown is None or shown < 1:
        raise BadInput(f"max_tokens must be at least 1, got {max_tokens}.")
    sites = attention_sites(model)
    layers = [s.layer for s in sites]
    if layer is not None and layer not in layers:
        raise BadInput(f"layer {layer} does not exist; this model's attention layers are {layers[0]}..{layers[-1]}.")
    if head is not None and layer is None:
        raise BadInput(f"head={head} needs its layer: show(model, prompt, layer=..., head={head}).")
    chosen = [s for s in sites if layer is None or s.layer == layer]
    if head is not None and not 0 <= head < chosen[0].n_heads:
        raise BadInput(f"head {head} does not exist in layer {layer}, which has heads 0..{chosen[0].n_heads - 1}.")
    heads = [(s.layer, h) for s in chosen for h in range(s.n_heads)]
    prompts = prompt_set(model, prompt)
    open_head = (layer, head) if layer is not None and head is not None else None
    return AttentionView(viewer_data(model, prompts, heads, max_tokens=shown, open_head=open_head))


def _whole(name: str, value: Any) -> int | None:
    """`value` as an int (None stays None): a bool, a float or a string is refused with a BadType naming `name`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BadType(f"show(): {name} must be an int, got {type(value).__name__} {value!r}"
                      + (f"; pass {name}={int(value)}." if isinstance(value, float) and value.is_integer() else "."))
    return int(value)
