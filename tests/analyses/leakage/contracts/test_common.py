"""Known answers for the contracts' verdict rule and measures."""
from __future__ import annotations

import math

import pytest
import torch

from interp.analyses.leakage.contracts.common import (
    ContractFinding,
    announce_cost,
    change,
    judged,
    scaled,
    threshold,
    timed,
)


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


def test_the_cost_line_carries_an_eta_where_a_forward_was_timed(capsys):
    announce_cost("window", "2 prompts", True, eta=lambda: 125.0)
    announce_cost("window", "2 prompts", True, eta=lambda: 0.2)
    announce_cost("window", "2 prompts", True, eta=lambda: None)  # the timed forward failed: no ETA, the mode says why
    announce_cost("window", "2 prompts", False, eta=lambda: 1 / 0)  # not printing: nothing is timed
    assert capsys.readouterr().err.splitlines() == [
        "window contract: 2 prompts; ETA about 2 min (from a timed forward, before localisation)",
        "window contract: 2 prompts; ETA under 1 s (from a timed forward, before localisation)",
        "window contract: 2 prompts"]


def test_timed_and_scaled():
    assert timed(lambda: 1 / 0) is None and scaled(None, 3.0) is None
    seconds = timed(lambda: torch.ones(3).sum())
    assert seconds is not None and seconds >= 0 and scaled(seconds, 2.0) == 2 * seconds


def test_kv_findings_say_which_position_of_which_call_moved():
    prefill = ContractFinding("kv_cache", "prefix 5, chunk 1", 0, None, 0.166, call=0, positions=(0, 5))
    alone = ContractFinding("kv_cache", "prefix 1, chunk 1", 1, None, 0.259, call=1, positions=(1, 2))
    chunk = ContractFinding("future", "sdpa: prefix 5, chunk 3", 6, 7, 0.1, call=1, positions=(5, 8))
    assert prefill.words() == "kv_cache at position 0, token 1 of 5 in the prefill (positions 0..4) (prefix 5, chunk 1, 0.166)"
    assert alone.words() == "kv_cache at position 1, decoded alone in call 1 after a prefill of 1 (prefix 1, chunk 1, 0.259)"
    assert chunk.words() == ("future at position 6, token 2 of 3 in decode call 1 (positions 5..7) after a prefill of 5, "
                             "moved by position 7 later in the same call (sdpa: prefix 5, chunk 3, 0.1)")


def test_each_mode_prints_its_cost_with_an_eta_before_it_starts(capsys):
    from leakzoo import backends  # tests/ is on sys.path (tests/conftest.py)

    from interp.analyses.leakage.contracts import run_contracts

    run_contracts(backends.hf_switchable_window(), vocab=64, windowed=True, attn_impls=("eager", "sdpa"), progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" contract: ")[0] for line in lines] == ["window", "backend", "window", "window"]  # then each impl
    assert all(line.endswith("(from a timed forward, before localisation)") and "; ETA " in line for line in lines)
