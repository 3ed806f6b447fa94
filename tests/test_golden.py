"""The toy-induction report's tables against committed golden files: refactors must not move a number.

Numbers agree within 1e-6 relative (absolute 1e-9 near zero), verdicts and every text column exactly.
Regenerate on purpose only: `python tests/golden/make_golden.py`.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
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


def assert_matches_golden(fresh: pd.DataFrame, golden: pd.DataFrame, name: str) -> None:
    """Same columns and rows; numbers within 1e-6 relative (1e-9 absolute), text exactly."""
    assert list(fresh.columns) == list(golden.columns), "columns changed: regenerate on purpose and list them in CHANGELOG.md"
    assert len(fresh) == len(golden)
    for column in golden.columns:
        want, got = golden[column], fresh[column]
        if pd.api.types.is_numeric_dtype(want) and pd.api.types.is_numeric_dtype(got):
            np.testing.assert_allclose(got.to_numpy(float), want.to_numpy(float), rtol=1e-6, atol=1e-9, equal_nan=True,
                                       err_msg=f"{name}:{column}")
        else:
            assert got.fillna("").astype(str).tolist() == want.fillna("").astype(str).tolist(), f"{name}:{column}"


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
