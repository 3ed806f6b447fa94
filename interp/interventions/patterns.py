"""Interventions on attention heads: ablations and pattern substitution, as small named objects.

Vocabulary (as in `interp.models.components`): a head is `(layer, head)` (an `interp.heads.Head`),
labelled `L{layer}H{head}`; `z` (batch, pos, head, d_head) is pattern @ v, `result` (batch, pos,
head, d_model) is a head's write to the residual stream, `pattern` (batch, head, query, key) is
the post-softmax weights.

- `HeadAblation(heads, kind, site)`: replace the heads' `z` (or `result`) by zero, by their
  mean over reference prompts at the same token role (`interp.data.token_roles`: [CLS] with
  [CLS], [SEP] with [SEP], content by rank; per position when every prompt has one layout), by
  their value on another reference prompt at the same roles (resampling), or, with kind="auto",
  by resampling for heads whose output is near-constant across prompts and the mean otherwise
  (`ReferenceActivations.resolved_kind`; `HeadAblation.resolved_kind(run)` names what was done).
  `spec()` is plain data for reports; `hooks(model, reference, prompts=)` gives `(hook_name, fn)`
  pairs for `run_with_hooks`; `ablate(...)` is the context manager.
- `substitute_pattern(model, layer, head, pattern)`: replace one head's pattern (an ideal one
  from `ideal_pattern`, any tensor or callable, or the head's own weights permuted among the
  allowed keys: the faithfulness control "does it matter *where* the head looks?").
- `batched_head_ablations`: many single-head ablations in one forward by expanding the batch.
  On a GPU that is the usual win; on these CPUs it measured about 2x *slower* than one
  forward per head (`python -m benchmarks redundancy` measures it), so analyses do not rely on it there.

- `PatternSubstitution(head, pattern, permute)`: the same substitution as an intervention of `interp.Run`.

Hook names always come from `interp.hooks.attention_sites(model)`; every context manager
removes its hooks in `finally` (through `interp.hooks.hooked`). Over 600 lines because every
intervention shares the reference values, the site lookup and the checks kept here; `interp.Run`
and the analyses import them as one vocabulary.
"""
from __future__ import annotations

import collections.abc
import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Protocol, Sequence, Union, cast, get_args

import einops
import torch
from torch import nn
from transformer_lens.utilities.statistics import derive_generator

from interp import distributed
from interp.capture import stop_after
from interp.data import PromptSet, token_roles
from interp.errors import BadInput, BadType
from interp.heads import Head, HeadLike, head_label, parse_head
from interp.hooks import AttentionSite, attention_sites, hooked
from interp.modelinfo import output_logits

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint
    from typing_extensions import TypeIs

AblationKind = Literal["zero", "mean", "resample", "auto"]
AblationSite = Literal["z", "result"]
IdealPattern = Literal["previous_token", "first_token", "self", "uniform"]
PatternSpec = Union[torch.Tensor, Callable[[int], torch.Tensor], str, None]

ABLATION_KINDS: tuple[str, ...] = get_args(AblationKind)
ABLATION_SITES: tuple[str, ...] = get_args(AblationSite)
IDEAL_PATTERNS: tuple[str, ...] = get_args(IdealPattern)
ROW_SUM_TOLERANCE = 1e-4  # a substituted pattern's rows must sum to one within this


# ---------------------------------------------------------------------------------------------
# heads


def _is_one_head(heads: HeadLike | Iterable[HeadLike]) -> TypeIs[HeadLike]:
    """A label, or one (layer, head) pair of integers, rather than a collection of heads."""
    return isinstance(heads, str) or (
        isinstance(heads, (tuple, list)) and len(heads) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in heads)
    )


