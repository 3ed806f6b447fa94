"""The leakage audit's typed results and stages: the all-ones-mask run is a column, the verdict's
wording lives in interp.analyses.leakage.report once, every renderer reads the object, and the
layers do not cycle."""
import ast
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp.analyses import leakage
from interp.analyses.leakage import (
    TABLE_COLUMNS,
    VERDICT_WORDS,
    AuditPlan,
    LeakageReport,
    Localisation,
    ModelAdapter,
    audit,
    decide_leaks,
    findings_table,
    leak_kinds,
    locate_leaks,
    plan_audit,
    run_methods,
)
from interp.models.zoo import build
from interp.testing import assert_causal

ROOT = Path(__file__).resolve().parents[3]


def _finding(method="truncation", influence=0.0, *, ones_mask=False, query=1, source=2, length=5):
    return {"method": method, "site": "output", "length": length, "query_pos": query, "source_pos": source,
            "influence": influence, "detail": "planted", "ones_mask": ones_mask}


def _report(verdict="leak", leaks=("future",), rows=(), **kwargs) -> LeakageReport:
    return LeakageReport(model_name="planted", verdict=verdict, max_influence=kwargs.pop("max_influence", 0.5),
                         first_leaking_site=kwargs.pop("first", "blocks.0.mixer" if leaks else None), leaks=leaks,
                         table=findings_table(list(rows)), methods=("truncation",), **kwargs)


# --------------------------------------------------------------------------- the all-ones mask is a column


def test_the_all_ones_mask_run_is_a_boolean_column_with_the_right_value():
    report = audit(build("mask_fast_path", 0), methods=("truncation",), n_prompts=1, localise_leaks=False)
    table = report.table
    assert list(table.columns) == TABLE_COLUMNS and table["ones_mask"].dtype == bool
    leaking = table[table["influence"] > report.tol]
    assert len(leaking) and leaking["ones_mask"].all()  # the fast path leaks only when handed a mask
    plain = table[~table["ones_mask"]]
    assert len(plain) and plain["influence"].max() <= report.tol  # the plain run was made, and is causal
    assert report.ones_mask_only
    assert not table["detail"].str.contains("attention_mask all ones").any()  # no suffix on the free text
    rows = report.to_dict()["table"]
    assert {row["ones_mask"] for row in rows} == {True, False} and all(type(row["ones_mask"]) is bool for row in rows)


def test_a_model_without_a_mask_argument_has_only_plain_runs():
    report = audit(lambda tokens: build("masked_fill", 0)(tokens), max_len=8, vocab_size=13, n_prompts=1)
    assert report.causal and not report.table["ones_mask"].any() and not report.ones_mask_only


def test_findings_table_types_its_columns_even_when_empty():
    empty = findings_table([])
    assert list(empty.columns) == TABLE_COLUMNS and empty["ones_mask"].dtype == bool
    table = findings_table([_finding(source=None), _finding(ones_mask=True)])
    assert str(table["source_pos"].dtype) == "Int64" and table["ones_mask"].tolist() == [False, True]


# --------------------------------------------------------------------------- one wording, every renderer


@pytest.mark.parametrize("verdict, leaks, expected", [
    ("exact_zero", (), "causal: no output moved at all"),
    ("numerical_noise", (), "causal: outputs moved by float rounding only (<= tol 5e-05)"),
    ("leak", ("future", "batch"), "LEAK (future, batch)"),
    ("bidirectional", (), VERDICT_WORDS["bidirectional"]),
    ("bidirectional", ("padding",), VERDICT_WORDS["bidirectional"] + "; LEAK (padding)"),
])
def test_headline_and_tone(verdict, leaks, expected):
    report = _report(verdict, leaks)
    assert report.headline == expected and report.title == f"Leakage audit of planted: {expected}"
    assert str(report).splitlines()[0] == report.title
    assert report.tone == ("leak" if leaks else "neutral" if verdict == "bidirectional" else "ok")


def test_cli_json_text_and_html_render_the_one_wording(monkeypatch):
    """Change the wording in interp.analyses.leakage.report: the CLI table, str(), the JSON and the HTML report follow."""
    from rich.console import Console

    from interp.analyses.report import html as report_html
    from interp.analyses.report.findings import _leakage_finding
    from interp.cli.audit import _verdict_table

    monkeypatch.setitem(VERDICT_WORDS, "leak", "PLANTED WORDING ({leaks})")
    lk = _report("leak", ("future",), rows=[_finding(influence=0.5)])
    console = Console(width=200, record=True)
    console.print(_verdict_table(lk, "spec"))
    assert "PLANTED WORDING (future)" in console.export_text()
    assert "PLANTED WORDING (future)" in str(lk)
    assert json.loads(lk.to_json())["headline"] == "PLANTED WORDING (future)"
    assert lk.brief()["headline"] == "PLANTED WORDING (future)"
    assert "PLANTED WORDING (future)" in report_html._leakage_section(type("Data", (), {"leakage": lk}))
    assert _leakage_finding(lk)["finding"] == "PLANTED WORDING (future)"


def test_to_dict_keeps_its_keys_and_adds_the_headline():
    keys = set(_report().to_dict())
    assert keys == {"model", "causal", "verdict", "headline", "max_influence", "first_leaking_site",
                    "first_leaking_sites", "leaks", "exit_code", "tol", "lengths", "n_prompts", "methods", "notes",
                    "seconds", "summary", "table", "sites", "declared_by", "incomplete", "origin", "origins",
                    "noise_floor", "floor_how", "margin", "float64_checked", "coverage", "contracts"}
    assert set(_report().brief()) == {"verdict", "headline", "causal", "leaks", "max_influence", "first_leaking_site",
                                      "text", "summary", "methods", "lengths", "tol"}


