"""Which heads matter together: joint ablation of pairs against the sum of each alone, and compensation
(direct vs total effects, self-repair, and how later heads back up an ablated one)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

import interp.ablation as _ablation
import interp.distributed as distributed
from interp.ablation import resumable
from interp.analyses.redundancy.common import _check_n, _heads_frame, _pairs_frame, _parse_pairs, named, redundancy_run
from interp.analyses.redundancy.similarity import SuggestBy, suggest_pairs
from interp.behaviour import BehaviourLike
from interp.data import PromptSet
from interp.heads import Head, HeadLike
from interp.interventions import (
    AblationKind,
    AblationValues,
    HeadAblation,
    ReferenceActivations,
    all_heads,
    check_heads,
)
from interp.launch import Device, DType
from interp.run import Run
from interp.stats import benjamini_hochberg, sign_flip_test


def joint_ablation(
    model: nn.Module | Run,
    prompts: PromptSet | None = None,
    pairs: Sequence[tuple[HeadLike, HeadLike]] | int = 5,
    method: AblationKind = "mean",
    *,
    suggest_by: SuggestBy = "second_order",
    reference: PromptSet | ReferenceActivations | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int | None = None,
    seed: int | None = None,
    fast: bool = True,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Loss change of ablating both heads of a pair against the sum of each alone.

    `pairs`: a list of head pairs, or an int k for the top-k pairs of `suggest_pairs(by=suggest_by)`,
    suggested on one half of the prompts and measured on the other (never on the prompts that
    chose them). One row per pair: `delta_a`, `delta_b`, `delta_both` and `interaction` =
    delta_both - delta_a - delta_b (main metric: `ci_low`/`ci_high`), `p_value` (sign-flip,
    interaction > 0), `p_adjusted` (Benjamini-Hochberg over the pairs), `n_prompts`.
    interaction > 0: the pair matters together more than apart (redundancy, backup); < 0:
    removing one already removes most of what the other adds. `behaviour` / `ablation` columns: what the
    loss is (default as `interp.Run`'s) and the ablation kind. `model`: an `interp.Run` or a model
    with its prompts and the Run's options; every ablation is a `Run.effect`.
    """
    run = redundancy_run(model, prompts, "joint_ablation", method=method, fast=fast, reference=reference, behaviour=behaviour,
                         batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    if isinstance(pairs, int) and not isinstance(pairs, bool):
        proposing, measuring = run.prompts.split(0.5, seed=run.seed)
        _check_n(measuring)
        pairs = suggest_pairs(run.model, proposing, pairs, by=suggest_by, method=method, behaviour=run.behaviour,
                              batch_size=run.batch_size, seed=run.seed)
        run = run.on(measuring)
    pairs = _parse_pairs(run.model, pairs)
    singles = sorted({h for pair in pairs for h in pair})
    effects = run.effects([HeadAblation((h,), method) for h in singles] + [HeadAblation(tuple(p), method) for p in pairs])
    single = {h: e.values for h, e in zip(singles, effects)}
    both = torch.stack([e.values for e in effects[len(singles):]])  # (pair, prompt)
    delta_a = torch.stack([single[a] for a, _ in pairs])  # (pair, prompt)
    delta_b = torch.stack([single[b] for _, b in pairs])
    interaction = both - delta_a - delta_b
    metrics = {"interaction": interaction.T, "delta_a": delta_a.T, "delta_b": delta_b.T, "delta_both": both.T}
    frame = _pairs_frame(pairs, metrics, len(run.prompts), main="interaction", seed=run.seed)
    p_value = sign_flip_test(interaction.T, alternative="greater", seed=run.seed, label="joint").numpy()
    frame.insert(frame.columns.get_loc("ci_high") + 1, "p_value", p_value)
    frame.insert(frame.columns.get_loc("p_value") + 1, "p_adjusted", benjamini_hochberg(p_value)[1])
    frame.attrs["clean_loss"] = float(effects[0].clean.mean())
    return named(frame, run, method)


@dataclass(frozen=True)
class CompensationResult:
    """`effects`: one row per head (direct_effect, total_effect, self_repair with CIs);
    `matrix`: one row per (ablated head, later head) with `compensation`, `frozen_effect`, `recovered`,
    `takeover` and `alignment` (see `compensation`); both name the `behaviour` and the `ablation`.
    `square()` gives the labelled ablated x compensating frame for a heat map."""

    effects: pd.DataFrame
    matrix: pd.DataFrame
    per_prompt: dict = field(default_factory=dict, repr=False, compare=False)  # (A, C) -> {metric: (prompt,)}

    def square(self, metric: str = "compensation") -> pd.DataFrame:
        return self.matrix.pivot(index="label_a", columns="label_b", values=metric).rename_axis(
            index="ablated", columns="compensating")


@dataclass
class _CompensationRun:
    """What `compensation` measures with, and its per-batch results, (batch,) tensors per head or pair."""

    engine: _ablation.AblationEngine
    everything: tuple[Head, ...]  # every head C
    ablated_heads: tuple[Head, ...]  # the heads A ablated for the compensation matrix
    result_names: dict[int, str]  # layer -> its hook_result name
    direct: list[torch.Tensor] = field(default_factory=list)  # (head, batch) per batch
    comp: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    frozen: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    align: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    takeover: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    sources_direct: dict[Head, AblationValues] = field(init=False)  # C's direct path ablated
    sources_a: dict[Head, AblationValues] = field(init=False)  # A ablated for the matrix

    def __post_init__(self) -> None:
        values = self.engine.values
        # ablation value sources, one per head and purpose (each resampling stream seeded alike)
        self.sources_direct = {h: values() for h in self.everything}
        self.sources_a = {a: values() for a in self.ablated_heads}

    def later(self, a: Head) -> list[Head]:
        return [c for c in self.everything if c[0] > a[0]]

    def pairs(self) -> list[tuple[Head, Head]]:
        """Every (A, later C) of the compensation matrix, in the order the batches fill them."""
        return list(dict.fromkeys((a, c) for a in self.ablated_heads for c in self.later(a)))

    def key(self, indices: range) -> None:
        """Key every source's resampling by the batch's global prompt indices (`AblationValues.prompt_index`)."""
        for sources in (self.sources_direct, self.sources_a):
            for values in sources.values():
                values.prompt_index = indices

    def gathered(self) -> tuple[torch.Tensor, dict]:
        """Direct effects (prompt, head) and the per-prompt values of each pair, every prompt of every rank
        in global order: this rank's values go as one (row, prompt) tensor, one collective."""
        pairs, n_heads = self.pairs(), len(self.everything)
        stores = (self.comp, self.frozen, self.align, self.takeover)
        if self.direct:
            blocks = [torch.cat(self.direct, 1)]
            blocks += [torch.stack([torch.cat(store[p]) for p in pairs]) for store in stores if pairs]
            local = torch.cat([block.double().cpu() for block in blocks])  # (row, prompt)
        else:  # an empty shard
            local = torch.zeros(n_heads + len(stores) * len(pairs), 0, dtype=torch.float64)
        rows = distributed.gather_prompts(local, dim=1)
        direct = rows[:n_heads]
        rest = rows[n_heads:].reshape(len(stores), len(pairs), rows.shape[1])  # (metric, pair, prompt)
        per_prompt = {p: {name: rest[k, i].clone() for k, name in enumerate(_PAIR_METRICS)}
                      for i, p in enumerate(pairs)}
        return direct.T, per_prompt


@dataclass
class _CleanEffects:
    """One batch's clean run, each head's change of write when ablated and its clean direct effect."""

    clean: _ablation.CleanBatch
    write_change: dict[Head, torch.Tensor]  # head -> (batch, pos, d_model): ablated minus clean write
    direct: dict[Head, torch.Tensor]  # head -> (batch,): clean direct effect

    def loss_from(self, engine: _ablation.AblationEngine, resid: torch.Tensor) -> torch.Tensor:
        return engine.loss_from_resid(resid, self.clean.prompts, "direct effect", self.clean.summary)


def compensation(
    model: nn.Module | Run,
    prompts: PromptSet | None = None,
    method: AblationKind = "mean",
    *,
    heads: Sequence[HeadLike] | None = None,
    reference: PromptSet | ReferenceActivations | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int | None = None,
    seed: int | None = None,
    device: Device = None,
    dtype: DType = None,
) -> CompensationResult:
    """Direct vs total effect per head, and how later heads compensate when a head is ablated.

    direct effect of C: behaviour change when only C's direct path to the output is ablated (its
    ablated write replaces its write in the final residual stream, later layers frozen: every other
    head sees the clean C); in the behaviour's unit, whatever it reads (the logits' loss, or the final
    hidden state for `embedding_change`). total effect: C ablated everywhere (= `importance`:
    `Run.effect` of the ablation). self_repair = direct - total:
    > 0 when the rest of the model makes up for part of C's loss (McGrath et al. 2023).
    compensation[A, C] (C in a later layer than A): how much C's direct contribution rises when A is
    ablated = the behaviour change, in the A-ablated run, of putting C's clean write back in place of
    its new one in the final residual stream: (L(A-ablated, C's write clean) - L(A-ablated)). It equals
    C's direct effect with A ablated minus its clean write's direct effect, *both measured on the
    A-ablated residual stream*: one baseline. Differencing direct effects taken on the clean run and on
    the A-ablated run instead credits a head whose write did not change at all, because a loss's
    curvature differs between the two (the same logit moves a saturated clean loss less than a high
    ablated one). > 0 when C, responding to A's loss, does more of the job (C backs A up, as the
    backup name movers of Wang et al. 2022); < 0 when C does less once A is gone (C reads A: a
    consumer). frozen_effect[A, C]: A's effect with C's direct response held at its clean write
    (= total effect of A + compensation): what A's ablation would cost were C not to respond;
    recovered[A, C] = mean compensation / mean frozen_effect (ratio of means, no CI): the fraction
    of that cost C's response makes up. alignment[A, C]: cosine (over positions and d_model) between
    C's change in output when A is ablated and A's own clean-minus-ablated write: > 0 when C moves
    toward A's role; takeover[A, C]: the component of C's change along A's write, as a fraction of
    that write (<dC, wA> / |wA|^2 per prompt; 1 = C restores exactly what A wrote, as a perfect
    backup does). `heads` limits the ablated heads A (default all). The direct paths are read from
    the Run's resuming engine (cached clean residuals), not as `Run.effect`s: they are no intervention
    of the whole model. Cost: one resumed forward per A and one unembedding per (A, C): small models.
    """
    run = redundancy_run(model, prompts, "compensation", method=method, reference=reference, behaviour=behaviour,
                         batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    if not resumable(run.model):
        raise TypeError(f"compensation needs a HookedGPT-like model to read direct effects; got {type(run.model).__name__}.")
    engine = run.engine(method)
    everything = all_heads(run.model)
    total = torch.stack([e.values for e in run.effects([HeadAblation((c,), method) for c in everything])], 1)
    state = _CompensationRun(engine, everything, everything if heads is None else check_heads(run.model, heads),
                             {site.layer: site.hook("result") for site in engine.sites.values()})
    for indices, batch in distributed.shard(run.prompts, run.batch_size).batches(run.batch_size):
        state.key(indices)
        with torch.no_grad():
            effects = _clean_effects(state, engine.clean(batch))
            state.direct.append(torch.stack([effects.direct[c] for c in everything]))
            for a in state.ablated_heads:
                if state.later(a):
                    _backup_effects(state, effects, a)
    return _compensation_result(state, total, run, method=method)


def _clean_effects(run: _CompensationRun, clean: _ablation.CleanBatch) -> _CleanEffects:
    """Every head's ablated-minus-clean write and its clean direct effect (its write change alone added
    to the clean final residual stream)."""
    model = run.engine.resumable_model
    effects = _CleanEffects(clean, {}, {})
    for c in run.everything:
        z = clean.z[c[0]][:, :, c[1]]  # (batch, pos, d_head)
        change = model.head_write(c[0], c[1], run.sources_direct[c](c[0], c[1], z) - z)  # ablated - clean write
        effects.write_change[c] = change
        effects.direct[c] = effects.loss_from(run.engine, clean.resid_final + change) - clean.loss
    return effects


def _backup_effects(run: _CompensationRun, effects: _CleanEffects, a: Head) -> None:
    """With A ablated: how much every later head C's direct contribution rises (compensation), A's effect
    with C's response frozen, and how far C's write moves toward A's role (alignment, takeover); appended to `run`."""
    model, engine, clean = run.engine.resumable_model, run.engine, effects.clean
    later = run.later(a)
    capture = sorted({run.result_names[c[0]] for c in later})
    resid, captured = engine.resume(clean, [a], run.sources_a[a], capture=capture)
    loss_a = effects.loss_from(engine, resid)
    role = -effects.write_change[a]  # A's clean write minus its ablated write: what A contributes
    role_flat = role.flatten(1)
    for c in later:
        result_c = captured[run.result_names[c[0]]][:, :, c[1]]  # (batch, pos, d_model), A ablated
        result_c_clean = model.head_write(c[0], c[1], clean.z[c[0]][:, :, c[1]])
        # C's response undone on top of A's ablation: its clean write replaces its new one (one baseline)
        unresponsive = effects.loss_from(engine, resid - result_c + result_c_clean)
        run.comp.setdefault((a, c), []).append(unresponsive - loss_a)
        run.frozen.setdefault((a, c), []).append(unresponsive - clean.loss)
        moved = (result_c - result_c_clean).flatten(1)
        run.align.setdefault((a, c), []).append(F.cosine_similarity(moved, role_flat, dim=-1, eps=1e-12))
        run.takeover.setdefault((a, c), []).append((moved * role_flat).sum(-1) / role_flat.pow(2).sum(-1).clamp(min=1e-30))


_PAIR_METRICS = ("compensation", "frozen_effect", "alignment", "takeover")  # the order of `_CompensationRun.gathered`
_MATRIX_COLUMNS = ["layer_a", "head_a", "layer_b", "head_b", "label_a", "label_b", "compensation", "ci_low", "ci_high",
                   "frozen_effect", "frozen_effect_ci_low", "frozen_effect_ci_high", "takeover", "takeover_ci_low",
                   "takeover_ci_high", "alignment", "alignment_ci_low", "alignment_ci_high", "n_prompts", "recovered",
                   "behaviour", "ablation"]


def _compensation_result(state: _CompensationRun, total_t: torch.Tensor, run: Run, *, method: AblationKind) -> CompensationResult:
    """The effects and matrix frames, with CIs over `run`'s prompts, and the per-prompt values of each pair;
    `total_t`: (prompt, head) total effects."""
    direct_t, per_prompt = state.gathered()  # (prompt, head), pair -> {metric: (prompt,)}
    n, seed = len(run.prompts), run.seed
    effects = _heads_frame(state.everything, {"self_repair": direct_t - total_t, "direct_effect": direct_t,
                                              "total_effect": total_t}, n, main="self_repair", seed=seed)
    pairs = list(per_prompt)
    if pairs:
        names = ("compensation", "frozen_effect", "takeover", "alignment")
        metrics = {name: torch.stack([per_prompt[p][name] for p in pairs], 1) for name in names}  # (prompt, pair)
        matrix = _pairs_frame(pairs, metrics, n, main="compensation", seed=seed)
        matrix["recovered"] = (metrics["compensation"].mean(0) / metrics["frozen_effect"].mean(0)).numpy()
    else:
        matrix = pd.DataFrame(columns=_MATRIX_COLUMNS)
    matrix.attrs["metric"] = "compensation"
    return CompensationResult(named(effects, run, method), named(matrix, run, method), per_prompt)
