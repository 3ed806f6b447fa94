"""Known answers for the contracts' verdict rule and measures."""
from __future__ import annotations

import math

import pytest
import torch

from interp.analyses.leakage.contracts.common import ContractFinding, change, judged, threshold


def test_threshold_is_the_floor_times_100_and_at_least_sqrt_eps():
    assert threshold("float64", 0.0) == torch.finfo(torch.float64).eps ** 0.5
    assert threshold("float64", 1e-6) == pytest.approx(1e-4)
    assert threshold("float32", 0.0) == torch.finfo(torch.float32).eps ** 0.5


def test_judged_keeps_changes_above_and_missing_dependences_at_or_below_the_threshold():
    findings = [ContractFinding("document", "default", 5, 0, 0.5), ContractFinding("document", "default", 6, 0, 1e-12),
                ContractFinding("over-masked", "default", 13, 9, 0.0), ContractFinding("over-masked", "default", 14, 9, 0.3)]
    result = judged("document", findings, {"default": 0.5}, floor=0.0, dtype="float64")
    assert result.status == "leak" and result.found == ("document", "over-masked")
    assert [(f.query, f.kind) for f in result.findings] == [(5, "document"), (13, "over-masked")]
    assert result.worst().kind == "document"
    clean = judged("window", [], {"length 3": 0.0}, floor=0.0, dtype="float64")
    assert clean.status == "exact zero" and clean.to_dict()["origin"] is None
    assert judged("window", [], {"x": 0.0}, floor=0.0, dtype="float64", applicable=False).status == "not applicable"


def test_change_counts_nan_as_infinite():
    a = torch.tensor([[1.0, 2.0]])
    assert change(a, torch.tensor([[1.0, float("nan")]]), 1.0).item() == math.inf
    assert change(a, a + 0.5, 2.0).item() == 0.25
