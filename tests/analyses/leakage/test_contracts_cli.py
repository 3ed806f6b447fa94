"""`interp audit-leakage` with the contract flags (issue 40), in-process: bad input exits 2 with what is needed, each
flag is explained in `--help` with an example, and a broken contract comes out as its own SARIF rule, JUnit case and
JSON entry."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from interp import cli  # noqa: E402
from interp.schemas import JSON_SCHEMA  # noqa: E402

TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def run(args: list[str], folder: Path) -> tuple[int, dict | None]:
    target = folder / "audit.json"
    try:
        code = cli.main(["audit-leakage", *args, "--quiet", "--max-len", "16", "--json", str(target)])
    except SystemExit as stop:  # argparse
        code = stop.code if isinstance(stop.code, int) else 2
    return code, json.loads(target.read_text()) if target.exists() else None


@pytest.mark.parametrize("args, words", [
    (["leakzoo.windows:hf_window", "--window", "0"], "at least 1"),
    (["leakzoo.windows:hf_window", "--window", "wide"], "not a window"),
    (["leakzoo.packed:nano_doc_sep", "--doc-sep", "64"], "not a token id of this model's vocabulary (0..63)"),
    (["leakzoo.packed:nano_doc_sep", "--doc-sep", "-1"], "ids start at 0"),
    (["leakzoo.nanostyle:flash", "--kv-cache"], "has no KV cache to audit"),
    (["leakzoo.nanostyle:flash", "--packed"], "`position_ids` resetting to 0 at each document start; `cu_seq_lens` / "
                                              "`cu_seqlens`; `document_ids` / `seq_ids` / `segment_ids`"),
    (["leakzoo.nanostyle:flash", "--window", "config"], "declares no sliding window"),
    (["leakzoo.nanostyle:flash", "--attn-impls"], "no attention implementation switch"),
    (["leakzoo.nanostyle:flash", "--attn-impls", "eager,fast"], "give implementations among"),
    (["leakzoo.nanostyle:flash", "--compiled"], "add --attn-impls (e.g. --attn-impls eager,flex_attention), or drop"),
])
def test_bad_contract_input_exits_2_saying_what_is_needed(args, words, on_path, tmp_path, capsys):
    code, _ = run(args, tmp_path)
    assert code == 2
    assert words in " ".join(capsys.readouterr().err.split())


def test_a_model_failing_under_a_mode_exits_2_naming_the_mode(on_path, tmp_path, capsys):
    """hf_window takes past_key_values but keeps no cache (it raises): the user's model failed, not the toolkit."""
    code, envelope = run(["leakzoo.windows:hf_window", "--kv-cache"], tmp_path)
    assert code == 2 and envelope is not None and envelope["error"]["type"] == "ModelError"
    assert "the kv_cache contract could not run" in envelope["error"]["message"]


