"""The leakage audit at long contexts: an incremental reference instead of every prefix, and a cost estimate.

The black-box truncation test runs every prefix length 1..T-1 of each prompt and compares it
with the full forward: about T^2 / 2 tokens per prompt (about 3 hours for a 1,024-token
GPT-2-small-shaped HookedGPT on 2 CPU cores). Where the model has an incremental path
(`interp.models.kv_cache`: one position at a time, keys and values cached, every module seeing only
the new position), the same question, "does the output at q change when everything after q is
removed?", is answered for every q at once by comparing that path with the full forward:
about one forward's worth of work per prompt (T single-position steps).

`truncation_rows` dispatches: models with an incremental path get the black-box truncation on
prefixes of up to `SHORT_LEN` tokens (kept as an independent check that needs no trust in the
incremental code) plus the incremental comparison over the whole length; every other model
gets the black-box truncation over the whole length. Rows of the incremental comparison are
truncation rows with `source_pos = query_pos + 1` (everything after the query removed) and a
detail saying how they were computed. Detection power: the incremental comparison at query q
is exactly the truncation comparison with cut q + 1, the one cut that removes every later
source; a module that mixes positions is caught because it sees only one position.

`estimate` counts the tokens each method will run and times one probe forward to give an ETA,
printed before the audit starts when `progress=True`.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from interp.analyses.leakage.methods import _change, _rows, _scale, truncation
from interp.analyses.leakage.types import Finding
from interp.models.kv_cache import incremental_outputs, supports_incremental

SHORT_LEN = 64  # black-box truncation kept up to this length when the incremental reference covers the rest
INCREMENTAL_DETAIL = "incremental reference (KV cache): positions after query_pos removed"


LONG_MAX_CUTS = 4  # perturbation cuts per length above SHORT_LEN once the incremental reference covers every cut
_PENDING: dict[tuple, list[Finding]] = {}  # rows of the all-ones-mask variant, computed in the same pass


def perturbation_cuts(model: Any, length: int, max_cuts: int | None) -> int | None:
    """Cuts perturbed at `length`: all asked for, or a spot check of LONG_MAX_CUTS above SHORT_LEN on
    models whose incremental reference already compares every cut at full length."""
    if supports_incremental(model) and length > SHORT_LEN:
        return LONG_MAX_CUTS if max_cuts is None else min(max_cuts, LONG_MAX_CUTS)
    return max_cuts


def _key(model: Any, prompts: torch.Tensor) -> tuple:
    return id(model), prompts.data_ptr(), tuple(prompts.shape), int(prompts.sum())


def incremental_rows(model: Any, adapter, prompts: torch.Tensor, tol: float,
                     progress: Callable = lambda *a, **k: None) -> list[Finding]:
    """Truncation rows from the incremental path vs the full forward (`adapter`), one per query.

    A model taking a mask is audited with and without an all-ones mask: both full forwards are
    compared with one incremental pass, and the second variant's rows wait in `_PENDING`."""
    key = _key(model, prompts)
    if adapter.ones_mask and key in _PENDING:
        return _PENDING.pop(key)
    variants = [adapter] + ([adapter.with_ones_mask()] if adapter.takes_mask and not adapter.ones_mask else [])
    n_prompts, n_pos = prompts.shape
    with torch.no_grad():
        fulls = [variant(prompts) for variant in variants]  # each (prompt, pos, feature), float32 on the CPU
    scales = [_scale(full) for full in fulls]
    influence = torch.full((len(variants), 1, n_pos - 1), math.nan)  # (variant, one cut per query, query)
    for t, logits in enumerate(incremental_outputs(model, prompts)):
        if t == n_pos - 1:  # the last position has no later token to leak from
            break
        reference = logits.float().cpu().reshape(n_prompts, -1)
        for i, (full, scale) in enumerate(zip(fulls, scales)):
            influence[i, 0, t] = float(_change(reference, full[:, t]).amax()) / scale
    queries = torch.arange(n_pos - 1)[None]
    progress(1, "incremental reference")
    rows = [_rows("truncation", n_pos, part, tol, query=queries, source=queries + 1, detail=INCREMENTAL_DETAIL,
                  ones_mask=variant.ones_mask) for part, variant in zip(influence, variants)]
    if len(rows) > 1:
        _PENDING[key] = rows[1]
    return rows[0]


def truncation_rows(model: Any, adapter, prompts: torch.Tensor, tol: float, *, progress: Callable = lambda *a, **k: None,
                    short_len: int = SHORT_LEN) -> list[Finding]:
    """The audit's truncation test: incremental reference + short black-box truncation where the
    model allows it, else black-box truncation over every prefix (module docstring)."""
    n_pos = prompts.shape[1]
    if not supports_incremental(model) or n_pos <= short_len:
        return truncation(adapter, prompts, tol, progress=progress)
    rows = truncation(adapter, prompts[:, :short_len], tol, progress=progress)
    rows += incremental_rows(model, adapter, prompts, tol, progress=progress)
    progress(max(0, n_pos - short_len - 1), "incremental reference")  # the planned black-box prefixes it replaced
    return rows


