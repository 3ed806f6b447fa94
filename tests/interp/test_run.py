"""interp.Run: one measurement object for every causal number (effects, memo, strategies, bad input)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from factories import ablating

import interp
import interp.run as run_module
from interp.data import PromptSet, pad, repeated_tokens
from interp.errors import BadInput
from interp.interventions import HeadAblation, PatternSubstitution
from interp.models.constructed import induction_circuit
from interp.run import Effect, Run, Strategy, parameter_version, prompt_fingerprint


@pytest.fixture(scope="module")
def toy():
    return interp.load("toy-induction")


@pytest.fixture(scope="module")
def prompts():
    return repeated_tokens(24, prefix_len=12, d_vocab=255, seed=0, bos=255)


def test_the_notebook_snippet(toy, prompts) -> None:
    run = interp.Run(toy, prompts)
    effect = run.effect(interp.HeadAblation("L1H2", "mean"))
    assert isinstance(effect, Effect) and effect.n_prompts == len(prompts) == effect.values.shape[0]
    assert effect.mean == pytest.approx(float(effect.values.mean()))
    assert effect.ci_low < effect.mean < effect.ci_high
    assert effect.mean > 0.5  # the toy's induction head: ablating it costs the repeats their copy
    assert effect.behaviour == "next-token loss on the repeated copies" and effect.unit == "nats"
    torch.testing.assert_close(effect.values, effect.intervened - effect.clean)
    row = effect.frame().iloc[0]
    assert row.effect == effect.mean and row.n_prompts == len(prompts) and row.behaviour == effect.behaviour


def test_an_effect_equals_the_hooked_forward_by_hand(toy, prompts) -> None:
    """The resumed path and a plain `with ablating(...)` forward give the same per-prompt losses."""
    run = Run(toy, prompts)
    effect = run.effect(HeadAblation((1, 2), "mean"))
    behaviour = run.behaviour
    reference = run.reference("mean")
    with torch.no_grad(), ablating(toy, [(1, 2)], "mean", reference=reference):
        logits = toy(prompts.tokens)
    by_hand = behaviour(logits, prompts).double()
    torch.testing.assert_close(effect.intervened, by_hand, atol=2e-6, rtol=0)
    hooked = Run(toy, prompts, strategy=Strategy.HOOKED).effect(HeadAblation((1, 2), "mean"))
    torch.testing.assert_close(hooked.values, effect.values, atol=2e-6, rtol=0)


def test_batched_strategy_agrees_with_resuming(toy, prompts) -> None:
    heads = [HeadAblation(h, "mean") for h in ("L0H0", "L1H1", "L1H2")]
    resumed = Run(toy, prompts, strategy=Strategy.RESUME).effects(heads)
    batched = Run(toy, prompts, strategy=Strategy.BATCHED).effects(heads)
    for a, b in zip(resumed, batched):
        torch.testing.assert_close(a.values, b.values, atol=2e-6, rtol=0)
    with pytest.raises(BadInput, match="one head at a time"):
        Run(toy, prompts, strategy=Strategy.BATCHED).effect(HeadAblation(["L0H0", "L0H1"], "mean"))


def test_the_memo_serves_a_repeated_effect_without_a_forward(toy, prompts, monkeypatch) -> None:
    run = Run(toy, prompts)
    first = run.effect(HeadAblation("L0H1", "zero"))
    calls = []
    monkeypatch.setattr(type(toy), "forward", lambda *a, **k: calls.append(1))  # a hook would stop the memo
    again = run.effect(HeadAblation(((0, 1),), "zero"))  # the same spec, written another way
    monkeypatch.undo()
    assert again is first and calls == []


def test_a_forward_hook_stops_the_memo_and_warns_once(toy, prompts) -> None:
    """r119: a hook attached after the first effect changes the numbers; the Run computes under it, memoises
    nothing while it is attached, warns once, and serves the memo again once it is removed."""
    import warnings

    run = Run(toy, prompts)
    ablation = HeadAblation("L1H2", "zero")
    first = run.effect(ablation)
    handle = toy.blocks[1].register_forward_hook(lambda module, args, out: torch.zeros_like(out))
    try:
        with pytest.warns(UserWarning, match=r"forward hooks are attached to the model \(at 'blocks.1'\).*nothing is memoised"):
            hooked = run.effect(ablation)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per Run
            again = run.effect(ablation)
        with pytest.warns(UserWarning, match="forward hooks"):
            fresh = Run(toy, prompts).effect(ablation)
    finally:
        handle.remove()
    assert abs(hooked.mean - first.mean) > 0.1  # block 1 zeroed: another number
    assert hooked is not again and again.mean == pytest.approx(fresh.mean, abs=1e-9)
    assert run.effect(ablation) is first  # the hook is gone: the memo again


def test_a_hook_point_hook_counts_but_the_toolkits_own_come_and_go(toy, prompts) -> None:
    from interp.hooks import attached_forward_hooks, hooked

    assert attached_forward_hooks(toy) == []
    with hooked(toy, [("blocks.0.attn.hook_pattern", lambda pattern, hook: None)]):
        assert attached_forward_hooks(toy) == ["blocks.0.attn.hook_pattern"]
    run = Run(toy, prompts)
    run.effect(HeadAblation("L0H0", "mean"))  # the toolkit's own hooks, inside the call
    assert attached_forward_hooks(toy) == [] and run.memoising()


def test_edits_through_data_are_seen_by_the_memo(prompts) -> None:
    """r117: torch does not count writes through `.data`; the key's sampled checksum does, so the memo follows a
    `.data` edit of one head's weights (a fresh Run's number), and a repeated call is still a memo hit."""
    model = induction_circuit()
    tokens = PromptSet(prompts.tokens.clamp(max=model.cfg.d_vocab - 1))
    run = Run(model, tokens)
    ablation = HeadAblation("L1H0", "mean")
    before = run.effect(ablation)
    model.blocks[1].attn.W_Q.data[0].mul_(0.0)  # one head's query weights, through .data
    after = run.effect(ablation)
    assert after is not before and abs(after.mean - before.mean) > 1e-3
    assert after.mean == pytest.approx(Run(model, tokens).effect(ablation).mean, abs=1e-6)
    assert run.effect(ablation) is after  # nothing changed since: a hit
    doc = " ".join((Run.effect.__doc__ or "").split())
    assert ".data" in doc and "forget()" in doc


def test_the_sampled_checksum_sees_a_strided_write_and_keeps_equal_keys_equal() -> None:
    model = induction_circuit()
    key = parameter_version(model)
    assert parameter_version(model) == key  # deterministic: a memo hit stays a hit
    largest = max(model.parameters(), key=lambda p: p.numel())
    largest.data.view(-1)[0] += 1.0  # the first value is always sampled
    assert parameter_version(model) != key


def test_a_model_without_attention_is_a_clear_error(prompts) -> None:
    from torch import nn

    from interp.errors import BadType

    with pytest.raises(BadType, match=r"cannot find attention hooks in a Sequential; .*interp.load\(model\)"):
        Run(nn.Sequential(nn.Embedding(256, 16), nn.Linear(16, 256)), prompts)


def test_editing_a_weight_in_place_recomputes_the_next_effect(prompts) -> None:
    model = induction_circuit()
    tokens = prompts.tokens.clamp(max=model.cfg.d_vocab - 1)
    run = Run(model, PromptSet(tokens))
    intervention = HeadAblation("L1H0", "mean")
    before = run.effect(intervention)
    version = parameter_version(model)
    with torch.no_grad():
        model.blocks[1].attn.W_Q[0] *= 0.0  # the induction head no longer finds its target
    assert parameter_version(model) != version
    after = run.effect(intervention)
    assert after is not before and abs(after.mean - before.mean) > 1e-3
    assert run.effect(intervention) is after


def test_prompt_fingerprint_is_content(prompts) -> None:
    copy = PromptSet(prompts.tokens.clone(), meta=dict(prompts.meta), special_mask=prompts.special_mask.clone())
    assert prompt_fingerprint(copy) == prompt_fingerprint(prompts)
    # which tokens are special is content too: it decides what shuffling and role-matched means do
    assert prompt_fingerprint(PromptSet(prompts.tokens, meta=dict(prompts.meta))) != prompt_fingerprint(prompts)
    changed = prompts.tokens.clone()
    changed[0, 3] += 1
    assert prompt_fingerprint(PromptSet(changed)) != prompt_fingerprint(prompts)
    masked = PromptSet(prompts.tokens, attention_mask=torch.ones_like(prompts.tokens), special_mask=prompts.special_mask)
    assert prompt_fingerprint(masked) != prompt_fingerprint(prompts)


def test_pattern_substitution_is_an_intervention(toy, prompts) -> None:
    run = Run(toy, prompts)
    uniform = run.effect(PatternSubstitution("L1H2", "uniform"))
    own = run.effect(PatternSubstitution("L1H2", None))  # the head's own pattern: nothing changes
    assert uniform.mean > 0.1
    assert abs(own.mean) < 1e-5
    assert PatternSubstitution((1, 2), None, permute=True).spec() == {"substitute": [1, 2], "pattern": None,
                                                                       "permute": True}
    with pytest.raises(ValueError, match=r"must be one of \['uniform', 'previous_token', .*'self', .*'induction'"):
        PatternSubstitution("L1H2", "previous")


def test_pattern_substitution_takes_a_tensor_as_substitute_pattern_does(toy, prompts) -> None:
    """r016 r017: a (query, key) tensor is substituted as `substitute_pattern` substitutes it, named in the spec by
    its shape and a digest; a value of another type is a BadType naming PatternSource."""
    from interp.errors import BadType
    from interp.head_types import TargetBatch, get_head_type
    from interp.interventions import substitute_pattern

    run = Run(toy, prompts, strategy=Strategy.HOOKED)
    ideal = get_head_type("previous_token").ideal_pattern(TargetBatch.from_prompts(prompts))[0]  # (query, key)
    effect = run.effect(PatternSubstitution("L1H2", ideal))
    with torch.no_grad(), substitute_pattern(toy, 1, 2, ideal):
        by_hand = run.behaviour(toy(prompts.tokens), prompts).double()
    torch.testing.assert_close(effect.intervened, by_hand, atol=2e-6, rtol=0)
    assert run.effect(PatternSubstitution("L1H2", "previous_token")).mean == pytest.approx(effect.mean, abs=1e-6)
    spec = PatternSubstitution("L1H2", ideal).spec()["pattern"]
    assert spec["tensor"] == [prompts.n_pos, prompts.n_pos] and len(spec["blake2b"]) == 32
    assert PatternSubstitution("L1H2", ideal.clone()) == PatternSubstitution("L1H2", ideal)
    other = get_head_type("first_token").ideal_pattern(TargetBatch.from_prompts(prompts))[0]
    assert PatternSubstitution("L1H2", other).spec() != PatternSubstitution("L1H2", ideal).spec()
    for bad in (5, lambda n: ideal):
        with pytest.raises(BadType, match="PatternSource"):
            PatternSubstitution("L1H2", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sums to"):
        PatternSubstitution("L1H2", ideal * 2)


class _Named:
    """A TargetSource / PatternSource named "mine", whatever it gives: two of them share one spec()."""

    def __init__(self, make):
        self.make = make

    def spec(self):
        return {"source": "mine"}

    def __call__(self, run, batch):
        return self.make(batch)


def test_sources_with_equal_specs_are_told_apart(toy, prompts) -> None:
    """r110: the memo key holds a digest of what a source gives on the run's prompts, not its spec() alone."""
    from interp.interventions import AttentionKnockout

    run = Run(toy, prompts)
    n = prompts.n_pos
    previous = _Named(lambda b: torch.diag_embed(torch.ones(len(b), n - 1), offset=-1))
    nothing = _Named(lambda b: torch.zeros(len(b), n, n))
    knocked = run.effect(AttentionKnockout("L1H2", previous))
    untouched = run.effect(AttentionKnockout("L1H2", nothing))
    assert untouched is not knocked and untouched.mean == pytest.approx(0.0, abs=1e-6) and abs(knocked.mean) > 1e-3
    assert run.effect(AttentionKnockout("L1H2", _Named(nothing.make))) is untouched  # same targets: the memo
    uniform = _Named(lambda b: torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None])
    own_previous = _Named(lambda b: torch.diag_embed(torch.ones(n - 1), offset=-1) + torch.eye(n) * (torch.arange(n) == 0))
    assert run.effect(PatternSubstitution("L1H2", uniform)).mean != run.effect(PatternSubstitution("L1H2", own_previous)).mean


