"""interp.hooks: attention sites of every supported model, name checking, hook hygiene."""
import pytest
import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp import hooks as hooks_module
from interp.hooks import AttentionSite, attention_sites, check_hook_names, hooked, live_hooks, register_site_finder
from interp.mha import hook_attention
from interp.models import GPTConfig, HookedGPT

ALL_ROLES = ("q", "k", "v", "attn_scores", "pattern", "z", "result")


def test_sites_of_hooked_gpt(tiny_gpt):
    sites = attention_sites(tiny_gpt)
    assert [s.layer for s in sites] == [0, 1]
    assert all(s.causal is True and s.n_heads == 4 and s.d_head == 8 for s in sites)
    assert sites[1].hooks == {role: f"blocks.1.attn.hook_{role}" for role in ALL_ROLES}
    assert all(name in tiny_gpt.hook_dict for s in sites for name in s.hooks.values())
    assert sites[1].label(3) == "L1H3"


def test_sites_of_hooked_encoder_are_bidirectional(tiny_encoder):
    assert [s.causal for s in attention_sites(tiny_encoder)] == [False, False]


def test_sites_of_a_hooked_torch_model_follow_module_paths():
    torch.manual_seed(0)
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 2, 32, batch_first=True), 1)
    hook_attention(decoder)
    sites = attention_sites(decoder)
    # self-attention and cross-attention are both attention sites
    assert [s.module for s in sites] == ["layers.0.self_attn", "layers.0.multihead_attn"]
    assert sites[1].hook("pattern") == "layers.0.multihead_attn.hook_pattern"
    memory, target = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    _, cache = decoder.run_with_cache(target, memory)
    assert cache[sites[1].hook("pattern")].shape == (2, 2, 3, 5)  # (batch, head, query, key): 3 targets x 5 memory


def test_site_hook_error_lists_available_roles():
    site = AttentionSite(0, "blocks.0.attn", 2, 4, True, {"pattern": "blocks.0.attn.hook_pattern"})
    with pytest.raises(KeyError, match=r"no 'q' hook; it exposes \['pattern'\]"):
        site.hook("q")


def test_unsupported_model_gets_a_clear_error():
    with pytest.raises(TypeError, match="cannot find attention hooks in a Linear"):
        attention_sites(nn.Linear(2, 2))


class OddModel(HookedRootModule):
    """A model laid out unlike TransformerLens: attention hooks under `layer_{i}.look`."""

    def __init__(self):
        super().__init__()
        self.layer_0 = nn.Module()
        self.layer_0.look = HookPoint()
        self.setup()

    def forward(self, x):
        return self.layer_0.look(x)


def test_register_site_finder_teaches_a_new_layout(monkeypatch):
    monkeypatch.setattr(hooks_module, "_SITE_FINDERS", list(hooks_module._SITE_FINDERS))

    @register_site_finder
    def odd_sites(model):
        if not isinstance(model, OddModel):
            return None
        return [AttentionSite(0, "layer_0", 1, 4, None, {"pattern": "layer_0.look"})]

    sites = attention_sites(OddModel())
    assert sites[0].hook("pattern") == "layer_0.look"
    # other models still go to their own finders
    assert attention_sites(HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=8, d_vocab=10, n_ctx=4)))[0].module == "blocks.0.attn"


def test_builtin_site_finders_are_an_explicit_list_tried_before_registered_ones(monkeypatch):
    from interp import sites
    from interp.loading import bridge_sites
    from interp.mha import mha_sites
    from interp.sdpa import intercepted_sites

    assert hooks_module.BUILTIN_SITE_FINDERS == (bridge_sites, mha_sites, intercepted_sites)
    assert hooks_module.AttentionSite is sites.AttentionSite and hooks_module.ROLES == ALL_ROLES
    # a registered finder that claims every model never shadows a built-in kind
    monkeypatch.setattr(hooks_module, "_SITE_FINDERS", [])
    register_site_finder(lambda model: [AttentionSite(0, "everything", 1, 4, None, {})])
    encoder = hook_attention(nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1))
    assert attention_sites(encoder)[0].module == "layers.0.self_attn"
    assert attention_sites(OddModel())[0].module == "everything"


def test_check_hook_names_suggests_close_names(tiny_gpt):
    check_hook_names(tiny_gpt, ["blocks.0.attn.hook_pattern", "hook_embed"])
    with pytest.raises(KeyError, match=r"'blocks\.1\.attn\.hook_scores'.*Did you mean .*blocks\.1\.attn\.hook_attn_scores"):
        check_hook_names(tiny_gpt, ["blocks.1.attn.hook_scores"])
    with pytest.raises(KeyError, match="has 48 hooks; see model.hook_dict"):
        check_hook_names(tiny_gpt, ["zzzz"])


def test_hooked_attaches_for_the_block_only(tiny_gpt):
    seen = []
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with hooked(tiny_gpt, [("blocks.0.attn.hook_pattern", lambda t, hook: seen.append(t.shape))]):
        assert live_hooks(tiny_gpt) == ["blocks.0.attn.hook_pattern"]
        tiny_gpt(tokens)
    tiny_gpt(tokens)
    assert seen == [(1, 4, 4, 4)]
    assert live_hooks(tiny_gpt) == []


def test_hooked_checks_names_before_attaching_anything(tiny_gpt):
    with pytest.raises(KeyError):
        with hooked(tiny_gpt, [("blocks.0.attn.hook_pattern", lambda t, hook: t), ("blocks.9.attn.hook_q", lambda t, hook: t)]):
            pass
    assert live_hooks(tiny_gpt) == []


def test_hooked_cleans_up_when_the_body_raises(tiny_gpt):
    with pytest.raises(ValueError, match="body failed"):
        with hooked(tiny_gpt, [("hook_embed", lambda t, hook: t)]):
            raise ValueError("body failed")
    assert live_hooks(tiny_gpt) == []
