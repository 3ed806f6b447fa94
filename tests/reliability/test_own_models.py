"""Users' own models through every command: nn.TransformerEncoder LMs, nanoGPT-style models and
nanoGPT checkpoints (own_models.py holds the models, written as a user would)."""
import dataclasses

import pytest
import torch
from own_models import EncoderLM, NanoArgs, NanoStyleGPT

import interp
from interp import cli
from interp.analyses.induction import copying_scores
from interp.errors import CheckpointError
from interp.hooks import attention_sites
from interp.modelinfo import context_length, ov_weights, token_embedding, unembedding, vocab_size
from interp.models import HookedGPT
from interp.models.nanogpt import from_nanogpt
from interp.verify import verify_hooks


def tokens(d_vocab, n_pos=12, batch=3, seed=1):
    return torch.randint(0, d_vocab, (batch, n_pos), generator=torch.Generator().manual_seed(seed))


def save_nanogpt(model: NanoStyleGPT, path, compiled: bool = False):
    state = {("_orig_mod." if compiled else "") + k: v for k, v in model.state_dict().items()}
    torch.save({"model": state, "model_args": dataclasses.asdict(model.config), "iter_num": 5,
                "best_val_loss": 1.5, "config": {"learning_rate": 6e-4}}, path)
    return path


# --------------------------------------------------------------------------- nanoGPT checkpoints


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_checkpoint_round_trip(tmp_path, flash, bias):
    original = NanoStyleGPT(NanoArgs(bias=bias), flash=flash).eval()
    path = save_nanogpt(original, tmp_path / "ckpt.pt", compiled=bias)
    model = interp.load(path)
    assert isinstance(model, HookedGPT) and model.cfg.n_ctx == 32 and model.cfg.d_vocab == 61
    x = tokens(61, 32, batch=4)
    with torch.no_grad():
        diff = (model(x) - original(x)).abs().max().item()
    assert diff < 1e-4
    frame = verify_hooks(model)
    assert frame["passed"].all()


def test_non_nanogpt_checkpoints_are_refused(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a nanoGPT checkpoint.*'model_args' and 'model'"):
        interp.load(tmp_path / "other.pt")
    args = dataclasses.asdict(NanoArgs())
    state = NanoStyleGPT().state_dict()
    torch.save({"model": {k: v for k, v in state.items() if "ln_f" not in k}, "model_args": args}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="no 'transformer.ln_f.weight'"):
        interp.load(tmp_path / "a.pt")
    torch.save({"model": {**state, "extra.weight": torch.zeros(3)}, "model_args": args}, tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match="does not know: \\['extra.weight'\\]"):
        interp.load(tmp_path / "b.pt")
    torch.save({"model": state, "model_args": {**args, "n_embd": 48}}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="shape"):
        interp.load(tmp_path / "c.pt")


class Payload:
    """Anything but tensors and plain data: weights_only=True must refuse to unpickle it."""


def test_nanogpt_checkpoint_is_never_unpickled(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "model_args": {}, "payload": Payload()}, path)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        interp.load(path)


# --------------------------------------------------------------------------- modelinfo on plain models


def test_output_logits_of_every_output_kind():
    from transformers.modeling_outputs import CausalLMOutput

    from interp.modelinfo import output_logits

    logits = torch.randn(2, 3, 5)
    assert output_logits(logits) is logits
    assert output_logits(CausalLMOutput(logits=logits)) is logits
    assert output_logits((logits, None)) is logits  # nanoGPT's (logits, loss)
    assert output_logits({"logits": logits, "loss": None}) is logits
    from interp.errors import BadInput

    for other, said in [("other", "a str"), ((logits[..., :2], logits), r"a tuple \(tensor \(2, 3, 2\), tensor"),
                        ({"scores": logits, "hidden": logits}, "a dict")]:  # issue 24: never passed on unchanged
        with pytest.raises(BadInput, match=said):
            output_logits(other)


def test_a_positional_table_longer_than_the_vocabulary_is_not_the_token_embedding():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(50, 8), torch.nn.Embedding(64, 8)

    assert vocab_size(Plain()) == 50 and context_length(Plain()) == 64


def test_modelinfo_reads_plain_models():
    encoder = EncoderLM()
    assert vocab_size(encoder) == 53 and context_length(encoder) == 48
    assert token_embedding(encoder) is encoder.tok.weight
    assert torch.equal(unembedding(encoder), encoder.head.weight.t())
    nano = NanoStyleGPT()
    assert vocab_size(nano) == 61 and context_length(nano) == 32  # config.vocab_size, config.block_size


