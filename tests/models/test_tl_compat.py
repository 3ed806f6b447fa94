"""TransformerLens 4.3's own tools on our models: each runs on the shipped checkpoints and on converted
GPT-2-family and Llama-family (grouped-query) models, and each number it returns equals an independent
computation by hand within 1e-5 (docs: "Coming from TransformerLens" lists the same functions)."""
from __future__ import annotations

import pytest
import torch
from transformer_lens import FactoredMatrix, patching, utilities
from transformer_lens.head_detector import detect_head
from transformer_lens.tools.analysis import attribution_patching as eap

import interp

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from factories import randomise  # noqa: E402 - the same random weights as the conversion tests

from interp.data import PromptSet  # noqa: E402
from interp.models.config import EncoderConfig  # noqa: E402
from interp.models.convert import convert_model  # noqa: E402
from interp.models.encoder import HookedEncoder  # noqa: E402
from interp.models.tokenizers import SymbolTokenizer  # noqa: E402
from interp.paths import patch_edges  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
VOCAB, N_POS = 50, 7


def _word_tokenizer():
    """An offline Hugging Face tokenizer of VOCAB words w0..w49, so strings work on the converted models."""
    vocab = {f"w{i}": i for i in range(VOCAB)}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, unk_token="w0")


def _converted(hf_model):
    model = convert_model(randomise(hf_model, 0)).eval()
    model.tokenizer = _word_tokenizer()
    return model


def _gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=24, n_layer=2, n_head=3)
    return _converted(transformers.GPT2LMHeadModel(config))


def _llama():  # grouped-query: 6 query heads share 2 key/value heads; RMSNorm, gated MLP, rotary
    config = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=32, hidden_size=48, num_hidden_layers=2,
                                      num_attention_heads=6, num_key_value_heads=2, intermediate_size=40,
                                      attention_bias=True)
    return _converted(transformers.LlamaForCausalLM(config))


def _encoder():  # a pre-norm HookedEncoder (bidirectional) with an unembedding
    model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=VOCAB, n_ctx=32, seed=0))
    model.tokenizer = SymbolTokenizer(VOCAB)
    return randomise(model, 0)


MODELS = {"toy-induction": lambda: interp.load("toy-induction"), "stdlib-bytes": lambda: interp.load("stdlib-bytes"),
          "gpt2": _gpt2, "llama-gqa": _llama, "encoder": _encoder}
