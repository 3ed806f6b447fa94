"""Statistics over prompts, vectorised over every head at once.

The prompt is the unit of statistics: every function takes per-prompt values of shape
(prompt, ...) and reduces the prompt axis, keeping the rest (usually (layer, head)).
Resampling reuses TransformerLens's `utilities.statistics` (percentile bootstrap, sign-flip
permutation test, seeded purpose-labelled generators); Benjamini-Hochberg, the two-sample
permutation test and the tidy-frame builder are ours, since the package has none.

Limits, stated once: a percentile bootstrap cannot show uncertainty the sample does not
contain (a constant metric gets a zero-width interval), and intervals on fewer than ~8
prompts are wide and skewed; `MIN_PROMPTS` refuses fewer than 2 outright.
"""
from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike
import pandas as pd
import torch
from transformer_lens.utilities.statistics import (
    bootstrap_ci as _tl_bootstrap_ci,
    derive_generator,
    sign_flip_permutation_pvalue,
)

Alternative = Literal["two-sided", "greater", "less"]
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
            "pass more prompts (>= 8 for a usable interval)."
        )
    if not torch.isfinite(values).all():
        raise ValueError(f"{what}: per-prompt values contain NaN or inf; check the model output and the metric.")
    return values.double()


def bootstrap(
    values: torch.Tensor, *, confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0, label: str = "bootstrap"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean over prompts and its percentile-bootstrap interval: values (prompt, ...) -> three (...) tensors."""
    values = _check_prompts(values, "bootstrap")
    # chunk so one chunk of resamples holds ~4M doubles whatever the prompt count: memory stays flat
    cells = max(1, values[0].numel())
    chunk_size = max(1, min(256, 2**22 // (values.shape[0] * cells)))
    low, high = _tl_bootstrap_ci(
        values, dim=0, confidence=confidence, n_resamples=n_resamples, generator=derive_generator(seed, label),
        chunk_size=chunk_size,
    )
    return values.mean(0), low, high


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