def test_ov_weights_of_intercepted_and_mha_models_match_their_computation():
    """Known answer: the per-head maps read from the projections reproduce the hooked v and result."""
    nano = interp.load(NanoStyleGPT().eval())
    converted = from_nanogpt(dataclasses.asdict(nano.config), nano.state_dict())
    site = attention_sites(nano)[1]
    ov = ov_weights(nano, site)
    assert torch.allclose(ov.W_V, converted.blocks[1].attn.W_V) and torch.allclose(ov.W_O, converted.blocks[1].attn.W_O)

    encoder = interp.load(EncoderLM().eval())
    site = attention_sites(encoder)[0]
    ov = ov_weights(encoder, site)
    x = tokens(53)
    _, cache = encoder.run_with_cache(x)
    z = cache[site.hook("z")]  # (batch, pos, head, d_head)
    result = torch.einsum("bphd,hdm->bphm", z, ov.W_O)
    assert torch.allclose(result, cache[site.hook("result")], atol=1e-5)
    attn_in = encoder.encoder.layers[0].norm1(encoder.tok(x) + encoder.pos(torch.arange(12)))
    b_v = encoder.encoder.layers[0].self_attn.in_proj_bias.chunk(3)[2].view(4, 8)
    v = torch.einsum("bpm,hmd->bphd", attn_in, ov.W_V) + b_v
    assert torch.allclose(v, cache[site.hook("v")], atol=1e-5)


def test_copying_scores_on_plain_models():
    from own_models import hf_gpt2

    for model in (interp.load(EncoderLM().eval()), interp.load(NanoStyleGPT().eval()),
                  interp.load(hf_gpt2(), backend="sdpa")):
        scores = copying_scores(model)
        assert scores.shape == (2, 4) and torch.isfinite(scores).all() and scores.abs().max() <= 1


def test_copying_score_reads_the_intercepted_projections():
    """Known answer: a head whose OV circuit maps each token's embedding onto its own logit copies (+1)."""
    from own_models import DirectSDPA

    model = DirectSDPA(vocab=24, d_model=24, n_heads=3)
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(24))
        model.qkv.weight[48:].copy_(torch.eye(24))  # v = x
        model.proj.weight.copy_(torch.eye(24))
        model.proj.weight[8:16] *= -1  # head 1 writes the negated token: anti-copying
        model.unembed.weight.copy_(torch.eye(24))
    scores = copying_scores(interp.load(model.eval()))
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-6) and scores[0, 2] == pytest.approx(1.0, abs=1e-6)
    assert scores[0, 1] == pytest.approx(-1.0, abs=1e-6)


# --------------------------------------------------------------------------- nn.TransformerEncoder LM


def test_encoder_lm_is_causal_and_verified_on_token_ids():
    model = interp.load(EncoderLM().eval())
    assert [s.causal for s in attention_sites(model)] == [True, True]  # seen from the mask its caller passes
    frame = verify_hooks(model)  # token ids from its nn.Embedding (it used to be fed floats)
    assert frame["passed"].all(), frame[~frame["passed"]].to_string()
    assert (frame.check == "scores_masked_inf").sum() == 2