def test_a_failing_report_names_the_layer_and_position():
    with pytest.raises(AssertionError) as info:
        assert_causal(build("off_by_one", 0))
    message = str(info.value)
    assert "First leaking site (forward order): blocks.0.mixer." in message
    assert "the output at position" in message and "reads position" in message


def test_a_mask_only_leak_says_so_in_its_rows():
    with pytest.raises(AssertionError) as info:
        assert_causal(build("mask_fast_path", 0), methods=("truncation", "gradient"), n_prompts=1)
    assert "with an all-ones attention_mask" in str(info.value) and "blocks.0.mixer" in str(info.value)


def test_cli_json_of_a_leak_carries_the_headline_and_the_column(tmp_path, monkeypatch, capsys):
    from interp import cli

    (tmp_path / "typed_specs.py").write_text("from interp.models.zoo import ZOO\ndef fast():\n    return ZOO['mask_fast_path'].build(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = tmp_path / "audit.json"
    assert cli.main(["audit-leakage", "typed_specs:fast", "--max-len", "8", "-q", "--json", str(target)]) == 1
    result = json.loads(target.read_text())["result"]
    assert result["headline"] == "LEAK (future)" and "LEAK (future)" in capsys.readouterr().out
    leaking = [row for row in result["table"] if row["influence"] > result["tol"] and row["method"] != "pattern"]
    assert leaking and all(row["ones_mask"] is True for row in leaking)


# --------------------------------------------------------------------------- the stages


def test_plan_fixes_what_to_run_without_a_forward_pass():
    model = build("mask_fast_path", 0)
    adapter = ModelAdapter(model)
    plan = plan_audit(model, adapter, max_len=10, methods=("gradient", "truncation"), gradient_len=24)
    assert isinstance(plan, AuditPlan) and plan.methods == ("truncation", "gradient")  # METHODS order
    assert plan.gradient_len == 10 and plan.mask_variants == (False, True) and plan.tol == leakage.DEFAULT_TOL
    # the floors and localisation, then per mask variant every prefix and the gradient's chunks
    assert plan.passes == 2 + 2 * (9 + math.ceil(9 / adapter.rows_per_forward(10)))
    assert plan.prompts(2, 6).shape == (2, 6) and torch.equal(plan.prompts(2, 6), plan.prompts(2, 6))
    with pytest.raises(ValueError, match="unknown method"):
        plan_audit(model, adapter, methods=("truncation", "bogus"))
    black_box = plan_audit(lambda t: model(t), ModelAdapter(lambda t: model(t)), max_len=6, vocab_size=13)
    assert black_box.mask_variants == (False,)


def test_the_stages_compose_to_audit():
    model = build("batch_mixing", 0)
    adapter = ModelAdapter(model)
    plan = plan_audit(model, adapter, max_len=9, n_prompts=2)
    runs = run_methods(model, adapter, plan)
    assert runs.adapter is not adapter and runs.adapter.max_rows == 1 and adapter.max_rows is None  # a copy, not a mutation
    table = findings_table(runs.rows)
    leaks = leak_kinds(table, plan)
    assert leaks[0] == "batch" and "future" not in leaks  # mixing does not pose as a future leak
    located = locate_leaks(adapter, runs, table, leaks=leaks, plan=plan, sites=leakage.site_modules(model))
    assert located.first["batch"] == "blocks.0.mixer" and set(located.sites["kind"]) == set(located.first)
    decision = decide_leaks(table, plan, leaks=leaks, located=located, localised=True)
    assert decision.verdict == "leak" and decision.first_leaking_site == "blocks.0.mixer"
    whole = audit(model, max_len=9, n_prompts=2)
    assert whole.verdict == decision.verdict and whole.first_leaking_sites == decision.first_leaking_sites
    pd.testing.assert_frame_equal(whole.table, table)


def test_decide_without_localisation_places_leaks_at_the_output():
    model = build("off_by_one", 0)
    plan = plan_audit(model, ModelAdapter(model), max_len=6)
    table = findings_table([_finding(influence=0.0), _finding("batch", influence=1.0, source=None)])
    leaks = leak_kinds(table, plan)
    decision = decide_leaks(table, plan, leaks=leaks, located=Localisation(pd.DataFrame(), {}), localised=False)
    assert leaks == ("batch",) and decision.first_leaking_sites == {"batch": "output"}
    assert decision.first_leaking_site == "output" and decision.max_influence == 1.0
    quiet = findings_table([_finding(influence=0.0)])
    assert decide_leaks(quiet, plan, leaks=(), located=Localisation(pd.DataFrame(), {}), localised=True).verdict == "exact_zero"


def test_one_per_forward_is_a_copy():
    adapter = ModelAdapter(build("masked_fill", 0))
    single = adapter.one_per_forward()
    assert single.max_rows == 1 and adapter.max_rows is None and single.rows_per_forward(4) == 1


# --------------------------------------------------------------------------- layering


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


LEAKAGE = "interp.analyses.leakage"
LAYERS = ("types", "adapter", "methods", "floor", "fast", "origin", "report", "plan", "stages", "ci")  # bottom first


@pytest.mark.parametrize("depth, module", list(enumerate(LAYERS)))
def test_the_leakage_layers_point_down(depth, module):
    """Each module imports only those below it, never the package (its __init__ imports them all)."""
    forbidden = {LEAKAGE} | {f"{LEAKAGE}.{above}" for above in LAYERS[depth + 1:]}
    imported = _imports(ROOT / "analyses" / "leakage" / f"{module}.py")
    assert not imported & forbidden, imported & forbidden


def test_every_leakage_module_has_a_layer():
    modules = {path.stem for path in (ROOT / "analyses" / "leakage").glob("*.py")} - {"__init__"}
    assert modules == set(LAYERS)
