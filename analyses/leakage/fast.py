"""The leakage audit at long contexts: an incremental reference, coverage of black boxes, and a cost estimate.

The black-box truncation test runs a prefix of each length and compares it with the full forward:
every length 1..T-1 costs about T^2 / 2 tokens per prompt (hours at 1,024 tokens of a GPT-2-small
shape on 2 CPU cores). Where the model is a native HookedGPT (`interp.models.kv_cache`: every block
the native converter builds), the same question, "does the output at q change when everything
after q is removed?", is answered for every q at once by the *incremental reference*: the model's
own position-wise modules run on blocks of `REFERENCE_CHUNK` new positions, attention reading the
cached keys and values of earlier positions through a causal mask of the reference's own. The
modules are exactly the toolkit's classes (no hook, no override: `supports_incremental`), so output
q of the reference is a function of tokens <= q by construction, and comparing it with the full
forward is the truncation test with cut q + 1 for every q: complete truncation coverage for about
two forwards' work, whatever the length. It compares final hidden states (`ln_final` applied; the
unembedding is position-wise) and is judged against its own measured floor: both passes run in
float32 and in float64 (`floor.comparison_floor`), and float64 decides when the float32 floor
exceeds `floor.FLOAT64_DECIDES`.

Black boxes get every prefix up to `SHORT_LEN` and, beyond it, the cuts `coverage_cuts` chooses:
every power of two, every boundary the config declares (window, attention chunk, cache size) and
`RANDOM_CUTS` seeded random cuts. Complete coverage of every (query, later source) pair costs
Theta(T) cuts of Theta(T) tokens whatever the method, so the report says what was covered
(`LeakageReport.coverage`).

`estimate` counts the tokens each method will run and times one probe forward to give an ETA,
printed before the audit starts when `progress=True`.
"""
from __future__ import annotations

import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from interp.analyses.leakage.adapter import ModelAdapter
from interp.analyses.leakage.floor import FLOAT64_SCALE, comparison_floor, decides, shape_of
from interp.analyses.leakage.methods import _change, _rows, _scale, truncation
from interp.analyses.leakage.types import NOISE_FACTOR, Finding
from interp.modelinfo import model_config
from interp.models.kv_cache import incremental_outputs, supports_incremental

SHORT_LEN = 64  # every prefix up to this length runs as a black box (also on native models: a check that trusts nothing)
INCREMENTAL_DETAIL = "incremental reference (KV cache): positions after query_pos removed"
REFERENCE_CHUNK = 16  # new positions per step of the reference (see the module docstring: exact for any chunk)
RANDOM_CUTS = 16  # seeded random cuts of a black box beyond SHORT_LEN
LONG_MAX_CUTS = 2  # perturbation cuts per length above SHORT_LEN once the incremental reference covers every cut
LONG_DRAWS = 1  # perturbation draws per cut there
GRADIENT_CUTS = 2  # cuts of the gradient at the audited length (`methods.gradient_at_cuts`), plain run only
SIDE_LEN = 256  # batch, padding and pattern checks run at most this long: their contracts do not depend on it


def perturbation_cuts(incremental: bool, length: int, max_cuts: int | None) -> int | None:
    """Cuts perturbed at `length`: all asked for, or a spot check of LONG_MAX_CUTS above SHORT_LEN on a model
    whose incremental reference (`incremental`: `supports_incremental`) already compares every cut."""
    if incremental and length > SHORT_LEN:
        return LONG_MAX_CUTS if max_cuts is None else min(max_cuts, LONG_MAX_CUTS)
    return max_cuts


def perturbation_draws(incremental: bool, length: int, draws: int) -> int:
    """Draws per cut at `length`: as asked, or LONG_DRAWS where the incremental reference covers every cut."""
    return min(draws, LONG_DRAWS) if incremental and length > SHORT_LEN else draws


# ---------------------------------------------------------------------------------------------
# Coverage: which cuts a black box's truncation runs
# ---------------------------------------------------------------------------------------------

BOUNDARY_FIELDS = ("window_size", "sliding_window", "attention_chunk_size", "chunk_size", "max_cache_len", "cache_size",
                   "local_window_size")  # config fields that declare a boundary in the sequence


def declared_boundaries(model: Any) -> dict[str, int]:
    """The sequence boundaries the model's config declares (a window, an attention chunk, a cache size), by field."""
    config = model_config(model)
    found: dict[str, int] = {}
    for holder in (config, getattr(model, "config", None)):
        for name in BOUNDARY_FIELDS:
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.setdefault(name, value)
    return found


