"""`interp.analyses.text_heads`: the card's Heads section rendered from typed evidence (the measurements themselves
are re-checked on the shipped model in tests/models/test_stdlib_bpe.py)."""
import pandas as pd
import torch

from interp.analyses.text_heads import HeadEvidence, HeldOutPrompts, render_heads_section
from interp.data import PromptSet, Repeats

HEADS = [(2, 2), (2, 3), (1, 2)]


def _ablation(claimed: dict[str, float], controls: dict[str, float]) -> pd.DataFrame:
    rows = [{"heads": h, "control": c, "removed": v, "ci_low": v - 0.01, "ci_high": v + 0.01, "gap_clean": 2.0,
             "gap_ablated": 2.0 * (1 - v)} for table, c in ((claimed, False), (controls, True)) for h, v in table.items()]
    return pd.DataFrame(rows)


def _evidence(together: float, with_proposed: bool = True) -> HeadEvidence:
    score = {"induction": 0.5, "induction_ci_low": 0.4, "induction_ci_high": 0.6, "duplicate_token": 0.0,
             "prev_token": 0.1, "prev_token_ci_low": 0.0, "prev_token_ci_high": 0.2}
    scores = pd.DataFrame([{"layer": l, "head": h, "prompts": kind, **score} for kind in ("natural", "repeated span")
                           for l, h in HEADS])
    verdicts = pd.DataFrame([
        {"layer": 2, "head": 2, "claim": "induction", "verdict": "inconclusive", "statement": "L2H2 is an induction head"},
        {"layer": 2, "head": 3, "claim": "induction", "verdict": "refuted", "statement": "L2H3 is an induction head"}])
    copy = pd.DataFrame([{"first_copy": 3.0, "second_copy": 1.0, "ratio": 1 / 3, "ratio_ci_low": 0.3, "ratio_ci_high": 0.36,
                          "gap": 2.0, "n_prompts": 8}])
    first = _ablation({"L2H2": 0.49}, {"L2H3": 0.19, "L1H2": 0.83})
    proposed = _ablation({"L2H2+L2H3": together}, {"L1H2+L0H0": 0.85, "L0H0+L0H1": 0.0}) if with_proposed else None
    spans = verdicts.assign(verdict=["supported", "refuted"])
    return HeadEvidence(scores, verdicts, ("L2H2",), first, copy, ("L2H2", "L2H3"), proposed, spans if with_proposed else None)


def _prompts() -> HeldOutPrompts:
    tokens = torch.randint(0, 10, (8, 16), generator=torch.Generator().manual_seed(0))
    return HeldOutPrompts(PromptSet(tokens, repeats=Repeats(match_len=1)), PromptSet(tokens))


def test_both_ablations_are_rendered_with_their_controls_and_a_backup_is_named_from_the_numbers():
    text = render_heads_section(_evidence(0.92), _prompts())
    assert "did not refute, L2H2 (inconclusive), together removes **0.490**" in text
    assert "refuted or not, L2H2 (inconclusive), L2H3 (refuted), together removes **0.920**" in text
    assert "more than the sum of each alone (L2H2 0.490 + L2H3 0.190 = 0.680)" in text and "backup" in text
    assert "| L2H2+L2H3 | 0.920 [0.910, 0.930] | no |" in text and "| L1H2+L0H0 | 0.850 [0.840, 0.860] | yes |" in text
    assert "the largest control, L1H2, removes 0.830".lower() in text.lower()
    assert "scores the next-token loss after a repeated 1-gram: the predictions" in text  # the natural windows' behaviour
    natural, spans = text.split("### Claims on the repeated spans")
    assert "| L2H2 is an induction head | inconclusive |" in natural and "| L2H2 is an induction head | supported |" in spans


def test_no_backup_is_claimed_when_the_pair_removes_no_more_than_its_parts_nor_a_second_ablation_without_one():
    additive = render_heads_section(_evidence(0.6), _prompts())
    assert "no more than the sum of each alone (L2H2 0.490 + L2H3 0.190)" in additive and "backup" not in additive
    single = render_heads_section(_evidence(0.6, with_proposed=False), _prompts())
    assert "refuted or not" not in single and single.count("| heads ablated |") == 1
    assert "### Claims on the repeated spans" not in single