STRINGS = {"toy-induction": "3 14 15 92 65 3 14 15 92 65", "stdlib-bytes": "def f(x):\n    return x",
           "gpt2": "w1 w2 w3 w1 w2 w3", "llama-gqa": "w4 w5 w6 w4 w5 w6", "encoder": "1 2 3 1 2 3"}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    torch.manual_seed(0)
    model = MODELS[request.param]()
    tokens = torch.randint(1, min(VOCAB, model.cfg.d_vocab), (2, N_POS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return request.param, model, tokens, logits, cache


def _ln_in(model, cache, layer: int) -> torch.Tensor:
    """The attention's input of `layer` (batch, pos, d_model), from the cached resid_pre by hand."""
    resid = cache[f"blocks.{layer}.hook_resid_pre"]
    norm = model.blocks[layer].ln1
    if model.cfg.normalization_type == "LN":
        resid = resid - resid.mean(-1, keepdim=True)
        return resid / (resid.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.w + norm.b
    return resid / (resid.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.w  # RMS


# ---------------------------------------------------------------- weights


def test_stacked_weights_have_transformer_lens_names_and_shapes(case):
    name, model, *_ = case
    cfg = model.cfg
    L, H, D, d = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
    shapes = {"W_Q": (L, H, D, d), "W_K": (L, H, D, d), "W_V": (L, H, D, d), "W_O": (L, H, d, D),
              "b_Q": (L, H, d), "b_K": (L, H, d), "b_V": (L, H, d), "b_O": (L, D),
              "W_E": (cfg.d_vocab, D), "W_U": (D, cfg.d_vocab), "b_U": (cfg.d_vocab,)}
    for weight, shape in shapes.items():
        assert tuple(getattr(model, weight).shape) == shape, weight
    for layer, block in enumerate(model.blocks):
        assert torch.equal(model.W_Q[layer], block.attn.W_Q) and torch.equal(model.b_O[layer], block.attn.b_O)
    assert hasattr(model, "W_pos") == (model.cfg.positional_embedding_type == "standard")  # rotary: no table
    if name in ("gpt2", "encoder"):
        assert model.W_pos.shape == (cfg.n_ctx, D)
    assert hasattr(model, "W_in") == (not cfg.attn_only)


def test_grouped_key_value_heads_are_repeated_per_query_head():
    model = _llama()
    group = model.cfg.n_heads // model.cfg.n_kv_heads  # 3
    for layer, block in enumerate(model.blocks):
        for head in range(model.cfg.n_heads):
            assert torch.equal(model.W_K[layer, head], block.attn._W_K[head // group])
            assert torch.equal(model.b_V[layer, head], block.attn._b_V[head // group])


def test_ov_circuit_reproduces_each_heads_result(case):
    """result[h] = pattern[h] @ (x W_V[h] + b_V[h]) W_O[h], with W_V W_O read from OV.AB."""
    _, model, _, _, cache = case
    assert isinstance(model.OV, FactoredMatrix) and isinstance(model.QK, FactoredMatrix)
    OV = model.OV.AB  # (layer, head, d_model, d_model)
    for layer in range(model.cfg.n_layers):
        x = _ln_in(model, cache, layer)  # (batch, pos, d_model)
        pattern = cache["pattern", layer]  # (batch, head, query, key)
        bias = torch.einsum("hd,hdm->hm", model.b_V[layer], model.W_O[layer])  # (head, d_model)
        by_hand = torch.einsum("bhqk,bkm,hmn->bqhn", pattern, x, OV[layer]) + pattern.sum(-1).transpose(1, 2)[..., None] * bias
        torch.testing.assert_close(by_hand, cache["result", layer], **TOL)


def test_qk_circuit_reproduces_the_attention_scores_without_rotary():
    model = _gpt2()  # learned positions: the scores are bilinear in the normalised input
    _, cache = model.run_with_cache(torch.arange(1, N_POS + 1)[None])
    QK = model.QK.AB
    for layer in range(model.cfg.n_layers):
        x = _ln_in(model, cache, layer)[0]  # (pos, d_model)
        scores = (torch.einsum("pm,hmn,kn->hpk", x, QK[layer], x)
                  + torch.einsum("pm,hmd,hd->hp", x, model.W_Q[layer], model.b_K[layer])[..., None]
                  + torch.einsum("hd,hmd,km->hk", model.b_Q[layer], model.W_K[layer], x)[:, None]
                  + (model.b_Q[layer] * model.b_K[layer]).sum(-1)[:, None, None]) / model.cfg.d_head ** 0.5
        lower = torch.ones(N_POS, N_POS, dtype=torch.bool).tril()
        torch.testing.assert_close(scores[:, lower], cache["attn_scores", layer][0][:, lower], **TOL)


# ---------------------------------------------------------------- the cache's decompositions


def test_decompose_resid_sums_to_the_final_residual_stream(case):
    _, model, _, _, cache = case
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels[0] == "embed" and len(labels) == stack.shape[0]
    assert not any("mlp" in label for label in labels) or not model.cfg.attn_only
    torch.testing.assert_close(stack.sum(0), cache["resid_post", model.cfg.n_layers - 1], **TOL)


def test_accumulated_resid_through_ln_final_and_w_u_gives_the_logits(case):
    _, model, _, logits, cache = case
    stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    assert labels[-1] == "final_post" and len(labels) == model.cfg.n_layers + 1
    for layer in range(model.cfg.n_layers):
        assert torch.equal(cache.accumulated_resid(apply_ln=False)[layer], cache["resid_pre", layer])
    torch.testing.assert_close(stack[-1] @ model.W_U + model.b_U, logits, **TOL)


def test_stack_head_results_sum_with_b_o_to_the_attention_output(case):
    _, model, _, _, cache = case
    H = model.cfg.n_heads
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels[:2] == ["L0H0", "L0H1"] and stack.shape[0] == model.cfg.n_layers * H
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(stack[layer * H:(layer + 1) * H].sum(0) + model.b_O[layer], cache["attn_out", layer],
                                   **TOL)


def test_full_resid_decomposition_sums_to_the_final_residual_stream(case):
    _, model, _, _, cache = case
    for expand_neurons in (False, True):
        stack, labels = cache.get_full_resid_decomposition(expand_neurons=expand_neurons, return_labels=True)
        assert labels[-1] == "bias"
        torch.testing.assert_close(stack.sum(0), cache["resid_post", model.cfg.n_layers - 1], **TOL)


def test_accumulated_bias_is_the_sum_of_the_written_biases(case):
    _, model, *_ = case
    cfg = model.cfg
    by_hand = torch.zeros(cfg.d_model)
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(model.accumulated_bias(layer), by_hand, **TOL)
        torch.testing.assert_close(model.accumulated_bias(layer, mlp_input=True), by_hand + model.b_O[layer], **TOL)
        by_hand = by_hand + model.b_O[layer] + (0 if cfg.attn_only else model.b_out[layer])
    torch.testing.assert_close(model.accumulated_bias(cfg.n_layers), by_hand, **TOL)


def test_logit_attrs_equal_direct_logit_attribution_by_hand(case):
    """Each component's share of the answer's logit at the last position: centred (LayerNorm), divided by
    the final norm's cached scale, dotted with ln_final.w * W_U[:, answer]; over the full decomposition they
    sum to the logit minus b_U and ln_final's bias term."""
    _, model, tokens, logits, cache = case
    answer = tokens[:, 0]  # (batch,): one answer per prompt
    stack = cache.decompose_resid(pos_slice=-1)  # (component, batch, d_model)
    attrs = cache.logit_attrs(stack, tokens=answer, pos_slice=-1)
    centred = stack - stack.mean(-1, keepdim=True) if model.cfg.normalization_type == "LN" else stack
    scale = cache["ln_final.hook_scale"][:, -1]  # (batch, 1)
    direction = model.ln_final.w[:, None] * model.W_U[:, answer]  # (d_model, batch)
    by_hand = torch.einsum("cbm,mb->cb", centred / scale, direction)
    torch.testing.assert_close(attrs, by_hand, **TOL)
    ln_bias = getattr(model.ln_final, "b", torch.zeros(model.cfg.d_model))
    rest = model.b_U[answer] + ln_bias @ model.W_U[:, answer]
    torch.testing.assert_close(attrs.sum(0) + rest, logits[torch.arange(len(answer)), -1, answer], **TOL)
    # a string answer and an incorrect token: the difference of two directions
    diff = cache.logit_attrs(stack, tokens=answer, incorrect_tokens=tokens[:, 1], pos_slice=-1)
    torch.testing.assert_close(diff, attrs - cache.logit_attrs(stack, tokens=tokens[:, 1], pos_slice=-1), **TOL)


def test_logit_lens_final_entry_is_the_models_logits(case):
    _, model, tokens, logits, cache = case
    lens = cache.logit_lens(positions=-1)
    assert lens.labels[-1] == "final_post" and len(lens.labels) == model.cfg.n_layers + 1
    torch.testing.assert_close(lens.values[-1], logits[:, -1], **TOL)
    first = lens.values[0]  # layer 0's input read through the final norm and W_U by hand
    torch.testing.assert_close(first, model.ln_final(cache["resid_pre", 0][:, -1:])[:, 0] @ model.W_U + model.b_U,
                               **TOL)


# ---------------------------------------------------------------- hooks, names, head detection, patching


def test_get_act_name_and_run_with_hooks_reach_our_hooks(case):
    _, model, tokens, logits, cache = case
    assert utilities.get_act_name("pattern", 1) in model.hook_dict
    assert utilities.get_act_name("mlp_out", 0) in model.hook_dict
    zero_head = lambda z, hook: torch.cat([torch.zeros_like(z[:, :, :1]), z[:, :, 1:]], dim=2)  # noqa: E731
    out = model.run_with_hooks(tokens, fwd_hooks=[(utilities.get_act_name("z", 0), zero_head)])
    z = cache["z", 0].clone()
    z[:, :, 0] = 0
    resid = cache["resid_pre", 0] + torch.einsum("bphd,hdm->bpm", z, model.W_O[0]) + model.b_O[0]
    if model.cfg.attn_only and model.cfg.n_layers == 1:
        pytest.skip("no later layer to resume")
    if not model.resumable:
        pytest.skip("resuming after attention needs sequential pre-norm blocks")
    by_hand = model.head(model.run_from(0, resid, after_attention=True))
    torch.testing.assert_close(out, by_hand, **TOL)
    assert not torch.allclose(out, logits)


def test_no_hook_stays_silent(case):
    """Every hook in hook_dict fires in a cached forward (attention-only blocks' mlp_out carries zeros); the
    split q/k/v inputs, cached only when named, fire then."""
    _, model, tokens, _, cache = case
    split = {name for name in model.hook_dict if name.endswith(("hook_q_input", "hook_k_input", "hook_v_input"))}
    assert len(split) == 3 * model.cfg.n_layers
    assert set(cache.keys()) == set(model.hook_dict) - split
    _, named = model.run_with_cache(tokens, names_filter=sorted(split))
    assert set(named.keys()) == split
    if model.cfg.attn_only:
        assert all(torch.count_nonzero(cache["mlp_out", layer]) == 0 for layer in range(model.cfg.n_layers))


def _previous_token_scores(pattern: torch.Tensor) -> torch.Tensor:
    """(layer, head) share of each head's attention on the previous token, TransformerLens's "mul" score."""
    return pattern.diagonal(-1, -2, -1).sum(-1) / pattern.sum((-2, -1))


@pytest.mark.parametrize("as_string", [False, True])
def test_detect_head_on_tokens_and_on_a_string(case, as_string):
    name, model, tokens, *_ = case
    seq = STRINGS[name] if as_string else tokens[0]
    scores = detect_head(model, seq, "previous_token_head")
    ids = model.to_tokens(seq)
    _, cache = model.run_with_cache(ids)
    by_hand = torch.stack([_previous_token_scores(cache["pattern", layer][0]) for layer in range(model.cfg.n_layers)])
    torch.testing.assert_close(scores, by_hand.to(scores.dtype), **TOL)
    if name == "toy-induction":
        assert scores.argmax() == 2  # L0H2, the card's previous-token head
        assert model.to_str_tokens(seq) == [str(i) for i in ids[0].tolist()]


def test_tokenizers_round_trip_the_shipped_models():
    toy, text = interp.load("toy-induction"), interp.load("stdlib-bytes")
    assert toy.to_tokens("255 3 7").tolist() == [[255, 3, 7]] and toy.to_string(torch.tensor([255, 3, 7])) == "255 3 7"
    assert text.to_str_tokens("déf") == ["d", "\\xc3", "\\xa9", "f"]
    assert text.to_string(text.to_tokens("déf x")) == ["déf x"] and text.to_single_token("x") == ord("x")
    with pytest.raises(ValueError, match="abstract symbols"):
        toy.to_tokens("hello")
    with pytest.raises(ValueError, match="not one"):
        text.to_single_token("ab")


def test_to_tokens_pads_strings_of_unequal_lengths_as_transformer_lens_does():
    """Issue 36 item 9: to_tokens(list of strings) of unequal lengths raised; TransformerLens pads on the right."""
    toy, bpe = interp.load("toy-induction"), interp.load("stdlib-bpe")
    assert toy.to_tokens(["5 17 5 17", "3 4 5 3 4 5"]).tolist() == [[5, 17, 5, 17, 0, 0], [3, 4, 5, 3, 4, 5]]
    ids = bpe.to_tokens(["def f(x):", "x"])
    assert ids.shape[0] == 2 and ids[1, 1:].eq(0).all() and ids[0].tolist() == bpe.to_tokens("def f(x):")[0].tolist()
    with pytest.raises(ValueError, match="padding on the left .* attention mask"):
        toy.to_tokens(["5 17", "3 4 5"], padding_side="left")
    with pytest.raises(ValueError, match="prepend_bos=True: HookedGPT has no BOS token"):
        toy.to_tokens("5 17", prepend_bos=True)


def test_to_tokens_honours_prepend_bos_and_pads_with_bos_where_no_pad_id():
    from interp.data import CharTokenizer

    model = interp.load("toy-induction")
    model.metadata = {**model.metadata, "bos": 255}
    assert model.to_tokens("5 17", prepend_bos=True).tolist() == [[255, 5, 17]]
    assert model.to_tokens("255 5 17", prepend_bos=True).tolist() == [[255, 5, 17]]  # once
    assert model.to_tokens("255 5 17", prepend_bos=False).tolist() == [[5, 17]]
    assert model.to_tokens(["5", "5 17"]).tolist() == [[5, 255], [5, 17]]  # no pad id: the BOS id pads
    encoder = interp.models.HookedEncoder(interp.models.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20,
                                                                      n_ctx=16))
    encoder.tokenizer = CharTokenizer("abcdefgh")
    with pytest.raises(ValueError, match="an encoder's padding is read by the real positions"):
        encoder.to_tokens(["ab", "abc"])


def test_detect_head_takes_a_list_of_strings_of_unequal_lengths():
    """TransformerLens's own detect_head calls model.to_tokens(list) first: it failed on our models."""
    toy = interp.load("toy-induction")
    strings = ["5 17 5 17 9", "3 4 5 3 4 5 8"]
    scores = detect_head(toy, strings, "previous_token_head")
    each = torch.stack([detect_head(toy, text, "previous_token_head") for text in strings]).mean(0)
    torch.testing.assert_close(scores, each)
    assert scores.argmax() == 2  # L0H2, the card's previous-token head


def test_patching_block_every_equals_patching_by_hand(case):
    _, model, tokens, _, clean_cache = case
    corrupted = tokens.flip(0)  # the other prompt
    answer = tokens[:, -1]

    def metric(logits):
        return logits[torch.arange(len(answer)), -1, answer].mean()

    results = patching.get_act_patch_block_every(model, corrupted, clean_cache, metric)
    assert results.shape == (3, model.cfg.n_layers, N_POS)

    def by_hand(act: str, layer: int, pos: int) -> float:
        def patch(activation, hook):
            activation = activation.clone()
            activation[:, pos] = clean_cache[hook.name][:, pos]
            return activation
        with torch.no_grad():
            return metric(model.run_with_hooks(corrupted, fwd_hooks=[(utilities.get_act_name(act, layer), patch)])).item()

    for row, act in enumerate(("resid_pre", "attn_out", "mlp_out")):
        for layer, pos in ((0, 0), (model.cfg.n_layers - 1, N_POS - 1), (0, N_POS // 2)):
            assert results[row, layer, pos].item() == pytest.approx(by_hand(act, layer, pos), abs=1e-5)
    if model.cfg.attn_only:  # an attention-only model's MLP writes nothing: patching it changes nothing
        with torch.no_grad():
            assert torch.allclose(results[2], metric(model(corrupted)).expand_as(results[2]), atol=1e-5)


def test_patching_per_head_equals_patching_by_hand(case):
    _, model, tokens, _, clean_cache = case
    corrupted, answer = tokens.flip(0), tokens[:, -1]

    def metric(logits):
        return logits[torch.arange(len(answer)), -1, answer].mean()

    every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted, clean_cache, metric)
    assert every.shape == (5, model.cfg.n_layers, model.cfg.n_heads)  # output, query, key, value, pattern
    layer, head = model.cfg.n_layers - 1, model.cfg.n_heads - 1

    def patch(activation, hook):
        activation = activation.clone()
        activation[:, :, head] = clean_cache[hook.name][:, :, head]
        return activation
    with torch.no_grad():
        hand = metric(model.run_with_hooks(corrupted, fwd_hooks=[(utilities.get_act_name("z", layer), patch)])).item()
    assert every[0, layer, head].item() == pytest.approx(hand, abs=1e-5)
    resid = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert resid[0, 0].item() == pytest.approx(
        metric(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, hook: torch.cat(
            [clean_cache[hook.name][:, :1], a[:, 1:]], 1))])).item(), abs=1e-5)


# ---------------------------------------------------------------- hooked user models: canonical aliases


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, tokens):
        return self.enc(self.emb(tokens))


class _SDPAAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        batch, pos, _ = x.shape
        q, k, v = self.qkv(x).view(batch, pos, 3, 2, 8).permute(2, 0, 3, 1, 4)
        z = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(z.transpose(1, 2).reshape(batch, pos, 16))


class _SDPAModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(20, 16), torch.nn.Linear(16, 20)
        self.layers = torch.nn.ModuleList([_SDPAAttention(), _SDPAAttention()])

    def forward(self, tokens):
        h = self.emb(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return self.out(h)


@pytest.mark.parametrize("kind", ["hook_attention", "hook_sdpa"])
def test_hooked_user_models_answer_to_canonical_names(kind):
    torch.manual_seed(0)
    if kind == "hook_attention":
        model, own = interp.hook_attention(_Encoder().eval()), "enc.layers.{}.self_attn.hook_pattern"
    else:
        model, own = interp.hook_sdpa(_SDPAModel().eval()), "layers.{}.hook_pattern"
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    for layer in range(2):
        assert model.mod_dict[f"blocks.{layer}.attn.hook_pattern"] is model.hook_dict[own.format(layer)]
        assert f"blocks.{layer}.attn.hook_pattern" not in model.hook_dict  # each point once in hook_dict
    _, cache = model.run_with_cache(tokens)
    assert len(cache.cache_dict) == len(model.hook_dict)  # one tensor per hook point, not one per name
    assert cache["pattern", 1] is cache[own.format(1)]
    _, some = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern"])
    assert list(some.cache_dict) == [own.format(0)]
    seen = []
    model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("attn.hook_pattern"), lambda t, hook: seen.append(hook.name))])
    assert seen == [own.format(0), own.format(1)]  # a filter matching both names runs a hook once per point
    with interp.hooked(model, [("blocks.1.attn.hook_z", lambda t, hook: t * 0)]):
        zeroed = model(tokens)
    with torch.no_grad():
        torch.testing.assert_close(zeroed, model.run_with_hooks(tokens, fwd_hooks=[(own.format(1).replace("pattern", "z"),
                                                                                     lambda t, hook: t * 0)]))


def test_post_norm_and_mlm_encoders_refuse_what_has_no_meaning_there():
    """BERT (post-norm, MLM head): weights stack, but the residual stream is no sum of biases and the logits
    are no linear readout of it, so accumulated_bias and tokens_to_residual_directions refuse, saying why."""
    bert = convert_model(randomise(transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
        max_position_embeddings=32)), 0)).eval()
    assert bert.W_Q.shape == (2, 3, 24, 8) and bert.W_pos.shape == (32, 24)
    with pytest.raises(ValueError, match="post-norm"):
        bert.accumulated_bias(1)
    with pytest.raises(ValueError, match="lm_head='mlm'"):
        bert.tokens_to_residual_directions(3)


