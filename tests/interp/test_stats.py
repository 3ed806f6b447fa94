"""interp.stats: coverage, null calibration and hand-computed answers for the lead's statistics."""
import math

import numpy as np
import pytest
import torch

from interp.stats import (
    TooFewPrompts,
    benjamini_hochberg,
    bootstrap,
    head_frame,
    permutation_test,
    sign_flip_test,
)


def test_bootstrap_mean_and_shape():
    values = torch.arange(12.0).reshape(4, 3)  # (prompt, head)
    mean, low, high = bootstrap(values, seed=0)
    torch.testing.assert_close(mean, values.double().mean(0))
    assert low.shape == high.shape == (3,) and (low <= mean).all() and (mean <= high).all()
    again = bootstrap(values, seed=0)
    assert torch.equal(again[1], low) and torch.equal(again[2], high)


@pytest.mark.parametrize("distribution", ["normal", "exponential"])
def test_bootstrap_coverage(distribution):
    """400 independent samples of 40 prompts each (vectorised on the trailing axis): a 95%
    percentile bootstrap should contain the true mean ~95% of the time (a little less for skewed data)."""
    generator = torch.Generator().manual_seed(11)
    if distribution == "normal":
        values, true_mean = torch.randn(40, 400, generator=generator) * 2 + 1, 1.0
    else:
        values, true_mean = torch.empty(40, 400).exponential_(1.0, generator=generator), 1.0
    _, low, high = bootstrap(values, n_resamples=1000, seed=0)
    coverage = ((low <= true_mean) & (true_mean <= high)).double().mean().item()
    assert 0.88 <= coverage <= 0.99, coverage
    # a 50% interval covers about half as often
    _, low50, high50 = bootstrap(values, confidence=0.5, seed=0)
    coverage50 = ((low50 <= true_mean) & (true_mean <= high50)).double().mean().item()
    assert 0.38 <= coverage50 <= 0.62, coverage50


def test_benjamini_hochberg_hand_computed():
    p = [0.01, 0.04, 0.03, 0.20, 0.005]
    # sorted: 0.005 0.01 0.03 0.04 0.20 -> * 5 / rank: 0.025 0.025 0.05 0.05 0.20 (already monotone)
    reject, adjusted = benjamini_hochberg(p, alpha=0.05)
    np.testing.assert_allclose(adjusted, [0.025, 0.05, 0.05, 0.20, 0.025])
    assert reject.tolist() == [True, True, True, False, True]
    # step-up: a later small ratio pulls earlier ones down
    _, adjusted = benjamini_hochberg([0.02, 0.03, 0.035], alpha=0.05)
    np.testing.assert_allclose(adjusted, [0.035, 0.035, 0.035])


def test_benjamini_hochberg_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    if not hasattr(stats, "false_discovery_control"):
        pytest.skip("scipy too old for false_discovery_control")
    p = np.random.default_rng(0).uniform(size=(6, 7)) ** 3
    _, adjusted = benjamini_hochberg(p)
    np.testing.assert_allclose(adjusted, stats.false_discovery_control(p.ravel()).reshape(6, 7), rtol=1e-12)


def test_benjamini_hochberg_nan_and_errors():
    reject, adjusted = benjamini_hochberg([0.01, np.nan, 0.02])
    assert np.isnan(adjusted[1]) and not reject[1]
    np.testing.assert_allclose(adjusted[[0, 2]], [0.02, 0.02])  # m counts only the valid tests
    with pytest.raises(ValueError, match="alpha=1.5"):
        benjamini_hochberg([0.1], alpha=1.5)


def _uniformity(p: torch.Tensor) -> float:
    from scipy.stats import kstest

    return kstest(p.numpy().ravel(), "uniform").pvalue


def test_permutation_test_null_is_roughly_uniform():
    pytest.importorskip("scipy")
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(15, 300, generator=generator), torch.randn(20, 300, generator=generator)
    p = permutation_test(a, b, n_permutations=400, seed=1)
    assert p.shape == (300,) and (p > 0).all() and (p <= 1).all()
    assert _uniformity(p) > 0.001
    assert 0.02 <= (p <= 0.05).double().mean().item() <= 0.09
    shifted = permutation_test(a + 1.5, b, n_permutations=400, seed=1)
    assert (shifted < 0.05).double().mean() > 0.95  # power against a clear shift
    less = permutation_test(a + 1.5, b, alternative="less", n_permutations=200, seed=1)
    assert (less > 0.5).all()


