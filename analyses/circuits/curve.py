"""The circuit benchmark's numbers: faithfulness over circuit sizes, CPR and CMD (MIB, Mueller et al. 2025),
and the edge AUROC that compiled ground truth is scored by.

    curve = faithfulness_curve(run, "eap")     # or "eap-ig", "acdc", or scores {edge label: score}, a Circuit
    curve.frame()        # ranking, fraction, n_selected, n_edges, faithfulness, ci_low, ci_high, n_prompts
    curve.cpr, curve.cmd # Intervals: mean and 95% bootstrap CI over the held-out prompts
    curve.random         # the same for random rankings: mean of 5 seeded rankings, with their spread
    edge_auroc(scores, truth)

Definitions, as MIB's `evaluate_area_under_curve` computes them (its `MIB_circuit_track/evaluation.py`):

- edges are ranked by their score, descending; at each fraction p of `MIB_FRACTIONS` the top
  n = int(p x number of edges) are kept (so a model of 118 edges keeps none at p <= 0.005: an empty circuit),
  then dangling edges are pruned (`topn.prune`: from senders with no kept input, into receivers with no
  kept output, until none is left), as MIB's `apply_topn(..., prune=True)` does after its top-n selection;
- faithfulness f(C) = (B(C) - B(empty)) / (B(clean) - B(empty)), B the behaviour's mean over prompts, B(C)
  the model with every edge outside C patched from the corrupted run (`interp.paths.EdgePatch`'s resampled
  prompts, or a given corrupted set), B(empty) every edge patched; f(empty) = 0 and f(all edges) = 1;
- CPR = the trapezoid area under f over the fractions on the linear axis (0.001 to 1, so at most 0.999 for a
  curve at 1), CMD = the trapezoid area of |1 - f|; CPR ranks edges by their signed score, CMD by |score|
  (MIB's `absolute=False` and `absolute=True`). Larger CPR and smaller CMD are better;
- scores are proposed on one half of the prompts (`PromptSet.split(0.5, seed=run.seed)`, `discover`'s split)
  and the curve measured on the other half with the ranking fixed;
- the random baseline: `N_RANDOM` rankings drawn by seeded permutations, each measured as above; its curve
  and areas are their mean, with their smallest and largest value.

Our behaviours are loss-like (larger = more damage) and our scores estimate the damage of patching an edge,
so "signed" ranks the edges whose patching hurts most first, as MIB's signed ranking does with its
higher-is-better metrics. Beyond MIB: every point and both areas carry a bootstrap CI over prompts (each
resample recomputes every f from the same resampled prompts, so the areas' CIs are joint); MIB reports
none. Comparable in definition only: GPT-2 and MIB's task data are not here, so no number of this module is
to be set beside the paper's tables.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import torch
from transformer_lens.utilities.statistics import derive_generator

from interp.analyses.circuits.evaluation import Interval
from interp.analyses.circuits.topn import MIB_FRACTIONS, ranked, top_n
from interp.data import PromptSet
from interp.errors import BadInput
from interp.paths import Edge, graph, kv_readers, parse_edge
from interp.run import Run
from interp.stats import ratio_bootstrap
from interp.sweep import PatchSweep, patched_values

N_RANDOM = 5  # random rankings in the baseline
N_RESAMPLES = 1000  # bootstrap resamples of the prompts
RANKINGS = ("signed", "absolute")  # CPR's and CMD's
SCORE_METHODS = ("eap", "eap-ig", "acdc")
SCHEMA = "interp.faithfulness_curve/1"


def _trapezoid(fractions: Sequence[float], values: Sequence[float]) -> float:
    return float(sum((fractions[i + 1] - fractions[i]) * (values[i] + values[i + 1]) / 2
                     for i in range(len(fractions) - 1)))


def cpr(fractions: Sequence[float], faithfulness: Sequence[float]) -> float:
    """CPR: the trapezoid area under faithfulness over the fractions (linear axis), as MIB's `area_under`."""
    _check_curve(fractions, faithfulness)
    return _trapezoid(fractions, faithfulness)


def cmd(fractions: Sequence[float], faithfulness: Sequence[float]) -> float:
    """CMD: the trapezoid area of |1 - faithfulness| over the fractions (linear axis), as MIB's `area_from_1`."""
    _check_curve(fractions, faithfulness)
    return _trapezoid(fractions, [abs(1.0 - f) for f in faithfulness])


