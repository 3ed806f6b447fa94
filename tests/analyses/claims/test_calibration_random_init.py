"""Calibration: on randomly initialised models of the toy-induction shape, claims are supported no more
often than the nominal error rate.

Two measurements, over every head, every built-in claim kind and several initialisation seeds:
1. the preset claims with every default evidence kind (the toolkit as users run it);
2. a harder, boundary case: each claim's threshold set to the head's true mean metric (measured on
   256 independent prompts), where "the metric exceeds the threshold" is exactly the null
   hypothesis, so the observational test alone decides. The rate at which it passes is the
   false-positive rate of the bootstrap-CI rule itself.
The rates are printed (run with -s) and attached to the test report as properties.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from interp.analyses import claims as hc
from interp.claims import Context, evaluate_claims
from interp.claims import test_claims as run_test_claims
from interp.data import repeated_tokens
from interp.experiments.train import toy_induction_config
from interp.models import HookedGPT

pytestmark = pytest.mark.heavy  # one module fixture tests every claim kind on five random models

ALPHA = 0.05
SEEDS = (0, 1, 2, 3, 4)
N_PROMPTS, PREFIX = 32, 20  # 32 prompts of 40 tokens


# every kind defined on a causal model (next_token is for bidirectional ones)
KINDS = tuple(kind for kind in hc.CLAIM_KINDS if kind != "next_token")


def slack(n: int, alpha: float = ALPHA) -> float:
    """Two binomial standard errors of a rate alpha measured on n claims."""
    return 2 * math.sqrt(alpha * (1 - alpha) / n)


def random_model(seed: int) -> HookedGPT:
    return HookedGPT(toy_induction_config(seed=1000 + seed)).eval()


@pytest.fixture(scope="module")
def preset_verdicts() -> pd.DataFrame:
    frames = []
    for seed in SEEDS:
        model = random_model(seed)
        cfg = model.cfg
        prompts = repeated_tokens(N_PROMPTS, PREFIX, cfg.d_vocab, seed=seed)
        claims = [hc.make_claim(kind, layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)
                  for kind in KINDS]
        frames.append(run_test_claims(model, claims, prompts, alpha=ALPHA, seed=seed).assign(init_seed=seed))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.heavy
def test_preset_claims_on_random_init_are_rarely_supported(preset_verdicts, record_property):
    n = len(preset_verdicts)
    rate = float((preset_verdicts["verdict"] == "supported").mean())
    counts = preset_verdicts["verdict"].value_counts().to_dict()
    print(f"\ncalibration (preset claims, all default evidence): {n} claims over {len(SEEDS)} random inits, "
          f"supported rate {rate:.4f} (alpha {ALPHA}); verdicts {counts}")
    record_property("supported_rate_presets", rate)
    assert n == len(SEEDS) * 8 * len(KINDS)
    assert rate <= ALPHA + slack(n)


def test_random_init_claims_fail_where_they_should(preset_verdicts):
    """Not just 'not supported': on random weights the observational evidence itself fails."""
    assert not (preset_verdicts["observational_passed"] == True).any()  # noqa: E712
    assert (preset_verdicts["verdict"] != "supported").all()


def boundary_claims(model: HookedGPT, seed: int) -> list:
    """Every (head, kind) claim with its threshold at the head's true mean metric (256 fresh prompts)."""
    cfg = model.cfg
    big = repeated_tokens(256, PREFIX, cfg.d_vocab, seed=10_000 + seed)
    ctx = Context(model, big)
    claims = []
    for kind in KINDS:
        params = {"offset": -1} if kind == "positional" else {}
        metric = hc.make_claim(kind, 0, 0, **params).params["metric"]
        truth = hc.head_metric(ctx, metric).double().mean(0)  # (layer, head)
        for layer in range(cfg.n_layers):
            for head in range(cfg.n_heads):
                claims.append(hc.make_claim(kind, layer, head, threshold=float(truth[layer, head]), **params))
    return claims


@pytest.mark.heavy
def test_boundary_thresholds_false_positive_rate(record_property):
    passes, supported, n = 0, 0, 0
    for seed in SEEDS:
        model = random_model(seed)
        prompts = repeated_tokens(N_PROMPTS, PREFIX, model.cfg.d_vocab, seed=seed)
        verdicts = evaluate_claims(model, boundary_claims(model, seed), prompts, alpha=ALPHA, seed=seed,
                                   evidence=["observational"])
        passes += sum(v.get("observational").passed is True for v in verdicts)
        supported += sum(v.verdict == "supported" for v in verdicts)
        n += len(verdicts)
    pass_rate, supported_rate = passes / n, supported / n
    print(f"\ncalibration (threshold = true mean, observational only): {n} claims, CI-above-threshold rate "
          f"{pass_rate:.4f} (nominal one-sided 0.025), supported rate after BH {supported_rate:.4f} (alpha {ALPHA})")
    record_property("boundary_pass_rate", pass_rate)
    record_property("boundary_supported_rate", supported_rate)
    assert n == len(SEEDS) * 8 * len(KINDS)
    assert pass_rate <= ALPHA + slack(n)
    assert supported_rate <= ALPHA + slack(n)
