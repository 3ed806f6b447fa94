"""Claims files: the TOML format, `interp claims`, and the pytest plugin that collects them as tests."""
import json
import textwrap
from pathlib import Path

import pytest

import interp.analyses.claims.pair  # noqa: F401

# imported here, before any in-process pytester run: pytester restores sys.modules after each run,
# and transformer_lens (through datasets/pyarrow) cannot be imported a second time in one process
import interp.analyses.claims.scanning  # noqa: F401
import interp.analyses.leakage  # noqa: F401
import interp.analyses.redundancy  # noqa: F401
import interp.loading  # noqa: F401
from interp import cli
from interp.analyses.claims.registry import claim_kinds, read_claims, run_claims
from interp.specs import ClaimsFileError, parse_claims_text

pytest_plugins = ["pytester"]

CONSTRUCTED = "interp.models.constructed:induction_circuit"
GOOD = textwrap.dedent(f"""\
    model = "{CONSTRUCTED}"

    [prompts]
    kind = "repeated"
    n = 32
    prefix_len = 8

    [claims]
    L0H0 = "previous_token"
    L1H0 = ["induction", "not previous_token"]
    """)
WRONG = GOOD + 'L0H3 = "induction"\n'  # L0H3 is a uniform head


# --------------------------------------------------------------------------- the format


def test_table_form_with_lists_negations_pairs_and_model_claims():
    parsed = parse_claims_text(textwrap.dedent("""\
        model = "toy-induction"
        alpha = 0.01
        [prompts]
        kind = "random"
        n = 12
        [claims]
        L1H2 = "induction"
        L0H1 = ["previous_token", "not positional"]
        "L0H1 ~ L0H3" = "redundant"
        model = "causal"
        """), "f.toml", valid_kinds=claim_kinds())
    assert parsed.model == "toy-induction" and parsed.alpha == 0.01
    assert parsed.prompts.kind == "random" and parsed.prompts.n == 12
    assert [(c.name, c.heads, c.expect, c.line) for c in parsed.claims] == [
        ("L1H2: induction", ((1, 2),), "supported", 7),
        ("L0H1: previous_token", ((0, 1),), "supported", 8),
        ("L0H1: not positional", ((0, 1),), "refuted", 8),
        ("L0H1 ~ L0H3: redundant", ((0, 1), (0, 3)), "supported", 9),
        ("model: causal", (), "supported", 10),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ('[claims]\nL0H0 = "previous_token\n', r"^f\.toml:2:\d+: TOML syntax error"),
        ('[claims]\n\nL0H0 = "inductoin"\n', r"^f\.toml:3:1: L0H0: unknown claim kind 'inductoin'.*Did you mean 'induction'"),
        ('[claims]\nLayer0 = "induction"\n', r"^f\.toml:2:1: 'Layer0' is not a head label"),
        ('modle = "x"\n[claims]\nL0H0 = "induction"\n', r"^f\.toml:1:1: unknown top-level key 'modle'"),
        ('[prompts]\nkind = "repeatd"\n[claims]\nL0H0 = "induction"\n', r"^f\.toml:2:1: unknown prompt kind 'repeatd'"),
        ('[prompts]\nlength = 3\n[claims]\nL0H0 = "induction"\n', r"^f\.toml:2:1: unknown prompts key 'length'"),
        ('model = "m"\n', r"^f\.toml:\?:\?: no claims"),
        ('[claims]\nL0H0 = ["induction", "induction"]\n', r"^f\.toml:2:1: 'L0H0: induction' is claimed twice"),
        ('[claims]\nL0H0 = 3\n', r"^f\.toml:2:1: L0H0 = 3: expected a claim kind"),
        ('alpha = 2\n[claims]\nL0H0 = "induction"\n', r"^f\.toml:1:1: alpha = 2 must be a number in \(0, 1\)"),
        ('[claims]\n"L0H0 -> L1H0 via x" = "composes"\n', r"^f\.toml:2:1: edge 'L0H0 -> L1H0 via x': via 'x'; expected one of .* \(via q, k or v\)"),
        ('[claims]\n"L0H0 -> L1H0" = "composes"\n', r"^f\.toml:2:1: edge 'L0H0 -> L1H0' into a head needs 'via q'"),
        ('[claims]\n"L1H0 -> L0H0 via k" = "composes"\n',
         r"^f\.toml:2:1: 'L1H0 -> L0H0 via k': the receiver L0H0 \(layer 0\) must sit in a later layer than the sender L1H0"),
        ('[claims]\n"L0H0 -> L0H1 via k" = "composes"\n', r"^f\.toml:2:1: .*must sit in a later layer"),
        ('[claims]\n"L0H0 -> logits" = "composes"\n', r"^f\.toml:2:1: 'L0H0 -> logits': an edge claim joins two heads"),
        # k20 k23: a mistyped edge (it says " via ") gets the edge syntax, not the head-label advice
        ('[claims]\n"L0H0 => L1H0 via k" = "composes"\n', r"^f\.toml:2:1: 'L0H0 => L1H0 via k' is not an edge; .*"
         r"write it as \"L0H0 -> L1H2 via k\""),
        ('[claims]\n"L0H0 - > L1H0 via k" = "composes"\n', r"^f\.toml:2:1: 'L0H0 - > L1H0 via k' is not an edge"),
        ('[claims]\n"L0H0 \u2192 L1H0 via k" = "composes"\n', r"^f\.toml:2:1: 'L0H0 \u2192 L1H0 via k' is not an edge"),
        # k07: one claim both ways always fails one of them
        ('[claims]\n"L0H0 -> L1H0 via k" = ["composes", "not composes"]\n',
         r"^f\.toml:2:1: 'L0H0 -> L1H0 via k' is claimed both ways: 'L0H0 -> L1H0 via k: composes' \(line 2\) and "
         r"'L0H0 -> L1H0 via k: not composes'"),
        ('[claims]\nL1H2 = "induction"\n"L1H2" = "not induction"\n', r"TOML syntax error"),
        ('[claims]\nL1H2 = "induction"\nl1h2 = "not induction"\n', r"^f\.toml:3:1: 'L1H2' is claimed both ways"),
        ('[claims]\n"L0H0 -> L1H0 via k" = "compose"\n', r"^f\.toml:2:1: .*unknown claim kind 'compose'.*Did you mean 'composes'"),
    ],
)
def test_errors_give_file_line_column_and_the_fix(text, message):
    with pytest.raises(ClaimsFileError, match=message):
        parse_claims_text(text, "f.toml", valid_kinds=claim_kinds())


