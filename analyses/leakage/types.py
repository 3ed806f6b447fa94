"""The leakage audit's vocabulary: methods, verdicts, leak kinds, the row type and the thresholds.

The bottom layer of the audit (it imports nothing of it): `methods` (the black-box methods
and localisation) and `fast` (the incremental reference) build `Finding` rows from it; `report`
(`LeakageReport`) and `stages` (`audit`) sit on top. Every public name here is re-exported by
`interp.analyses.leakage`, where users find them.
"""
from __future__ import annotations

import math
from typing import Any, Literal, TypedDict, get_args

import pandas as pd
import torch

from interp.errors import BadInput
from interp.models.zoo import LeakKind  # defined where the zoo plants them (models/ imports nothing above it)

Method = Literal["truncation", "perturbation", "gradient", "pattern", "batch", "padding"]
METHODS: tuple[str, ...] = get_args(Method)
LeakVerdict = Literal["exact_zero", "numerical_noise", "leak", "bidirectional"]  # wording: report.VERDICT_WORDS
VERDICTS: tuple[str, ...] = get_args(LeakVerdict)
LEAK_KINDS: tuple[str, ...] = get_args(LeakKind)
METHOD_KIND: dict[str, str] = {
    "truncation": "future", "perturbation": "future", "gradient": "future", "pattern": "future",
    "batch": "batch", "padding": "padding",
}
TRUSTED = ("truncation", "perturbation", "gradient", "batch", "padding")  # "pattern" never decides alone
FUTURE_METHODS = ("truncation", "perturbation", "gradient")  # the trusted methods that can show a future leak
MAX_ROWS_PER_METHOD = 200
DEFAULT_MAX_LEN = 256  # the audited length without max_len: min(the model's context, this); max_len="ctx" for the context
DEFAULT_TOL = 5e-5  # float32: rounding measured <= 2.8e-5 (toy-induction, 128 tokens), the smallest planted leak >= 9.96e-5
SPREAD_FLOOR = 1e-2  # the scale is the outputs' spread, but at least this fraction of their RMS
GRADIENT_TOL_FACTOR = 0.1  # the gradient is exactly zero for a correct model (rounding measured <= 2.1e-8): it
# counts a leak above tol * 0.1 (its unit is one source position's Jacobian; the 1e-4 planted leak measures >= 3.4e-5)
HALF_PRECISION_TOL = 5e-3  # float16 / bfloat16 weights: below this a same-length change may be rounding (bf16's
# unit roundoff is 3.9e-3); every comparison is also judged against a noise floor measured on the model itself
# (`floor.measure_floors`) times NOISE_FACTOR
NOISE_FACTOR = 3.0  # a change counts a leak above this multiple of the model's measured rounding (`floor`)
MAX_TOL = 1e-2  # float32: a tol above 1% of the output scale would call real leaks rounding
MAX_TOL_HALF = 5e-2  # float16 / bfloat16: the default is 2e-2, so the bound sits above it
LOCALISE_FRACTION = 0.1  # a site carries the leak when it moves by more than this fraction of the leak's own size
PATTERN_TOL = 1e-6  # attention weight on a masked key is exactly 0; anything above this is weight on a later key


class Finding(TypedDict):
    """One row of `LeakageReport.table`: a measured dependence of the output at `query_pos`.

    `source_pos`: the first changed position for cut-based methods (every later one changed too),
    the exact source for the gradient and the pattern, None for batch and padding rows.
    `ones_mask`: the run passed an all-ones attention_mask where the call gave none (a model
    taking a mask is audited both ways: a fast path may drop the causal mask when handed one).
    """

    method: str
    site: str
    length: int
    query_pos: int
    source_pos: int | None
    influence: float
    detail: str
    ones_mask: bool
    threshold: float  # the influence above which this row counts a leak (its method's tol, or a measured noise floor)


TABLE_COLUMNS: list[str] = list(Finding.__annotations__)
SITE_COLUMNS = ["kind", "order", "site", "influence", "query_pos", "leaks"]  # LeakageReport.sites


class Pair(TypedDict, total=False):
    """Two runs that differ only where a leak may enter (localisation): `tokens_a`, `tokens_b`
    (rows, pos), an optional attention `mask`, the observed `row` and `observe` positions (bool, pos);
    `influence`: the largest change the pair showed at the output, where it is known."""

    tokens_a: torch.Tensor
    tokens_b: torch.Tensor
    mask: torch.Tensor
    row: int
    observe: torch.Tensor
    influence: float


def empty_table() -> pd.DataFrame:
    """A findings table with no rows and the typed columns."""
    return findings_table([])


def findings_table(rows: list[Finding]) -> pd.DataFrame:
    """`rows` as the report's table: TABLE_COLUMNS, `source_pos` a nullable integer, `ones_mask` a bool, and a
    `threshold` per row (a row built without one gets its method's float32 default)."""
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["source_pos"] = table["source_pos"].astype("Int64")
    table["ones_mask"] = table["ones_mask"].fillna(False).astype(bool)
    default = table["method"].map(lambda method: method_tol(method, DEFAULT_TOL))  # rows built by hand
    table["threshold"] = table["threshold"].astype(float).fillna(default.astype(float))
    return table


def method_tol(method: str, tol: float) -> float:
    """The influence above which `method` counts a leak: tol, or tol * GRADIENT_TOL_FACTOR for the gradient.

    The pattern check's unit is an attention weight, not an output change: a masked key gets
    exactly 0, so any weight above PATTERN_TOL is weight on a later key, whatever `tol` says.
    """
    if method == "pattern":
        return PATTERN_TOL
    return tol * GRADIENT_TOL_FACTOR if method == "gradient" else tol


def above_threshold(table: pd.DataFrame, tol: float | None = None) -> pd.Series:
    """Rows whose influence is above their own threshold (the one their method was judged by; `tol` is unused,
    kept for callers that pass the report's)."""
    return table["influence"] > table["threshold"]


def check_tol(tol: Any, dtype: torch.dtype = torch.float32) -> float:
    """`tol` as a float, or a BadInput: it must be finite, positive and small enough to see a leak.

    A tolerance above MAX_TOL (MAX_TOL_HALF for float16 / bfloat16 models) would call real
    leaks rounding: `--tol inf` must not turn an unmasked model into "causal".
    """
    limit = MAX_TOL_HALF if dtype in (torch.float16, torch.bfloat16) else MAX_TOL
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or not 0 < tol <= limit:
        raise BadInput(
            f"tol={tol!r} must be a finite number in (0, {limit:g}]: an influence relative to the output scale below "
            f"which a change counts as float rounding. Rounding measures <= 3e-5 in float32 (default {DEFAULT_TOL:g}, "
            f"{HALF_PRECISION_TOL:g} for half precision); a larger tol would call real leaks rounding."
        )
    return float(tol)