def _check_curve(fractions: Sequence[float], faithfulness: Sequence[float]) -> None:
    if len(fractions) != len(faithfulness) or len(fractions) < 2:
        raise BadInput(f"a curve needs two or more points, one faithfulness per fraction; got {len(fractions)} fractions "
                       f"and {len(faithfulness)} values.")
    if any(b <= a for a, b in zip(fractions, fractions[1:])) or not 0 < fractions[0] or fractions[-1] > 1:
        raise BadInput(f"fractions {list(fractions)} must increase strictly within (0, 1], e.g. MIB_FRACTIONS.")


def edge_auroc(scores: Mapping[str, float] | Any, truth: Iterable[str], *, absolute: bool = True) -> float:
    """The area under the ROC curve of ranking edges by score (|score| with `absolute`) against the true edges:
    the chance that a true edge outranks a false one, ties counting half (Mann-Whitney). `scores`: {edge label:
    score} over the edges to rank (every edge of the model, for discovery), or a Circuit / Attribution."""
    table = _score_table(scores)
    wanted = {parse_edge(edge).label for edge in truth}
    missing = sorted(wanted - set(table))
    if missing:
        raise BadInput(f"edge_auroc: true edges {missing[:3]} have no score; score every edge of the model "
                       f"({len(table)} scored).")
    positives = [label in wanted for label in table]
    if all(positives) or not any(positives):
        raise BadInput(f"edge_auroc needs true and false edges among the {len(table)} scored; {sum(positives)} are true.")
    values = pd.Series(list(table.values()), dtype=float)
    ranks = (values.abs() if absolute else values).rank(method="average")  # ties share their mean rank
    n_true = sum(positives)
    n_false = len(positives) - n_true
    rank_sum = float(ranks[pd.Series(positives)].sum())
    return (rank_sum - n_true * (n_true + 1) / 2) / (n_true * n_false)


def _score_table(scores: Any) -> dict[str, float]:
    """{edge label: score} from a mapping, a Circuit (its scores) or an Attribution (mean over prompts)."""
    if hasattr(scores, "edge_values") and hasattr(scores, "edges"):
        means = scores.edge_values.mean(1)
        return {edge.label: float(value) for edge, value in zip(scores.edges, means)}
    table = getattr(scores, "scores", scores)
    if not isinstance(table, Mapping) or not table:
        raise BadInput(f"scores must be a non-empty {{edge label: score}}, a Circuit or an Attribution; got "
                       f"{type(scores).__name__}.")
    out = {}
    for label, value in table.items():
        number = float(value)
        if not math.isfinite(number):
            raise BadInput(f"the score of {label!r} is {number}; every score must be finite.")
        out[parse_edge(label).label] = number
    return out


@dataclass(frozen=True)
class Curve:
    """One ranking's curve: per fraction the edges kept and the behaviour with the rest patched, per prompt."""

    ranking: str  # "signed", "absolute", "random-{i}"
    n_selected: tuple[int, ...]  # int(fraction x edges)
    n_edges: tuple[int, ...]  # after pruning dangling edges
    values: torch.Tensor  # (fraction, prompt) float64: B(C) per prompt
    faithfulness: tuple[Interval, ...]


@dataclass(frozen=True)
class RandomBaseline:
    """The curve and areas of `N_RANDOM` seeded random rankings: their mean, smallest and largest."""

    faithfulness: tuple[float, ...]  # mean over rankings, per fraction
    cpr: Interval  # mean, min, max over rankings (a spread, not a CI)
    cmd: Interval
    n_rankings: int


