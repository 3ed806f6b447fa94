"""GGUF files dequantized straight into a HookedGPT: tiny Llama (grouped-query, tied or not, biases) and Qwen2
models written with `gguf.GGUFWriter` as llama.cpp's converter writes them (Q/K rows permuted for llama,
quantised Q8_0 / Q4_1 / F16 tensors), loaded by us and by `transformers`' own GGUF support, and compared:
max |delta logit| <= 1e-4 x max |logit| on four sentences and an 8 x 128 random batch. Bad files get a
clear error naming what is wrong (exit 2 through the CLI)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import interp  # noqa: E402
from interp.cli import main  # noqa: E402
from interp.errors import BadInput, CheckpointError  # noqa: E402
from interp.models.convert.gguf import hf_name, unpermute  # noqa: E402

SENTENCES = ["the cat sat on the mat", "when mary and john went to the store", "a b c a b c",
             "to be or not to be, that is the question"]
RELATIVE = 1e-4
Q = gguf.GGMLQuantizationType


def _byte_vocabulary() -> tuple[list[str], list[str], list[int]]:
    """A byte-level BPE vocabulary as llama.cpp stores one: 256 byte symbols, a few merges, one control token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "a t", "Ġ m", "Ġm at", "Ġ s", "Ġs at", "Ġ c", "Ġc at", "o n", "Ġ o", "Ġo n"]
    tokens = ["<|endoftext|>", *symbols, *(m.replace(" ", "") for m in merges)]
    types = [3] + [1] * (len(tokens) - 1)  # 3: control, 1: normal
    return tokens, merges, types


def _hf_model(arch: str, *, heads: int = 4, kv: int = 2, tied: bool = False, bias: bool = False, seed: int = 0):
    tokens, _, _ = _byte_vocabulary()
    common = dict(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=256, rms_norm_eps=1e-5,
                  tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attention_bias=bias))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * 0.2
            param.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)
    return model.eval()