def test_auto_strategy_hooks_models_that_cannot_resume(prompts) -> None:
    from interp.models import EncoderConfig, HookedEncoder

    encoder = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, n_ctx=32, d_vocab=256, seed=0,
                                          post_norm=True))  # BERT's blocks: resuming after attention is not exact
    run = Run(encoder, prompts, behaviour="embedding")
    assert run._path(HeadAblation("L0H0")) == run_module._Path("engine", "mean")  # one hooked forward per head set
    effect = run.effect(HeadAblation("L0H0", "mean"))
    assert effect.values.shape == (len(prompts),) and bool((effect.clean == 0).all())  # same as itself: no change
    with pytest.raises(BadInput, match="strategy=Strategy.RESUME needs"):
        Run(encoder, prompts, behaviour="embedding", strategy=Strategy.RESUME).effect(HeadAblation("L0H0"))


def test_with_behaviour_keeps_the_settings(toy, prompts) -> None:
    run = Run(toy, prompts, batch_size=8, seed=3)
    every = run.with_behaviour(interp.next_token_loss("all"))
    assert (every.batch_size, every.seed, every.model) == (8, 3, toy)
    assert every.behaviour.describe(prompts) != run.behaviour.describe(prompts)
    assert every.effect(HeadAblation("L1H2")).mean != run.effect(HeadAblation("L1H2")).mean


