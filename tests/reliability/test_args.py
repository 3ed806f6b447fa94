"""Argument validation and model outputs (issue 24, items 7, 8, 9, 11, 13, 15, 16).

One table of API calls (`API_CASES`: the call, the error class, a regex naming the value) and one
of `interp` commands (`CLI_CASES`: argv, exit code, a regex for stderr), each case tagged with its
item of issue 24; below them the calls that must now *work*: half precision on the CPU, a model
whose forward returns a dict or a tuple with `output=` / `--logits-key`, a model whose context length
is a nanoGPT `block_size`, a single Claim, a head type whose offset no prompt reaches.
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest
import torch

import interp
from interp import cli, data, validate
from interp.analyses import claims, head_types, induction, positional, redundancy
from interp.analyses.claims import pair as pair_claims
from interp.claims import test_claims as run_claims_table
from interp.errors import BadInput, BadType, exit_code_for
from interp.models import GPTConfig, HookedGPT
from interp.specs import ClaimsFileError, parse_claims_text

VOCAB, N_CTX = 40, 32
TESTS = Path(__file__).resolve().parents[1]

USER_MODELS = '''
"""Users' models for tests/reliability/test_args.py: odd outputs, a short context, the meta device."""
import torch

from own_models import NanoArgs, NanoStyleGPT


class DictLogits(NanoStyleGPT):
    def forward(self, idx):
        return {"logits": super().forward(idx), "aux": torch.zeros(())}


class DictScores(NanoStyleGPT):
    def forward(self, idx):
        logits = super().forward(idx)
        return {"scores": logits, "hidden": torch.ones(*logits.shape[:2], 32)}


class HiddenLogits(NanoStyleGPT):
    def forward(self, idx):
        logits = super().forward(idx)
        return torch.ones(*logits.shape[:2], 32), logits


def nano24():
    return NanoStyleGPT(NanoArgs(block_size=24)).eval()


def dict_logits():
    return DictLogits().eval()


def dict_scores():
    return DictScores().eval()


def hidden_logits():
    return HiddenLogits().eval()


def on_meta():
    with torch.device("meta"):
        return NanoStyleGPT().eval()
