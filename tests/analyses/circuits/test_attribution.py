"""Attribution patching (`interp.analyses.circuits.attribution`): the score is the derivative of the exact
patch along its direction (checked by finite differences), exact where the behaviour is linear in the
patched write, node scores sum their out-edges, and "eap-ig" integrates each layer's path."""
import pytest
import torch

import interp
from interp.analyses.circuits import PatchSweep, attribution_patching
from interp.behaviour import custom_behaviour, output_squared_error
from interp.data import random_tokens
from interp.errors import BadInput
from interp.hooks import hooked
from interp.models import GPTConfig, HookedGPT
from interp.paths import graph


def small(**extra):
    cfg = dict(n_layers=2, n_heads=2, d_model=16, d_vocab=20, n_ctx=16, seed=0, init_range=0.3)
    return HookedGPT(GPTConfig(**{**cfg, **extra})).eval()


def test_scores_are_the_derivative_of_the_exact_patch():
    model = small(n_key_value_heads=1, positional_embedding_type="rotary")  # MLPs, LN, grouped k/v
    run = interp.Run(model, random_tokens(6, 7, 20, seed=1), batch_size=4)
    result = attribution_patching(run)
    sweep = PatchSweep(run)
    eps = 1e-3  # patch a thousandth of the way from the clean to the corrupted write
    for b in sweep.batches:
        b.corrupted_writes = {k: b.clean_writes[k] + eps * (v - b.clean_writes[k]) for k, v in b.corrupted_writes.items()}
    finite = (sweep.values([[e] for e in result.edges]) - sweep.clean()) / eps  # (edge, prompt)
    scale = finite.abs().max()
    assert scale > 1e-2
    torch.testing.assert_close(result.edge_values, finite, atol=2e-2 * float(scale), rtol=0)
    assert result.edges == tuple(graph(model))


def test_scores_are_exact_for_a_behaviour_linear_in_the_final_stream():
    model = small(normalization_type=None)  # no ln_final: a logit is linear in every write reaching it directly

    def logit_3(logits, prompts):
        return logits[:, :, 3].sum(-1)

    run = interp.Run(model, random_tokens(6, 7, 20, seed=2), behaviour=custom_behaviour(logit_3))
    result = attribution_patching(run)
    sweep = PatchSweep(run)
    direct = [i for i, e in enumerate(result.edges) if e.via == "direct"]
    exact = sweep.values([[result.edges[i]] for i in direct]) - sweep.clean()
    torch.testing.assert_close(result.edge_values[direct], exact, atol=1e-5, rtol=1e-4)
    assert exact.abs().max() > 1e-2


def test_node_scores_sum_their_outgoing_edges_and_frames_are_tidy():
    model = small()
    run = interp.Run(model, random_tokens(6, 7, 20, seed=3))
    result = attribution_patching(run)
    for i, node in enumerate(result.nodes):
        out = [j for j, e in enumerate(result.edges) if e.sender == node]
        torch.testing.assert_close(result.node_values[i], result.edge_values[out].sum(0))
    edges, nodes = result.edges_frame(), result.nodes_frame()
    assert list(edges.columns[:8]) == ["edge", "sender", "receiver", "via", "score", "ci_low", "ci_high", "n_prompts"]
    assert edges.edge.tolist() == [e.label for e in result.edges]
    assert len(edges) == len(graph(model)) and (edges.ci_low <= edges.score + 1e-12).all()
    heads = nodes.dropna(subset=["head"])
    assert len(heads) == 4 and set(heads.layer) == {0, 1}
    assert result.score("L1H0 -> logits") == pytest.approx(edges.set_index(["sender", "receiver"]).loc[("L1H0", "logits")].score)


def _simpson_along(model, tokens, layer, change, measure, h=1e-3):
    """Simpson's rule on d/dalpha measure(logits) (batch,), the layer's attention output shifted by alpha * change,
    each derivative a central finite difference of forwards (another path than the scores' gradients)."""
    def value(alpha):
        with torch.no_grad(), hooked(model, [(f"blocks.{layer}.hook_attn_out", lambda act, hook: act + alpha * change)]):
            return measure(model(tokens)).double()  # (batch,)

    slope = [(value(a + h) - value(a - h)) / (2 * h) for a in (0.0, 0.5, 1.0)]
    return (slope[0] + 4 * slope[1] + slope[2]) / 6


@pytest.mark.parametrize("per", ["layer", "node"])
def test_integrated_scores_follow_each_groups_path(per):
    """A layer's heads' scores sum to Simpson's rule on d/dalpha B(clean writes + alpha * their change), the
    derivative taken by finite differences of forwards that shift the layer's attention output (another path)."""
    model = small()
    run = interp.Run(model, random_tokens(8, 7, 20, seed=4), batch_size=8)
    result = attribution_patching(run, method="eap-ig", steps=3, per=per)
    batch = PatchSweep(run).batches[0]
    layer_heads = [[n for n in result.nodes if n.kind == "head" and n.layer == layer] for layer in (0, 1)]
    groups = layer_heads if per == "layer" else [[h] for heads in layer_heads for h in heads]
    for heads in groups:
        layer = heads[0].layer
        change = sum(batch.corrupted_writes[h] - batch.clean_writes[h] for h in heads)  # (batch, pos, d_model)

        simpson = _simpson_along(model, batch.tokens, layer, change, lambda out: run.behaviour(out, batch.batch))
        summed = sum(result.node_values[result.nodes.index(n)] for n in heads)  # (prompt,)
        torch.testing.assert_close(summed, simpson, atol=5e-3, rtol=1e-2)
        assert simpson.abs().max() > 1e-2


