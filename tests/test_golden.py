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


@pytest.mark.parametrize("name", ["heads.csv", "claims.csv", "redundancy.csv"])
def test_report_table_matches_golden(tables, tmp_path, name):
    golden = pd.read_csv(GOLDEN / name)
    fresh = _round_trip(tables[name], tmp_path, name)
    assert list(fresh.columns) == list(golden.columns), "columns changed: regenerate on purpose and list them in CHANGELOG.md"
    assert len(fresh) == len(golden)
    for column in golden.columns:
        want, got = golden[column], fresh[column]
        if pd.api.types.is_numeric_dtype(want) and pd.api.types.is_numeric_dtype(got):
            np.testing.assert_allclose(got.to_numpy(float), want.to_numpy(float), rtol=1e-6, atol=1e-9, equal_nan=True,
                                       err_msg=f"{name}:{column}")
        else:
            assert got.fillna("").astype(str).tolist() == want.fillna("").astype(str).tolist(), f"{name}:{column}"


def test_golden_comparison_can_fail(tables, tmp_path):
    """A number moved by 1e-5 relative is caught."""
    golden = pd.read_csv(GOLDEN / "heads.csv")
    moved = golden.copy()
    column = next(c for c in golden.columns if c not in ("layer", "head") and pd.api.types.is_float_dtype(golden[c]))
    moved[column] = moved[column] * (1 + 1e-5) + 1e-8
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(moved[column].to_numpy(float), golden[column].to_numpy(float), rtol=1e-6, atol=1e-9)