SWEEPS = sorted(name for name in dir(patching) if name.startswith("get_act_patch_") and "direct_path" not in name)


@pytest.mark.slow
def test_every_patching_sweep_runs(case):
    """Every `patching.get_act_patch_*` sweep but direct-path patching (it takes a corrupted cache too, and
    is checked edge by edge below) runs; each entry of the two sweeps above is checked by hand."""
    _, model, tokens, _, clean_cache = case
    def metric(logits):
        return logits[:, -1, 3].mean()
    for sweep in SWEEPS:
        result = getattr(patching, sweep)(model, tokens.flip(0), clean_cache, metric)
        assert torch.isfinite(result).all(), sweep


# ---------------------------------------------------------------- direct-path patching, edge by edge


def _answer_metric(tokens):
    answer = tokens[:, -1]

    def metric(logits):
        return logits[torch.arange(len(answer)), -1, answer].mean()
    return metric


def _components(model) -> list[str]:
    """k and v too where each query head has its own key/value head (TransformerLens refuses them under GQA)."""
    return ["q", "k", "v"] if model.cfg.n_kv_heads == model.cfg.n_heads else ["q"]


def _edge_patched(model, edge: str, corrupted, clean, metric) -> float:
    """The metric on the corrupted prompts with one edge reading the clean run's sender write (interp.paths):
    TransformerLens's direction, clean minus corrupted added to a corrupted run."""
    with torch.no_grad(), patch_edges(model, [edge], PromptSet(corrupted), PromptSet(clean)):
        return metric(model(corrupted)).item()