'''


def tiny() -> HookedGPT:
    return HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=VOCAB, n_ctx=N_CTX, seed=0)).eval()


def rotary() -> HookedGPT:
    return HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=VOCAB, n_ctx=N_CTX, seed=0,
                               positional_embedding_type="rotary")).eval()


def repeated(n: int = 8, prefix_len: int = 4) -> data.PromptSet:
    return data.repeated_tokens(n, prefix_len, VOCAB, seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("args")
    (root / "userpkg_args.py").write_text(USER_MODELS)
    (root / "claims.toml").write_text('[prompts]\nn = 16\n[claims]\nL1H0 = "previous_token"\n')
    (root / "self_pair.toml").write_text('[claims]\n"L0H1 ~ L0H1" = "redundant"\n')
    return root


@pytest.fixture(autouse=True)
def _paths_and_registry(files, monkeypatch):
    """The user package and tests/own_models on sys.path; the head-type registry restored after each test."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.syspath_prepend(str(files))
    saved = dict(head_types.HEAD_TYPES)
    yield
    head_types.HEAD_TYPES.clear()
    head_types.HEAD_TYPES.update(saved)


def _register(**fields):
    values = {"name": "user_type", "statement": "{label} is a user type (> {threshold:g})", "target": head_types.offset_target(-2)}
    return lambda f: head_types.register(head_types.HeadType(**{**values, **fields}))


def _nano(name: str):
    return lambda: interp.load(f"userpkg_args:{name}")


def _api_cases():
    prev = claims.previous_token_head(0, 1)
    p = repeated()
    return [
        # --- item 7: head-type arguments
        ("7 offset_target(0.7)", lambda f: head_types.offset_target(0.7), BadType, r"k=0\.7.*whole number"),
        ("7 OffsetTarget('1')", lambda f: head_types.OffsetTarget("1"), BadType, r"k='1'"),
        ("7 offset_target(True)", lambda f: head_types.offset_target(True), BadType, r"k=True"),
        ("7 offset_type(0.7)", lambda f: head_types.offset_type(0.7), BadType, r"k=0\.7"),
        ("7 WindowTarget(-1)", lambda f: head_types.WindowTarget(-1), BadInput, r"window=-1"),
        ("7 threshold nan", _register(threshold=math.nan), BadInput, r"threshold=nan.*\[0, 1\]"),
        ("7 threshold 5.0", _register(threshold=5.0), BadInput, r"threshold=5\.0.*\[0, 1\]"),
        ("7 threshold '0.5'", _register(threshold="0.5"), BadInput, r"threshold='0\.5'"),
        ("7 sufficiency 2.0", _register(sufficiency=2.0), BadInput, r"sufficiency=2\.0"),
        ("7 name 'redundant'", _register(name="redundant"), BadInput, r"'redundant'.*claim"),
        ("7 name 'not'", _register(name="not"), BadInput, r"'not'.*claims-file syntax"),
        ("7 name 'NOT'", _register(name="NOT"), BadInput, r"'NOT'"),
        ("7 name 'backs_up'", _register(name="backs_up"), BadInput, r"'backs_up'"),
        ("7 name 'dispensable'", _register(name="dispensable"), BadInput, r"'dispensable'"),
        ("7 name 'causal'", _register(name="causal"), BadInput, r"'causal'"),
        ("7 name 'model'", _register(name="model"), BadInput, r"'model'"),
        ("7 target raises", _register(target=lambda batch: batch.tokens.nope), BadInput,
         r"user_type.*target raised AttributeError.*tried on"),
        ("7 target wrong shape", _register(target=lambda batch: batch.real), BadInput, r"user_type.*\(batch, query, key\)"),
        ("7 target float mask", _register(target=lambda batch: batch.allowed.float()), BadInput, r"torch\.float32"),
        ("7 queries raise", _register(queries=lambda batch: 1 / 0), BadInput, r"queries raised ZeroDivisionError"),
        # --- item 15: registration
        ("15 target returns None", _register(target=lambda batch: None), BadInput, r"target returned None"),
        ("15 statement unknown field", _register(statement="{label} reaches {reach}"), BadInput,
         r"statement.*\{reach\}.*\{label\}, \{threshold\}"),
        ("15 statement bad format", _register(statement="{label} {threshold:q}"), BadInput, r"statement"),
        ("15 not a HeadType", lambda f: head_types.register("two_back"), BadType, r"got str"),
        # --- item 8: layers, seeds, a head paired with itself
        ("8 focus layers=[0.5]", lambda f: positional.focus(tiny(), p, layers=[0.5]), BadType, r"layers=\[0\.5\].*0\.5"),
        ("8 focus layers=['0']", lambda f: positional.focus(tiny(), p, layers=["0"]), BadType, r"'0'"),
        ("8 focus layers=[True]", lambda f: positional.focus(tiny(), p, layers=[True]), BadType, r"True"),
        ("8 focus layers=[7]", lambda f: positional.focus(tiny(), p, layers=[7]), BadInput, r"layers \[7\] do not exist"),
        ("8 offset_profile layers=[0.5]", lambda f: positional.offset_profile(tiny(), p, layers=[0.5]), BadType, r"0\.5"),
        ("8 induction layers=[1.5]", lambda f: induction.scores(tiny(), p, layers=[1.5]), BadType, r"1\.5"),
        ("8 focus seed='a'", lambda f: positional.focus(tiny(), p, seed="a"), BadType, r"seed='a'"),
        ("8 focus seed=-1", lambda f: positional.focus(tiny(), p, seed=-1), BadInput, r"seed=-1.*\[0, 2\*\*32 - 1\]"),
        ("8 focus seed=2**70", lambda f: positional.focus(tiny(), p, seed=2**70), BadInput, rf"seed={2**70}"),
        ("8 focus seed=1.5", lambda f: positional.focus(tiny(), p, seed=1.5), BadType, r"seed=1\.5"),
        ("8 focus seed=True", lambda f: positional.focus(tiny(), p, seed=True), BadType, r"seed=True"),
        ("8 induction seed=-1", lambda f: induction.scores(tiny(), p, seed=-1), BadInput, r"seed=-1"),
        ("8 test_claims seed='a'", lambda f: run_claims_table(tiny(), [prev], p, seed="a"), BadType, r"seed='a'"),
        ("8 scan seed=2**70", lambda f: claims.scan(tiny(), p, seed=2**70), BadInput, rf"seed={2**70}"),
        ("8 importance seed=-1", lambda f: redundancy.importance(tiny(), p, seed=-1), BadInput, r"seed=-1"),
        ("8 redundant self pair", lambda f: pair_claims.redundant_claim((0, 1), (0, 1)), BadInput, r"L0H1 with itself"),
        ("8 backs_up self pair", lambda f: pair_claims.backup_claim("L1H0", (1, 0)), BadInput, r"L1H0 with itself"),
        ("8 claims file self pair", lambda f: parse_claims_text('[claims]\n"L0H1 ~ L0H1" = "redundant"\n', "c.toml"),
         ClaimsFileError, r"c\.toml:2:1: .*L0H1 with itself"),
        # --- item 16: argument types
        ("16 focus(m, tensor)", lambda f: positional.focus(tiny(), p.tokens), BadType,
         r"torch\.Tensor of shape \(8, 8\).*interp\.data\.PromptSet\(tokens\)"),
        ("16 focus(m, list)", lambda f: positional.focus(tiny(), p.tokens.tolist()), BadType, r"list.*interp\.data\.pad"),
        ("16 focus(m, None)", lambda f: positional.focus(tiny(), None), BadType, r"None.*repeated_tokens"),
        ("16 focus(P, m)", lambda f: positional.focus(p, tiny()), BadType, r"swapped.*focus\(model, prompts\)"),
        ("16 focus('toy', P)", lambda f: positional.focus("toy-induction", p), BadType, r"interp\.load\('toy-induction'\)"),
        ("16 induction(m, tensor)", lambda f: induction.scores(tiny(), p.tokens), BadType, r"PromptSet\(tokens\)"),
        ("16 offset_profile(P, m)", lambda f: positional.offset_profile(p, tiny()), BadType, r"swapped"),
        ("16 importance(m, list)", lambda f: redundancy.importance(tiny(), [[1, 2, 3]]), BadType, r"interp\.data\.pad"),
        ("16 test_claims(m, 'L0H1')", lambda f: run_claims_table(tiny(), "L0H1", p), BadType, r"a Claim or a list.*got str"),
        ("16 test_claims(m, [claim, 3])", lambda f: run_claims_table(tiny(), [prev, 3], p), BadType, r"expected Claim objects, got int \(3\)"),
        ("16 test_claims(m, claim, tensor)", lambda f: run_claims_table(tiny(), prev, p.tokens), BadType, r"PromptSet\(tokens\)"),
        ("16 test_claims(P, claims, m)", lambda f: run_claims_table(p, [prev], tiny()), BadType, r"swapped"),
        ("16 scan(m, tensor)", lambda f: claims.scan(tiny(), p.tokens), BadType, r"PromptSet\(tokens\)"),
        # --- item 13: model outputs, the meta device
        ("13 load output=3.5", lambda f: interp.load("toy-induction", output=3.5), BadType, r"output=3\.5"),
        ("13 dict without logits", lambda f: interp.verify_hooks(_nano("dict_scores")()), BadInput,
         r"returned a dict \{'scores': tensor \(\d+, \d+, 61\), 'hidden'.*output='scores'.*--logits-key"),
        ("13 (hidden, logits)", lambda f: interp.verify_hooks(_nano("hidden_logits")()), BadInput,
         r"returned a tuple \(tensor \(\d+, \d+, 32\), tensor \(\d+, \d+, 61\)\).*output=1"),
        ("13 (hidden, logits) importance", lambda f: redundancy.importance(_nano("hidden_logits")(), data.random_tokens(8, 6, 61)),
         BadInput, r"returned a tuple"),
        ("13 dict: output names no key", lambda f: interp.verify_hooks(interp.load("userpkg_args:dict_scores", output="logits")),
         BadInput, r"output='logits'.*keys \['scores', 'hidden'\]"),
        ("13 tuple: output index too big", lambda f: interp.verify_hooks(interp.load("userpkg_args:hidden_logits", output=2)),
         BadInput, r"output=2.*2 elements"),
        ("13 meta model load", lambda f: interp.load("userpkg_args:on_meta"), BadInput, r"meta device"),
        ("13 meta model focus", lambda f: positional.focus(tiny().to("meta"), p), BadInput, r"meta device.*load_state_dict"),
    ]


API_CASES = _api_cases()


@pytest.mark.parametrize("name, call, error, match", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_arguments(name, call, error, match, files):
    with pytest.raises(error, match=match) as info:
        call(files)
    assert exit_code_for(info.value) == 2, f"{name}: {type(info.value).__name__} would exit {exit_code_for(info.value)}"


def _cli_cases():
    return [
        # item 11: half precision on the shipped model
        (["heads", "toy-induction", "--dtype", "float16", "--n", "8"], 0, None),
        (["heads", "toy-induction", "--dtype", "bfloat16", "--n", "8"], 0, None),
        (["verify", "toy-induction", "--dtype", "float16"], 0, None),
        (["verify", "toy-induction", "--dtype", "bfloat16"], 0, None),
        (["scan", "toy-induction", "--dtype", "bfloat16", "--n", "16"], 0, None),
        (["scan", "toy-induction", "--dtype", "float16", "--n", "16"], 0, None),
        # item 13: dict / tuple outputs, --logits-key (issue 37: formerly --output), the meta device
        (["verify", "userpkg_args:dict_logits"], 0, None),
        (["verify", "userpkg_args:dict_scores"], 2, r"returned a dict \{'scores'.*--logits-key scores"),
        (["verify", "userpkg_args:dict_scores", "--logits-key", "scores"], 0, None),
        (["verify", "userpkg_args:dict_scores", "--output", "scores"], 2, r"--output was renamed --logits-key .*pass "
                                                                            r"--logits-key scores"),
        (["verify", "userpkg_args:hidden_logits"], 2, r"returned a tuple \(tensor.*--logits-key 1"),
        (["verify", "userpkg_args:hidden_logits", "--logits-key", "1"], 0, None),
        (["verify", "userpkg_args:hidden_logits", "--logits-key", "5"], 2, r"output=5.*2 elements"),
        (["claims", "userpkg_args:dict_logits", "{f}/claims.toml"], 0, None),
        (["claims", "userpkg_args:hidden_logits", "{f}/claims.toml"], 2, r"returned a tuple"),
        (["claims", "userpkg_args:hidden_logits", "{f}/claims.toml", "--logits-key", "1"], 0, None),
        (["heads", "userpkg_args:on_meta"], 2, r"meta device"),
        (["verify", "userpkg_args:on_meta"], 2, r"meta device"),
        # item 8: a head paired with itself
        (["claims", "toy-induction", "{f}/self_pair.toml"], 2, r"self_pair\.toml:2:1: .*L0H1 with itself"),
        # item 9: a context length that is not cfg.n_ctx
        (["report", "userpkg_args:nano24", "--out", "{f}/r24", "--n", "8", "--force"], 0, None),
        (["report", "userpkg_args:nano24", "--out", "{f}/r24b", "--n", "8", "--max-len", "30"], 2,
         r"--max-len 30 exceeds .*context.*24"),
    ]


CLI_CASES = _cli_cases()


@pytest.mark.parametrize("argv, code, match", CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_cli_arguments(argv, code, match, files, capsys):
    argv = [a.replace("{f}", str(files)) for a in argv]
    try:
        got = cli.main([*argv, "-q"])
    except SystemExit as exit_:  # argparse's own usage errors
        got = exit_.code
    err = capsys.readouterr().err
    assert got == code, err
    if match is not None:
        assert re.search(match, err, re.S), err
    assert "Traceback" not in err and "internal error" not in err


# --------------------------------------------------------------------------- what must work now


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_on_a_rotary_model(dtype):
    """Item 11: the rotary cos / sin were float32 and promoted q and k (heads, verify, scan, focus exited 3)."""
    model = rotary()
    frame = positional.focus(model, repeated(), dtype=dtype)
    reference = positional.focus(model, repeated())
    assert (frame["prev_token"] - reference["prev_token"]).abs().max() < 0.05
    half = model.to(getattr(torch, dtype))
    assert half(repeated().tokens).dtype == getattr(torch, dtype)
    assert bool(interp.verify_hooks(half)["passed"].all())


def test_float32_rotary_numbers_unchanged():
    """The cast is a no-op in float32: the rotary model's logits equal cos / sin applied by hand."""
    from interp.models.components import apply_rotary, rotary_angles

    x = torch.randn(2, 2, 5, 8)
    cos, sin = rotary_angles(torch.arange(5).expand(2, 5), torch.rand(4))
    assert apply_rotary(x, cos, sin).dtype == torch.float32
    assert apply_rotary(x.half(), cos, sin).dtype == torch.float16


def test_report_reads_the_models_context_length(files):
    """Item 9: analyses/report.py read cfg.n_ctx only; a nanoGPT-style block_size of 24 failed the leakage stage."""
    from interp.analyses import report

    model = interp.load("userpkg_args:nano24")
    result = report.compute(model, prompts=data.random_tokens(8, 12, 61), heads=[(0, 0)])
    assert result is not None


def test_a_single_claim_is_accepted():
    """Item 16: test_claims(m, claim) raised TypeError ('Claim' object is not iterable)."""
    table = run_claims_table(tiny(), claims.previous_token_head(0, 1), repeated(16), evidence=["observational"])
    assert list(table["label"]) == ["L0H1"]


def test_dict_with_logits_and_output_selector_measure_the_same(files):
    """Item 13: a forward returning {"logits": ...} and one returning (hidden, logits) with output=1
    give the plain model's numbers (they crashed with exit 3, or used the hidden states as logits)."""
    prompts = data.random_tokens(8, 10, 61, seed=1)
    plain = redundancy.importance(interp.load("own_models:nanogpt_flash"), prompts)
    for model in (interp.load("userpkg_args:dict_logits"), interp.load("userpkg_args:hidden_logits", output=1),
                  validate.select_output(interp.load("userpkg_args:dict_scores"), "scores")):
        got = redundancy.importance(model, prompts)
        assert torch.allclose(torch.tensor(got["delta_loss"].to_numpy()), torch.tensor(plain["delta_loss"].to_numpy()))


def test_a_failed_registration_leaves_every_analysis_working():
    """Item 7: a registered type whose target fails made every later analysis fail, built-ins included."""
    before = dict(head_types.HEAD_TYPES)
    with pytest.raises(BadInput):
        head_types.register(head_types.HeadType("broken", "{label} x", lambda batch: None))
    assert head_types.HEAD_TYPES == before
    assert "prev_token" in positional.focus(tiny(), repeated()).columns


def test_an_offset_no_prompt_reaches_is_undefined_not_a_crash():
    """Items 7 and 15: offset_target(-50) on 8-token prompts raised a size mismatch in focus and scan; a registered
    type never defined on a model (two tokens ahead on a causal one) made scan raise a bare Inconclusive."""
    head_types.register(head_types.HeadType("far_back", "{label} attends 50 back (> {threshold:g})", head_types.offset_target(-50)))
    head_types.register(head_types.HeadType("two_ahead", "{label} attends 2 ahead (> {threshold:g})", head_types.offset_target(2)))
    frame = positional.focus(tiny(), repeated())
    assert frame["far_back"].isna().all() and frame["two_ahead"].isna().all()
    table = claims.scan(tiny(), repeated(16), evidence=["observational"])
    assert len(table) >= 4 and not table["claim"].isin(["far_back", "two_ahead"]).any()


def test_validate_is_the_one_helper():
    """The helpers every entry point calls (named for the Run object of the architecture issue)."""
    assert validate.check_seed(7) == 7 and validate.check_layers(None) is None
    assert validate.check_layers([1, 0, 1]) == (0, 1)
    assert validate.check_prompt_arg(repeated()) is not None
    assert validate.check_model(tiny()) is not None
    with pytest.raises(BadInput, match=r"myfunc: seed=-3"):
        validate.check_seed(-3, "myfunc")


def test_claims_file_pairs_still_parse():
    """The self-pair check leaves a real pair alone."""
    parsed = parse_claims_text(textwrap.dedent('[claims]\n"L0H1 ~ L0H3" = "redundant"\n'), "c.toml")
    assert parsed.claims[0].heads == ((0, 1), (0, 3))
