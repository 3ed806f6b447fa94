"""Stage 1 of the leakage audit: what `audit` runs, checked and fixed before any forward pass.

`plan_audit` checks the arguments against the model (sizes, methods, tol, finite weights, the
declaration) and returns an `AuditPlan`; `stages` runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch import nn

from interp.analyses.leakage.adapter import ModelAdapter, _config, declaration, infer_n_ctx, infer_vocab_size
from interp.analyses.leakage.fast import (
    GRADIENT_CUTS,
    SHORT_LEN,
    SIDE_LEN,
    CostEstimate,
    coverage_cuts,
    declared_boundaries,
    perturbation_cuts,
    perturbation_draws,
)
from interp.analyses.leakage.methods import _prompts, embedding_module, spread_cuts
from interp.analyses.leakage.types import DEFAULT_MAX_LEN, DEFAULT_TOL, HALF_PRECISION_TOL, METHODS, check_tol
from interp.errors import BadInput
from interp.modelinfo import check_finite_weights
from interp.models.kv_cache import supports_incremental


def check_weights_finite(model: Any) -> None:
    """A ModelError naming NaN / inf weights (`interp.modelinfo.check_finite_weights`): the audit compares
    outputs, and NaN weights would be blamed on something else (a fully masked row) or hide a leak."""
    check_finite_weights(model)


# ---------------------------------------------------------------------------------------------
# Stage 1, the plan: what to run, fixed before any forward pass
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditPlan:
    """What `audit` runs: sizes, methods, thresholds, and the budget (progress steps, cost estimate)."""

    max_len: int  # longest length; truncation covers every prefix up to it
    vocab: int
    lengths: tuple[int, ...]  # perturbed lengths
    methods: tuple[str, ...]  # in METHODS order
    n_prompts: int
    draws: int  # resamplings per cut
    max_cuts: int | None  # cuts perturbed per length (None: all)
    gradient_len: int  # length of the Jacobian test (at most max_len)
    tol: float
    seed: int
    pad_id: int
    bidirectional: bool  # declared an encoder: future dependence is by design, not audited
    localise: bool  # localise leaks at every site
    declared_by: str | None = None  # who declared it bidirectional (`declaration`); None: a causal model is expected
    mask_variants: tuple[bool, ...] = (False,)  # ones_mask of each run of the future methods
    passes: int = 0  # progress-bar steps: truncation prefixes, perturbation / gradient chunks, other methods
    cost: CostEstimate | None = None  # tokens and ETA (`fast.estimate`), when progress is shown
    incremental: bool = False  # a native model: the incremental reference covers every truncation cut
    prefix_lengths: tuple[int, ...] = ()  # the black-box truncation's prefixes (`fast.coverage_cuts`)
    gradient_cuts: tuple[int, ...] = ()  # cuts of the gradient at max_len (`methods.gradient_at_cuts`), if longer than gradient_len
    boundaries: tuple[tuple[str, int], ...] = ()  # boundaries the config declares (`fast.declared_boundaries`)
    side_len: int = 0  # length of the batch and padding checks (at most `fast.SIDE_LEN`)
    tol_given: bool = True  # the caller chose tol (else the dtype's default: float64 comparisons then use DEFAULT_TOL)

    def prompts(self, n: int, length: int) -> torch.Tensor:
        """The audit's random prompts (prompt, pos): the same for every method at a length."""
        return _prompts(n, length, self.vocab, self.seed)

    def cost_arguments(self) -> dict[str, Any]:
        """Keyword arguments of `fast.estimate` / `announce`."""
        return {"max_len": self.max_len, "vocab": self.vocab, "lengths": self.lengths, "n_prompts": self.n_prompts,
                "methods": self.methods, "draws": self.draws, "max_cuts": self.max_cuts,
                "gradient_len": self.gradient_len, "prefix_lengths": self.prefix_lengths,
                "gradient_cuts": len(self.gradient_cuts)}

    def coverage(self) -> dict[str, Any]:
        """What the future methods cover, for the report (`LeakageReport.coverage`): per method its lengths and cuts
        (a cut t: positions <= t observed, later ones removed or changed), and whether every cut was compared."""
        cuts = {"truncation": {"length": self.max_len, "complete": self.incremental or self.max_len - 1 <= len(self.prefix_lengths),
                               "every_prefix_up_to": min(SHORT_LEN, self.max_len - 1),
                               "prefix_lengths": list(self.prefix_lengths),
                               "incremental_reference": self.incremental}}
        cuts["perturbation"] = {"cuts": {str(length): _spread(length, perturbation_cuts(self.incremental, length, self.max_cuts))
                                         for length in self.lengths}}
        cuts["gradient"] = {"every_pair_at_length": self.gradient_len,
                            "cuts": {str(self.max_len): list(self.gradient_cuts)} if self.gradient_cuts else {}}
        return {**{m: cuts[m] for m in ("truncation", "perturbation", "gradient") if m in self.methods},
                "boundaries": dict(self.boundaries), "batch_and_padding_length": self.side_len, "seed": self.seed}


