"""Per-prompt behaviour values of a model under head ablations, with as little recomputation as possible.

`AblationEngine(model, prompts, method)` is built once per (model, prompts, method), by `interp.Run`
(`run.engine(kind)`), which asks it for the clean value (prompt,) and the value with each set of heads
ablated (set, prompt): `run.effects([HeadAblation(...), ...])` is the public road. `batched_values` is
`Strategy.BATCHED`'s engine (the batch expanded per head). Ablation values come from `interp.interventions`
(zero, or mean / resample over a reference, default the prompts themselves), so the numbers equal a forward
under `HeadAblation(...).hooks(model, reference)`.
The value is a *behaviour*'s (`interp.behaviour`; default: the model's own).

Minimal recomputation, where the model says resuming is exact (`HookedGPT.resumable`: sequential
pre-norm blocks): the clean forward runs once per batch, caching each layer's `z` and
`hook_resid_mid`; ablating heads whose earliest layer is `l` adds their change of write
(`model.head_write`) to the cached residual and resumes after layer `l`'s attention
(`model.run_from(l, ..., after_attention=True)`), so nothing before it is repeated. Next-token
behaviours read the loss from the final residual through the model's fused unembedding and
cross-entropy (`model.next_token_loss_from_resid`: the full logits never exist); a behaviour on
the final hidden state stops at `ln_final`. Post-norm (BERT) and parallel (GPT-NeoX) blocks, other
models, or `fast=False` run one hooked full forward per ablation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

import interp.distributed as distributed
from interp.behaviour import Behaviour, BehaviourLike, as_behaviour, check_values, final_output
from interp.capture import stop_after
from interp.data import PromptSet, check_prompts
from interp.errors import BadInput, BadType
from interp.heads import Head, HeadLike, head_label
from interp.hooks import attention_sites, hooked
from interp.interventions import (
    ABLATION_KINDS,
    AblationKind,
    AblationValues,
    ReferenceActivations,
    check_heads,
    needs_samples,
    reference_activations,
)
from interp.modelinfo import context_length, vocab_size
from interp.models.gpt import HookedGPT


def resumable(model: nn.Module) -> bool:
    """Whether the ablation engine may resume `model`'s forward after an attention layer: a HookedGPT /
    HookedEncoder whose blocks say so (`HookedGPT.resumable`: sequential pre-norm)."""
    return isinstance(model, HookedGPT) and model.resumable


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@dataclass
class CleanBatch:
    """One batch's clean run: what resuming needs."""

    prompts: PromptSet
    tokens: torch.Tensor  # (batch, pos)
    mask: torch.Tensor | None  # (batch, pos) bool
    positions: torch.Tensor  # (batch, pos)
    z: dict[int, torch.Tensor]  # layer -> (batch, pos, head, d_head)
    resid_mid: dict[int, torch.Tensor]  # layer -> (batch, pos, d_model)
    resid_final: torch.Tensor  # (batch, pos, d_model), before ln_final
    loss: torch.Tensor  # (batch,)
    summary: torch.Tensor | None = None  # what a compare-to-clean behaviour compares with (e.g. pooled embedding)