def test_device_and_dtype_move_a_copy(toy, prompts) -> None:
    run = Run(toy, prompts, dtype="bfloat16")
    assert run.model is not toy and next(run.model.parameters()).dtype == torch.bfloat16
    assert next(toy.parameters()).dtype == torch.float32


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size=0"),
    ({"strategy": "fast"}, r"strategy='fast'; expected an interp.Strategy: Strategy.AUTO, Strategy.RESUME"),
    ({"seed": -1}, "seed"),
])
def test_bad_settings_are_refused(toy, prompts, kwargs, match) -> None:
    with pytest.raises(BadInput, match=match):
        Run(toy, prompts, **kwargs)


def test_a_non_intervention_is_refused(toy, prompts) -> None:
    with pytest.raises(BadInput, match="needs an intervention"):
        Run(toy, prompts).effect("L1H2")  # type: ignore[arg-type]


def test_the_toolkits_own_deprecations_fail_the_suite() -> None:
    """pyproject's filter: a DeprecationWarning attributed to an interp module is an error here."""
    import warnings

    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("a removed name", DeprecationWarning, "interp/old.py", 1, module="interp.old")


@pytest.fixture
def effect_calls(monkeypatch):
    """The spec of every intervention measured through Run.effect or Run.effects (wrappers on both methods)."""
    calls: list[dict] = []
    one, many = Run.effect, Run.effects

    def counting(self, intervention):
        calls.append(intervention.spec())
        return one(self, intervention)

    def counting_all(self, interventions):
        interventions = list(interventions)
        calls.extend(i.spec() for i in interventions)
        return many(self, interventions)

    monkeypatch.setattr(Run, "effect", counting)
    monkeypatch.setattr(Run, "effects", counting_all)
    return calls


