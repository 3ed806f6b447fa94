"""`interp qk` on the shipped toy-induction: its induction heads attend to the induction target because of what the
previous-token head L0H2 wrote there (known from path patching; `analyses/qk`'s tests hold the arithmetic)."""
import json

import pytest

from interp import cli

INDUCTION_HEADS = ("L1H0", "L1H1", "L1H2", "L1H3")
PREFIX_LEN = 20  # repeated prompts' default block on toy-induction: BOS, 20 tokens, the same 20 again


def _document(tmp_path, *argv):
    path = tmp_path / "qk.json"
    assert cli.main(["qk", "toy-induction", "-q", *argv, "--json", str(path)]) == 0
    document = json.loads(path.read_text())
    assert document["command"] == "qk" and document["model"] == "toy-induction" and document["error"] is None
    return document["result"]


@pytest.mark.parametrize("head", INDUCTION_HEADS)
def test_the_key_side_source_of_every_induction_head_is_the_previous_token_head(head, tmp_path):
    result = _document(tmp_path, "--head", head, "--n", "16")
    key_side = [r for r in result["by_source"] if r["side"] == "key"]
    strongest = max(key_side, key=lambda r: abs(r["mean"]))
    assert strongest["source"] == "L0H2" and strongest["ci_low"] > 0 and strongest["n_prompts"] == 16
    pairs = result["attribution"]["pairs"]
    assert len(pairs) == 16 and all(p["query"] == 2 * PREFIX_LEN for p in pairs)  # the last token by default
    assert sum(p["key"] == PREFIX_LEN + 1 for p in pairs) >= 12  # mostly the token after the earlier occurrence
    assert len(result["aggregate"]) == 5 and result["aggregate"][0]["n_prompts"] == 16


def test_one_prompt_prints_its_pair_and_terms_that_sum_to_the_difference(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = _document(tmp_path, "--head", "L1H0", "--prompts", "repeated", "--index", "3", "--top", "100")
    out = capsys.readouterr().out
    assert "L1H0 of toy-induction on repeated prompt 3: query 40" in out and "log p_k - log p_k'" in out
    assert max(map(len, out.splitlines())) <= 80, out
    assert result["prompts"] == {"kind": "repeated", "n": 64, "index": 3} and result["view"] == "difference"
    (pair,) = result["attribution"]["pairs"]
    assert pair["prompt"] == 0 and pair["key"] == PREFIX_LEN + 1 and pair["weight"] > 0.5
    terms = pair["top_difference"]  # every term: 8 query sources x 8 key sources <= 100
    assert len(terms) == 64 and terms[0]["key_source"] == "L0H2"
    assert sum(t["contribution"] for t in terms) == pytest.approx(pair["difference"], abs=1e-4)
    assert "aggregate" not in result


def test_text_prompt_key_all_and_the_score_view(tmp_path, capsys):
    text = "255 1 2 3 4 5 6 1 2 3 4"  # toy-induction's symbols; the second 4 (position 10) should look at 5 (position 5)
    result = _document(tmp_path, "--head", "L1H2", "--text", text, "--key", "all", "--view", "score", "--top", "2")
    pairs = result["attribution"]["pairs"]
    assert result["prompts"] == {"text": text} and [p["key"] for p in pairs] == list(range(11))
    assert max(pairs, key=lambda p: p["weight"])["key"] == 5
    assert all(len(p["top_score"]) == 2 for p in pairs)
    assert "8 more pairs" in capsys.readouterr().out


def test_json_to_stdout_is_the_only_thing_there(capsys):
    assert cli.main(["qk", "--head", "L1H0", "--text", "255 7 8 9 7 8", "--against", "0", "--json", "-"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    assert document["result"]["attribution"]["pairs"][0]["against"] == 0 and document["schema"] == cli.JSON_SCHEMA


@pytest.mark.parametrize("argv, message", [
    (["--head", "L2H0"], "head L2H0 does not exist: this HookedGPT has 2 layers of 4 heads"),
    (["--head", "L1H7"], "(L0H0 .. L1H3)"),
    (["--head", "L1H0", "--query", "41"], "--query 41 is outside the prompts' 41 positions"),
    (["--head", "L1H0", "--key", "-42"], "--key -42 is outside the prompts' 41 positions"),
    (["--head", "L1H0", "--query", "3", "--key", "6"], "--key 6 comes after query 3: a causal model's query sees only"),
    (["--head", "L1H0", "--key", "21", "--against", "21"], "--against 21 is the key itself"),
    (["--head", "L1H0", "--query", "0"], "no attributed query sees a second key"),
    (["--head", "L1H0", "--index", "64"], "--index 64 is past the 64 prompts"),
    (["--head", "L1H0", "--text", "1 2", "--prompts", "random"], "--text gives the one prompt"),
    (["--head", "L1H0", "--text", "one two"], "--text: 'one' is not a token of this model"),
])
def test_bad_input_exits_2_with_what_to_do(argv, message, capsys):
    assert cli.main(["qk", "-q", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("interp qk: error: ") and message in err, err


def test_a_key_on_padding_exits_2(tmp_path, capsys):
    rows = tmp_path / "rows.json"
    rows.write_text("[[255, 1, 2, 3, 1, 2, 3], [255, 4, 5, 4]]")  # row 1 is padded after position 3
    assert cli.main(["qk", "-q", "--head", "L1H0", "--prompts", str(rows), "--index", "1", "--key", "5"]) == 2
    assert "--key 5 is padding in prompt 1" in capsys.readouterr().err
    assert cli.main(["qk", "-q", "--head", "L1H0", "--prompts", str(rows)]) == 2  # no common last position
    assert "pass --query Q" in capsys.readouterr().err
    assert cli.main(["qk", "-q", "--head", "L1H0", "--prompts", str(rows), "--index", "1", "--key", "1"]) == 0


def test_flag_types_are_refused_by_the_parser(capsys):
    for argv in (["--key", "first"], ["--query", "1.5"], ["--top", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["qk", "--head", "L1H0", *argv])
        assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["qk"])  # --head is required
    assert "--head" in capsys.readouterr().err


def test_a_users_own_module_by_its_factory_spec(tmp_path, capsys):
    """`interp qk own_models:nanogpt_flash` (a package.module:factory spec, hooked by interception): the attribution
    runs and its JSON names the intercepted sources; a rotary fork exits 2 naming what works on it."""
    path = tmp_path / "qk.json"
    assert cli.main(["qk", "own_models:nanogpt_flash", "--head", "L1H2", "-q", "--json", str(path)]) == 0
    result = json.loads(path.read_text())["result"]
    assert result["attribution"]["query_sources"][0] == "rest" and "L0H0" in result["attribution"]["key_sources"]
    assert cli.main(["qk", "own_models:rotary_gpt_trained", "--head", "L1H2", "-q"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no column block of any Linear's output" in err and "attention_input_patch" in err
