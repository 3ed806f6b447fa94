"""Each analysis package's `__all__` is what a user calls (the page of the API reference shows those), and every
name the package exported before stays importable from it, for users and for type checkers."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# the names each `__all__` left behind when it was cut to what a user calls (issue 43): still importable
LEFT_OUT = {
    "leakage": """AuditPlan BIDIRECTIONAL_HINT CostEstimate DEFAULT_MAX_LEN DEFAULT_TOL Decision FLOAT64_DECIDES
        FUTURE_METHODS Floors GRADIENT_TOL_FACTOR HALF_PRECISION_TOL LEAK_KINDS LOCALISE_FRACTION Localisation
        MAX_ROWS_PER_METHOD MAX_TOL MAX_TOL_HALF METHOD_KIND MethodRuns ModelAdapter NOISE_FACTOR PATTERN_TOL Pair
        SITE_COLUMNS SPREAD_FLOOR STATUS_TONE TABLE_COLUMNS TRUSTED Tone LeakVerdict above_threshold batch_mixing check_tol
        check_weights_finite comparison_floor coverage_cuts decide_leaks declared_boundaries describe_row embedding_module
        empty_table findings_table float64_copy gradient gradient_at_cuts infer_n_ctx infer_vocab_size leak_kinds
        localisation_threshold localise locate_leaks locate_origins measure_floors method_tol observed_masking
        padding_check pattern_check perturbation plan_audit run_methods site_modules truncation user_forward""",
    "circuits": "ACDC_THRESHOLD EAP_THRESHOLD FROZEN_SCALE Interval MIB_FRACTIONS PatchSweep baseline cmd cpr edge_frame test_node_circuit",
    "claims": """CLAIM_KINDS EDGE_CLAIM_KINDS Faithfulness MODEL_CLAIM_KINDS Necessity Observational PRESETS
        PositionalParams RandomInitControl ShuffledControl Sufficiency bridge_without_pattern_edits claim_evidence_for
        claim_object control_sender edge_claim_kinds head_claim_kinds head_metric pair_claim_kinds random_init_model""",
    "qk": "FROZEN_NORM MAX_ROWS UNIT",
    "redundancy": "DEFAULT_MARGIN OrderBy SuggestBy WRITE_FLOOR",
    "report": """DEFAULT_N LEAKAGE_LEN MARKER MAX_CARDS NO_LOSS_EVIDENCE RENDER_STAGES behaviour_method
        check_cards_before_loading check_out_dir default_prompt_spec heads_before_loading is_report_dir model_name
        model_prompt_spec model_summary prompt_warnings report_behaviour""",
}
PACKAGES = sorted(LEFT_OUT)


def _module(package: str):
    return importlib.import_module(f"interp.analyses.{package}")


def _top_level_imports(package: str) -> dict[str, ast.alias]:
    """name -> its alias in each top-level import from the package's own modules (TYPE_CHECKING block included)."""
    tree = ast.parse((ROOT / "analyses" / package / "__init__.py").read_text())
    nodes = [*tree.body, *(n for s in tree.body if isinstance(s, ast.If) for n in s.body)]
    own = f"interp.analyses.{package}."
    return {a.asname or a.name: a for n in nodes if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(own)
            for a in n.names}


@pytest.mark.parametrize("package", PACKAGES)
def test_all_lists_what_a_user_calls_and_every_name_resolves(package: str) -> None:
    module = _module(package)
    assert 10 <= len(module.__all__) <= 21, len(module.__all__)
    assert len(set(module.__all__)) == len(module.__all__)
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
    assert set(module.__all__) <= set(dir(module))


@pytest.mark.parametrize("package", PACKAGES)
def test_names_left_out_of_all_still_import(package: str) -> None:
    module = _module(package)
    left_out = LEFT_OUT[package].split()
    assert not set(left_out) & set(module.__all__)
    for name in left_out:
        exec(f"from interp.analyses.{package} import {name}", {})  # the form a user writes
        assert getattr(module, name) is not None, name


@pytest.mark.parametrize("package", PACKAGES)
def test_names_outside_all_are_explicit_re_exports(package: str) -> None:
    """`from m import X as X` (or listed in `__all__`): what type checkers with `--no-implicit-reexport` accept."""
    module = _module(package)
    implicit = [name for name, alias in _top_level_imports(package).items()
                if name not in module.__all__ and alias.asname != alias.name]
    assert implicit == []


def test_the_leakage_tuning_constants_keep_their_values() -> None:
    from interp.analyses.leakage import DEFAULT_MAX_LEN, DEFAULT_TOL
    from interp.analyses.leakage.types import DEFAULT_MAX_LEN as home_max_len
    from interp.analyses.leakage.types import DEFAULT_TOL as home_tol

    assert (DEFAULT_TOL, DEFAULT_MAX_LEN) == (home_tol, home_max_len) == (5e-5, 256)
