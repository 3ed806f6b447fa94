"""The causal check of a QK attribution: remove a pair's sources from the head's input and read its score.

A term `Q_a(q) . K_b(k)` is the pair's share of the score. Removing source `a` from only the head's query
input (and nothing else) removes every term of row a; removing `b` from only its key input removes column
b; removing both removes both, the pair's term once. So the pair's own term is measured by four scores,

    measured(a, b) = s(-a, -b) - s(-a) - s(-b) + s

read through `interp.Run` (`SourceRemoval` interventions, a behaviour that reads the head's score:
`score_behaviour`, an `interp.behaviour` activation read). Sources in the residual stream (embeddings,
heads, MLPs, b_O) are subtracted from the head's split input (`hook_q_input` / `hook_k_input`, before the
norm); those added after the norm (ln_bias, b_Q, b_K) from its projected query or key (`hook_q` / `hook_k`,
rotated as the model rotates them). Each pair is measured twice:

- norm scale frozen (`ln1.hook_scale` pinned at its clean-run value): the norm is then affine, so the
  measurement must equal the attribution's term to float rounding; a test of the arithmetic, not of the model;
- live: the norm recomputes its scale from the input with the source removed, as the model would. How far
  the live number is from the prediction is how far the frozen-scale reading is from what removing the
  source does.

Both say what the pair does to *this head's score*; neither is a statement about the model's output (the
linear prediction is exact for the score, not for downstream behaviour).
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import pandas as pd
import torch
from torch import nn

from interp.analyses.qk.common import UNIT, View
from interp.analyses.qk.sources import Side, Source, check_qk_head, side_weights, sources
from interp.behaviour import Behaviour, UndefinedOnPrompts
from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import Head, head_label
from interp.hooks import hooked
from interp.models.components import apply_rotary, rotary_angles
from interp.run import Run, prompt_fingerprint
from interp.stats import MIN_PROMPTS, bootstrap


class Attributed(Protocol):
    """What the check reads of a `QKAttribution` (`interp.analyses.qk.attribution`, which calls the check)."""

    @property
    def head(self) -> Head: ...

    @property
    def pairs(self) -> pd.DataFrame: ...

    @property
    def query_sources(self) -> tuple[str, ...]: ...

    @property
    def key_sources(self) -> tuple[str, ...]: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def seed(self) -> int: ...

    def terms(self, view: View = ...) -> tuple[torch.Tensor, Any]: ...

    def per_prompt(self, view: View = ...) -> tuple[torch.Tensor, list[int]]: ...


@dataclass(frozen=True)
class SourceRemoval:
    """Remove sources from one head's query input and / or key input (see the module): an `interp.Run`
    intervention. `frozen`: ln1's scale pinned at its clean-run value (per prompt and position)."""

    layer: int
    head: int
    query_sources: tuple[str, ...] = ()
    key_sources: tuple[str, ...] = ()
    frozen: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "query_sources", tuple(sorted(set(self.query_sources))))
        object.__setattr__(self, "key_sources", tuple(sorted(set(self.key_sources))))
        if not self.query_sources and not self.key_sources:
            raise BadInput("SourceRemoval needs a source on at least one side, e.g. SourceRemoval(1, 0, "
                           "query_sources=('tok_embed',)).")

    def spec(self) -> dict[str, Any]:
        return {"intervention": "qk_source_removal", "head": self.label, "query_sources": list(self.query_sources),
                "key_sources": list(self.key_sources), "norm_scale": "frozen" if self.frozen else "live"}

    @property
    def label(self) -> str:
        return head_label((self.layer, self.head))

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        model = run.model
        head = check_qk_head(model, (self.layer, self.head))
        chosen: dict[Side, list[Source]] = {"q": _named(model, head, "q", self.query_sources),
                                            "k": _named(model, head, "k", self.key_sources)}
        writes = _Writes(model)
        read_from = sorted({src.hook for picked in chosen.values() for src in picked if src.hook})
        hooks: list[tuple[str, Callable[..., Any]]] = [(name, writes.record) for name in read_from]
        for side, picked in chosen.items():
            hooks += _input_hooks(model, head, side, [s for s in picked if s.in_stream], writes)
            hooks += _projected_hooks(model, head, side, [s for s in picked if not s.in_stream], batch)
        if self.frozen and model.cfg.normalization_type is not None:
            hooks.append(_pin_scale(model, batch, head.layer))
        return hooked(model, hooks)


