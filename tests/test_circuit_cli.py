"""`interp circuit` and the report's circuit section, on the constructed induction circuit (known edges)."""
import json

import pytest

from interp import cli
from interp.data import repeated_tokens
from interp.models.constructed import induction_circuit

CONSTRUCTED = "interp.models.constructed:induction_circuit"
DISPENSABLE = ("L0H1", "L0H2", "L0H3", "L1H1", "L1H2", "L1H3")


@pytest.fixture(scope="module")
def found():
    from interp.analyses.circuits.summary import circuit_summary

    return circuit_summary(induction_circuit(), repeated_tokens(32, 10, 63, bos=63))


def test_circuit_summary_finds_the_induction_edges(found):
    edges = list(found.edges.edge)
    assert "L0H0 -> L1H0 via k" in edges and "L1H0 -> logits" in edges
    assert not any(head in edge for edge in edges for head in DISPENSABLE), edges  # nothing reads the fillers
    k_edge = found.edges.set_index("edge").loc["L0H0 -> L1H0 via k"]
    assert k_edge.effect > 1 and k_edge.ci_low > 0 and k_edge.unit == "nats" and k_edge.n_prompts == 16
    assert found.test is not None and found.test.faithfulness.mean > 0.9
    document = found.to_json()
    assert document["circuit"]["edges"] == list(found.circuit.edges) and len(document["edges"]) == len(edges)
    assert [t["test"] for t in document["tests"]] == ["faithfulness", "completeness", "minimality"]
    json.dumps(document, allow_nan=False)  # plain JSON: no NaN


def test_cli_circuit_prints_writes_json_and_a_drawing(found, tmp_path, capsys, monkeypatch):
    import interp.analyses.circuits.summary as summary

    monkeypatch.setattr(summary, "circuit_summary", lambda *a, **k: found)  # the CLI's wiring, not discovery again
    monkeypatch.setenv("COLUMNS", "80")
    png = tmp_path / "circuit.png"
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--png", str(png), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "L0H0 -> L1H0 via k" in out and "faithfulness" in out and max(map(len, out.splitlines())) <= 80, out
    assert png.read_bytes().startswith(b"\x89PNG")
    document = json.loads((tmp_path / "c.json").read_text())
    assert document["command"] == "circuit" and document["result"]["circuit"]["method"] == "acdc"


def test_cli_circuit_bad_input_exits_2(tmp_path, capsys):
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--png", str(tmp_path / "x.jpg")]) == 2
    assert "expected a .png file name" in capsys.readouterr().err
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--png", str(tmp_path / "missing" / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error
        cli.main(["circuit", CONSTRUCTED, "--threshold", "1.5"])
    assert exit_info.value.code == 2
    assert "outside [0, 1)" in capsys.readouterr().err


def test_report_circuit_section(found, tmp_path):
    from interp.analyses.report.circuit import CircuitSection, report_circuit
    from interp.analyses.report.html import circuit_html, circuit_markdown
    from interp.analyses.report.plots import circuit_figures

    section = CircuitSection(found)
    images = circuit_figures(section, tmp_path)
    assert images == {"circuit": "plots/circuit.png"} and (tmp_path / "circuit.png").is_file()
    page = circuit_html(section, images)
    assert '<h2 id="circuit">Circuit</h2>' in page and "L0H0 -&gt; L1H0 via k" in page and "faithfulness" in page
    assert "## Circuit" in circuit_markdown(section) and section.to_json()["circuit"]["method"] == "acdc"
    from interp.models import GPTConfig, HookedGPT

    post_norm = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20, n_ctx=16, post_norm=True)).eval()
    skipped = report_circuit(post_norm, repeated_tokens(8, 4, 19), seed=0)
    assert skipped.summary is None and "pre-norm" in skipped.note and skipped.to_json() == {"skipped": skipped.note}
    assert "No circuit: " in circuit_html(skipped, {}) and circuit_figures(skipped, tmp_path) == {}
    assert report_circuit(induction_circuit(), repeated_tokens(8, 4, 63), seed=0, has_loss=False).summary is None


def test_cli_circuit_nodes_method_and_the_acdc_budget(tmp_path, capsys):
    """--method nodes finds the circuit's heads; ACDC above --max-edges is refused with its estimate (exit 2)."""
    out = tmp_path / "nodes.json"
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--n", "32", "--method", "nodes", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["result"]
    assert result["circuit"]["method"] == "nodes" and result["circuit"]["nodes"] == ["embed", "L0H0", "L1H0", "logits"]
    capsys.readouterr()
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--n", "32", "--max-edges", "10"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ACDC patches each of the model's 81 edges once" in err and "--method nodes" in err


def test_summary_measures_the_largest_scored_edges_only(monkeypatch):
    import interp.analyses.circuits.summary as summary

    monkeypatch.setattr(summary, "MAX_EDGE_EFFECTS", 2)
    capped = summary.circuit_summary(induction_circuit(), repeated_tokens(32, 10, 63, bos=63))
    measured = capped.edges.dropna(subset=["effect"])
    assert len(measured) == 2 and len(capped.edges) == len(capped.circuit.edges)
    scores = capped.edges.set_index("edge").score.abs()
    assert scores[measured.edge].min() >= scores.drop(measured.edge).max()
