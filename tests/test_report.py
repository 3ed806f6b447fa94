"""Per-head pattern reports: contents, self-containedness, determinism, and refusing bad output dirs."""
import json
import os
from html.parser import HTMLParser

import pandas as pd
import pytest

from analyses import report
from interp.specs import PromptSpec
from models.constructed import induction_circuit

SPEC = PromptSpec(kind="repeated", n=24, prefix_len=10, seed=0)


@pytest.fixture(scope="module")
def model():
    return induction_circuit(n_ctx=32)


@pytest.fixture(scope="module")
def built(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "first"
    return report.build_report(model, out, spec="models.constructed:induction_circuit", prompt_spec=SPEC)


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


def test_report_directory_has_every_file(built):
    out = built.out_dir
    for name in ("report.html", "heads.csv", "claims.csv", "summary.md", "report.json", "redundancy.csv", report.MARKER):
        assert (out / name).is_file(), name
    assert not list(out.parent.glob(".first.*")), "a temporary sibling was left behind"


def test_html_is_self_contained_and_every_image_exists(built):
    html = (built.out_dir / "report.html").read_text()
    parser = _Collector()
    parser.feed(html)
    assert parser.mismatched == [] and parser.open == []  # every element closed, in order
    assert parser.scripts == [] and parser.links == []  # no CDN, no external CSS or JS
    assert "http://" not in html and "https://" not in html
    assert len(parser.images) == 8 + 2  # one card per head, similarity and importance
    for src in parser.images:
        assert not src.startswith(("/", "http")), src
        assert (built.out_dir / src).is_file(), f"report.html references missing {src}"
        assert (built.out_dir / src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for section in ("leakage", "heads", "redundancy", "claims", "methods"):
        assert section in parser.ids
    assert {f"L{l}H{h}" for l in range(2) for h in range(4)} <= parser.ids


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


def test_claims_csv_and_leakage_verdict(built):
    claims = pd.read_csv(built.out_dir / "claims.csv")
    assert {"label", "claim", "verdict", "p_adjusted", "reasons", "source"} <= set(claims.columns)
    assert set(claims.verdict) <= {"supported", "refuted", "inconclusive"}
    assert built.leakage["causal"] is True
    html = (built.out_dir / "report.html").read_text()
    assert built.leakage["verdict"] in html


def test_summary_and_highlights(built):
    summary = (built.out_dir / "summary.md").read_text()
    assert summary.startswith("# Attention report")
    assert "## Methods" in summary and "Benjamini-Hochberg" in summary
    supported = built.highlights[built.highlights.verdict == "supported"]
    findings = dict(zip(supported.heads, supported.finding))
    assert "previous_token" in findings["L0H0"] and "induction" in findings["L1H0"]
    assert built.highlights.finding[0].startswith("causal")  # the leakage verdict comes first
    meta = json.loads((built.out_dir / "report.json").read_text())
    assert meta["settings"]["seed"] == 0 and meta["settings"]["prompts"]["n"] == 24


def test_two_runs_give_identical_csvs(built, model, tmp_path):
    again = report.build_report(model, tmp_path / "second", spec="models.constructed:induction_circuit", prompt_spec=SPEC)
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


def test_a_failure_leaves_nothing_half_written(model, tmp_path, monkeypatch):
    def broken(data, folder):
        (folder / "heads.csv").write_text("partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(report, "render", broken)
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
    assert cli.main(["report", "models.constructed:induction_circuit", "--out", str(tmp_path)]) == 2
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


def test_claims_file_claims_appear_with_their_expectations(model, tmp_path):
    from interp.testing import read_claims

    path = tmp_path / "claims.toml"
    path.write_text('[prompts]\nn = 12\nprefix_len = 10\n[claims]\nL1H0 = "induction"\nL0H3 = "not previous_token"\n')
    result = report.build_report(model, tmp_path / "out", prompt_spec=PromptSpec(n=12, prefix_len=10),
                                 heads=[(0, 3), (1, 0)], claims_file=read_claims(path))
    claims = pd.read_csv(result.out_dir / "claims.csv")
    pinned = claims[claims.source == "claims file claims.toml"]
    assert list(zip(pinned.label, pinned.claim, pinned.expect, pinned.passed)) == [
        ("L1H0", "induction", "supported", True), ("L0H3", "previous_token", "refuted", True)]
    assert "expected refuted: as expected" in (result.out_dir / "report.html").read_text()
