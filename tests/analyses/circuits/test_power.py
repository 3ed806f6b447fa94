"""Power before verdicts (`interp.analyses.circuits.power`): the relative change of a sender's write under a
corruption or an ablation, known answers on the positional sender (`interp.models.handbuilt`), whose L0H0 writes
the same positions on every prompt, and the edge's zero ablation."""
import pytest
import torch

import interp
from interp.analyses.circuits.power import (
    POWER_FLOOR,
    EdgeZero,
    WriteChange,
    ablation_write_changes,
    relative_change,
    sweep_write_changes,
    write_changes,
)
from interp.data import repeated_tokens
from interp.errors import BadInput
from interp.models import handbuilt
from interp.paths import EdgePatch, Node, nodes, parse_edge, parse_node


@pytest.fixture(scope="module")
def run():
    return interp.Run(handbuilt.positional_sender(), repeated_tokens(16, 2, 63, bos=63, n_repeats=10), batch_size=8)


def test_relative_change_known_answers():
    clean = torch.zeros(3, 2, 4)
    clean[0, 0, 0], clean[1, 0, 0] = 2.0, 1.0  # prompt 2 writes nothing
    corrupted = clean.clone()
    corrupted[0, 0, 1] = 2.0  # (2, 2) against (2, 0): ||(0, 2)|| / ||(2, 0)|| = 1
    corrupted[2, 1, 3] = 5.0  # from nothing to something: infinite
    ratio, norm = relative_change(clean, corrupted, None)
    assert ratio.tolist() == [1.0, 0.0, float("inf")] and ratio.dtype == torch.float64
    assert norm.tolist() == pytest.approx([2 + 8 ** 0.5, 2.0, 5.0])  # clean plus corrupted norms: 0 only when both are
    mask = torch.tensor([[True, False], [True, True], [True, False]])  # prompt 2's change is at a padded position
    assert relative_change(clean, corrupted, mask)[0].tolist() == [1.0, 0.0, 0.0]


def test_powerless_silent_and_the_reason():
    still = WriteChange("L0H0", torch.zeros(4, dtype=torch.float64))
    assert still.max == 0.0 and still.powerless
    assert still.reason().startswith("the corruption does not change L0H0's write (largest relative change over 4 "
                                     "prompts 0 < 1e-06; resampled)")
    assert not WriteChange("L0H0", torch.zeros(4, dtype=torch.float64), silent=True).powerless  # writes nothing at all
    assert not WriteChange("L0H0", torch.tensor([0.0, 2 * POWER_FLOOR], dtype=torch.float64)).powerless
    ablated = WriteChange("L0H0", torch.zeros(2, dtype=torch.float64), how="mean ablation")
    assert ablated.reason().startswith("the mean ablation does not change L0H0's write")


def test_resampling_cannot_change_a_write_of_positions(run):
    senders = [node for node in nodes(run.model) if node.kind != "logits"]
    changes = write_changes(run, senders)
    assert changes[parse_node("L0H0")].max == 0.0 and changes[parse_node("L0H0")].powerless  # the same on every prompt
    assert changes[parse_node("L0H1")].max == pytest.approx(2 ** 0.5)  # the previous token, another one: sqrt 2
    assert changes[Node(-1, "embed")].max > 0.5 and not changes[Node(-1, "embed")].powerless
    assert changes[parse_node("L0H0")].values.shape == (16,)
    swept = sweep_write_changes(run.sweep())  # the sweep's cached writes give the same numbers, without a forward
    for node in senders:
        assert torch.allclose(swept[node].values, changes[node].values, atol=1e-6), node.label
    with pytest.raises(BadInput, match="the logits write nothing"):
        write_changes(run, [parse_node("logits")])


def test_a_given_corrupted_set_counts_too(run):
    shifted = repeated_tokens(16, 2, 63, bos=63, n_repeats=10, seed=5)
    changes = write_changes(run, [parse_node("L0H0"), parse_node("L0H1")], source=shifted)
    assert changes[parse_node("L0H0")].powerless and changes[parse_node("L0H0")].how == "from the corrupted prompts given"
    assert not changes[parse_node("L0H1")].powerless


def test_mean_and_resample_ablation_have_no_power_on_a_constant_write_zero_has(run):
    heads = [(0, 0), (0, 1)]
    mean = ablation_write_changes(run, interp.HeadAblation(heads, "mean"))
    assert mean[parse_node("L0H0")].powerless and mean[parse_node("L0H0")].how == "mean ablation"
    assert 0.5 < mean[parse_node("L0H1")].max < 1.5
    assert ablation_write_changes(run, interp.HeadAblation(heads, "resample"))[parse_node("L0H0")].powerless
    zero = ablation_write_changes(run, interp.HeadAblation(heads, "zero"))
    assert zero[parse_node("L0H0")].max == pytest.approx(1.0) and zero[parse_node("L0H1")].max == pytest.approx(1.0)
    assert ablation_write_changes(run, interp.HeadAblation(heads, "mean", site="result")) == {}  # not read at z


def test_edge_zero_is_a_run_intervention_with_known_answers(run):
    edge = parse_edge("L0H0 -> L1H0 via k")
    zero = run.effect(EdgeZero((edge,)))
    assert zero.mean > 1.5 and zero.ci_low > 1.5  # without the position write, L1H0 attends uniformly: ~2 nats
    assert run.effect(EdgePatch((edge,))).mean == 0.0  # resampling it changes nothing
    assert run.effect(EdgeZero(("L0H0 -> L1H1 via k",))).mean == 0.0  # L1H1 is a filler nothing reads
    assert EdgeZero(("L0H0 -> L1H0 via k",)).spec() == {"intervention": "edge_zero", "edges": ["L0H0 -> L1H0 via k"]}
    with pytest.raises(BadInput, match="EdgeZero needs at least one edge"):
        EdgeZero(())
