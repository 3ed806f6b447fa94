"""The leakage audit's incremental reference (KV cache) and cost estimate; fast refusal of bad names."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp.analyses import leakage
from interp.analyses.leakage import fast as leakage_fast
from interp.analyses.leakage.methods import _prompts
from interp.specnames import check_spec, could_load
from interp.models import GPTConfig, HookedGPT
from interp.models.kv_cache import incremental_outputs, supports_incremental
from interp.models.zoo import build

ROOT = Path(__file__).resolve().parents[3]


def _gpt(**overrides) -> HookedGPT:
    cfg = dict(n_layers=2, n_heads=2, d_model=16, d_vocab=23, n_ctx=96, seed=2, init_range=0.3)
    return HookedGPT(GPTConfig(**{**cfg, **overrides})).eval()


@pytest.mark.parametrize("overrides", [{}, {"positional_embedding_type": "rotary"}, {"attn_only": True},
                                       {"normalization_type": None}, {"n_heads": 4, "n_key_value_heads": 2}])
def test_incremental_path_equals_full_forward(overrides):
    model = _gpt(**overrides)
    tokens = torch.randint(0, 23, (3, 40), generator=torch.Generator().manual_seed(0))
    steps = torch.stack(list(incremental_outputs(model, tokens)), dim=1)  # (batch, pos, vocab)
    torch.testing.assert_close(steps, model(tokens), atol=1e-5, rtol=1e-5)


def test_incremental_path_claimed_only_for_plain_hooked_gpt():
    assert supports_incremental(_gpt())
    assert not supports_incremental(_gpt(window_size=8))  # a sliding window is not reproduced
    assert not supports_incremental(build("masked_fill"))  # a zoo model of its own make

    class Variant(HookedGPT):
        pass

    assert not supports_incremental(Variant(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=10, n_ctx=8)))
    with pytest.raises(TypeError, match="no incremental path"):
        next(incremental_outputs(build("masked_fill"), torch.zeros(1, 3, dtype=torch.long)))


def test_long_audit_of_a_correct_model_is_causal_and_uses_the_reference():
    report = leakage.audit(_gpt(), max_len=96)
    assert report.causal
    truncation = report.table[report.table["method"] == "truncation"]
    assert truncation["detail"].str.startswith(leakage_fast.INCREMENTAL_DETAIL).any()
    assert int(truncation["length"].max()) == 96


def test_long_audit_finds_an_unmasked_layer():
    model = _gpt()
    model.blocks[1].attn.causal = False  # planted: the fused kernel runs without its causal mask
    report = leakage.audit(model, max_len=96)
    assert report.verdict == "leak" and report.first_leaking_site is not None
    incremental = report.table[report.table["detail"].str.startswith(leakage_fast.INCREMENTAL_DETAIL)]
    assert (incremental["influence"] > report.tol).any()


def test_reference_finds_one_leaking_pair_past_the_short_length_only_with_a_mask():
    """A single (query 80 <- key 90) hole in the mask, used only when an attention_mask is passed:
    beyond the black-box truncation's 64 tokens, the reference finds it at query 80."""
    model = _gpt()
    attn = model.blocks[0].attn
    original = attn.mask

    def holed(n_pos, key_mask, device=None):  # the mask used when a key mask is passed, with one hole
        allowed = original(n_pos, key_mask, device=device)
        if n_pos > 90:
            allowed = allowed.clone()
            allowed[..., 80, 90] = True
        return allowed

    attn.mask = holed
    tokens = _prompts(2, 96, 23, 0)
    plain = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model), tokens, leakage.DEFAULT_TOL)
    masked = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model).with_ones_mask(), tokens, leakage.DEFAULT_TOL)
    assert max(row["influence"] for row in plain) <= leakage.DEFAULT_TOL
    leaking = sorted(row["query_pos"] for row in masked if row["influence"] > leakage.DEFAULT_TOL)
    assert leaking[0] == 80  # later queries read position 80's residual in layer 1: they leak too


def test_token_counts_known_answer():
    counts = leakage_fast.count_tokens(10, (5,), 2, leakage.METHODS, draws=2, max_cuts=None, gradient_len=4,
                                       incremental=False, with_mask=False)
    assert counts == {"truncation": 2 * 55, "perturbation": 2 * 5 * (4 * 2 + 1), "gradient": 3 * 4 * 3}
    fast = leakage_fast.count_tokens(1024, (1024,), 2, ("truncation",), draws=2, max_cuts=16, gradient_len=24,
                                     incremental=True, with_mask=False)
    assert fast["truncation"] == 2 * (64 * 65 // 2 + 3 * 1024) < 2 * 1024 * 1025 // 2 / 50


def test_estimate_prints_an_eta(capsys):
    model = _gpt()
    cost = leakage_fast.announce(model, leakage.ModelAdapter(model), max_len=96, vocab=23, lengths=(5, 49, 96),
                                 n_prompts=2, methods=leakage.METHODS, draws=2, max_cuts=16, gradient_len=24)
    assert cost.incremental and cost.total_tokens > 0 and cost.seconds > 0
    assert "ETA about" in " ".join(capsys.readouterr().err.split())  # the line wraps at the terminal width


def test_perturbation_cuts_are_a_spot_check_only_where_the_reference_runs():
    assert leakage_fast.perturbation_cuts(_gpt(), 96, 16) == leakage_fast.LONG_MAX_CUTS
    assert leakage_fast.perturbation_cuts(_gpt(), 49, 16) == 16
    assert leakage_fast.perturbation_cuts(build("masked_fill"), 96, 16) == 16


def test_spec_names_checked_without_heavy_imports(tmp_path):
    assert could_load("toy-induction") and could_load("pkg.mod:factory") and could_load(str(tmp_path))
    (tmp_path / "ckpt.safetensors").write_bytes(b"")
    assert could_load(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"'toy-inductoin'.*Did you mean \['toy-induction'\]"):
        check_spec("toy-inductoin")
    code = ("import sys; from interp.cli import main; rc = main(['heads', 'toy-inductoin']); "
            "print(rc, 'torch' in sys.modules, 'transformer_lens' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "False", "False"], out.stderr
    assert "Did you mean ['toy-induction']" in out.stderr
