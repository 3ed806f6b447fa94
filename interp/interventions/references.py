"""Reference activations: the heads' values over reference prompts, from which mean and resample ablation take theirs.

`reference_activations(model, reference)` runs the reference prompts once and keeps, per layer, the mean of
every head's `z` (or `result`) at each token role (`interp.data.token_roles`: [CLS] with [CLS], [SEP] with
[SEP], content by rank; per position when every prompt has one layout), with `keep_samples` every prompt's
values, and each head's across-prompt variance fraction, which kind="auto" reads
(`ReferenceActivations.resolved_kind`). Computed once, shared by every ablation over the same reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

import einops
import torch
from torch import nn

import interp.distributed as distributed
from interp.data import PromptSet, token_roles
from interp.hooks import hooked
from interp.interventions.common import (
    ABLATION_SITES,
    AblationSite,
    _check_choice,
    _sites_by_layer,
    as_prompts,
    run_stopping_after,
)

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint

ROLE_WIDTH = 1 << 32  # role keys: kind * ROLE_WIDTH + index (interp.data.TokenRoles.key)
# kind="auto": resample a head whose across-prompt variance (at matched token roles) is below this fraction
# of its mean squared norm, i.e. mean ablation would leave over 95% of its output's energy in place (a near
# no-op); a fixed convention of this toolkit, not fitted to any model
AUTO_RESAMPLE_BELOW = 0.05


@dataclass(frozen=True)
class ReferenceActivations:
    """Activations of heads over reference prompts, for mean and resample ablation.

    `means[layer]`: (pos, head, d) per-position mean over the reference prompts (padding
    excluded; a position no prompt reaches is 0). `samples[layer]`: (prompt, pos, head, d), kept
    only for resampling. Computed once, reused by every ablation that shares the reference.

    Token roles (`interp.data.token_roles`): when the reference prompts do not all share one layout
    (padding, or special tokens in different columns), a position's mean is over the positions of
    the same *role*: `role_means[layer]` (role, head, d), one row per key of `role_keys` (role,);
    `sample_roles` (prompt, pos) is each reference position's row (-1 at padding) and
    `role_positions` (prompt, role) each prompt's position of each role (-1 where it has none).
    All three are None when every prompt has the same layout: roles are then positions, and
    `means` is the role mean exactly. `variance_fraction[layer]` (head,): the head's across-prompt
    variance at matched roles over its mean squared norm (`resolved_kind` reads it).
    """

    site: AblationSite
    means: dict[int, torch.Tensor]
    samples: dict[int, torch.Tensor] | None
    n_prompts: int
    variance_fraction: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (head,)
    role_means: dict[int, torch.Tensor] | None = None  # layer -> (role, head, d)
    role_keys: torch.Tensor | None = None  # (role,) sorted role keys
    sample_roles: torch.Tensor | None = None  # (prompt, pos) row of role_means, -1 at padding
    role_positions: torch.Tensor | None = None  # (prompt, role) position of each role, -1 if absent

    @property
    def n_pos(self) -> int:
        return next(iter(self.means.values())).shape[0]

    @property
    def by_role(self) -> bool:
        """Whether means are matched by token role (the reference prompts differ in layout)."""
        return self.role_keys is not None

    def role_rows(self, prompts: PromptSet) -> torch.Tensor:
        """(prompt, pos) each position's row of `role_means` (-1 at padding); raises for a role the
        reference never saw (e.g. prompts longer than every reference prompt)."""
        assert self.role_keys is not None  # callers check by_role
        keys = token_roles(prompts).key(ROLE_WIDTH)  # (prompt, pos)
        rows = torch.searchsorted(self.role_keys, keys.clamp(min=0)).clamp(max=len(self.role_keys) - 1)
        found = self.role_keys[rows] == keys
        missing = (keys >= 0) & ~found
        if bool(missing.any()):
            prompt, pos = (int(i) for i in missing.nonzero()[0])
            raise ValueError(
                f"prompt {prompts.row_numbers([prompt])[0]} has a token at position {pos} whose role (token "
                f"kind {int(keys[prompt, pos] // ROLE_WIDTH)}, index {int(keys[prompt, pos] % ROLE_WIDTH)}) no reference "
                "prompt has; pass reference prompts at least as long as the prompts being ablated.")
        return torch.where(keys >= 0, rows, -1)

    def resolved_kind(self, layer: int, head: int) -> str:
        """What kind="auto" does for this head: "resample" when its output is near-constant across prompts
        (variance at matched roles below AUTO_RESAMPLE_BELOW of its mean square: mean ablation would
        barely change it), else "mean". A head whose output is exactly zero gets "mean" (both are no-ops)."""
        if layer not in self.variance_fraction:
            raise ValueError(f"reference activations lack layer {layer}; recompute them with that layer.")
        return "resample" if float(self.variance_fraction[layer][head]) < AUTO_RESAMPLE_BELOW else "mean"


def _role_layout(reference: PromptSet) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(role keys (role,) or None when every prompt has one layout, each position's group (prompt, pos)).

    The group is the row of the role (-1 at padding), or the position itself when roles are positions.
    """
    keys = token_roles(reference).key(ROLE_WIDTH)  # (prompt, pos)
    if bool((keys >= 0).all()) and bool((keys == keys[:1]).all()):
        return None, einops.repeat(torch.arange(reference.n_pos), "pos -> prompt pos", prompt=len(reference))
    role_keys = torch.unique(keys[keys >= 0])  # sorted
    rows = torch.searchsorted(role_keys, keys.clamp(min=0))
    return role_keys, torch.where(keys >= 0, rows, -1)


