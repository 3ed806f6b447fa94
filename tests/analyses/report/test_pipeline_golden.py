"""The toy-induction report's tables against committed golden files: refactors must not move a number.

Numbers agree within `TOLERANCE` of each column's largest magnitude (absolute 1e-9 for an all-zero
column), verdicts and every text column exactly. The tolerance is measured, not guessed: the slow
`test_golden_tables_spread_across_configurations` reruns the tables under 1 and 2 threads, two batch
sizes, two prompt orders and another CPU's kernels, and the spread it found is `MEASURED_SPREAD`.
Regenerate on purpose only: `python tests/golden/make_golden.py`.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)


@pytest.fixture(scope="module")
def tables():
    return make_golden.report_tables()


def _round_trip(frame: pd.DataFrame, tmp_path: Path, name: str) -> pd.DataFrame:
    """The frame as the CSV reader sees it, so dtypes match the golden file's."""
    path = tmp_path / name
    frame.to_csv(path, index=False, float_format="%.17g")
    return pd.read_csv(path)


# The largest difference between the golden tables computed under the configurations of
# `CONFIGURATIONS` (below), as a fraction of the column's largest magnitude: 2.3e-7, measured on an
# AMD EPYC (AVX2, torch 2.13 with MKL), in claims.csv sufficiency_ci_high; the same run on its generic
# kernels reproduces the failure of issue 24 #18 (necessity 8.1e-8 apart, 1.96e-6 of its own value).
# Threads, batch sizes and prompt order moved no number by a single bit on that machine: the kernels
# (vector width, blocking of the float32 reductions) are what differs from one CPU to the next.
# Re-measured after issue #20 (studentized intervals, knockout evidence): 5.87e-7, under "other CPU
# kernels" (the slow test below, run once on this machine; the column was not recorded).
# Re-measured for issue #36 on an AMD EPYC with AVX-512 (2 cores, load average about 7 from other jobs):
# 5.8709e-7 = 5.87e-7 again, under "other CPU kernels" in claims.csv sufficiency_ci_low; every other
# configuration and column below it (the slow test passed, 1,499 s: `PYTHONPATH=$PWD OMP_NUM_THREADS=1
# python -m pytest tests/test_golden.py -s -k spread_across` prints the worst spread and where).
MEASURED_SPREAD = 5.9e-7
# Factor 10 for CPUs whose kernels differ more than the two measured (AVX-512, ARM NEON); it leaves the
# comparison tighter than a 1e-5 relative move, which must fail (the can-fail test below).
FACTOR = 10
TOLERANCE = MEASURED_SPREAD * FACTOR  # of the column's largest magnitude
ATOL = 1e-9  # for a column of zeros


def numeric_spread(fresh: pd.Series, golden: pd.Series) -> float:
    """Largest |fresh - golden| as a fraction of the golden column's largest magnitude (inf if NaNs differ).

    Why the column's scale and not each value's own: a float32 reduction errs by a few ulps of the
    terms it sums, so a value that is a small difference of large ones (a necessity near zero, an
    interaction) carries the error of its terms, not of itself."""
    got, want = fresh.to_numpy(float), golden.to_numpy(float)
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("inf")
    if np.isnan(want).all():
        return 0.0
    scale = float(np.nanmax(np.abs(want)))
    error = float(np.nanmax(np.abs(got - want)))
    return error / scale if scale > 0 else (0.0 if error <= ATOL else float("inf"))


def assert_matches_golden(fresh: pd.DataFrame, golden: pd.DataFrame, name: str, skip: tuple[str, ...] = ()) -> None:
    """Same columns and rows; numbers within TOLERANCE of the column's scale, text exactly (`skip`: not compared)."""
    assert list(fresh.columns) == list(golden.columns), "columns changed: regenerate on purpose and list them in CHANGELOG.md"
    assert len(fresh) == len(golden)
    for column in golden.columns:
        want, got = golden[column], fresh[column]
        if column in skip:
            continue
        if pd.api.types.is_numeric_dtype(want) and pd.api.types.is_numeric_dtype(got):
            spread = numeric_spread(got, want)
            assert spread <= TOLERANCE, (f"{name}:{column} moved by {spread:.3g} of the column's largest magnitude "
                                         f"(tolerance {TOLERANCE:.3g}); at rows {_moved_rows(got, want)}")
        else:
            assert got.fillna("").astype(str).tolist() == want.fillna("").astype(str).tolist(), f"{name}:{column}"