def test_help_explains_each_flag_with_an_example(capsys):
    with pytest.raises(SystemExit):
        cli.main(["audit-leakage", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, example in [("--packed", "e.g. --packed"), ("--doc-sep TOKEN", "e.g. --doc-sep 50256"),
                          ("--kv-cache", "e.g. --kv-cache"), ("--window W|config", "e.g. --window 4096"),
                          ("--attn-impls", "e.g. --attn-impls eager,sdpa,flex_attention"),
                          ("--packed-prompts FILE.json", "e.g. --packed-prompts rows.json"),
                          ("--compiled", "e.g. --attn-impls eager,flex_attention --compiled")]:
        assert flag in text and example in text, flag
    assert "i-W < j <= i" in text


def test_a_broken_contract_is_its_own_sarif_rule_junit_case_and_json_entry(on_path, tmp_path):
    sarif, junit = tmp_path / "audit.sarif", tmp_path / "audit.xml"
    code, envelope = run(["leakzoo.packed:eos_over_masks", "--packed", "--sarif", str(sarif), "--junit", str(junit)],
                         tmp_path)
    assert code == 1 and envelope is not None and envelope["schema"] == JSON_SCHEMA
    result = envelope["result"]
    assert result["leaks"] == ["document"] and result["verdict"] == "leak"
    contract = result["contracts"]["document"]
    assert contract["status"] == "leak" and contract["found"] == ["over-masked"] and contract["floor"] == 0.0
    assert contract["origin"]["line"] == result["origins"]["document"]["line"]
    log = json.loads(sarif.read_text())["runs"][0]
    assert {rule["id"] for rule in log["tool"]["driver"]["rules"]} >= {
        "leak/document", "leak/kv_cache", "leak/window", "leak/backend"}
    assert [r["ruleId"] for r in log["results"]] == ["leak/document"]
    assert "over-masked at query 13 from key 9" in log["results"][0]["message"]["text"]
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    assert cases["document"].find("failure") is not None
    assert cases["truncation"].find("failure") is None
    row = next(r for r in result["summary"] if r["method"] == "document")
    assert row["status"] == "leak"


def test_correct_contracts_pass_with_a_row_each(on_path, tmp_path):
    code, envelope = run(["leakzoo.windows:hf_mixed", "--window", "config"], tmp_path)
    assert code == 0 and envelope is not None
    window = envelope["result"]["contracts"]["window"]
    # the full layer hides the window from the outputs; the hooked model's weights show each layer keeps it
    assert window["status"] == "exact zero" and window["origin"] is None
    assert any("full-attention layer" in note for note in window["notes"])
    assert any("attention weights checked (2 layers observed" in note for note in window["notes"])
    code, envelope = run(["leakzoo.packed:nano_doc_sep", "--doc-sep", "1"], tmp_path)
    assert code == 0 and envelope is not None
    assert envelope["result"]["contracts"]["document"]["status"] in ("exact zero", "noise")


def test_no_contract_asked_leaves_contracts_empty(on_path, tmp_path):
    code, envelope = run(["leakzoo.nanostyle:flash"], tmp_path)
    assert code == 0 and envelope is not None and envelope["result"]["contracts"] == {}


@pytest.mark.parametrize("flags, words", [
    (["--packed"], "GPT.forward takes none of the conventions"),
    (["--kv-cache"], "--kv-cache: GPT has no KV cache to audit"),
    (["--window", "config"], "GPT declares no sliding window"),
    (["--attn-impls"], "--attn-impls: GPT has no attention implementation switch"),
])
def test_refusals_name_the_users_class_not_the_hooked_one(flags, words, on_path, tmp_path, capsys):
    """The CLI hooks the model (its class becomes SDPAHookedGPT); the user wrote `GPT`, and the refusal says so."""
    code, _ = run(["leakzoo.nanostyle:flash", *flags], tmp_path)
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and words in err and "SDPAHooked" not in err


def test_packed_prompts_without_the_separator_exit_2_naming_it(on_path, tmp_path, capsys):
    rows = tmp_path / "rows.json"
    rows.write_text("[[3, 4, 5, 6], [7, 8, 9]]")
    code, envelope = run(["leakzoo.packed:nano_doc_sep", "--doc-sep", "2", "--packed-prompts", str(rows)], tmp_path)
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and envelope is not None and envelope["error"]["type"] == "BadInput"
    assert "--doc-sep 2: token 2 is absent from the packed prompts (no row of the 2 holds it" in err
    assert "give prompts in which documents are packed with token 2 between them, or the separator" in err
    code, _ = run(["leakzoo.packed:nano_doc_sep", "--packed-prompts", str(rows)], tmp_path)
    assert code == 2 and "give it with --doc-sep TOKEN" in " ".join(capsys.readouterr().err.split())
    rows.write_text("[[3, 4")
    code, _ = run(["leakzoo.packed:nano_doc_sep", "--doc-sep", "2", "--packed-prompts", str(rows)], tmp_path)
    assert code == 2 and "not JSON" in capsys.readouterr().err


def test_packed_prompts_holding_the_separator_are_audited(on_path, tmp_path):
    rows = tmp_path / "rows.json"
    rows.write_text("[[3, 4, 5], [9, 8, 7, 1, 6, 5, 1, 4, 3, 2]]")
    code, envelope = run(["leakzoo.packed:nano_doc_sep", "--doc-sep", "1", "--packed-prompts", str(rows)], tmp_path)
    assert code == 0 and envelope is not None
    document = envelope["result"]["contracts"]["document"]
    assert document["status"] in ("exact zero", "noise")
    assert any("documents of [3, 2, 3] tokens; packed prompt 1 of 2, the first holding the separator" in note
               for note in document["notes"])
    # a plain causal model does not find the documents itself: the second document's first token reads the first
    code, envelope = run(["leakzoo.nanostyle:flash", "--doc-sep", "1", "--packed-prompts", str(rows)], tmp_path)
    assert code == 1 and envelope is not None
    document = envelope["result"]["contracts"]["document"]
    assert document["status"] == "leak" and document["first"]["document"]["query"] == 4
    assert document["first"]["document"]["key"] < 3

