"""The noise floor measured on the model itself (`interp.analyses.leakage.floor`): each run's deviation from a float64
copy at the same shape, summed over the two runs compared; never taken from the comparison itself; the threshold
max(tol, NOISE_FACTOR x floor); the float64 copy decides where the float32 floor would hide a leak of 1e-4; a model
that cannot be cast gets the batch-composition floor, said to be weaker."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from interp.analyses import leakage
from interp.analyses.leakage.floor import FLOAT64_SCALE, Floors, comparison_floor, decides, float64_copy


def test_comparison_floor_sums_both_runs_deviations_position_by_position():
    reference_a, reference_b = torch.zeros(2, 5, 3, dtype=torch.float64), torch.zeros(3, 4, 3, dtype=torch.float64)
    run_a, run_b = reference_a.float().clone(), reference_b.float().clone()
    run_a[1, 2, 0], run_b[0, 2, 1], run_b[2, 3, 2] = 1e-3, 2e-3, 4e-3  # position 4 of a is not compared
    run_a[0, 4, 0] = 1.0
    assert comparison_floor(run_a, reference_a, run_b, reference_b, scale=2.0) == pytest.approx((4e-3 + 0) / 2.0)
    run_b[2, 3, 2] = 0.0
    assert comparison_floor(run_a, reference_a, run_b, reference_b, scale=2.0) == pytest.approx(3e-3 / 2.0)


def test_threshold_is_tol_at_least_and_float64_decides_above_1e_4():
    floors = Floors(tol=5e-5, how="float64", reference=object())  # a reference: float64 can decide
    floors.add("truncation", "2x8 | 2x16", 3e-5)
    floors.add("batch", "1x16 | 2x16", 1e-4)
    assert floors.threshold("truncation") == pytest.approx(leakage.NOISE_FACTOR * 3e-5)
    assert not floors.float64_decides("truncation") and floors.float64_decides("batch")
    assert floors.threshold("batch") == pytest.approx(max(5e-5, leakage.NOISE_FACTOR * 1e-4 * FLOAT64_SCALE)) == 5e-5
    assert decides(1e-4 / leakage.NOISE_FACTOR * 1.01) and not decides(1e-4 / leakage.NOISE_FACTOR * 0.99)
    assert Floors(tol=1e-3, how="float64").threshold("truncation") == 1e-3  # nothing measured: the lower bound


class _RoundsByShape(nn.Module):
    """A causal model whose float32 outputs move with the batch's shape by 1e-3 of their spread (as deep float32 models
    round differently at other lengths and batch sizes), exactly in float64; with `leak`, position 0 also reads the
    last token by `leak` of the spread."""

    def __init__(self, leak: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(30, 8)
        self.leak = leak
        self.cfg = type("Cfg", (), {"n_ctx": 16})()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.emb(tokens).cumsum(dim=1)  # (batch, pos, width): each position reads only the past
        if out.dtype == torch.float32:  # "rounding" that depends on the shape, absent from the float64 copy
            out = out + 1e-3 * ((tokens.shape[0] * 7 + tokens.shape[1]) % 5)
        if self.leak:
            out = out.clone()
            out[:, 0] = out[:, 0] + self.leak * self.emb(tokens[:, -1])
        return out


def test_a_model_whose_rounding_would_hide_1e_4_is_decided_in_float64():
    report = leakage.audit(_RoundsByShape(), max_len=16, methods=("truncation", "perturbation", "batch"))
    assert report.causal and set(report.float64_checked) == {"truncation", "perturbation", "batch"}
    assert max(report.noise_floor["truncation"].values()) > 1e-4 and report.floor_how == "float64"
    assert any("float64 copy decided" in note for note in report.notes)
    leaking = leakage.audit(_RoundsByShape(leak=3e-4), max_len=16, methods=("truncation", "perturbation", "batch"))
    assert leaking.leaks == ("future",)  # 3e-4 under rounding of 1e-3: found in float64


def test_a_leak_does_not_inflate_its_own_floor():
    report = leakage.audit(_RoundsByShape(leak=0.5), max_len=16, methods=("truncation", "perturbation"))
    assert report.leaks == ("future",)
    assert max(floor for pairs in report.noise_floor.values() for floor in pairs.values()) < 0.05  # the rounding only


def test_a_model_that_cannot_be_cast_gets_the_weaker_batch_composition_floor():
    model = _RoundsByShape()
    report = leakage.audit(lambda tokens: model(tokens), max_len=16, vocab_size=30, methods=("truncation", "perturbation"))
    assert report.floor_how == "batch composition" and not report.float64_checked
    assert any("weaker guarantee" in note for note in report.notes)


def test_the_float64_copy_leaves_the_model_alone_and_holds_no_float32_twin():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
    copy = float64_copy(model)
    assert all(p.dtype == torch.float64 for p in copy.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert float64_copy(lambda tokens: tokens) is None
    with torch.no_grad():
        assert not math.isnan(float(copy(torch.zeros(1, 3, dtype=torch.long)).sum()))