def test_sign_flip_test_null_is_roughly_uniform():
    pytest.importorskip("scipy")
    generator = torch.Generator().manual_seed(4)
    effects = torch.randn(25, 300, generator=generator)
    p = sign_flip_test(effects, n_permutations=400, seed=2)
    assert _uniformity(p) > 0.001
    assert (sign_flip_test(effects + 1.0, n_permutations=400) < 0.05).double().mean() > 0.95


@pytest.mark.parametrize("fn", [
    lambda v: bootstrap(v),
    lambda v: sign_flip_test(v),
    lambda v: permutation_test(v, torch.ones(5, 2)),
])
def test_too_few_prompts_and_nan(fn):
    with pytest.raises(TooFewPrompts, match="at least 2 prompts, got 1"):
        fn(torch.ones(1, 2))
    bad = torch.ones(5, 2)
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        fn(bad)


def test_bad_alternative():
    with pytest.raises(ValueError, match="alternative='bigger'"):
        sign_flip_test(torch.ones(4, 2), alternative="bigger")


def test_head_frame():
    generator = torch.Generator().manual_seed(0)
    per_prompt = {"a": torch.rand(10, 2, 3, generator=generator), "b": torch.rand(10, 2, 3, generator=generator)}
    frame = head_frame(per_prompt, seed=0)
    assert list(frame.columns) == ["layer", "head", "a", "a_ci_low", "a_ci_high", "b", "b_ci_low", "b_ci_high", "n_prompts"]
    assert len(frame) == 6 and (frame["n_prompts"] == 10).all()
    row = frame[(frame["layer"] == 1) & (frame["head"] == 2)].iloc[0]
    assert row["a"] == pytest.approx(per_prompt["a"][:, 1, 2].double().mean().item())
    assert row["a_ci_low"] <= row["a"] <= row["a_ci_high"]
    single = head_frame({"a": torch.rand(1, 2, 3)})
    assert single["a_ci_low"].isna().all() and (single["n_prompts"] == 1).all()
    with pytest.raises(ValueError, match="shape"):
        head_frame({"a": torch.rand(4, 2, 3), "b": torch.rand(4, 2, 2)})
    with pytest.raises(ValueError, match="at least one metric"):
        head_frame({})


def test_spearman_known_answers_and_degenerate_cases():
    from interp.stats import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))  # a constant ranking carries no order
    assert math.isnan(spearman([1, 2], [2, 1]))  # too few values
    with pytest.raises(ValueError, match="equal length"):
        spearman([1, 2, 3], [1, 2])


# --------------------------------------------------------------------------- BCa and studentized intervals


@pytest.mark.parametrize("n", [12, 40])
def test_bca_matches_scipy(n):
    """Our BCa against scipy.stats.bootstrap(method="BCa") on skewed data, to within Monte-Carlo error
    (20000 resamples each: the bounds' sampling error is ~1% of the interval's width)."""
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(n).exponential(size=n)
    _, low, high = bootstrap(torch.tensor(x), n_resamples=20000, seed=3, method="bca")
    ref = stats.bootstrap((x,), np.mean, method="BCa", n_resamples=20000, random_state=1).confidence_interval
    width = ref.high - ref.low
    assert abs(float(low) - ref.low) < 0.03 * width and abs(float(high) - ref.high) < 0.03 * width
    # and BCa moves the interval the way the skew says: right of the percentile one for right-skewed data
    _, p_low, p_high = bootstrap(torch.tensor(x), n_resamples=20000, seed=3)
    assert float(low) > float(p_low) and float(high) > float(p_high)


def test_ratio_bca_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    from interp.stats import ratio_bootstrap

    rng = np.random.default_rng(0)
    num, den = rng.exponential(size=20), rng.uniform(1, 2, size=20)
    ratio, low, high = ratio_bootstrap(torch.tensor(num), torch.tensor(den), n_resamples=20000, method="bca")
    assert float(ratio) == pytest.approx(num.mean() / den.mean())
    ref = stats.bootstrap((num, den), lambda a, b, axis=-1: a.mean(axis) / b.mean(axis), paired=True, method="BCa",
                          n_resamples=20000, random_state=1).confidence_interval
    width = ref.high - ref.low
    assert abs(float(low) - ref.low) < 0.03 * width and abs(float(high) - ref.high) < 0.03 * width


