"""Which heads matter alone: single-head ablation with its head-mask gradient estimate (Michel et al.
2019), the second-order estimate of pair interactions, and the pruning curve."""
from __future__ import annotations

from typing import Literal, Sequence, get_args

import einops
import numpy as np
import pandas as pd
import torch
from torch import nn
from transformer_lens.utilities.statistics import derive_generator

import interp.ablation as _ablation
import interp.distributed as distributed
from interp.analyses.redundancy.common import (
    DEFAULT_MARGIN,
    _all_pairs,
    _check_n,
    _ci,
    _heads_frame,
    _pair_columns,
    named,
    redundancy_run,
)
from interp.behaviour import BehaviourLike, clean_summaries, final_output
from interp.data import PromptSet
from interp.heads import Head, HeadLike, head_label
from interp.hooks import hooked
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
from interp.stats import TooFewPrompts, sign_flip_test, spearman

OrderBy = Literal["gradient", "ablation"]


def _param_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's weights: a head mask in it keeps every matmul in one dtype."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def gradient_importance(
    model: nn.Module | Run,
    prompts: PromptSet | None = None,
    method: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int | None = None,
    seed: int | None = None,
    device: Device = None,
    dtype: DType = None,
) -> torch.Tensor:
    """Head-mask gradient (Michel et al. 2019), per prompt: (prompt, layer, head).

    Each head's z is written z' = base + m (z - base), base being its ablated value (0 for
    zero ablation, as Michel et al.); at m = 1 the model is unchanged and -dL/dm is the
    first-order estimate of the loss change when m goes to 0 (the head is ablated).
    Returns that signed estimate; Michel et al.'s importance is its absolute value. For a
    behaviour measured as a distance from the clean run (`embedding_change`) the clean run is its
    minimum, so the gradient is zero there: rank by ablation instead. `model`: a Run, or a model with
    its prompts and the Run's options.
    """
    run = redundancy_run(model, prompts, "gradient_importance", method=method, reference=reference, behaviour=behaviour,
                         batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    engine = run.engine(method)
    sites = list(engine.sites.values())
    n_heads = max(site.n_heads for site in sites)
    values = engine.values()
    out = []
    for indices, batch in distributed.shard(run.prompts, run.batch_size).batches(run.batch_size):
        values.prompt_index = indices  # resampling keyed by global prompt index
        out.append(_batch_gradient(engine, batch, values, len(sites), n_heads))
    local = torch.cat(out) if out else torch.zeros(0, len(sites), n_heads, dtype=torch.float64)
    return distributed.gather_prompts(local)


def _batch_gradient(engine: _ablation.AblationEngine, batch: PromptSet, values: AblationValues, n_layers: int,
                    n_heads: int) -> torch.Tensor:
    """-dL/dm (batch, layer, head) of one batch, m the head mask of `gradient_importance`."""
    model, sites = engine.model, list(engine.sites.values())
    mask = torch.ones(len(batch), n_layers, n_heads, device=engine.device, dtype=_param_dtype(model), requires_grad=True)

    def make_hook(layer: int, heads: int):
        def hook(z: torch.Tensor, hook=None) -> torch.Tensor:  # (batch, pos, head, d_head)
            with torch.no_grad():
                base = torch.stack([values(layer, h, z[:, :, h].detach()) for h in range(heads)], dim=2)
            scale = einops.rearrange(mask[:, layer, :heads], "batch head -> batch 1 head 1")
            return base + scale * (z - base)
        return hook

    hooks = [(site.hook("z"), make_hook(site.layer, site.n_heads)) for site in sites]
    summary = clean_summaries(model, batch, engine.behaviour, batch_size=len(batch))
    with torch.enable_grad(), hooked(model, hooks):
        output = final_output(model, engine.behaviour.model_prompts(batch), engine.behaviour.reads)
        loss = engine.value(output, batch, summary, "head-mask gradient")
        (grad,) = torch.autograd.grad(loss.sum(), mask)
    return -grad.detach().double().cpu()


def importance(
    model: nn.Module | Run,
    prompts: PromptSet | None = None,
    method: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    behaviour: BehaviourLike = None,
    gradient: bool = True,
    batch_size: int | None = None,
    seed: int | None = None,
    fast: bool = True,
    device: Device = None,
    dtype: DType = None,
    heads: Sequence[HeadLike] | None = None,
) -> pd.DataFrame:
    """Loss change when each head alone is ablated, and its gradient estimate, one row per head (of `heads`, when
    given: only those are ablated, which on a large model is the cost; default every head).

    Columns: `delta_loss` (ablated - clean behaviour value, e.g. nats; > 0 = the head helps), `ci_low`, `ci_high`,
    `p_value` (sign-flip test that the head helps), `clean_loss`; with `gradient=True` also
    `grad_estimate` (first-order estimate of delta_loss) and `grad_abs` (Michel et al.'s
    importance, |dL/dm|), each with CIs. `frame.attrs["spearman"]`: rank correlation over heads
    between `grad_estimate` and `delta_loss` (and `spearman_abs`: `grad_abs` vs |delta_loss|).
    Limits: a first-order estimate misses interactions (it is exact only for linear effects),
    which is what joint_ablation measures. `behaviour`: what the loss is (`interp.behaviour`; default the
    model's own, as `interp.Run`: for a causal LM the next-token loss at the repeated positions when the prompts
    have a repeat structure, else on every real position); the `behaviour` column says which, in words, and `ablation` the
    ablation kind (`frame.attrs` too). `model`: an
    `interp.Run` (its prompts and settings), or a model with its prompts and the Run's options
    (batch_size 16, seed 0 when left None); every ablation is a `Run.effect`.
    """
    run = redundancy_run(model, prompts, "importance", method=method, fast=fast, reference=reference, behaviour=behaviour,
                         batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    heads = all_heads(run.model) if heads is None else check_heads(run.model, heads)
    effects = run.effects([HeadAblation((h,), method) for h in heads])
    clean = effects[0].clean if effects else run.clean()
    delta = torch.stack([e.values for e in effects], dim=1)  # (prompt, head)
    metrics = {"delta_loss": delta}
    if gradient:
        estimate = gradient_importance(run, method=method)
        estimate = torch.stack([estimate[:, l, h] for l, h in heads], dim=1)  # (prompt, head)
        metrics.update(grad_estimate=estimate, grad_abs=estimate.abs())
    frame = _heads_frame(heads, metrics, len(run.prompts), main="delta_loss", seed=run.seed)
    frame.insert(frame.columns.get_loc("ci_high") + 1, "p_value",
                 sign_flip_test(delta, alternative="greater", seed=run.seed, label="importance").numpy())
    frame.insert(frame.columns.get_loc("p_value") + 1, "clean_loss", float(clean.mean()))
    named(frame, run, method).attrs["loss"] = run.behaviour.name
    if gradient:
        frame.attrs["spearman"] = spearman(frame.grad_estimate, frame.delta_loss)
        frame.attrs["spearman_abs"] = spearman(frame.grad_abs, frame.delta_loss.abs())
    return frame


def _batch_hessian(engine: _ablation.AblationEngine, batch: PromptSet, heads: Sequence[Head],
                   values: AblationValues) -> torch.Tensor:
    """d2L / dm_a dm_b (head, head) of one batch's summed loss, L being the behaviour's value with every
    head's z written base + m (z - base) (the head mask of `gradient_importance`)."""
    model = engine.model
    sites = list(engine.sites.values())
    index = {h: i for i, h in enumerate(heads)}
    mask = torch.ones(len(heads), device=engine.device, dtype=_param_dtype(model), requires_grad=True)

    def make_hook(site):
        def hook(z: torch.Tensor, hook=None) -> torch.Tensor:  # (batch, pos, head, d_head)
            with torch.no_grad():
                base = torch.stack([values(site.layer, h, z[:, :, h].detach()) for h in range(site.n_heads)], dim=2)
            scale = torch.stack([mask[index[Head(site.layer, h)]] for h in range(site.n_heads)])
            return base + einops.rearrange(scale, "head -> 1 1 head 1") * (z - base)
        return hook

    # the explicit attention path (a no-op pattern hook) keeps every op twice differentiable
    summary = clean_summaries(model, batch, engine.behaviour, batch_size=len(batch))
    hooks = [(site.hook("z"), make_hook(site)) for site in sites] + [(site.hook("pattern"), lambda p, hook: None) for site in sites]
    hessian = torch.zeros(len(heads), len(heads), dtype=torch.float64)
    with torch.enable_grad(), hooked(model, hooks):
        output = final_output(model, engine.behaviour.model_prompts(batch), engine.behaviour.reads)
        loss = engine.value(output, batch, summary, "second-order estimate").sum()
        (grad,) = torch.autograd.grad(loss, mask, create_graph=True)
        for i in range(len(heads)):
            (row,) = torch.autograd.grad(grad[i], mask, retain_graph=True)
            hessian[i] = row.detach().double().cpu()
    return hessian


def second_order(
    model: nn.Module | Run,
    prompts: PromptSet | None = None,
    method: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int | None = None,
    seed: int | None = None,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Second-order head-mask estimate of every pair's interaction: d2L / dm_a dm_b (mean over prompts).

    With the head mask m of `gradient_importance`, a Taylor expansion gives
    delta_both - delta_a - delta_b ~ d2L/dm_a dm_b: positive = redundant (together worse than
    apart). One row per pair, column `interaction_estimate`; no CI (computed on the mean loss).
    One extra backward per head: meant for small models. A gradient, not an ablation: it reads the
    Run's model, prompts and ablation values, not `Run.effect`.
    """
    run = redundancy_run(model, prompts, "second_order", method=method, reference=reference, behaviour=behaviour,
                         batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    engine = run.engine(method)
    heads = all_heads(run.model)
    index = {h: i for i, h in enumerate(heads)}
    hessian = torch.zeros(len(heads), len(heads), dtype=torch.float64)  # (head, head), summed over prompts
    values = engine.values()
    for indices, batch in distributed.shard(run.prompts, run.batch_size).batches(run.batch_size):
        values.prompt_index = indices  # resampling keyed by global prompt index
        hessian += _batch_hessian(engine, batch, heads, values)
    distributed.all_reduce_sum([hessian])  # every rank holds the sum over all prompts
    hessian /= len(run.prompts)
    pairs = _all_pairs(heads)
    frame = pd.DataFrame({**_pair_columns(pairs),
                          "interaction_estimate": [float(hessian[index[a], index[b]]) for a, b in pairs],
                          "n_prompts": len(run.prompts)})
    frame.attrs.update(metric="interaction_estimate", diagonal=np.nan)
    return named(frame, run, method)


def pruning_curve(
    model: nn.Module | Run,
    prompts: PromptSet | None = None,
    method: AblationKind = "mean",
    *,
    order_by: OrderBy = "ablation",
    margin: float = DEFAULT_MARGIN,
    n_random: int = 3,
    reference: PromptSet | ReferenceActivations | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int | None = None,
    seed: int | None = None,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Loss as heads are removed one by one, least important first vs in random orders, held out.

    The prompts are split in two (`PromptSet.split(0.5, seed)`): the heads are ordered on one half
    (`n_rank_prompts` of them) and the curve is scored on the other (`n_prompts`), so the order never
    sees the prompts that judge it (ranking and scoring on the same prompts would favour the ranking).
    `order_by`: "ablation" (true single-head loss changes, the default) or "gradient" (the
    head-mask estimate: cheaper, but near zero for a trained model at convergence, where it can
    misrank heads badly; see `importance(...).attrs["spearman"]`). Rows: `order` ("importance" / "random"),
    `n_removed` (0..n_heads), `removed` (the head removed at that step; for random orders, which differ,
    empty), `loss` with `ci_low`, `ci_high` (random: each prompt's loss averaged over `n_random` orders),
    `rise` = loss - clean loss with its CI, `n_prompts` (the scoring half), `n_rank_prompts` (the ranking
    half), `behaviour`, `ablation`. `frame.attrs["n_removable"]` = {order: the largest number of heads
    removed with the rise's upper CI still below `margin`}; `attrs["rank_prompts"]` / `["score_prompts"]`:
    the two halves' indices into `prompts`. Every ablation is a `Run.effect`.
    """
    if order_by not in get_args(OrderBy):
        raise ValueError(f"order_by={order_by!r}; expected one of {list(get_args(OrderBy))}.")
    if n_random < 1:
        raise ValueError(f"n_random={n_random} must be at least 1.")
    run = redundancy_run(model, prompts, "pruning_curve", method=method, reference=reference, behaviour=behaviour,
                         batch_size=batch_size, seed=seed, device=device, dtype=dtype)
    rank_index, score_index = held_out_halves(len(run.prompts), run.seed)
    ranking, scoring = run.on(run.prompts[rank_index]), run.on(run.prompts[score_index])
    _check_n(ranking.prompts)
    _check_n(scoring.prompts)
    heads = all_heads(run.model)
    order = _pruning_order(ranking, heads, method, order_by)
    generator = derive_generator(run.seed, "pruning-random-order")
    random_orders = [[heads[i] for i in torch.randperm(len(heads), generator=generator).tolist()] for _ in range(n_random)]
    sets = [order[:k] for k in range(1, len(heads) + 1)]
    sets += [o[:k] for o in random_orders for k in range(1, len(heads) + 1)]
    removed = scoring.effects([HeadAblation(tuple(heads_set), method) for heads_set in sets])
    clean = removed[0].clean
    ablated = torch.stack([e.intervened for e in removed])  # (set, prompt)
    n = len(heads)
    by_order = {
        "importance": torch.cat([clean[None], ablated[:n]]),  # (n_removed, prompt)
        "random": torch.cat([clean[None], ablated[n:].view(n_random, n, -1).mean(0)]),
    }
    frame, n_removable = _pruning_frame(by_order, clean, order, margin=margin, seed=run.seed)
    frame["n_rank_prompts"] = len(rank_index)
    frame.attrs.update(n_removable=n_removable, margin=margin, order_by=order_by,
                       importance_order=[head_label(h) for h in order], n_rank_prompts=len(rank_index),
                       rank_prompts=rank_index.tolist(), score_prompts=score_index.tolist())
    return named(frame, scoring, method)


def held_out_halves(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the two disjoint halves `PromptSet.split(0.5, seed)` draws from n prompts: (rank, score).
    (The split of a set whose i-th prompt is the token i: the very draw `split` makes.)"""
    if n < 2:
        raise TooFewPrompts(f"pruning_curve ranks on one half of the prompts and scores on the other; got {n}, pass more.")
    rank, score = PromptSet(torch.arange(n)[:, None]).split(0.5, seed=seed)
    return rank.tokens[:, 0], score.tokens[:, 0]


def _pruning_order(run: Run, heads: Sequence[Head], method: AblationKind, order_by: OrderBy) -> list[Head]:
    """`heads`, least important first on `run`'s prompts: by single-head ablation or the head-mask estimate."""
    if order_by == "gradient":
        estimate = gradient_importance(run, method=method).mean(0)
        scores = [float(estimate[l, h]) for l, h in heads]
    else:
        scores = [e.mean for e in run.effects([HeadAblation((h,), method) for h in heads])]
    return [heads[i] for i in np.argsort(scores, kind="stable")]


def _pruning_frame(by_order: dict[str, torch.Tensor], clean: torch.Tensor, order: list[Head], *, margin: float,
                   seed: int) -> tuple[pd.DataFrame, dict[str, int]]:
    """`pruning_curve`'s rows from each order's (n_removed, prompt) losses, and how many heads each order
    removes with the rise's upper CI still below `margin`."""
    rows, n_removable, n = [], {}, len(order)
    for name, losses in by_order.items():
        loss_mean, loss_low, loss_high = _ci(losses.T, seed=seed, label=f"pruning/{name}")
        rise = (losses - clean).T
        rise_mean, rise_low, rise_high = _ci(rise, seed=seed, label=f"pruning-rise/{name}")
        ok = rise_high < margin
        n_removable[name] = int(np.argmin(ok)) - 1 if not ok.all() else n
        for k in range(n + 1):
            removed = head_label(order[k - 1]) if (name == "importance" and k) else ""
            rows.append({"order": name, "n_removed": k, "removed": removed, "loss": loss_mean[k], "ci_low": loss_low[k],
                         "ci_high": loss_high[k], "rise": rise_mean[k], "rise_ci_low": rise_low[k],
                         "rise_ci_high": rise_high[k], "n_prompts": losses.shape[1]})
    return pd.DataFrame(rows), n_removable