@dataclass(frozen=True)
class FaithfulnessCurve:
    """MIB's faithfulness curve of one edge ranking on held-out prompts, with CPR, CMD and a random baseline."""

    fractions: tuple[float, ...]
    curves: dict[str, Curve]  # "signed" (CPR's) and "absolute" (CMD's)
    cpr: Interval  # area under the signed ranking's curve, 95% bootstrap CI over prompts
    cmd: Interval  # area of |1 - f| under the absolute ranking's curve
    random: RandomBaseline | None
    clean: torch.Tensor  # (prompt,) B(clean)
    empty: torch.Tensor  # (prompt,) B(empty): every edge patched
    scores: dict[str, float]  # the ranking's scores, from the proposing prompts
    score_name: str  # what the scores are ("eap", "acdc", ... or "given")
    n_total_edges: int
    n_prompts: int  # the held-out prompts the curve is measured on
    n_proposing: int  # the prompts the scores came from (0: given scores)
    behaviour: str
    unit: str

    def frame(self) -> pd.DataFrame:
        """One row per ranking and fraction: ranking, fraction, n_selected, n_edges, faithfulness, ci_low, ci_high,
        n_prompts; the random baseline's mean curve as ranking "random" (its CI columns: the rankings' spread)."""
        rows = []
        for name, curve in self.curves.items():
            for i, fraction in enumerate(self.fractions):
                point = curve.faithfulness[i]
                rows.append({"ranking": name, "fraction": fraction, "n_selected": curve.n_selected[i],
                             "n_edges": curve.n_edges[i], "faithfulness": point.mean, "ci_low": point.ci_low,
                             "ci_high": point.ci_high, "n_prompts": self.n_prompts})
        if self.random is not None:
            for i, fraction in enumerate(self.fractions):
                rows.append({"ranking": "random", "fraction": fraction, "n_selected": int(fraction * self.n_total_edges),
                             "n_edges": float("nan"), "faithfulness": self.random.faithfulness[i],
                             "ci_low": float("nan"), "ci_high": float("nan"), "n_prompts": self.n_prompts})
        columns = ["ranking", "fraction", "n_selected", "n_edges", "faithfulness", "ci_low", "ci_high", "n_prompts"]
        return pd.DataFrame(rows, columns=columns)

    def areas(self) -> pd.DataFrame:
        """One row per area: metric (cpr, cmd), ranking, value, ci_low, ci_high, random, random_low, random_high."""
        rows = []
        for metric, interval, ranking in (("cpr", self.cpr, "signed"), ("cmd", self.cmd, "absolute")):
            base = getattr(self.random, metric) if self.random is not None else Interval(*(3 * [float("nan")]))
            rows.append({"metric": metric, "ranking": ranking, "value": interval.mean, "ci_low": interval.ci_low,
                         "ci_high": interval.ci_high, "random": base.mean, "random_low": base.ci_low,
                         "random_high": base.ci_high, "n_prompts": self.n_prompts})
        return pd.DataFrame(rows)

    def to_json(self) -> str:
        """Plain JSON: the fractions, each curve's points, the areas, the baseline, and what they were measured on."""
        def interval(iv: Interval) -> dict[str, float | None]:
            return {k: (None if math.isnan(v) else v) for k, v in
                    (("mean", iv.mean), ("ci_low", iv.ci_low), ("ci_high", iv.ci_high))}

        data: dict[str, Any] = {
            "schema": SCHEMA, "fractions": list(self.fractions), "score_name": self.score_name,
            "curves": {name: {"n_selected": list(c.n_selected), "n_edges": list(c.n_edges),
                              "faithfulness": [interval(p) for p in c.faithfulness]} for name, c in self.curves.items()},
            "cpr": interval(self.cpr), "cmd": interval(self.cmd),
            "random": None if self.random is None else {
                "faithfulness": list(self.random.faithfulness), "cpr": interval(self.random.cpr),
                "cmd": interval(self.random.cmd), "n_rankings": self.random.n_rankings, "spread": "min, max"},
            "clean": float(self.clean.mean()), "empty": float(self.empty.mean()), "n_total_edges": self.n_total_edges,
            "n_prompts": self.n_prompts, "n_proposing": self.n_proposing, "behaviour": self.behaviour, "unit": self.unit,
            "scores": self.scores,
        }
        return json.dumps(data, indent=1, sort_keys=True)


def _faithfulness(values: torch.Tensor, clean: torch.Tensor, empty: torch.Tensor, seed: int, label: str
                  ) -> tuple[Interval, ...]:
    """Per fraction f with its bootstrap CI: values (fraction, prompt)."""
    gap = clean - empty  # (prompt,)
    out = []
    for i, row in enumerate(values):
        mean, low, high = (float(v) + 0.0 for v in ratio_bootstrap(row - empty, gap, seed=seed, label=f"{label}-{i}"))
        out.append(Interval(mean, low, high))  # + 0.0: an empty circuit's 0 / gap prints 0, not -0
    return tuple(out)


