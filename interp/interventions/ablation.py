"""Head ablations: replace heads' `z` (or `result`) by zero, their reference mean, or a resampled value.

- `HeadAblation(heads, kind, site)`: the intervention of `interp.Run`; zero, the mean over reference prompts
  at the same token role (`interp.interventions.references`), the value on another reference prompt at the
  same roles (resampling), or, with kind="auto", resampling for heads whose output is near-constant across
  prompts and the mean otherwise (`HeadAblation.resolved_kind(run)` names what was done). `spec()` is plain
  data for reports; `hooks(model, reference, prompts=)` gives `(hook_name, fn)` pairs for `run_with_hooks`.
  `with hooked(model, ablation.hooks(model, reference)):` runs it outside a Run (hooks removed in `finally`).
- `AblationValues`: the values that replace one head's activation under a kind (what the hooks call).
- `_batched_head_ablations`: many single-head ablations in one forward by expanding the batch, internal to
  `interp.Run`'s `Strategy.BATCHED` (`Run(..., strategy=Strategy.BATCHED).effects([...])` is the public road).
  On a GPU that is the usual win; on these CPUs it measured about 2x *slower* than one
  forward per head (`python -m benchmarks redundancy` measures it), so analyses do not rely on it there.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, cast

import einops
import torch
from torch import nn
from transformer_lens.utilities.statistics import derive_generator

import interp.distributed as distributed
from interp.data import PromptSet
from interp.heads import Head, HeadLike, head_label
from interp.hooks import hooked
from interp.interventions.common import (
    ABLATION_KINDS,
    ABLATION_SITES,
    AblationKind,
    AblationSite,
    _check_choice,
    _sites_by_layer,
    all_heads,
    as_prompts,
    check_heads,
    parse_heads,
)
from interp.interventions.references import ReferenceActivations, reference_activations
from interp.modelinfo import output_logits

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint


class AblationValues:
    """Values that replace one head's activation (batch, pos, d) under an ablation kind.

    With a reference matched by token role (`ReferenceActivations.by_role`), the values need the
    roles of the prompts being ablated: `prompts=` (the whole set; a batch is picked by
    `prompt_index`) or `set_batch(batch)` before each forward. Without them the per-position
    means and samples are used (as for a reference of one layout).
    """

    def __init__(self, kind: str, reference: ReferenceActivations | None, seed: int, prompts: PromptSet | None = None):
        self.kind, self.reference, self.seed = kind, reference, seed
        self.generators: dict[Head, torch.Generator] = {}
        # global indices of the prompts in the current batch; when set (by a sharded loop such
        # as the ablation engine), resampling is keyed by each prompt's global index, so the
        # draws do not depend on batching or on the number of processes
        self.prompt_index: range | None = None
        self.all_rows = self._rows_of(prompts)  # (prompt, pos) role rows of the whole ablated set
        self.batch_rows: torch.Tensor | None = None  # (batch, pos), from set_batch

    def _rows_of(self, prompts: PromptSet | None) -> torch.Tensor | None:
        ref = self.reference
        return None if prompts is None or ref is None or not ref.by_role else ref.role_rows(prompts)

    def set_batch(self, prompts: PromptSet | None) -> None:
        """The prompts of the next forward(s), whose token roles pick the matching reference values."""
        self.batch_rows = self._rows_of(prompts)

    def kind_of(self, layer: int, head: int) -> str:
        """The kind applied to this head: `kind`, or for "auto" the reference's `resolved_kind`."""
        if self.kind != "auto":
            return self.kind
        assert self.reference is not None  # _resolve_reference gives one for every kind but "zero"
        return self.reference.resolved_kind(layer, head)

    def _rows(self, clean: torch.Tensor) -> torch.Tensor | None:
        """(batch, pos) role rows of the current batch, or None (per-position values)."""
        rows = self.batch_rows
        if rows is None and self.all_rows is not None:
            if self.prompt_index is not None:
                rows = self.all_rows[list(self.prompt_index)]
            elif self.all_rows.shape[0] == clean.shape[0]:
                rows = self.all_rows
        if rows is not None and tuple(rows.shape) != tuple(clean.shape[:2]):
            raise ValueError(f"the ablation values were set for prompts of shape {tuple(rows.shape)} but the head's "
                             f"activation has (batch, pos) {tuple(clean.shape[:2])}; set_batch() with the prompts of this forward.")
        return rows

    def __call__(self, layer: int, head: int, clean: torch.Tensor) -> torch.Tensor:
        batch, n_pos = clean.shape[:2]
        kind = self.kind_of(layer, head)
        if kind == "zero":
            return torch.zeros_like(clean)
        ref = self.reference
        assert ref is not None  # _resolve_reference (or the engine) gives one for every kind but "zero"
        if n_pos > ref.n_pos:
            raise ValueError(
                f"the prompts have {n_pos} positions but the reference prompts only {ref.n_pos}; "
                "pass reference prompts at least as long as the prompts being ablated."
            )
        rows = self._rows(clean)
        if kind == "mean":
            if rows is not None:
                return self._role_mean(layer, head, rows, clean)
            mean = ref.means[layer][:n_pos, head].to(device=clean.device, dtype=clean.dtype)  # (pos, d)
            return einops.repeat(mean, "pos d -> batch pos d", batch=batch)
        # resample: each prompt gets the head's value on a random reference prompt, a different
        # one from the prompt itself wherever that is possible
        if ref.samples is None:
            raise ValueError(f"resample ablation of {head_label((layer, head))} needs per-prompt reference values; "
                             "recompute the reference with keep_samples=True.")
        pool = ref.samples[layer][:, :, head]  # (ref_prompt, ref_pos, d)
        if self.prompt_index is not None:
            return self._resample_keyed(layer, head, clean, pool, self.prompt_index, rows)
        n_ref = pool.shape[0]
        gen = self.generators.setdefault(Head(layer, head), derive_generator(self.seed, "resample", layer, head))
        index = torch.randint(0, n_ref, (batch,), generator=gen)
        chosen = self._donors(layer, head, pool, index, clean, rows)  # (batch, pos, d)
        same = (chosen == clean).flatten(1).all(1).cpu()
        if n_ref > 1 and bool(same.any()):
            shift = torch.randint(1, n_ref, (int(same.sum()),), generator=gen)
            index[same] = (index[same] + shift) % n_ref
            chosen = self._donors(layer, head, pool, index, clean, rows)
        return chosen

    def _role_mean(self, layer: int, head: int, rows: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
        """(batch, pos, d) the mean of each position's role; padding keeps its own value (nothing reads it)."""
        assert self.reference is not None and self.reference.role_means is not None  # rows exist only by role
        table = self.reference.role_means[layer][:, head].to(device=clean.device, dtype=clean.dtype)  # (role, d)
        rows = rows.to(clean.device)
        return torch.where((rows >= 0)[..., None], table[rows.clamp(min=0)], clean)

    def _donors(self, layer: int, head: int, pool: torch.Tensor, index: torch.Tensor, clean: torch.Tensor,
                rows: torch.Tensor | None) -> torch.Tensor:
        """(batch, pos, d) the head's values on reference prompts `index` (batch,): at the same positions, or
        with roles at the donor's position of the same role (the role mean where the donor has none)."""
        n_pos = clean.shape[1]
        if rows is None:
            return pool[index, :n_pos].to(device=clean.device, dtype=clean.dtype)
        ref = self.reference
        assert ref is not None and ref.role_positions is not None  # by-role references with samples keep them
        where = ref.role_positions[index[:, None], rows.clamp(min=0)]  # (batch, pos) donor positions, -1 if none
        donor = pool[index[:, None], where.clamp(min=0)].to(device=clean.device, dtype=clean.dtype)  # (batch, pos, d)
        fallback = self._role_mean(layer, head, rows, clean)
        return torch.where((where >= 0).to(clean.device)[..., None] & (rows >= 0).to(clean.device)[..., None], donor, fallback)

    def _resample_keyed(self, layer: int, head: int, clean: torch.Tensor, pool: torch.Tensor,
                        prompt_index: range, rows: torch.Tensor | None) -> torch.Tensor:
        """Resampling with one generator per (prompt's global index, head): see `prompt_index`."""
        if len(prompt_index) != clean.shape[0]:
            raise ValueError(f"prompt_index has {len(prompt_index)} prompts but the batch {clean.shape[0]}.")
        n_ref = pool.shape[0]
        index = torch.empty(clean.shape[0], dtype=torch.long)
        for row, prompt in enumerate(prompt_index):
            gen = distributed.prompt_generator(self.seed, "resample", prompt, layer, head)
            index[row] = int(torch.randint(0, n_ref, (1,), generator=gen))
            one = slice(row, row + 1)
            donor = self._donors(layer, head, pool, index[one], clean[one], None if rows is None else rows[one])
            if n_ref > 1 and bool((donor == clean[one]).all()):
                index[row] = (index[row] + int(torch.randint(1, n_ref, (1,), generator=gen))) % n_ref
        return self._donors(layer, head, pool, index, clean, rows)  # (batch, pos, d)


def needs_samples(kind: str) -> bool:
    """Whether an ablation kind may resample (so its reference must keep every prompt's values)."""
    return kind in ("resample", "auto")


def _resolve_reference(
    model: nn.Module, heads: Iterable[tuple[int, int]], kind: str, site: AblationSite,
    reference: PromptSet | ReferenceActivations | None,
) -> ReferenceActivations | None:
    if kind == "zero":
        return None
    if reference is None:
        raise ValueError(
            f"{kind} ablation needs reference prompts (reference=PromptSet) to take the heads' "
            f"{'mean' if kind == 'mean' else 'values'} from; pass reference=..., or use kind='zero'."
        )
    layers = sorted({layer for layer, _ in heads})
    if isinstance(reference, ReferenceActivations):
        if reference.site != site:
            raise ValueError(f"reference activations were taken at site {reference.site!r}, not {site!r}; recompute them.")
        missing = [layer for layer in layers if layer not in reference.means]
        if missing:
            raise ValueError(f"reference activations lack layers {missing}; recompute them with those layers.")
        if kind == "resample" and reference.samples is None:
            raise ValueError("resample ablation needs per-prompt reference values; recompute with keep_samples=True.")
        return reference
    return reference_activations(model, reference, layers=layers, site=site, keep_samples=needs_samples(kind))


@dataclass(frozen=True)
class HeadAblation:
    """Replace some heads' `z` (or `result`) by zero, their reference mean, or a resampled value.

    Zero-ablating at `z` equals zeroing the heads' rows of W_O. Mean ablation uses the mean over
    reference prompts at the same token role (`reference_activations`: per position when every
    prompt has one layout); the model keeps the head's average write and loses only its
    prompt-specific information. Resampling gives each prompt the head's value on another, randomly
    chosen reference prompt (seeded per head), at the same roles. "auto" resamples the heads whose
    output is near-constant across prompts (mean ablation would be a no-op for them) and
    mean-ablates the others, by the fixed rule of `ReferenceActivations.resolved_kind`;
    `resolved_kind(run)` says what was done.
    """

    heads: tuple[tuple[int, int], ...]  # parsed into Heads
    kind: AblationKind = "mean"
    site: AblationSite = "z"

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", parse_heads(self.heads))
        _check_choice("kind", self.kind, ABLATION_KINDS)
        _check_choice("site", self.site, ABLATION_SITES)

    def spec(self) -> dict[str, Any]:
        """Plain, JSON-serialisable description, e.g. {"heads": [[1, 3]], "kind": "mean", "site": "z"}."""
        return {"heads": [list(h) for h in self.heads], "kind": self.kind, "site": self.site}

    @property
    def label(self) -> str:
        return "+".join(head_label(h) for h in self.heads)

    def resolved_kinds(self, source: Any) -> dict[Head, str]:
        """The kind applied to each head: `kind` itself, or for "auto" the rule's choice over the
        reference of `source` (an `interp.Run` or a `ReferenceActivations`)."""
        if self.kind != "auto":
            return {Head(*head): self.kind for head in self.heads}
        reference = source if isinstance(source, ReferenceActivations) else self._reference(source)
        assert reference is not None  # "auto" always has a reference
        return {Head(*head): reference.resolved_kind(*head) for head in self.heads}

    def resolved_kind(self, source: Any) -> str:
        """The ablation used, for an `ablation` column: one kind when every head got it, else
        "L0H1:mean+L4H5:resample"."""
        kinds = self.resolved_kinds(source)
        if len(set(kinds.values())) == 1:
            return next(iter(kinds.values()))
        return "+".join(f"{head_label(head)}:{kind}" for head, kind in kinds.items())

    def hooks(
        self, model: nn.Module, reference: PromptSet | ReferenceActivations | None = None, seed: int = 0,
        prompts: PromptSet | None = None,
    ) -> list[tuple[str, Callable[..., Any]]]:
        """`(hook_name, fn)` pairs for `model.run_with_hooks` / `interp.hooks.hooked`. `prompts`: the prompts
        the hooked forward reads, so a reference matched by token role gives each position its role's values."""
        check_heads(model, self.heads)
        replacer = AblationValues(self.kind, _resolve_reference(model, self.heads, self.kind, self.site, reference), seed,
                                  prompts=prompts)
        sites = _sites_by_layer(model)
        by_layer: dict[int, list[int]] = {}
        for layer, index in self.heads:
            by_layer.setdefault(layer, []).append(index)

        def make_hook(layer: int, indices: list[int]) -> Callable[..., torch.Tensor]:
            def hook(act: torch.Tensor, hook: HookPoint | None = None) -> torch.Tensor:  # (batch, pos, head, d)
                act = act.clone()  # clone: never edit a tensor another hook or cache may hold
                for index in indices:
                    act[:, :, index] = replacer(layer, index, act[:, :, index])
                return act
            return hook

        return [(sites[layer].hook(self.site), make_hook(layer, indices)) for layer, indices in sorted(by_layer.items())]

    def _reference(self, run: Any) -> ReferenceActivations | None:
        """The reference values of an `interp.Run` for this ablation's kind and site."""
        if self.site == "z":
            reference: ReferenceActivations | None = run.reference(self.kind)
            return reference
        if self.kind == "zero":
            return None
        return cast(ReferenceActivations, run.cached(("reference", needs_samples(self.kind), self.site), lambda: reference_activations(
            run.model, run.behaviour.model_prompts(run.prompts), site=self.site,
            keep_samples=needs_samples(self.kind), batch_size=run.batch_size)))

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        """The hooks for one batch of an `interp.Run` (the prompts the model reads): its reference values
        (over its prompts, matched to the batch's token roles) and seed."""
        return hooked(run.model, self.hooks(run.model, self._reference(run), run.seed, prompts=batch))


# ---------------------------------------------------------------------------------------------
# many single-head ablations in one forward


@torch.no_grad()
def _batched_head_ablations(
    model: nn.Module,
    tokens: torch.Tensor | PromptSet,
    heads: Sequence[HeadLike] | None = None,
    kind: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    site: AblationSite = "z",
    seed: int = 0,
    chunk_size: int | None = None,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """Output of the model with each head ablated alone: (ablation, batch, ...), one forward per chunk.

    The batch is expanded to one copy per ablated head (`chunk_size` heads per forward, default
    all). `forward_kwargs` go to the model (e.g. `return_type="loss", loss_per_token=True`);
    the output must keep a batch axis. Equal to one forward per head to float tolerance.
    Measured on CPUs (`python -m benchmarks redundancy`) as about 2x slower than the sequential loop: use it on a GPU.
    Internal: `interp.Run`'s `Strategy.BATCHED` calls it (through `interp.ablation`).
    """
    prompts = as_prompts(tokens)
    heads = all_heads(model) if heads is None else check_heads(model, heads)
    _check_choice("kind", kind, ABLATION_KINDS)
    _check_choice("site", site, ABLATION_SITES)
    resolved = _resolve_reference(model, heads, kind, site, reference)
    chunk_size = len(heads) if chunk_size is None else chunk_size
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be at least 1.")
    outputs = []
    for start in range(0, len(heads), chunk_size):
        replacer = AblationValues(kind, resolved, seed)
        replacer.set_batch(prompts)  # every copy of the batch has the batch's token roles
        # each head draws its own resampling stream, as the sequential ablation does
        outputs.append(_ablate_copies(model, prompts, heads[start : start + chunk_size], replacer, site, forward_kwargs))
    return torch.cat(outputs)


def _ablate_copies(model: nn.Module, prompts: PromptSet, chunk: Sequence[tuple[int, int]], replacer: AblationValues,
                   site: AblationSite, forward_kwargs: dict[str, Any]) -> torch.Tensor:
    """One forward of `prompts` repeated once per head of `chunk`, copy i with head i ablated: (copy, batch, ...)."""
    sites, batch = _sites_by_layer(model), len(prompts)
    by_layer: dict[int, list[tuple[int, int]]] = {}  # layer -> (copy, head index)
    for copy, (layer, index) in enumerate(chunk):
        by_layer.setdefault(layer, []).append((copy, index))
    hooks = [(sites[layer].hook(site), _copies_hook(replacer, layer, members, batch)) for layer, members in by_layer.items()]
    expanded = einops.repeat(prompts.tokens, "batch pos -> (copy batch) pos", copy=len(chunk))
    kwargs = dict(forward_kwargs)
    if prompts.attention_mask is not None:
        kwargs["attention_mask"] = einops.repeat(prompts.attention_mask, "batch pos -> (copy batch) pos", copy=len(chunk))
    with hooked(model, hooks):
        out = output_logits(model(expanded.to(getattr(model, "device", expanded.device)), **kwargs), model)
    if not isinstance(out, torch.Tensor) or out.ndim == 0 or out.shape[0] != len(chunk) * batch:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"the model output ({shape}) has no batch axis of size {len(chunk) * batch} to split per ablation; "
            "ask for a per-prompt output (e.g. return_type='logits', or return_type='loss', loss_per_token=True)."
        )
    return einops.rearrange(out, "(copy batch) ... -> copy batch ...", copy=len(chunk))


def _copies_hook(replacer: AblationValues, layer: int, members: list[tuple[int, int]],
                 batch: int) -> Callable[..., torch.Tensor]:
    """The hook ablating, in each `(copy, head index)` of `members`, that head in that copy's rows of the batch."""
    def hook(act: torch.Tensor, hook: HookPoint | None = None) -> torch.Tensor:  # (copy * batch, pos, head, d)
        act = act.clone()
        for copy, index in members:
            rows = slice(copy * batch, (copy + 1) * batch)
            act[rows, :, index] = replacer(layer, index, act[rows, :, index])
        return act
    return hook
