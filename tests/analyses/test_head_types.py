"""Head types as the analyses see them: a new type defined here, outside the package, gets its metric columns,
claims, scan and report card; `interp.analyses.head_types` re-exports the core module `interp.head_types` (whose
own tests are tests/interp/test_head_types.py)."""

import pytest
import torch

from interp.analyses import claims as hc
from interp.analyses import head_types as ht
from interp.analyses import positional, report
from interp.analyses.head_types import HeadType, TargetBatch, register, unregister
from interp.claims import Context
from interp.claims import test_claims as run_test_claims
from interp.data import repeated_tokens
from interp.models.constructed import fixed_offset_copier

# --------------------------------------------------------------------------- a new head type, outside the package

def two_back(batch: TargetBatch) -> torch.Tensor:
    """(batch, query, key): the key two positions before the query."""
    q = torch.arange(batch.n_pos)
    return (q[:, None] - q[None, :] == 2).expand_as(batch.allowed)


TWO_BACK = HeadType("two_back", "{label} attends two tokens back (> {threshold:g} of its attention)", two_back,
                    description="mean attention weight on the token two positions back; in [0, 1]")


@pytest.fixture()
def registered():
    register(TWO_BACK)
    yield TWO_BACK
    unregister("two_back")


@pytest.fixture(scope="module")
def copier():
    """L0H0 attends exactly two back (and copies: right on period-3 repeats); L0H1 is uniform."""
    return fixed_offset_copier(period=3, d_vocab=16, n_ctx=32)


@pytest.fixture(scope="module")
def period3(copier):
    return repeated_tokens(64, 3, 15, bos=15, n_repeats=5, seed=1)  # 16 positions; 64 prompts: report.compute tests scanned claims on half, 32


def test_new_head_type_metric_per_head(registered, copier, period3):
    frame = positional.focus(copier, period3)
    assert "two_back" in frame.columns and "two_back_argmax" in frame.columns
    values = frame.set_index("head")["two_back"]
    assert values[0] == pytest.approx(1.0, abs=1e-6)  # the hand-set head
    # the uniform head: weight 1 / (q + 1) on q - 2, averaged over the queries q = 2..15 that have a target
    expected = sum(1 / (q + 1) for q in range(2, 16)) / 14
    assert values[1] == pytest.approx(expected, rel=1e-5)
    ctx = Context(copier, period3)
    torch.testing.assert_close(hc.head_metric(ctx, TWO_BACK)[:, 0, 1], torch.full((64,), expected), rtol=1e-5, atol=1e-6)


def test_new_head_type_claim_gets_every_evidence_kind(registered, copier, period3):
    claim = hc.make_claim("two_back", 0, 0)
    assert claim.statement == "L0H0 attends two tokens back (> 0.5 of its attention)"
    assert claim.spec()["params"] == {"metric": "two_back", "ideal": "two_back"}
    table = run_test_claims(copier, [claim], period3)
    row = table.iloc[0]
    for kind in ("observational", "control_shuffled", "control_random_init", "necessity"):
        assert row[f"{kind}_passed"] == True, (kind, row["reasons"])  # noqa: E712 (numpy bool)
    assert row["verdict"] == "supported"
    assert row["sufficiency"] > 0.99  # the ideal two-back pattern is what the head does: "not informative"
    assert all(table.attrs["verdicts"][0].get(kind).extra["informative"] == "no" for kind in ("sufficiency", "faithfulness"))


def test_new_head_type_unregistered_still_measures_and_claims(copier, period3):
    ctx = Context(copier, period3)
    values = hc.head_metric(ctx, TWO_BACK)  # measured in a pass of its own
    assert float(values[:, 0, 0].mean()) == pytest.approx(1.0, abs=1e-6)
    claim = hc.head_type_claim(TWO_BACK, 0, 0, threshold=0.9)
    assert "two_back" not in ht.HEAD_TYPES and claim.thresholds["observational"].value == 0.9