def test_direct_path_patching_equals_patching_the_edge(case):
    """`get_act_patch_direct_path` from L0H{last}: every later head's q (and k, v without GQA) input, each
    against interp.paths' edge patch; rows up to the source layer are TransformerLens's zero placeholders."""
    _, model, tokens, _, clean_cache = case
    corrupted, metric = tokens.flip(0), _answer_metric(tokens)
    with torch.no_grad():
        _, corrupted_cache = model.run_with_cache(corrupted)
        unpatched = metric(model(corrupted)).item()
    src, moved = model.cfg.n_heads - 1, 0.0
    for component in _components(model):
        results = patching.get_act_patch_direct_path(model, corrupted, clean_cache, corrupted_cache, metric,
                                                     src_layer=0, src_head=src, component=component, verbose=False)
        assert results.shape == (model.cfg.n_layers, model.cfg.n_heads) and torch.count_nonzero(results[0]) == 0
        by_hand = torch.tensor([[_edge_patched(model, f"L0H{src} -> L{layer}H{head} via {component}", corrupted, tokens,
                                               metric) for head in range(model.cfg.n_heads)]
                                for layer in range(1, model.cfg.n_layers)])
        torch.testing.assert_close(results[1:], by_hand, **TOL)
        moved = max(moved, (results[1:] - unpatched).abs().max().item())
    assert moved > 1e-4  # the patches change the metric
    assert not model.cfg.use_split_qkv_input  # TransformerLens's context manager restored the switch


