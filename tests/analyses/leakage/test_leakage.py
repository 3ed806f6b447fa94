"""The leakage audit finds every planted leak where it enters, and passes every correct model."""
import json
import math
import warnings

import pytest
import torch
from torch import nn

from interp.analyses.leakage import (
    METHODS,
    SPREAD_FLOOR,
    LeakageReport,
    ModelAdapter,
    audit,
    batch_mixing,
    declared_bidirectional,
    embedding_module,
    gradient,
    infer_n_ctx,
    infer_vocab_size,
    localise,
    padding_check,
    perturbation,
    site_modules,
    truncation,
)
from interp.analyses.leakage.methods import _scale
from interp.errors import ModelError
from interp.models import GPTConfig, HookedGPT
from interp.models.zoo import SINGLE_PAIR, ZOO, build
from interp.testing import assert_causal

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_truth_is_recovered(name, seed):
    entry = ZOO[name]
    report = audit(build(name, seed), seed=seed)
    if entry.bidirectional:
        assert report.verdict == "bidirectional" and not report.causal
    else:
        assert report.causal == entry.causal, str(report)
    if entry.causal:
        assert report.leaks == () and report.exit_code == 0 and report.first_leaking_site is None
        if not entry.bidirectional:
            assert report.verdict in ("exact_zero", "numerical_noise")
            assert report.max_influence <= report.tol
    else:
        assert entry.leak in report.leaks and report.exit_code == 1, str(report)
        assert report.first_leaking_sites[entry.leak] == entry.first_leaking_site, str(report.sites)
        assert report.first_leaking_site == entry.first_leaking_site
    if entry.leak == "batch":  # mixing must never pose as a future leak
        assert "future" not in report.leaks


@pytest.mark.parametrize("method", ["truncation", "perturbation", "gradient"])
@pytest.mark.parametrize("name", ["single_pair", "tiny_leak"])
def test_each_future_method_alone_finds_the_hard_leaks_every_time(name, method):
    for seed in range(4):
        report = audit(build(name, 0), seed=seed, methods=(method,), draws=1, n_prompts=1, localise_leaks=False)
        assert report.leaks == ("future",), f"seed {seed}: {report}"


@pytest.mark.parametrize("method", ["truncation", "perturbation", "gradient"])
def test_each_future_method_alone_finds_the_mask_fast_path(method):
    report = audit(build("mask_fast_path", 0), methods=(method,), draws=1, n_prompts=1, localise_leaks=False)
    assert report.leaks == ("future",), str(report)
    leaking = report.table[report.table["influence"] > report.tol]
    assert leaking["ones_mask"].all() and report.ones_mask_only  # seen only with a mask of ones


def test_mask_only_leak_is_a_future_leak_located_with_the_mask():
    report = audit(build("masked_pooling", 0))
    assert "future" in report.leaks and report.first_leaking_sites["future"] == "blocks.0.mixer"
    assert any("all-ones attention_mask" in note for note in report.notes)
    plain = report.table[report.table["method"].isin(["truncation", "perturbation", "gradient"])
                         & ~report.table["ones_mask"]]
    assert plain["influence"].max() <= report.tol  # without a mask it is causal


def test_a_model_without_a_mask_argument_runs_the_future_methods_once():
    report = audit(lambda tokens: build("masked_fill", 0)(tokens), max_len=8, vocab_size=13)
    assert report.causal and not report.table["ones_mask"].any()


@pytest.mark.parametrize("methods", [("gradient",), ("pattern",), ("padding",), ("batch", "pattern")])
def test_methods_that_cannot_show_a_future_leak_are_refused(methods):
    torch.manual_seed(0)
    table = torch.randn(13, 4)

    def reverse_cumsum(tokens):  # reads the whole future; a black box (no embedding for the gradient)
        return table[tokens].flip(1).cumsum(1).flip(1)

    with pytest.raises(ValueError, match="'truncation' or 'perturbation'"):
        audit(reverse_cumsum, max_len=8, vocab_size=13, methods=methods)
    with pytest.raises(ValueError, match="'truncation' or 'perturbation'"):
        assert_causal(reverse_cumsum, max_len=8, vocab_size=13, methods=methods)


