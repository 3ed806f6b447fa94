"""The leakage audit's incremental reference (KV cache) over every block the native converter builds, the coverage
of black boxes beyond 64 tokens, the cost estimate; fast refusal of bad names."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp.analyses import leakage
from interp.analyses.leakage import fast as leakage_fast
from interp.analyses.leakage.floor import float64_copy
from interp.analyses.leakage.methods import _prompts
from interp.models import GPTConfig, HookedGPT
from interp.models.kv_cache import incremental_outputs, supports_incremental
from interp.models.zoo import build
from interp.specnames import check_spec, could_load

ROOT = Path(__file__).resolve().parents[3]

# every block layout the native converter builds (interp.models.convert): GPT-2, GPT-NeoX, Llama / Gemma, Mistral /
# Phi-3 (windows), Qwen2, Llama 3 scaled rotary, BERT-style post-norm (an encoder there; here its block in a decoder)
BLOCKS = {
    "gpt2": {},
    "neox": dict(parallel_attn_mlp=True, positional_embedding_type="rotary", rotary_dim=4),
    "llama": dict(normalization_type="RMS", gated_mlp=True, act_fn="silu", positional_embedding_type="rotary",
                  n_heads=4, n_key_value_heads=2),
    "mistral": dict(normalization_type="RMS", gated_mlp=True, act_fn="silu", positional_embedding_type="rotary",
                    window_size=5),
    "llama3": dict(normalization_type="RMS", gated_mlp=True, positional_embedding_type="rotary", use_NTK_by_parts_rope=True,
                   NTK_original_ctx_len=16),
    "post_norm": dict(post_norm=True),
    "attn_only": dict(attn_only=True, normalization_type=None),
}


def _gpt(**overrides) -> HookedGPT:
    cfg = dict(n_layers=2, n_heads=2, d_model=16, d_vocab=23, n_ctx=96, seed=2, init_range=0.3)
    return HookedGPT(GPTConfig(**{**cfg, **overrides})).eval()


@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_incremental_path_equals_full_forward(block, chunk):
    model = _gpt(**BLOCKS[block])
    assert supports_incremental(model)
    tokens = torch.randint(0, 23, (3, 40), generator=torch.Generator().manual_seed(0))
    steps = torch.cat(list(incremental_outputs(model, tokens, chunk=chunk)), dim=1)  # (batch, pos, vocab)
    with torch.no_grad():
        torch.testing.assert_close(steps, model(tokens), atol=2e-5, rtol=1e-5)
        hidden = torch.cat(list(incremental_outputs(model, tokens, output="hidden", chunk=chunk)), dim=1)
        torch.testing.assert_close(hidden, model.ln_final(model(tokens, stop_at_layer=model.cfg.n_layers)), atol=2e-5, rtol=1e-5)


def test_incremental_path_is_exact_in_float64():
    model = float64_copy(_gpt(**BLOCKS["llama"]))
    tokens = torch.randint(0, 23, (2, 40), generator=torch.Generator().manual_seed(0))
    steps = torch.cat(list(incremental_outputs(model, tokens, chunk=16)), dim=1)
    assert steps.dtype == torch.float64
    with torch.no_grad():
        assert float((steps - model(tokens)).abs().max()) < 1e-12


def test_incremental_path_claimed_only_where_it_is_position_wise():
    assert supports_incremental(_gpt(window_size=8))  # windows are reproduced now
    assert not supports_incremental(build("masked_fill"))  # a zoo model of its own make

    class Variant(HookedGPT):
        pass

    assert not supports_incremental(Variant(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=10, n_ctx=8)))
    patched = _gpt()
    patched.blocks[0].mlp.forward = lambda x: x.mean(dim=1, keepdim=True).expand_as(x)  # mixes positions
    assert not supports_incremental(patched)
    hooked = _gpt()
    handle = hooked.blocks[1].register_forward_hook(lambda *a: None)
    assert not supports_incremental(hooked)
    handle.remove()
    assert supports_incremental(hooked)
    with pytest.raises(TypeError, match="no incremental path"):
        next(incremental_outputs(build("masked_fill"), torch.zeros(1, 3, dtype=torch.long)))
    with pytest.raises(ValueError, match="chunk=0"):
        next(incremental_outputs(_gpt(), torch.zeros(1, 3, dtype=torch.long), chunk=0))


def test_long_audit_of_a_correct_model_is_causal_and_uses_the_reference():
    report = leakage.audit(_gpt(**BLOCKS["llama"]), max_len=96)
    assert report.causal
    truncation = report.table[report.table["method"] == "truncation"]
    assert truncation["detail"].str.startswith(leakage_fast.INCREMENTAL_DETAIL).any()
    assert int(truncation["length"].max()) == 96
    coverage = report.coverage["truncation"]
    assert coverage["complete"] and coverage["incremental_reference"] and coverage["every_prefix_up_to"] == 64
    assert any(key.startswith("reference 2x96") for key in report.noise_floor["truncation"])
    assert report.coverage["gradient"]["cuts"]["96"]  # the gradient ran at the audited length too
    assert (report.table[report.table["method"] == "gradient"]["length"] == 96).any()


@pytest.mark.parametrize("block", ["gpt2", "llama", "neox", "mistral"])
def test_long_audit_finds_an_unmasked_layer(block):
    model = _gpt(**BLOCKS[block])
    model.blocks[1].attn.causal = False  # planted: the fused kernel runs without its causal mask
    report = leakage.audit(model, max_len=96)
    assert report.verdict == "leak" and report.first_leaking_site is not None
    incremental = report.table[report.table["detail"].str.startswith(leakage_fast.INCREMENTAL_DETAIL)]
    assert leakage.above_threshold(incremental).any()


def test_a_broken_window_is_a_leak_the_reference_sees():
    """A window that also lets each query read the next key, only where the window applies (beyond 8 tokens)."""
    model = _gpt(window_size=8, positional_embedding_type="rotary")
    attn = model.blocks[0].attn
    original = attn.mask

    def holed(n_pos, key_mask, device=None):
        allowed = original(n_pos, key_mask, device=device)
        if n_pos > 8:
            allowed = allowed | torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).triu(1).tril(1)
        return allowed

    attn.mask = holed  # the mask is what the full forward uses; the reference builds its own
    rows, _ = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model), _prompts(2, 96, 23, 0), leakage.DEFAULT_TOL)
    assert sorted(row["query_pos"] for row in rows if row["influence"] > leakage.DEFAULT_TOL)[0] == 0
    attn.mask = original
    rows, _ = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model), _prompts(2, 96, 23, 0), leakage.DEFAULT_TOL)
    assert max(row["influence"] for row in rows) <= leakage.DEFAULT_TOL  # the window itself agrees with the reference


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
    plain, reference = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model), tokens, leakage.DEFAULT_TOL)
    masked, again = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model).with_ones_mask(), tokens,
                                                  leakage.DEFAULT_TOL, reference=reference)
    assert again is reference  # one reference pass serves both mask variants
    assert max(row["influence"] for row in plain) <= leakage.DEFAULT_TOL
    leaking = sorted(row["query_pos"] for row in masked if row["influence"] > leakage.DEFAULT_TOL)
    assert leaking[0] == 80  # later queries read position 80's residual in layer 1: they leak too


def test_the_reference_is_judged_against_its_own_floor_and_float64_where_needed():
    model = _gpt(**BLOCKS["llama"])
    copy = float64_copy(model)
    tokens = _prompts(2, 96, 23, 0)
    rows, reference = leakage_fast.incremental_rows(model, leakage.ModelAdapter(model), tokens, leakage.DEFAULT_TOL,
                                                    model64=copy, adapter64=leakage.ModelAdapter(copy))
    floor = reference.floors[False]
    assert 0 < floor < 1e-4 and reference.outputs64 is not None and reference.outputs64.dtype == torch.float64
    assert {row["threshold"] for row in rows} == {max(leakage.DEFAULT_TOL, leakage.NOISE_FACTOR * floor)}


def test_coverage_cuts_known_answer():
    cuts = leakage_fast.coverage_cuts(300, {"window_size": 100}, seed=0, random_cuts=3)
    assert cuts[:64] == list(range(1, 65))  # every prefix up to SHORT_LEN
    assert {128, 256} <= set(cuts) and {99, 100, 101} <= set(cuts)  # powers of two, either side of the window
    beyond = set(cuts) - set(range(1, 65)) - {128, 256, 99, 100, 101}
    assert len(beyond) == 3 and all(64 < n < 300 for n in beyond)  # three seeded random cuts
    assert cuts == leakage_fast.coverage_cuts(300, {"window_size": 100}, seed=0, random_cuts=3)  # reproducible
    assert cuts != leakage_fast.coverage_cuts(300, {"window_size": 100}, seed=1, random_cuts=3)
    assert leakage_fast.coverage_cuts(16, {}, seed=0) == list(range(1, 16))  # short: every prefix


def test_declared_boundaries_are_read_from_the_config():
    assert leakage_fast.declared_boundaries(_gpt(window_size=8)) == {"window_size": 8}
    assert leakage_fast.declared_boundaries(_gpt()) == {}


def test_a_black_box_beyond_64_tokens_is_audited_at_its_coverage_cuts():
    model = _gpt()
    report = leakage.audit(lambda tokens: model(tokens), max_len=96, vocab_size=23, methods=("truncation",))
    coverage = report.coverage["truncation"]
    assert not coverage["complete"] and not coverage["incremental_reference"]
    assert 64 in coverage["prefix_lengths"] and len(coverage["prefix_lengths"]) < 95
    measured = report.table[report.table["method"] == "truncation"]
    assert report.causal and set(measured["source_pos"].dropna().astype(int)) <= set(coverage["prefix_lengths"])


def test_token_counts_known_answer():
    counts = leakage_fast.count_tokens(10, (5,), 2, leakage.METHODS, draws=2, max_cuts=None, gradient_len=4,
                                       incremental=False, with_mask=False)
    floor_runs = 2 * (10 + 5 + 9) + 2 * 5 + 3 * 10 + 3 * 2 * 10  # full, prefixes 5 and 9; base 5; batch; padding
    assert counts == {"floor": int(floor_runs * leakage_fast.FLOAT64_COST), "truncation": 2 * 45,
                      "perturbation": 2 * 5 * (4 * 2 + 1), "gradient": 3 * 4 * 3, "batch": 4 * 2 * 10, "padding": 5 * 2 * 10}
    fast = leakage_fast.count_tokens(1024, (1024,), 2, ("truncation",), draws=2, max_cuts=16, gradient_len=24,
                                     incremental=True, with_mask=False, castable=False)
    assert fast["truncation"] == 2 * (64 * 65 // 2 + 1024) < 2 * 1024 * 1025 // 2 / 50


def test_estimate_prints_an_eta(capsys):
    model = _gpt()
    cost = leakage_fast.announce(model, leakage.ModelAdapter(model), max_len=96, vocab=23, lengths=(5, 49, 96),
                                 n_prompts=2, methods=leakage.METHODS, draws=2, max_cuts=16, gradient_len=24)
    assert cost.incremental and cost.total_tokens > 0 and cost.seconds > 0
    assert "ETA about" in " ".join(capsys.readouterr().err.split())  # the line wraps at the terminal width


def test_perturbation_cuts_are_a_spot_check_only_where_the_reference_runs():
    assert leakage_fast.perturbation_cuts(True, 96, 16) == leakage_fast.LONG_MAX_CUTS
    assert leakage_fast.perturbation_cuts(True, 49, 16) == 16
    assert leakage_fast.perturbation_cuts(False, 96, 16) == 16
    assert leakage_fast.perturbation_draws(True, 96, 2) == leakage_fast.LONG_DRAWS
    assert leakage_fast.perturbation_draws(False, 96, 2) == 2


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


def test_max_len_defaults_to_the_context_up_to_256_and_ctx_is_the_whole_context():
    from interp.analyses.leakage.plan import plan_audit
    from interp.analyses.report.pipeline import LEAKAGE_LEN, report_max_len
    from interp.cli import parser

    model = _gpt(n_ctx=400)
    adapter = leakage.ModelAdapter(model)
    assert plan_audit(model, adapter, methods=("truncation",)).max_len == leakage.DEFAULT_MAX_LEN == 256
    assert plan_audit(model, adapter, max_len="ctx", methods=("truncation",)).max_len == 400
    assert plan_audit(_gpt(n_ctx=40), leakage.ModelAdapter(_gpt(n_ctx=40)), methods=("truncation",)).max_len == 40
    assert parser.DEFAULT_MAX_LEN == leakage.DEFAULT_MAX_LEN == LEAKAGE_LEN  # the CLI's help says the same
    assert report_max_len(model, LEAKAGE_LEN) == 256 and report_max_len(model, "ctx") == 400
    args = parser.build_parser().parse_args(["audit-leakage", "toy-induction", "--max-len", "ctx"])
    assert args.max_len == "ctx"
    with pytest.raises(SystemExit):
        parser.build_parser().parse_args(["audit-leakage", "toy-induction", "--max-len", "all"])
    with pytest.raises(ValueError, match="'ctx'"):
        plan_audit(model, adapter, max_len="whole", methods=("truncation",))
