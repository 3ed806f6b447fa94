"""The contract modes of the audit (issue 40) judged on every case of the contract zoos (`leakzoo.catalogue`): each
verdict equals what the catalogue says and what the explicit-mask reference (`leakzoo.references`, written apart from
the product, so the two checks stay independent) finds, and each broken contract is located within two lines of its
`# BUG` (or of a `# SITE:` line applying a mask that was built wrong).

The sweep through the CLI (`interp.cli.main` in-process, a child process per audit) is `slow`; the same judgement
through the contract functions alone runs in the default suite.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from leakzoo import marked_line, references  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)
from leakzoo.catalogue import CASES, ContractCase  # noqa: E402

from interp.analyses.leakage.contracts import run_contracts  # noqa: E402

TESTS = Path(__file__).resolve().parents[2]
TOLERANCE = 2  # lines between the reported origin and a marked line
AUDITED = ("document", "window", "kv_cache", "backend")  # the contracts the audit's modes judge so far


def _cases(kinds=AUDITED):
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.flex else []) for c in CASES if c.contract in kinds]


def _flags(case: ContractCase) -> list[str]:
    if case.contract == "document":
        return ["--doc-sep", str(case.doc_sep)] if case.doc_sep is not None else ["--packed"]
    if case.contract == "kv_cache":
        return ["--kv-cache"]
    if case.contract == "backend":
        return ["--attn-impls", ",".join(_implementations(case)), "--no-padding"]  # the zoo refuses padded rows
    return ["--window", "config"]


def _kwargs(case: ContractCase) -> dict:
    if case.contract == "document":
        return {"doc_sep": case.doc_sep} if case.doc_sep is not None else {"packed": True}
    if case.contract == "kv_cache":
        return {"kv_cache": True}
    if case.contract == "backend":
        return {"attn_impls": _implementations(case)}
    return {"windowed": True}


def _implementations(case: ContractCase) -> tuple[str, ...]:
    """FlexAttention only where the bug needs it (its first call in a process takes seconds on CPU)."""
    return ("eager", "sdpa", "flex_attention") if case.flex else ("eager", "sdpa")


def lines_of(case: ContractCase) -> set[int]:
    """The lines that count as the case's origin: its `# BUG` line and the `# SITE:` lines it lists."""
    return {marked_line(case.path, "BUG", case.factory)} | {marked_line(case.path, "SITE", s) for s in case.sites}


def assert_origin(origin: dict | None, case: ContractCase) -> None:
    assert origin and origin["file"], f"{case.id}: no origin"
    assert Path(origin["file"]).resolve() == case.path.resolve(), f"{case.id}: origin in {origin['file']}"
    near = min(abs(origin["line"] - line) for line in lines_of(case))
    assert near <= TOLERANCE, f"{case.id}: origin line {origin['line']} ({origin['code']!r}), expected {lines_of(case)}"


def assert_verdict(found: set[str], runs: dict[str, float], threshold: float, case: ContractCase) -> None:
    assert found == set(case.kinds), (case.id, found)
    if case.runs is not None and not case.correct:
        leaking = {run for run, value in runs.items() if value > threshold}
        if "over-masked" not in case.kinds:
            assert leaking == set(case.runs), (case.id, runs)


@pytest.mark.parametrize("case", _cases())
def test_contract_verdict_and_origin(case, monkeypatch):
    """Through the contract functions: the catalogue's kinds, the reference's kinds, the line."""
    monkeypatch.syspath_prepend(str(TESTS))
    model = case.model()
    result = run_contracts(model, vocab=64, seed=0, **_kwargs(case))[case.contract]
    if case.weights_only:  # not hooked, the weights unseen: the full layer hides the window from the outputs
        assert result.status == "not applicable" and not result.found and result.origin is None
        assert not references.windows(case.model()).kinds
        return
    assert_verdict(set(result.found), result.runs, result.threshold, case)
    assert result.status == ("leak" if case.kinds else result.status)
    assert set(result.found) == set(case.reference(case.model(), _implementations(case)).kinds)
    if case.correct:
        assert result.status in ("exact zero", "noise", "not applicable") and result.origin is None
        assert result.max_influence < 1e-12
    else:
        assert_origin(result.origin.to_dict() if result.origin else None, case)


@pytest.mark.parametrize("case", _cases(("window",)))
def test_window_verdicts_hooked_equal_the_reference(case, monkeypatch):
    """Hooked as the CLI hooks it, the model's weights are checked per layer too: the verdict is still the catalogue's
    and the reference's, the leaking runs the same, every layer named is one whose weights break its window."""
    from interp.sdpa import hook_sdpa

    monkeypatch.syspath_prepend(str(TESTS))
    result = run_contracts(hook_sdpa(case.model()), vocab=64, windowed=True)["window"]
    assert_verdict(set(result.found), result.runs, result.threshold, case)
    assert set(result.found) == set(case.reference(case.model()).kinds)
    assert any("attention weights checked (2 layers observed" in note for note in result.notes)
    if case.correct:
        assert result.status == "exact zero" and result.origin is None
    else:
        layers = {"one_layer_wide": {1}, "hidden_by_full_layer": {0}}.get(case.factory, {0, 1})
        assert {f.layer for f in result.findings if f.layer is not None} == layers
        assert_origin(result.origin.to_dict() if result.origin else None, case)


def audit_cli(spec: str, flags: list[str], folder: Path) -> tuple[int, dict | None]:
    from interp import cli

    target = folder / "audit.json"
    target.unlink(missing_ok=True)
    try:
        code = cli.main(["audit-leakage", spec, "--quiet", "--max-len", "16", "--json", str(target), *flags])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    return code, json.loads(target.read_text()) if target.exists() else None


@pytest.mark.slow
@pytest.mark.cli
@pytest.mark.parametrize("case", _cases())
def test_cli_judges_every_zoo_case(case, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(TESTS))
    code, envelope = audit_cli(case.spec, _flags(case), tmp_path)
    assert envelope is not None, case.id
    result = envelope["result"]
    contract = result["contracts"][case.contract]
    assert code == (1 if case.kinds else 0), (case.id, code, result["headline"])
    assert set(contract["found"]) == set(case.kinds), (case.id, contract)
    assert (case.contract in result["leaks"]) == bool(case.kinds)
    assert set(contract) >= {"status", "max_influence", "floor", "origin"}
    if case.kinds:
        assert_origin(contract["origin"], case)
        assert result["origins"][case.contract] == contract["origin"]
    else:
        assert contract["origin"] is None


def test_each_implementation_is_held_to_the_other_contracts(monkeypatch):
    """sdpa_drops_window: with the window contract asked too, the window breaks under sdpa only."""
    monkeypatch.syspath_prepend(str(TESTS))
    case = next(c for c in CASES if c.factory == "sdpa_drops_window")
    results = run_contracts(case.model(), vocab=64, windowed=True, attn_impls=("eager", "sdpa"))
    window = results["window"]
    assert window.status == "leak" and {f.run.split(": ")[0] for f in window.findings} == {"sdpa"}
    assert set(window.runs) == {f"{impl}: length {n}" for impl in ("eager", "sdpa") for n in (3, 12)}
    assert_origin(window.origin.to_dict() if window.origin else None, case)