def test_new_head_type_in_the_report(registered, copier, period3, tmp_path):
    data = report.compute(copier, prompts=period3, seed=0)
    assert "two_back" in data.heads.columns
    supported = data.claims[(data.claims["claim"] == "two_back") & (data.claims["verdict"] == "supported")]
    assert list(supported["label"]) == ["L0H0"]
    assert "two_back" in data.heads.set_index("label").loc["L0H0", "claims_supported"].split(";")
    folder = tmp_path / "report"
    report.render(data, folder)
    assert "L0H0 attends two tokens back" in (folder / "report.html").read_text(encoding="utf-8")  # its card
    assert "two positions back" in (folder / "columns.md").read_text(encoding="utf-8")


def test_the_analyses_module_re_exports_the_core_one():
    """`from interp.analyses.head_types import X` keeps working for every name it had, as the same object, and a
    type registered through it is in the one registry (the README's `register(HeadType(...))`)."""
    import interp.head_types as core

    before = ["BUILTIN_HEAD_TYPES", "CLARK", "DUPLICATE", "ELHAGE", "Fallback", "FirstTarget", "HEAD_TYPES", "HeadType",
              "HeadTypeParams", "NEEDS", "Needs", "OLSSON", "OffsetTarget", "PlainParams", "RESERVED", "SINK",
              "ShuffleExpect", "TIE_TOLERANCE", "Target", "TargetBatch", "VOITA", "WindowTarget", "argmax_ties",
              "duplicate_target", "get_head_type", "head_type_reducer", "head_types", "induction_target", "offset_target",
              "offset_type", "reduce_head_types", "register", "repeat_queries_of", "try_head_type", "unregister"]
    for name in before:
        assert getattr(ht, name) is getattr(core, name), name
    assert HeadType.__module__ == "interp.head_types"
    register(TWO_BACK)
    try:
        assert core.get_head_type("two_back") is TWO_BACK and core.HEAD_TYPES is ht.HEAD_TYPES
    finally:
        unregister("two_back")
    assert "two_back" not in core.HEAD_TYPES


def test_the_registry_reaches_the_presets_and_the_positional_metrics():
    register(TWO_BACK)
    try:
        assert "two_back" in hc.PRESETS and "two_back_argmax" in positional.positional_metrics()
    finally:
        unregister("two_back")
    assert "two_back" not in hc.PRESETS and positional.positional_metrics() == positional.POSITIONAL_METRICS


def test_offset_type_is_the_positional_claims_family():
    assert hc.positional_head(0, 0, offset=-2).params.head_type == ht.offset_type(-2)


def test_typed_params_read_as_the_legacy_mapping():
    claim = hc.local_window_head(0, 1)
    assert isinstance(claim.params, ht.HeadTypeParams) and claim.params.head_type is ht.get_head_type("local_window")
    assert dict(claim.params) == {"metric": "local_window", "ideal": "local_window", "window": 3}
    assert dict(hc.induction_head(1, 0).params) == {"metric": "induction", "ideal": "induction",
                                                     "position_metric": "induction_position"}
    assert dict(hc.positional_head(0, 0).params) == {"metric": "argmax_at:auto", "offset": None}
    assert len(claim.params) == 3 and claim.params["window"] == 3
    with pytest.raises(TypeError, match="no parameter 'width'"):
        hc.head_type_claim("local_window", 0, 0, width=2)


def test_typed_params_are_a_full_mapping():
    # regression: a dataclass field named `values` shadowed Mapping.values(), so .values() raised TypeError
    params = hc.local_window_head(0, 1).params
    assert list(params.values()) == ["local_window", "local_window", 3]
    assert list(params.keys()) == ["metric", "ideal", "window"] and dict(params.items()) == dict(params)
    assert params.param_values == (("window", 3),) and params.get("window") == 3 and "window" in params
    assert list(ht.HeadTypeParams(ht.get_head_type("previous_token")).values()) == ["prev_token", "previous_token"]


