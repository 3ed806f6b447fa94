"""Statistics over prompts, vectorised over every head at once.

The prompt is the unit of statistics: every function takes per-prompt values of shape
(prompt, ...) and reduces the prompt axis, keeping the rest (usually (layer, head)).
Resampling reuses TransformerLens's `utilities.statistics` (percentile bootstrap, sign-flip
permutation test, seeded purpose-labelled generators); the BCa interval, Benjamini-Hochberg, the
two-sample permutation test and the tidy-frame builder are ours, since the package has none.

Intervals (`bootstrap(method=...)`, `ratio_bootstrap`): "percentile" takes the bootstrap quantiles
as they are; "bca" (bias-corrected and accelerated, Efron 1987) shifts the quantile levels by the
bootstrap's median bias z0 and a jackknife estimate of the estimator's skewness (the acceleration
a); "studentized" (bootstrap-t) resamples t* = (mean* - mean) / se* and reads the interval off its
quantiles, so it also widens for the extra uncertainty of se at small n. Attention metrics pile
up near 0 or 1 and are skewed: on real per-prompt metrics (tests/interp/test_stats_coverage.py, 2000
replications; one heavy-tailed head excepted, see there) a 95% interval at n = 32 covers 0.92-0.94 (percentile), 0.92-0.94 (BCa) and
0.94-0.96 (studentized); at n = 8 0.84-0.89, 0.85-0.90 and 0.93-0.96. The claims' evidence helpers
use the studentized interval and need `interp.claims.MIN_PROMPTS_FOR_VERDICT` (32) prompts.
The sign-flip test assumes effects symmetric about 0 and on skewed metrics rejects a true null
up to 0.09 at n = 32 for alpha = 0.05; `studentized_pvalue` does not assume symmetry.

Limits, stated once: no bootstrap can show uncertainty the sample does not contain (a constant
metric gets a zero-width interval), and intervals on fewer than ~32 prompts undercover on skewed
metrics; `MIN_PROMPTS` refuses fewer than 2 outright.
"""
from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike
from transformer_lens.utilities.statistics import (
    bootstrap_ci as _tl_bootstrap_ci,
)
from transformer_lens.utilities.statistics import (
    derive_generator,
    sign_flip_permutation_pvalue,
)

Alternative = Literal["two-sided", "greater", "less"]
IntervalMethod = Literal["percentile", "bca", "studentized"]
MIN_PROMPTS = 2


class TooFewPrompts(ValueError):
    """A statistic needs more prompts than it was given."""


