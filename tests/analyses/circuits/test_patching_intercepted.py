"""Head -> layer patching (`attention_input_patch`) on users' own models hooked by interception: the same effect as
the path patch of the sender's edges into every q, k and v input of the layer on the converted HookedGPT."""
from __future__ import annotations

import pytest
import torch
from own_models import hf_gpt2, nanogpt_flash, rotary_gpt_trained

import interp
from interp.analyses.circuits import attention_input_patch, direct_logit_attribution
from interp.errors import BadInput
from interp.paths import EdgePatch


@pytest.fixture(scope="module")
def rotary():
    return interp.load(rotary_gpt_trained())


@pytest.mark.parametrize("sender", ["L0H0", "L0H1", "L0H2", "L0H3"])
def test_head_to_layer_patch_on_a_users_fork_equals_the_path_patch_on_the_converted_model(rotary, toy, sender):
    """RotaryGPT (toy-induction's weights, intercepted) vs toy-induction: each layer-0 head's write, resampled,
    into layer 1's whole attention input gives the same mean effect to 1e-4; and the HookedGPT number is the
    multi-edge EdgePatch (sender -> every L1 head via q, k and v)."""
    prompts = interp.data.repeated_tokens(12, 8, 256, bos=0, seed=1)
    own = attention_input_patch(rotary, prompts, sender=sender, layer=1).iloc[0]
    ref = attention_input_patch(toy, prompts, sender=sender, layer=1).iloc[0]
    assert own["edge"] == f"{sender} -> L1 (attention input)" and own["via"] == "q,k,v"
    assert own["effect"] == pytest.approx(ref["effect"], abs=1e-4)
    assert own["clean"] == pytest.approx(ref["clean"], abs=1e-4)
    edges = [f"{sender} -> L1H{h} via {via}" for h in range(4) for via in "qkv"]
    by_edges = interp.Run(toy, prompts).effect(EdgePatch(edges))
    assert ref["effect"] == pytest.approx(by_edges.mean, abs=1e-9)


def test_the_previous_token_heads_carry_the_induction_heads_input(rotary):
    """A known answer of the trained model: its layer-0 heads feed the induction heads (each patch raises the loss
    on repeated tokens, CI above 0)."""
    prompts = interp.data.repeated_tokens(12, 8, 256, bos=0, seed=1)
    rows = [attention_input_patch(rotary, prompts, sender=f"L0H{h}", layer=1).iloc[0] for h in range(4)]
    assert max(row["ci_low"] for row in rows) > 1.0


def test_a_corrupted_set_row_for_row_on_hugging_face_gpt2_under_interception():
    """backend='sdpa' GPT-2 vs its conversion, with an explicit corrupted set: the same effect."""
    own, converted = interp.load(hf_gpt2(), backend="sdpa"), interp.load(hf_gpt2())
    prompts = interp.data.repeated_tokens(6, 6, 100, bos=0, seed=4)
    source = interp.data.repeated_tokens(6, 6, 100, bos=0, seed=9)
    a = attention_input_patch(own, prompts, sender="L0H2", layer=1, source=source).iloc[0]
    b = attention_input_patch(converted, prompts, sender="L0H2", layer=1, source=source).iloc[0]
    assert a["source"] == "corrupted prompts"
    assert a["effect"] == pytest.approx(b["effect"], abs=1e-4) and a["effect"] != 0


class _Half(torch.nn.Module):
    def forward(self, x):
        return x / 2


def test_an_attention_without_a_recognised_input_norm_is_refused_and_the_advice_runs():
    model = nanogpt_flash()
    model.transformer.h[1].ln_1 = _Half()
    hooked = interp.load(model)
    prompts = interp.data.repeated_tokens(4, 4, 61, bos=0)
    with pytest.raises(BadInput, match=r"it reads transformer\.h\.1\.ln_1 \(_Half\)") as info:
        attention_input_patch(hooked, prompts, sender="L0H0", layer=1)
    assert "direct logit attribution per head" in str(info.value)
    assert len(direct_logit_attribution(hooked, prompts)) == 1 + 8 + 2  # what the advice names runs here
    assert not any(m._forward_pre_hooks for m in hooked.modules())  # nothing left attached


@pytest.mark.parametrize("kwargs, message", [
    (dict(sender="L1H0", layer=1), "writes only into later layers"),
    (dict(sender="L0H9", layer=1), "has 4 heads"),
    (dict(sender="L0H0", layer=5), "is not an attention layer"),
])
def test_bad_senders_and_layers_are_refused(rotary, kwargs, message):
    prompts = interp.data.repeated_tokens(4, 4, 256, bos=0)
    with pytest.raises(BadInput, match=message):
        attention_input_patch(rotary, prompts, **kwargs)


def _tiny_llama():
    """A random grouped-query Llama (RMSNorm, rotary, 4 query heads on 2 key/value heads), built offline."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      attn_implementation="sdpa", tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # larger than the default init, so heads differ visibly
            param.normal_(0, 0.2) if param.dim() > 1 else param.normal_(1, 0.1)
    return model


def test_grouped_query_llama_under_interception_matches_its_conversion():
    """RMSNorm, grouped-query attention: per-head DLA and the head -> layer patch equal the converted HookedGPT's
    (whose patch is the graph's edges, k and v once per kv head); QK attribution is refused (rotary q and k)."""
    from interp.analyses import qk

    own, converted = interp.load(_tiny_llama(), backend="sdpa"), interp.load(_tiny_llama())
    prompts = interp.data.repeated_tokens(8, 6, 100, bos=0, seed=1)
    a = direct_logit_attribution(own, prompts).set_index("component")
    b = direct_logit_attribution(converted, prompts).set_index("component")
    heads = [c for c in b.index if c.startswith("L")]
    torch.testing.assert_close(torch.tensor(a.loc[heads, "mean"].to_numpy()), torch.tensor(b.loc[heads, "mean"].to_numpy()),
                               atol=1e-4, rtol=0)
    own_patch = attention_input_patch(own, prompts, sender="L0H1", layer=1).iloc[0]
    ref_patch = attention_input_patch(converted, prompts, sender="L0H1", layer=1).iloc[0]
    assert own_patch["effect"] == pytest.approx(ref_patch["effect"], abs=1e-4) and own_patch["effect"] != 0
    with pytest.raises(BadInput, match="no column block"):
        qk.attribute(own, prompts, "L1H0")


def test_composition_scores_on_an_intercepted_model_are_refused_naming_what_runs(rotary):
    """They read HookedGPT's blocks; the intercepted model used to fail with an AttributeError."""
    from interp.analyses.circuits import composition_scores

    with pytest.raises(BadInput, match="hooked by interception") as info:
        composition_scores(rotary)
    assert "attention_input_patch" in str(info.value) and "direct_logit_attribution" in str(info.value)