def test_direct_path_all_sources_equals_patching_each_edge(case):
    _, model, tokens, _, clean_cache = case
    corrupted, metric = tokens.flip(0), _answer_metric(tokens)
    with torch.no_grad():
        _, corrupted_cache = model.run_with_cache(corrupted)
    every = patching.get_act_patch_direct_path_all_sources(model, corrupted, clean_cache, corrupted_cache, metric,
                                                           component="q", verbose=False)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    assert every.shape == (L, H, L, H)
    for src_layer, src_head, dst_layer, dst_head in ((0, 0, 1, 0), (0, H - 1, L - 1, 1), (L - 2, 1, L - 1, H - 1)):
        edge = f"L{src_layer}H{src_head} -> L{dst_layer}H{dst_head} via q"
        assert every[src_layer, src_head, dst_layer, dst_head].item() == pytest.approx(
            _edge_patched(model, edge, corrupted, tokens, metric), abs=1e-5), edge
    assert torch.count_nonzero(every[L - 1]) == 0  # no later layer: placeholders


def test_direct_path_refuses_what_has_no_per_head_meaning():
    """TransformerLens refuses k / v under grouped-query attention (cfg.n_key_value_heads); our post-norm models
    refuse its split-input switch (a head's write reaches later heads only through a norm)."""
    llama = _llama()
    tokens = torch.randint(1, VOCAB, (2, N_POS), generator=torch.Generator().manual_seed(1))
    _, cache = llama.run_with_cache(tokens)
    with pytest.raises(ValueError, match="GQA"):
        patching.get_act_patch_direct_path(llama, tokens, cache, cache, _answer_metric(tokens), 0, 0, component="k")
    bert = convert_model(randomise(transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
        max_position_embeddings=32)), 0)).eval()
    _, cache = bert.run_with_cache(tokens)
    with pytest.raises(ValueError, match="post-norm"):
        patching.get_act_patch_direct_path(bert, tokens, cache, cache, lambda logits: logits.sum(), 0, 0, verbose=False)
    assert not bert.cfg.use_split_qkv_input