class AblationEngine:
    """Per-prompt losses of a model under head ablations, with as little recomputation as possible.

    Built once per (model, prompts, method) by `interp.Run.engine`; the Run reads the clean loss (prompt,) and
    the loss with each set ablated (set, prompt) from it. Where `resumable(model)` the clean
    run is cached per batch and each ablation resumes from its earliest layer (`fast=True`);
    otherwise (or with `fast=False`) each ablation is one full forward with hooks.
    Ablation values come from `interp.interventions` (mean / resample over `reference`,
    default the prompts themselves), so numbers equal a forward under `HeadAblation(...).hooks(...)`.
    The loss is the `behaviour`'s value (`interp.behaviour`; default: the model's own).
    """

    def __init__(
        self,
        model: nn.Module,
        prompts: PromptSet,
        method: AblationKind = "mean",
        *,
        reference: PromptSet | ReferenceActivations | None = None,
        batch_size: int = 16,
        seed: int = 0,
        fast: bool = True,
        behaviour: BehaviourLike = None,
    ):
        if method not in ABLATION_KINDS:
            raise ValueError(f"method={method!r} is not an ablation kind; expected one of {list(ABLATION_KINDS)}.")
        if not isinstance(prompts, PromptSet):
            raise BadType(f"prompts must be an interp.data.PromptSet, got {type(prompts).__name__}.")
        check_prompts(prompts, n_ctx=context_length(model), d_vocab=vocab_size(model))  # plain models too
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1.")
        self.model, self.prompts, self.method = model, prompts, method
        # a next-token loss chosen by default or by name scores every real position here (as
        # `interp.analyses.redundancy.lm_loss`): pass `induction_loss` (or positions="auto") for the repeats only
        self.behaviour = as_behaviour(behaviour, model, positions="all")
        self.batch_size, self.seed = batch_size, seed
        self.device = _device(model)
        self.fast = fast and resumable(model)
        self.sites = {site.layer: site for site in attention_sites(model)}
        self.model_prompts = self.behaviour.model_prompts(prompts)  # what the model reads: its token roles pick mean values
        if method == "zero":
            self.reference = None
        elif isinstance(reference, ReferenceActivations):
            self.reference = reference
        else:
            source = self.model_prompts if reference is None else reference
            self.reference = reference_activations(model, source, site="z",
                                                   keep_samples=needs_samples(method), batch_size=batch_size)

    @property
    def resumable_model(self) -> HookedGPT:
        """The model on the fast path (clean runs cached, ablations resumed): `resumable` admits only a HookedGPT."""
        if not isinstance(self.model, HookedGPT):
            raise BadType(f"resuming needs a HookedGPT (see interp.ablation.resumable), got {type(self.model).__name__}.")
        return self.model

    # -- values and hooks

    def values(self) -> AblationValues:
        """A fresh source of ablation values (resampling streams seeded per head, as `ablate` does), matched to
        the token roles of the prompts the model reads (a batch picked by `prompt_index`)."""
        return AblationValues(self.method, self.reference, self.seed, prompts=self.model_prompts)

    def hooks(self, heads: Iterable[Head], values: AblationValues) -> list[tuple[str, Callable]]:
        by_layer: dict[int, list[int]] = {}
        for layer, index in heads:
            by_layer.setdefault(layer, []).append(index)

        def make_hook(layer: int, indices: list[int]):
            def hook(z: torch.Tensor, hook=None) -> torch.Tensor:  # (batch, pos, head, d_head)
                z = z.clone()
                for index in indices:
                    z[:, :, index] = values(layer, index, z[:, :, index])
                return z
            return hook

        return [(self.sites[layer].hook("z"), make_hook(layer, idx)) for layer, idx in sorted(by_layer.items())]

    # -- clean run

    @torch.no_grad()
    def clean(self, batch: PromptSet) -> CleanBatch:
        """The batch's clean run to the final residual stream, caching every layer's z and resid_mid."""
        model = self.resumable_model
        tokens = self.behaviour.model_prompts(batch).tokens.to(_device(model))
        mask = None if batch.attention_mask is None else batch.attention_mask.to(tokens.device).bool()
        positions = model.position_ids(tokens.shape, mask, device=tokens.device)
        names = {}
        for layer, block in enumerate(model.blocks):
            names[self.sites[layer].hook("z")] = ("z", layer)
            mid_name = block.hook_resid_mid.name
            assert mid_name is not None  # HookedRootModule.setup names every hook point
            names[mid_name] = ("mid", layer)
        final, cache = model.run_with_cache(tokens, attention_mask=mask, **stop_after(model, [len(model.blocks) - 1]),
                                            names_filter=lambda n: n in names, return_cache_object=False)
        z = {layer: cache[name] for name, (kind, layer) in names.items() if kind == "z"}
        mid = {layer: cache[name] for name, (kind, layer) in names.items() if kind == "mid"}
        summary = self.behaviour.clean_summary(self.output_from_resid(final), batch) if self.behaviour.compares_to_clean else None
        loss = self.loss_from_resid(final, batch, "clean run", summary)
        return CleanBatch(batch, tokens, mask, positions, z, mid, final, loss, summary)

    # -- resumed runs

    @torch.no_grad()
    def resume(self, clean: CleanBatch, heads: Sequence[Head], values: AblationValues,
               capture: Sequence[str] = ()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Final residual stream (before ln_final) and captured activations, with `heads` ablated."""
        model = self.resumable_model
        start = min(layer for layer, _ in heads)
        z_clean = clean.z[start]
        delta = torch.zeros_like(clean.resid_mid[start])
        for layer, index in heads:
            if layer == start:
                change = values(layer, index, z_clean[:, :, index]) - z_clean[:, :, index]  # (batch, pos, d_head)
                delta += model.head_write(layer, index, change)
        later = [Head(layer, index) for layer, index in heads if layer > start]
        captured: dict[str, torch.Tensor] = {}

        def keep(act, hook):
            captured[hook.name] = act
            return None

        hooks = self.hooks(later, values) + [(name, keep) for name in capture]
        with hooked(model, hooks):
            resid = model.run_from(start, clean.resid_mid[start] + delta, attention_mask=clean.mask,
                                   positions=clean.positions, after_attention=True)
        return resid, captured

    @torch.no_grad()
    def loss_from_resid(self, resid: torch.Tensor, batch: PromptSet, what: str,
                        summary: torch.Tensor | None = None) -> torch.Tensor:
        """Per-prompt behaviour value from the final residual stream (batch, pos, d_model), before ln_final.

        For next-token behaviours (`target_weights`) the model's fused unembedding and cross-entropy
        (`next_token_loss_from_resid`) score only the weighted positions, so the (batch, pos, d_vocab)
        logits never exist (about 2x faster here, equal to 1e-6). A behaviour on the final hidden
        state reads `ln_final(resid)` and the unembedding never runs. `summary`: the clean run's,
        for behaviours that compare with it.
        """
        behaviour = self.behaviour
        if behaviour.target_weights is None or behaviour.reads != "logits":
            return check_values(behaviour(self.output_from_resid(resid), batch, summary), len(batch), what, behaviour)
        weights = behaviour.target_weights(batch).to(resid.device)  # (batch, pos - 1), each row summing to one
        loss = self.resumable_model.next_token_loss_from_resid(resid, batch.tokens, weights)
        return check_values(loss, len(batch), what, behaviour)

    def output_from_resid(self, resid: torch.Tensor) -> torch.Tensor:
        """What the behaviour reads, from the final residual stream: ln_final(resid), or the logits."""
        if self.behaviour.reads == "activation":  # not in the final residual stream: a hooked forward reads it
            raise BadInput(f"the behaviour {self.behaviour.name!r} reads the activation at {self.behaviour.hook!r}, which "
                           "resuming from cached residuals cannot give; measure it through interp.Run (hooked forwards).")
        model = self.resumable_model
        return model.head(resid) if self.behaviour.reads == "logits" else model.ln_final(resid)

    @torch.no_grad()
    def _full(self, batch: PromptSet, heads: Sequence[Head], values: AblationValues) -> torch.Tensor:
        """The final output the behaviour reads (logits or hidden state), with `heads` ablated."""
        with hooked(self.model, self.hooks(heads, values)):
            return final_output(self.model, self.behaviour.model_prompts(batch), self.behaviour.reads, self.behaviour.hook)

    def value(self, output: torch.Tensor, batch: PromptSet, summary: torch.Tensor | None, what: str) -> torch.Tensor:
        """The behaviour on a full forward's output, checked."""
        return check_values(self.behaviour(output, batch, summary), len(batch), what, self.behaviour)

    def _clean_values(self, batch: PromptSet) -> tuple[CleanBatch | None, torch.Tensor, torch.Tensor | None]:
        """The batch's clean run (None on the full-forward path), its values (batch,) and summary."""
        if self.fast:
            clean = self.clean(batch)
            return clean, clean.loss, clean.summary
        with torch.no_grad():
            output = final_output(self.model, self.behaviour.model_prompts(batch), self.behaviour.reads, self.behaviour.hook)
        summary = self.behaviour.clean_summary(output, batch)
        return None, self.value(output, batch, summary, "clean run"), summary

    def _losses(self, head_sets: Sequence[Sequence[HeadLike]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean loss (prompt,) and loss with each set of heads ablated (set, prompt). Internal: `interp.Run`
        computes its head ablations here (`Run.effects` is the public road, with the memo and CIs)."""
        checked = [check_heads(self.model, heads) for heads in head_sets]
        sources = [self.values() for _ in checked]
        clean_parts, ablated_parts = [], []
        for indices, batch in distributed.shard(self.prompts, self.batch_size).batches(self.batch_size):
            for values in sources:
                values.prompt_index = indices  # resampling keyed by global prompt index
            clean, clean_loss, summary = self._clean_values(batch)
            rows = []
            for heads, values in zip(checked, sources):
                what = f"ablating {'+'.join(map(head_label, heads))}"
                if clean is not None:
                    rows.append(self.loss_from_resid(self.resume(clean, heads, values)[0], batch, what, summary))
                else:
                    rows.append(self.value(self._full(batch, heads, values), batch, summary, what))
            clean_parts.append(clean_loss.detach().double().cpu())
            ablated_parts.append(torch.stack(rows).detach().double().cpu() if rows else torch.zeros(0, len(batch), dtype=torch.float64))
        clean_loss = torch.cat(clean_parts) if clean_parts else torch.zeros(0, dtype=torch.float64)
        ablated = torch.cat(ablated_parts, dim=1) if ablated_parts else torch.zeros(len(checked), 0, dtype=torch.float64)
        return distributed.gather_prompts(clean_loss), distributed.gather_prompts(ablated, dim=1)


@torch.no_grad()
def batched_values(model: nn.Module, prompts: PromptSet, behaviour: Behaviour, heads=None, kind: AblationKind = "mean", *,
                   reference=None, seed: int = 0, batch_size: int = 32,
                   chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean values (prompt,) and values with each head ablated alone (head, prompt), float64, through
    the batch expanded per head (one forward per chunk of heads: the GPU path). Internal to `interp.Run`'s
    strategy "batched" (`Run(..., strategy=Strategy.BATCHED).effects([HeadAblation(head), ...])` is the public road).

    For a behaviour on the final hidden state a HookedGPT stops before the unembedding. Mean and
    resample values come from `reference` (default: the prompts the model reads), as `HeadAblation` does.
    """
    from interp.interventions import all_heads
    from interp.interventions.ablation import _batched_head_ablations

    heads = all_heads(model) if heads is None else check_heads(model, heads)
    if reference is None and kind != "zero":
        reference = reference_activations(model, behaviour.model_prompts(prompts), keep_samples=kind == "resample",
                                          batch_size=batch_size)
    # a behaviour on the final hidden state: the HookedGPT stops before its unembedding
    stop = model if behaviour.reads == "hidden" and isinstance(model, HookedGPT) else None
    if behaviour.reads == "hidden" and stop is None:
        raise BadInput(f"batched ablations of a behaviour on the final hidden state need a HookedGPT-like model, got "
                       f"{type(model).__name__}; use interp.Run(..., strategy=interp.Strategy.HOOKED).")
    kwargs: dict[str, Any] = {"stop_at_layer": len(stop.blocks)} if stop is not None else {}
    clean_parts, ablated_parts = [], []
    for batch in prompts.batches(batch_size):
        run = behaviour.model_prompts(batch)
        output = final_output(model, run, behaviour.reads)
        summary = behaviour.clean_summary(output, batch)
        clean_parts.append(check_values(behaviour(output, batch, summary), len(batch), "clean run", behaviour).double().cpu())
        outputs = _batched_head_ablations(model, run, heads, kind, reference=reference, seed=seed, chunk_size=chunk_size,
                                          **kwargs)  # (head, batch, ...)
        rows = [behaviour(stop.ln_final(out) if stop is not None else out, batch, summary) for out in outputs]
        ablated_parts.append(torch.stack([check_values(r, len(batch), "a batched ablation", behaviour) for r in rows])
                             .double().cpu())
    return torch.cat(clean_parts), torch.cat(ablated_parts, dim=1)