COMMANDS = {
    "verify": ["verify", "own_models:encoder_lm"],
    "verify_hf_gpt2": ["verify", "own_models:hf_gpt2", "--backend", "sdpa"],
    "verify_nanogpt_manual": ["verify", "own_models:nanogpt_manual"],
    "heads": ["heads", "own_models:encoder_lm", "--n", "8"],
    "scan": ["scan", "own_models:encoder_lm", "--n", "8"],
    "audit": ["audit-leakage", "own_models:encoder_lm", "--max-len", "10", "--n", "4"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_encoder_lm_through_the_cli(command, capsys):
    assert cli.main([*COMMANDS[command], "-q"]) == 0, capsys.readouterr().err


def test_encoder_lm_claims_file(tmp_path, capsys):
    claims = tmp_path / "claims.toml"
    claims.write_text('model = "own_models:encoder_lm"\n[prompts]\nkind = "repeated"\nn = 32\n'
                      '[claims]\nmodel = "causal"\nL0H1 = "not induction"\n')
    assert cli.main(["claims", str(claims), "--strict", "-q"]) == 0, capsys.readouterr()


@pytest.mark.heavy
@pytest.mark.parametrize("spec", ["own_models:encoder_lm", "own_models:nanogpt_flash", "own_models:hf_gpt2"])  # ~10 s each
def test_report_on_plain_models_given_as_factories(spec, tmp_path, capsys):
    out = tmp_path / "report"
    backend = ["--backend", "sdpa"] if spec.endswith("hf_gpt2") else []  # auto would convert GPT-2 natively
    assert cli.main(["report", spec, "--n", "8", "--out", str(out), "-q", *backend]) == 0, capsys.readouterr().err
    assert (out / "report.html").exists() and (out / "heads.csv").exists()
    heads = (out / "heads.csv").read_text()
    assert "copying" in heads and "importance" in heads  # copying weights read; causal LM so ablations ran


@pytest.mark.parametrize("argv, message", [
    (["verify", "own_models:einsum_lm"], "per-head hooks are unavailable"),
    (["report", "own_models:einsum_lm", "--out", "unused-report-dir"], "black box"),
    (["verify", "own_models:fails_on_tokens"], "failed on the probe input"),
    (["verify", "own_models:encoder_lm_fails_on_tokens"], "failed on token ids"),
])
def test_bad_models_exit_2_with_the_reason(argv, message, capsys):
    assert cli.main([*argv, "-q"]) == 2
    assert message in capsys.readouterr().err


def test_bad_checkpoint_exits_2(tmp_path, capsys):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "ckpt.pt")
    assert cli.main(["verify", str(tmp_path / "ckpt.pt"), "-q"]) == 2
    assert "not a nanoGPT checkpoint" in capsys.readouterr().err


def test_unrecognised_attention_keeps_the_black_box_audit(capsys):
    assert cli.main(["audit-leakage", "own_models:einsum_lm", "--max-len", "8", "--n", "2", "-q"]) == 0


def test_redundancy_checks_prompts_against_a_plain_models_vocabulary():
    from interp.analyses import redundancy
    from interp.data import PromptSet, repeated_tokens

    model = interp.load(EncoderLM().eval())
    importance = redundancy.importance(model, repeated_tokens(8, 5, 53, seed=0), "mean", gradient=False)
    assert len(importance) == 8 and importance["delta_loss"].notna().all()
    with pytest.raises(ValueError, match="outside the model's vocabulary \\[0, 53\\)"):
        redundancy.importance(model, PromptSet(torch.full((8, 6), 60)), "mean", gradient=False)


def test_modelinfo_reexports_the_config_facts_of_modelconfig():
    from interp import modelconfig, modelinfo

    for name in ("model_config", "vocab_size", "context_length", "CONTEXT_FIELDS", "VOCAB_FIELDS"):
        assert getattr(modelinfo, name) is getattr(modelconfig, name)
    assert modelconfig.vocab_size(torch.nn.Embedding(11, 4)) == 11 and modelconfig.context_length(dataclasses.make_dataclass("M", [("config", dict)])({"n_ctx": 7})) == 7


# --------------------------------------------------------------------------- a user's trained nanoGPT fork: claims


def test_a_users_nanogpt_fork_gets_its_induction_heads_supported_by_default():
    """The user's call (test_claims, default evidence) on a nanoGPT fork hooked by interception, with trained weights
    (own_models.rotary_gpt_trained: toy-induction's). Before issue 42 the random-init control could not copy the
    module and every claim was "inconclusive"; now the control re-initialises a copy and the induction heads are
    supported, while layer 0's heads (previous-token heads, no induction) are refuted."""
    from own_models import rotary_gpt_trained

    from interp.analyses.claims import induction_head

    model = interp.load(rotary_gpt_trained())
    assert type(model).__name__ == "SDPAHookedRotaryGPT"
    prompts = interp.repeated_tokens(64, 7, 255, seed=5)  # prefix length 7: held out of toy-induction's training
    table = interp.test_claims(model, [induction_head(1, 0), induction_head(1, 3), induction_head(0, 0)], prompts)
    found, other, layer0 = table.attrs["verdicts"]
    for verdict in (found, other):
        assert verdict.verdict == "supported", verdict.reasons
        assert verdict.p_adjusted < 0.05
        control = verdict.get("control_random_init")  # ran: a re-initialised copy of the intercepted module
        assert control.passed is True and control.extra["initialised_by"] == "reset"
        assert control.extra["random_init"] < 0.5 < verdict.get("observational").effect
        assert {e.kind for e in verdict.evidence} >= {"observational", "control_shuffled", "necessity", "sufficiency"}
    assert layer0.verdict == "refuted"
