"""interp.analyses.induction: known answers on a hand-set induction circuit, agreement with TransformerLens."""
from dataclasses import replace

import pytest
import torch
from transformer_lens.head_detector import detect_head

from interp.analyses.induction import NoRepeats, copying_scores, repeat_queries, scores, scores_per_prompt
from interp.data import PromptSet, repeated_tokens
from interp.models import GPTConfig, HookedGPT
from interp.models.constructed import fixed_offset_copier, induction_circuit

D_VOCAB, N_CTX = 24, 64


@pytest.fixture(scope="module")
def circuit():
    """L0H0 previous-token, L1H0 induction (copies to the logits), the rest first/self/uniform to scratch."""
    return induction_circuit(d_vocab=D_VOCAB, n_ctx=N_CTX)


def distinct_repeats(n: int, prefix_len: int, seed: int, bos: int | None = D_VOCAB - 1) -> PromptSet:
    """Repeated tokens whose prefix has no repeated token (so every target is unambiguous)."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.stack([torch.randperm(D_VOCAB - 1, generator=generator)[:prefix_len] for _ in range(n)])
    tokens = prefix.repeat(1, 2)
    if bos is not None:
        tokens = torch.cat([torch.full((n, 1), bos), tokens], dim=1)
    meta = {"kind": "repeated", "prefix_len": prefix_len, "offset": 0 if bos is None else 1, "bos": bos}
    return PromptSet(tokens, meta=meta)


def test_known_answers_on_constructed_circuit(circuit):
    table = scores(circuit, distinct_repeats(10, 12, seed=0)).set_index(["layer", "head"])
    assert table.loc[(1, 0), "induction"] == pytest.approx(1.0, abs=1e-5)
    assert table.loc[(1, 0), "induction_ci_low"] == pytest.approx(1.0, abs=1e-5)
    assert table.loc[(1, 0), "duplicate_token"] == pytest.approx(0.0, abs=1e-5)
    # the previous-token head attends to query - 1; the induction target is query - 11
    assert table.loc[(0, 0), "induction"] == pytest.approx(0.0, abs=1e-5)
    # a self head: the query itself is never an earlier occurrence
    assert table.loc[(0, 2), "duplicate_token"] == pytest.approx(0.0, abs=1e-5)
    assert (table["n_prompts"] == 10).all()


def test_induction_holds_on_other_lengths(circuit):
    for prefix_len in (5, 9, 20):
        table = scores(circuit, distinct_repeats(6, prefix_len, seed=prefix_len), copying=False).set_index(["layer", "head"])
        assert table.loc[(1, 0), "induction"] == pytest.approx(1.0, abs=1e-5)


def test_fixed_offset_copier_is_induction_only_at_its_period():
    model = fixed_offset_copier(10, d_vocab=D_VOCAB, n_ctx=N_CTX)
    at_period = scores(model, distinct_repeats(6, 10, seed=1, bos=D_VOCAB - 1), copying=False)
    off_period = scores(model, distinct_repeats(6, 14, seed=1, bos=D_VOCAB - 1), copying=False)
    assert at_period.loc[0, "induction"] == pytest.approx(1.0, abs=1e-5)
    assert off_period.loc[0, "induction"] < 0.05


def test_copying_scores(circuit):
    copying = copying_scores(circuit)  # (layer, head)
    assert copying.shape == (2, 4)
    assert copying[1, 0] == pytest.approx(1.0, abs=1e-6)  # copies the attended token to the logits
    assert copying[0, 0] == 0.0  # writes to the `prev` subspace only: invisible to the unembedding
    assert (copying[:, 1:] == 0).all()  # scratch writers


def test_copying_sign_on_random_and_negated_heads():
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20, n_ctx=16, seed=0,
                                attn_only=True, normalization_type=None)).eval()
    with torch.no_grad():
        W_E = model.embed.W_E
        model.unembed.W_U.copy_(W_E.T)
        model.blocks[0].attn.W_V.zero_(), model.blocks[0].attn.W_O.zero_()
        model.blocks[0].attn.W_V[:, :, :] = torch.eye(16)[:, :8]
        model.blocks[0].attn.W_O[0] = torch.eye(16)[:8]  # W_E P W_E^T: positive semi-definite
        model.blocks[0].attn.W_O[1] = -torch.eye(16)[:8]  # anti-copying
    copying = copying_scores(model)
    assert copying[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert copying[0, 1] == pytest.approx(-1.0, abs=1e-6)


def test_copying_folds_layernorm(tiny_gpt):
    copying = copying_scores(tiny_gpt)
    assert copying.shape == (2, 4) and torch.isfinite(copying).all() and copying.abs().max() <= 1


@pytest.mark.parametrize("kind", ["induction_head", "duplicate_token_head"])
@pytest.mark.parametrize("with_meta", [True, False])
def test_agrees_with_detect_head(kind, with_meta):
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=D_VOCAB, n_ctx=N_CTX, seed=2, init_range=0.4)).eval()
    one = distinct_repeats(1, 9, seed=4, bos=None)
    if not with_meta:
        one = replace(one, meta={})
    metric = {"induction_head": "induction", "duplicate_token_head": "duplicate_token"}[kind]
    ours = scores_per_prompt(model, one)[metric][0]
    theirs = detect_head(model, one.tokens, kind, error_measure="mul")
    n_queries = int(repeat_queries(one).sum())
    assert n_queries == 9
    torch.testing.assert_close(theirs, ours * n_queries / one.n_pos, atol=1e-6, rtol=1e-5)


def test_accidental_repeats_count_without_meta_only():
    tokens = torch.tensor([[3, 3, 5, 3, 3, 5]])
    with_meta = PromptSet(tokens, meta={"prefix_len": 3, "offset": 0})
    without = PromptSet(tokens)
    assert repeat_queries(with_meta).tolist() == [[False, False, False, True, True, True]]
    assert repeat_queries(without).tolist() == [[False, True, False, True, True, True]]


def test_no_repeats_is_an_error(tiny_gpt):
    with pytest.raises(NoRepeats, match="no repeated tokens"):
        scores(tiny_gpt, PromptSet(torch.arange(10)[None]))
    with pytest.raises(NoRepeats, match="prompts \\[0\\]"):
        scores(tiny_gpt, PromptSet(torch.arange(10)[None], meta={"prefix_len": 10, "offset": 0}))


@pytest.mark.parametrize("normalization", ["RMS", "LN"])
def test_copying_under_grouped_query_attention_is_the_definition(normalization, monkeypatch):
    """sum(eig)/sum(|eig|) of W_E' W_V W_O out W_U, the vocabulary-sized product written out in full (norms folded:
    an RMSNorm only scales, a LayerNorm centres too), equals the score computed through d_model x d_model
    products; and no per-query-head W_V is built (the grouped weights are read as stored)."""
    from transformer_lens import FactoredMatrix

    from interp.models.components import GroupedQueryAttention

    cfg = GPTConfig(n_layers=2, n_heads=4, n_key_value_heads=2, d_model=16, d_head=4, d_vocab=30, n_ctx=16, seed=3,
                    normalization_type=normalization, positional_embedding_type="rotary", gated_mlp=True, act_fn="silu")
    model = HookedGPT(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.ln1.w.uniform_(0.5, 1.5)
        model.ln_final.w.uniform_(0.5, 1.5)
    expected = torch.zeros(2, 4, dtype=torch.float64)
    centre = torch.eye(16, dtype=torch.float64) - (1 / 16 if normalization == "LN" else 0)
    for layer, block in enumerate(model.blocks):
        embed = model.W_E.double() @ centre * block.ln1.w.double()
        readout = centre * model.ln_final.w.double() @ model.W_U.double()
        for head in range(4):
            eig = FactoredMatrix(embed @ block.attn.W_V[head].double(), block.attn.W_O[head].double() @ readout).eigenvalues
            expected[layer, head] = eig.real.sum() / eig.abs().sum()
    monkeypatch.setattr(GroupedQueryAttention, "_expanded", lambda self, stored: pytest.fail("W_V expanded per query head"))
    torch.testing.assert_close(copying_scores(model).double(), expected, atol=1e-6, rtol=0)


def test_copying_needs_weights(tiny_gpt):
    class Opaque(torch.nn.Module):
        pass

    with pytest.raises(TypeError, match="copying=False"):
        copying_scores(Opaque())


def test_trained_like_random_model_scores_are_small(tiny_gpt):
    table = scores(tiny_gpt, repeated_tokens(16, 8, 40, seed=0))
    # an untrained model attends near-uniformly: ~1/(pos+1) on any one target
    assert table["induction"].max() < 0.3
    assert (table["induction_ci_low"] <= table["induction"]).all()
    assert (table["induction"] <= table["induction_ci_high"]).all()