def parse_heads(heads: HeadLike | Iterable[HeadLike]) -> tuple[Head, ...]:
    """A tuple of Heads from one head or many (pairs or labels), duplicates removed, order kept."""
    if not (_is_one_head(heads) or isinstance(heads, collections.abc.Iterable)) or isinstance(heads, bytes):
        raise BadType(f"heads={heads!r} ({type(heads).__name__}) is not a head or a list of heads; pass an "
                      "'L{layer}H{head}' label, a (layer, head) pair of integers, or a list of them, e.g. "
                      "HeadAblation(['L1H2', (0, 3)]).")
    many = [heads] if _is_one_head(heads) else heads
    parsed = tuple(dict.fromkeys(parse_head(h) for h in many))
    if not parsed:
        raise ValueError("no heads given; pass at least one (layer, head) pair or 'L{layer}H{head}' label.")
    return parsed


def all_heads(model: nn.Module) -> tuple[Head, ...]:
    """Every (layer, head) of the model, in forward order."""
    return tuple(Head(site.layer, h) for site in attention_sites(model) for h in range(site.n_heads))


def check_heads(model: nn.Module, heads: HeadLike | Iterable[HeadLike]) -> tuple[Head, ...]:
    """Parse heads and check each exists in `model`; the error says which heads do."""
    parsed = parse_heads(heads)
    sites = {site.layer: site for site in attention_sites(model)}
    for layer, index in parsed:
        site = sites.get(layer)
        if site is None or not 0 <= index < site.n_heads:
            shape = ", ".join(f"layer {s.layer}: heads 0..{s.n_heads - 1}" for s in sites.values())
            raise ValueError(
                f"head {head_label((layer, index))} = ({layer}, {index}) does not exist in this "
                f"{type(model).__name__}; it has {len(sites)} attention layers ({shape})."
            )
    return parsed


def _sites_by_layer(model: nn.Module) -> dict[int, AttentionSite]:
    return {site.layer: site for site in attention_sites(model)}


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {list(allowed)}.")


# ---------------------------------------------------------------------------------------------
# running a model over prompts


def as_prompts(prompts: PromptSet | torch.Tensor) -> PromptSet:
    """A PromptSet from a PromptSet or a (prompt, pos) token tensor."""
    if isinstance(prompts, PromptSet):
        if len(prompts) == 0:
            raise ValueError("the prompt set is empty; pass at least one prompt.")
        return prompts
    if isinstance(prompts, torch.Tensor):
        return PromptSet(prompts if prompts.ndim == 2 else prompts.unsqueeze(0))
    raise BadType(f"prompts must be an interp.data.PromptSet or a (prompt, pos) token tensor, got {type(prompts).__name__}.")


def run_stopping_after(model: nn.Module, prompts: PromptSet, last_layer: int) -> None:
    """Forward `prompts` through the model, stopping after block `last_layer` where the model allows it
    (`interp.capture.stop_after`)."""
    kwargs = prompts.model_kwargs()
    tokens = prompts.tokens.to(getattr(model, "device", prompts.tokens.device))
    kwargs = {k: v.to(tokens.device) for k, v in kwargs.items()}
    model(tokens, **stop_after(model, [last_layer]), **kwargs)


# ---------------------------------------------------------------------------------------------
# reference activations

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
    acc = _Accumulator(n_groups)
    samples: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
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

    hooks = [(sites[layer].hook(site), make_hook(layer)) for layer in layers]
    with hooked(model, hooks):
        for indices, batch in distributed.shard(reference, batch_size).batches(batch_size):
            batch_groups = groups[list(indices)]  # (batch, pos)
            current[0] = (batch.attention_mask, batch_groups)
            weights = torch.ones(batch.tokens.shape) if batch.attention_mask is None else batch.attention_mask.double()
            counts += weights.sum(0).double()
            real = batch_groups >= 0
            group_counts.index_add_(0, batch_groups[real], torch.ones(int(real.sum()), dtype=torch.float64))
            run_stopping_after(model, batch, max(layers))
    if distributed.active():  # sums over ranks in rank order, samples in global prompt order
        acc, counts, group_counts, samples = _merge_reference(acc, counts, group_counts, samples)
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