def _named(model: Any, head: Head, side: Side, names: tuple[str, ...]) -> list[Source]:
    available = {src.name: src for src in sources(model, head.layer, side)}
    unknown = [name for name in names if name not in available]
    if unknown:
        raise BadInput(f"{head.label}'s {'query' if side == 'q' else 'key'} has no source {unknown[0]!r}; its sources: "
                       f"{', '.join(available)}.")
    return [available[name] for name in names]


class _Writes:
    """Source writes recorded as the forward makes them (by hook name), and each source's write from them."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.acts: dict[str, torch.Tensor] = {}

    def record(self, act: torch.Tensor, hook: Any) -> None:
        self.acts[hook.name] = act

    def write(self, src: Source) -> torch.Tensor:
        """(batch, pos, d_model), or (d_model,) for a bias."""
        if src.kind == "b_O":
            assert src.layer is not None  # sources() sets it
            return self.model.blocks[src.layer].attn.b_O
        assert src.hook is not None
        act = self.acts[src.hook]
        if src.kind == "head":
            assert src.layer is not None and src.index is not None
            return self.model.blocks[src.layer].attn.head_write(src.index, act[:, :, src.index])
        return act


def _input_hooks(model: Any, head: Head, side: Side, picked: list[Source], writes: _Writes
                 ) -> list[tuple[str, Callable[..., Any]]]:
    """Subtract the residual-stream sources' writes from the head's split input of `side` (before the norm)."""
    if not picked:
        return []
    attn = model.blocks[head.layer].attn
    index = head.head if side == "q" else head.head // attn.group

    def patch(act: torch.Tensor, hook: Any) -> torch.Tensor:  # (batch, pos, head, d_model)
        act = act.clone()
        for src in picked:
            act[:, :, index] -= writes.write(src)
        return act

    return [(f"blocks.{head.layer}.attn.hook_{side}_input", patch)]


def _projected_hooks(model: Any, head: Head, side: Side, picked: list[Source], batch: PromptSet
                     ) -> list[tuple[str, Callable[..., Any]]]:
    """Subtract the post-norm sources (ln_bias, b_Q / b_K) from the head's projected query or key, rotated."""
    if not picked:
        return []
    block = model.blocks[head.layer]
    W, bias = side_weights(block.attn, head.head, side)
    vector = torch.stack([bias if src.kind == "bias" else block.ln1.b @ W for src in picked]).sum(0)  # (d_head,)
    index = head.head if side == "q" else head.head // block.attn.group

    def patch(act: torch.Tensor, hook: Any) -> torch.Tensor:  # (batch, pos, head, d_head)
        term = vector.to(act.dtype).expand(act.shape[0], 1, act.shape[1], act.shape[-1])  # (batch, 1, pos, d_head)
        if model.cfg.positional_embedding_type == "rotary":
            positions = model.position_ids(batch.tokens.shape, batch.attention_mask, device=act.device)
            term = apply_rotary(term, *rotary_angles(positions, block.attn.rotary_inv_freq))
        act = act.clone()
        act[:, :, index] -= term[:, 0]
        return act

    return [(f"blocks.{head.layer}.attn.hook_{side}", patch)]