# ---------------------------------------------------------------- attribution patching (EAP), against autograd


def _logit_diff(logits):
    return logits[0, -1, 3] - logits[0, -1, 4]


def _derivative(model, tokens, hook_name: str, index: tuple, delta: torch.Tensor) -> float:
    """d metric / d eps at 0, with `delta` * eps added to `hook_name`'s activation at `index` on `tokens`:
    the first-order effect attribution patching estimates, by autograd through our own hooks."""
    eps = torch.zeros((), requires_grad=True)

    def add(act, hook):
        act = act.clone()
        act[index] = act[index] + eps * delta
        return act
    return torch.autograd.grad(_logit_diff(model.run_with_hooks(tokens, fwd_hooks=[(hook_name, add)])), eps)[0].item()


def test_node_attribution_patching_equals_the_derivative_by_hand(case):
    _, model, tokens, _, _ = case
    clean, corrupt = tokens[:1], tokens[1:]
    result = eap.attribution_patch(model, clean, corrupt, _logit_diff)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        _, corrupt_cache = model.run_with_cache(corrupt)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    assert len(result.node_scores) == N_POS * (1 + L * (H + 1))
    for layer, head, pos in ((0, 0, N_POS - 1), (L - 1, H - 1, N_POS - 1), (0, H - 1, 2)):
        name = f"blocks.{layer}.attn.hook_z"
        delta = (clean_cache[name] - corrupt_cache[name])[0, pos, head]
        score = result.node_scores[eap.Node(kind="attn_head_out", position=pos, layer=layer, head=head)]
        assert score == pytest.approx(_derivative(model, corrupt, name, (0, pos, head), delta), abs=1e-5)
    mlp = [result.node_scores[eap.Node(kind="mlp_out", position=pos, layer=0)] for pos in range(N_POS)]
    if model.cfg.attn_only:  # an absent MLP writes zeros on both runs: no effect
        assert mlp == [0.0] * N_POS
    else:
        name = "blocks.0.hook_mlp_out"
        delta = (clean_cache[name] - corrupt_cache[name])[0, N_POS - 1]
        assert mlp[-1] == pytest.approx(_derivative(model, corrupt, name, (0, N_POS - 1), delta), abs=1e-5)
    assert any(abs(score) > 1e-3 for score in result.node_scores.values())