def _check_prompts(values: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        values = torch.as_tensor(values)
    if values.ndim == 0 or values.shape[0] < MIN_PROMPTS:
        n = 0 if values.ndim == 0 else values.shape[0]
        raise TooFewPrompts(
            f"{what} needs per-prompt values from at least {MIN_PROMPTS} prompts, got {n}; "
            "pass more prompts (>= 32 for an interval that covers as it says)."
        )
    if not torch.isfinite(values).all():
        raise ValueError(f"{what}: per-prompt values contain NaN or inf; check the model output and the metric.")
    return values.double()


def bootstrap(
    values: torch.Tensor, *, confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0, label: str = "bootstrap",
    method: IntervalMethod = "percentile",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean over prompts and its bootstrap interval: values (prompt, ...) -> three (...) tensors.

    `method`: "percentile" or "bca" (see the module docstring). Both resample the same prompts
    from `derive_generator(seed, label)`, so they differ only in the quantile levels read off.
    """
    values = _check_prompts(values, "bootstrap")
    _check_interval(method, confidence, n_resamples)
    if method == "percentile":
        low, high = _tl_bootstrap_ci(
            values, dim=0, confidence=confidence, n_resamples=n_resamples, generator=derive_generator(seed, label),
            chunk_size=_chunk_size(values),
        )
        return values.mean(0), low, high
    if method == "studentized":
        estimate, se, t = _studentized(values, None, n_resamples, derive_generator(seed, label))
        return (estimate,) + _t_interval(estimate, se, t, confidence)
    n = values.shape[0]
    mean = values.mean(0)
    draws = _resampled_means(values, n_resamples, derive_generator(seed, label))  # (resample, ...)
    jackknife = (values.sum(0) - values) / (n - 1)  # (prompt, ...): the mean without each prompt
    low, high = bca_interval(draws, mean, jackknife, confidence)
    return mean, low, high


def ratio_bootstrap(
    numerator: torch.Tensor, denominator: torch.Tensor, *, confidence: float = 0.95, n_resamples: int = 1000,
    seed: int = 0, label: str = "ratio", method: IntervalMethod = "bca",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ratio of means sum(num) / sum(den) over prompts and its bootstrap interval; num, den (prompt, ...).

    Resamples prompts (the pair num, den together). Resamples whose denominator mean is 0 give no
    ratio and are left out; with none left the interval is NaN.
    """
    num = _check_prompts(numerator, "ratio_bootstrap (numerator)")
    den = _check_prompts(denominator, "ratio_bootstrap (denominator)")
    if num.shape != den.shape:
        raise ValueError(f"ratio_bootstrap: numerator {tuple(num.shape)} and denominator {tuple(den.shape)} "
                         "must have the same shape (one pair per prompt).")
    _check_interval(method, confidence, n_resamples)
    ratio = num.mean(0) / den.mean(0)
    generator = derive_generator(seed, label)
    if method == "studentized":
        estimate, se, t = _studentized(num, den, n_resamples, generator)
        return (estimate,) + _t_interval(estimate, se, t, confidence)
    pairs = torch.stack([num, den], -1)  # (prompt, ..., 2)
    means = _resampled_means(pairs, n_resamples, generator)  # (resample, ..., 2)
    draws = means[..., 0] / means[..., 1]  # (resample, ...)
    draws = torch.where(torch.isfinite(draws), draws, torch.nan)
    if method == "percentile":
        low, high = _quantile(draws, torch.full_like(ratio, (1 - confidence) / 2)), _quantile(
            draws, torch.full_like(ratio, (1 + confidence) / 2))
        return ratio, low, high
    jackknife = (num.sum(0) - num) / (den.sum(0) - den)  # (prompt, ...): the ratio without each prompt
    low, high = bca_interval(draws, ratio, jackknife, confidence)
    return ratio, low, high


def studentized_pvalue(
    effects: torch.Tensor, *, n_resamples: int = 2000, seed: int = 0, label: str = "studentized"
) -> torch.Tensor:
    """One-sided p-value that the mean per-prompt effect (prompt, ...) is > 0, by the studentized bootstrap.

    The share of bootstrap t* = (mean* - mean) / se* at least the observed t = mean / se,
    (hits + 1) / (n_resamples + 1). Unlike the sign-flip test it does not assume the effects are
    symmetric about 0, so it is not lenient on skewed metrics (tests/interp/test_stats_coverage.py). A constant
    effect gets the smallest p-value when positive and 1 otherwise.
    """
    effects = _check_prompts(effects, "studentized_pvalue")
    if n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples} must be >= 1 (2000 is the default).")
    estimate, se, t = _studentized(effects, None, n_resamples, derive_generator(seed, label))
    observed = torch.where(se > 0, estimate / se.clamp(min=1e-300), torch.where(estimate > 0, math.inf, -math.inf))
    hits = (t >= observed).sum(0).double()
    return (hits + 1) / (n_resamples + 1)


def _studentized(
    num: torch.Tensor, den: torch.Tensor | None, n_resamples: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Estimate, standard error and bootstrap t* (resample, ...) for a mean (den None: the mean of num)
    or a ratio of means (the delta-method standard error of mean(num) / mean(den)).

    t* = (estimate* - estimate) / se*. A resample with no spread of its own (se* below 1e-6 of the
    sample's se: every prompt drawn tied, common for a metric tied on most prompts, e.g. an argmax
    rate of 1.0 on 31 of 32 prompts) is studentized by the sample's se instead: dividing by ~0
    would put it at +-infinity and make the interval unbounded and the p-value ~1. Moments are
    taken about the sample means, so a near-constant metric (0.9998 +- 1e-5) loses no precision."""
    n = num.shape[0]
    center_num = num.mean(0)
    center_den = None if den is None else den.mean(0)
    u = num - center_num  # (prompt, ...)
    w = torch.zeros_like(u) if den is None else den - den.mean(0)
    moments = torch.stack([u, w, u**2, w**2, u * w], -1)  # (prompt, ..., 5)
    estimate, se = _estimate_se(moments.mean(0), n, center_num, center_den)
    star, se_star = _estimate_se(_resampled_means(moments, n_resamples, generator), n, center_num, center_den)
    scale = torch.where(se_star > 1e-6 * se, se_star, se)  # (resample, ...)
    t = torch.where(scale > 0, (star - estimate) / scale.clamp(min=1e-300), 0.0)
    return estimate, se, t


def _estimate_se(
    moments: torch.Tensor, n: int, center_num: torch.Tensor, center_den: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., 5) means of u, w, u^2, w^2, u*w (num and den about their sample means) -> estimate and standard error."""
    m_u, m_w, m_u2, m_w2, m_uw = moments.unbind(-1)
    if center_den is None:
        return center_num + m_u, ((m_u2 - m_u**2).clamp(min=0) * n / (n - 1) / n).sqrt()
    mean_den = center_den + m_w
    r = (center_num + m_u) / mean_den
    # variance of num - r * den over prompts, over mean(den)^2: the delta method
    variance = (m_u2 - 2 * r * m_uw + r**2 * m_w2 - (m_u - r * m_w) ** 2).clamp(min=0) * n / (n - 1)
    return r, (variance / n).sqrt() / mean_den.abs()


def _t_interval(
    estimate: torch.Tensor, se: torch.Tensor, t: torch.Tensor, confidence: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bootstrap-t interval [est - t*_(1-a/2) se, est - t*_(a/2) se]; zero width when se = 0; NaN draws left out."""
    t = torch.where(torch.isfinite(estimate) & torch.isfinite(se), t, torch.nan)
    upper_t = _quantile(t, torch.full_like(estimate, (1 + confidence) / 2))
    lower_t = _quantile(t, torch.full_like(estimate, (1 - confidence) / 2))
    low = torch.where(se > 0, estimate - upper_t * se, estimate)
    high = torch.where(se > 0, estimate - lower_t * se, estimate)
    return low, high


def bca_interval(
    draws: torch.Tensor, estimate: torch.Tensor, jackknife: torch.Tensor, confidence: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """BCa interval from bootstrap draws (resample, ...), the estimate (...) and its jackknife values (prompt, ...).

    z0 = Phi^-1(share of draws below the estimate, ties counted half), the acceleration
    a = sum(d^3) / (6 sum(d^2)^1.5) with d = mean(jackknife) - jackknife; each bound is the draws'
    quantile at Phi(z0 + (z0 + z) / (1 - a (z0 + z))) for z = Phi^-1 of (1 -+ confidence) / 2.
    NaN draws are left out. A constant sample has a = 0 and a zero-width interval.
    """
    valid = ~torch.isnan(draws)
    count = valid.sum(0).clamp(min=1).double()  # (...)
    below = ((draws < estimate) & valid).sum(0) + ((draws <= estimate) & valid).sum(0)
    # clamped so that a sample every resample lies on one side of gives a finite z0 (the extreme draw)
    share = (below.double() / (2 * count)).clamp(0.5 / count, 1 - 0.5 / count)
    z0 = torch.special.ndtri(share)
    jackknife = jackknife.double()
    d = jackknife.nanmean(0) - jackknife  # (prompt, ...)
    d = torch.where(torch.isfinite(d), d, 0.0)
    spread = (d**2).sum(0)
    accel = torch.where(spread > 0, (d**3).sum(0) / (6 * spread.clamp(min=1e-300) ** 1.5), 0.0)
    bounds = []
    for level in ((1 - confidence) / 2, (1 + confidence) / 2):
        z = z0 + torch.special.ndtri(torch.tensor(level, dtype=torch.float64))
        bounds.append(_quantile(draws, torch.special.ndtr(z0 + z / (1 - accel * z))))
    return bounds[0], bounds[1]


def _quantile(draws: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Per-cell quantile, linear interpolation (torch.quantile's default): draws (resample, ...), levels (...).

    NaN draws are left out (a cell with none left gives NaN)."""
    ordered = torch.sort(draws, dim=0).values  # NaN sort last
    count = (~torch.isnan(draws)).sum(0, keepdim=True)  # (1, ...)
    position = levels.double().unsqueeze(0).clamp(0, 1) * (count - 1).clamp(min=0)
    lower = position.floor().long()
    upper = torch.minimum(lower + 1, (count - 1).clamp(min=0))
    weight = position - lower
    below, above = ordered.gather(0, lower), ordered.gather(0, upper)
    out = (below + weight * (above - below)).squeeze(0)
    return torch.where(count.squeeze(0) > 0, out, torch.nan)


def _resampled_means(values: torch.Tensor, n_resamples: int, generator: torch.Generator) -> torch.Tensor:
    """Means of `n_resamples` resamples of the prompts (with replacement): (prompt, ...) -> (resample, ...).

    Draws the indices in the chunks TransformerLens's bootstrap_ci uses, so the resamples are the
    ones its percentile interval reads."""
    n, chunk = values.shape[0], _chunk_size(values)
    means = []
    for start in range(0, n_resamples, chunk):
        idx = torch.randint(0, n, (min(chunk, n_resamples - start), n), generator=generator)  # (resample, prompt)
        means.append(values[idx].mean(1))  # (resample, ...)
    return torch.cat(means)


def _chunk_size(values: torch.Tensor) -> int:
    # one chunk of resamples holds ~4M doubles whatever the prompt count: memory stays flat
    cells = max(1, values[0].numel())
    return max(1, min(256, 2**22 // (values.shape[0] * cells)))


def _check_interval(method: str, confidence: float, n_resamples: int) -> None:
    if method not in get_args(IntervalMethod):
        raise ValueError(f"method={method!r}; expected one of {list(get_args(IntervalMethod))}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must be in (0, 1), e.g. 0.95.")
    if n_resamples < 2:
        raise ValueError(f"n_resamples={n_resamples} must be >= 2 (1000 is the default).")


def sign_flip_test(
    effects: torch.Tensor, *, alternative: Alternative = "greater", n_permutations: int = 2000, seed: int = 0, label: str = "sign-flip"
) -> torch.Tensor:
    """p-value that the mean per-prompt effect (prompt, ...) is zero (paired sign-flip test)."""
    _check_alternative(alternative)
    effects = _check_prompts(effects, "sign_flip_test")
    return sign_flip_permutation_pvalue(
        effects, dim=0, n_permutations=n_permutations, alternative=alternative, generator=derive_generator(seed, label)
    )


def permutation_test(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    alternative: Alternative = "greater",
    n_permutations: int = 2000,
    seed: int = 0,
    label: str = "permutation",
) -> torch.Tensor:
    """p-value that mean(a) - mean(b) is zero, by permuting group labels; a (n, ...), b (m, ...).

    Vectorised over the trailing axes. p = (hits + 1) / (n_permutations + 1), never zero.
    """
    _check_alternative(alternative)
    a, b = _check_prompts(a, "permutation_test (a)"), _check_prompts(b, "permutation_test (b)")
    pooled = torch.cat([a, b])  # (n + m, ...)
    n = a.shape[0]
    observed = a.mean(0) - b.mean(0)
    generator = derive_generator(seed, label)
    hits = torch.zeros_like(observed)
    for _ in range(n_permutations):
        order = torch.randperm(pooled.shape[0], generator=generator)
        null = pooled[order[:n]].mean(0) - pooled[order[n:]].mean(0)
        hits += _hits(null, observed, alternative)
    return (hits + 1) / (n_permutations + 1)


def _hits(null: torch.Tensor, observed: torch.Tensor, alternative: str) -> torch.Tensor:
    tolerance = observed.abs() * 1e-9
    if alternative == "two-sided":
        return (null.abs() >= observed.abs() - tolerance).double()
    if alternative == "greater":
        return (null >= observed - tolerance).double()
    return (null <= observed + tolerance).double()


def _check_alternative(alternative: str) -> None:
    if alternative not in get_args(Alternative):
        raise ValueError(f"alternative={alternative!r}; expected one of {list(get_args(Alternative))}.")


def benjamini_hochberg(p_values: ArrayLike, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini-Hochberg step-up: (reject, adjusted p-values), same shape as the input.

    Controls the false discovery rate at `alpha` for independent or positively dependent tests.
    NaN p-values (tests that could not run) stay NaN and are never rejected.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1).")
    p = np.asarray(p_values, dtype=float)
    flat = p.ravel()
    valid = ~np.isnan(flat)
    adjusted = np.full_like(flat, np.nan)
    m = int(valid.sum())
    if m:
        pv = flat[valid]
        order = np.argsort(pv)
        ranked = pv[order] * m / np.arange(1, m + 1)
        ranked = np.minimum.accumulate(ranked[::-1])[::-1].clip(max=1.0)
        out = np.empty(m)
        out[order] = ranked
        adjusted[valid] = out
    reject = np.where(np.isnan(adjusted), False, adjusted <= alpha)
    return reject.reshape(p.shape), adjusted.reshape(p.shape)


def spearman(a: ArrayLike, b: ArrayLike) -> float:
    """Spearman rank correlation of two equal-length sequences; NaN with < 3 values or a constant one."""
    x, y = pd.Series(np.ravel(np.asarray(a, dtype=float))), pd.Series(np.ravel(np.asarray(b, dtype=float)))
    if len(x) != len(y):
        raise ValueError(f"spearman needs sequences of equal length, got {len(x)} and {len(y)}.")
    if len(x) < 3 or x.nunique() < 2 or y.nunique() < 2:
        return float("nan")
    return float(x.corr(y, method="spearman"))


def head_frame(
    per_prompt: dict[str, torch.Tensor], *, seed: int = 0, confidence: float = 0.95, n_resamples: int = 1000
) -> pd.DataFrame:
    """Wide tidy frame, one row per (layer, head): each metric, `{metric}_ci_low`, `{metric}_ci_high`, `n_prompts`.

    `per_prompt` maps metric name -> (prompt, layer, head) values. With fewer than
    `MIN_PROMPTS` prompts the CI columns are NaN (a point estimate is still given).
    """
    if not per_prompt:
        raise ValueError("head_frame needs at least one metric.")
    first = next(iter(per_prompt.values()))
    n_prompts, n_layers, n_heads = first.shape
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    columns: dict[str, np.ndarray] = {"layer": layer.ravel(), "head": head.ravel()}
    for name, values in per_prompt.items():
        if values.shape != first.shape:
            raise ValueError(f"metric {name!r} has shape {tuple(values.shape)}, expected {tuple(first.shape)}.")
        if n_prompts >= MIN_PROMPTS:
            mean, low, high = bootstrap(values, confidence=confidence, n_resamples=n_resamples, seed=seed, label=name)
        else:
            mean = values.double().mean(0)
            low = high = torch.full_like(mean, float("nan"))
        columns[name] = mean.numpy().ravel()
        columns[f"{name}_ci_low"] = low.numpy().ravel()
        columns[f"{name}_ci_high"] = high.numpy().ravel()
    columns["n_prompts"] = np.full(n_layers * n_heads, n_prompts)
    return pd.DataFrame(columns)