def test_gradient_alone_is_enough_where_there_is_an_embedding():
    assert audit(build("off_by_one", 0), methods=("gradient",)).leaks == ("future",)
    assert audit(build("encoder", 0), methods=("padding",)).verdict == "bidirectional"  # encoders need none


def test_scale_is_the_spread_floored_by_the_rms():
    out = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(0))
    assert _scale(out + 40.0) == pytest.approx(_scale(out), rel=1e-4)  # a common offset does not count
    per_feature = out + torch.arange(5.0) * 3  # per-feature offsets do not count either
    assert _scale(per_feature) == pytest.approx(_scale(out), rel=1e-4)
    assert _scale(out + 1e4) == pytest.approx(SPREAD_FLOOR * 1e4, rel=1e-3)  # spread < 1e-2 of the RMS: floored
    assert _scale(torch.zeros(2, 3, 4)) == 1.0
    assert _scale(torch.full((2, 3, 4), 5.0)) == pytest.approx(SPREAD_FLOOR * 5.0)


def test_a_leak_under_a_large_offset_is_found_at_its_size():
    report = audit(build("offset_small_leak", 0))
    future = report.table[report.table["method"].isin(["truncation", "perturbation"])]
    assert "future" in report.leaks and 5e-4 < future["influence"].max() < 1e-2  # (its future mean reads pads too)
    clean = audit(build("offset_causal", 0))  # rounding of the offset itself stays below tol
    assert clean.causal and clean.max_influence <= clean.tol


def test_single_pair_is_located_exactly_by_the_gradient():
    query, source = SINGLE_PAIR
    report = audit(build("single_pair", 0))
    rows = report.table[(report.table["method"] == "gradient") & (report.table["influence"] > report.tol)]
    assert set(zip(rows["query_pos"], rows["source_pos"])) == {(query, source)}


def test_tiny_leak_is_measured_at_its_size():
    report = audit(build("tiny_leak", 0))
    assert 5e-5 < report.max_influence < 5e-4


def test_rounding_is_noise_not_leak():
    report = audit(build("mask_after_softmax_renorm", 0))
    perturbed = report.table[report.table["method"] == "perturbation"]["influence"]
    assert 0.0 < perturbed.max() < 1e-5  # the future moved the outputs, by rounding only
    assert report.verdict == "numerical_noise" and report.causal


def test_a_leak_below_tol_is_noise_and_above_is_leak():
    model = build("tiny_leak", 0)
    assert audit(model, tol=1e-2).verdict == "numerical_noise"
    assert audit(model, tol=1e-6).verdict == "leak"


def test_hooked_gpt_passes_with_exact_zero_gradient(tiny_gpt):
    report = assert_causal(tiny_gpt, max_len=24)
    assert isinstance(report, LeakageReport) and report.causal and report.exit_code == 0
    by_method = report.table.groupby("method")["influence"].max()
    assert by_method["gradient"] == 0.0 and by_method["perturbation"] == 0.0 and by_method["pattern"] == 0.0
    assert report.lengths == (5, 13, 24)


def test_hooked_encoder_is_bidirectional_with_inert_padding(tiny_encoder):
    report = audit(tiny_encoder, max_len=16)
    assert report.verdict == "bidirectional" and report.exit_code == 0 and report.leaks == ()
    assert "fully masked row" in " ".join(report.table["detail"])
    with pytest.raises(AssertionError, match="bidirectional by design"):
        assert_causal(tiny_encoder, max_len=16)


def test_assert_causal_is_exported_lazily():
    import interp

    assert interp.assert_causal is assert_causal


def test_assert_causal_says_where_and_how_much():
    with pytest.raises(AssertionError) as info:
        assert_causal(build("one_layer_unmasked", 0))
    message = str(info.value)
    assert "blocks.1.mixer" in message and "max influence" in message and "future" in message


