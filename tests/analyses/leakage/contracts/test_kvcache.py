"""Known answers for the KV-cache contract's pieces: the call plans, the styles, the decode-vs-full comparison."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from interp.analyses.leakage.contracts.kvcache import Cached, _sliced_change, plan_calls
from interp.errors import BadInput


class Step(nn.Module):
    def forward(self, idx):
        return idx

    def step(self, idx, cache=None):
        return idx, cache


class HF(nn.Module):
    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        return input_ids


class NoCache(nn.Module):
    def forward(self, idx):
        return idx


def test_plans_prefill_then_chunks_to_the_end():
    assert plan_calls(7, 2, 3) == [(0, 2), (2, 5), (5, 7)]
    assert plan_calls(4, 1, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_styles_and_a_model_without_a_cache():
    assert Cached(Step()).style == "step"
    assert Cached(HF()).style == "past_key_values"
    with pytest.raises(BadInput, match="no KV cache"):
        Cached(NoCache())


def test_a_decode_output_is_compared_with_the_full_forward_at_its_positions():
    full = torch.arange(24.0).reshape(1, 6, 4)  # (batch, pos, feature)
    assert _sliced_change(full[:, 4:6], full, 4, 6, 6) == 0.0
    moved = full[:, 4:6].clone()
    moved[0, 1, 0] += 2.0
    assert _sliced_change(moved, full, 4, 6, 6) > 0
    assert _sliced_change(torch.zeros(1, 2, 5), full, 4, 6, 6) is None  # shapes that do not pair