def coverage_cuts(max_len: int, boundaries: dict[str, int], *, seed: int, random_cuts: int = RANDOM_CUTS,
                  short_len: int = SHORT_LEN) -> list[int]:
    """Prefix lengths a black box's truncation runs: every one up to `short_len`, then every power of two, each
    declared boundary and the lengths either side of it, and `random_cuts` seeded random lengths."""
    lengths = set(range(1, min(short_len, max_len - 1) + 1))
    lengths |= {2 ** k for k in range(1, max_len.bit_length())}
    for boundary in boundaries.values():
        lengths |= {boundary - 1, boundary, boundary + 1}
    beyond = [n for n in range(short_len + 1, max_len) if n not in lengths]
    if beyond:
        generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/coverage/{max_len}".encode()))
        pick = torch.randperm(len(beyond), generator=generator)[:random_cuts]
        lengths |= {beyond[int(i)] for i in pick}
    return sorted(n for n in lengths if 1 <= n < max_len)


# ---------------------------------------------------------------------------------------------
# The incremental reference
# ---------------------------------------------------------------------------------------------

@dataclass
class Reference:
    """The incremental reference of one audit's prompts: float32 hidden states, and float64 ones where the model
    can be cast (`floor.float64_copy`), computed once and compared with every full forward (each mask variant)."""

    outputs32: torch.Tensor  # (prompt, pos, d_model)
    outputs64: torch.Tensor | None = None
    floors: dict[bool, float] = field(default_factory=dict)  # ones_mask -> the comparison's float32 floor


def reference_outputs(model: Any, prompts: torch.Tensor, chunk: int = REFERENCE_CHUNK) -> torch.Tensor:
    """(prompt, pos, d_model) the incremental reference's final hidden states (float32, or float64 for a float64 model)."""
    steps = list(incremental_outputs(model, prompts, output="hidden", chunk=chunk))
    out = torch.cat(steps, dim=1)
    return out.to(torch.float64 if out.dtype == torch.float64 else torch.float32).cpu()


@torch.no_grad()
def incremental_rows(model: Any, adapter: ModelAdapter, prompts: torch.Tensor, tol: float, *,
                     reference: Reference | None = None, model64: Any = None, adapter64: ModelAdapter | None = None,
                     progress: Callable = lambda *a, **k: None) -> tuple[list[Finding], Reference]:
    """Truncation rows from the incremental reference vs the full forward (`adapter`), one per query; and the
    reference, to pass back for the next mask variant. With a float64 copy (`model64`, `adapter64`), the rows
    are judged against the measured floor, and in float64 where that floor calls for it (`floor.decides`)."""
    if reference is None:
        reference = Reference(reference_outputs(model, prompts),
                              None if model64 is None else reference_outputs(model64, prompts))
        progress(1, "incremental reference")
    full = adapter(prompts)  # (prompt, pos, d_model)
    scale = _scale(full)
    compared, against, threshold = reference.outputs32, full, tol
    if reference.outputs64 is not None and adapter64 is not None:
        full64 = (adapter64.with_ones_mask() if adapter.ones_mask else adapter64)(prompts)
        floor = comparison_floor(reference.outputs32[:, :-1], reference.outputs64[:, :-1], full[:, :-1], full64[:, :-1],
                                 scale=scale)
        reference.floors[adapter.ones_mask] = floor
        in_float64 = decides(floor)
        threshold = max(tol, NOISE_FACTOR * floor * (FLOAT64_SCALE if in_float64 else 1.0))
        if in_float64:
            compared, against = reference.outputs64, full64
    n_pos = prompts.shape[1]
    influence = _change(compared[:, :-1], against[:, :-1]).amax(dim=(0, 2))[None] / scale  # (1, query)
    queries = torch.arange(n_pos - 1)[None]
    rows = _rows("truncation", n_pos, influence, threshold, query=queries, source=queries + 1, detail=INCREMENTAL_DETAIL,
                 ones_mask=adapter.ones_mask)
    return rows, reference


def reference_label(prompts: torch.Tensor) -> str:
    """The floor's key of the reference comparison: "reference 2x256 | 2x256"."""
    return f"reference {shape_of(prompts)} | {shape_of(prompts)}"


def truncation_rows(model: Any, adapter: ModelAdapter, prompts: torch.Tensor, tol: float, *,
                    lengths: Sequence[int] | None = None, progress: Callable = lambda *a, **k: None) -> list[Finding]:
    """The audit's black-box truncation: the prefixes of `lengths` (default every one up to SHORT_LEN and the
    coverage cuts beyond, `coverage_cuts`) against the full length."""
    n_pos = prompts.shape[1]
    if lengths is None:
        lengths = coverage_cuts(n_pos, declared_boundaries(model), seed=0)
    return truncation(adapter, prompts, tol, progress=progress, lengths=lengths)


