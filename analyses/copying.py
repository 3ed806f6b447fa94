"""In-context copying: how much cheaper a repeated span is the second time, and which heads carry that.

On prompts built as text, span, the same span again (`interp.data.Repeats(period=span, offset=...,
n_repeats=2)`), the *copy gap* of a prompt is the mean next-token loss on the first copy's predictable
tokens minus that on the second copy's (nats; positive when the model copies). Olsson et al. (2022)
attribute most in-context copying to induction heads; `copy_gap_ablation` tests that on a model: it
ablates a set of heads and reports the fraction of the copy gap removed,

    removed = 1 - gap(ablated) / gap(clean)      (ratio of means over prompts, BCa bootstrap CI)

next to the same figure for every other set of as many heads: the control. A claim that these heads carry
the copying must beat ablating a random set of as many other heads (`random_set_effect`, the mean over the
sets), not just zero; `control_bound`, the best single control set, is stricter, since the sets include the
heads the claimed ones depend on (an induction head's previous-token head).
"""
from __future__ import annotations

import itertools
import math

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from interp.behaviour import custom_behaviour
from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import head_label
from interp.interventions import AblationKind, HeadAblation, all_heads, check_heads
from interp.run import Run
from interp.stats import ratio_bootstrap

MAX_CONTROL_SETS = 64  # control sets measured at most (all of them when there are fewer; else a seeded sample)


def _copy_spans(prompts: PromptSet) -> tuple[int, int]:
    """(offset, span) of prompts built as text + span + span; a clear error otherwise."""
    repeats = prompts.repeats
    if repeats is None or repeats.period is None or repeats.n_repeats != 2:
        raise BadInput("copy_gap needs prompts of the form text + span + the same span, described by "
                       "Repeats(period=span, offset=len(text), n_repeats=2) (e.g. interp.experiments.stdlib_bpe.repeated_spans); "
                       f"got repeats={repeats!r}.")
    if repeats.offset + 2 * repeats.period > prompts.tokens.shape[1]:
        raise BadInput(f"the prompts have {prompts.tokens.shape[1]} positions, fewer than offset + 2 * span = "
                       f"{repeats.offset + 2 * repeats.period}.")
    return repeats.offset, repeats.period


def copy_losses(logits: torch.Tensor, prompts: PromptSet) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second): per-prompt mean loss on each copy's tokens after its first (the predictable ones)."""
    offset, span = _copy_spans(prompts)
    tokens = prompts.tokens.to(logits.device)
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none")
    per_token = per_token.view(tokens.shape[0], -1)  # (prompt, pos - 1): column i predicts token i + 1
    first = per_token[:, offset : offset + span - 1].mean(-1)
    second = per_token[:, offset + span : offset + 2 * span - 1].mean(-1)
    return first, second


def _negative_gap(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
    first, second = copy_losses(logits, prompts)
    return second - first  # loss-like: larger = less copying


COPY_GAP = custom_behaviour(_negative_gap, name="copy_gap",
                            description="second-copy minus first-copy next-token loss of a repeated span (nats)")


def copy_gap(model: nn.Module, prompts: PromptSet, *, batch_size: int = 16) -> pd.DataFrame:
    """One row: first- and second-copy loss, their ratio and the gap (nats) with a CI, `n_prompts`."""
    first, second = _losses(model, prompts, batch_size)
    gap = first - second
    ratio, low, high = ratio_bootstrap(second, first, label="copy_ratio")
    return pd.DataFrame([{"first_copy": float(first.mean()), "second_copy": float(second.mean()), "ratio": float(ratio),
                          "ratio_ci_low": float(low), "ratio_ci_high": float(high), "gap": float(gap.mean()),
                          "n_prompts": len(prompts)}])


@torch.no_grad()
def _losses(model: nn.Module, prompts: PromptSet, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    firsts, seconds = [], []
    for part in prompts.batches(batch_size):
        first, second = copy_losses(model(part.tokens), part)
        firsts.append(first.double())
        seconds.append(second.double())
    return torch.cat(firsts), torch.cat(seconds)


def copy_gap_ablation(model: nn.Module, prompts: PromptSet, heads, *, kind: AblationKind = "mean",
                      batch_size: int = 16, seed: int = 0, max_controls: int = MAX_CONTROL_SETS) -> pd.DataFrame:
    """The fraction of the copy gap removed by ablating `heads` together, and by each control set of as
    many other heads; one row per set: `heads`, `control`, `removed` with `ci_low` / `ci_high`,
    `gap_clean`, `gap_ablated` (nats), `ablation`, `n_prompts`. Rows sorted: the claimed set first."""
    heads = check_heads(model, heads)
    run = Run(model, prompts, behaviour=COPY_GAP, batch_size=batch_size, seed=seed)
    others = [h for h in all_heads(model) if h not in heads]
    controls = list(itertools.combinations(others, len(heads)))
    if len(controls) > max_controls:
        generator = torch.Generator().manual_seed(seed)
        keep = torch.randperm(len(controls), generator=generator)[:max_controls].sort().values
        controls = [controls[i] for i in keep.tolist()]
    rows = []
    for chosen, is_control in [(tuple(heads), False)] + [(c, True) for c in controls]:
        effect = run.effect(HeadAblation(chosen, kind))
        gap_clean = -effect.clean.double()  # (prompt,)
        removed, low, high = ratio_bootstrap(effect.values.double(), gap_clean, seed=seed, label="copy_gap_removed")
        rows.append({"heads": "+".join(head_label(h) for h in chosen), "control": is_control, "removed": float(removed),
                     "ci_low": float(low), "ci_high": float(high), "gap_clean": float(gap_clean.mean()),
                     "gap_ablated": float((-effect.intervened.double()).mean()), "ablation": effect.ablation,
                     "n_prompts": effect.n_prompts})
    return pd.DataFrame(rows)


def control_bound(frame: pd.DataFrame) -> float:
    """The largest fraction removed by any control set (a stricter bar than a random set: it includes the heads
    the claimed ones read from, such as their previous-token head)."""
    controls = frame[frame["control"]]
    return float(controls["removed"].max()) if len(controls) else math.nan


def random_set_effect(frame: pd.DataFrame) -> float:
    """The fraction a random set of as many other heads removes, on average over the control sets (all of them
    when they were enumerated, else a seeded sample): the bar the claimed set's CI lower bound must clear."""
    controls = frame[frame["control"]]
    return float(controls["removed"].mean()) if len(controls) else math.nan