def test_every_causal_analysis_reads_its_numbers_through_run_effect(effect_calls, toy, prompts) -> None:
    from interp.analyses import redundancy
    from interp.analyses.claims import induction_head, pair
    from interp.claims import test_claims
    from interp.interventions import all_heads

    n_heads = len(all_heads(toy))
    measured = {}
    for name, analysis in {
        "importance": lambda: redundancy.importance(toy, prompts, gradient=False),
        "joint_ablation": lambda: redundancy.joint_ablation(toy, prompts, [("L0H0", "L1H2")]),
        "pruning_curve": lambda: redundancy.pruning_curve(toy, prompts, n_random=1),
        "compensation": lambda: redundancy.compensation(toy, prompts, heads=["L0H0"]),
        "head claim": lambda: test_claims(toy, [induction_head(1, 2)], prompts,
                                          evidence=("observational", "necessity", "sufficiency", "faithfulness")),
        "pair claim": lambda: test_claims(toy, [pair.redundant_claim("L0H0", "L0H1")], prompts),
    }.items():
        effect_calls.clear()
        analysis()
        measured[name] = list(effect_calls)
    assert len(measured["importance"]) == n_heads
    assert len(measured["joint_ablation"]) == 3  # each alone, then both
    assert len(measured["pruning_curve"]) >= 2 * n_heads
    assert len(measured["compensation"]) == n_heads  # every head's total effect
    claims = measured["head claim"]
    assert {"heads": [[1, 2]], "kind": "mean", "site": "z"} in claims  # necessity
    assert any("substitute" in spec and spec["pattern"] == "uniform" for spec in claims)  # faithfulness
    assert any("substitute" in spec and isinstance(spec["pattern"], dict) for spec in claims)  # sufficiency: the ideal
    assert {"heads": [[0, 0], [0, 1]], "kind": "mean", "site": "z"} in measured["pair claim"]