def test_edge_attribution_patching_equals_the_derivative_by_hand(case):
    """Edge granularity (EAP): a writer's clean-minus-corrupt write along one edge into a head's split q/k/v
    input, an MLP's input or the logits. GQA models are refused by TransformerLens itself (their k/v inputs are
    per key/value head, not per query head)."""
    name, model, tokens, _, _ = case
    clean, corrupt = tokens[:1], tokens[1:]
    config = eap.EdgeAttributionConfig(granularity="edge")
    if model.cfg.n_kv_heads != model.cfg.n_heads:
        with pytest.raises(ValueError, match="GQA"):
            eap.attribution_patch(model, clean, corrupt, _logit_diff, config)
        return
    result = eap.attribution_patch(model, clean, corrupt, _logit_diff, config)
    assert not model.cfg.use_split_qkv_input  # restored
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        _, corrupt_cache = model.run_with_cache(corrupt)
    L, H, last = model.cfg.n_layers, model.cfg.n_heads, N_POS - 1

    def write(hook: str, index: tuple) -> torch.Tensor:
        return (clean_cache[hook] - corrupt_cache[hook])[index]

    head = eap.Node(kind="attn_head_out", position=last, layer=0, head=1)
    head_write = write("blocks.0.attn.hook_result", (0, last, 1))
    embed = eap.Node(kind="embed", position=2)
    checks = [((head, eap.Node(kind=f"{branch}_input", position=last, layer=1, head=H - 1)),
               f"blocks.1.attn.hook_{branch}_input", (0, last, H - 1), head_write) for branch in "qkv"]
    checks.append(((embed, eap.Node(kind="v_input", position=2, layer=1, head=0)), "blocks.1.attn.hook_v_input",
                   (0, 2, 0), write("hook_embed", (0, 2))))
    checks.append(((head, eap.Node(kind="logits", position=last, layer=L - 1)), f"blocks.{L - 1}.hook_resid_post",
                   (0, last), head_write))
    checks.append(((head, eap.Node(kind="mlp_in", position=last, layer=0)), "blocks.0.hook_mlp_in", (0, last), head_write))
    for edge, hook, index, delta in checks:
        assert result.edge_scores[edge] == pytest.approx(_derivative(model, corrupt, hook, index, delta), abs=1e-5), edge
    if model.cfg.attn_only:
        assert result.edge_scores[checks[-1][0]] == 0.0  # the absent MLP reads nothing
    assert any(abs(score) > 1e-3 for score in result.edge_scores.values())