def test_claim_arity_is_checked(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text('[claims]\n"L0H0 ~ L0H1" = "induction"\n')
    with pytest.raises(ClaimsFileError, match=r"claims\.toml:2:1: 'induction' is a claim about one head"):
        read_claims(path)
    path.write_text('[claims]\nL0H0 = "redundant"\n')
    with pytest.raises(ClaimsFileError, match="a claim about a pair of heads"):
        read_claims(path)


def test_edge_claims_parse_and_are_checked_for_their_kind(tmp_path):
    parsed = parse_claims_text('[claims]\n"l0h0->L1H2 VIA K" = ["composes"]\n"L0H1 -> L1H2 via q" = "not composes"\n',
                               "f.toml", valid_kinds=claim_kinds())
    assert [(c.name, c.heads, c.edge, c.expect) for c in parsed.claims] == [
        ("L0H0 -> L1H2 via k: composes", ((0, 0), (1, 2)), "L0H0 -> L1H2 via k", "supported"),
        ("L0H1 -> L1H2 via q: not composes", ((0, 1), (1, 2)), "L0H1 -> L1H2 via q", "refuted"),
    ]
    grouped = parse_claims_text('[claims]\n"L16H0 -> L18KV2 via k" = "composes"\n', "f.toml", valid_kinds=claim_kinds())
    assert [(c.heads, c.edge) for c in grouped.claims] == [(((16, 0),), "L16H0 -> L18KV2 via k")]  # a KV head: the target
    with pytest.raises(ClaimsFileError, match=r"^f\.toml:2:1: 'L0H0 -> L1KV0 via q': an edge claim joins two heads through "
                                              r"q, k or v \(a key/value head \"L1KV0\" through k or v\)"):
        parse_claims_text('[claims]\n"L0H0 -> L1KV0 via q" = "composes"\n', "f.toml", valid_kinds=claim_kinds())
    from interp.analyses.claims.registry import EDGE_CLAIM_KINDS, edge_claim_kinds

    assert tuple(edge_claim_kinds()) == EDGE_CLAIM_KINDS
    path = tmp_path / "claims.toml"
    path.write_text('[claims]\nL0H0 = "composes"\n')
    with pytest.raises(ClaimsFileError, match=r"claims\.toml:2:1: 'composes' is a claim about an edge between heads; "
                                              r"write \"L0H0 -> L1H2 via k\""):
        read_claims(path)
    path.write_text('[claims]\n"L0H0 -> L1H0 via k" = "induction"\n')
    with pytest.raises(ClaimsFileError, match=r"claims\.toml:2:1: 'L0H0 -> L1H0 via k' is an edge, and 'induction' is not"):
        read_claims(path)


def test_run_claims_gives_expected_verdicts_on_the_constructed_circuit(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text(WRONG)
    from interp.loading import load

    frame = run_claims(load(CONSTRUCTED), read_claims(path))
    assert list(frame.name) == ["L0H0: previous_token", "L1H0: induction", "L1H0: not previous_token", "L0H3: induction"]
    assert list(frame.verdict) == ["supported", "supported", "refuted", "refuted"]
    assert list(frame.passed) == [True, True, True, False]
    assert "L0H3 induction = 0.0" in frame.reasons[3]


# --------------------------------------------------------------------------- interp claims


@pytest.mark.heavy
def test_cli_claims_exit_codes_and_json(tmp_path, capsys):
    good, wrong = tmp_path / "good.toml", tmp_path / "wrong.toml"
    good.write_text(GOOD)
    wrong.write_text(WRONG)
    assert cli.main(["claims", str(good), "--strict", "-q"]) == 0
    capsys.readouterr()
    assert cli.main(["claims", str(wrong), "-q"]) == 0  # a refuted claim is a finding only with --strict
    capsys.readouterr()
    assert cli.main(["claims", CONSTRUCTED, str(wrong), "--strict", "-q", "--json", "-"]) == 1
    document = json.loads(capsys.readouterr().out)["result"]  # the CLI's JSON envelope
    assert [c["passed"] for c in document["claims"]] == [True, True, True, False]


def test_cli_claims_input_errors_exit_2(tmp_path, capsys):
    broken = tmp_path / "broken.toml"
    broken.write_text('[claims]\nL0H0 = "previous_token"\nL1H0 = induction\n')
    assert cli.main(["claims", CONSTRUCTED, str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken}:3:" in err and "Traceback" not in err
    nameless = tmp_path / "nameless.toml"
    nameless.write_text('[claims]\nL0H0 = "previous_token"\n')
    assert cli.main(["claims", str(nameless)]) == 2
    assert "names no model" in capsys.readouterr().err
    assert cli.main(["claims", CONSTRUCTED, str(tmp_path / "missing.toml")]) == 2
    assert "claims file not found" in capsys.readouterr().err


# --------------------------------------------------------------------------- the pytest plugin


def test_plugin_collects_one_item_per_claim_and_fails_with_reasons(pytester):
    pytester.makefile(".toml", claims_constructed=WRONG)
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*claims_constructed.toml::L0H0-previous_token PASSED*",
        "*claims_constructed.toml::L1H0-not-previous_token PASSED*",
        "*claims_constructed.toml::L0H3-induction FAILED*",
        "*claims_constructed.toml:11: claim 'L0H3: induction' expected supported, got refuted*",
        "*observational failed: L0H3 induction = 0.0*",
    ])


def test_plugin_model_option_and_file_name_patterns(pytester):
    nameless = GOOD.replace(f'model = "{CONSTRUCTED}"\n', "")
    (pytester.path / "pinned.claims.toml").write_text(nameless)
    (pytester.path / "other.toml").write_text(nameless)  # not a claims file name: not collected
    result = pytester.runpytest("-p", "no:cacheprovider", "--interp-model", CONSTRUCTED)
    result.assert_outcomes(passed=3)
    without = pytester.runpytest("-p", "no:cacheprovider")
    without.assert_outcomes(failed=3)
    without.stdout.fnmatch_lines(["*names no model: add model = * pass --interp-model SPEC*"])


def test_plugin_reports_syntax_errors_with_line_and_column(pytester):
    pytester.makefile(".toml", claims_bad='[claims]\nL0H0 = "previous_token\n')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*claims_bad.toml:2:*: TOML syntax error*"])


def test_plugin_reports_a_model_that_does_not_load(pytester):
    pytester.makefile(".toml", claims_x=GOOD.replace(CONSTRUCTED, "no-such-model"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*could not test the claims*no-such-model*"])


def test_plugin_reports_a_failing_factory_in_one_line_per_claim(pytester):
    """P08: a factory that raises is the user's model failing (ModelError): one line per claim, not the toolkit's
    internals."""
    pytester.makepyfile(broken_factory="def build():\n    raise RuntimeError('factory blew up')\n")
    pytester.makefile(".toml", claims_factory=GOOD.replace(CONSTRUCTED, "broken_factory:build"))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*claims_factory.toml:*: could not test the claims: ModelError: *broken_factory:build* "
                                 "raised RuntimeError*factory blew up*"])
    assert len(result.outlines) < 30 and not any("interp/loading.py" in line for line in result.outlines)


def test_plugin_reports_a_claim_made_both_ways_as_a_collection_error(pytester):
    """P05: the file contradicts itself: nothing runs, the error names both claims."""
    pytester.makefile(".toml", claims_both=GOOD.replace('L0H0 = "previous_token"',
                                                        'L0H0 = ["previous_token", "not previous_token"]'))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*claims_both.toml:*: 'L0H0' is claimed both ways*"])


# --------------------------------------------------------------------------- the shipped examples, pinned


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_shipped_claims_files_pass_on_their_models(pytester):
    for name in ("claims.toml", "constructed.claims.toml", "circuit.claims.toml"):
        (pytester.path / name).write_text((ROOT / "examples" / name).read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=9 + 6 + 3)  # every claim of the three files
    result.stdout.fnmatch_lines(["*circuit.claims.toml::L0H0->L1H0-via-k-composes PASSED*",
                                 "*circuit.claims.toml::L0H0->L1H0-via-q-not-composes PASSED*"])


@pytest.mark.heavy
def test_pins_catch_a_checkpoint_without_induction_heads(pytester, tmp_path):
    """The team's use: pin toy-induction's interpretation, then point the pins at a new checkpoint."""
    import dataclasses

    import interp
    from interp.models import HookedGPT

    trained = interp.load("toy-induction")
    untrained = HookedGPT(dataclasses.replace(trained.cfg, seed=123)).eval()  # same shape, never trained
    interp.save(untrained, tmp_path / "untrained", metadata=trained.metadata)
    (pytester.path / "claims.toml").write_text((ROOT / "examples" / "claims.toml").read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "--interp-model", str(tmp_path / "untrained"))
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 4  # every induction pin fails
    result.stdout.fnmatch_lines(["*claim 'L1H0: induction' expected supported, got *", "*L1H0 induction = 0.0*"])


def test_cli_lists_the_claim_kinds(capsys):
    assert cli.main(["claims", "--list-kinds"]) == 0
    out = capsys.readouterr().out
    assert 'an edge ("L0H0 -> L1H2 via k" = ...): composes' in out
    for kind in ("induction", "previous_token", "positional", "dispensable", "redundant", "causal", "composes"):
        assert kind in out
    assert cli.main(["claims"]) == 2


def test_claim_kinds_live_in_the_registry_alone():
    """The former homes (interp.testing's claim kinds, report.claim_evidence_for) are gone, not aliased."""
    import interp
    from interp import testing
    from interp.analyses import report
    from interp.analyses.claims import registry

    for name in ("MODEL_CLAIM_KINDS", "head_claim_kinds", "pair_claim_kinds", "claim_kinds", "nope"):
        with pytest.raises(AttributeError):
            getattr(testing, name)
    assert not hasattr(report, "claim_evidence_for")
    assert testing.read_claims is registry.read_claims is interp.read_claims
    assert testing.run_claims is registry.run_claims is interp.run_claims


def test_registry_imports_no_analysis_and_no_face_at_import():
    import subprocess
    import sys

    code = ("import sys, interp.analyses.claims.registry; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'interp', 'analyses')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "torch" not in out and "interp.testing" not in out and "interp.analyses.report" not in out, out