def _padded_with_bos(n: int = 12) -> PromptSet:
    """BOS (255) then 6..13 random tokens, right padded: references matched by token role."""
    generator = torch.Generator().manual_seed(3)
    rows = [torch.cat([torch.tensor([255]), torch.randint(0, 255, (int(6 + i % 8),), generator=generator)]) for i in range(n)]
    padded = pad(rows, pad_id=0)
    special = torch.zeros(padded.tokens.shape, dtype=torch.bool)
    special[:, 0] = True
    return PromptSet(padded.tokens, padded.attention_mask, padded.meta, special_mask=special)


@pytest.mark.parametrize("kind", ["mean", "resample", "auto"])
def test_role_matched_ablations_agree_across_strategies(toy, kind) -> None:
    prompts = _padded_with_bos()
    heads = [HeadAblation(h, kind) for h in ("L0H0", "L1H1")]
    resumed = Run(toy, prompts, strategy=Strategy.RESUME).effects(heads)
    assert Run(toy, prompts).reference(kind).by_role
    for strategy in (Strategy.HOOKED, Strategy.BATCHED):
        for a, b in zip(resumed, Run(toy, prompts, strategy=strategy).effects(heads)):
            assert a.ablation == b.ablation and a.ablation in ("mean", "resample")
            if strategy is Strategy.HOOKED or a.ablation == "mean":  # batched resampling draws its own stream
                torch.testing.assert_close(a.values, b.values, atol=2e-6, rtol=0)
    if kind == "mean":  # the resumed values are the role-matched ablation done by hand
        run = Run(toy, prompts)
        with torch.no_grad(), ablating(toy, [(1, 1)], "mean", reference=run.reference("mean"), prompts=prompts):
            by_hand = run.behaviour(toy(prompts.tokens, attention_mask=prompts.attention_mask), prompts).double()
        torch.testing.assert_close(resumed[1].intervened, by_hand, atol=2e-6, rtol=0)


def test_auto_ablation_is_named_in_the_effect_and_its_frame(toy, prompts) -> None:
    run = Run(toy, prompts)
    auto = run.effect(HeadAblation((1, 2), "auto"))
    resolved = HeadAblation((1, 2), "auto").resolved_kind(run)
    assert auto.ablation == resolved and auto.frame()["ablation"].tolist() == [resolved]
    same = run.effect(HeadAblation((1, 2), resolved))
    torch.testing.assert_close(auto.values, same.values, atol=0, rtol=0)
    assert run.effect(HeadAblation((1, 2), "zero")).ablation == "zero"
    assert run.effect(PatternSubstitution((1, 2))).ablation is None