@dataclass
class _Accumulator:
    """Running sums over reference batches: per position (today's means) and per group (role or position)."""

    n_groups: int
    sums: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (pos, head, d)
    group_sums: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (group, head, d)
    group_squares: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (group, head)

    def add(self, layer: int, act: torch.Tensor, mask: torch.Tensor | None, groups: torch.Tensor) -> None:
        """act (batch, pos, head, d); groups (batch, pos), -1 at padding."""
        weights = (torch.ones(act.shape[:2], dtype=torch.float64) if mask is None else mask.double()).to(act.device)
        total = einops.einsum(act.double(), weights, "batch pos head d, batch pos -> pos head d")
        self.sums[layer] = total if layer not in self.sums else self.sums[layer] + total
        real = (groups >= 0).to(act.device)
        values, index = act[real].double(), groups.to(act.device)[real]  # (token, head, d), (token,)
        group_sum = torch.zeros(self.n_groups, *act.shape[2:], dtype=torch.float64, device=act.device).index_add_(0, index, values)
        squares = torch.zeros(self.n_groups, act.shape[2], dtype=torch.float64, device=act.device).index_add_(
            0, index, values.square().sum(-1))
        for store, value in ((self.group_sums, group_sum), (self.group_squares, squares)):
            store[layer] = value if layer not in store else store[layer] + value


@torch.no_grad()
def reference_activations(
    model: nn.Module,
    reference: PromptSet | torch.Tensor,
    *,
    layers: Iterable[int] | None = None,
    site: AblationSite = "z",
    keep_samples: bool = False,
    batch_size: int = 32,
) -> ReferenceActivations:
    """Means at matching token roles (and, with `keep_samples`, every prompt's values) of all heads' `site`.

    The rule (`interp.data.token_roles`): a position's mean is over the reference positions of the
    same role: the leading special tokens ([CLS], BOS) by their rank in that run, the trailing ones
    ([SEP]) by their rank from the end, every other real token by its rank among the prompt's real
    tokens (counted from the first real token, so content is left-aligned whatever the padding side);
    padding never counts. When all prompts share one layout (no padding, specials in the same
    columns) roles are positions and the means are today's per-position means, bit for bit.
    """
    _check_choice("site", site, ABLATION_SITES)
    reference = as_prompts(reference)
    sites = _sites_by_layer(model)
    layers = sorted(set(sites) if layers is None else set(layers))
    role_keys, groups = _role_layout(reference)  # groups: (prompt, pos)
    n_groups = reference.n_pos if role_keys is None else len(role_keys)
    hooks = [(sites[layer].hook(site), layer) for layer in layers]
    acc, counts, group_counts, samples = _sum_over_reference(model, reference, hooks, groups, n_groups,
                                                             keep_samples=keep_samples, batch_size=batch_size)
    denominator = einops.rearrange(counts.clamp(min=1.0), "pos -> pos 1 1")
    means = {layer: (acc.sums[layer].cpu() / denominator).float() for layer in layers}
    kept = {layer: torch.cat(samples[layer]) for layer in layers} if keep_samples else None
    group_means = {layer: acc.group_sums[layer].cpu() / einops.rearrange(group_counts.clamp(min=1.0), "g -> g 1 1")
                   for layer in layers}  # float64
    fraction = {layer: _variance_fraction(group_means[layer], acc.group_squares[layer].cpu(), group_counts) for layer in layers}
    if role_keys is None:
        return ReferenceActivations(site, means, kept, len(reference), fraction)
    positions = _role_positions(groups, len(role_keys)) if keep_samples else None
    return ReferenceActivations(site, means, kept, len(reference), fraction, {k: v.float() for k, v in group_means.items()},
                                role_keys, groups if keep_samples else None, positions)


