"""Attention knockout: remove the attention a head pays to the keys a role predicts (role-specific necessity,
`interp.analyses.claims.causal`), or, as its control, an equal mass of other attention.

`AttentionKnockout(head, targets, mode, control)` is an intervention of `interp.Run`: the head's own pattern
less the target weights (`TargetSource`, per batch), renormalised (`knock_out`) or the mass moved to the
head's mean off-target pattern (`off_target_pattern`, `head_mean_pattern`); `control_removal` picks the
control's keys. Built on the pattern substitution's hooks (`interp.interventions.patterns`).
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, get_args

import einops
import torch
from torch import nn
from transformer_lens.utilities.statistics import derive_generator

from interp.data import PromptSet
from interp.errors import BadInput, BadType
from interp.heads import head_label, parse_head
from interp.hooks import hooked
from interp.interventions.common import _check_choice, _is_source, _sites_by_layer, check_heads, tensor_digest
from interp.interventions.patterns import _allowed_keys, _PatternSubstitution

KnockoutMode = Literal["renormalise", "mean_off_target"]
KNOCKOUT_MODES: tuple[str, ...] = get_args(KnockoutMode)
# A row left with less than this mass is never renormalised: dividing by it would multiply the head's
# residual weights (softmax noise) by more than 50; its removed mass goes to the mean off-target pattern.
NEAR_ZERO_REMAINDER = 0.02
_EMPTY_ROW = 1e-6  # a row (of a pattern or of removed mass) with less than this counts as empty


class TargetSource(Protocol):
    """The attention to knock out, per batch of an `interp.Run`: (batch, query, key) weights in [0, 1]
    (a bool mask: the target keys), named by `spec()`.

    `spec()` names the source in reports; `interp.Run` memoises a knockout's effect under it *and* a digest of
    the weights the source returns on the run's prompts (`AttentionKnockout.fingerprint`), so two sources with an
    equal spec() but different targets never share a number."""

    def spec(self) -> dict[str, Any]: ...

    def __call__(self, run: Any, batch: PromptSet) -> torch.Tensor: ...


def _take(weights: torch.Tensor, wanted: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """weights (..., n) >= 0, wanted (..., 1): the mass to take from each entry, emptying entries whole in
    `noise` order (lower first; entries without weight never), the last one partly, `wanted` in all (or all there is)."""
    order = torch.where(weights > 0, noise, torch.full_like(noise, 2.0)).argsort(-1)
    ordered = weights.gather(-1, order)
    before = ordered.cumsum(-1) - ordered  # mass of the entries emptied before this one
    taken = (wanted - before).clamp(min=0).minimum(ordered)
    return torch.zeros_like(weights).scatter(-1, order, taken)


def control_removal(pattern: torch.Tensor, allowed: torch.Tensor, targets: torch.Tensor,
                    noise: torch.Tensor) -> torch.Tensor:
    """(batch, query, key) mass to take from non-target keys, as much as the targets carry (`pattern *
    targets`): per query row first, keys emptied whole in a random order (`noise` (batch, query, key) in
    [0, 1): lower first), the last one partly, so the control removes attention from particular keys
    as the targeted knockout does; what a row cannot match (it has less non-target mass than target
    mass) is taken from the other rows of the same prompt, so each prompt loses the same mass (or all
    its non-target mass, when there is less)."""
    others = allowed & (targets == 0)  # (batch, query, key): the non-target keys
    off = pattern * others
    # target mass the targeted knockout moves: none in a row without a non-target key (`knock_out` keeps it)
    on = (pattern * targets).sum(-1, keepdim=True) * others.any(-1, keepdim=True)  # (batch, query, 1)
    removal = _take(off, on.minimum(off.sum(-1, keepdim=True)), noise)
    short = (on[..., 0] - removal.sum(-1)).sum(-1)  # (batch,): the target mass no row could match
    spare = einops.rearrange(off - removal, "batch query key -> batch (query key)")
    more = _take(spare, short[:, None], einops.rearrange(noise, "batch query key -> batch (query key)"))
    return removal + more.view_as(removal)


def off_target_pattern(mean: torch.Tensor, allowed: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(batch, query, key) rows summing to one over the allowed keys outside `targets` (those knocked out;
    weights of 1 count as out): the head's mean pattern `mean` (query, key) there, renormalised; uniform
    over those keys where the mean puts no weight on them; zero rows where no such key exists."""
    keys = (allowed & (targets < 1)).to(mean.dtype)  # keys the knocked-out mass may go to
    weights = mean.to(keys.device)[None] * keys  # (batch, query, key)
    total = weights.sum(-1, keepdim=True)
    uniform = keys / keys.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(total > _EMPTY_ROW, weights / total.clamp(min=_EMPTY_ROW), uniform)