# ---------------------------------------------------------------------------------------------
# The cost estimate
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostEstimate:
    """Tokens each method runs through the model, and a time estimate from one probe forward."""

    tokens: dict[str, int]
    seconds_per_token: float
    incremental: bool

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def seconds(self) -> float:
        return self.total_tokens * self.seconds_per_token

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {count:,}" for name, count in self.tokens.items() if count)
        how = "incremental reference + short truncation" if self.incremental else "black-box truncation at the coverage cuts"
        return (f"leakage audit: about {self.total_tokens:,} tokens through the model ({parts}; {how}); "
                f"ETA about {_duration(self.seconds)}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


FLOAT64_COST = 2.0  # a float64 forward against a float32 one, on these CPUs (SmolLM2-135M: 1.2-1.6x; kept high)


def count_tokens(max_len: int, lengths: Sequence[int], n_prompts: int, methods: Sequence[str], *, draws: int,
                 max_cuts: int | None, gradient_len: int, incremental: bool, with_mask: bool, castable: bool = True,
                 prefix_lengths: Sequence[int] | None = None, gradient_cuts: int = 0) -> dict[str, int]:
    """Tokens per method, in float32-forward equivalents (a backward counted as two forwards, a float64 forward as
    FLOAT64_COST). "floor": the float64 runs that measure the floors (their float32 runs serve the methods too);
    without a float64 copy, the runs one row at a time of the batch-composition floor."""
    variants = 2 if with_mask else 1
    f64 = FLOAT64_COST if castable else 0.0
    side = min(max_len, SIDE_LEN)
    tokens: dict[str, float] = {"floor": 0, "truncation": 0, "perturbation": 0, "gradient": 0, "batch": 0, "padding": 0}
    floor_runs = 0  # tokens of the runs whose floors are measured (`stages.comparisons`)
    if "truncation" in methods:
        short = range(1, min(SHORT_LEN, max_len - 1) + 1) if incremental else (prefix_lengths or range(1, max_len))
        tokens["truncation"] = n_prompts * sum(short) + (n_prompts * max_len * (1 + f64) if incremental else 0)
        floor_runs += n_prompts * (max_len + (max_len + 1) // 2 + (max_len - 1 if max_len <= SIDE_LEN else 0))
    if "perturbation" in methods:
        for length in lengths:
            long = incremental and length > SHORT_LEN
            cuts = LONG_MAX_CUTS if long else max_cuts
            cuts = length - 1 if cuts is None else min(length - 1, cuts)
            # a long length on a native model: the plain run only (the reference covers the mask variant's cuts)
            tokens["perturbation"] += n_prompts * length * (cuts * (LONG_DRAWS if long else draws) + 1) / (variants if long else 1)
            floor_runs += n_prompts * length
    if "gradient" in methods:
        length = min(gradient_len, max_len)
        tokens["gradient"] = 3 * length * (length - 1) + 3 * max_len * gradient_cuts / variants  # cuts: plain run only
    if "batch" in methods:
        tokens["batch"] = 4 * n_prompts * side
        floor_runs += (n_prompts + 1) * side
    if "padding" in methods:
        tokens["padding"] = 5 * n_prompts * side
        floor_runs += 3 * n_prompts * side
    tokens["floor"] = floor_runs * f64 if castable else floor_runs
    variant_scaled = {"truncation", "perturbation", "gradient"}
    return {name: int(count * (variants if name in variant_scaled else 1)) for name, count in tokens.items()}


@torch.no_grad()  # a graph for the backward would hold every activation (3 GB for SmolLM2-135M at 2,048 tokens)
def probe_seconds_per_token(adapter: ModelAdapter, vocab: int, length: int) -> float:
    """Seconds per token of one forward of `length` random tokens (after a warm-up call)."""
    tokens = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    adapter(tokens[:, : min(length, 8)], check_finite=False)
    start = time.perf_counter()
    adapter(tokens, check_finite=False)
    return (time.perf_counter() - start) / length


def estimate(model: Any, adapter: ModelAdapter, *, max_len: int, vocab: int, lengths: Sequence[int], n_prompts: int,
             methods: Sequence[str], draws: int, max_cuts: int | None, gradient_len: int,
             prefix_lengths: Sequence[int] | None = None, gradient_cuts: int = 0, castable: bool = True) -> CostEstimate:
    """The audit's cost before it runs (see `CostEstimate`); the probe costs one forward of max_len tokens."""
    incremental = supports_incremental(model)
    tokens = count_tokens(max_len, lengths, n_prompts, methods, draws=draws, max_cuts=max_cuts, gradient_len=gradient_len,
                          incremental=incremental, with_mask=adapter.takes_mask, castable=castable,
                          prefix_lengths=prefix_lengths, gradient_cuts=gradient_cuts)
    return CostEstimate(tokens, probe_seconds_per_token(adapter, vocab, max_len), incremental)


def announce(model: Any, adapter: ModelAdapter, **kwargs: Any) -> CostEstimate | None:
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