@torch.no_grad()
def _pin_scale(model: Any, batch: PromptSet, layer: int) -> tuple[str, Callable[..., Any]]:
    """A hook pinning ln1's scale at `layer` to its value in the clean forward on `batch`."""
    name, kept = f"blocks.{layer}.ln1.hook_scale", {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        kept["scale"] = act.detach().clone()  # (batch, pos, 1)

    kwargs = {k: v.to(model.device) for k, v in batch.model_kwargs().items()}
    with hooked(model, [(name, keep)]):
        model(batch.tokens.to(model.device), stop_at_layer=layer + 1, **kwargs)
    clean = kept["scale"]

    def pin(act: torch.Tensor, hook: Any) -> torch.Tensor:  # (batch, pos, [head,] 1): one per split branch
        return clean.reshape(*clean.shape[:2], *([1] * (act.ndim - 2))).expand_as(act).to(act.dtype)

    return name, pin


def score_behaviour(attribution: Attributed, prompts: PromptSet, view: View = "difference") -> Behaviour:
    """The behaviour `check` measures: per prompt, the mean over its attributed (query, key) pairs of the head's
    score s(q, k) (view "score") or s(q, k) - s(q, k') (view "difference"), read at `hook_attn_scores` (an
    activation read). `prompts`: the Run's prompts, the ones attributed."""
    _, keep = attribution.terms(view)
    pairs = attribution.pairs[keep]
    by_prompt: dict[int, list[tuple[int, int, int]]] = {}
    for p, q, k, a in pairs[["prompt", "query", "key", "against"]].itertuples(index=False):
        by_prompt.setdefault(int(p), []).append((int(q), int(k), int(a)))
    rows = torch.arange(len(prompts)) if prompts.rows is None else prompts.rows
    position = {int(row): i for i, row in enumerate(rows.tolist())}
    head = attribution.head

    def read(scores: torch.Tensor, batch: PromptSet) -> torch.Tensor:  # scores (batch, head, query, key)
        batch_rows = torch.arange(len(batch)) if batch.rows is None else batch.rows
        values = []
        for i, row in enumerate(batch_rows.tolist()):
            listed = by_prompt.get(position.get(int(row), -1))
            if not listed:
                raise UndefinedOnPrompts(f"prompt {row} has no attributed pair in the {view} view; attribute every "
                                         "prompt of the Run (or check on a Run of the attributed prompts only).")
            s = scores[i, head.head].double()
            values.append(torch.stack([s[q, k] - (s[q, a] if view == "difference" else 0.0) for q, k, a in listed]).mean())
        return torch.stack(values)

    digest = hashlib.blake2b(pairs[["prompt", "query", "key", "against"]].to_numpy().tobytes(), digest_size=8).hexdigest()
    what = "s(q, k) - s(q, k')" if view == "difference" else "s(q, k)"
    return Behaviour(f"{head.label}_score" + ("_difference" if view == "difference" else ""), "activation", read,
                     description=f"{head.label}'s pre-softmax score {what} at the attributed pairs, mean per prompt",
                     unit=UNIT, params=(("head", head.label), ("view", view), ("pairs", digest)),
                     hook=f"blocks.{head.layer}.attn.hook_attn_scores")


@dataclass(frozen=True)
class QKCheck:
    """The top source pairs of an attribution, each patched out of the head's input (see the module).

    Per-prompt values (prompt, pair): `predicted_values` (the attribution's terms), `frozen_values` and
    `live_values` (the measured terms, norm scale frozen / live); `total_values` (prompt,): the score
    (difference) the terms are shares of."""

    head: Head
    view: str
    pairs: tuple[tuple[str, str], ...]  # (query_source, key_source), largest mean term first
    predicted_values: torch.Tensor
    frozen_values: torch.Tensor
    live_values: torch.Tensor
    total_values: torch.Tensor
    seed: int = 0

    @property
    def predicted(self) -> float:
        """The top pairs' summed term, mean over prompts (score units)."""
        return float(self.predicted_values.sum(1).mean())

    @property
    def measured_frozen(self) -> float:
        return float(self.frozen_values.sum(1).mean())

    @property
    def measured_live(self) -> float:
        return float(self.live_values.sum(1).mean())

    @property
    def explained(self) -> float:
        """The share of the score (difference) the top pairs account for: predicted / mean total."""
        total = float(self.total_values.mean())
        return self.predicted / total if total else float("nan")

    @property
    def frozen_error(self) -> float:
        """The largest |measured_frozen - predicted| of any pair and prompt: float rounding, if the arithmetic holds."""
        return float((self.frozen_values - self.predicted_values).abs().max())

    def frame(self) -> pd.DataFrame:
        """One row per pair, then one for the pairs together ("top n"): predicted, measured_frozen, measured_live
        (means over prompts), the live measurement's 95% bootstrap CI, n_prompts; `attrs` carry explained."""
        n = len(self.pairs)
        labels = [*self.pairs, (f"top {n}", "together")]
        columns = {name: torch.cat([v, v.sum(1, keepdim=True)], 1) for name, v in (
            ("predicted", self.predicted_values), ("measured_frozen", self.frozen_values),
            ("measured_live", self.live_values))}
        live = columns["measured_live"]
        if len(live) >= MIN_PROMPTS:
            _, low, high = bootstrap(live, seed=self.seed, label=f"qk_check:{self.head.label}")
        else:
            low = high = torch.full((n + 1,), float("nan"), dtype=torch.float64)
        frame = pd.DataFrame({"layer": self.head.layer, "head": self.head.head,
                              "query_source": [a for a, _ in labels], "key_source": [b for _, b in labels],
                              **{name: values.mean(0).numpy() for name, values in columns.items()},
                              "ci_low": low.numpy(), "ci_high": high.numpy(), "n_prompts": len(live)})
        frame.attrs.update(view=self.view, unit=UNIT, head=self.head.label, explained=self.explained,
                           total=float(self.total_values.mean()))
        return frame


def check(attribution: Attributed, run: Run, *, n: int = 5, view: View = "difference") -> QKCheck:
    """Patch the top `n` source pairs of `attribution.aggregate(view)` (by size) out of the head's input, each by
    the four-score design of the module, frozen and live. `run`: a Run of the attributed prompts (its model is
    the one attributed; its own behaviour is not used)."""
    if not isinstance(run, Run):
        raise BadInput(f"check(run): expected an interp.Run of the attributed prompts, got {type(run).__name__}.")
    if prompt_fingerprint(run.prompts) != attribution.fingerprint:
        raise BadInput("check: the Run's prompts are not the ones attributed; build the Run on the same PromptSet "
                       "(or attribute(run, head) on this Run).")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInput(f"check(n={n!r}); expected a whole number of at least 1.")
    from interp.analyses.qk.intercepted import is_intercepted_model

    if is_intercepted_model(run.model):
        raise BadInput(f"check patches sources out of only the query or only the key input of {attribution.head.label}, "
                       f"which needs split q/k inputs; {type(run.model).__name__} is hooked by interception and has none. "
                       "The attribution itself is exact (its rows sum to the score); to test a source causally here, "
                       "patch its head's write into the layer's whole attention input "
                       "(interp.analyses.circuits.attention_input_patch).")
    if len(run.prompts) < MIN_PROMPTS:
        raise BadInput(f"check needs at least {MIN_PROMPTS} prompts (each measurement is a Run effect with a CI over "
                       f"prompts); the Run has {len(run.prompts)}. Attribute and check more prompts.")
    values, _ = attribution.per_prompt(view)
    if len(values) != len(run.prompts):
        raise BadInput(f"check: only {len(values)} of the Run's {len(run.prompts)} prompts have a pair in the {view} "
                       "view; attribute queries that see a second key, or use view='score'.")
    scored = run.with_behaviour(score_behaviour(attribution, run.prompts, view))
    _check_same_model(scored, values)
    flat = values.reshape(len(values), -1)
    order = flat.mean(0).abs().argsort(descending=True)[:n].tolist()
    n_k = len(attribution.key_sources)
    pairs = tuple((attribution.query_sources[j // n_k], attribution.key_sources[j % n_k]) for j in order)
    frozen, live = (_measure(scored, attribution.head, pairs, frozen=f) for f in (True, False))
    return QKCheck(attribution.head, view, pairs, flat[:, order], frozen, live, flat.sum(1), attribution.seed)


def _check_same_model(run: Run, values: torch.Tensor) -> None:
    """The Run's clean scores must be the ones attributed (same model, same prompts), to float rounding."""
    clean, attributed = run.clean(), values.sum((1, 2))
    gap = float((clean - attributed).abs().max())
    if gap > 1e-4 * max(1.0, float(attributed.abs().max())):
        raise BadInput(f"check: the Run's model gives scores {gap:.3g} away from the attributed ones; pass a Run of the "
                       "model that was attributed (attribute(run, head) does).")


def _measure(run: Run, head: Head, pairs: tuple[tuple[str, str], ...], *, frozen: bool) -> torch.Tensor:
    """(prompt, pair) each pair's measured term: s(-a, -b) - s(-a) - s(-b) + s, from three Run effects."""
    removals = []
    for a, b in pairs:
        removals += [SourceRemoval(head.layer, head.head, (a,), (), frozen),
                     SourceRemoval(head.layer, head.head, (), (b,), frozen),
                     SourceRemoval(head.layer, head.head, (a,), (b,), frozen)]
    effects = run.effects(removals)
    return torch.stack([both.values - q_only.values - k_only.values
                        for q_only, k_only, both in zip(effects[0::3], effects[1::3], effects[2::3])], 1)


