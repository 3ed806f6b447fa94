"""Per-head pattern reports: contents, self-containedness, determinism, and refusing bad output dirs."""
import json
import os
from html import escape
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from interp import outdir
from interp.analyses import report
from interp.models.constructed import induction_circuit
from interp.specs import PromptSpec

SPEC = PromptSpec(kind="repeated", n=64, prefix_len=10, seed=0)  # scan tests on half: 32, the minimum for a verdict


@pytest.fixture(scope="module")
def model():
    return induction_circuit(n_ctx=32)


@pytest.fixture(scope="module")
def built(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "first"
    return report.build_report(model, out, spec="interp.models.constructed:induction_circuit", prompt_spec=SPEC)


class _Collector(HTMLParser):
    """Every referenced resource (img src, link href, script src) and whether scripts/styles load from elsewhere."""

    VOID = {"img", "meta", "link", "br", "hr", "input"}

    def __init__(self):
        super().__init__()
        self.images, self.links, self.scripts, self.ids = [], [], [], set()
        self.open: list[str] = []
        self.mismatched: list[str] = []

    def handle_endtag(self, tag):
        if not self.open or self.open[-1] != tag:
            self.mismatched.append(f"</{tag}> while {self.open[-3:]} open")
        else:
            self.open.pop()

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag == "link":
            self.links.append(attrs.get("href", ""))
        if tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])


@pytest.mark.heavy
def test_report_directory_has_every_file(built):
    out = built.out_dir
    for name in ("report.html", "heads.csv", "claims.csv", "summary.md", "report.json", "redundancy.csv", report.MARKER):
        assert (out / name).is_file(), name
    assert not list(out.parent.glob(".first.*")), "a temporary sibling was left behind"