def _permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of a Llama query / key projection (rows per head: halves -> pairs)."""
    return weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[module]}.{kind}"


def write_gguf(model, path, *, arch: str = "llama", quant=Q.Q8_0, tokenizer: bool = True, extra=None, skip=()):
    """`model` written as llama.cpp writes a GGUF: metadata, tokenizer, tensors (2-D weights quantised to `quant`,
    the embedding Q8_0 as in SmolLM2's file, norms and biases F32); `extra(writer)` adds metadata or tensors."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name("tiny test model")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == Q.Q8_0 else gguf.LlamaFileType.MOSTLY_Q4_1)
    if tokenizer:
        tokens, merges, types = _byte_vocabulary()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(0)
        writer.add_eos_token_id(0)
    if extra is not None:
        extra(writer)
    for name, tensor in model.state_dict().items():
        if name in skip or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        data = tensor.detach().float().numpy().copy()
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            data = _permute(data, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        kind = Q.F32 if data.ndim == 1 else Q.Q8_0 if "embed" in name and quant not in (Q.F32, Q.F16) else quant
        stored = data if kind == Q.F32 else data.astype(np.float16) if kind == Q.F16 else gguf.quants.quantize(data, kind)
        writer.add_tensor(_gguf_name(name), stored, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _reference(path):
    """transformers' own load of the same GGUF file (dequantised by it, Q/K un-permuted by it), in float32."""
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32).eval()


def _batches(model, vocab: int):
    tokenizer = model.tokenizer
    sentences = [torch.tensor([tokenizer.encode(text)]) for text in SENTENCES]
    random = torch.randint(0, vocab, (8, 128), generator=torch.Generator().manual_seed(0))
    return [*sentences, random]


CASES = {
    "llama-gqa-q8": dict(arch="llama", quant=Q.Q8_0),
    "llama-gqa-q4_1-tied": dict(arch="llama", quant=Q.Q4_1, tied=True),
    "llama-mha-f16": dict(arch="llama", quant=Q.F16, kv=4),
    "qwen2-gqa-q8": dict(arch="qwen2", quant=Q.Q8_0),
    # transformers' GGUF loader drops Llama's attention biases (its config never sets attention_bias), so this
    # file (F32: nothing rounded) is compared with the Hugging Face model it was written from
    "llama-gqa-f32-bias": dict(arch="llama", quant=Q.F32, bias=True, reference="original"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_equals_transformers_gguf_load(case, tmp_path):
    options = dict(CASES[case])
    arch, quant, against = options.pop("arch"), options.pop("quant"), options.pop("reference", "gguf")
    hf = _hf_model(arch, **options)
    path = write_gguf(hf, tmp_path / f"{case}.gguf", arch=arch, quant=quant)
    ours = interp.load(path, progress=False)
    reference = _reference(path) if against == "gguf" else hf
    assert type(ours).__name__ == "HookedGPT" and ours.cfg.n_key_value_heads == hf.config.num_key_value_heads
    for tokens in _batches(ours, hf.config.vocab_size):
        with torch.no_grad():
            expected, got = reference(tokens).logits, ours(tokens)
        assert (got - expected).abs().max() <= RELATIVE * expected.abs().max(), case


def test_llama_rows_are_unpermuted():
    """The permutation llama.cpp applies, undone: a query projection comes back row for row."""
    weight = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(4 * 8, 3)
    permuted = torch.from_numpy(_permute(weight.numpy(), 4))
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute(permuted, 4), weight)
    assert torch.equal(unpermute(torch.from_numpy(_permute(weight[:, 0].numpy(), 4)), 4), weight[:, 0])  # a bias


def test_notes_tokenizer_and_dequantisation_are_said(tmp_path):
    hf = _hf_model("llama")
    path = write_gguf(hf, tmp_path / "tiny.gguf", quant=Q.Q4_1)
    model = interp.load(str(path), progress=False)
    assert "dequantized from Q4_1 (" in model.load_notes[0] and "Q8_0" in model.load_notes[0]
    assert "not the original model's" in model.load_notes[0]
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in SENTENCES:
        assert model.tokenizer.encode(text) == reference.encode(text)
    assert model.to_str_tokens("the cat") == ["t", "he", " cat"]  # merges "h e" and "Ġc at" apply, "t h" is none


def test_progress_counts_every_tensor(tmp_path):
    hf = _hf_model("llama")
    path = write_gguf(hf, tmp_path / "tiny.gguf")
    seen: list[tuple[int, int]] = []
    interp.load(path, progress=lambda done, total: seen.append((done, total)))
    n_tensors = len(hf.state_dict())  # lm_head included: the model is untied
    assert seen[-1] == (n_tensors, n_tensors) and [d for d, _ in seen] == list(range(1, n_tensors + 1))


def test_missing_tokenizer_is_a_note_not_a_failure(tmp_path):
    hf = _hf_model("llama")
    path = write_gguf(hf, tmp_path / "notok.gguf", tokenizer=False)
    model = interp.load(path, progress=False)
    assert model.tokenizer is None and any("tokenizer" in note and "pass token ids" in note for note in model.load_notes)


def test_save_keeps_notes_source_and_tokenizer(tmp_path):
    hf = _hf_model("llama")
    model = interp.load(write_gguf(hf, tmp_path / "tiny.gguf"), progress=False)
    interp.save(model, tmp_path / "saved")
    again = interp.load(tmp_path / "saved")
    assert again.load_notes == model.load_notes
    assert again.metadata["source"]["gguf"] == "tiny.gguf" and again.metadata["source"]["file_type"] == "Q8_0"
    assert again.tokenizer.encode(SENTENCES[0]) == model.tokenizer.encode(SENTENCES[0])
    tokens = torch.tensor([model.tokenizer.encode(SENTENCES[1])])
    with torch.no_grad():
        assert torch.equal(again(tokens), model(tokens))


def test_heads_before_loading_reads_gguf_metadata(tmp_path):
    from interp.analyses.report import heads_before_loading

    path = write_gguf(_hf_model("llama", heads=4, kv=2), tmp_path / "tiny.gguf")
    assert heads_before_loading(str(path)) == (2, 4)


def test_hf_names_of_gguf_tensors():
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("rope_freqs.weight") is None


# ---- bad files: each refused with what is wrong and what to do, exit 2 through the CLI


def _unsupported_architecture(tmp_path):
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), arch="phi2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    return path


def _truncated(tmp_path):
    path = write_gguf(_hf_model("llama"), tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return cut


def _header_only(tmp_path):
    path = write_gguf(_hf_model("llama"), tmp_path / "whole.gguf")
    cut = tmp_path / "header.gguf"
    cut.write_bytes(path.read_bytes()[:100])
    return cut


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _split(tmp_path):
    return write_gguf(_hf_model("llama"), tmp_path / "model-00001-of-00002.gguf",
                      extra=lambda w: (w.add_uint16("split.no", 0), w.add_uint16("split.count", 2)))


def _undequantisable(tmp_path):
    hf = _hf_model("llama")

    def extra(writer):  # one weight in a type gguf reads no dequantiser for
        block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
        writer.add_tensor("blk.0.ffn_down.weight", np.zeros((64, 128 // block * size), np.uint8), raw_dtype=Q.Q8_1)
    return write_gguf(hf, tmp_path / "q81.gguf", extra=extra, skip=("model.layers.0.mlp.down_proj.weight",))


def _llama3_rope(tmp_path):
    extra = lambda w: w.add_tensor("rope_freqs.weight", np.ones(8, np.float32))  # noqa: E731
    return write_gguf(_hf_model("llama"), tmp_path / "llama3.gguf", extra=extra)


def _missing_tensor(tmp_path):
    return write_gguf(_hf_model("llama"), tmp_path / "short.gguf", skip=("model.layers.1.mlp.up_proj.weight",))


BAD_FILES = {
    "architecture": (_unsupported_architecture, BadInput, r"architecture 'phi2'.*\['llama', 'qwen2'\]"),
    "truncated": (_truncated, CheckpointError, r"cut\.gguf is a GGUF file that cannot be read to its end .*: it is "
                                               r"truncated or corrupt\. Download or copy it again"),
    "header only": (_header_only, CheckpointError, r"header\.gguf is a GGUF file that cannot be read to its end"),
    "not gguf": (lambda tmp: _write(tmp / "text.gguf", b"hello world" * 20), CheckpointError,
                 r"text\.gguf is not a GGUF file: it does not start with the GGUF magic bytes"),
    "split": (_split, CheckpointError, r"part 1 of 2 of a split GGUF.*llama-gguf-split --merge"),
    "quantisation": (_undequantisable, CheckpointError, r"types the installed gguf .* cannot dequantise: Q8_1"),
    "llama3 rope": (_llama3_rope, BadInput, r"rope_freqs\.weight.*Llama 3's rotary scaling"),
    "missing tensor": (_missing_tensor, CheckpointError, r"short\.gguf: .*no tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_gguf_files_are_refused_with_the_reason(case, tmp_path):
    make, error, match = BAD_FILES[case]
    path = make(tmp_path)
    with pytest.raises(error, match=match):
        interp.load(path, progress=False)


@pytest.mark.parametrize("case", ["architecture", "truncated", "split"])
def test_bad_gguf_files_exit_2(case, tmp_path, capsys):
    make, _, match = BAD_FILES[case]
    path = make(tmp_path)
    assert main(["verify", str(path), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "interp verify: error: cannot load model spec" in err and path.name in err


def test_gguf_refuses_other_backends(tmp_path):
    path = write_gguf(_hf_model("llama"), tmp_path / "tiny.gguf")
    with pytest.raises(BadInput, match="loads natively only"):
        interp.load(path, backend="bridge")
    assert type(interp.load(path, backend="native", progress=False)).__name__ == "HookedGPT"


def test_gguf_model_passes_verify(tmp_path, capsys):
    path = write_gguf(_hf_model("qwen2"), tmp_path / "tiny.gguf", arch="qwen2")
    assert main(["verify", str(path), "--quiet", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    assert result["n_failed"] == 0 and result["n_checks"] > 20