def _area_interval(values: torch.Tensor, clean: torch.Tensor, empty: torch.Tensor, fractions: Sequence[float],
                   area: Any, seed: int, label: str) -> Interval:
    """An area and its percentile CI from resampling prompts jointly for every fraction (values (fraction, prompt))."""
    table = torch.cat([values, clean[None], empty[None]]).T  # (prompt, fraction + 2)
    n = table.shape[0]
    point = _curve_from_means(table.mean(0)).tolist()
    generator = derive_generator(seed, label)
    idx = torch.randint(0, n, (N_RESAMPLES, n), generator=generator)  # (resample, prompt)
    means = table[idx].mean(1)  # (resample, fraction + 2)
    curves = _curve_from_means(means.T).T  # (resample, fraction)
    draws = torch.tensor([area(fractions, row.tolist()) if torch.isfinite(row).all() else float("nan")
                          for row in curves], dtype=torch.float64)
    draws = draws[~torch.isnan(draws)]
    if not len(draws):
        return Interval(area(fractions, point), float("nan"), float("nan"))
    low, high = torch.quantile(draws, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return Interval(area(fractions, point), low, high)


def _curve_from_means(means: torch.Tensor) -> torch.Tensor:
    """f per fraction from the means (fraction + 2, ...): B(C_k)..., B(clean), B(empty)."""
    return (means[:-2] - means[-1]) / (means[-2] - means[-1])


def _proposed_scores(run: Run, method: str, source: PromptSet | None) -> dict[str, float]:
    """{edge label: score} of a method on `run`'s prompts (the proposing half)."""
    if method == "acdc":
        from interp.analyses.circuits.discovery import discover

        return dict(discover(run, method="acdc", split=False, source=source).scores)
    from interp.analyses.circuits.attribution import attribution_patching

    return _score_table(attribution_patching(run, source=source, method="eap-ig" if method == "eap-ig" else "eap"))


def _halves(run: Run, split: bool, source: PromptSet | None
            ) -> tuple[Run, Run, PromptSet | None, PromptSet | None]:
    """(proposing run, measuring run, their corrupted sources): discover's seeded split, a source split row for row."""
    if not split:
        return run, run, source, source
    if len(run.prompts) < 4:
        raise BadInput(f"faithfulness_curve splits the prompts in two halves of 2 or more; got {len(run.prompts)} prompts. "
                       "Give at least 4, or split=False with scores from other prompts.")
    propose, test = run.prompts.split(0.5, seed=run.seed)
    if source is None:
        return run.on(propose), run.on(test), None, None
    if source.tokens.shape != run.prompts.tokens.shape:
        raise BadInput(f"faithfulness_curve: source has shape {tuple(source.tokens.shape)}; expected the prompts' "
                       f"{tuple(run.prompts.tokens.shape)} (one corrupted prompt per prompt, row for row).")
    propose_source, test_source = source.split(0.5, seed=run.seed)
    return run.on(propose), run.on(test), propose_source, test_source


def _measure(sweep: PatchSweep, every: list[Edge], rankings: dict[str, list[Edge]], fractions: Sequence[float]
             ) -> dict[str, tuple[list[int], list[int], torch.Tensor]]:
    """Per ranking: n selected, n kept after pruning, and B(C) per fraction and prompt; each distinct circuit
    patched once (every edge outside it), the empty circuit taken as every edge patched."""
    readers = kv_readers(sweep.run.model)
    plans = {name: top_n(order, fractions, readers) for name, order in rankings.items()}
    distinct = sorted({kept for _, sets in plans.values() for kept in sets}, key=len)
    values = patched_values(sweep.run, [[e for e in every if e not in kept] for kept in distinct], sweep.source)
    row = {kept: i for i, kept in enumerate(distinct)}
    return {name: (selected, [len(k) for k in sets], values[[row[k] for k in sets]])
            for name, (selected, sets) in plans.items()}


def faithfulness_curve(run: Run, scores: str | Mapping[str, float] | Any, fractions: Sequence[float] = MIB_FRACTIONS,
                       *, split: bool = True, n_random: int = N_RANDOM, source: PromptSet | None = None
                       ) -> FaithfulnessCurve:
    """MIB's faithfulness curve, CPR and CMD (see the module) of an edge ranking, with bootstrap CIs.

    `scores`: a method whose scores are proposed on one half of the prompts ("eap", "eap-ig", "acdc"), or
    scores already made ({edge label: score}, a Circuit, an Attribution), taken as proposed on the first half
    of the same split (`discover(run, ...)`'s). The curve is measured on the other half (`split=False`: on all
    of `run`'s prompts, for scores from prompts the caller holds out). `n_random`: random rankings (0: none).
    `source`: a corrupted set, row for row (default: resampled prompts)."""
    if not isinstance(run, Run):
        raise BadInput(f"faithfulness_curve takes an interp.Run, got {type(run).__name__}; build one with "
                       "interp.Run(model, prompts).")
    fractions = tuple(float(f) for f in fractions)
    _check_curve(fractions, fractions)
    if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 0:
        raise BadInput(f"faithfulness_curve: n_random={n_random!r} must be a whole number >= 0.")
    if isinstance(scores, str) and scores not in SCORE_METHODS:
        raise BadInput(f"faithfulness_curve: scores={scores!r}; expected one of {list(SCORE_METHODS)} or "
                       "{edge label: score}.")
    propose_run, test_run, propose_source, test_source = _halves(run, split, source)
    table = _proposed_scores(propose_run, scores, propose_source) if isinstance(scores, str) else _score_table(scores)
    every = graph(run.model)
    missing = [e.label for e in every if e.label not in table]
    if missing:
        raise BadInput(f"faithfulness_curve needs a score for every edge of the model; {len(missing)} of {len(every)} "
                       f"have none (e.g. {missing[:3]}).")
    sweep = test_run.sweep(test_source)
    clean, empty = sweep.clean(), patched_values(test_run, [every], test_source)[0]
    rankings = {"signed": ranked(table, every, False), "absolute": ranked(table, every, True)}
    for i in range(n_random):
        order = torch.randperm(len(every), generator=derive_generator(test_run.seed, f"curve-random-{i}"))
        rankings[f"random-{i}"] = [every[j] for j in order.tolist()]
    measured = _measure(sweep, every, rankings, fractions)
    seed = test_run.seed
    curves = {name: Curve(name, tuple(selected), tuple(kept), values,
                          _faithfulness(values, clean, empty, seed, f"curve-{name}"))
              for name, (selected, kept, values) in measured.items() if not name.startswith("random")}
    return FaithfulnessCurve(
        fractions, curves,
        _area_interval(measured["signed"][2], clean, empty, fractions, cpr, seed, "curve-cpr"),
        _area_interval(measured["absolute"][2], clean, empty, fractions, cmd, seed, "curve-cmd"),
        _random_baseline([measured[f"random-{i}"][2] for i in range(n_random)], clean, empty, fractions),
        clean, empty, table, scores if isinstance(scores, str) else "given", len(every), len(clean),
        0 if propose_run is test_run or not isinstance(scores, str) else len(propose_run.prompts),
        test_run.behaviour.describe(test_run.prompts), test_run.behaviour.unit)


def _random_baseline(curves: list[torch.Tensor], clean: torch.Tensor, empty: torch.Tensor,
                     fractions: Sequence[float]) -> RandomBaseline | None:
    """Mean curve and areas of the random rankings, with the areas' smallest and largest (values (fraction, prompt))."""
    if not curves:
        return None
    faithfulness = [_curve_from_means(torch.cat([v.mean(1), clean.mean()[None], empty.mean()[None]])).tolist()
                    for v in curves]
    areas = {name: [area(fractions, f) for f in faithfulness] for name, area in (("cpr", cpr), ("cmd", cmd))}
    mean_curve = tuple(sum(column) / len(column) for column in zip(*faithfulness))
    spread = {name: Interval(sum(v) / len(v), min(v), max(v)) for name, v in areas.items()}
    return RandomBaseline(mean_curve, spread["cpr"], spread["cmd"], len(curves))


__all__ = ["Curve", "FaithfulnessCurve", "MIB_FRACTIONS", "N_RANDOM", "RandomBaseline", "cmd", "cpr", "edge_auroc",
           "faithfulness_curve"]