def _sum_over_reference(
    model: nn.Module, reference: PromptSet, hooks: list[tuple[str, int]], groups: torch.Tensor, n_groups: int, *,
    keep_samples: bool, batch_size: int,
) -> tuple[_Accumulator, torch.Tensor, torch.Tensor, dict[int, list[torch.Tensor]]]:
    """One forward over the reference prompts, stopped after the last hooked layer: the running sums of each
    `(hook_name, layer)` of `hooks`, the real tokens per position (pos,) and per group (group,), and with
    `keep_samples` every batch's values; summed over ranks when distributed. groups: (prompt, pos)."""
    acc = _Accumulator(n_groups)
    samples: dict[int, list[torch.Tensor]] = {layer: [] for _, layer in hooks}
    counts = torch.zeros(reference.n_pos, dtype=torch.float64)
    group_counts = torch.zeros(n_groups, dtype=torch.float64)
    current: list[tuple[torch.Tensor | None, torch.Tensor]] = [(None, groups)]  # this batch's (mask, groups)

    def make_hook(layer: int) -> Callable[..., None]:
        def hook(act: torch.Tensor, hook: HookPoint | None = None) -> None:  # (batch, pos, head, d)
            act = act.detach()
            acc.add(layer, act, *current[0])
            if keep_samples:
                samples[layer].append(act.cpu().clone())
            return None
        return hook

    with hooked(model, [(name, make_hook(layer)) for name, layer in hooks]):
        for indices, batch in distributed.shard(reference, batch_size).batches(batch_size):
            batch_groups = groups[list(indices)]  # (batch, pos)
            current[0] = (batch.attention_mask, batch_groups)
            weights = torch.ones(batch.tokens.shape) if batch.attention_mask is None else batch.attention_mask.double()
            counts += weights.sum(0).double()
            real = batch_groups >= 0
            group_counts.index_add_(0, batch_groups[real], torch.ones(int(real.sum()), dtype=torch.float64))
            run_stopping_after(model, batch, max(layer for _, layer in hooks))
    if distributed.active():  # sums over ranks in rank order, samples in global prompt order
        return _merge_reference(acc, counts, group_counts, samples)
    return acc, counts, group_counts, samples


def _variance_fraction(means: torch.Tensor, squares: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(head,) across-prompt variance at matched groups over the mean squared norm; 1 where the head is all zero.

    means (group, head, d), squares (group, head) summed squared norms, counts (group,).
    """
    total = squares.sum(0)  # (head,)
    variance = (squares - counts[:, None] * means.square().sum(-1)).sum(0).clamp(min=0.0)  # (head,)
    return torch.where(total > 0, variance / total.clamp(min=1e-300), torch.ones_like(total)).float()


def _role_positions(groups: torch.Tensor, n_roles: int) -> torch.Tensor:
    """(prompt, role) the position of each role in each prompt, -1 where the prompt has none."""
    out = torch.full((groups.shape[0], n_roles), -1, dtype=torch.long)
    prompt, pos = (groups >= 0).nonzero(as_tuple=True)
    out[prompt, groups[prompt, pos]] = pos
    return out


def _merge_reference(
    acc: _Accumulator, counts: torch.Tensor, group_counts: torch.Tensor, samples: dict[int, list[torch.Tensor]]
) -> tuple[_Accumulator, torch.Tensor, torch.Tensor, dict[int, list[torch.Tensor]]]:
    """Every rank's reference sums, counts and samples, combined identically on every rank."""
    def cpu(store: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        return {k: v.cpu() for k, v in store.items()}

    parts = distributed.gather_objects((cpu(acc.sums), cpu(acc.group_sums), cpu(acc.group_squares), counts,
                                        group_counts, samples))
    merged = _Accumulator(acc.n_groups)
    for part in parts:
        for store, values in ((merged.sums, part[0]), (merged.group_sums, part[1]), (merged.group_squares, part[2])):
            for layer, total in values.items():
                store[layer] = total if layer not in store else store[layer] + total
    merged_counts = sum((part[3] for part in parts[1:]), parts[0][3].clone())
    merged_groups = sum((part[4] for part in parts[1:]), parts[0][4].clone())
    merged_samples = {layer: [chunk for part in parts for chunk in part[5][layer]] for layer in samples}
    return merged, merged_counts, merged_groups, merged_samples
