"""The device benchmark suite (benchmarks/suite.py) on the CPU at its tiny shape: every section runs and
writes its JSON as it ends; a failing or slow section is recorded and the others still run."""
from __future__ import annotations

import json
import time

import pytest
import torch

from benchmarks import suite
from interp.errors import BadInput


@pytest.mark.heavy
def test_dry_run_executes_every_section_and_writes_as_it_goes(tmp_path):
    index = suite.run_suite("cpu", tmp_path, dry_run=True, limit_s=300)
    assert list(index["sections"]) == list(suite.SECTIONS)
    assert {row["status"] for row in index["sections"].values()} == {"ok"}
    assert json.loads((tmp_path / "suite.json").read_text())["sections"] == index["sections"]
    forward = json.loads((tmp_path / "forward.json").read_text())
    for dtype in ("float32", "bfloat16"):
        labels = {row["comparison"]: row for row in forward[dtype]["ratios"]}
        assert labels["HookedGPT attention cache / no hooks"]["target"] == 1.15
        assert labels["HookedGPT / bridge, attention cache"]["ratio"] > 0  # the bridge ran (transformer-lens here)
        assert all(row["tokens_per_s"] > 0 for row in forward[dtype]["rows"].values())
    importance = json.loads((tmp_path / "importance.json").read_text())
    assert importance["float32"]["max_abs_difference"]["resumed"] < 1e-4  # the three ways agree
    scaling = json.loads((tmp_path / "scaling.json").read_text())
    assert scaling["backend"] == "gloo" and scaling["equal_to_one_process"] and not scaling["measured_on_gpus"]
    leakage = json.loads((tmp_path / "leakage.json").read_text())
    assert leakage["float32"]["tokens"] == suite.DRY.leak_len


def test_a_failing_or_slow_section_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("boom")

    def slow(ctx):
        time.sleep(5)
        return {}

    monkeypatch.setitem(suite.RUNNERS, "forward", broken)
    monkeypatch.setitem(suite.RUNNERS, "positional", slow)
    index = suite.run_suite("cpu", tmp_path, dry_run=True, limit_s=0.5, sections=("forward", "positional"))
    assert index["sections"]["forward"]["status"] == "failed"
    assert "boom" in json.loads((tmp_path / "forward.json").read_text())["error"]
    assert index["sections"]["positional"]["status"] == "timed out"
    assert index["sections"]["positional"]["seconds"] < 4


def test_bad_device_or_section_is_refused(tmp_path):
    with pytest.raises(BadInput, match="unknown benchmark section"):
        suite.run_suite("cpu", tmp_path, dry_run=True, sections=("forwards",))
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match="CUDA is not available"):
            suite.run_suite("cuda", tmp_path)


def test_main_exit_code_says_whether_every_section_was_ok(tmp_path, monkeypatch):
    monkeypatch.setitem(suite.RUNNERS, "leakage", lambda ctx: {})
    assert suite.main(["--device", "cpu", "--dry-run", "--out", str(tmp_path), "--sections", "leakage"]) == 0
    monkeypatch.setitem(suite.RUNNERS, "leakage", lambda ctx: 1 / 0)
    assert suite.main(["--device", "cpu", "--dry-run", "--out", str(tmp_path), "--sections", "leakage"]) == 1