def _moved_rows(got: pd.Series, want: pd.Series) -> list[int]:
    moved = ~np.isclose(got.to_numpy(float), want.to_numpy(float), rtol=0, atol=0, equal_nan=True)
    return [int(i) for i in np.flatnonzero(moved)[:5]]


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["heads.csv", "claims.csv", "redundancy.csv"])
def test_report_table_matches_golden(tables, tmp_path, name):
    assert_matches_golden(_round_trip(tables[name], tmp_path, name), pd.read_csv(GOLDEN / name), name)


def test_golden_comparison_catches_a_moved_number_and_a_changed_reason():
    """A number moved by 1e-5 relative, or one word of a reason, fails the comparison."""
    golden = pd.read_csv(GOLDEN / "heads.csv")
    moved = golden.copy()
    column = next(c for c in golden.columns if c not in ("layer", "head") and pd.api.types.is_float_dtype(golden[c]))
    moved[column] = moved[column] * (1 + 1e-5) + 1e-8
    with pytest.raises(AssertionError):
        assert_matches_golden(moved, golden, "heads.csv")
    claims = pd.read_csv(GOLDEN / "claims.csv")
    reworded = claims.copy()
    reworded.loc[0, "reasons"] = str(reworded.loc[0, "reasons"]) + " (reworded)"
    with pytest.raises(AssertionError):
        assert_matches_golden(reworded, claims, "claims.csv")
    assert_matches_golden(claims.copy(), claims, "claims.csv")  # and an unchanged table passes
    largest = claims["necessity"].abs().idxmax()  # one number at the column's scale moved by 1e-5 of itself
    one_moved = claims.copy()
    one_moved.loc[largest, "necessity"] *= 1 + 1e-5
    with pytest.raises(AssertionError, match="necessity moved by"):
        assert_matches_golden(one_moved, claims, "claims.csv")


def test_golden_comparison_accepts_another_cpus_rounding():
    """Issue 24 #18: on another CPU one necessity came out 8.1e-8 (1.96e-6 of itself) from the golden
    value and failed rtol=1e-6; that is float32 rounding of terms of a few nats, far below the column's
    scale. The same move (2e-6 of the smallest necessity) must pass the scale-relative comparison."""
    claims = pd.read_csv(GOLDEN / "claims.csv")
    other = claims.copy()
    small = claims["necessity"].abs().idxmin()
    move = 2e-6 * abs(claims.loc[small, "necessity"])
    other.loc[small, "necessity"] += move
    assert move / abs(claims.loc[small, "necessity"]) > 1e-6  # what the old relative tolerance refused
    assert_matches_golden(other, claims, "claims.csv")


# ---------------------------------------------------------------------------------------------
# the spread across configurations that justifies TOLERANCE

# another CPU's kernels, emulated on this one: ATen's generic (non-vector) kernels and MKL's SSE4.2 path
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
# name -> (torch threads, batch size of every analysis (0: each one's default), prompt order, extra environment)
CONFIGURATIONS = {
    "two threads": (2, 0, "given", {}),
    "batch size 7": (1, 7, "given", {}),
    "prompts reversed": (1, 0, "reversed", {}),
    "other CPU kernels": (1, 0, "given", OTHER_CPU),
    "all four": (2, 7, "reversed", OTHER_CPU),
}
# what each variation may change by design, so is not compared: the faithfulness columns depended on
# the batch size until issue #20 (a permuted control drawn per batch); that control is gone, but the
# spread across batch sizes was not re-measured since, so they stay excluded here; another prompt order resamples other prompts in every bootstrap and permutation test
# (intervals, p-values, hence which claims the scan proposes), so only the heads' point estimates compare
# (not their intervals, nor the claims they hold)
FAITHFULNESS = ("faithfulness", "faithfulness_ci_low", "faithfulness_ci_high", "faithfulness_passed", "reasons")

