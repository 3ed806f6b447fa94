"""The report's section "Why these heads attend": known answers on the constructed induction circuit and on the shipped
toy-induction (every induction head's strongest key-side source is the previous-token head L0H2), its choice of heads,
its refusals, and its HTML, Markdown and JSON."""
import json

import pandas as pd
import pytest

import interp
from interp.analyses.report.attend import MAX_HEADS, AttendSection, discussed_heads, report_attend
from interp.analyses.report.html import attend_html, attend_markdown
from interp.models import EncoderConfig, HookedEncoder
from interp.models.constructed import induction_circuit

INDUCTION = [(1, 0), (1, 1), (1, 2), (1, 3)]


def _claims(rows):
    """A claims table and its subject heads, as the report's pipeline keeps them: (claim, verdict, heads) rows."""
    frame = pd.DataFrame({"claim": [r[0] for r in rows], "verdict": [r[1] for r in rows]})
    return frame, [r[2] for r in rows]


@pytest.fixture(scope="module")
def toy_section():
    model = interp.load("toy-induction")
    prompts = interp.data.repeated_tokens(24, 20, 255, bos=255, seed=0)
    claims, heads = _claims([("previous_token", "supported", ((0, 2),))]
                            + [("induction", "supported", (head,)) for head in INDUCTION])
    return report_attend(model, prompts, claims, heads)


def test_discussed_heads_are_the_supported_single_head_claims_induction_first():
    claims, heads = _claims([("previous_token", "supported", ((1, 0),)), ("induction", "supported", ((1, 0),)),
                             ("induction", "refuted", ((1, 1),)), ("redundant", "supported", ((0, 1), (0, 3))),
                             ("first_token", "inconclusive", ((0, 0),)), ("self_token", "supported", ((0, 2),))])
    assert discussed_heads(claims, heads) == [((1, 0), "induction"), ((0, 2), "self_token")]
    many, many_heads = _claims([("first_token", "supported", ((0, h),)) for h in range(MAX_HEADS + 3)])
    assert len(discussed_heads(many, many_heads)) == MAX_HEADS


def test_every_toy_induction_head_attends_its_target_because_of_L0H2(toy_section):
    assert toy_section.note == "" and [h.label for h in toy_section.heads] == ["L0H2", "L1H0", "L1H1", "L1H2", "L1H3"]
    for reason in toy_section.heads[1:]:
        assert reason.claim == "induction" and reason.query == 40 and reason.key == "induction target (position 21)"
        assert reason.n_prompts == 16 and reason.weight > 0.5 and reason.difference > 2
        key = reason.sources.set_index("side").loc["key"]
        assert key["source"] == "L0H2" and key["ci_low"] > 0, reason.sources
        assert len(reason.pairs) == 5 and reason.pairs["key_source"].iloc[0] == "L0H2"
        assert (reason.pairs["mean"].abs().diff().dropna() <= 0).all()  # largest first
    previous = toy_section.heads[0]
    assert previous.key == "highest-attention key" and previous.claim == "previous_token"


def test_the_constructed_circuit_attends_through_its_one_pair():
    model = induction_circuit(n_ctx=32)
    claims, heads = _claims([("induction", "supported", ((1, 0),))])
    section = report_attend(model, interp.data.repeated_tokens(8, 10, 63, bos=63, seed=1), claims, heads)
    (reason,) = section.heads
    pairs = list(zip(reason.pairs["query_source"], reason.pairs["key_source"]))
    # the target's one pair (query token x the previous-token head's write) minus the contrast's (BOS: b_Q x position)
    assert pairs[:2] == [("tok_embed", "L0H0"), ("b_Q", "pos_embed")] and reason.key.endswith("(position 11)")
    assert reason.pairs["mean"].iloc[:2].sum() == pytest.approx(reason.difference, rel=1e-5)
    assert (reason.pairs["mean"].iloc[2:].abs() < 1e-6).all() and reason.pairs["mean"].iloc[0] > 0