def test_hooked_interventions_resume_from_their_first_layer_with_the_same_values(monkeypatch):
    """A pattern substitution, a knockout and an ablation at layer 1 rerun only blocks 1..: the same numbers as
    the full hooked forward (`measure` on the whole model), and fewer blocks run."""
    import interp.run as run_module
    from interp.analyses.claims.causal import RoleTargets
    from interp.analyses.head_types import get_head_type
    from interp.behaviour import measure
    from interp.interventions import AttentionKnockout

    model = induction_circuit(d_vocab=24, n_ctx=48)
    prompts = repeated_tokens(16, 8, 23, bos=23, seed=3)
    run = Run(model, prompts, strategy=Strategy.HOOKED, batch_size=6)
    interventions = [PatternSubstitution((1, 0), "uniform"), HeadAblation(((1, 0),), "zero", site="result"),
                     AttentionKnockout((1, 0), RoleTargets(get_head_type("induction")))]
    for intervention in interventions:
        assert run_module._first_layer(intervention) == 1
        full = measure(model, prompts, run.behaviour, intervene=lambda batch, i=intervention: i.intervene(run, batch),
                       batch_size=6)
        torch.testing.assert_close(run.values(intervention), full, atol=1e-6, rtol=1e-6)
    blocks_run = []  # counted by wrapping block 0's forward: an attached forward hook would stop the memo
    block_forward = model.blocks[0].forward
    model.blocks[0].forward = lambda *args, **kwargs: (blocks_run.append(0), block_forward(*args, **kwargs))[1]
    fresh = Run(model, prompts, strategy=Strategy.HOOKED, batch_size=6)
    try:
        fresh.values(PatternSubstitution((1, 1), "uniform"))
        assert len(blocks_run) == 6  # the clean run, and the stream entering block 1 (3 batches each)
        fresh.values(PatternSubstitution((1, 2), "uniform"))
        fresh.values(HeadAblation(((1, 3),), "zero", site="result"))
    finally:
        del model.blocks[0].forward
    assert len(blocks_run) == 6  # block 0 never reruns under an intervention at layer 1
    assert run_module._first_layer(HeadAblation(((0, 1), (1, 2)), "mean")) == 0


@dataclasses.dataclass(frozen=True, eq=False)
class _ScaledHead:
    """A user's intervention: L1H2's z times `scale` (a tensor); its spec() names it without the tensor's values."""

    scale: torch.Tensor

    def spec(self):
        return {"intervention": "scaled L1H2"}

    def intervene(self, run, batch):
        def hook(z, hook=None):  # (batch, pos, head, d_head)
            z = z.clone()
            z[:, :, 2] = z[:, :, 2] * self.scale
            return z
        return interp.hooked(run.model, [(interp.attention_sites(run.model)[1].hook("z"), hook)])


def test_interventions_with_equal_specs_but_other_tensors_are_told_apart(toy, prompts) -> None:
    """The memo key holds a digest of an intervention's tensors (and prompt sets), not its spec() alone: two
    interventions naming themselves alike but holding other values never share a number."""
    run = Run(toy, prompts)
    removed = run.effect(_ScaledHead(torch.tensor(0.0)))
    kept = run.effect(_ScaledHead(torch.tensor(1.0)))
    assert removed.mean > 0.5 and kept.mean == pytest.approx(0.0, abs=1e-6)
    assert run.effect(_ScaledHead(torch.tensor(0.0))) is removed  # equal content: the memo
    effects = [key for key in run.memo_keys() if key.kind == "effect"]
    assert len(effects) == 2 and effects[0].what != effects[1].what


def test_memo_keys_say_what_is_memoised(toy, prompts) -> None:
    run = Run(toy, prompts)
    assert run.memo_keys() == []
    run.effect(HeadAblation("L1H2", "mean"))
    run.with_behaviour(interp.next_token_loss("all")).effect(HeadAblation("L1H2", "mean"))
    keys = run.memo_keys()
    effects = [key for key in keys if key.kind == "effect"]
    assert [key.behaviour for key in effects] == ["next_token_loss(positions=auto)", "next_token_loss(positions=all)"]
    assert all('{"heads": [[1, 2]], "kind": "mean", "site": "z"}' in key.what for key in effects)
    assert {"reference", "engine"} <= {key.kind for key in keys}
    assert {key.prompts for key in keys} == {prompt_fingerprint(prompts)[:12]}
    run.forget()
    assert [key for key in run.memo_keys() if key.behaviour.endswith("auto)")] == []


