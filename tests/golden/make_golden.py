"""Regenerate the golden report tables: `python tests/golden/make_golden.py` (commit the result).

Only on purpose: a change that alters what the report computes (a new column, another behaviour,
other random streams) regenerates them and lists the changed columns in CHANGELOG.md.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

GOLDEN = Path(__file__).resolve().parent
MODEL = "toy-induction"


def report_tables() -> dict[str, pd.DataFrame]:
    """heads.csv, claims.csv and redundancy.csv of `interp report toy-induction` with the default seed, as frames."""
    import interp
    from interp.analyses import report
    from interp.analyses.report.build import _claims_csv

    data = report.compute(interp.load(MODEL), spec=MODEL, seed=0)
    return {"heads.csv": data.heads, "claims.csv": _claims_csv(data.claims), "redundancy.csv": data.redundancy}


def main() -> None:
    for name, frame in report_tables().items():
        frame.to_csv(GOLDEN / name, index=False, float_format="%.17g")
        print(f"wrote {GOLDEN / name}: {frame.shape[0]} rows x {frame.shape[1]} columns")


if __name__ == "__main__":
    main()