def test_planted_hooked_gpt_leak_and_pattern_check():
    report = audit(build("hooked_gpt_unmasked_layer", 0))
    pattern = report.table[report.table["method"] == "pattern"]
    leaking_layers = set(pattern.loc[pattern["influence"] > report.tol, "site"])
    assert leaking_layers == {"blocks.1.attn.hook_pattern"}
    sites = report.sites[report.sites["kind"] == "future"]
    assert list(sites["order"]) == sorted(sites["order"])
    assert not sites.set_index("site").loc["blocks.1.attn.hook_k", "leaks"]


def test_mha_model_through_interp_load_gets_a_pattern_check():
    from interp.loading import load

    report = audit(load(build("mha_causal", 0)))  # nn.MultiheadAttention swapped for a hooked copy
    assert report.causal
    pattern = report.table[report.table["method"] == "pattern"]
    assert not pattern.empty and pattern["influence"].max() == 0.0


def _hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50, n_positions=24, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def _hf_bert():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                        vocab_size=50, max_position_embeddings=24)
    torch.manual_seed(0)
    return BertForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def quiet_transformers():
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


def test_random_gpt2_passes_as_module_and_as_callable(quiet_transformers):
    model = _hf_gpt2()
    report = audit(model)
    assert report.causal and infer_vocab_size(model) == 50 and infer_n_ctx(model) == 24
    assert any("left padding" in note for note in report.notes)  # GPT-2 numbers positions from the row start
    black_box = audit(lambda tokens: model(tokens).logits, max_len=24, vocab_size=50)
    assert black_box.causal
    assert any("black-box" in note for note in black_box.notes)


def test_bert_is_reported_bidirectional(quiet_transformers):
    report = audit(_hf_bert())
    assert report.verdict == "bidirectional" and report.exit_code == 0


def test_transformer_bridge_models(tmp_path, quiet_transformers, monkeypatch):
    from interp.loading import load

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hf_gpt2().save_pretrained(tmp_path / "gpt2")
    _hf_bert().save_pretrained(tmp_path / "bert")
    gpt2 = audit(str(tmp_path / "gpt2"))  # through interp.load -> TransformerBridge
    assert gpt2.causal and (gpt2.table["method"] == "pattern").any()
    bert = load(tmp_path / "bert")
    assert declared_bidirectional(bert)
    assert audit(bert).verdict == "bidirectional"


class _Torch(nn.Module):
    """nn.TransformerEncoder used as a decoder (with or without its causal mask)."""

    def __init__(self, causal: bool):
        super().__init__()
        torch.manual_seed(0)
        self.causal = causal
        self.emb = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(32, 50)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1]) if self.causal else None
        return self.out(self.enc(self.emb(tokens), mask=mask, is_causal=self.causal))


def test_torch_transformer_encoder_with_and_without_causal_mask():
    assert audit(_Torch(causal=True), max_len=20).causal
    leaky = audit(_Torch(causal=False), max_len=20)
    assert leaky.leaks == ("future",) and leaky.first_leaking_site == "enc.layers.0.self_attn"


def test_checkpoint_spec_loads(tmp_path):
    from interp.loading import save

    save(HookedGPT(GPTConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=12, seed=0)), tmp_path / "tiny")
    assert audit(str(tmp_path / "tiny")).causal


# --- the methods on their own ------------------------------------------------------------------

def test_methods_separately_on_known_models():
    prompts = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(0))
    off_model = build("off_by_one", 0)
    good, off = ModelAdapter(build("masked_fill", 0)), ModelAdapter(off_model)
    assert max(r["influence"] for r in truncation(good, prompts, 2e-5)) < 2e-5
    rows = truncation(off, prompts, 2e-5)
    leaking = {(r["query_pos"], r["source_pos"]) for r in rows if r["influence"] > 2e-5}
    assert leaking == {(cut, cut + 1) for cut in range(8)}  # t reads t + 1 and nothing further
    rows, influence = perturbation(off, prompts, 13, 2e-5, draws=1)
    assert influence.shape == (8, 9) and torch.isnan(influence[0, 1:]).all()
    assert (influence.diagonal() > 2e-5).all()
    embed = embedding_module(off_model, 13)
    rows = gradient(off, embed, prompts[0], 2e-5)
    assert {(r["query_pos"], r["source_pos"]) for r in rows if r["influence"] > 2e-5} == {(q, q + 1) for q in range(8)}
    assert max(r["influence"] for r in batch_mixing(good, prompts, 13, 2e-5)) < 2e-5
    pad_rows, notes, worst = padding_check(good, prompts, 13, 2e-5)
    assert max(r["influence"] for r in pad_rows) < 2e-5 and notes == []


