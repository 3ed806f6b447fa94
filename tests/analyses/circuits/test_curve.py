"""MIB's faithfulness curve, CPR, CMD and edge AUROC (`interp.analyses.circuits.curve`): the areas by hand, the
AUROC against scipy's Mann-Whitney U, and curves with known answers on the hand-set induction circuit."""
from __future__ import annotations

import json
import math

import pytest
from factories import INDUCTION_EDGES

import interp
from interp.analyses.circuits import MIB_FRACTIONS, cmd, cpr, edge_auroc, faithfulness_curve
from interp.data import repeated_tokens
from interp.errors import BadInput
from interp.paths import graph


@pytest.fixture(scope="module")
def run(induction):
    return interp.Run(induction, repeated_tokens(32, 10, 63, bos=63))


@pytest.fixture(scope="module")
def planted(induction):
    """The true edges first (in graph order), every other edge after them: a perfect ranking."""
    every = graph(induction)
    return {edge.label: (1.0 + i / 100 if edge.label in INDUCTION_EDGES else -i / 1000) for i, edge in enumerate(every)}


@pytest.fixture(scope="module")
def perfect(run, planted):
    return faithfulness_curve(run, planted)


def test_areas_by_hand():
    assert MIB_FRACTIONS == (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    assert cpr(MIB_FRACTIONS, [1.0] * 10) == pytest.approx(0.999) and cmd(MIB_FRACTIONS, [1.0] * 10) == 0.0
    assert cpr(MIB_FRACTIONS, [0.0] * 10) == 0.0 and cmd(MIB_FRACTIONS, [0.0] * 10) == pytest.approx(0.999)
    # one step: f = 0 up to 0.1, 1 from 0.2: the trapezoid between them is half the 0.1-wide interval
    step = [0.0] * 7 + [1.0] * 3
    assert cpr(MIB_FRACTIONS, step) == pytest.approx(0.05 + 0.3 + 0.5)
    assert cmd(MIB_FRACTIONS, step) == pytest.approx(0.099 + 0.05)
    assert cpr((0.5, 1.0), [2.0, -1.0]) == pytest.approx(0.25)  # overshoot and negative faithfulness count as they are
    assert cmd((0.5, 1.0), [2.0, -1.0]) == pytest.approx(0.75)
    with pytest.raises(BadInput, match="increase"):
        cpr((0.5, 0.2), [0, 1])
    with pytest.raises(BadInput, match="one faithfulness per fraction"):
        cmd(MIB_FRACTIONS, [1.0])


def test_edge_auroc_is_mann_whitney():
    stats = pytest.importorskip("scipy.stats")
    scores = {"L0H0 -> L1H0 via k": 3.0, "L0H1 -> L1H0 via k": -5.0, "L0H2 -> L1H0 via k": 1.0,
              "L0H3 -> L1H0 via k": 1.0, "embed -> L1H0 via q": 0.5, "L1H0 -> logits": 2.0}
    truth = ["L0H0 -> L1H0 via k", "L0H2 -> L1H0 via k", "L1H0 -> logits"]
    for absolute in (True, False):
        values = {k: abs(v) if absolute else v for k, v in scores.items()}
        u = stats.mannwhitneyu([values[k] for k in truth], [v for k, v in values.items() if k not in truth]).statistic
        assert edge_auroc(scores, truth, absolute=absolute) == pytest.approx(u / 9)
    assert edge_auroc({"L0H0 -> L1H0 via k": 1, "L1H0 -> logits": 0}, ["L0H0->L1H0 via k"]) == 1.0  # labels parsed
    assert edge_auroc({"L0H0 -> L1H0 via k": 1, "L1H0 -> logits": 1}, ["L1H0 -> logits"]) == 0.5  # a tie counts half
    with pytest.raises(BadInput, match="no score"):
        edge_auroc(scores, ["L1H3 -> logits"])
    with pytest.raises(BadInput, match="true and false"):
        edge_auroc(scores, list(scores))
    with pytest.raises(BadInput, match="finite"):
        edge_auroc({"L1H0 -> logits": math.nan, "L0H0 -> L1H0 via k": 1}, ["L1H0 -> logits"])


def test_a_perfect_ranking_reaches_one_when_the_circuit_fits(perfect, induction):
    frame = perfect.frame().set_index(["ranking", "fraction"])
    n_edges = len(graph(induction))  # 81: no edge kept below 2%, one at 2% (pruned: alone it has no path), 4 at 5%
    assert perfect.n_total_edges == n_edges and perfect.n_prompts == 16 and perfect.n_proposing == 0
    signed = frame.loc["signed"]
    assert list(signed.n_selected) == [int(f * n_edges) for f in MIB_FRACTIONS]
    assert list(signed.faithfulness[signed.n_edges == 0]) == [0.0] * int((signed.n_edges == 0).sum())
    # at 10% the 8 kept are the 5 true edges and 3 false ones (2 of which have a path): every true edge is in
    assert signed.loc[0.1, "n_edges"] == 7 and signed.loc[0.1, "faithfulness"] == pytest.approx(1.0, abs=1e-6)
    assert 0 < signed.loc[0.05, "faithfulness"] < 1  # 4 of the 5 true edges
    assert (signed.loc[[0.1, 0.2, 0.5, 1.0], "faithfulness"] - 1).abs().max() < 1e-6
    assert signed.loc[1.0, "n_edges"] == n_edges
    assert perfect.cpr.ci_low <= perfect.cpr.mean <= perfect.cpr.ci_high
    assert perfect.cpr.mean == pytest.approx(cpr(MIB_FRACTIONS, list(signed.faithfulness)))
    assert perfect.cmd.mean == pytest.approx(cmd(MIB_FRACTIONS, list(frame.loc["absolute"].faithfulness)))
    assert perfect.cpr.mean > 0.95 and perfect.cmd.mean < 0.05


def test_the_random_baseline_is_far_below_and_seeded(perfect, run, planted):
    base = perfect.random
    assert base is not None and base.n_rankings == 5
    assert base.cpr.ci_low <= base.cpr.mean <= base.cpr.ci_high < perfect.cpr.ci_low
    assert base.cmd.mean > perfect.cmd.ci_high and base.faithfulness[-1] == pytest.approx(1.0)
    again = faithfulness_curve(run, planted, n_random=2)
    assert again.random is not None and again.random.n_rankings == 2
    assert again.random.faithfulness[:7] == pytest.approx(base.faithfulness[:7], abs=0.2)
    assert faithfulness_curve(run, planted, n_random=0).random is None


def test_the_worst_ranking_scores_below_random(run, planted, perfect):
    reversed_scores = {label: -score for label, score in planted.items()}
    worst = faithfulness_curve(run, reversed_scores, n_random=0)
    assert worst.cpr.mean < perfect.random.cpr.mean
    # |score| ranks the true edges first again, so CMD is as good as the perfect ranking's
    assert worst.cmd.mean == pytest.approx(perfect.cmd.mean, abs=1e-9)


@pytest.mark.heavy
def test_scores_from_a_method_come_from_the_other_half(run):
    curve = faithfulness_curve(run, "acdc", n_random=0)
    assert curve.score_name == "acdc" and curve.n_proposing == 16 and curve.n_prompts == 16
    assert curve.cpr.mean > 0.9  # ACDC recovers the hand-set circuit exactly: its scores rank it first
    assert edge_auroc(curve.scores, INDUCTION_EDGES) == 1.0
    whole = faithfulness_curve(run, curve.scores, split=False, n_random=0)
    assert whole.n_prompts == 32


def test_json_and_frames(perfect):
    data = json.loads(perfect.to_json())
    assert data["schema"] == "interp.faithfulness_curve/1" and data["fractions"] == list(MIB_FRACTIONS)
    assert data["cpr"]["mean"] == pytest.approx(perfect.cpr.mean) and len(data["curves"]["signed"]["faithfulness"]) == 10
    assert data["random"]["n_rankings"] == 5 and data["n_prompts"] == 16
    areas = perfect.areas().set_index("metric")
    assert areas.loc["cpr", "value"] == perfect.cpr.mean and areas.loc["cmd", "ranking"] == "absolute"
    assert set(perfect.frame().ranking) == {"signed", "absolute", "random"}


def test_bad_input(run, planted, induction):
    with pytest.raises(BadInput, match="interp.Run"):
        faithfulness_curve(induction, planted)
    with pytest.raises(BadInput, match="scores='nope'"):
        faithfulness_curve(run, "nope")
    with pytest.raises(BadInput, match="every edge"):
        faithfulness_curve(run, {"L1H0 -> logits": 1.0})
    with pytest.raises(BadInput, match="n_random"):
        faithfulness_curve(run, planted, n_random=-1)
    with pytest.raises(BadInput, match="increase"):
        faithfulness_curve(run, planted, fractions=(0.5, 0.1))
    with pytest.raises(BadInput, match="at least 4"):
        faithfulness_curve(run.on(run.prompts[:3]), planted)
