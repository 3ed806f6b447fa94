"""`interp circuit` and the report's circuit section, on the constructed induction circuit (known edges)."""
import json

import pytest
import torch

from interp import cli
from interp.data import random_tokens, repeated_tokens
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
    # c024: prompts with no behaviour to explain (random tokens) leave the section out, saying why; the report runs
    noise = report_circuit(induction_circuit(), random_tokens(16, 12, 63, seed=3), seed=0)
    assert noise.summary is None and "within its noise" in noise.note


# --------------------------------------------------------------------------- issue 36: messages, --n, empty circuits


def test_c019_FD5_a_model_without_split_inputs_is_told_what_works(capsys):
    """The advice was interp.load(..., backend='native'), which returns the same intercepted model. A nanoGPT-layout
    module is told its own conversion, with its model_args; following it gives a model the circuit runs on."""
    assert cli.main(["circuit", "own_models:nanogpt_flash", "-q", "--n", "8"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "split q/k/v inputs" in err and "backend='native'" not in err
    args = "{'n_layer': 2, 'n_head': 4, 'n_embd': 32, 'block_size': 32, 'vocab_size': 61, 'bias': True}"
    assert "NanoStyleGPT has nanoGPT's layout" in err and f"from_nanogpt({args}, model.state_dict())" in err
    assert f"torch.save({{'model_args': {args}, 'model': model.state_dict()}}, 'ckpt.pt')" in err


def test_following_the_nanogpt_advice_gives_a_model_with_split_inputs(tmp_path, capsys):
    from own_models import nanogpt_flash

    import interp
    from interp.paths import check_graph_model

    model = nanogpt_flash()
    args = {"n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": 32, "vocab_size": 61, "bias": True}
    torch.save({"model_args": args, "model": model.state_dict()}, tmp_path / "ckpt.pt")
    converted = interp.load(tmp_path / "ckpt.pt")
    check_graph_model(converted)  # what the circuit needs
    tokens = torch.randint(0, 61, (2, 16))
    torch.testing.assert_close(converted(tokens), model(tokens), atol=1e-4, rtol=0)
    # the CLI then gets past the model's structure to its behaviour (a random model has none to explain)
    assert cli.main(["circuit", str(tmp_path / "ckpt.pt"), "-q", "--n", "8", "--method", "nodes"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "split q/k/v" not in err and "within its noise" in err


@pytest.mark.parametrize("spec, backend, says", [
    ("own_models:direct_sdpa", "auto", "No conversion exists for DirectSDPA, a module of your own"),
    ("own_models:hf_gpt2", "sdpa", "GPT2LMHeadModel is a Hugging Face model hooked by interception"),
])
def test_other_intercepted_models_are_told_what_works_for_them(spec, backend, says, capsys):
    assert cli.main(["circuit", spec, "-q", "--n", "8", "--backend", backend]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and "backend='native'" not in err and "head claims (interp.test_claims" in err


def test_FD5_the_reports_circuit_note_ends_in_one_full_stop():
    from own_models import nanogpt_flash

    import interp
    from interp.analyses.report.circuit import report_circuit
    from interp.analyses.report.html import circuit_html, circuit_markdown

    skipped = report_circuit(interp.load(nanogpt_flash()), repeated_tokens(8, 4, 60), seed=0)
    assert skipped.note.endswith(".") and "backend='native'" not in skipped.note
    assert circuit_html(skipped, {}).split("</p>")[0].endswith("claims) work.")  # one full stop, not ".." as before
    assert not any(line.endswith("..") for line in circuit_markdown(skipped))


@pytest.mark.parametrize("n", ["2", "3"])
def test_c021_c022_too_few_prompts_name_the_flag(n, capsys):
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--n", n]) == 2
    err = capsys.readouterr().err
    assert f"{n} prompts: pass --n 4 at least" in err and "each half needs 2 prompts" in err
    assert "Give prompts of equal lengths" not in err


def test_c030_prompts_longer_than_the_context_say_what_a_cli_user_can_do(tmp_path, capsys):
    prompts = tmp_path / "long.json"
    prompts.write_text(json.dumps([[1] * 140] + [[2] * 10] * 4))  # the constructed model's context: 128
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--prompts", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert "row 0 holds 140 token ids but the model's context is n_ctx=128" in err and "max_len=" not in err
    assert "shorten the file's rows to 128 tokens at most" in err


def test_c036_c031_n_takes_the_first_rows_of_a_json_file_as_of_a_txt_file(tmp_path):
    from interp.specs import PromptSpec, build_prompts

    model = induction_circuit()
    (tmp_path / "p.json").write_text(json.dumps([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16],
                                                 [1, 2, 3, 5], [5, 6, 7, 9]]))
    four = build_prompts(model, PromptSpec.parse(str(tmp_path / "p.json"), n=4))
    assert four.tokens.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
    assert len(build_prompts(model, PromptSpec.parse(str(tmp_path / "p.json")))) == 6  # without --n: every row


def test_c048_an_empty_circuit_exits_1_with_a_message_and_still_writes_its_json(found, tmp_path, capsys, monkeypatch):
    import dataclasses

    import interp.analyses.circuits.summary as summary

    empty = dataclasses.replace(found, circuit=dataclasses.replace(found.circuit, edges=(), nodes=(), threshold=0.99),
                                edges=found.edges.iloc[0:0])
    monkeypatch.setattr(summary, "circuit_summary", lambda *a, **k: empty)
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--threshold", "0.99", "--json", str(tmp_path / "c.json")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "no edge kept: at threshold 0.99" in out and "Pass a lower --threshold" in out
    assert json.loads((tmp_path / "c.json").read_text())["result"]["circuit"]["edges"] == []


def test_cli_circuit_nodes_method_and_the_acdc_budget(tmp_path, capsys):
    """--method nodes finds the circuit's heads; ACDC above --max-edges is refused with its estimate (exit 2)."""
    out, png = tmp_path / "nodes.json", tmp_path / "nodes.png"
    argv = ["circuit", CONSTRUCTED, "-q", "--n", "32", "--method", "nodes", "--json", str(out), "--png", str(png)]
    assert cli.main(argv) == 0
    result = json.loads(out.read_text())["result"]
    assert result["circuit"]["method"] == "nodes" and result["circuit"]["nodes"] == ["embed", "L0H0", "L1H0", "logits"]
    # read by its nodes: each kept head's removal cost from the circuit (the test's minimality rows), no edge patched
    by_node = {row["node"]: row for row in result["nodes"]}
    assert set(by_node) == {"L0H0", "L1H0"} and all(row["effect"] > 0.1 and row["ci_low"] > 0 for row in by_node.values())
    minimality = {row["test"]: row for row in result["tests"]}["minimality"]
    assert min(row["effect"] for row in by_node.values()) == pytest.approx(minimality["value"])
    assert "smallest kept node's removal cost" in minimality["unit"]
    assert all(edge["effect"] is None for edge in result["edges"]) and len(result["edges"]) == len(result["circuit"]["edges"])
    printed = " ".join(capsys.readouterr().out.split())
    assert "removal cost from the circuit" in printed and "L1H0" in printed and "edges between these nodes" in printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
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


# --------------------------------------------------------------------------- issue 42: the curve, per-prompt values


def test_cli_circuit_curve_reaches_one_once_every_true_edge_is_in(tmp_path, capsys, monkeypatch):
    """On the hand-set induction circuit (5 true edges of 81) ACDC's scores rank the true edges first, so the curve is
    1 at every fraction whose kept edges hold all of them and 0 where none is kept; CPR beats every random ranking."""
    from factories import INDUCTION_EDGES

    from interp.paths import parse_edge

    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "c.json"
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--n", "32", "--curve", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Faithfulness curve of the acdc scores (MIB) on 16 held-out prompts" in printed
    assert "CPR (signed scores; higher is better)" in printed and max(map(len, printed.splitlines())) <= 80
    curve = json.loads(out.read_text())["result"]["curve"]
    assert curve["schema"] == "interp.faithfulness_curve/1" and curve["score_name"] == "acdc"
    assert curve["n_proposing"] == 16 and curve["n_prompts"] == 16 and curve["n_total_edges"] == 81
    ranked = sorted(curve["scores"], key=lambda label: -curve["scores"][label])  # the signed ranking
    truth = {parse_edge(e).label for e in INDUCTION_EDGES}
    last_true = max(ranked.index(label) for label in truth) + 1  # the top this many hold every true edge
    signed = curve["curves"]["signed"]
    for n, point in zip(signed["n_selected"], signed["faithfulness"]):
        if n >= last_true:
            assert point["mean"] == pytest.approx(1.0, abs=1e-6) and point["ci_low"] == pytest.approx(1.0, abs=1e-6)
        if n == 0:
            assert point["mean"] == 0.0
    assert any(n < last_true for n in signed["n_selected"]) and signed["n_selected"][-1] == 81
    assert curve["cpr"]["ci_low"] > curve["random"]["cpr"]["ci_high"]  # above the best of the 5 random rankings
    assert curve["cmd"]["ci_high"] < curve["random"]["cmd"]["ci_low"]
    assert curve["cpr"]["ci_low"] <= curve["cpr"]["mean"] <= curve["cpr"]["ci_high"] <= 0.999


def test_cli_circuit_without_curve_writes_null_and_passes_the_flag(found, tmp_path, monkeypatch):
    import interp.analyses.circuits.summary as summary

    asked = {}
    monkeypatch.setattr(summary, "circuit_summary", lambda *a, **k: asked.update(k) or found)
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--json", str(tmp_path / "c.json")]) == 0
    assert asked["curve"] is False and json.loads((tmp_path / "c.json").read_text())["result"]["curve"] is None


def test_circuit_test_values_are_per_prompt_and_give_the_faithfulness(found, tmp_path, monkeypatch):
    import torch

    values = found.test.values
    assert set(values) == {"clean", "all_patched", "circuit_only"}
    assert all(v.dtype == torch.float64 and v.shape == (16,) for v in values.values())
    gap = values["clean"] - values["all_patched"]
    recomputed = float((values["circuit_only"] - values["all_patched"]).mean() / gap.mean())
    assert recomputed == pytest.approx(found.test.faithfulness.mean, abs=1e-9)
    assert float(values["clean"].mean()) == pytest.approx(found.test.clean, abs=1e-9)
    import interp.analyses.circuits.summary as summary

    monkeypatch.setattr(summary, "circuit_summary", lambda *a, **k: found)
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--json", str(tmp_path / "c.json")]) == 0
    written = json.loads((tmp_path / "c.json").read_text())["result"]["values"]
    assert written == {name: v.tolist() for name, v in values.items()}


def test_issue42_a_gap_within_noise_exits_2_naming_it(capsys):
    """Random tokens: the constructed induction circuit has nothing to do, so patching every edge moves the loss by
    noise only; a circuit found there would be a fraction of noise, so the command refuses (exit 2), saying why."""
    assert cli.main(["circuit", CONSTRUCTED, "-q", "--n", "16", "--prompts", "random", "--curve"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the clean-vs-patched gap is" in err and "within its noise" in err and "nothing for a circuit to explain" in err


def test_report_circuit_section_draws_the_curve(tmp_path):
    from interp.analyses.report.circuit import CircuitSection, report_circuit
    from interp.analyses.report.html import circuit_html, circuit_markdown
    from interp.analyses.report.plots import circuit_figures

    section = report_circuit(induction_circuit(), repeated_tokens(32, 10, 63, bos=63), seed=0)
    assert isinstance(section, CircuitSection) and section.summary is not None
    curve = section.summary.curve
    assert curve is not None and curve.score_name == "acdc" and curve.cpr.mean > 0.9
    images = circuit_figures(section, tmp_path)
    assert images == {"circuit": "plots/circuit.png", "circuit_curve": "plots/circuit_curve.png"}
    assert (tmp_path / "circuit_curve.png").read_bytes().startswith(b"\x89PNG")
    page = circuit_html(section, images)
    assert "<h3>Faithfulness over circuit sizes (MIB's CPR and CMD)</h3>" in page
    assert f"CPR {curve.cpr.mean:.3f} [{curve.cpr.ci_low:.3f}, {curve.cpr.ci_high:.3f}]" in page
    assert 'src="plots/circuit_curve.png"' in page and "random rankings: CPR" in page
    assert any(line.startswith("Faithfulness over circuit sizes (acdc scores") for line in circuit_markdown(section))
    document = section.to_json()
    assert document["curve"]["cpr"]["mean"] == pytest.approx(curve.cpr.mean)
    json.dumps(document, allow_nan=False)


def test_cli_circuit_eap_prints_how_it_chose_and_its_note(tmp_path, capsys, monkeypatch):
    """issue 42 item 5: the top-n EAP kept, its exact faithfulness, and the note that its estimates are unreliable."""
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.warns(UserWarning, match="EAP estimates unreliable"):
        code = cli.main(["circuit", CONSTRUCTED, "-q", "--method", "eap", "--n", "32", "--json", str(tmp_path / "c.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "EAP kept the top 8 edges by |estimate| (fraction 0.1; 7 after pruning): exact faithfulness 1.000" in out
    assert "note: EAP estimates unreliable here" in out
    circuit = json.loads((tmp_path / "c.json").read_text())["result"]["circuit"]
    assert circuit["selection"]["n_selected"][circuit["selection"]["chosen"]] == 8 and len(circuit["notes"]) == 1


def test_cli_circuit_names_the_edges_it_kept_untested(tmp_path, capsys):
    """A positional sender's edges cannot be tested by resampling: the terminal says which were kept untested and why."""
    argv = ["circuit", "interp.models.handbuilt:positional_sender", "-q", "--n", "32", "--prompts", "repeated",
            "--prefix-len", "2", "--json", str(tmp_path / "c.json")]
    assert cli.main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    untested = json.loads((tmp_path / "c.json").read_text())["result"]["circuit"]["untested"]
    assert untested and f"{len(untested)} edges kept untested" in out
    assert "the corruption does not change L0H0's write" in out


def test_report_circuit_section_names_the_untested_edges():
    from interp.analyses.circuits.summary import circuit_summary
    from interp.analyses.report.circuit import CircuitSection
    from interp.analyses.report.html import circuit_html, circuit_markdown
    from interp.models import handbuilt

    found = circuit_summary(handbuilt.positional_sender(), repeated_tokens(32, 2, 63, bos=63, n_repeats=10))
    assert found.circuit.untested
    page, lines = circuit_html(CircuitSection(found), {}), "\n".join(circuit_markdown(CircuitSection(found)))
    assert "L0H0 -&gt; L1H0 via k" in page and "L0H0 -> L1H0 via k" in lines  # escaped in HTML, plain in markdown
    for text in (page, lines):
        assert f"{len(found.circuit.untested)} edges kept untested" in text
        assert "the corruption does not change L0H0" in text and "never support by itself)." in text


def test_cli_circuit_on_grouped_query_attention_names_key_value_heads(tmp_path, capsys):
    """`interp circuit` on the grouped induction circuit (tests/factories.py): its key and value edges are named by
    the key/value heads in the table and the JSON, and the circuit is faithful (the kept key edge is kept)."""
    path = tmp_path / "c.json"
    assert cli.main(["circuit", "factories:grouped_induction_circuit", "-q", "--json", str(path)]) == 0
    assert "L0H0 -> L1KV0 via k" in capsys.readouterr().out
    result = json.loads(path.read_text())["result"]
    assert set(result["circuit"]["edges"]) == {"embed -> L0KV0 via v", "L0H0 -> L1KV0 via k", "embed -> L1H0 via q",
                                               "embed -> L1KV0 via v", "L1H0 -> logits"}
    assert {e["receiver"] for e in result["edges"]} == {"L0KV0", "L1KV0", "L1H0", "logits"}
    faithfulness = next(t for t in result["tests"] if t["test"] == "faithfulness")
    assert faithfulness["value"] == pytest.approx(1.0, abs=0.02)
@pytest.mark.parametrize("spec, backend, patch", [
    ("own_models:nanogpt_flash", "auto", True), ("own_models:hf_gpt2", "sdpa", True),
    ("own_models:direct_sdpa", "auto", False), ("own_models:rotary_gpt_trained", "auto", True),
])
def test_what_the_refusal_says_works_on_an_intercepted_model_runs(spec, backend, patch, capsys):
    """interp circuit's refusal names direct logit attribution per head and head -> layer patching: each runs on the
    model as it is (the patch where its attention reads a norm; DirectSDPA has one layer and none)."""
    import interp
    from interp.analyses.circuits import attention_input_patch, direct_logit_attribution
    from interp.modelinfo import vocab_size

    assert cli.main(["circuit", spec, "-q", "--n", "8", "--backend", backend]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "direct_logit_attribution" in err and "attention_input_patch" in err and "(interp qk)" in err
    model = interp.load(spec, backend=backend)
    prompts = repeated_tokens(8, 4, vocab_size(model), bos=0)
    assert direct_logit_attribution(model, prompts)["mean"].notna().all()
    if patch:
        assert attention_input_patch(model, prompts, sender="L0H0", layer=1)["effect"].notna().all()