def test_localise_orders_sites_and_ignores_non_positional_outputs():
    model = build("centred_conv", 0)
    prompt = torch.randint(0, 13, (9,), generator=torch.Generator().manual_seed(0))
    changed = prompt.clone()
    changed[5:] = (changed[5:] + 1) % 13
    pair = {"tokens_a": prompt[None], "tokens_b": changed[None], "row": 0, "observe": torch.arange(9) <= 4}
    located = localise(ModelAdapter(model), site_modules(model), [pair], 2e-5)
    assert list(located["site"][:2]) == ["embed", "blocks.0.norm"]
    assert "pos_embed" not in set(located["site"])  # its output (pos, d_model) has no batch axis
    assert located[located["leaks"]]["site"].iloc[0] == "blocks.0.mixer"
    assert located.set_index("site").loc["blocks.0.mixer", "query_pos"] == 4  # the conv reaches one step ahead


# --- the report ---------------------------------------------------------------------------------

def test_report_serialises_and_prints():
    report = audit(build("off_by_one", 0))
    data = json.loads(report.to_json())
    assert data["verdict"] == "leak" and data["exit_code"] == 1 and data["first_leaking_site"] == "blocks.0.mixer"
    assert {"site", "query_pos", "source_pos", "influence", "method"} <= set(data["table"][0])
    assert list(report.table.columns[:6]) == ["method", "site", "length", "query_pos", "source_pos", "influence"]
    frame = report.to_frame()
    assert list(frame["method"]) == list(METHODS) and set(frame.columns) == {"method", "status", "max_influence", "where"}
    text = str(report)
    assert "LEAK (future" in text and "blocks.0.mixer" in text
    clean = audit(build("masked_fill", 0))
    assert "causal" in str(clean) and json.loads(clean.to_json())["causal"] is True
    assert math.isfinite(clean.max_influence)


def test_progress_bar_runs(capsys):
    assert audit(build("sdpa_causal", 0), progress=True, max_len=8).causal
    assert "leakage audit" in capsys.readouterr().err


# --- bad input ----------------------------------------------------------------------------------

def test_bad_input_gets_clear_errors():
    model = build("masked_fill", 0)
    with pytest.raises(ValueError, match="one output per position"):
        audit(lambda tokens: model(tokens)[:, -1], max_len=8, vocab_size=13)
    with pytest.raises(ValueError, match="sequence-first"):
        audit(lambda tokens: model(tokens).transpose(0, 1), max_len=8, vocab_size=13)
    with pytest.raises(ValueError, match="exceeds the model's context n_ctx=16"):
        audit(model, max_len=40)
    with pytest.raises(ModelError, match="NaN.*no position was padded, so the cause is inside the model"):
        audit(lambda tokens: model(tokens) * float("nan"), max_len=8, vocab_size=13)
    with pytest.raises(ValueError, match="pass max_len"):
        audit(lambda tokens: model(tokens), vocab_size=13)
    with pytest.raises(ValueError, match="pass vocab_size"):
        audit(lambda tokens: model(tokens), max_len=8)
    with pytest.raises(ValueError, match="unknown method"):
        audit(model, methods=("vibes",))
    with pytest.raises(ValueError, match="outside"):
        audit(model, lengths=(1, 8))
    with pytest.raises(ValueError, match="tol"):
        audit(model, tol=0)
    with pytest.raises(ValueError, match="names nothing loadable"):
        audit("no-such-model-anywhere")
