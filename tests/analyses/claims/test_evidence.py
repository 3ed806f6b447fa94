"""The random-init control on any nn.Module: a re-initialised copy, or "not applicable" naming what remained."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from own_models import NanoStyleGPT, direct_sdpa, encoder_lm, hf_gpt2
from torch import nn

import interp
from interp.analyses import claims as hc
from interp.analyses.claims.evidence import NotReinitialised, random_init, random_init_model, reset_init
from interp.claims import Context, Evidence, decide, evaluate_claims
from interp.data import repeated_tokens
from interp.models.constructed import induction_circuit


class RawParameterLM(nn.Module):
    """The own-model tutorial's shape: a position table as a bare nn.Parameter on the root, which no
    reset_parameters knows."""

    def __init__(self, d_vocab: int = 20, d_model: int = 16, n_heads: int = 2, n_ctx: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(d_vocab, d_model)
        self.pos = nn.Parameter(torch.randn(n_ctx, d_model) * 0.02)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.unembed = nn.Linear(d_model, d_vocab)
        self.n_heads = n_heads

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        q, k, v = (t.unflatten(-1, (self.n_heads, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        z = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.unembed(x + self.out(z.transpose(1, 2).flatten(2)))


class Conv1D(nn.Module):
    """Hugging Face GPT-2's projection: a (in, out) weight and a bias, and no reset_parameters."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_in, n_out))
        self.bias = nn.Parameter(torch.ones(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class PlainLayerNorm(nn.Module):
    """nanoGPT's own LayerNorm (weight and optional bias, no reset_parameters)."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.full((n,), 3.0))
        self.bias = nn.Parameter(torch.full((n,), 3.0))

    def forward(self, x):
        return nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias)


def changed(before: dict[str, torch.Tensor], model: nn.Module) -> dict[str, bool]:
    return {name: not torch.equal(p, before[name]) for name, p in model.named_parameters()}


def test_intercepted_nanogpt_gets_a_reinitialised_copy_and_keeps_its_own_weights():
    model = interp.load(NanoStyleGPT(flash=True))  # SDPA-intercepted
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    made = random_init(model, seed=3)
    fresh = made.model
    assert made.how == "reset" and type(fresh) is type(model) and fresh is not model
    assert not any(changed(before, model).values())  # the original is untouched
    # every weight matrix is new; the tied embedding / head is reset last as lm_head, an nn.Linear (uniform, bound
    # 1 / sqrt(fan_in): std 1 / sqrt(3 * 32)), not the model's own std 0.2; norms are ones
    fresh_params = {name: p.detach() for name, p in fresh.named_parameters()}
    assert all(changed(before, fresh)[name] for name, p in before.items() if p.dim() == 2)
    assert float(fresh_params["transformer.wte.weight"].std()) == pytest.approx(1 / 96 ** 0.5, rel=0.1)
    assert torch.equal(fresh_params["transformer.h.0.ln_1.weight"], torch.ones(32))
    assert fresh.lm_head.weight is fresh.transformer.wte.weight  # tied weights stay tied in the copy
    _, cache = fresh.run_with_cache(torch.randint(0, 61, (2, 12)))  # its hooks are its own, and live
    assert cache["transformer.h.1.attn.hook_pattern"].shape == (2, 4, 12, 12)
    again = random_init_model(model, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), again.parameters()))  # seeded


@pytest.mark.parametrize("factory", [encoder_lm, direct_sdpa, lambda: NanoStyleGPT(flash=False).eval()])
def test_every_parameter_of_users_models_is_reinitialised(factory):
    model = interp.load(factory())
    fresh = random_init_model(model, seed=1)
    assert reset_init(fresh) == ()  # nothing remains (nn.MultiheadAttention's in_proj through its reset)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_hugging_face_model_in_sdpa_mode_conv1d_by_torch_init():
    model = interp.load(hf_gpt2(), backend="sdpa")
    fresh = random_init_model(model, seed=0)
    c_attn = fresh.transformer.h[0].attn.c_attn  # Hugging Face's Conv1D: no reset_parameters
    assert float(c_attn.weight.detach().std()) == pytest.approx(0.02, rel=0.1) and not c_attn.bias.any()


def test_linear_embedding_and_norm_weights_without_reset_parameters():
    model = nn.Sequential(Conv1D(4, 6), PlainLayerNorm(6))
    assert reset_init(model) == ()
    assert not model[0].bias.any() and torch.equal(model[1].weight, torch.ones(6)) and not model[1].bias.any()
    assert not torch.equal(model[0].weight, torch.ones(4, 6))


def test_a_parameter_nothing_reinitialises_is_named():
    model = interp.load(RawParameterLM().eval())
    with pytest.raises(NotReinitialised, match="1 parameter.*: pos ") as error:
        random_init_model(model, seed=0)
    assert error.value.remained == ("pos",)


def test_control_is_not_applicable_there_and_counts_neither_way():
    model = interp.load(RawParameterLM().eval())
    prompts = repeated_tokens(32, 6, 20, seed=0)
    ctx = Context(model, prompts)
    claim = hc.induction_head(0, 0)
    evidence = claim.evidence["control_random_init"](claim, ctx)
    assert evidence.passed is None and evidence.extra["applicable"] == "no"
    assert evidence.extra["not_reinitialised"] == "pos" and "not applicable" in evidence.detail
    observational = claim.evidence["observational"](claim, ctx)
    passing = dataclasses.replace(observational, passed=True, p_value=0.001)  # whatever the head does
    verdict, reasons = decide([passing, evidence], 0.001, 0.05, 32)
    assert verdict == "supported" and any("control_random_init not applicable" in r for r in reasons)


def test_our_models_are_rebuilt_from_their_config():
    circuit = induction_circuit(d_vocab=32, n_ctx=64)
    made = random_init(circuit, seed=5)
    assert made.how == "config" and made.model.cfg.seed == 5
    verdict = evaluate_claims(circuit, [hc.induction_head(1, 0)], repeated_tokens(32, 12, 31, bos=31, seed=1),
                              evidence=["observational", "control_random_init"])[0]
    control = verdict.get("control_random_init")
    assert control.extra["initialised_by"] == "config"
    # per prompt: trained minus random-init, float64, one per prompt, their mean the evidence's effect
    assert control.values is not None and control.values.dtype.is_floating_point and len(control.values) == 32
    assert float(control.values.double().mean()) == pytest.approx(control.effect, rel=1e-6, abs=1e-9)


def test_only_a_control_can_be_not_applicable():
    """A claim still needs its causal evidence: a necessity that could not run withholds support, whatever it says."""
    passing = Evidence("observational", effect=0.9, ci_low=0.8, ci_high=1.0, p_value=0.001, rule="CI > 0.5", passed=True,
                       decisive=True, n_prompts=32)
    missing = Evidence.unmeasured("necessity", rule="", n_prompts=32, detail="could not run",
                                  extra={"applicable": "no"})
    verdict, reasons = decide([passing, missing], 0.001, 0.05, 32)
    assert verdict == "inconclusive" and "necessity undecided" in reasons[0]