@dataclass(frozen=True)
class CostEstimate:
    """Tokens each method runs through the model, and a time estimate from one probe forward."""

    tokens: dict[str, int]
    seconds_per_token: float
    incremental: bool
    incremental_seconds: float = 0.0  # the reference's single-position steps, timed apart (matrix-vector work)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def seconds(self) -> float:
        return self.total_tokens * self.seconds_per_token + self.incremental_seconds

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {count:,}" for name, count in self.tokens.items() if count)
        how = "incremental reference + short truncation" if self.incremental else "black-box truncation of every prefix"
        steps = f", incremental steps about {_duration(self.incremental_seconds)}" if self.incremental_seconds else ""
        return (f"leakage audit: about {self.total_tokens:,} tokens through the model ({parts}; {how}{steps}); "
                f"ETA about {_duration(self.seconds)}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def count_tokens(max_len: int, lengths: Sequence[int], n_prompts: int, methods: Sequence[str], *, draws: int,
                 max_cuts: int | None, gradient_len: int, incremental: bool, with_mask: bool,
                 short_len: int = SHORT_LEN) -> dict[str, int]:
    """Tokens per method (gradient counted as 3 forwards' worth per row: forward + backward)."""
    variants = 2 if with_mask else 1
    tokens: dict[str, float] = {"truncation": 0, "perturbation": 0, "gradient": 0}
    if "truncation" in methods:
        if incremental and max_len > short_len:
            # the incremental pass is one forward's worth, shared by both mask variants
            tokens["truncation"] = n_prompts * (short_len * (short_len + 1) // 2 + max_len * (1 + 2 / variants))
        else:
            tokens["truncation"] = n_prompts * max_len * (max_len + 1) // 2
    if "perturbation" in methods:
        for length in lengths:
            cuts = LONG_MAX_CUTS if incremental and length > short_len else max_cuts
            cuts = length - 1 if cuts is None else min(length - 1, cuts)
            tokens["perturbation"] += n_prompts * length * (cuts * draws + 1)
    if "gradient" in methods:
        length = min(gradient_len, max_len)
        tokens["gradient"] = 3 * length * (length - 1)
    return {name: int(count * variants) for name, count in tokens.items()}


def probe_seconds_per_token(adapter, vocab: int, length: int) -> float:
    """Seconds per token of one forward of `length` random tokens (after a warm-up call)."""
    tokens = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    adapter(tokens[:, : min(length, 8)])
    start = time.perf_counter()
    adapter(tokens)
    return (time.perf_counter() - start) / length


def estimate(model: Any, adapter, *, max_len: int, vocab: int, lengths: Sequence[int], n_prompts: int,
             methods: Sequence[str], draws: int, max_cuts: int | None, gradient_len: int) -> CostEstimate:
    """The audit's cost before it runs (see `CostEstimate`); the probe costs one forward of max_len tokens."""
    incremental = supports_incremental(model)
    tokens = count_tokens(max_len, lengths, n_prompts, methods, draws=draws, max_cuts=max_cuts,
                          gradient_len=gradient_len, incremental=incremental, with_mask=adapter.takes_mask)
    steps = probe_incremental_seconds(model, vocab, n_prompts, max_len) if incremental and max_len > SHORT_LEN else 0.0
    return CostEstimate(tokens, probe_seconds_per_token(adapter, vocab, max_len), incremental, steps)


def probe_incremental_seconds(model: Any, vocab: int, n_prompts: int, length: int, n_steps: int = 4) -> float:
    """Seconds of the incremental reference over `length` positions, from `n_steps` timed steps."""
    tokens = torch.randint(0, vocab, (n_prompts, length), generator=torch.Generator().manual_seed(0))
    steps = incremental_outputs(model, tokens)
    next(steps)  # warm-up: the cache is allocated here
    start = time.perf_counter()
    for _ in range(n_steps):
        next(steps)
    steps.close()
    # a step's cost grows with the keys it reads; the first steps read few, so this is a lower bound
    return (time.perf_counter() - start) / n_steps * length


def announce(model: Any, adapter, **kwargs) -> CostEstimate | None:
    """Print the estimate to stderr (what `audit(progress=True)` shows first); None if the probe fails."""
    try:
        cost = estimate(model, adapter, **kwargs)
    except (ValueError, RuntimeError, TypeError):  # the audit itself reports what is wrong with the model
        return None
    import shutil
    import textwrap

    # filled at spaces to the terminal ($COLUMNS first): a terminal's own wrap breaks words ("perturba/tion")
    print(textwrap.fill(str(cost), shutil.get_terminal_size().columns, subsequent_indent="  ", break_long_words=False,
                        break_on_hyphens=False), file=sys.stderr, flush=True)
    return cost