def knock_out(pattern: torch.Tensor, removal: torch.Tensor, off_target: torch.Tensor,
              mode: KnockoutMode = "renormalise") -> torch.Tensor:
    """pattern (batch, query, key) less `removal` (same shape, 0 <= removal <= pattern), rows summing to one
    again: renormalised over what is left (mode "renormalise", rows keeping at least `NEAR_ZERO_REMAINDER`),
    else the removed mass added as `off_target` (rows summing to one). A row with nowhere to move its
    mass (an empty `off_target` row, e.g. a query whose only key is the target) keeps its pattern."""
    kept = pattern - removal
    remainder = kept.sum(-1, keepdim=True)  # (batch, query, 1)
    moved = kept + removal.sum(-1, keepdim=True) * off_target
    can_move = off_target.sum(-1, keepdim=True) > 0.5
    out = torch.where(can_move, moved, pattern)
    if mode == "renormalise":
        renormalise = remainder >= NEAR_ZERO_REMAINDER
        out = torch.where(renormalise, kept / remainder.clamp(min=NEAR_ZERO_REMAINDER), out)
    return out


def head_mean_pattern(run: Any, layer: int, head: int) -> torch.Tensor:
    """The head's (query, key) pattern averaged over the run's prompts (as the model reads them), each
    entry over the prompts where that query and key are both real; 0 where none is."""
    from interp.capture import MomentAccumulator, stream

    def compute() -> torch.Tensor:
        def reduce(pattern: torch.Tensor, ctx: Any) -> dict[str, torch.Tensor]:  # (batch, head, query, key)
            return {"pattern": pattern.float().masked_fill(~ctx.allowed, float("nan"))}
        prompts = run.behaviour.model_prompts(run.prompts)
        moments = MomentAccumulator()  # type: ignore[no-untyped-call]
        acc = stream(run.model, prompts, reduce, layers=[layer], batch_size=run.batch_size, accumulator=moments)
        mean: torch.Tensor = acc.result()["pattern"]["mean"][0].float()  # (head, query, key)
        return mean.nan_to_num(0.0)
    pattern: torch.Tensor = run.cached(("knockout-mean-pattern", layer), compute)
    return pattern[head]


