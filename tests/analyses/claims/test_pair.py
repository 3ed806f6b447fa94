"""Pair claims' power (`interp.analyses.claims.pair`): a head whose write is the same on every prompt is not changed by
mean ablation (the mean of a constant is the constant), so "dispensable" and "redundant" measured by mean ablation
are undecided there, never supported nor refuted; zero ablation, which does change it, still decides."""
import pytest

from interp.analyses.claims.pair import dispensable_claim, redundant_claim
from interp.claims import test_claims as run_test_claims
from interp.data import repeated_tokens
from interp.models import handbuilt


@pytest.fixture(scope="module")
def verdicts():
    model = handbuilt.positional_sender()
    prompts = repeated_tokens(32, 2, 63, bos=63, n_repeats=10)
    claims = [dispensable_claim("L0H0"), dispensable_claim("L0H1"), redundant_claim("L0H0", "L1H0"),
              dispensable_claim("L0H0", method="zero")]
    return run_test_claims(model, claims, prompts).attrs["verdicts"]


def test_mean_ablation_of_a_constant_write_decides_nothing(verdicts):
    l0h0, l0h1, pair, zeroed = verdicts
    obs = l0h0.get("observational")
    assert obs.effect == 0.0 and obs.write_change == 0.0 and obs.passed is None  # "cheap" would have passed
    assert l0h0.verdict == "inconclusive"
    assert "the mean ablation does not change L0H0's write" in l0h0.reasons[0]
    assert l0h1.verdict == "supported" and l0h1.get("observational").write_change > 0.5  # a filler: truly dispensable
    assert pair.verdict == "inconclusive" and all(e.write_change == 0.0 for e in pair.evidence)
    assert zeroed.verdict == "refuted" and zeroed.get("observational").effect > 1.5  # zeroing L0H0 costs ~2 nats
