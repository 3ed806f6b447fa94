"""Half precision: the hook self-test and the leakage audit use tolerances stated per dtype."""
from __future__ import annotations

import pytest
import torch

from interp.analyses import leakage
from interp.models import GPTConfig, HookedGPT
from interp.models.zoo import build
from interp.verify import TOLERANCES, verify_hooks


def _gpt(dtype: torch.dtype) -> HookedGPT:
    return HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, seed=0)).eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_verify_hooks_passes_in_every_supported_dtype(dtype):
    frame = verify_hooks(_gpt(dtype))
    assert frame.passed.all(), frame[~frame.passed]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tolerance_still_catches_a_wrong_pattern(dtype):
    model = _gpt(dtype)
    model.blocks[0].attn.hook_pattern.add_hook(lambda pattern, hook: pattern * 1.1)
    try:
        frame = verify_hooks(model).set_index(["layer", "check"])
    finally:
        model.reset_hooks()
    assert not frame.loc[(0, "rows_sum_to_one"), "passed"]
    assert TOLERANCES[dtype][1] < 0.1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_leakage_audit_in_half_precision(dtype):
    assert leakage.audit(build("hooked_gpt").to(dtype), max_len=16).causal
    report = leakage.audit(build("hooked_gpt_unmasked_layer").to(dtype), max_len=16)
    assert report.verdict == "leak" and report.tol == leakage.HALF_PRECISION_TOL