def _prompt_noise(seed: int, rows: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """(batch, query, key) uniform noise, drawn per prompt from its row in the run's prompt set, so the
    control's choice of keys does not depend on the batch size."""
    return torch.stack([torch.rand(shape, generator=derive_generator(seed, "knockout-control", int(row))) for row in rows])


@dataclass(kw_only=True)
class _Knockout(_PatternSubstitution):
    """The hook of one `AttentionKnockout` for one batch: the head's own pattern, knocked out."""

    targets: torch.Tensor  # (batch, query, key) weights in [0, 1]
    mean: torch.Tensor  # (query, key) the head's mean pattern over the run's prompts
    noise: torch.Tensor | None  # (batch, query, key): the control's key order; None: knock out the targets
    mode: KnockoutMode

    def _target(self, original: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        own = original[:, self.head].float()  # (batch, query, key)
        real = _allowed_keys(original, causal=False)[:, 0]  # (batch, key): a key no query gives weight is padding
        allowed = allowed & real[:, None, :] & real[:, :, None]  # padded queries are left alone too
        targets = self.targets.to(own.device, own.dtype)
        if targets.shape != own.shape:
            raise ValueError(f"knockout targets for {self.label} have shape {tuple(targets.shape)}; the head's pattern "
                             f"is (batch, query, key) = {tuple(own.shape)}.")
        if self.noise is None:
            removal = own * targets
        else:
            removal = control_removal(own, allowed, targets, self.noise.to(own.device))
        emptied = torch.maximum(targets, (removal > 0).to(own.dtype))  # the moved mass never returns to these keys
        return knock_out(own, removal, off_target_pattern(self.mean, allowed, emptied), self.mode)


@dataclass(frozen=True)
class AttentionKnockout:
    """Knock out the attention one head pays to `targets` (`TargetSource`), as an intervention of `interp.Run`:
    the head's own post-softmax pattern minus the target weights, renormalised over the remaining keys
    (mode "renormalise"; rows keeping under `NEAR_ZERO_REMAINDER` move the mass as below) or the mass moved
    to the head's mean off-target pattern over the run's prompts (mode "mean_off_target").

    `control=True` knocks out an equal mass of *non-target* attention instead (per query row, keys emptied
    in an order seeded per prompt, what a row cannot match taken from the prompt's other rows:
    `control_removal`), moved the same way (never back to the keys it emptied): the comparison that tells "the
    targets matter" from "any perturbation of this head's pattern of this size matters"."""

    head: tuple[int, int]  # parsed into a Head
    targets: TargetSource
    mode: KnockoutMode = "renormalise"
    control: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", parse_head(self.head))
        _check_choice("mode", self.mode, KNOCKOUT_MODES)
        if not _is_source(self.targets):
            raise BadType(f"AttentionKnockout targets must be a TargetSource (callable (run, batch) -> (batch, query, key) "
                          f"mask, with spec()), got {type(self.targets).__name__}.")
        if not isinstance(self.control, bool):
            raise BadType(f"AttentionKnockout control={self.control!r} must be True or False.")

    def spec(self) -> dict[str, Any]:
        return {"knockout": list(self.head), "targets": self.targets.spec(), "mode": self.mode, "control": self.control}

    def fingerprint(self, run: Any) -> str:
        """A digest of the target weights on the run's batches: part of `Run`'s memo key, so two TargetSources
        with an equal spec() but different targets are told apart."""
        digest = hashlib.blake2b(digest_size=16)
        for batch in run.prompts.batches(run.batch_size):
            digest.update(tensor_digest(self._targets(run, run.behaviour.model_prompts(batch))).encode())
        return digest.hexdigest()

    def _targets(self, run: Any, batch: PromptSet) -> torch.Tensor:
        """The source's (batch, query, key) weights for one batch, checked: a tensor of that shape, finite, in [0, 1]."""
        expected = (len(batch), batch.n_pos, batch.n_pos)
        value = self.targets(run, batch)
        where = f"knockout targets for {self.label} (TargetSource {self.targets.spec()!r})"
        try:
            targets = torch.as_tensor(value).float()
        except (TypeError, ValueError, RuntimeError):
            targets = None
        if value is None or targets is None:
            raise BadInput(f"{where}: the source returned {type(value).__name__}; expected (batch, query, key) = "
                           f"{expected} weights in [0, 1] (a bool mask: True on the keys to knock out).")
        if tuple(targets.shape) != expected:
            raise BadInput(f"{where} have shape {tuple(targets.shape)}; expected (batch, query, key) = {expected} "
                           "weights in [0, 1] for this batch.")
        finite = torch.isfinite(targets)
        if not bool(finite.all()):
            raise BadInput(f"{where}: {int((~finite).sum())} of {targets.numel()} weights are NaN or infinite; target "
                           "weights must be finite, in [0, 1] (a bool mask: True on the keys to knock out).")
        if bool(((targets < 0) | (targets > 1)).any()):
            raise BadInput(f"{where} must be (batch, query, key) weights in [0, 1]; got range "
                           f"[{float(targets.min()):.3g}, {float(targets.max()):.3g}].")
        return targets

    @property
    def label(self) -> str:
        return head_label(self.head)

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        layer, head = self.head
        check_heads(run.model, [self.head])
        site = _sites_by_layer(run.model)[layer]
        targets = self._targets(run, batch)  # (batch, query, key)
        rows = torch.arange(len(batch)) if batch.rows is None else batch.rows
        noise = _prompt_noise(run.seed, rows, (batch.n_pos, batch.n_pos)) if self.control else None
        hook = _Knockout(site=site, head=head, pattern=None, permute_keys=False, generator=torch.Generator(),
                         targets=targets, mean=head_mean_pattern(run, layer, head), noise=noise, mode=self.mode)
        hooks: list[tuple[str, Callable[..., Any]]] = [(site.hook("pattern"), hook.replace)]
        if "attn_scores" in site.hooks:
            hooks.insert(0, (site.hook("attn_scores"), hook.read_mask))
        return hooked(run.model, hooks)
