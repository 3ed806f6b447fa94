"""`interp.analyses.copying`: the copy gap of repeated spans and the share of it that a set of heads carries,
on the hand-built induction circuit (known answer) and against its controls."""
import pandas as pd
import pytest
import torch

from interp.analyses import copying
from interp.data import PromptSet, Repeats
from interp.errors import BadInput
from interp.models.constructed import induction_circuit

D_VOCAB, OFFSET, SPAN = 64, 10, 20


@pytest.fixture(scope="module")
def model():
    return induction_circuit(d_vocab=D_VOCAB)


@pytest.fixture(scope="module")
def prompts():
    """BOS, 9 random tokens, a span of 20 distinct tokens, the span again: the second copy is predictable."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(32):
        span = torch.randperm(D_VOCAB - 1, generator=generator)[:SPAN]
        before = torch.randint(0, D_VOCAB - 1, (OFFSET - 1,), generator=generator)
        rows.append(torch.cat([torch.tensor([D_VOCAB - 1]), before, span, span]))
    return PromptSet(torch.stack(rows), repeats=Repeats(period=SPAN, offset=OFFSET, n_repeats=2))


def test_copy_gap_of_the_induction_circuit_is_the_whole_first_copy_loss(model, prompts):
    frame = copying.copy_gap(model, prompts)
    row = frame.iloc[0]
    assert row["second_copy"] < 0.05 * row["first_copy"] and row["ratio_ci_high"] < 0.05
    assert row["gap"] == pytest.approx(row["first_copy"] - row["second_copy"]) and row["n_prompts"] == 32
    assert list(frame.columns) == ["first_copy", "second_copy", "ratio", "ratio_ci_low", "ratio_ci_high", "gap", "n_prompts"]


def test_ablating_the_induction_head_removes_the_gap_and_no_control_set_does(model, prompts):
    frame = copying.copy_gap_ablation(model, prompts, ["L1H0"], kind="zero")
    claimed = frame[~frame["control"]].iloc[0]
    assert claimed["heads"] == "L1H0" and claimed["removed"] > 0.9 and claimed["ci_low"] > 0.9
    controls = frame[frame["control"]]
    assert len(controls) == 7 and set(controls["heads"]) == {f"L{l}H{h}" for l in range(2) for h in range(4)} - {"L1H0"}
    # the previous-token head L0H0 is part of the circuit: ablating it removes the gap too; the scratch heads do not
    assert controls.set_index("heads").loc["L0H0", "removed"] > 0.9
    assert (controls[controls["heads"] != "L0H0"]["removed"].abs() < 0.05).all()
    assert copying.control_bound(frame) == pytest.approx(controls["removed"].max())


def test_control_sets_are_capped_and_seeded(model, prompts):
    a = copying.copy_gap_ablation(model, prompts, ["L1H0", "L0H0"], kind="zero", max_controls=5, seed=1)
    b = copying.copy_gap_ablation(model, prompts, ["L1H0", "L0H0"], kind="zero", max_controls=5, seed=1)
    assert len(a) == 6 and a["heads"].tolist() == b["heads"].tolist()
    pd.testing.assert_frame_equal(a, b)


def test_prompts_without_a_repeated_span_are_refused(model, prompts):
    plain = PromptSet(prompts.tokens)
    with pytest.raises(BadInput, match="text \\+ span \\+ the same span"):
        copying.copy_gap(model, plain)
    with pytest.raises(ValueError, match="no heads given"):
        copying.copy_gap_ablation(model, prompts, [])