@pytest.mark.heavy
def test_html_is_self_contained_and_every_image_exists(built):
    html = (built.out_dir / "report.html").read_text()
    parser = _Collector()
    parser.feed(html)
    assert parser.mismatched == [] and parser.open == []  # every element closed, in order
    assert parser.scripts == [] and parser.links == []  # no CDN, no external CSS or JS
    assert "http://" not in html and "https://" not in html
    assert len(parser.images) == 8 + 4  # one card per head, similarity, importance, the circuit and its curve
    for src in parser.images:
        assert not src.startswith(("/", "http")), src
        assert (built.out_dir / src).is_file(), f"report.html references missing {src}"
        assert (built.out_dir / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for section in ("leakage", "heads", "redundancy", "claims", "methods"):
        assert section in parser.ids
    assert {f"L{l}H{h}" for l in range(2) for h in range(4)} <= parser.ids


@pytest.mark.heavy
def test_heads_csv_has_one_row_per_head_with_metrics_cis_and_verdicts(built):
    heads = pd.read_csv(built.out_dir / "heads.csv")
    assert list(heads.label) == [f"L{l}H{h}" for l in range(2) for h in range(4)]
    for metric in ("prev_token", "induction", "importance"):
        assert {metric, f"{metric}_ci_low", f"{metric}_ci_high"} <= set(heads.columns)
    assert {"claims_supported", "claims_refuted", "claims_inconclusive", "n_prompts"} <= set(heads.columns)
    by_label = heads.set_index("label")
    # the constructed roles are exact
    assert by_label.loc["L0H0", "prev_token"] == pytest.approx(1.0, abs=1e-6)
    assert by_label.loc["L1H0", "induction"] == pytest.approx(1.0, abs=1e-6)
    assert "previous_token" in by_label.loc["L0H0", "claims_supported"]
    assert "induction" in by_label.loc["L1H0", "claims_supported"]
    # the two heads the circuit needs are the two most important ones
    top2 = set(heads.sort_values("importance", ascending=False).label[:2])
    assert top2 == {"L0H0", "L1H0"}


@pytest.mark.heavy
def test_claims_csv_and_leakage_verdict(built):
    claims = pd.read_csv(built.out_dir / "claims.csv")
    assert {"label", "claim", "verdict", "p_adjusted", "reasons", "source"} <= set(claims.columns)
    assert set(claims.verdict) <= {"supported", "refuted", "inconclusive"}
    assert built.leakage["causal"] is True
    html = (built.out_dir / "report.html").read_text()
    assert escape(built.leakage["headline"]) in html  # the verdict in words (FD6: never the code word alone)


@pytest.mark.heavy
def test_summary_and_highlights(built):
    summary = (built.out_dir / "summary.md").read_text()
    assert summary.startswith("# Attention report")
    assert "## Methods" in summary and "Benjamini-Hochberg" in summary
    supported = built.highlights[built.highlights.verdict == "supported"]
    findings = supported.groupby("heads")["finding"].apply(" ".join)
    assert "previous_token" in findings["L0H0"] and "induction" in findings["L1H0"]
    # an argmax rate is its own finding, never grouped or ranked with a weight
    weights = supported[supported.family == "attention weight"]
    assert "previous_token" in " ".join(weights[weights.heads == "L0H0"].finding)
    assert not weights.finding.str.contains("positional").any()
    assert built.highlights.finding[0].startswith("causal")  # the leakage verdict comes first
    meta = json.loads((built.out_dir / "report.json").read_text())
    assert meta["settings"]["seed"] == 0 and meta["settings"]["prompts"]["n"] == 64


@pytest.mark.heavy
def test_two_runs_give_identical_csvs(built, model, tmp_path):
    again = report.build_report(model, tmp_path / "second", spec="interp.models.constructed:induction_circuit", prompt_spec=SPEC)
    for name in ("heads.csv", "claims.csv", "redundancy.csv"):
        assert (built.out_dir / name).read_bytes() == (again.out_dir / name).read_bytes(), name


def test_refuses_a_non_empty_directory_unless_forced(model, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(report.OutputDirError, match="not empty; pass --force"):
        report.build_report(model, out, prompt_spec=SPEC)
    assert (out / "notes.txt").read_text() == "mine"
    assert not report.is_report_dir(out)  # `interp demo` would refuse it too


@pytest.mark.heavy
def test_force_replaces_an_earlier_report_and_never_a_users_file(built, model, tmp_path):
    out = tmp_path / "again"
    small = PromptSpec(n=12, prefix_len=10)
    report.build_report(model, out, prompt_spec=small, heads=[(1, 0), (0, 1)])
    assert (out / "plots" / "L0H1.png").exists()
    report.build_report(model, out, prompt_spec=small, heads=[(1, 0)], force=True)
    assert list(pd.read_csv(out / "heads.csv").label) == ["L1H0"]
    assert not (out / "plots" / "L0H1.png").exists()  # the earlier report's own file, not written again
    assert report.is_report_dir(out)
    (out / "stale.txt").write_text("mine")  # issue 11 #1: --force used to delete the whole folder
    with pytest.raises(report.OutputDirError, match="stale.txt"):
        report.build_report(model, out, prompt_spec=small, heads=[(1, 0)], force=True)
    assert (out / "stale.txt").read_text() == "mine"
    assert not report.is_report_dir(out)


@pytest.mark.heavy
def test_a_failure_leaves_nothing_half_written(model, tmp_path, monkeypatch):
    def broken(data, folder):
        (folder / "heads.csv").write_text("partial")
        raise RuntimeError("disk full")

    import interp.analyses.report.build as report_build

    monkeypatch.setattr(report_build, "render", broken)  # build_report's own name for it
    with pytest.raises(RuntimeError, match="disk full"):
        report.build_report(model, tmp_path / "out", prompt_spec=PromptSpec(n=12, prefix_len=10), heads=[(0, 0)])
    assert list(tmp_path.iterdir()) == []


def test_too_large_a_report_says_how_to_narrow_it(model, tmp_path):
    with pytest.raises(report.ReportTooLarge, match=r"8 head cards \(limit 4\).*--layers.*--heads"):
        report.build_report(model, tmp_path / "big", prompt_spec=SPEC, max_cards=4)
    assert not (tmp_path / "big").exists()


def test_selection_errors_name_the_heads(model):
    with pytest.raises(ValueError, match="head L0H9 does not exist"):
        report.select_heads(model, heads=[(0, 9)])
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        report.select_heads(model, layers=[5])


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_parent_is_refused(model, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(report.OutputDirError, match="not a writable directory"):
            report.check_out_dir(locked / "out", force=False)
    finally:
        locked.chmod(0o700)


def test_out_dir_that_is_a_file_or_below_one_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(report.OutputDirError, match="exists and is not a directory"):
        report.check_out_dir(path, force=True)
    with pytest.raises(report.OutputDirError, match="is not a writable directory"):
        report.check_out_dir(path / "out", force=False)


def test_cli_report_refuses_a_non_empty_dir_before_loading_anything(tmp_path, capsys):
    from interp import cli

    (tmp_path / "keep.txt").write_text("mine")
    assert cli.main(["report", "interp.models.constructed:induction_circuit", "--out", str(tmp_path)]) == 2
    assert "not empty; pass --force" in capsys.readouterr().err
    assert cli.main(["demo", "--out", str(tmp_path)]) == 2  # the demo replaces only earlier reports
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_mean_patterns_ignore_padded_queries(model):
    from interp.data import pad

    prompts = pad([[63, 1, 2, 3, 1, 2, 3], [63, 4, 5]], pad_id=0)
    means = report.mean_patterns(model, prompts, [0])
    # query 4 is real only in the first prompt: its row is that prompt's row, not halved by padding
    assert means[0][0, 4].sum() == pytest.approx(1.0, abs=1e-6)
    assert means[0][0, 4, 3] == pytest.approx(1.0, abs=1e-6)  # L0H0 is an exact previous-token head


@pytest.mark.heavy
def test_claims_file_claims_appear_with_their_expectations(model, tmp_path):
    from interp.testing import read_claims

    path = tmp_path / "claims.toml"
    path.write_text('[prompts]\nn = 32\nprefix_len = 10\n[claims]\nL1H0 = "induction"\nL0H3 = "not previous_token"\n')
    result = report.build_report(model, tmp_path / "out", prompt_spec=PromptSpec(n=32, prefix_len=10),
                                 heads=[(0, 3), (1, 0)], claims_file=read_claims(path))
    claims = pd.read_csv(result.out_dir / "claims.csv")
    pinned = claims[claims.source == "claims file claims.toml"]
    assert list(zip(pinned.label, pinned.claim, pinned.expect, pinned.passed)) == [
        ("L1H0", "induction", "supported", True), ("L0H3", "previous_token", "refuted", True)]
    assert "expected refuted: as expected" in (result.out_dir / "report.html").read_text()


# --------------------------------------------------------------------------- issue 12: what a reviewer reads


def test_p_values_have_one_format_and_name_the_floor():
    from interp.analyses.report.format import format_p

    assert format_p(1 / 2001, 2000) == "≤ 1/2001"
    assert format_p(float(np.float32(1 / 2001)), 2000) == "≤ 1/2001"  # a float32 floor
    assert format_p(0.0004998 * 1.01, 2000) == "5.0e-04"
    assert format_p(0.00075, 2000) == "7.5e-04"
    assert format_p(0.0123) == "0.012" and format_p(1.0) == "1.000"
    assert format_p(float("nan")) == "n/a" and format_p(None) == "n/a"


@pytest.mark.heavy
def test_every_claim_has_an_evidence_table_row_per_kind(built):
    from interp.analyses.report.format import evidence_rows

    html = (built.out_dir / "report.html").read_text()
    data = built.data
    assert len(data.verdicts) == len(data.claims) and all(v is not None for v in data.verdicts)
    for verdict in data.verdicts:
        rows = evidence_rows(verdict, data.settings["evidence"])
        assert [r.kind for r in rows] == list(verdict.claim.kinds)
        assert {r.status for r in rows} <= {"passed", "failed", "undecided", "not run"}
        for r in rows:
            if r.status == "not run":
                assert r.why, r  # says why
    # one evidence table per claim on the cards; verdicts of every kind get one
    assert html.count('<table class="evidence">') == sum(
        len([p for p in str(lbl).split("~")]) for lbl in data.claims["label"])
    assert "stability" in html and "off by default" in html  # a kind not run says why


def test_evidence_rows_say_why_ablations_did_not_run(model):
    from interp.analyses.claims import previous_token_head
    from interp.analyses.report.format import evidence_rows
    from interp.claims import evaluate_claims
    from interp.data import repeated_tokens

    prompts = repeated_tokens(12, 10, 64, seed=1)
    verdict = evaluate_claims(model, [previous_token_head(0, 0)], prompts, evidence=report.NO_LOSS_EVIDENCE)[0]
    rows = {r.kind: r for r in evidence_rows(verdict, report.NO_LOSS_EVIDENCE)}
    assert rows["observational"].status == "passed" and rows["observational"].p == "≤ 1/2001"
    assert rows["necessity"].status == "not run" and "no meaningful next-token loss" in rows["necessity"].why


def test_findings_are_ranked_by_effect_size_numerically():
    from interp.analyses.report.findings import head_order

    heads = [((1, 10),), ((1, 3),), ((1, 3), (1, 10)), (), ((0, 2),), ((10, 0),)]
    assert sorted(heads, key=head_order) == [(), ((0, 2),), ((1, 3),), ((1, 3), (1, 10)), ((1, 10),), ((10, 0),)]
    claims = pd.DataFrame({
        "label": ["L1H10", "L1H3", "L1H2"], "claim": ["induction"] * 3, "verdict": ["supported"] * 3,
        "observational": [0.5, 0.9, 0.5], "observational_ci_low": [0.4, 0.8, 0.4], "observational_ci_high": [0.6, 1.0, 0.6],
        "p_adjusted": [0.001, 0.01, 0.001]})
    data = report.ReportData({}, pd.DataFrame(), claims, {}, None, None, None, None, None, [], {},
                             claim_heads=[((1, 10),), ((1, 3),), ((1, 2),)])
    table = report.highlights(data, limit=2)
    assert list(table.heads) == ["L1H3", "L1H2"]  # strongest effect first; ties in numeric head order, not text
    assert table.attrs["n_supported"] == 3 and table.attrs["n_shown"] == 2


@pytest.mark.heavy
def test_positional_findings_name_their_offset(built):
    positional = built.highlights[built.highlights.finding.str.contains("positional")]
    assert len(positional) and positional.finding.str.contains(r"offset -?\d+|first position").all()
    html = (built.out_dir / "report.html").read_text()
    n_supported = built.highlights.attrs["n_supported"]
    assert n_supported == len({l for l, v in zip(built.claims.label, built.claims.verdict) if v == "supported"})
    assert f"of {n_supported} supported heads" in html and 'href="#claims"' in html  # the total, and a link to the full table


def test_FD7_FD8_the_caption_counts_what_the_table_shows_and_says_what_ran():
    """The caption read "showing 7 of 7 supported heads" above an inconclusive row ("0 of 0" above two on an own
    model), and "(observational only)" labelled rows whose causal tests had run and failed."""
    from interp.analyses.report.findings import table_caption

    claims = pd.DataFrame({
        "label": ["L1H0", "L0H1", "L0H2"], "claim": ["induction"] * 3, "verdict": ["supported", "inconclusive", "inconclusive"],
        "observational": [0.9, 0.8, 0.7], "observational_ci_low": [0.8, 0.7, 0.6], "observational_ci_high": [1.0, 0.9, 0.8],
        "observational_passed": [True, True, True], "p_adjusted": [0.001, 0.01, 0.01]})
    verdicts = [_verdict(_evidence("observational", 0.9, True), _evidence("necessity", 0.5, True, decisive=True)),
                _verdict(_evidence("observational", 0.8, True), _evidence("necessity", -0.4, False, decisive=True)),
                _verdict(_evidence("observational", 0.7, True))]
    data = report.ReportData({}, pd.DataFrame(), claims, {}, None, None, None, None, None, [], {},
                             claim_heads=[((1, 0),), ((0, 1),), ((0, 2),)], verdicts=verdicts)
    table = report.highlights(data)
    findings = dict(zip(table.heads, table.finding))
    assert findings["L0H1"] == "induction (holds observationally; causal tests refuted)"
    assert findings["L0H2"] == "induction (observational only)"  # no causal test ran
    assert table_caption(table) == ("1 of 1 supported heads and 2 heads that hold observationally but failed or "
                                    "could not decide another test (inconclusive)")
    data.claims = claims.assign(verdict="inconclusive")
    assert table_caption(report.highlights(data)).startswith("no supported head and 3 heads that hold")


def test_FD6_FD9_the_leakage_verdict_in_words_and_where_only_where_to_look(built):
    leak_row = built.highlights[built.highlights.family == "leakage audit"].iloc[0]
    assert leak_row.verdict == "causal" and leak_row.finding.startswith("causal:")  # not numerical_noise / exact_zero
    html = (built.out_dir / "report.html").read_text()
    section = html[html.index('<h2 id="leakage">'):html.index('<h2 id="viewer">')]
    assert "numerical_noise" not in html[:html.index('<h2 id="viewer">')] and "reads" not in section.split("<details>")[0]
    assert "where: the hook, sequence length and query / source positions" in section  # the column explained
    assert "This table shows the leakage verdict," in html


@pytest.mark.heavy
def test_columns_md_defines_every_csv_column_with_a_schema_version(built):
    from interp.analyses.report.format import SCHEMA_VERSION, UNDEFINED

    text = (built.out_dir / "columns.md").read_text()
    assert f"schema version {SCHEMA_VERSION}" in text and UNDEFINED not in text
    for name in ("heads.csv", "claims.csv", "redundancy.csv"):
        for column in pd.read_csv(built.out_dir / name).columns:
            assert f"| `{column}` |" in text, (name, column)
    assert "a difference" in text  # control_random_init is defined as what it is


@pytest.mark.heavy
def test_report_json_has_provenance_schema_and_every_file(built):
    meta = json.loads((built.out_dir / "report.json").read_text())
    files = {p.relative_to(built.out_dir).as_posix() for p in built.out_dir.rglob("*") if p.is_file()}
    assert set(meta["files"]) == files - {report.MARKER, outdir.MANIFEST}
    assert {"redundancy.csv", "columns.md", "report.json"} <= set(meta["files"])
    prov = meta["provenance"]
    assert {"toolkit", "git_commit", "torch", "transformer_lens", "python", "seed", "prompt_hash", "wall_time_s"} <= set(prov)
    assert prov["torch"] == __import__("torch").__version__ and prov["prompt_hash"].startswith("sha256:")
    assert meta["schema_version"] >= 2 and meta["sizes_bytes"]["report.html"] > 0
    html = (built.out_dir / "report.html").read_text()
    summary = (built.out_dir / "summary.md").read_text()
    for text in (html, summary):
        assert prov["prompt_hash"] in text and f"torch {prov['torch']}" in text


@pytest.mark.heavy
def test_why_these_heads_attend_is_in_the_page_the_summary_and_the_json(built):
    attend = json.loads((built.out_dir / "report.json").read_text())["attend"]
    induction = next(h for h in attend["heads"] if h["head"] == "L1H0")  # the constructed circuit's induction head
    assert induction["claim"] == "induction" and induction["pairs"][0]["key_source"] == "L0H0"
    assert [s["source"] for s in induction["sources"]] == ["tok_embed", "L0H0"]
    html, summary = (built.out_dir / "report.html").read_text(), (built.out_dir / "summary.md").read_text()
    assert '<h2 id="attend">Why these heads attend</h2>' in html and "<h3>L1H0</h3>" in html
    assert "## Why these heads attend" in summary and "strongest key-side source L0H0" in summary


@pytest.mark.heavy
def test_methods_match_what_was_drawn_and_run(built):
    import re

    html = (built.out_dir / "report.html").read_text()
    methods = html[html.index('id="methods"'):]
    for check in built.leakage["methods"]:  # every check of the verdict box is named in Methods
        assert check in methods, check
    assert "error bars" in methods and "≤ 1/(B+1)" in methods
    table = html[html.index("Joint ablation"):html.index('id="claims"')]
    assert "one-sided: interaction &gt; 0" in table
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", table).group(1)
    assert header.count("<th>") == 8 and "<th>behaviour</th><th>ablation</th>" in header
    assert re.search(r"p_adj 0\.000\d|0\.00075|9\.99\de-04", html) is None  # no stray p formats


def test_offset_profile_draws_its_interval_and_heat_maps_share_a_scale():
    import numpy as np

    profile = pd.DataFrame({"offset": [-1, 0], "weight": [0.8, 0.2], "weight_ci_low": [0.7, 0.1], "weight_ci_high": [0.9, 0.3]})
    fig = report.plot_offsets(profile, "L0H0")
    from matplotlib.container import ErrorbarContainer

    assert any(isinstance(c, ErrorbarContainer) for c in fig.axes[0].containers)  # the CI is drawn
    pattern = np.full((4, 4), 0.07)
    common = report.plot_pattern(pattern, "L0H0")
    per_head = report.plot_pattern(pattern, "L0H0", per_head=True)
    assert common.axes[0].images[0].get_clim() == (0, 1.0)
    assert per_head.axes[0].images[0].get_clim()[1] == pytest.approx(0.07)
    assert "this head's scale" in per_head.axes[-1].get_ylabel()
    from interp.analyses.report.pipeline import _check_colour_scale

    with pytest.raises(ValueError, match="colour_scale"):
        _check_colour_scale("rainbow")


def test_similarity_map_is_clustered_and_readable_at_72_heads():
    import numpy as np

    from interp.analyses.report.plots import cluster_order, plot_matrix

    sim = np.array([[1, .1, .9, .1], [.1, 1, .1, .8], [.9, .1, 1, .1], [.1, .8, .1, 1.]])
    order = cluster_order(sim)
    assert abs(order.index(0) - order.index(2)) == 1 and abs(order.index(1) - order.index(3)) == 1
    labels = [f"L{l}H{h}" for l in range(6) for h in range(12)]
    fig = plot_matrix(pd.DataFrame(np.eye(72), index=labels, columns=labels), "sim", vmin=0, vmax=1)
    width, height = fig.get_size_inches()
    assert width <= 12 and height <= 11
    assert min(t.get_fontsize() for t in fig.axes[0].get_xticklabels()) >= 4.5


def test_model_aware_prompts_and_warnings(model):
    from interp.data import corpus_tokenizer

    assert report.default_prompt_spec(model).kind == "repeated"
    assert report.prompt_warnings(model, _repeated(model)) == []
    text_model = induction_circuit(n_ctx=32)
    text_model.tokenizer = corpus_tokenizer()
    assert report.default_prompt_spec(text_model).kind == "text"
    assert report.model_prompt_spec(text_model, SPEC, asked=False).kind == "text"
    assert report.model_prompt_spec(text_model, SPEC, asked=True).kind == "repeated"  # random ids only when asked
    warnings = report.prompt_warnings(text_model, _repeated(model))
    assert any("not [CLS]" in w and "--prompts text" in w for w in warnings)


def _repeated(model):
    from interp.specs import build_prompts

    return build_prompts(model, SPEC)


def test_title_is_the_models_name(tmp_path, model):
    folder = tmp_path / "pkg" / "model"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("---\nlibrary_name: x\n---\n\n# all-MiniLM-L6-v2\n\ntext\n# later\n")
    assert report.model_name(model, str(folder)) == "all-MiniLM-L6-v2"
    (folder / "README.md").unlink()
    assert report.model_name(model, str(folder)) == "pkg"  # a generic folder name gives way to its parent's
    assert report.model_name(model, "toy-induction") == "toy-induction"


def test_card_limit_is_checked_from_the_config_before_loading(tmp_path, capsys, monkeypatch):
    from interp import cli

    assert report.heads_before_loading("toy-induction") == (2, 4)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"num_hidden_layers": 6, "num_attention_heads": 12}')
    with pytest.raises(report.ReportTooLarge, match="72 head cards.*--max-cards 72"):
        report.check_cards_before_loading(str(folder), None, None, 64)
    report.check_cards_before_loading(str(folder), None, None, 72)  # raised limit passes
    report.check_cards_before_loading(str(folder), (0, 1), None, 64)  # so does a narrower selection
    monkeypatch.setattr("interp.load", lambda spec: pytest.fail("loaded the model before checking the card limit"))
    assert cli.main(["report", "toy-induction", "--out", str(tmp_path / "r"), "--max-cards", "3", "--quiet"]) == 2
    assert "limit 3" in capsys.readouterr().err


def test_viewer_data_is_compact_and_drops_padding(model):
    import numpy as np

    from interp import viewer
    from interp.data import pad

    prompts = pad([[63, 1, 2, 3, 1, 2, 3], [63, 4, 5]], pad_id=0)
    data = viewer.viewer_data(model, prompts, [(0, 0), (1, 0)])
    assert [len(t) for t in data.tokens] == [7, 3] and data.tokens[1] == ["63", "4", "5"]
    assert data.patterns[0].dtype == np.uint8 and data.patterns[0].shape == (2, 7, 7)
    assert data.patterns[0][0, 4, 3] == 255  # L0H0 is an exact previous-token head
    assert np.abs(data.patterns[0].sum(-1).astype(int) - 255).max() <= 4  # rows still sum to ~1
    page = viewer.viewer_html(data)
    assert "<script src" not in page and "http" not in page and '"levels":255' in page


@pytest.mark.heavy
def test_html_viewer_and_warnings_in_the_page(built):
    html = (built.out_dir / "report.html").read_text()
    assert 'class="attn-viewer"' in html and 'class="av-data"' in html and "this page:" in html
    assert "@@PAGE_SIZE@@" not in html
    assert '<div class="scroll">' in html
    assert "http:" not in html and "https:" not in html  # offline: no URL at all (issue 23)


def test_bidirectional_is_not_shown_as_an_alarm_and_behaviour_is_rendered():
    from types import SimpleNamespace

    from interp.analyses.leakage import LeakageReport, empty_table
    from interp.analyses.report import html as report_html

    leakage = LeakageReport(model_name="encoder", verdict="bidirectional", max_influence=0.0, first_leaking_site=None,
                            leaks=(), table=empty_table())
    section = report_html._leakage_section(SimpleNamespace(leakage=leakage))
    assert 'class="neutral"' in section and "bidirectional (by design)" in section and 'class="refuted"' not in section
    row = pd.Series({"label": "L0H0", "claim": "previous_token", "verdict": "supported", "statement": "L0H0 looks back",
                     "p_adjusted": 0.01, "source": "scan", "behaviour": "masked-LM loss", "observational": 0.9,
                     "observational_ci_low": 0.8, "observational_ci_high": 0.95, "observational_passed": True})
    block = report_html.claim_block(row, None)
    assert "behaviour: masked-LM loss" in block and "observational" in block and "0.900 [0.800, 0.950]" in block


# --------------------------------------------------------------------------- honest headline (issue 20, item 9)


def _evidence(kind, effect, passed, *, decisive=False, metric="", **extra):
    from interp.claims import Evidence

    return Evidence(kind, effect=effect, ci_low=effect - 0.1, ci_high=effect + 0.1, p_value=0.01, rule="CI > 0",
                    passed=passed, decisive=decisive, metric=metric, extra=extra)


def _verdict(*evidence, name="previous_token", params=None):
    from interp.claims import Claim, Verdict

    def gather(claim, ctx):  # never called: the evidence is given
        raise AssertionError

    kinds = {e.kind: gather for e in evidence} | {"observational": gather}
    claim = Claim(name, ((0, 1),), "L0H1 does it", params or {}, {}, kinds)
    return Verdict(claim, "supported", (), tuple(evidence), 0.01, 0.01, 32)


def test_metric_family_separates_weights_argmax_rates_and_causal_effects():
    from interp.analyses.report.findings import ARGMAX, CAUSAL, WEIGHT, metric_family

    row = lambda claim: pd.Series({"claim": claim})
    assert metric_family(row("previous_token"), _verdict(_evidence("observational", 0.8, True, metric="prev_token"))) == WEIGHT
    assert metric_family(row("positional"), _verdict(_evidence("observational", 1.0, True, metric="argmax_at:0"))) == ARGMAX
    assert metric_family(row("x"), _verdict(_evidence("observational", 1.0, True, metric="self_token_argmax"))) == ARGMAX
    loss = _evidence("observational", 0.3, True, behaviour="next-token loss")
    assert metric_family(row("redundant"), _verdict(loss, name="redundant")) == CAUSAL
    # a claims file's rows (no Verdict): by kind
    assert [metric_family(row(k), None) for k in ("positional", "redundant", "dispensable", "induction")] == [
        ARGMAX, CAUSAL, CAUSAL, WEIGHT]


def test_causal_summary_gives_the_verdict_and_the_necessity_interval():
    from interp.analyses.report.findings import NOT_TESTED, causal_summary

    obs = _evidence("observational", 0.8, True)
    assert causal_summary(_verdict(obs)) == NOT_TESTED and causal_summary(None) == NOT_TESTED
    passed = _verdict(obs, _evidence("necessity", 0.5, True), _evidence("sufficiency", 0.9, True))
    assert causal_summary(passed, "nats") == "supported: necessity +0.500 [0.400, 0.600] nats (passed); sufficiency passed"
    refuted = _verdict(obs, _evidence("necessity", -0.5, False, decisive=True))
    assert causal_summary(refuted, "nats").startswith("refuted: necessity -0.500 [-0.600, -0.400] nats (failed)")
    withheld = _verdict(obs, _evidence("necessity", -0.5, False), _evidence("faithfulness", 1.0, True))
    assert causal_summary(withheld, "nats").startswith("inconclusive: necessity")
    from interp.claims import abstain

    assert causal_summary(_verdict(obs, abstain("necessity", "no repeats"))) == NOT_TESTED  # an abstention measured nothing
    cosine = _verdict(obs, _evidence("necessity", 0.002, True))
    assert "cosine distance" in causal_summary(cosine, "cosine distance")


def test_evidence_ablation_reads_the_evidence_then_the_claims_method():
    from interp.analyses.report.format import evidence_ablation

    obs = _evidence("observational", 0.8, True)
    named = _verdict(obs, _evidence("necessity", 0.5, True, ablation="resample"), _evidence("faithfulness", 1.0, True))
    assert evidence_ablation(named) == "resample" and evidence_ablation(named, "faithfulness") == ""
    pair = _verdict(obs, _evidence("necessity", 0.5, True), name="redundant", params={"method": "zero"})
    assert evidence_ablation(pair) == "zero"
    assert evidence_ablation(_verdict(obs)) == "" and evidence_ablation(None) == ""  # no causal evidence ran


def test_collapse_names_evidence_not_run_once():
    from interp.analyses.report.format import EvidenceRow, collapse

    rows = [EvidenceRow("observational", "metric", "0.800", "[0.7, 0.9]", "CI > 0.5", "0.001", "passed", "", False),
            EvidenceRow("control_random_init", "", "", "", "", "", "not run", "skipped: no loss", False),
            EvidenceRow("necessity", "", "", "", "", "", "undecided", "no repeats", False),
            EvidenceRow("stability", "", "", "", "", "", "not run", "off by default", False)]
    kept, line = collapse(rows)
    assert [r.kind for r in kept] == ["observational"]
    assert line == ("not run: control_random_init, skipped: no loss; stability, off by default; "
                    "nothing measured: necessity, no repeats")
    assert collapse(rows, reasons=False)[1] == "not run: control_random_init, stability; nothing measured: necessity"
    assert collapse(rows[:1]) == (rows[:1], "")


def test_name_causal_adds_behaviour_and_ablation_columns():
    from interp.analyses.report.pipeline import name_causal

    frame = pd.DataFrame({"layer": [0], "head": [1], "delta_loss": [0.5], "n_prompts": [32]})
    frame.attrs.update(behaviour="next-token loss on every position", method="mean")
    named = name_causal(frame)
    assert list(named.columns) == ["layer", "head", "delta_loss", "behaviour", "ablation", "n_prompts"]
    assert named.loc[0, "behaviour"] == "next-token loss on every position" and named.loc[0, "ablation"] == "mean"
    own = pd.DataFrame({"delta_loss": [0.5], "ablation": ["resample"]})
    own.attrs.update(behaviour="b", method="mean")
    assert name_causal(own).loc[0, "ablation"] == "resample"  # a frame that names its ablation keeps it
    with pytest.raises(ValueError, match="names no behaviour"):
        name_causal(pd.DataFrame({"delta_loss": [0.5]}))


def test_families_are_ranked_apart_and_argmax_rates_say_so():
    claims = pd.DataFrame({
        "label": ["L0H1", "L1H2"], "layer": [0, 1], "head": [1, 2], "claim": ["positional", "induction"],
        "verdict": ["supported"] * 2, "observational": [1.0, 0.6], "observational_ci_low": [1.0, 0.5],
        "observational_ci_high": [1.0, 0.7], "p_adjusted": [0.001, 0.001], "offset": [0, None],
        "necessity": [float("nan"), 0.4], "necessity_ci_low": [float("nan"), 0.3], "necessity_ci_high": [float("nan"), 0.5],
        "necessity_passed": [None, True], "behaviour": ["", "next-token loss"]})
    heads = pd.DataFrame({"label": ["L0H1", "L1H2"], "self_token": [0.455, 0.1]})
    data = report.ReportData({}, heads, claims, {}, None, None, None, None, None, [], {},
                             claim_heads=[((0, 1),), ((1, 2),)])
    table = report.highlights(data)
    assert list(table.family) == ["attention weight", "argmax rate"]  # 1.0 of queries never outranks a weight of 0.6
    argmax = table.iloc[1]
    assert argmax.evidence.startswith("the maximum weight sits on the query itself for 100% [100%, 100%] of queries "
                                      "(argmax rate; mean weight there 0.455)")
    assert argmax.causal == "not tested causally" and argmax.behaviour == ""
    weight = table.iloc[0]
    assert weight.evidence.startswith("mean attention weight 0.600 [0.500, 0.700] on the claimed keys (in [0, 1])")
    assert weight.causal == "supported: necessity +0.400 [0.300, 0.500] nats (passed)"
    assert weight.behaviour == "next-token loss"


@pytest.mark.heavy
def test_report_findings_and_tables_name_the_behaviour_and_the_ablation(built):
    table = built.highlights
    claims_rows = table[table.verdict.isin(["supported", "inconclusive"])]
    assert (claims_rows.causal != "").all()  # every finding shows its causal verdict, or says it was not tested
    positional = claims_rows[claims_rows.finding.str.startswith("positional")]
    assert len(positional) and (positional.family == "argmax rate").all()
    assert positional.evidence.str.contains("argmax rate").all()
    # positional claims are tested causally too: knocking out the attention at their offset
    assert positional.causal.str.contains("necessity").all()
    assert (positional.ablation == "attention knockout").all()
    causal = table[(table.causal.str.contains("necessity")) | (table.verdict == "measured")]
    assert len(causal) and (causal.behaviour != "").all()
    assert causal.ablation.isin(["mean", "attention knockout"]).all()
    measured = built.data.settings["behaviour"]["measured"]
    heads = pd.read_csv(built.out_dir / "heads.csv")
    assert (heads.behaviour == measured).all() and (heads.ablation == "mean").all()
    pairs = pd.read_csv(built.out_dir / "redundancy.csv")
    assert (pairs.behaviour == measured).all() and (pairs.ablation == "mean").all()
    claims = pd.read_csv(built.out_dir / "claims.csv")
    tested = claims.necessity.notna()
    assert tested.any() and claims.ablation[~tested].isna().all()
    assert claims.ablation[tested].isin(["mean", "attention knockout"]).all()
    assert list(claims.columns).index("ablation") == list(claims.columns).index("behaviour") + 1


@pytest.mark.heavy
def test_evidence_not_run_is_one_line_not_a_row(built):
    html = (built.out_dir / "report.html").read_text()
    assert '<td class="not-run">' not in html  # no row of empty cells per kind not run
    assert "not run: stability, off by default" in html
    assert "; not run: stability</td>" in html  # the All claims table names it once per claim


@pytest.mark.heavy
def test_glossary_states_the_minimum_effects_and_the_sufficiency_convention(built):
    from interp.analyses.report.format import TERMS, define
    from interp.claims import MIN_EFFECT

    minimum = TERMS["practical minimum effect"]
    assert all(f"{value:g} {unit}" in minimum for unit, value in MIN_EFFECT.items())
    assert "CI above 0 alone never supports" in minimum and "not a paper's" in minimum
    assert "convention" in TERMS["sufficiency threshold"] and "not a threshold taken from a paper" in TERMS["sufficiency threshold"]
    for column in ("behaviour", "ablation", "family", "causal", "finding", "evidence"):
        assert define(column), column
    html = (built.out_dir / "report.html").read_text()
    assert "practical minimum effect" in html and "sufficiency threshold" in html


@pytest.mark.heavy
def test_head_cards_name_the_behaviour_of_importance(built):
    from interp.analyses.report import html as report_html

    row = built.data.heads.iloc[0]
    card = report_html._metric_table(row)
    assert "<th>behaviour</th><th>ablation</th>" in card
    assert f"<td>{report_html.esc(row['behaviour'])}</td><td>mean</td>" in card
    assert "<th>behaviour</th>" not in report_html._metric_table(row.drop(["importance", "importance_ci_low", "importance_ci_high"]))


def test_a_restricted_report_says_what_every_head_would_cost(tiny_gpt):
    """Scan claims and importance grow with the heads chosen, similarity with their pairs: the Methods line
    extrapolates the time they took here to every head of the model."""
    from interp.analyses.report.pipeline import restricted_cost

    timings = {"claims": 10.0, "importance": 2.0, "head similarity": 1.0, "viewer": 50.0}
    line, = restricted_cost(tiny_gpt, [(1, 0), (1, 1), (1, 2), (1, 3)], timings)  # 4 of 8 heads
    assert "ran on the 4 chosen heads only (here 13 s); for all 8 heads of the model they would take about 28 s" in line
    assert restricted_cost(tiny_gpt, [(l, h) for l in range(2) for h in range(4)], timings) == []