def test_strategies_are_typed_and_their_names_are_mapped_for_one_release(toy, prompts) -> None:
    """A strategy is an `interp.Strategy`; its name as a string still works in 0.1, with a DeprecationWarning
    that names the value to pass."""
    assert interp.Strategy is Strategy and Run(toy, prompts, strategy=Strategy.HOOKED).strategy is Strategy.HOOKED
    with pytest.warns(DeprecationWarning, match=r"strategy='hooked' as a string is deprecated.*Strategy.HOOKED"):
        run = Run(toy, prompts, strategy="hooked")  # type: ignore[arg-type]
    assert run.strategy is Strategy.HOOKED and "strategy='hooked'" in repr(run)
    with pytest.raises(BadInput, match="expected an interp.Strategy"):
        Run(toy, prompts, strategy=3)  # type: ignore[arg-type]


@pytest.fixture
def effects_returned(monkeypatch):
    """Every Effect that Run.effect and Run.effects hand back, as they hand them back."""
    returned: list[Effect] = []
    one, many = Run.effect, Run.effects

    def counting(self, intervention):
        effect = one(self, intervention)
        returned.append(effect)
        return effect

    def counting_all(self, interventions):
        effects = many(self, interventions)
        returned.extend(effects)
        return effects

    monkeypatch.setattr(Run, "effect", counting)
    monkeypatch.setattr(Run, "effects", counting_all)
    return returned


def _memoised(run: Run) -> list:
    """Every value in the Run's memo and in its with_behaviour runs' (runs made by .on() share the memo)."""
    return [*run._memo.values(), *(value for derived in run._derived.values() for value in derived._memo.values())]


def test_every_effect_an_analysis_used_is_in_the_users_run_memo(effects_returned) -> None:
    """Claims, pruning, path patching and circuit discovery given a Run read every causal number through it: each
    Effect they used is afterwards in that Run's memo (and listed by memo_keys)."""
    from interp.analyses import circuits, redundancy
    from interp.analyses.claims import induction_head

    model = induction_circuit(d_vocab=24, n_ctx=48)
    prompts = repeated_tokens(32, 8, 23, bos=23, seed=3)
    for name, analysis in {
        "claims": lambda run: interp.test_claims(run, [induction_head(1, 0)], evidence=("observational", "necessity",
                                                                                 "faithfulness")),
        "pruning": lambda run: redundancy.pruning_curve(run, n_random=1),
        "path patching": lambda run: (circuits.path_patch(run, sender="L0H0", receiver="L1H0", via="k"),
                                      circuits.path_patches(run, edges=["L0H0 -> L1H0 via k", "L1H0 -> logits"])),
        "discovery": lambda run: circuits.discover(run, method="acdc"),
    }.items():
        run = Run(model, prompts, batch_size=8)
        effects_returned.clear()
        analysis(run)
        memoised = _memoised(run)
        assert effects_returned, name
        assert all(any(effect is value for value in memoised) for effect in effects_returned), name
        assert len([key for key in run.memo_keys() if key.kind == "effect"]) >= len({id(e) for e in effects_returned})


def test_the_memo_keeps_one_sweep_engine_at_a_time(toy, prompts):
    """Each engine holds every node's clean and corrupted writes: a second prompt set's engine replaces the first's
    in the shared memo, while the effects computed through the first stay memoised."""
    run = Run(toy, prompts)
    first_half, second_half = prompts.split(0.5, seed=0)
    first = run.on(first_half)
    edge = interp.EdgePatch("L0H2 -> L1H2 via k")
    effect = first.effect(edge)
    engine = first.sweep()
    assert first.sweep() is engine  # built once
    run.on(second_half).sweep()
    engines = [key for key in run._memo if key[0][:1] == ("sweep",)]
    assert len(engines) == 1
    assert first.effect(edge) is effect  # the effect itself is still memoised
    assert first.sweep() is not engine  # rebuilt when asked again
