"""The activation read of `interp.behaviour` (reads="activation", hook=...): a behaviour of any hook's
activation, measured through `interp.Run` with one hooked forward per intervention."""
import pytest
import torch

import interp
from interp import behaviour as B
from interp.errors import BadInput
from interp.hooks import hooked, live_hooks

SCORES = "blocks.1.attn.hook_attn_scores"


def last_score(scores: torch.Tensor, prompts) -> torch.Tensor:
    """Head 0's score from the last query to the first key, per prompt."""
    return scores[:, 0, -1, 0].double()


@pytest.fixture(scope="module")
def toy():
    return interp.load("toy-induction")


@pytest.fixture(scope="module")
def prompts():
    return interp.data.repeated_tokens(4, 6, 255, bos=255, seed=0)


def test_an_activation_read_names_its_hook():
    with pytest.raises(BadInput, match=r"reads='activation' with hook=''"):
        B.Behaviour("score", "activation", last_score)
    with pytest.raises(BadInput, match=r"reads='logits' with hook="):
        B.Behaviour("score", "logits", last_score, hook=SCORES)
    spec = B.Behaviour("score", "activation", last_score, hook=SCORES).spec()
    assert spec["reads"] == "activation" and spec["hook"] == SCORES
    assert "hook" not in B.next_token_loss().spec()  # the other behaviours' specs are unchanged


def test_measure_reads_the_hook_and_stops_the_forward_there(toy, prompts):
    behaviour = B.Behaviour("score", "activation", last_score, hook=SCORES)
    fired = []
    with hooked(toy, [("ln_final.hook_scale", lambda act, hook: fired.append(hook.name))]):
        values = B.measure(toy, prompts, behaviour, batch_size=3)
    _, cache = toy.run_with_cache(prompts.tokens, names_filter=[SCORES])
    torch.testing.assert_close(values, cache[SCORES][:, 0, -1, 0].double())
    assert fired == [] and live_hooks(toy) == []


def test_an_unknown_or_unreached_hook_is_bad_input(toy, prompts, monkeypatch):
    with pytest.raises(BadInput, match=r"unknown hook name 'blocks.1.attn.hook_score'.*Did you mean"):
        B.measure(toy, prompts, B.Behaviour("s", "activation", last_score, hook="blocks.1.attn.hook_score"))
    monkeypatch.setattr(toy, "forward", lambda *args, **kwargs: None)  # a forward that never reaches the hook
    with pytest.raises(BadInput, match=r"hook 'blocks.1.attn.hook_attn_scores', which this forward .* never reached"):
        B.final_output(toy, prompts, "activation", SCORES)
    assert live_hooks(toy) == []


def test_a_run_measures_an_activation_behaviour_with_hooked_forwards(toy, prompts):
    run = interp.Run(toy, prompts).with_behaviour(B.Behaviour("score", "activation", last_score, hook=SCORES))
    assert run._path(None).how == "hooked" and run._path(interp.HeadAblation("L0H2", "zero")).how == "hooked"
    _, cache = toy.run_with_cache(prompts.tokens, names_filter=[SCORES])
    torch.testing.assert_close(run.clean(), cache[SCORES][:, 0, -1, 0].double())
    effect = run.effect(interp.HeadAblation("L0H2", "zero"))

    def zero(z, hook):
        z[:, :, 2] = 0.0
        return z

    with hooked(toy, [("blocks.0.attn.hook_z", zero)]):
        _, ablated = toy.run_with_cache(prompts.tokens, names_filter=[SCORES])
    torch.testing.assert_close(effect.intervened, ablated[SCORES][:, 0, -1, 0].double())
    assert effect.mean != 0


def test_the_ablation_engine_reads_an_activation_by_a_hooked_forward_only(toy, prompts):
    from interp.ablation import AblationEngine

    behaviour = B.Behaviour("score", "activation", last_score, hook=SCORES)
    slow = AblationEngine(toy, prompts, "zero", behaviour=behaviour, fast=False)
    clean, ablated = slow._losses([[(0, 2)]])
    _, cache = toy.run_with_cache(prompts.tokens, names_filter=[SCORES])
    torch.testing.assert_close(clean, cache[SCORES][:, 0, -1, 0].double())
    assert not torch.equal(ablated[0], clean)
    with pytest.raises(BadInput, match=r"resuming from cached residuals cannot give; measure it through interp.Run"):
        AblationEngine(toy, prompts, "zero", behaviour=behaviour, fast=True)._losses([[(0, 2)]])