# ---------------------------------------------------------------------------------------------
# ablation


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


@contextlib.contextmanager
def ablate(
    model: nn.Module,
    heads: HeadLike | Iterable[HeadLike],
    kind: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    site: AblationSite = "z",
    seed: int = 0,
    prompts: PromptSet | None = None,
) -> Iterator[nn.Module]:
    """`with ablate(model, [(1, 3)], "mean", reference=prompts, prompts=prompts): model(tokens)`; hooks removed on exit.

    `reference` is a PromptSet (its activations are computed on entry: one forward over it) or
    the `ReferenceActivations` of `reference_activations(model, prompts)`, to share them
    between many ablations. `prompts`: the prompts the forward inside reads; with a reference of
    varying layout (padding, special tokens) each position then gets its token role's values
    (without it, the per-position ones).
    """
    ablation = HeadAblation(parse_heads(heads), kind, site)
    with hooked(model, ablation.hooks(model, reference, seed, prompts=prompts)):
        yield model


# ---------------------------------------------------------------------------------------------
# patterns


def ideal_pattern(kind: IdealPattern, n_pos: int, *, causal: bool = True) -> torch.Tensor:
    """An idealised (query, key) pattern whose rows sum to one.

    previous_token: all weight on query - 1 (query 0, which has no previous token: on itself);
    first_token: all on key 0; self: all on the query; uniform: equal on every allowed key.
    """
    _check_choice("kind", kind, IDEAL_PATTERNS)
    if n_pos < 1:
        raise ValueError(f"n_pos={n_pos} must be at least 1.")
    query = torch.arange(n_pos)
    pattern = torch.zeros(n_pos, n_pos)  # (query, key)
    if kind == "previous_token":
        pattern[query, (query - 1).clamp(min=0)] = 1.0
    elif kind == "first_token":
        pattern[:, 0] = 1.0
    elif kind == "self":
        pattern[query, query] = 1.0
    else:
        allowed = torch.ones(n_pos, n_pos).tril() if causal else torch.ones(n_pos, n_pos)
        pattern = allowed / allowed.sum(-1, keepdim=True)
    return pattern