def test_edge_faithfulness_without_one_heads_edges_equals_patching_that_head(case):
    """TransformerLens's `faithfulness` ablates (to the corrupt run) every edge outside a circuit: the circuit of
    every edge but those out of L0H1 is the clean run with L0H1's output from the corrupt run, by hand."""
    _, model, tokens, _, _ = case
    clean, corrupt = tokens[:1], tokens[1:]
    if model.cfg.n_kv_heads != model.cfg.n_heads:
        pytest.skip("edge granularity: TransformerLens refuses grouped-query attention (above)")
    edges = list(eap.attribution_patch(model, clean, corrupt, _logit_diff,
                                       eap.EdgeAttributionConfig(granularity="edge")).edge_scores)
    # a ratio of float32 metric differences: 1 + 3.3e-5 on stdlib-bytes on some CPUs (measured), so 1e-4, not 1e-5
    assert eap.faithfulness(model, clean, corrupt, _logit_diff, edges).recovered == pytest.approx(1.0, abs=1e-4)
    kept = [(u, v) for u, v in edges if not (u.kind == "attn_head_out" and (u.layer, u.head) == (0, 1))]
    result = eap.faithfulness(model, clean, corrupt, _logit_diff, kept)
    circuit_metric = result.corrupt_metric + result.recovered * (result.full_metric - result.corrupt_metric)
    with torch.no_grad():
        _, corrupt_cache = model.run_with_cache(corrupt)

        def corrupt_head(z, hook):
            z = z.clone()
            z[:, :, 1] = corrupt_cache[hook.name][:, :, 1]
            return z
        by_hand = _logit_diff(model.run_with_hooks(clean, fwd_hooks=[("blocks.0.attn.hook_z", corrupt_head)])).item()
    assert circuit_metric == pytest.approx(by_hand, abs=1e-5)
    assert abs(by_hand - result.full_metric) > 1e-4  # the head matters: the check can fail
