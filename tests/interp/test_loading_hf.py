"""interp.load on Hugging Face folders and models: native conversion by default, the backends,
optional tokenizers, sharded weights, and clear errors for what cannot be converted."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import interp.models.convert  # noqa: E402
from interp.errors import BadInput, CheckpointError  # noqa: E402
from interp.loading import load  # noqa: E402


def _tiny_gpt2(**overrides):
    fields = {"vocab_size": 40, "n_positions": 16, "n_embd": 12, "n_layer": 1, "n_head": 3, **overrides}
    config = transformers.GPT2Config(**fields)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture()
def gpt2_folder(tmp_path):
    _tiny_gpt2().save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def _equal_to_hf(model, hf_model, n_pos: int = 8) -> float:
    tokens = torch.randint(0, 40, (2, n_pos), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return (model(tokens) - hf_model(tokens).logits).abs().max().item()


def test_folder_without_tokenizer_converts_natively_and_says_so(gpt2_folder):
    model = load(gpt2_folder)
    assert type(model).__name__ == "HookedGPT" and model.cfg.original_architecture == "GPT2LMHeadModel"
    assert model.tokenizer is None and any("no tokenizer files" in note for note in model.load_notes)
    assert "converted natively from GPT2LMHeadModel" in model.load_notes[0]
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(gpt2_folder)).eval()
    assert _equal_to_hf(model, hf) <= 1e-4


def test_hugging_face_model_object_converts(gpt2_folder):
    hf = _tiny_gpt2()
    model = load(hf)
    assert type(model).__name__ == "HookedGPT" and _equal_to_hf(model, hf) <= 1e-4
    with torch.no_grad():  # the converted weights are a copy: editing them leaves the original alone
        model.embed.W_E.zero_()
    assert hf.transformer.wte.weight.abs().sum() > 0


def test_sharded_safetensors_with_index_load(tmp_path):
    hf = _tiny_gpt2()
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="10KB")
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert "model.safetensors.index.json" in files and sum(f.startswith("model-0") for f in files) > 1
    assert _equal_to_hf(load(tmp_path / "sharded"), hf) <= 1e-4


def test_folder_without_weights_is_refused(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="config.json but no weights.*model.safetensors"):
        load(gpt2_folder)


def test_weights_that_do_not_match_the_config_name_the_tensor_and_shape(gpt2_folder):
    config = json.loads((gpt2_folder / "config.json").read_text())
    config["vocab_size"] = 41
    (gpt2_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"tensor 'transformer\.wte\.weight' has shape \(40, 12\).*implies \(41, 12\)"):
        load(gpt2_folder)


def test_extra_layers_in_the_weights_are_refused(gpt2_folder):
    config = json.loads((gpt2_folder / "config.json").read_text())  # one layer
    _tiny_gpt2(n_layer=2).save_pretrained(gpt2_folder)  # two layers of weights ...
    (gpt2_folder / "config.json").write_text(json.dumps(config))  # ... a config saying one
    with pytest.raises(CheckpointError, match=r"tensors the config does not account for.*h\.1\."):
        load(gpt2_folder)


def test_unsupported_field_names_field_and_value(tmp_path):
    _tiny_gpt2(scale_attn_by_inverse_layer_idx=True).save_pretrained(tmp_path / "m")
    with pytest.raises(BadInput, match="scale_attn_by_inverse_layer_idx=True"):
        load(tmp_path / "m", backend="native")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}))
    with pytest.raises(BadInput, match="rope_type='linear'"):
        load(hf, backend="native")
    # "auto" falls back to SDPA interception (interp.sdpa) and says why
    hooked = load(hf)
    assert any("rope_type='linear'" in note and "sdpa" in note for note in hooked.load_notes)


def test_unknown_field_with_a_non_default_value_is_refused():
    config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=12, n_layer=1, n_head=3)
    config.my_custom_switch = True
    with pytest.raises(interp.models.convert.ConversionError, match="my_custom_switch=True"):
        interp.models.convert.convert(config, {}, "GPT2LMHeadModel")


def test_unsupported_architecture_native_names_the_supported_ones(tmp_path):
    config = transformers.OPTConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    ffn_dim=32, max_position_embeddings=16, word_embed_proj_dim=16)
    transformers.OPTForCausalLM(config).save_pretrained(tmp_path / "opt")
    with pytest.raises(BadInput, match=r"OPTForCausalLM.*no native converter; supported: \[.*GPT2LMHeadModel.*LlamaForCausalLM"):
        load(tmp_path / "opt", backend="native")


def test_unsupported_architecture_falls_back_to_the_bridge_with_a_note(tmp_path):
    config = transformers.OPTConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    ffn_dim=32, max_position_embeddings=16, word_embed_proj_dim=16)
    transformers.OPTForCausalLM(config).save_pretrained(tmp_path / "opt")
    model = load(tmp_path / "opt")
    assert type(model).__name__ == "TransformerBridge"
    assert "not converted natively" in model.load_notes[0] and "hook_result is absent" in model.load_notes[0]


def test_backend_choices(gpt2_folder, tmp_path):
    with pytest.raises(BadInput, match="backend='nativ' is not one of"):
        load(gpt2_folder, backend="nativ")
    with pytest.raises(BadInput, match="backend='bridge' wraps a local Hugging Face folder"):
        load("toy-induction", backend="bridge")
    assert type(load(gpt2_folder, backend="native")).__name__ == "HookedGPT"
    import importlib.util

    if importlib.util.find_spec("interp.sdpa") is None:
        with pytest.raises(BadInput, match="sdpa backend is not available"):
            load(gpt2_folder, backend="sdpa")


def test_cli_backend_flag_and_exit_code(tmp_path, gpt2_folder):
    from interp import cli

    config = transformers.OPTConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    ffn_dim=32, max_position_embeddings=16, word_embed_proj_dim=16)
    transformers.OPTForCausalLM(config).save_pretrained(tmp_path / "opt")
    assert cli.main(["verify", str(tmp_path / "opt"), "--backend", "native", "-q"]) == 2
    assert cli.main(["verify", str(gpt2_folder), "--backend", "native", "-q"]) == 0


def test_every_supported_field_is_in_the_module_docstring():
    from interp.models.convert import bert, gpt2, llama, neox

    doc = interp.models.convert.__doc__
    tables = [gpt2.FIELDS, gpt2.ACCEPTED, neox.FIELDS, llama.FIELDS, *llama.FAMILY_FIELDS.values(), bert.FIELDS,
              bert.ACCEPTED]
    missing = [name for table in tables for name in table if f"`{name}`" not in doc]
    assert not missing


def test_llama_folder_without_tokenizer_loads(tmp_path):
    """A Llama folder saved without tokenizer files (the bridge fails there building a tokenizer)."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=24, max_position_embeddings=16)).eval()
    hf.save_pretrained(tmp_path / "llama")
    model = load(tmp_path / "llama")
    assert model.tokenizer is None and model.cfg.n_kv_heads == 2
    assert _equal_to_hf(model, hf) <= 1e-4


