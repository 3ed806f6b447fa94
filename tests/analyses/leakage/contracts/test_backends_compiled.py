"""The back-end contract with compiled FlexAttention (`audit(..., compiled=True)`, `--compiled`): the FlexAttention zoo
(tests/leakzoo/backends.py) with its `flex_attention` compiled, as production code calls it, where `torch.compile` works
on this CPU (skipped with the reason where it does not). Slow: the first compile in a process takes ~15 s.

On CPU the compiled kernel refuses float64, so the comparisons run in float32 (said in the notes), and the op trace that
locates a leak cannot enter it, so the origin is searched again with FlexAttention unfused (said in the notes too).
"""
from __future__ import annotations

import pytest
import torch

from interp.analyses.leakage.contracts import run_contracts
from interp.analyses.leakage.contracts.backends import audit_backends

pytestmark = pytest.mark.slow
IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")


@pytest.fixture(scope="module")
def compiled_flex():
    """`torch.compile(flex_attention)`, once it has run here; a skip naming why where it cannot."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    q = torch.randn(1, 2, 16, 8)
    try:
        compiled(q, q, q, block_mask=create_block_mask(lambda b, h, i, j: i >= j, None, None, 16, 16, device="cpu"))
    except Exception as error:  # no C compiler, an inductor without CPU support...
        first = (str(error).strip().splitlines() or [""])[0][:200]
        pytest.skip(f"torch.compile(flex_attention) cannot run on this machine: {type(error).__name__}: {first}")
    return compiled


@pytest.fixture
def zoo(compiled_flex, monkeypatch):
    from leakzoo import backends  # tests/ is on sys.path (tests/conftest.py)

    torch._dynamo.reset()  # each test compiles afresh: past dynamo's recompile limit it would run unfused, silently
    monkeypatch.setattr(backends, "flex_attention", compiled_flex)
    return backends


def test_a_correct_model_agrees_compiled_in_float32(zoo):
    result = audit_backends(zoo.hf_switchable(), vocab=64, attn_impls=IMPLEMENTATIONS, compiled=True)
    assert result.status == "noise" and result.dtype == "float32" and not result.found
    assert result.runs["flex_attention vs eager"] < 1e-5
    assert any(n.startswith("float64 refused") and "FlexAttention" in n for n in result.notes)


def test_a_cropped_block_mask_leaks_compiled_too_and_is_located(zoo):
    from leakzoo import marked_line

    result = audit_backends(zoo.flex_cropped_block_mask(), vocab=64, attn_impls=IMPLEMENTATIONS, compiled=True)
    assert result.status == "leak" and set(result.found) == {"backend", "future"}
    assert {run for run, value in result.runs.items() if value > result.threshold} == {
        "flex_attention", "flex_attention vs eager"}
    assert any(n.startswith("origin located with FlexAttention unfused") for n in result.notes)
    lines = {marked_line(zoo.__file__, "BUG", "flex_cropped_block_mask"), marked_line(zoo.__file__, "SITE", "switch-flex")}
    assert result.origin is not None and min(abs(result.origin.to_dict()["line"] - line) for line in lines) <= 2


def test_block_sparsity_is_honoured_by_the_compiled_kernel(zoo):
    """block_sparse_window keeps its window only through the block mask's kv_indices, which the unfused path ignores
    (the default audit finds `backend` there); the compiled kernel reads them, so compiled the model agrees."""
    result = audit_backends(zoo.block_sparse_window(), vocab=64, attn_impls=IMPLEMENTATIONS, compiled=True)
    assert result.status == "noise" and not result.found


def test_run_contracts_passes_compiled_on(zoo):
    results = run_contracts(zoo.flex_cropped_block_mask(), vocab=64, attn_impls=("eager", "flex_attention"),
                            compiled=True)
    assert results["backend"].leaks and results["backend"].dtype == "float32"