_RUNNER = r"""
import sys
from pathlib import Path
import torch
threads, batch, order, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
torch.set_num_threads(threads)
from interp import data, distributed
if batch:  # every analysis batches through these two
    plain, sharded = data.PromptSet.batches, distributed.Shard.batches
    data.PromptSet.batches = lambda self, size: plain(self, batch)
    distributed.Shard.batches = lambda self, size: sharded(self, batch)
import interp
from interp.analyses import report
from interp.analyses.report.build import _claims_csv
from interp.specs import build_prompts
model = interp.load("toy-induction")
prompts = build_prompts(model, report.default_prompt_spec(model, 0), default_n=report.DEFAULT_N)
if order == "reversed":
    prompts = prompts[torch.arange(len(prompts) - 1, -1, -1)]
computed = report.compute(model, spec="toy-induction", seed=0, prompts=prompts)
tables = {"heads.csv": computed.heads, "claims.csv": _claims_csv(computed.claims), "redundancy.csv": computed.redundancy}
for name, frame in tables.items():
    frame.to_csv(out / name, index=False, float_format="%.17g")
"""


def _tables_under(name: str, tmp_path: Path) -> dict[str, pd.DataFrame]:
    threads, batch, order, extra = CONFIGURATIONS[name]
    out = tmp_path / name.replace(" ", "_")
    out.mkdir()
    root = GOLDEN.parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": str(threads), **extra}
    # a hang guard, not a speed test: one configuration took about 300 s on 2 busy cores (load 7), so 900 s
    # left a busier machine little room; an hour still ends a configuration that hangs
    done = subprocess.run([sys.executable, "-c", _RUNNER, str(threads), str(batch), order, str(out)], cwd=root,
                          capture_output=True, text=True, timeout=3600, env=env)
    assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
    return {table: pd.read_csv(out / table) for table in ("heads.csv", "claims.csv", "redundancy.csv")}


def _compared(name: str, table: str, golden: pd.DataFrame) -> tuple[str, ...]:
    """The columns of `table` that configuration `name` must leave unchanged."""
    _, batch, order, _ = CONFIGURATIONS[name]
    if order == "reversed":
        if table != "heads.csv":
            return ()
        return tuple(c for c in golden.columns if "_ci_" not in c and not c.startswith("claims_"))
    return tuple(c for c in golden.columns if not (batch and table == "claims.csv" and c in FAITHFULNESS))


@pytest.mark.slow
def test_golden_tables_spread_across_configurations(tmp_path):
    """Every configuration matches the golden files within TOLERANCE, and the spread is still the stated one."""
    spreads: dict[str, float] = {}
    for name in CONFIGURATIONS:
        fresh = _tables_under(name, tmp_path)
        for table, frame in fresh.items():
            golden = pd.read_csv(GOLDEN / table)
            columns = _compared(name, table, golden)
            if not columns:
                continue
            skip = tuple(c for c in golden.columns if c not in columns)
            assert_matches_golden(frame, golden, f"{name}: {table}", skip=skip)
            for column in columns:
                if pd.api.types.is_numeric_dtype(golden[column]):
                    spreads[f"{name}: {table}:{column}"] = numeric_spread(frame[column], golden[column])
    worst = max(spreads, key=spreads.__getitem__)
    print(json.dumps({"measured_spread": spreads[worst], "where": worst}))
    assert spreads[worst] <= 2 * MEASURED_SPREAD, (
        f"the spread grew to {spreads[worst]:.3g} ({worst}) from the stated {MEASURED_SPREAD:.3g}: "
        "find what made the tables less reproducible, or re-measure and restate MEASURED_SPREAD and its reason")