def _spread(length: int, max_cuts: int | None) -> list[int]:
    """The cuts `methods.perturbation` perturbs at `length` (`methods.spread_cuts`), as a list."""
    return [int(c) for c in spread_cuts(length, max_cuts)]


def _default_lengths(max_len: int) -> tuple[int, ...]:
    middle = (max_len // 2) | 1  # odd, so no position axis is mistaken for a head or width axis
    return tuple(sorted({max_len, max(2, min(middle, max_len)), min(5, max_len)}))


def _resolve_sizes(model: Any, max_len: int | str | None, vocab_size: int | None,
                   lengths: Sequence[int] | None) -> tuple[int, int, tuple[int, ...]]:
    """max_len, vocabulary size and perturbed lengths: given, or inferred from the model; checked."""
    n_ctx = infer_n_ctx(model)
    if max_len is None or max_len == "ctx":
        if n_ctx is None:
            raise ValueError(
                f"cannot tell the context length of a {type(model).__name__}; pass max_len=N (the longest "
                "sequence the model accepts)."
            )
        max_len = n_ctx if max_len == "ctx" else min(n_ctx, DEFAULT_MAX_LEN)
    if isinstance(max_len, bool) or not isinstance(max_len, int):
        raise BadInput(f"max_len={max_len!r}; expected a number of tokens, or 'ctx' for the model's whole context.")
    if n_ctx is not None and max_len > n_ctx:
        raise ValueError(f"max_len={max_len} exceeds the model's context n_ctx={n_ctx}; pass max_len<={n_ctx}.")
    if max_len < 2:
        raise ValueError(f"max_len={max_len}: a leak needs at least two positions; pass max_len>=2.")
    vocab = vocab_size or infer_vocab_size(model)
    if vocab is None or vocab < 2:
        raise ValueError(
            f"cannot tell the vocabulary size of a {type(model).__name__}; pass vocab_size=N (token ids 0..N-1)."
        )
    lengths = tuple(sorted(set(lengths))) if lengths is not None else _default_lengths(max_len)
    bad = [length for length in lengths if not 2 <= length <= max_len]
    if bad:
        raise ValueError(f"lengths {bad} are outside [2, max_len={max_len}]; pass lengths between 2 and {max_len}.")
    return max_len, vocab, lengths


def _check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """`methods` in METHODS order, or a ValueError naming the unknown ones."""
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected a subset of {list(METHODS)}.")
    return tuple(m for m in METHODS if m in methods)


def plan_audit(model: Any, adapter: ModelAdapter, *, max_len: int | str | None = None, vocab_size: int | None = None,
               n_prompts: int = 2, seed: int = 0, tol: float | None = None, lengths: Sequence[int] | None = None,
               methods: Sequence[str] = METHODS, draws: int = 2, max_cuts: int | None = 16, gradient_len: int = 24,
               localise_leaks: bool = True, pad_token_id: int | None = None,
               bidirectional: bool | None = None) -> AuditPlan:
    """Check `audit`'s arguments against the model and fix what it will run (no forward pass)."""
    methods = _check_methods(methods)
    tol_given = tol is not None
    if tol is None:  # rounding of the model's own precision: half-precision models round 1e3 times coarser
        tol = HALF_PRECISION_TOL if adapter.dtype in (torch.float16, torch.bfloat16) else DEFAULT_TOL
    check_tol(tol, adapter.dtype)
    check_weights_finite(model)
    if n_prompts < 1 or draws < 1:
        raise ValueError(f"n_prompts={n_prompts} and draws={draws} must both be at least 1.")
    max_len, vocab, lengths = _resolve_sizes(model, max_len, vocab_size, lengths)
    declared = declaration(model, bidirectional)
    incremental = supports_incremental(model)
    boundaries = declared_boundaries(model)
    gradient_len = min(gradient_len, max_len)
    plan = AuditPlan(
        max_len=max_len, vocab=vocab, lengths=lengths, methods=methods, n_prompts=n_prompts, draws=draws,
        max_cuts=max_cuts, gradient_len=gradient_len, tol=float(tol), seed=seed,
        pad_id=pad_token_id if pad_token_id is not None else getattr(_config(model), "pad_token_id", None) or 0,
        bidirectional=declared is not None, declared_by=declared, localise=localise_leaks,
        mask_variants=(False, True) if adapter.takes_mask else (False,), incremental=incremental,
        prefix_lengths=tuple(range(1, min(SHORT_LEN, max_len - 1) + 1)) if incremental else
        tuple(coverage_cuts(max_len, boundaries, seed=seed)),
        gradient_cuts=_gradient_cuts(max_len, gradient_len), boundaries=tuple(sorted(boundaries.items())),
        side_len=min(max_len, SIDE_LEN), tol_given=tol_given,
    )
    if not plan.bidirectional and not ({"truncation", "perturbation"} & set(methods)) and _embedding(model, plan) is None:
        reason = ["gradient skipped: no input embedding found (a black-box callable)"] if "gradient" in methods else []
        raise ValueError(_no_future_method_message(methods, reason))
    return replace(plan, passes=_planned_passes(plan, adapter))


def _gradient_cuts(max_len: int, gradient_len: int) -> tuple[int, ...]:
    """GRADIENT_CUTS cuts spread over max_len (a cut t: positions <= t observed), when it is longer than the
    exhaustive gradient's length."""
    if max_len <= gradient_len:
        return ()
    return tuple(sorted({max(0, min(max_len - 2, round(max_len * k / (GRADIENT_CUTS + 1)) - 1))
                         for k in range(1, GRADIENT_CUTS + 1)}))


def _embedding(model: Any, plan: AuditPlan) -> nn.Module | None:
    """Where the gradient test differentiates: the input embedding, if the gradient runs at all."""
    return embedding_module(model, plan.vocab) if "gradient" in plan.methods and not plan.bidirectional else None


def _planned_passes(plan: AuditPlan, adapter: ModelAdapter) -> int:
    """Progress-bar steps: one per truncation prefix, perturbation or gradient chunk, other method."""
    steps = 2 + sum(m in plan.methods for m in ("batch", "padding"))  # + the floors + localisation
    if plan.bidirectional:
        return steps
    future = len(plan.prefix_lengths) + plan.incremental if "truncation" in plan.methods else 0
    steps += "pattern" in plan.methods
    if "perturbation" in plan.methods:
        for length in plan.lengths:
            cuts = len(_spread(length, perturbation_cuts(plan.incremental, length, plan.max_cuts)))
            draws = perturbation_draws(plan.incremental, length, plan.draws)
            if plan.incremental and length > SHORT_LEN:
                steps += cuts * draws  # the plain run only
            else:
                future += cuts * draws  # one forward of n_prompts rows per (cut, draw)
    if "gradient" in plan.methods:
        future += math.ceil((plan.gradient_len - 1) / adapter.rows_per_forward(plan.gradient_len))
        steps += len(plan.gradient_cuts)  # the gradient at the audited length: the plain run only
    return steps + future * len(plan.mask_variants)  # with a mask of ones too


def _no_future_method_message(methods: Sequence[str], notes: Sequence[str]) -> str:
    why = "; ".join(note for note in notes if "skipped" in note)
    return (
        f"methods={tuple(methods)} cannot show a dependence on later tokens for this model"
        + (f" ({why})" if why else "")
        + ": a causal verdict needs at least one of 'truncation' or 'perturbation' (any model) or 'gradient' "
        "(models with an nn.Embedding or hook_embed); 'pattern' is never trusted alone. Include them, e.g. "
        "methods=('truncation', 'perturbation', 'gradient'), or leave methods at its default."
    )