def test_bca_interval_without_bias_or_skew_is_the_percentile_one():
    from interp.stats import bca_interval

    draws = torch.linspace(-1, 1, 1001, dtype=torch.float64).unsqueeze(1)  # (resample, cell): symmetric about 0
    jackknife = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)  # symmetric: acceleration 0
    low, high = bca_interval(draws, draws[500], jackknife, 0.9)  # the estimate is the draws' median: z0 = 0
    torch.testing.assert_close(torch.cat([low, high]), torch.quantile(draws[:, 0], torch.tensor([0.05, 0.95], dtype=torch.float64)))


def test_studentized_interval_is_the_t_interval_on_normal_data():
    """On normal data the bootstrap-t interval approaches mean +- t_(n-1) se (wider than the percentile one)."""
    stats = pytest.importorskip("scipy.stats")
    x = torch.randn(40, 200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # (prompt, sample)
    mean, low, high = bootstrap(x, n_resamples=2000, method="studentized")
    half = stats.t.ppf(0.975, 39) * x.std(0) / math.sqrt(40)
    ratio = ((high - low) / (2 * half)).median().item()
    assert 0.95 < ratio < 1.1, ratio
    _, p_low, p_high = bootstrap(x, n_resamples=2000)
    assert ((high - low) > (p_high - p_low)).double().mean() > 0.8


def test_intervals_on_constant_and_tied_metrics():
    """A constant metric gets a zero-width interval from every method; a metric tied on all prompts but
    one (an argmax rate of 1.0 on 31 of 32) gets a finite, narrow studentized interval, not an unbounded one."""
    for method in ("percentile", "bca", "studentized"):
        mean, low, high = bootstrap(torch.full((10, 3), 0.7, dtype=torch.float64), method=method)
        torch.testing.assert_close(low, mean) and torch.testing.assert_close(high, mean)
    tied = torch.ones(32, dtype=torch.float64)
    tied[5] = 0.8
    mean, low, high = bootstrap(tied, method="studentized")
    assert 0.98 < float(low) < float(mean) < float(high) < 1.01
    from interp.stats import studentized_pvalue

    assert float(studentized_pvalue(tied - 0.9)) < 0.001  # clearly above 0.9
    assert float(studentized_pvalue(torch.full((8,), 0.2))) < 0.01
    assert float(studentized_pvalue(torch.zeros(8))) == 1.0


def test_studentized_ratio_interval():
    from interp.stats import ratio_bootstrap

    generator = torch.Generator().manual_seed(1)
    den = 1 + torch.rand(32, 300, generator=generator, dtype=torch.float64)
    num = 0.6 * den + 0.1 * torch.randn(32, 300, generator=generator, dtype=torch.float64)
    ratio, low, high = ratio_bootstrap(num, den, method="studentized")
    assert ratio.shape == low.shape == (300,) and (low < ratio).all() and (ratio < high).all()
    coverage = ((low <= 0.6) & (0.6 <= high)).double().mean().item()
    assert 0.9 <= coverage <= 0.99, coverage
    exact = ratio_bootstrap(0.9 * den[:, 0], den[:, 0], method="studentized")  # an exact ratio: zero width
    assert all(abs(float(v) - 0.9) < 1e-9 for v in exact)
    with pytest.raises(ValueError, match="same shape"):
        ratio_bootstrap(num, den[:, :2])


def test_studentized_pvalue_null_and_power():
    pytest.importorskip("scipy")
    from interp.stats import studentized_pvalue

    generator = torch.Generator().manual_seed(6)
    effects = torch.randn(32, 300, generator=generator, dtype=torch.float64)
    p = studentized_pvalue(effects, n_resamples=400, seed=2)
    assert p.shape == (300,) and (p > 0).all() and (p <= 1).all()
    assert _uniformity(p) > 0.001
    assert (studentized_pvalue(effects + 1.0, n_resamples=400) < 0.05).double().mean() > 0.95


def test_interval_method_errors():
    with pytest.raises(ValueError, match="method='bootstrap-t'"):
        bootstrap(torch.ones(4, 2), method="bootstrap-t")
    with pytest.raises(ValueError, match="confidence=1.5"):
        bootstrap(torch.ones(4, 2), method="bca", confidence=1.5)
    with pytest.raises(TooFewPrompts, match="at least 2 prompts, got 1"):
        bootstrap(torch.ones(1, 2), method="studentized")