def on_real_positions(make: Callable[[int], torch.Tensor], allowed: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """An n-position pattern `make(n)` laid on each prompt's real (unpadded) positions.

    allowed: (batch, query, key), True where a key may be attended; own: the head's own
    (batch, query, key) pattern. A prompt with m real tokens gets `make(m)` on its real queries
    and keys, so "previous token" and "first token" count from the first real token whatever the
    padding side; padded queries keep the head's own row (no real position reads them). Without
    padding this is `make(n)` for every prompt.
    """
    batch, n_query, n_key = allowed.shape
    real = allowed.any(dim=-2)  # (batch, key): keys some query may attend, i.e. real tokens
    if bool(real.all()):
        return torch.as_tensor(make(n_query))
    out = own.clone()  # (batch, query, key); clone: `own` may be the caller's cached pattern
    for row in range(batch):
        positions = real[row].nonzero().flatten()  # (m,)
        if len(positions) == 0:
            continue
        block = torch.as_tensor(make(len(positions))).to(out)  # (m, m)
        if block.shape != (len(positions), len(positions)):
            raise ValueError(f"a pattern for {len(positions)} real positions has shape {tuple(block.shape)}; "
                             f"expected ({len(positions)}, {len(positions)}).")
        laid = torch.zeros(len(positions), n_key, dtype=out.dtype, device=out.device)
        laid[:, positions] = block
        out[row, positions] = laid
    return out


def _allowed_keys(original: torch.Tensor, causal: bool | None) -> torch.Tensor:
    """(batch, query, key) True where a key may be attended: causally allowed and not padding.

    Padding is read off the head's own pattern: a key that no head and no query gives any
    weight to was masked (masked keys get exactly 0 after softmax of -inf).
    """
    batch, _, n_query, n_key = original.shape
    allowed = torch.ones(batch, n_query, n_key, dtype=torch.bool, device=original.device)
    if causal:
        allowed &= torch.ones(n_query, n_key, dtype=torch.bool, device=original.device).tril()
    padded = original.sum(dim=(1, 2)) == 0  # (batch, key)
    allowed &= ~einops.rearrange(padded, "batch key -> batch 1 key")
    return allowed


def permute_among_allowed(pattern: torch.Tensor, allowed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shuffle each row's weights among its allowed keys: (batch, query, key) -> same shape, same row sums."""
    n_key = pattern.shape[-1]
    position = torch.arange(n_key, dtype=torch.float32, device=pattern.device).expand(pattern.shape)
    inf = torch.tensor(float("inf"), device=pattern.device)
    in_order = torch.where(allowed, position, inf).argsort(dim=-1)  # allowed keys first, ascending
    noise = torch.rand(pattern.shape, generator=generator).to(pattern.device)
    shuffled = torch.where(allowed, noise, inf).argsort(dim=-1)  # allowed keys first, random order
    # positions past the allowed count pair disallowed keys with disallowed keys: zeros stay zeros
    return torch.zeros_like(pattern).scatter(-1, in_order, pattern.gather(-1, shuffled))


def check_pattern_rows(pattern: torch.Tensor, what: str = "pattern") -> None:
    """Every row sums to one (or is all zero, a padded query); raise naming the worst row otherwise."""
    if not torch.isfinite(pattern).all():
        raise ValueError(f"{what} contains NaN or inf.")
    if (pattern < 0).any():
        raise ValueError(f"{what} has negative weights (min {pattern.min().item():.3g}); attention weights are >= 0.")
    sums = pattern.sum(-1)
    bad = ((sums - 1).abs() > ROW_SUM_TOLERANCE) & (sums != 0)
    if bad.any():
        worst = (sums - 1).abs().masked_fill(~bad, -1).argmax()
        row = tuple(int(i) for i in torch.unravel_index(worst, sums.shape))
        raise ValueError(
            f"{what}: row {row} sums to {sums.flatten()[worst].item():.6f}, not 1; "
            "attention rows must sum to one over the keys (normalise with p / p.sum(-1, keepdim=True))."
        )


def _check_pattern_spec(pattern: PatternSpec, label: str) -> None:
    """A pattern argument of a kind substitute_pattern takes; a tensor's rows must sum to one."""
    if isinstance(pattern, str):
        _check_choice("pattern", pattern, IDEAL_PATTERNS)
    elif not (pattern is None or isinstance(pattern, torch.Tensor) or callable(pattern)):
        raise BadType(
            f"pattern must be a tensor, a callable n_pos -> (query, key), one of {list(IDEAL_PATTERNS)} or None, "
            f"got {type(pattern).__name__}."
        )
    if isinstance(pattern, torch.Tensor):
        if pattern.ndim not in (2, 3):
            raise ValueError(f"pattern has shape {tuple(pattern.shape)}; expected (query, key) or (batch, query, key).")
        check_pattern_rows(pattern, f"pattern for {label}")


@dataclass(kw_only=True)
class _PatternSubstitution:
    """The hooks of one `substitute_pattern`: `read_mask` on the scores notes which keys the model
    allows, `replace` on the pattern puts the new pattern in the head's place."""

    site: AttentionSite
    head: int
    pattern: PatternSpec
    permute_keys: bool
    generator: torch.Generator
    allowed: torch.Tensor | None = None  # (batch, query, key), from the scores of the current forward

    @property
    def label(self) -> str:
        return head_label((self.site.layer, self.head))

    def read_mask(self, scores: torch.Tensor, hook: HookPoint | None = None) -> None:  # (batch, head, query, key)
        # masked keys are -inf in the scores; a near-one-hot head's real keys can be exactly 0 after softmax
        if bool(scores.isneginf().any()) or not self.site.causal:
            self.allowed = ~scores[:, self.head].isneginf()

    def replace(self, original: torch.Tensor, hook: HookPoint | None = None) -> torch.Tensor:  # (batch, head, query, key)
        allowed, self.allowed = self.allowed, None  # (batch, query, key)
        if allowed is None:  # no scores hook, or one carrying weights (some bridges): read it off the pattern
            allowed = _allowed_keys(original, self.site.causal)
        new = self._checked(self._target(original, allowed), original, allowed)  # (batch, query, key)
        if self.permute_keys:
            new = permute_among_allowed(new, allowed, self.generator)
        out = original.clone()  # clone: the caller's cache may hold `original`
        out[:, self.head] = new
        return out

    def _target(self, original: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The pattern asked for, before shape checks: (query, key) or (batch, query, key)."""
        pattern, own = self.pattern, original[:, self.head]  # own: (batch, query, key)
        if pattern is None:
            return own
        if isinstance(pattern, str) and pattern == "uniform":
            return allowed.to(original.dtype) / allowed.sum(-1, keepdim=True).clamp(min=1)
        if isinstance(pattern, str):
            name = cast(IdealPattern, pattern)  # substitute_pattern checked it against IDEAL_PATTERNS
            return on_real_positions(lambda m: ideal_pattern(name, m, causal=bool(self.site.causal)), allowed, own)
        if isinstance(pattern, torch.Tensor):
            return pattern

        def make(m: int) -> torch.Tensor:
            made = torch.as_tensor(pattern(m))
            check_pattern_rows(made, f"pattern({m}) for {self.label}")
            return made

        return on_real_positions(make, allowed, own)

    def _checked(self, new: torch.Tensor, original: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """`new` on the head's device, dtype and (batch, query, key) shape; refused where it does not fit,
        or puts weight on keys a causal model cannot attend."""
        batch, _, n_query, n_key = original.shape
        new = new.to(device=original.device, dtype=original.dtype)
        if new.shape[-2:] != (n_query, n_key) or (new.ndim == 3 and new.shape[0] != batch):
            raise ValueError(
                f"substituted pattern for {self.label} has shape {tuple(new.shape)}, but the "
                f"head's pattern is (batch={batch}, query={n_query}, key={n_key}); pass a (query, key) tensor "
                "for this sequence length, or a callable n_pos -> (query, key)."
            )
        new = new.expand(batch, n_query, n_key)
        if self.site.causal and bool((new.masked_fill(allowed, 0) > 1e-6).any()) and self.pattern is not None:
            raise ValueError(
                f"substituted pattern for {self.label} puts weight on future (or padded) keys, "
                "which this causal model cannot attend to; use a lower-triangular pattern (e.g. ideal_pattern(..., causal=True))."
            )
        return new


@contextlib.contextmanager
def substitute_pattern(
    model: nn.Module,
    layer: int,
    head: int,
    pattern: PatternSpec = None,
    *,
    permute_keys: bool = False,
    seed: int = 0,
) -> Iterator[nn.Module]:
    """Replace one head's post-softmax pattern at `hook_pattern` for the duration of the block.

    `pattern`: a (query, key) tensor (every prompt), a (batch, query, key) tensor, a callable
    `n_pos -> (query, key)`, a name for `ideal_pattern` ("uniform" is uniform over the keys the
    model actually allows, padding excluded), or None for the head's own pattern (useful with
    `permute_keys`). `permute_keys=True` shuffles each row's weights among the allowed keys:
    same weights, random places. Rows must sum to one; a causal model refuses weight on future keys.
    """
    check_heads(model, [(layer, head)])
    site = _sites_by_layer(model)[layer]
    _check_pattern_spec(pattern, head_label((layer, head)))
    substitution = _PatternSubstitution(site=site, head=head, pattern=pattern, permute_keys=permute_keys,
                                        generator=torch.Generator().manual_seed(seed))
    hooks: list[tuple[str, Callable[..., Any]]] = [(site.hook("pattern"), substitution.replace)]
    if "attn_scores" in site.hooks:
        hooks.insert(0, (site.hook("attn_scores"), substitution.read_mask))
    with hooked(model, hooks):
        yield model


class PatternSource(Protocol):
    """A pattern computed per batch of an `interp.Run` (e.g. a head type's ideal pattern), named by `spec()`.

    `spec()` names the source in reports; `interp.Run` memoises a substitution's effect under it *and* a digest
    of what the source returns on the run's prompts (`PatternSubstitution.fingerprint`), so two sources with an
    equal spec() but different patterns never share a number."""

    def spec(self) -> dict[str, Any]: ...

    def __call__(self, run: Any, batch: PromptSet) -> PatternSpec: ...


def _is_source(value: object) -> bool:
    """A TargetSource / PatternSource: callable as (run, batch), with a callable spec()."""
    return callable(value) and callable(getattr(value, "spec", None))


def tensor_digest(tensor: torch.Tensor) -> str:
    """blake2b of a tensor's shape, dtype and bytes: equal content, equal digest."""
    tensor = tensor.detach().cpu().contiguous()
    digest = hashlib.blake2b(f"{tuple(tensor.shape)}{tensor.dtype}".encode(), digest_size=16)
    digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _pattern_digest(pattern: PatternSpec, batch: PromptSet) -> str:
    """What a PatternSource returned for one batch, as text: a tensor's digest, a name, or a callable's
    patterns at the lengths `substitute_pattern` asks of it on this batch (its real lengths and its width)."""
    if isinstance(pattern, torch.Tensor):
        return tensor_digest(pattern)
    if pattern is None or isinstance(pattern, str):
        return repr(pattern)
    lengths = {batch.n_pos}
    if batch.attention_mask is not None:
        lengths |= {int(n) for n in batch.attention_mask.sum(-1)}
    return "callable:" + ",".join(tensor_digest(torch.as_tensor(pattern(n))) for n in sorted(lengths) if n > 0)


@dataclass(frozen=True, eq=False)
class PatternSubstitution:
    """Replace one head's post-softmax pattern (`substitute_pattern`), as an intervention of `interp.Run`.

    `pattern`: "uniform" (over the keys the model allows) or another `ideal_pattern` name, a (query, key) or
    (batch, query, key) tensor (rows summing to one; named in `spec()` by its shape and a digest of its
    values), None (the head's own; with `permute=True` its weights shuffled among the allowed keys of each
    row), or a `PatternSource` computed per batch.
    """

    head: tuple[int, int]  # parsed into a Head
    pattern: str | torch.Tensor | PatternSource | None = "uniform"
    permute: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", parse_head(self.head))
        if isinstance(self.pattern, str) and self.pattern not in IDEAL_PATTERNS:
            raise ValueError(f"pattern={self.pattern!r}: a name here must be one of {list(IDEAL_PATTERNS)} ('uniform': over "
                             "the keys the model allows); pass None (the head's own, with permute=True), a tensor or a "
                             "PatternSource for another pattern.")
        if isinstance(self.pattern, torch.Tensor):
            _check_pattern_spec(self.pattern, self.label)
        elif not (self.pattern is None or isinstance(self.pattern, str) or _is_source(self.pattern)):
            raise BadType(f"PatternSubstitution pattern for {self.label} is of type {type(self.pattern).__name__}; expected one "
                          f"of {list(IDEAL_PATTERNS)}, None, a (query, key) or (batch, query, key) tensor, or a "
                          "PatternSource (an object with spec() and __call__(run, batch) -> pattern). A plain callable "
                          "n_pos -> (query, key) works with substitute_pattern; give it a spec() to use it here.")
        if not isinstance(self.permute, bool):
            raise BadType(f"PatternSubstitution permute={self.permute!r} must be True or False.")

    def spec(self) -> dict[str, Any]:
        pattern: Any = self.pattern
        if isinstance(pattern, torch.Tensor):
            pattern = {"tensor": list(pattern.shape), "blake2b": tensor_digest(pattern)}
        elif pattern is not None and not isinstance(pattern, str):
            pattern = pattern.spec()
        return {"substitute": list(self.head), "pattern": pattern, "permute": self.permute}

    def fingerprint(self, run: Any) -> str | None:
        """With a PatternSource: a digest of the patterns it gives on the run's batches (part of `Run`'s memo key,
        so sources with equal spec() but different patterns are told apart); None where spec() says it all."""
        if not _is_source(self.pattern):
            return None
        source = cast(PatternSource, self.pattern)
        digest = hashlib.blake2b(digest_size=16)
        for batch in run.prompts.batches(run.batch_size):
            model_batch = run.behaviour.model_prompts(batch)
            digest.update(_pattern_digest(source(run, model_batch), model_batch).encode())
        return digest.hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PatternSubstitution) and self.spec() == other.spec() and (
            self.pattern is other.pattern or not _is_source(self.pattern) or self.pattern == other.pattern)

    def __hash__(self) -> int:
        return hash(repr(sorted(self.spec().items())))

    @property
    def label(self) -> str:
        return head_label(self.head)

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        given = self.pattern
        pattern = cast(PatternSource, given)(run, batch) if _is_source(given) else cast(PatternSpec, given)
        layer, head = self.head
        return substitute_pattern(run.model, layer, head, pattern, permute_keys=self.permute, seed=run.seed)


def permuted_pattern(model: nn.Module, layer: int, head: int, *, seed: int = 0) -> contextlib.AbstractContextManager[nn.Module]:
    """Context manager: the head keeps its own weights, shuffled among the allowed keys of each row."""
    return substitute_pattern(model, layer, head, None, permute_keys=True, seed=seed)


def uniform_pattern(model: nn.Module, layer: int, head: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Context manager: the head attends uniformly to every allowed key."""
    return substitute_pattern(model, layer, head, "uniform")


# ---------------------------------------------------------------------------------------------
# many single-head ablations in one forward


@torch.no_grad()
def batched_head_ablations(
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
    Over 60 lines only through its signature and docstring: the body is 43 lines.
    """
    prompts = as_prompts(tokens)
    heads = all_heads(model) if heads is None else check_heads(model, heads)
    _check_choice("kind", kind, ABLATION_KINDS)
    _check_choice("site", site, ABLATION_SITES)
    resolved = _resolve_reference(model, heads, kind, site, reference)
    sites = _sites_by_layer(model)
    batch = len(prompts)
    chunk_size = len(heads) if chunk_size is None else chunk_size
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be at least 1.")
    outputs = []
    for start in range(0, len(heads), chunk_size):
        chunk = heads[start : start + chunk_size]
        replacer = AblationValues(kind, resolved, seed)
        replacer.set_batch(prompts)  # every copy of the batch has the batch's token roles
        # each head draws its own resampling stream, as the sequential ablation does
        by_layer: dict[int, list[tuple[int, int]]] = {}
        for copy, (layer, index) in enumerate(chunk):
            by_layer.setdefault(layer, []).append((copy, index))

        def make_hook(replacer: AblationValues, layer: int,
                      members: list[tuple[int, int]]) -> Callable[..., torch.Tensor]:
            def hook(act: torch.Tensor, hook: HookPoint | None = None) -> torch.Tensor:  # (copy * batch, pos, head, d)
                act = act.clone()
                for copy, index in members:
                    rows = slice(copy * batch, (copy + 1) * batch)
                    act[rows, :, index] = replacer(layer, index, act[rows, :, index])
                return act
            return hook

        hooks = [(sites[layer].hook(site), make_hook(replacer, layer, members)) for layer, members in by_layer.items()]
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
        outputs.append(einops.rearrange(out, "(copy batch) ... -> copy batch ...", copy=len(chunk)))
    return torch.cat(outputs)


# ---------------------------------------------------------------------------------------------
# knocking out the attention a role predicts (role-specific necessity, interp.analyses.claims.causal)

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