def test_without_a_supported_head_or_on_a_post_norm_model_the_section_says_why():
    claims, heads = _claims([("induction", "refuted", ((1, 0),))])
    empty = report_attend(induction_circuit(n_ctx=32), interp.data.repeated_tokens(4, 5, 63, bos=63), claims, heads)
    assert empty.heads == () and "no claim about a single head was supported" in empty.note
    assert "No head attributed: no claim" in attend_html(empty)
    encoder = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_vocab=20, n_ctx=16, post_norm=True, seed=0))
    claims, heads = _claims([("first_token", "supported", ((1, 0),))])
    refused = report_attend(encoder, interp.data.random_tokens(4, 6, 20), claims, heads)
    assert refused.heads == () and refused.note.startswith("L1H0: ") and "post-norm" in refused.note


def test_html_markdown_and_json_carry_the_numbers(toy_section):
    html = attend_html(toy_section)
    l1h0 = toy_section.heads[1]
    strongest = l1h0.sources.set_index("side").loc["key"]
    assert '<h2 id="attend">Why these heads attend</h2>' in html and "<h3>L1H0</h3>" in html
    assert f"strongest key-side source L0H2 {strongest['mean']:.3f}" in html
    assert f"{l1h0.pairs['mean'].iloc[0]:.3f} [{l1h0.pairs['ci_low'].iloc[0]:.3f}" in html
    lines = attend_markdown(toy_section)
    assert lines[0] == "## Why these heads attend" and sum(line.startswith("- L1H") for line in lines) == 4
    document = json.loads(json.dumps(toy_section.to_json(), allow_nan=False))
    head = document["heads"][1]
    assert head["head"] == "L1H0" and head["pairs"][0]["key_source"] == "L0H2" and head["pairs"][0]["n_prompts"] == 16
    assert attend_html(None) == "" and attend_markdown(None) == [] and AttendSection().to_json() == {"heads": [], "note": ""}


def test_viewer_pairs_are_in_viewer_positions_and_kept_within_the_budget(monkeypatch):
    import interp.analyses.report.attend as attend

    model = interp.load("toy-induction")
    prompts = interp.data.pad([[255, 1, 2, 3, 1, 2, 3], [9, 9, 255, 4, 5, 6, 4, 5, 6]], pad_id=0, padding_side="left")
    pairs = attend.viewer_pairs(model, prompts, [(1, 0)])
    cells = pairs["heads"]["L1H0"]["cells"]
    # viewer positions (padding dropped): 2 (model position 7, a left-padded prompt) attends after the earlier 2
    assert len(cells) == 2 and "5,3" in cells[0] and "8,6" in cells[1] and len(cells[1]) == 8  # no cell of query 0
    assert all(len(cell) == 2 + 3 * attend.VIEWER_TOP for prompt in cells for cell in prompt.values())
    monkeypatch.setattr(attend, "MAX_VIEWER_BYTES", 500)
    small = attend.viewer_pairs(model, prompts, [(1, 0)])
    assert small["heads"] == {} and small["omitted"] == ["L1H0: past the viewer's budget of 0 KB"]


def test_an_intercepted_model_is_attributed_where_its_projections_show_and_one_reason_is_said_once():
    """A user's nanoGPT (intercepted) gets its heads attributed; a rotary fork, whose q and k nothing shows, gets one
    reason naming every head it applies to, not the same sentence per head."""
    from own_models import nanogpt_flash, rotary_gpt_trained

    claims, heads = _claims([("induction", "supported", (head,)) for head in INDUCTION])
    shown = report_attend(interp.load(nanogpt_flash()), interp.data.repeated_tokens(8, 6, 61, bos=0, seed=1), claims,
                          heads)
    assert len(shown.heads) == 4 and shown.note == ""
    hidden = report_attend(interp.load(rotary_gpt_trained()), interp.data.repeated_tokens(8, 6, 256, bos=0, seed=1),
                           claims, heads)
    assert hidden.heads == () and hidden.note.startswith("L1H0, L1H1, L1H2, L1H3: QK attribution needs")
    assert hidden.note.count("QK attribution needs") == 1
