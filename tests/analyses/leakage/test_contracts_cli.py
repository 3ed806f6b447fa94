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
                          ("--attn-impls", "e.g. --attn-impls eager,sdpa,flex_attention")]:
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
    assert window["status"] == "not applicable" and window["origin"] is None
    assert any("full-attention layer" in note for note in window["notes"])
    code, envelope = run(["leakzoo.packed:nano_doc_sep", "--doc-sep", "1"], tmp_path)
    assert code == 0 and envelope is not None
    assert envelope["result"]["contracts"]["document"]["status"] in ("exact zero", "noise")


def test_no_contract_asked_leaves_contracts_empty(on_path, tmp_path):
    code, envelope = run(["leakzoo.nanostyle:flash"], tmp_path)
    assert code == 0 and envelope is not None and envelope["result"]["contracts"] == {}
