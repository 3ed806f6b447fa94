"""Known-answer tests for interp.analyses.redundancy on constructed models, plus what toy-induction shows."""
import math

import pytest
import torch
from factories import ablating

from interp.ablation import AblationEngine
from interp.analyses import redundancy as R
from interp.analyses.claims import pair as P
from interp.claims import min_effect, test_claims
from interp.data import PromptSet, random_tokens, repeated_tokens
from interp.hooks import hooked, live_hooks
from interp.interventions import all_heads
from interp.models import GPTConfig, HookedGPT
from interp.models.constructed import _Builder, pattern_heads, redundant_pair
from interp.stats import TooFewPrompts

D_VOCAB, N_CTX = 16, 32


@pytest.fixture(scope="module")
def pair_model():
    return redundant_pair(d_vocab=D_VOCAB, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def period2():
    """Period-2 sequences after a BOS: the constructed models' task."""
    return repeated_tokens(32, 2, D_VOCAB - 1, bos=D_VOCAB - 1, n_repeats=6, seed=0)


@pytest.fixture(scope="module")
def backup_model():
    """L0H0 copies the previous token to the logits; L1H0 does the same, but only when L0H0's write is
    missing: its query reads the `out` subspace and, when anything is there, attends to BOS (which
    writes nothing) by a score of 80 against the previous token's 40. A zero-ablated L0H0 is fully
    made up for by L1H0: the backup behaviour of Wang et al. 2022, exactly."""
    b = _Builder(2, 1, D_VOCAB, N_CTX, "constructed-backup")
    b.set_pattern(0, 0, "previous_token")
    b.set_copy(0, 0, "out")
    b.set_pattern(1, 0, "previous_token")
    b.set_copy(1, 0, "out")
    with torch.no_grad():
        real = torch.arange(D_VOCAB - 1)
        b.model.blocks[1].attn.W_Q[0, b.dim("out", real), 0] = 2 * b.gain  # key 0 (BOS) is basis vector 0
    return b.finish(task="period-2: next = previous token, with a backup head")


# ---------------------------------------------------------------------------------------------
# losses and the ablation engine


def test_lm_loss_equals_the_models_loss(tiny_gpt):
    prompts = random_tokens(4, 10, tiny_gpt.cfg.d_vocab, seed=0)
    logits, loss = tiny_gpt(prompts.tokens, return_type="both", loss_per_token=True)
    torch.testing.assert_close(R.lm_loss(logits, prompts), loss.mean(-1))
    mask = torch.ones_like(prompts.tokens)
    mask[0, 6:] = 0
    padded = PromptSet(prompts.tokens, mask)
    torch.testing.assert_close(R.lm_loss(logits, padded)[0], loss[0, :5].mean())


@pytest.mark.parametrize("loss_fn", [R.lm_loss, R.induction_loss])
def test_fused_loss_equals_loss_on_logits(tiny_gpt, loss_fn):
    prompts = repeated_tokens(5, 6, tiny_gpt.cfg.d_vocab, seed=3)
    engine = AblationEngine(tiny_gpt, prompts, "zero", behaviour=loss_fn)
    resid = tiny_gpt(prompts.tokens, stop_at_layer=tiny_gpt.cfg.n_layers)
    fused = engine.loss_from_resid(resid, prompts, "test")
    torch.testing.assert_close(fused, loss_fn(tiny_gpt(prompts.tokens), prompts), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_resuming_engine_equals_hooked_forwards(tiny_gpt, method):
    prompts = random_tokens(6, 12, tiny_gpt.cfg.d_vocab, seed=1)
    sets = [[(0, 1)], [(1, 3)], [(0, 0), (1, 2)], [(1, 0), (1, 1)], all_heads(tiny_gpt)]
    fast = AblationEngine(tiny_gpt, prompts, method, batch_size=4, seed=2)
    slow = AblationEngine(tiny_gpt, prompts, method, batch_size=4, seed=2, fast=False)
    assert fast.fast and not slow.fast
    clean_f, ablated_f = fast._losses(sets)
    clean_s, ablated_s = slow._losses(sets)
    torch.testing.assert_close(clean_f, clean_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ablated_f, ablated_s, atol=1e-5, rtol=1e-5)
    # and both equal the plain context manager
    for heads, row in zip(sets, ablated_f):
        if method == "resample":
            continue  # resampling draws per batch; batch sizes differ from a single forward
        with ablating(tiny_gpt, heads, method, reference=prompts):
            expected = tiny_gpt(prompts.tokens, return_type="loss", loss_per_token=True).mean(-1)
        torch.testing.assert_close(row, expected.double(), atol=1e-5, rtol=1e-5)
    assert live_hooks(tiny_gpt) == []


def test_resuming_engine_on_rotary_and_padded_encoder(tiny_encoder):
    rotary = HookedGPT(GPTConfig(n_layers=3, n_heads=2, d_model=16, d_vocab=30, n_ctx=16, attn_only=True,
                                 positional_embedding_type="rotary", seed=3)).eval()
    tokens = torch.randint(0, 30, (5, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[1, 6:] = 0
    cases = [(rotary, PromptSet(tokens), None),
             (tiny_encoder, PromptSet(tokens, mask), lambda logits, p: logits[:, :, 0].mean(-1))]
    for model, prompts, loss_fn in cases:
        sets = [[(0, 1)], [(1, 0), (model.cfg.n_layers - 1, 1)]]
        fast = AblationEngine(model, prompts, "mean", behaviour=loss_fn, batch_size=3)._losses(sets)
        slow = AblationEngine(model, prompts, "mean", behaviour=loss_fn, batch_size=3, fast=False)._losses(sets)
        for f, s in zip(fast, slow):
            torch.testing.assert_close(f, s, atol=1e-5, rtol=1e-5)


def test_custom_loss_fn_takes_the_logits_path(tiny_gpt):
    prompts = random_tokens(6, 12, tiny_gpt.cfg.d_vocab, seed=1)
    fused = R.importance(tiny_gpt, prompts, gradient=False)
    custom = R.importance(tiny_gpt, prompts, gradient=False, behaviour=lambda logits, p: R.lm_loss(logits, p))
    torch.testing.assert_close(torch.tensor(fused.delta_loss.values), torch.tensor(custom.delta_loss.values), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# importance and its gradient estimate


def test_importance_on_the_redundant_pair(pair_model, period2):
    frame = R.importance(pair_model, period2)
    by = frame.set_index("label")
    assert list(frame.columns[:6]) == ["layer", "head", "label", "delta_loss", "ci_low", "ci_high"]
    assert (frame.n_prompts == 32).all()
    # the scratch writers change nothing at all
    assert by.loc["L0H2", "delta_loss"] == 0 and by.loc["L0H3", "delta_loss"] == 0
    # one of the pair alone: the other keeps a 15-logit lead, loss ~ (d_vocab - 2) e^-15 per position
    for label in ("L0H0", "L0H1"):
        assert 0 < by.loc[label, "delta_loss"] < 1e-4
    assert by.loc["L0H0", "delta_loss"] == pytest.approx(by.loc["L0H1", "delta_loss"], rel=1e-6)
    assert frame.attrs["spearman"] == pytest.approx(1.0)


def test_importance_of_chosen_heads_equals_the_full_rows(pair_model, period2):
    full = R.importance(pair_model, period2, gradient=False).set_index("label")
    chosen = R.importance(pair_model, period2, gradient=False, heads=["L0H1", (0, 3)]).set_index("label")
    assert list(chosen.index) == ["L0H1", "L0H3"]
    assert chosen["delta_loss"].tolist() == full.loc[["L0H1", "L0H3"], "delta_loss"].tolist()


def test_gradient_estimate_matches_finite_differences(tiny_gpt):
    """-dL/dm at m = 1 against (L(1 - eps) - L(1)) / eps, with z' = mean + m (z - mean)."""
    prompts = random_tokens(4, 10, tiny_gpt.cfg.d_vocab, seed=4)
    estimate = R.gradient_importance(tiny_gpt, prompts, "mean")  # (prompt, layer, head)
    engine = AblationEngine(tiny_gpt, prompts, "mean")
    means = engine.reference.means
    eps = 1e-3
    for layer, head in [(0, 2), (1, 1)]:
        def scaled(z, hook, layer=layer, head=head):
            z = z.clone()
            base = means[layer][: z.shape[1], head]
            z[:, :, head] = base + (1 - eps) * (z[:, :, head] - base)
            return z
        clean = R.lm_loss(tiny_gpt(prompts.tokens), prompts)
        with hooked(tiny_gpt, [(f"blocks.{layer}.attn.hook_z", scaled)]):
            nudged = R.lm_loss(tiny_gpt(prompts.tokens), prompts)
        torch.testing.assert_close(estimate[:, layer, head], ((nudged - clean) / eps).double(), atol=2e-3, rtol=2e-2)


def test_second_order_estimate_matches_finite_differences():
    """d2L/dm_a dm_b against a mixed finite difference, in float64 on a model with sizeable effects."""
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, init_range=0.3, seed=1)).double().eval()
    prompts = random_tokens(4, 10, 40, seed=5)
    frame = R.second_order(model, prompts, "zero", batch_size=2)
    a, b, eps = (0, 1), (1, 2), 1e-4

    def loss_at(scale_a, scale_b):
        def hook_for(head, scale):
            def hook(z, hook):
                z = z.clone()
                z[:, :, head[1]] = z[:, :, head[1]] * scale
                return z
            return (f"blocks.{head[0]}.attn.hook_z", hook)
        with torch.no_grad(), hooked(model, [hook_for(a, scale_a), hook_for(b, scale_b)]):
            return R.lm_loss(model(prompts.tokens), prompts).mean()

    finite = (loss_at(1 - eps, 1 - eps) - loss_at(1 - eps, 1) - loss_at(1, 1 - eps) + loss_at(1, 1)) / eps**2
    row = frame[(frame.label_a == "L0H1") & (frame.label_b == "L1H2")]
    assert abs(float(finite)) > 1e-3  # a real interaction to compare against
    assert float(row.interaction_estimate.iloc[0]) == pytest.approx(float(finite), rel=1e-2)


# ---------------------------------------------------------------------------------------------
# joint ablation and claims on the constructed models


def test_joint_ablation_on_the_redundant_pair(pair_model, period2):
    frame = R.joint_ablation(pair_model, period2, [("L0H0", "L0H1"), ((0, 2), (0, 3))], "zero")
    pair, scratch = frame.iloc[0], frame.iloc[1]
    # both zero-ablated: ln(d_vocab - 1) at each scored target (the default behaviour, as Run's: the repeated
    # copies, every one predictable; clean loss there ~1e-12)
    expected_both = math.log(D_VOCAB - 1)
    assert pair.delta_both == pytest.approx(expected_both, rel=1e-3)
    assert pair.interaction == pytest.approx(pair.delta_both - pair.delta_a - pair.delta_b)
    assert pair.ci_low > 1.0 and pair.p_value < 0.01
    assert scratch.interaction == 0 and scratch.delta_both == 0


def test_redundancy_verdicts_on_constructed_models(pair_model, period2):
    table = P.redundancy_claims(
        pair_model, period2, pairs=[("L0H0", "L0H1"), ("L0H2", "L0H3"), ("L0H0", "L0H2")],
        heads=["L0H2", "L0H3"], backups=[("L0H1", "L0H0")],
    )
    verdicts = dict(zip(table.claim + ":" + table.label, table.verdict))
    assert verdicts == {
        "redundant:L0H0 ~ L0H1": "supported",
        "redundant:L0H2 ~ L0H3": "refuted",  # both together cost nothing: dispensable, not redundant
        "redundant:L0H0 ~ L0H2": "refuted",
        "dispensable:L0H2": "supported",
        "dispensable:L0H3": "supported",
        "backs_up:L0H1 ~ L0H0": "refuted",  # same layer: L0H1 cannot react to L0H0's ablation
    }
    reasons = dict(zip(table.claim + ":" + table.label, table.reasons))
    assert "necessity failed" in reasons["redundant:L0H2 ~ L0H3"]
    assert "not in a later layer" in reasons["backs_up:L0H1 ~ L0H0"]


def test_essential_head_is_not_dispensable():
    model = pattern_heads(d_vocab=D_VOCAB, n_ctx=N_CTX)
    prompts = repeated_tokens(32, 2, D_VOCAB - 1, bos=D_VOCAB - 1, n_repeats=6, seed=1)
    table = P.redundancy_claims(model, prompts, heads=["L0H0", "L0H4"], pairs=[("L0H4", "L0H5")])
    assert dict(zip(table.label, table.verdict)) == {"L0H0": "refuted", "L0H4": "supported", "L0H4 ~ L0H5": "refuted"}


def test_few_prompts_make_claims_inconclusive(pair_model, period2):
    table = P.redundancy_claims(pair_model, period2[:4], pairs=[("L0H0", "L0H1")])
    assert table.verdict.iloc[0] == "inconclusive" and "too few prompts" in table.reasons.iloc[0]


# ---------------------------------------------------------------------------------------------
# similarity


def test_pattern_similarity_known_answers(pair_model, period2):
    frame = R.pattern_similarity(pair_model, period2)
    assert len(frame) == 6 and (frame.n_prompts == 32).all()
    by = frame.set_index(["label_a", "label_b"])
    assert by.loc[("L0H0", "L0H1"), "js_divergence"] == pytest.approx(0.0, abs=1e-6)  # identical heads
    # previous-token vs first-token heads: same distribution only at queries 0 and 1 of 13 -> 11/13 bits
    assert by.loc[("L0H0", "L0H2"), "js_divergence"] == pytest.approx(11 / 13, abs=1e-5)
    square = R.to_matrix(frame)
    assert list(square.index) == ["L0H0", "L0H1", "L0H2", "L0H3"]
    assert (square.values == square.values.T).all() and (square.values.diagonal() == 0).all()


def test_pattern_similarity_of_chosen_layers(tiny_gpt):
    prompts = random_tokens(8, 9, tiny_gpt.cfg.d_vocab, seed=6)
    full = R.pattern_similarity(tiny_gpt, prompts).set_index(["label_a", "label_b"])
    layer1 = R.pattern_similarity(tiny_gpt, prompts, layers=[1]).set_index(["label_a", "label_b"])
    assert len(layer1) == 6 and all(a.startswith("L1") and b.startswith("L1") for a, b in layer1.index)
    torch.testing.assert_close(torch.tensor(layer1["js_divergence"].values),
                               torch.tensor(full.loc[layer1.index, "js_divergence"].values), atol=1e-6, rtol=0)


def test_pattern_similarity_equals_direct_js(tiny_gpt):
    prompts = random_tokens(5, 9, tiny_gpt.cfg.d_vocab, seed=6)
    frame = R.pattern_similarity(tiny_gpt, prompts, batch_size=2)
    _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    patterns = torch.cat([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(2)], dim=1).double()  # (prompt, head, q, k)

    def js(p, q):
        m = (p + q) / 2
        kl = lambda a, b: (torch.special.xlogy(a, a) - torch.special.xlogy(a, b)).sum(-1)
        return ((kl(p, m) + kl(q, m)) / 2 / math.log(2)).mean(-1).mean(0)  # mean over queries, then prompts

    for row in frame.sample(6, random_state=0).itertuples():
        i, j = row.layer_a * 4 + row.head_a, row.layer_b * 4 + row.head_b
        assert row.js_divergence == pytest.approx(float(js(patterns[:, i], patterns[:, j])), abs=1e-5)
        assert row.ci_low <= row.js_divergence <= row.ci_high


def test_output_similarity_known_answers(pair_model, period2, tiny_gpt):
    frame = R.output_similarity(pair_model, period2).set_index(["label_a", "label_b"])
    assert frame.loc[("L0H0", "L0H1"), "cosine"] == pytest.approx(1.0, abs=1e-6)
    assert frame.loc[("L0H0", "L0H1"), "cka"] == pytest.approx(1.0, abs=1e-6)
    assert frame.loc[("L0H0", "L0H2"), "cosine"] == pytest.approx(0.0, abs=1e-6)  # out vs scratch subspaces
    # against a direct computation on a random model
    prompts = random_tokens(3, 7, tiny_gpt.cfg.d_vocab, seed=7)
    result = R.output_similarity(tiny_gpt, prompts).set_index(["label_a", "label_b"])
    _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_result"))
    x, y = cache["blocks.0.attn.hook_result"][:, :, 1].double(), cache["blocks.1.attn.hook_result"][:, :, 3].double()
    cosine = torch.nn.functional.cosine_similarity(x, y, dim=-1).mean()
    xc, yc = x - x.mean(1, keepdim=True), y - y.mean(1, keepdim=True)
    hsic = lambda a, b: (a.transpose(1, 2) @ b).pow(2).sum((1, 2))
    cka = (hsic(xc, yc) / (hsic(xc, xc) * hsic(yc, yc)).sqrt()).mean()
    assert result.loc[("L0H1", "L1H3"), "cosine"] == pytest.approx(float(cosine), abs=1e-5)
    assert result.loc[("L0H1", "L1H3"), "cka"] == pytest.approx(float(cka), abs=1e-5)


# ---------------------------------------------------------------------------------------------
# compensation, backup, pruning


def test_backup_head_compensates_exactly(backup_model, period2):
    result = R.compensation(backup_model, period2, "zero")
    effects = result.effects.set_index("label")
    # L0H0's direct path carries the whole prediction; ablated everywhere, L1H0 takes over
    assert effects.loc["L0H0", "direct_effect"] == pytest.approx(math.log(D_VOCAB - 1), rel=1e-3)
    assert abs(effects.loc["L0H0", "total_effect"]) < 1e-4
    assert effects.loc["L0H0", "ci_low"] > 1.0  # self-repair
    row = result.matrix.iloc[0]
    assert (row.label_a, row.label_b) == ("L0H0", "L1H0")
    assert row.ci_low > 1.0 and row.alignment > 0.99  # L1H0 writes what L0H0 wrote
    assert row.takeover == pytest.approx(1.0, abs=1e-4)
    assert result.square().loc["L0H0", "L1H0"] == row.compensation
    table = P.redundancy_claims(backup_model, period2, backups=[("L1H0", "L0H0")], heads=["L0H0"], method="zero")
    assert dict(zip(table.claim, table.verdict)) == {"backs_up": "supported", "dispensable": "supported"}


def test_pruning_curve_on_the_redundant_pair(pair_model, period2):
    frame = R.pruning_curve(pair_model, period2, "zero", order_by="ablation", n_random=2)
    ordered = frame[frame.order == "importance"]
    assert list(ordered.n_removed) == [0, 1, 2, 3, 4]
    assert set(ordered.removed.iloc[1:3]) == {"L0H2", "L0H3"}  # the free heads go first
    assert frame.attrs["n_removable"]["importance"] == 3
    assert ordered.rise.iloc[-1] == pytest.approx(math.log(D_VOCAB - 1), rel=1e-3)
    assert frame.attrs["n_removable"]["random"] <= 3


def _verdicts(table):
    return dict(zip(table.claim + ":" + table.label, table.verdict))


@pytest.fixture(scope="module")
def costly_pair():
    """Two identical previous-token heads that each matter: each writes a tenth of the readout (3 logits), so
    with both the right token leads by 6 logits (loss ln(1 + 14 e^-6) = 0.034), with one by 3 (0.49 nats more),
    with neither by 0 (ln 15 = 2.71): each alone costs ten times the cheap-removal margin, and together far
    more than apart (interaction 2.67 - 2 x 0.49 = 1.68 nats). L0H2 writes to nothing."""
    b = _Builder(1, 3, D_VOCAB, N_CTX, "constructed-costly-pair")
    for head in (0, 1):
        b.set_pattern(0, head, "previous_token")
        b.set_copy(0, head, "out", gain=0.1)
    b.set_pattern(0, 2, "uniform")
    b.set_copy(0, 2, "scratch")
    return b.finish(task="period-2: next = previous token, split over two heads that each matter")


def test_redundant_heads_that_each_matter_are_redundant_not_dispensable(costly_pair, period2):
    joint = R.joint_ablation(costly_pair, period2, [("L0H0", "L0H1")], "zero").iloc[0]
    both = math.log(D_VOCAB - 1) - math.log1p((D_VOCAB - 2) * math.exp(-6))
    one = math.log1p((D_VOCAB - 2) * math.exp(-3)) - math.log1p((D_VOCAB - 2) * math.exp(-6))
    assert joint.delta_both == pytest.approx(both, rel=1e-3) and joint.delta_a == pytest.approx(one, rel=1e-3)
    assert joint.delta_a > 9 * R.DEFAULT_MARGIN  # each alone is costly
    table = P.redundancy_claims(costly_pair, period2, pairs=[("L0H0", "L0H1"), ("L0H0", "L0H2")], heads=["L0H0"],
                                method="zero")
    assert _verdicts(table) == {"redundant:L0H0 ~ L0H1": "supported", "redundant:L0H0 ~ L0H2": "refuted",
                                "dispensable:L0H0": "refuted"}
    row = table.set_index("label").loc["L0H0 ~ L0H1"]
    assert row.observational == pytest.approx(both - 2 * one, rel=1e-3)  # the interaction, in nats


def test_redundant_pair_is_supported_with_its_interaction(pair_model, period2):
    """constructed.redundant_pair: each alone ~1e-5 nats, both ln 15 = 2.71 on the repeated copies."""
    for method in ("zero", "mean"):
        table = P.redundancy_claims(pair_model, period2, pairs=[("L0H0", "L0H1")], method=method)
        row = table.iloc[0]
        assert row.verdict == "supported", (method, row.reasons)
        assert row.observational > 2.0 and row.necessity > 2.0


def test_no_consumer_is_a_backup_on_toy_induction(toy):
    """Every layer-1 head of toy-induction reads the layer-0 heads (they are its induction heads, and L0's
    heads write their keys). Ablating an L0 head makes each L1 head's direct contribution fall (rise < 0) or
    barely move (L1H0 after a zero-ablated L0H1: +0.003 nats, below the 0.01 minimum), so "L1Hx backs up L0Hy"
    is refuted for all 16 pairs, under mean, resample and zero ablation."""
    model, prompts = toy
    prompts = prompts[:32]
    backups = [(f"L1H{h}", f"L0H{g}") for h in range(4) for g in range(4)]
    for method in ("mean", "resample", "zero"):
        table = P.redundancy_claims(model, prompts, backups=backups, method=method)
        assert set(table.verdict) == {"refuted"}, (method, table[table.verdict != "refuted"].reasons.tolist())
        assert (table.observational < min_effect("nats")).all(), method  # no consumer's direct contribution rises
    matrix = R.compensation(model, prompts, heads=["L0H0", "L0H1", "L0H2", "L0H3"]).matrix
    assert (matrix.ci_high < 0).all() and (matrix.recovered < 0).all()
    assert set(matrix.behaviour) == {"next-token loss on the repeated copies"} and set(matrix.ablation) == {"mean"}


def test_consumer_on_random_prompts_is_not_a_backup(toy):
    """The case the takeover test supported (resample ablation, random prompts: "L1H1 backs up L0H0",
    takeover 0.083 [0.035, 0.131], direct-effect growth 0.125 [0.080, 0.170] nats). There ablating a layer-0
    head *lowers* the loss (by about 0.2 nats): nothing to back up, so no backup claim is supported."""
    model, _ = toy
    bos = model.cfg.d_vocab - 1
    prompts = random_tokens(64, 41, bos, seed=0)
    backups = [(f"L1H{h}", f"L0H{g}") for h in range(4) for g in range(4)]
    table = P.redundancy_claims(model, prompts, backups=backups, method="resample")
    assert "supported" not in set(table.verdict)
    reasons = table.set_index("label").reasons
    assert "no effect to back up" in reasons["L1H1 ~ L0H0"]


def test_backup_head_is_a_backup_by_direct_effect(backup_model, period2):
    """The constructed backup: ablating L0H0 (zero) makes L1H0 write the whole copy, so its direct contribution
    rises by ln 15 (both missing vs L1H0 restoring all) and recovers all of L0H0's frozen effect."""
    result = R.compensation(backup_model, period2, "zero")
    row = result.matrix.iloc[0]
    assert row.compensation == pytest.approx(math.log(D_VOCAB - 1), rel=1e-3)
    assert row.frozen_effect == pytest.approx(math.log(D_VOCAB - 1), rel=1e-3)
    assert row.recovered == pytest.approx(1.0, abs=1e-3)
    verdict = test_claims(backup_model, [P.backup_claim("L1H0", "L0H0", method="zero")], period2,
                          evidence=["observational", "necessity"]).attrs["verdicts"][0]
    assert verdict.verdict == "supported"
    assert verdict.get("necessity").effect == pytest.approx(1.0, abs=1e-3)
    assert verdict.get("necessity").ci_low > 0.9  # well above MIN_EFFECT["fraction"]
    assert verdict.get("observational").extra["takeover"] == pytest.approx(1.0, abs=1e-3)


def test_backup_of_a_head_without_effect_is_inconclusive(backup_model, period2):
    """L0H0 mean-ablated on period-2 prompts costs nothing measurable? No: build the no-effect case directly:
    a layer-0 head writing to scratch has no effect to back up, so the claim is inconclusive, never refuted."""
    b = _Builder(2, 2, D_VOCAB, N_CTX, "constructed-scratch-backup")
    b.set_pattern(0, 0, "uniform")
    b.set_copy(0, 0, "scratch")
    b.set_pattern(0, 1, "previous_token")
    b.set_copy(0, 1, "out")
    for head in (0, 1):
        b.set_pattern(1, head, "uniform")
        b.set_copy(1, head, "scratch")
    model = b.finish(task="a scratch writer and a later scratch writer")
    verdict = test_claims(model, [P.backup_claim("L1H0", "L0H0", method="zero")], period2,
                          evidence=["observational", "necessity"]).attrs["verdicts"][0]
    assert verdict.verdict == "inconclusive" and "no effect" in verdict.reasons[0]


def test_backup_on_encoders_is_measured_or_inconclusive(tiny_encoder):
    """The direct effect on a named behaviour with later layers frozen: on a pre-norm encoder with the
    embedding change it is measured (finite evidence); on a post-norm (BERT-style) one there is no frozen
    direct path, and the claim says so."""
    from interp.models import EncoderConfig, HookedEncoder

    prompts = random_tokens(32, 10, tiny_encoder.cfg.d_vocab, seed=3)
    claim = P.backup_claim((1, 0), (0, 0))
    verdict = test_claims(tiny_encoder, [claim], prompts, behaviour="embedding",
                          evidence=["observational", "necessity"]).attrs["verdicts"][0]
    assert all(math.isfinite(e.effect) for e in verdict.evidence) and verdict.verdict == "refuted"  # random heads
    # L1H0's direct contribution barely moves: well under the practical minimum of the embedding change
    assert abs(verdict.get("observational").effect) < min_effect("cosine distance")
    assert verdict.get("observational").extra["behaviour"] == "embedding_change"
    post = HookedEncoder(EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, post_norm=True,
                                       seed=0)).eval()
    verdict = test_claims(post, [claim], prompts, behaviour="embedding",
                          evidence=["observational", "necessity"]).attrs["verdicts"][0]
    assert verdict.verdict == "inconclusive" and "pre-norm" in verdict.reasons[0]


def test_every_frame_names_its_behaviour_and_ablation(tiny_gpt):
    """One behaviour everywhere: the redundancy analyses default to `interp.Run`'s (`positions="auto"`: the
    repeated copies for repeated prompts), and every frame names it and the ablation kind in columns."""
    from interp.run import Run

    prompts = repeated_tokens(8, 6, tiny_gpt.cfg.d_vocab, seed=3)
    expected = Run(tiny_gpt, prompts).behaviour.describe(prompts)
    assert expected == "next-token loss on the repeated copies"
    frames = {
        "importance": R.importance(tiny_gpt, prompts, "zero"),
        "joint_ablation": R.joint_ablation(tiny_gpt, prompts, [((0, 0), (1, 1))], "zero"),
        "second_order": R.second_order(tiny_gpt, prompts, "zero"),
        "pruning_curve": R.pruning_curve(tiny_gpt, prompts, "zero", n_random=1),
        "compensation.effects": R.compensation(tiny_gpt, prompts, "zero", heads=[(0, 1)]).effects,
        "compensation.matrix": R.compensation(tiny_gpt, prompts, "zero", heads=[(0, 1)]).matrix,
    }
    for name, frame in frames.items():
        assert set(frame["behaviour"]) == {expected}, name
        assert set(frame["ablation"]) == {"zero"}, name
        assert frame.attrs["behaviour"] == expected and frame.attrs["method"] == "zero", name
    every = R.importance(tiny_gpt, prompts, behaviour=R.lm_loss, gradient=False)
    assert set(every["behaviour"]) == {"next-token loss on every position"}
    run = Run(tiny_gpt, prompts)
    from interp.interventions import HeadAblation

    assert frames["importance"].delta_loss.iloc[0] == pytest.approx(run.effect(HeadAblation(((0, 0),), "zero")).mean)


def test_pruning_curve_ranks_and_scores_on_disjoint_halves(tiny_gpt):
    prompts = random_tokens(10, 8, tiny_gpt.cfg.d_vocab, seed=2)
    curve = R.pruning_curve(tiny_gpt, prompts, "zero", n_random=1, seed=5)
    rank, score = curve.attrs["rank_prompts"], curve.attrs["score_prompts"]
    assert not set(rank) & set(score) and sorted(rank + score) == list(range(10))
    assert (curve.n_rank_prompts == len(rank)).all() and (curve.n_prompts == len(score)).all()
    assert curve.attrs["n_rank_prompts"] == len(rank) == 5
    first, second = prompts.split(0.5, seed=5)  # the halves are PromptSet.split's, seeded
    assert torch.equal(prompts[torch.tensor(rank)].tokens, first.tokens)
    assert torch.equal(prompts[torch.tensor(score)].tokens, second.tokens)
    # the order is the ablation ranking of the first half, the curve the second half's losses
    ranked = R.importance(tiny_gpt, first, "zero", gradient=False).sort_values("delta_loss", kind="stable")
    assert curve.attrs["importance_order"] == list(ranked.label)
    clean = R.importance(tiny_gpt, second, "zero", gradient=False).clean_loss.iloc[0]
    assert curve[(curve.order == "importance") & (curve.n_removed == 0)].loss.iloc[0] == pytest.approx(clean)


# ---------------------------------------------------------------------------------------------
# bad input


def test_errors(pair_model, period2):
    with pytest.raises(ValueError, match="L0H7 = \\(0, 7\\) does not exist"):
        R.joint_ablation(pair_model, period2, [("L0H0", "L0H7")])
    with pytest.raises(ValueError, match="same head twice"):
        R.joint_ablation(pair_model, period2, [("L0H0", (0, 0))])
    with pytest.raises(ValueError, match=r"method='median'.*\['zero', 'mean', 'resample', 'auto'\]"):
        R.importance(pair_model, period2, "median")
    with pytest.raises(ValueError, match="NaN or inf"):
        R.importance(pair_model, period2, behaviour=lambda logits, p: torch.full((len(p),), float("nan")), gradient=False)
    with pytest.raises(ValueError, match="one loss per prompt"):
        R.importance(pair_model, period2, behaviour=lambda logits, p: logits.mean(), gradient=False)
    with pytest.raises(TooFewPrompts):
        R.importance(pair_model, period2[:1])
    with pytest.raises(TooFewPrompts):
        R.pattern_similarity(pair_model, period2[:1])
    with pytest.raises(ValueError, match="by='vibes'"):
        R.suggest_pairs(pair_model, period2, by="vibes")
    with pytest.raises(ValueError, match="induction_loss needs prompts from interp.data.repeated_tokens"):
        R.importance(pair_model, random_tokens(4, 8, D_VOCAB), behaviour=R.induction_loss, gradient=False)
    assert live_hooks(pair_model) == []


def test_suggested_pairs_find_the_duplicate(pair_model, period2):
    assert R.suggest_pairs(pair_model, period2, 1, by="pattern") == [((0, 0), (0, 1))]
    assert R.suggest_pairs(pair_model, period2, 1, by="output") == [((0, 0), (0, 1))]
    assert R.suggest_pairs(pair_model, period2, 1, by="second_order") == [((0, 0), (0, 1))]


# ---------------------------------------------------------------------------------------------
# what the shipped toy-induction checkpoint shows


@pytest.fixture(scope="module")
def toy():
    import interp

    model = interp.load("toy-induction")
    bos = model.cfg.d_vocab - 1  # 255
    prompts = repeated_tokens(64, 20, bos, bos=bos, seed=11)  # BOS + prefix of 20 + its repeat
    return model, prompts


@pytest.mark.heavy
def test_toy_induction_redundancy_report(toy):
    """Measured on 64 prompts (BOS + 20 random tokens, repeated), loss on the repeated half
    (`induction_loss`, clean 0.497 nats), mean ablation, 95% bootstrap CIs:

    - No head is dispensable: ablating any one costs between 0.35 [0.26, 0.42] (L0H1) and
      4.99 [4.91, 5.07] nats (L0H2, the previous-token head); all 8 "dispensable" claims refuted.
      L0H0 (previous-token score 0.08) costs 3.71 [3.61, 3.81]: the induction heads need it too.
    - One pair is redundant (together much more than apart): the induction heads L1H1 + L1H3,
      interaction +0.42 [0.34, 0.50], both together 1.25 [1.19, 1.31] nats above the costlier alone;
      the other 27 are refuted. It is the only super-additive pair (partial redundancy). Layer-0 heads with the induction heads they feed are sub-additive
      (L0H2 + L1H0: -1.75 [-1.86, -1.63]): once L0H2 is gone the induction heads add little; and
      L0H0 + L0H2 by -3.61 [-3.71, -3.50] (either alone breaks the circuit).
    - Layer-0 heads act only through composition: direct effects |DE| < 0.03 nats, total
      effects 0.35-4.99, so direct - total is strongly negative (no self-repair to speak of).
    - Backup: no induction head backs up any layer-0 head (all 16 refuted): each reads them, and its
      direct contribution falls when one is ablated (see test_no_consumer_is_a_backup_on_toy_induction).
    - The first-order head-mask estimate (Michel et al. 2019) gets the signs wrong at convergence:
      Spearman with the true ablation 0.10 (signed), though 0.93 on magnitudes.
    - Patterns: the induction heads resemble each other (JS 0.18-0.31 bits) more than any
      layer-0 head (0.78-0.92).
    """
    model, prompts = toy
    margin = 0.05
    imp = R.importance(model, prompts, behaviour=R.induction_loss).set_index("label")
    assert (imp.ci_low > margin).all()
    assert imp.delta_loss.idxmax() == "L0H2" and imp.loc["L0H2", "ci_low"] > 4.5
    assert imp.loc["L0H0", "ci_low"] > 3.0  # the other layer-0 head the induction heads read
    assert imp.attrs["spearman"] < 0.5  # the gradient estimate misranks heads here

    heads = [f"L{l}H{h}" for l in range(2) for h in range(4)]
    pairs = [(heads[i], heads[j]) for i in range(8) for j in range(i + 1, 8)]
    joint = R.joint_ablation(model, prompts, pairs, behaviour=R.induction_loss).set_index(["label_a", "label_b"])
    assert joint.loc[("L1H1", "L1H3"), "ci_low"] > 0.2  # super-additive: partial redundancy
    super_additive = joint[joint.ci_low > 0].index.tolist()
    assert super_additive == [("L1H1", "L1H3")], super_additive
    for pair in [("L0H2", "L1H0"), ("L0H2", "L1H1"), ("L0H2", "L1H2"), ("L0H2", "L1H3"), ("L0H0", "L0H2")]:
        assert joint.loc[pair, "ci_high"] < 0, pair  # sub-additive: the induction heads need L0H2

    backups = [(f"L1H{h}", f"L0H{g}") for h in range(4) for g in range(4)]
    table = P.redundancy_claims(model, prompts, pairs=pairs, heads=heads, backups=backups, behaviour=R.induction_loss)
    verdicts = table.groupby("claim").verdict.agg(lambda v: sorted(set(v)))
    assert verdicts["dispensable"] == ["refuted"]
    redundant = table[table.claim == "redundant"].set_index("label").verdict
    assert redundant[redundant != "refuted"].to_dict() == {"L1H1 ~ L1H3": "supported"}
    assert verdicts["backs_up"] == ["refuted"]

    effects = R.compensation(model, prompts, behaviour=R.induction_loss).effects.set_index("label")
    layer0 = effects.loc[["L0H0", "L0H1", "L0H2", "L0H3"]]
    assert (layer0.direct_effect.abs() < 0.05).all() and (layer0.total_effect > 0.1).all() and (layer0.ci_high < 0).all()

    similarity = R.to_matrix(R.pattern_similarity(model, prompts))
    induction = ["L1H0", "L1H1", "L1H2", "L1H3"]
    within = similarity.loc[induction, induction].values[~torch.eye(4, dtype=torch.bool).numpy()]
    across = similarity.loc[["L0H0", "L0H1", "L0H2", "L0H3"], induction].values
    assert within.max() < across.min()

    curve = R.pruning_curve(model, prompts, behaviour=R.induction_loss, n_random=3)
    at2 = curve[curve.n_removed == 2].set_index("order")
    assert at2.loc["importance", "rise_ci_high"] < at2.loc["random", "rise_ci_low"]
    assert curve.attrs["n_removable"] == {"importance": 0, "random": 0}


# ---------------------------------------------------------------------------------------------
# device= and dtype=

BF16_LOSS_ATOL = 1e-3  # nats: loss values and their changes, bfloat16 vs float32 on tiny_gpt (1e-4 seen)
BF16_SIMILARITY_ATOL = 1e-2  # cosines, CKA, JS, alignment, takeover (2e-3 seen)

PLACED = {  # entry point -> (call, loss-valued columns, similarity-valued columns)
    "importance": (lambda m, p, **k: R.importance(m, p, **k), ["delta_loss", "grad_estimate", "clean_loss"], []),
    "joint_ablation": (lambda m, p, **k: R.joint_ablation(m, p, [((0, 0), (0, 1)), ((0, 2), (1, 3))], **k),
                       ["interaction", "delta_both"], []),
    "second_order": (lambda m, p, **k: R.second_order(m, p, **k), ["interaction_estimate"], []),
    "compensation": (lambda m, p, **k: R.compensation(m, p, heads=[(0, 1)], **k).matrix, ["compensation"],
                     ["takeover", "alignment"]),
    # the random orders only: the importance order is ranked on 4 prompts, where near-tied heads (2e-3 nats
    # apart on tiny_gpt) may swap in bfloat16 and change which head a row removes
    "pruning_curve": (lambda m, p, **k: R.pruning_curve(m, p, n_random=1, **k).query("order == 'random'"),
                      ["loss", "rise"], []),
    "pattern_similarity": (lambda m, p, **k: R.pattern_similarity(m, p, **k), [], ["js_divergence"]),
    "output_similarity": (lambda m, p, **k: R.output_similarity(m, p, **k), [], ["cosine", "cka"]),
}


@pytest.mark.parametrize("name", list(PLACED))
def test_bfloat16_is_close_to_float32_and_leaves_the_model(tiny_gpt, name):
    call, losses, similarities = PLACED[name]
    prompts = repeated_tokens(8, 8, tiny_gpt.cfg.d_vocab, seed=3)
    full, half = call(tiny_gpt, prompts), call(tiny_gpt, prompts, dtype="bfloat16")
    moved = 0.0
    for columns, atol in ((losses, BF16_LOSS_ATOL), (similarities, BF16_SIMILARITY_ATOL)):
        for column in columns:
            gap = (half[column] - full[column]).abs().max()
            assert gap <= atol, (name, column, gap)
            moved = max(moved, gap)
    assert moved > 1e-7, "bfloat16 gave float32's numbers exactly: the dtype was not applied"
    assert next(tiny_gpt.parameters()).dtype == torch.float32  # the caller's model was copied, not cast


def test_device_cpu_gives_the_same_numbers(tiny_gpt):
    prompts = repeated_tokens(8, 8, tiny_gpt.cfg.d_vocab, seed=3)
    torch.testing.assert_close(torch.tensor(R.importance(tiny_gpt, prompts, device="cpu", dtype=torch.float32).delta_loss),
                               torch.tensor(R.importance(tiny_gpt, prompts).delta_loss), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(PLACED))
@pytest.mark.parametrize("placement,message", [
    (dict(device="nonsense"), "is not a device"),
    (dict(device="cuda:99"), "CUDA device"),
    (dict(device="xla"), "not supported"),
    (dict(dtype="float64"), "dtype='float64' is not supported"),
    (dict(dtype=torch.int8), "is not supported"),
])
def test_bad_device_or_dtype_is_bad_input(tiny_gpt, name, placement, message):
    from interp.errors import BadInput

    call = PLACED[name][0]
    with pytest.raises(BadInput, match=message):
        call(tiny_gpt, repeated_tokens(4, 4, tiny_gpt.cfg.d_vocab, seed=3), **placement)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(PLACED))
def test_on_gpu_equals_cpu(tiny_gpt, name):
    call, losses, similarities = PLACED[name]
    prompts = repeated_tokens(8, 8, tiny_gpt.cfg.d_vocab, seed=3)
    cpu, gpu = call(tiny_gpt, prompts), call(tiny_gpt, prompts, device="cuda")
    for column in losses + similarities:
        torch.testing.assert_close(torch.tensor(gpu[column].to_numpy()), torch.tensor(cpu[column].to_numpy()),
                                   rtol=1e-4, atol=1e-5, msg=f"{name}.{column}")
    half = call(tiny_gpt, prompts, device="cuda", dtype="bfloat16")
    for columns, atol in ((losses, BF16_LOSS_ATOL), (similarities, BF16_SIMILARITY_ATOL)):
        for column in columns:
            assert (half[column] - cpu[column]).abs().max() <= atol, (name, column)
    assert next(tiny_gpt.parameters()).device.type == "cpu"