def test_a_bert_decoder_or_cross_attention_is_not_converted_as_an_encoder():
    config = transformers.BertConfig(vocab_size=40, hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=16, is_decoder=True)
    with pytest.raises(interp.models.convert.UnsupportedField, match="is_decoder=True"):
        interp.models.convert.convert(config, {}, "BertModel")
    config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=12, n_layer=1, n_head=3, add_cross_attention=True)
    with pytest.raises(interp.models.convert.UnsupportedField, match="add_cross_attention=True"):
        interp.models.convert.convert(config, {}, "GPT2LMHeadModel")


# config.json files shaped like published checkpoints (fields as older transformers wrote them)
PUBLISHED_CONFIGS = {
    "pythia-70m": ("GPTNeoXConfig", {
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
        "hidden_size": 512, "intermediate_size": 2048, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 6, "rotary_emb_base": 10000,
        "rotary_pct": 0.25, "tie_word_embeddings": False, "torch_dtype": "float16", "use_parallel_residual": True,
        "vocab_size": 50304}, {"rotary_dim": 16, "parallel_attn_mlp": True}),
    "qwen2.5-0.5b": ("Qwen2Config", {
        "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
        "use_mrope": False}, {"n_key_value_heads": 2, "rotary_base": 1e6, "window_size": None}),
    "llama-3.2-1b": ("LlamaConfig", {
        "architectures": ["LlamaForCausalLM"], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256},
        {"use_NTK_by_parts_rope": True, "NTK_by_parts_factor": 32.0, "n_ctx": 131072}),
    "mistral-7b": ("MistralConfig", {
        "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "vocab_size": 32000}, {"window_size": 4096, "n_key_value_heads": 8}),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_configs_shaped_like_published_checkpoints_convert(name):
    class_name, fields, expected = PUBLISHED_CONFIGS[name]
    hf_config = getattr(transformers, class_name).from_dict(fields)
    architecture = interp.models.convert.architecture_of(hf_config)
    family = interp.models.convert.ARCHITECTURES[architecture][1]
    cfg = family.config(hf_config, architecture)
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_config_fields_starting_with_underscore_are_metadata(gpt2_folder):
    """save_pretrained of a model transformers loaded from a GGUF file writes `_model_name_or_path`: bookkeeping,
    never a reason to refuse native conversion (nor to fall back to the bridge)."""
    config = json.loads((gpt2_folder / "config.json").read_text())
    config.update(_model_name_or_path="some/where", _commit_hash="abc", _attn_implementation_internal="eager")
    (gpt2_folder / "config.json").write_text(json.dumps(config))
    model = load(gpt2_folder, backend="native")
    assert model.cfg.original_architecture == "GPT2LMHeadModel"
    assert _equal_to_hf(model, _tiny_gpt2()) < 1e-4
