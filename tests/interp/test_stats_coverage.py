"""Coverage of the 95% intervals and null calibration of the p-values at small n, on real skewed metrics.

Null model: each population is one head's per-prompt attention metric on real prompts
(tests/data/coverage_population.csv, built by tests/data/make_coverage_population.py from MiniLM's
[CLS] sinks and previous-token heads and toy-induction's induction and previous-token heads). A
simulated experiment draws n prompts from it with replacement; the truth is the population mean.
Every replication is a trailing column, so one call of `interp.stats.bootstrap` runs them all.

With 2000 replications the Monte-Carlo standard error of a coverage near 0.95 is
sqrt(0.95 * 0.05 / 2000) = 0.49%, of a rejection rate near 0.05 also 0.49%.

MiniLM's L0H2 previous-token weight (0.9998, skew -7.5, kurtosis 68: a few prompts far below the
rest) is reported but not held to +-2%: no bootstrap of 32 values covers a mean that a 1-in-50
outlier moves (studentized 0.85, percentile 0.77); its claims stand on the threshold, far below it.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp.stats import bootstrap, sign_flip_test, studentized_pvalue

DATA = Path(__file__).resolve().parents[1] / "data" / "coverage_population.csv"
HEAVY_TAILED = {"minilm_L0H2_prev_token"}  # reported, not held to +-2% (see the module docstring)
# the claims' p-value at n=32 still rejects a true null a little too often here (0.064; the sign-flip test
# alone 0.088): an open limit, held to this bound so that it cannot get worse unnoticed
KNOWN_LENIENT = {"toy_induction_L1H0_induction": 0.07}
REPLICATIONS = 2000
ALPHA = 0.05


def populations() -> dict[str, torch.Tensor]:
    frame = pd.read_csv(DATA)
    return {name: torch.tensor(frame[name].dropna().to_numpy(), dtype=torch.float64) for name in frame.columns}


def experiments(population: torch.Tensor, n: int, replications: int = REPLICATIONS, seed: int = 0) -> torch.Tensor:
    """`replications` samples of n prompts drawn with replacement: (prompt, replication)."""
    generator = torch.Generator().manual_seed(seed)
    return population[torch.randint(0, len(population), (n, replications), generator=generator)]


def coverage(population: torch.Tensor, n: int, method: str, replications: int = REPLICATIONS) -> float:
    """Share of simulated 95% intervals that contain the population mean."""
    _, low, high = bootstrap(experiments(population, n, replications), method=method, seed=1)
    truth = population.mean()
    return ((low <= truth) & (truth <= high)).double().mean().item()


def rejection(population: torch.Tensor, n: int, test: str, replications: int = REPLICATIONS) -> float:
    """Share of one-sided tests of "mean > truth" rejected at ALPHA: the null holds, so this should be <= ALPHA.

    test: "sign-flip" alone, or "claims" (the larger of the sign-flip and studentized p-values, as
    `interp.claims`'s evidence helpers combine them)."""
    margin = experiments(population, n, replications) - population.mean()  # (prompt, replication)
    p = sign_flip_test(margin, alternative="greater", n_permutations=2000, seed=2)
    if test == "claims":
        p = torch.maximum(p, studentized_pvalue(margin, n_resamples=2000, seed=3))
    return (p <= ALPHA).double().mean().item()


def mc_error(rate: float, replications: int = REPLICATIONS) -> float:
    return math.sqrt(rate * (1 - rate) / replications)


def test_monte_carlo_error_is_small_enough():
    assert mc_error(0.95) <= 0.005 and mc_error(ALPHA) <= 0.005


def test_population_data_is_real_and_skewed():
    pops = populations()
    assert len(pops) >= 5 and all(len(p) >= 200 for p in pops.values())
    skews = {name: float(pd.Series(p.numpy()).skew()) for name, p in pops.items()}
    assert sum(abs(s) > 1 for s in skews.values()) >= 3, skews  # the point: skewed metrics


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["minilm_L1H1_first_token", "toy_induction_L1H0_induction"])
def test_studentized_coverage_at_32_prompts(name):
    """Fast subset: the two most skewed populations held to +-2% (the full sweep is slow)."""
    pop = populations()[name]
    value = coverage(pop, 32, "studentized")
    assert abs(value - 0.95) <= 0.02, f"{name}: studentized 95% interval covers {value:.3f} at n=32"


@pytest.mark.heavy
def test_claims_p_value_is_not_lenient_at_32_prompts():
    """The claims' p-value (sign-flip and studentized, the larger) rejects a true null at most alpha + MC error,
    where the sign-flip test alone rejects 0.087 (a skewed previous-token head)."""
    pop = populations()["minilm_L2H9_prev_token"]
    rate = rejection(pop, 32, "claims")
    assert rate <= ALPHA + 2 * mc_error(ALPHA), rate


@pytest.mark.slow
def test_coverage_sweep():
    """Coverage of the percentile, BCa and studentized 95% intervals at n = 8, 16, 32 on every population,
    and the null rejection rate of the sign-flip test alone and of the claims' p-value at n = 32."""
    rows = []
    for name, pop in populations().items():
        for n in (8, 16, 32):
            row = {"population": name, "n": n, **{m: coverage(pop, n, m) for m in ("percentile", "bca", "studentized")}}
            if n == 32:
                row.update({"reject sign-flip": rejection(pop, n, "sign-flip"), "reject claims": rejection(pop, n, "claims")})
            rows.append(row)
    table = pd.DataFrame(rows)
    print("\n" + table.round(3).to_string(index=False))
    at32 = table[(table["n"] == 32) & ~table["population"].isin(HEAVY_TAILED)]
    assert ((at32["studentized"] - 0.95).abs() <= 0.02).all(), at32
    bound = at32["population"].map(lambda name: KNOWN_LENIENT.get(name, ALPHA + 2 * mc_error(ALPHA)))
    assert (at32["reject claims"] <= bound).all(), at32
    assert (at32["reject claims"] <= at32["reject sign-flip"]).all()
    # the studentized interval is never much worse than the percentile one, and better where it matters
    assert (table["studentized"] >= table["percentile"] - 3 * mc_error(0.95)).all()
    heavy = table[table["population"].isin(HEAVY_TAILED)]
    assert (heavy["studentized"] > heavy["percentile"]).all()