def test_integrated_scores_keep_the_clean_reference_of_a_distance_behaviour():
    """A behaviour measured from the clean run's output (a squared change) keeps the clean output as its reference
    along the path: the scores are Simpson's rule on d/dalpha ||y(alpha) - y(0)||^2 (each shifted forward used to be
    its own reference, so every score was 0); plain EAP warns that its estimate is 0 there by construction."""
    model = small()
    behaviour = output_squared_error([0, 1, 2])
    run = interp.Run(model, random_tokens(8, 7, 20, seed=4), batch_size=8, behaviour=behaviour)
    result = attribution_patching(run, method="eap-ig", steps=3, per="layer")
    batch = PatchSweep(run).batches[0]
    with torch.no_grad():
        clean = behaviour.clean_summary(model(batch.tokens), batch.batch)
    for layer in (0, 1):
        heads = [n for n in result.nodes if n.kind == "head" and n.layer == layer]
        change = sum(batch.corrupted_writes[h] - batch.clean_writes[h] for h in heads)  # (batch, pos, d_model)

        simpson = _simpson_along(model, batch.tokens, layer, change, lambda out: behaviour(out, batch.batch, clean))
        summed = sum(result.node_values[result.nodes.index(n)] for n in heads)  # (prompt,)
        torch.testing.assert_close(summed, simpson, atol=5e-3, rtol=1e-2)
        assert simpson.abs().max() > 1e-3
    with pytest.warns(UserWarning, match="use method='eap-ig'"):
        eap = attribution_patching(run, method="eap")
    assert eap.edge_values.abs().max() < 1e-9


def test_bad_input():
    model = small()
    prompts = random_tokens(4, 6, 20)
    with pytest.raises(BadInput, match="method='ig'"):
        attribution_patching(model, prompts, method="ig")
    with pytest.raises(BadInput, match="per='head'"):
        attribution_patching(model, prompts, method="eap-ig", per="head")
    with pytest.raises(BadInput, match="steps=5"):
        attribution_patching(model, prompts, method="eap-ig", steps=5)


def test_per_node_integrated_scores_rank_toy_induction_heads_as_exact_patching_does():
    """The issue's bar (Spearman >= 0.9 over heads against exact node patches) on the trained toy-induction
    model: met by eap-ig per node; plain EAP is far below it there (about 0.1: resampling is a large patch)."""
    from interp.data import repeated_tokens
    from interp.stats import spearman

    model = interp.load("toy-induction")
    run = interp.Run(model, repeated_tokens(24, 20, model.cfg.d_vocab, bos=model.cfg.d_vocab - 1, seed=7))
    result = attribution_patching(run, method="eap-ig", per="node")
    heads = [n for n in result.nodes if n.kind == "head"]
    sweep = PatchSweep(run)
    exact = (sweep.values([[e for e in result.edges if e.sender == h] for h in heads]) - sweep.clean()).mean(1)
    estimate = torch.stack([result.node_values[result.nodes.index(h)] for h in heads]).mean(1)
    assert spearman(estimate, exact) >= 0.9
    assert exact.min() > 0.3  # every head matters under resampling: the ranking is not of zeros


def test_estimate_agreement_ranks_the_estimates_against_exact_single_edge_patches():
    """The sample: the 16 edges of largest |estimate| and 16 seeded others; exact = each edge's EdgePatch effect."""
    import pandas as pd

    from interp.analyses.circuits.attribution import estimate_agreement
    from interp.data import repeated_tokens
    from interp.models.constructed import induction_circuit
    from interp.paths import EdgePatch

    run = interp.Run(induction_circuit(), repeated_tokens(8, 10, 63, bos=63))
    result = attribution_patching(run)
    agreement = estimate_agreement(run, result)
    assert len(agreement.edges) == 32 == len(set(agreement.edges))
    means = result.edge_values.mean(1)
    top = {result.edges[i] for i in torch.argsort(means.abs(), descending=True, stable=True)[:16].tolist()}
    assert top <= set(agreement.edges)
    some = agreement.edges[:3]
    exact = [run.effect(EdgePatch((edge,))).mean for edge in some]
    assert list(agreement.exact[:3]) == pytest.approx(exact)
    frame = agreement.frame()
    assert list(frame.columns) == ["edge", "estimate", "exact"] and len(frame) == 32
    rho = pd.Series(frame.estimate).rank().corr(pd.Series(frame.exact).rank())
    assert agreement.spearman == pytest.approx(rho) and agreement.spearman < 0.5  # saturated: wrong signs
    assert estimate_agreement(run, result).edges == agreement.edges  # seeded
    with pytest.raises(BadInput, match="n_edges=1"):
        estimate_agreement(run, result, 1)
    with pytest.raises(BadInput, match="over 8 prompts, the run has 4"):
        estimate_agreement(run.on(run.prompts[:4]), result)
