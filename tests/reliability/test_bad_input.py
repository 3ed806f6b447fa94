"""Every public entry point x bad input: the right error class, a message naming the value (issue 11).

Two tables: the Python API (`API_CASES`: a call, the exception class it must raise, a regex the
message must match, which names the offending value) and the `interp` command (`CLI_CASES`:
argv, the exit code, a regex for stderr). "Huge" inputs go through the size estimate and never
allocate. Below them, property-based tests (hypothesis) of the prompt-file and claims-file
parsers and of PromptSet: whatever the input, either a valid result or the documented error
class with a message that names the file or the value, never another exception.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interp import cli, data, outdir
from interp.errors import BadInput, CheckpointError, ModelError, exit_code_for
from interp.models import GPTConfig, HookedGPT
from interp.specs import ClaimsFile, ClaimsFileError, PromptSpec, SpecError, _json_prompts, parse_claims_text

VOCAB, N_CTX = 40, 32


def tiny() -> HookedGPT:
    return HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=VOCAB, n_ctx=N_CTX, seed=0)).eval()


def with_nan(model: HookedGPT) -> HookedGPT:
    with torch.no_grad():
        model.blocks[1].attn.W_V[0, 0, 0] = float("nan")
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad files of every kind, written once: checkpoints (corrupt, truncated, edited), prompt and claims files,
    and a user package whose factories and models raise."""
    root = tmp_path_factory.mktemp("bad")
    from interp import save

    good = root / "good"
    save(tiny(), good)
    for name, edit in {"arch": ("architecture", "EncoderConfig"), "act": ("act_fn", "relu"), "eps": ("layer_norm_eps", 0.1)}.items():
        save(tiny(), root / name)
        document = json.loads((root / f"{name}.json").read_text())
        document["config"][edit[0]] = edit[1]
        (root / f"{name}.json").write_text(json.dumps(document))
    save(tiny(), root / "strcfg")
    (root / "strcfg.json").write_text(json.dumps({"config": "x", "metadata": {}}))
    save(tiny(), root / "corrupt")
    (root / "corrupt.safetensors").write_bytes(b"\x00garbage" * 10)
    save(tiny(), root / "truncated")
    blob = (root / "truncated.safetensors").read_bytes()
    (root / "truncated.safetensors").write_bytes(blob[: len(blob) // 2])
    save(with_nan(tiny()), root / "nanw")
    (root / "hf_noweights").mkdir()
    (root / "hf_noweights" / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    (root / "hf_junk").mkdir()
    (root / "hf_junk" / "config.json").write_text("not json")
    (root / "floats.json").write_text("[[1.5, 2]]")
    (root / "negative.json").write_text("[[1, -3]]")
    (root / "strings.json").write_text('[["a", 2]]')
    (root / "bools.json").write_text("[[true, 2]]")
    (root / "empty.json").write_text("[]")
    (root / "emptyrow.json").write_text("[[1, 2], []]")
    (root / "toobig.json").write_text(f"[[1, {VOCAB + 7}]]")
    (root / "notjson.json").write_text("[[1, 2")
    (root / "ragged.json").write_text(json.dumps([[3, 4, 5, 3, 4, 5], [6, 7, 6, 7]] * 6))
    (root / "blank.txt").write_text("\n# only a comment\n")
    (root / "claims.toml").write_text('[claims]\nL1H0 = "induction"\n')
    (root / "badclaims.toml").write_text('[claims]\nL1H0 = "inductoin"\n')
    package = root / "userpkg_bad"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        import torch
        from interp.models import GPTConfig, HookedGPT

        def raising_factory():
            raise RuntimeError("factory cannot find its weights")

        def int_factory():
            return 3

        class Exploding(HookedGPT):
            def forward(self, tokens, *args, **kwargs):
                raise ZeroDivisionError("the user's forward divides by zero")

        def exploding():
            return Exploding(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=40, n_ctx=32, seed=0))

        def black_box():
            return torch.nn.Linear(4, 4)
        '''))
    return root


@pytest.fixture(autouse=True)
def _user_package(files, monkeypatch):
    monkeypatch.syspath_prepend(str(files))


def _repeated(n=8, prefix_len=4):
    return data.repeated_tokens(n, prefix_len, VOCAB, seed=0)


def _api_cases():
    from interp.analyses import induction, positional, redundancy
    from interp.analyses.leakage import audit
    from interp.heads import parse_head
    from interp.interventions import substitute_pattern
    from interp.specs import build_prompts, parse_layers_flag

    def load(spec):
        import interp

        return lambda f: interp.load(spec if spec.startswith(("userpkg", "toy")) or not spec.strip() else str(f / spec))

    def huge_cache(f):
        from interp.models import components

        model = tiny()
        real = components._available_bytes
        components._available_bytes = lambda device: 1 << 20  # 1 MiB free: the estimate refuses, nothing allocates
        try:
            model.run_with_cache(torch.zeros(64, N_CTX, dtype=torch.long))
        finally:
            components._available_bytes = real

    def forward(**kwargs):
        tokens = kwargs.pop("tokens", torch.zeros(2, 4, dtype=torch.long))
        return lambda f: tiny()(tokens, **kwargs)

    def substitute(pattern):
        def run(f):
            model = tiny()
            with substitute_pattern(model, 0, 0, pattern):
                model(torch.zeros(1, 4, dtype=torch.long))
        return run

    cases = [
        # --- loading: specs, checkpoints, factories
        ("load empty spec", load(""), BadInput, r"empty \(''\)"),
        ("load blank spec", load("   "), BadInput, r"empty \('   '\)"),
        ("load int", lambda f: __import__("interp").load(3), TypeError, "from a int"),
        ("load unknown name", load("toy-inductoin"), ValueError, r"'toy-inductoin'.*Did you mean \['toy-induction'\]"),
        ("load corrupt safetensors", load("corrupt"), CheckpointError, r"corrupt\.safetensors is not a readable safetensors"),
        ("load truncated safetensors", load("truncated"), CheckpointError, r"truncated\.safetensors is not a readable"),
        ("load edited architecture", load("arch"), CheckpointError, r"architecture: saved 'GPTConfig', now 'EncoderConfig'"),
        ("load edited act_fn", load("act"), CheckpointError, r"act_fn: saved 'gelu', now 'relu'"),
        ("load edited layer_norm_eps", load("eps"), CheckpointError, r"layer_norm_eps: saved 1e-05, now 0.1"),
        ("load config not an object", load("strcfg"), CheckpointError, r"'config': 'x', not an object"),
        ("load NaN weights", load("nanw"), ValueError, r"non-finite weights .*blocks\.1\.attn\.W_V"),
        ("HF folder without weights", load("hf_noweights"), CheckpointError,
         r"hf_noweights has config.json but no weights"),
        ("HF folder with broken config", load("hf_junk"), CheckpointError, r"hf_junk/config\.json is not a JSON object"),
        ("factory raises", load("userpkg_bad:raising_factory"), ModelError,
         r"factory 'userpkg_bad:raising_factory' raised RuntimeError: factory cannot find its weights"),
        ("factory returns int", load("userpkg_bad:int_factory"), TypeError, "returned a int"),
        ("factory missing", load("userpkg_bad:nope"), ValueError, "has no callable 'nope'"),
        ("module missing", load("userpkg_nothere.m:f"), ValueError, "cannot import module 'userpkg_nothere.m'"),
        # --- prompt sets
        ("repeated n=0", lambda f: data.repeated_tokens(0, 4, VOCAB), ValueError, "n=0"),
        ("repeated prefix_len=1", lambda f: data.repeated_tokens(4, 1, VOCAB), BadInput, r"prefix_len=1.*self-attention"),
        ("repeated prefix_len=0", lambda f: data.repeated_tokens(4, 0, VOCAB), ValueError, "prefix_len=0"),
        ("repeated d_vocab=0", lambda f: data.repeated_tokens(4, 4, 0), ValueError, "d_vocab=0"),
        ("random seq_len=-2", lambda f: data.random_tokens(4, -2, VOCAB), ValueError, "seq_len=-2"),
        ("random huge (estimated, not allocated)", lambda f: data.random_tokens(10**9, 10**6, VOCAB), BadInput,
         r"random_tokens: 1000000000 prompts x 1000000 positions would take \d+\.\d GiB"),
        ("repeated huge (estimated, not allocated)", lambda f: data.repeated_tokens(10**8, 10**6, VOCAB), BadInput,
         r"repeated_tokens: 100000000 prompts x 2000000 positions"),
        ("pad nothing", lambda f: data.pad([]), ValueError, "no sequences"),
        ("pad an empty row", lambda f: data.pad([[1], []]), ValueError, r"sequences \[1\] are empty"),
        ("pad side", lambda f: data.pad([[1]], padding_side="middle"), ValueError, "padding_side='middle'"),
        ("PromptSet float tokens", lambda f: data.PromptSet(torch.zeros(2, 3)), TypeError, "torch.float32"),
        ("PromptSet 1-D tokens", lambda f: data.PromptSet(torch.zeros(3, dtype=torch.long)), ValueError, r"got \(3,\)"),
        ("PromptSet list tokens", lambda f: data.PromptSet([[1, 2]]), ValueError, "got list"),
        ("PromptSet mask shape", lambda f: data.PromptSet(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4)),
         ValueError, r"\(2, 4\) differs from tokens shape \(2, 3\)"),
        ("text no texts", lambda f: data.text_prompts([], data.corpus_tokenizer()), ValueError, "no texts"),
        ("text empty string", lambda f: data.text_prompts(["ok", ""], data.corpus_tokenizer()), ValueError, r"texts \[1\]"),
        ("char unknown character", lambda f: data.CharTokenizer("abc").encode("abz"), ValueError, r"'z' \(U\+007A\)"),
        ("check_prompts id >= vocab", lambda f: data.check_prompts(data.PromptSet(torch.tensor([[1, VOCAB + 3]])), d_vocab=VOCAB),
         ValueError, f"token id {VOCAB + 3} is outside"),
        ("check_prompts too long", lambda f: data.check_prompts(data.random_tokens(1, N_CTX + 1, VOCAB), n_ctx=N_CTX),
         ValueError, f"{N_CTX + 1} tokens long.*n_ctx={N_CTX}"),
        ("check_prompts empty", lambda f: data.check_prompts(data.PromptSet(torch.zeros(0, 3, dtype=torch.long))),
         ValueError, r"empty \(tokens shape \(0, 3\)\)"),
        # --- prompt specs and files
        ("PromptSpec n=0", lambda f: PromptSpec(n=0), SpecError, "n=0"),
        ("PromptSpec kind", lambda f: PromptSpec(kind="repeatd"), SpecError, "'repeatd'"),
        ("PromptSpec seed negative", lambda f: PromptSpec(seed=-1), SpecError, "seed=-1"),
        ("PromptSpec seed 2**70", lambda f: PromptSpec(seed=2**70), SpecError, f"seed={2**70}"),
        ("PromptSpec float n", lambda f: PromptSpec(n=2.5), SpecError, "n=2.5"),
        ("head label", lambda f: parse_head("L1X2"), BadInput, "'L1X2'"),
        ("layers flag", lambda f: parse_layers_flag("0-x"), SpecError, "'0-x'"),
        ("JSON floats", lambda f: _json_prompts(f / "floats.json", VOCAB), SpecError, r"row 0, position 0 holds 1\.5"),
        ("JSON negative", lambda f: _json_prompts(f / "negative.json", VOCAB), SpecError, r"position 1 holds token id -3"),
        ("JSON strings", lambda f: _json_prompts(f / "strings.json", VOCAB), SpecError, r"position 0 holds 'a'"),
        ("JSON bools", lambda f: _json_prompts(f / "bools.json", VOCAB), SpecError, r"position 0 holds True"),
        ("JSON empty", lambda f: _json_prompts(f / "empty.json", VOCAB), SpecError, r"empty\.json.*got \[\]"),
        ("JSON empty row", lambda f: _json_prompts(f / "emptyrow.json", VOCAB), SpecError, r"row 1 is \[\]"),
        ("JSON id >= vocab", lambda f: _json_prompts(f / "toobig.json", VOCAB), SpecError, f"token id {VOCAB + 7}"),
        ("JSON syntax", lambda f: _json_prompts(f / "notjson.json", VOCAB), SpecError, r"notjson\.json:1:\d+: not valid JSON"),
        ("txt without lines", lambda f: build_prompts(tiny(), PromptSpec(kind="file", file=str(f / "blank.txt"))),
         SpecError, r"blank\.txt has no non-empty lines"),
        # --- the model's forward and cache
        ("forward float tokens", forward(tokens=torch.zeros(1, 3)), (TypeError, ValueError), "float"),
        ("forward id >= vocab", forward(tokens=torch.tensor([[1, VOCAB]])), ValueError, f"token id {VOCAB}"),
        ("forward too long", forward(tokens=torch.zeros(1, N_CTX + 5, dtype=torch.long)), ValueError, f"{N_CTX + 5}"),
        ("forward mask values", forward(attention_mask=torch.full((2, 4), 2)), ValueError, "attention_mask holds 2"),
        ("forward mask shape", forward(attention_mask=torch.ones(2, 5)), ValueError, r"shape \(2, 5\)"),
        ("forward return_type", forward(return_type="logit"), ValueError, "return_type='logit'"),
        ("forward stop_at_layer", forward(stop_at_layer=9), ValueError, "stop_at_layer=9"),
        ("forward 1-token loss", forward(tokens=torch.zeros(1, 1, dtype=torch.long), return_type="loss"), ValueError, "1"),
        ("forward NaN weights", lambda f: with_nan(tiny())(torch.zeros(1, 4, dtype=torch.long)), ValueError,
         r"non-finite weights .*blocks\.1\.attn\.W_V"),
        ("cache misspelt name", lambda f: tiny().run_with_cache(torch.zeros(1, 4, dtype=torch.long),
                                                                names_filter="blocks.0.attn.hook_patern"),
         ValueError, r"'blocks\.0\.attn\.hook_patern'; did you mean \['blocks\.0\.attn\.hook_pattern'"),
        ("cache filter selects nothing", lambda f: tiny().run_with_cache(torch.zeros(1, 4, dtype=torch.long),
                                                                         names_filter=lambda n: "patern" in n),
         ValueError, "selects none of this model's"),
        ("cache huge (estimated, not allocated)", huge_cache, ValueError, r"about 0\.\d GiB .*batch 64 x 32 positions"),
        # --- analyses
        ("focus NaN weights", lambda f: positional.focus(with_nan(tiny()), _repeated()), ModelError,
         r"non-finite weights .*blocks\.1\.attn\.W_V"),
        ("induction NaN weights", lambda f: induction.scores(with_nan(tiny()), _repeated()), ModelError,
         r"non-finite weights .*blocks\.1\.attn\.W_V"),
        ("induction no repeats", lambda f: induction.scores(tiny(), data.PromptSet(torch.arange(6).view(2, 3))),
         induction.NoRepeats, r"prompts \[0, 1\] have no repeated tokens"),
        ("importance 1-token prompts", lambda f: redundancy.importance(tiny(), data.random_tokens(16, 1, VOCAB)),
         BadInput, r"fewer than 2 real tokens"),
        ("importance a 1-token padded prompt", lambda f: redundancy.importance(tiny(), data.pad([[1, 2, 3]] * 15 + [[4]])),
         BadInput, r"prompts \[15\] have fewer than 2 real tokens"),
        ("substitute wrong name", substitute("previous"), ValueError, "'previous'"),
        ("substitute future weight", substitute(torch.ones(4, 4) / 4), ValueError, "future"),
        # --- leakage audit
        ("audit tol inf", lambda f: audit(tiny(), max_len=8, tol=math.inf), BadInput, r"tol=inf must be a finite number"),
        ("audit tol nan", lambda f: audit(tiny(), max_len=8, tol=math.nan), BadInput, r"tol=nan"),
        ("audit tol 1e9", lambda f: audit(tiny(), max_len=8, tol=1e9), BadInput, r"tol=1000000000\.0"),
        ("audit tol 0", lambda f: audit(tiny(), max_len=8, tol=0), BadInput, r"tol=0 "),
        ("audit tol -1", lambda f: audit(tiny(), max_len=8, tol=-1.0), BadInput, r"tol=-1\.0"),
        ("audit tol str", lambda f: audit(tiny(), max_len=8, tol="1e-4"), BadInput, r"tol='1e-4'"),
        ("audit tol bool", lambda f: audit(tiny(), max_len=8, tol=True), BadInput, r"tol=True"),
        ("audit method", lambda f: audit(tiny(), max_len=8, methods=["gradiant"]), ValueError, r"\['gradiant'\]"),
        ("audit max_len > n_ctx", lambda f: audit(tiny(), max_len=N_CTX + 1), ValueError, f"max_len={N_CTX + 1}"),
        ("audit max_len 1", lambda f: audit(tiny(), max_len=1), ValueError, "max_len=1"),
        ("audit NaN weights", lambda f: audit(with_nan(tiny()), max_len=8), ModelError,
         r"non-finite weights .*blocks\.1\.attn\.W_V"),
        ("audit empty spec", lambda f: audit("", max_len=8), BadInput, r"empty \(''\)"),
        ("audit user model raises", lambda f: audit("userpkg_bad:exploding", max_len=8), ModelError,
         r"raised ZeroDivisionError at .*userpkg_bad.*the user's forward divides by zero"),
        ("audit black box returns NaN", lambda f: audit(lambda t: torch.full((*t.shape, 3), math.nan), max_len=6,
                                                       vocab_size=VOCAB), ModelError, r"NaN or inf for tokens of shape"),
        ("audit black box wrong shape", lambda f: audit(lambda t: torch.zeros(t.shape[0], 3), max_len=6, vocab_size=VOCAB),
         ValueError, r"returned \(\d+, 3\)"),
        ("audit factory raises", lambda f: audit("userpkg_bad:raising_factory", max_len=8), ModelError,
         "factory cannot find its weights"),
        # --- output folders
        ("out dir is a file", lambda f: outdir.check_out_dir(f / "claims.toml", force=True), outdir.OutputDirError,
         r"claims\.toml exists and is not a directory"),
        ("out dir with user files, forced", lambda f: outdir.check_out_dir(f, force=True), outdir.OutputDirError, r"claims\.toml"),
        # --- claims files
        ("claims unknown kind", lambda f: __import__("interp.testing").testing.read_claims(f / "badclaims.toml"),
         ClaimsFileError, r"badclaims\.toml:2:1: L1H0: unknown claim kind 'inductoin'.*Did you mean 'induction'"),
        ("claims missing file", lambda f: __import__("interp.testing").testing.read_claims(f / "nope.toml"),
         ClaimsFileError, r"nope\.toml: claims file not found"),
    ]
    return cases


API_CASES = _api_cases()


@pytest.mark.parametrize("name, call, error, match", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(name, call, error, match, files):
    with pytest.raises(error, match=match) as info:
        call(files)
    assert exit_code_for(info.value) == 2, f"{name}: {type(info.value).__name__} would exit {exit_code_for(info.value)}"


def _cli_cases():
    return [
        (["audit-leakage", ""], 2, r"model spec is empty \(''\).*unset"),
        (["verify", ""], 2, r"model spec is empty"),
        (["heads", " "], 2, r"model spec is empty"),
        (["audit-leakage", "toy-induction", "--tol", "inf"], 2, r"--tol: .*positive finite"),
        (["audit-leakage", "toy-induction", "--tol", "1e9"], 2, r"--tol: .*below 0\.05"),
        (["audit-leakage", "toy-induction", "--tol", "nan"], 2, r"--tol"),
        (["audit-leakage", "toy-induction", "--max-len", "500", "--n", "1"], 2, r"--max-len 500 exceeds .*n_ctx=128"),
        (["heads", "--seed", str(2**70)], 2, r"--seed: .*outside \[0, 2\*\*32 - 1\]"),
        (["heads", "--seed", "-1"], 2, r"--seed"),
        (["heads", "--n", "0"], 2, r"--n(/--n-prompts)?: 0 must be at least 1"),
        (["heads", "--n", "100000000000"], 2, r"100000000000 prompts x \d+ positions would take \d+\.\d GiB"),
        (["claims", "{f}/claims.toml", "toy-induction"], 2, r"model first.*interp claims toy-induction .*claims\.toml"),
        (["claims", "toy-induction", "{f}/badclaims.toml"], 2, r"unknown claim kind 'inductoin'"),
        (["heads", "toy-induction", "--prompts", "{f}/floats.json"], 2, r"row 0, position 0 holds 1\.5"),
        (["verify", "{f}/corrupt.safetensors"], 2, r"corrupt\.safetensors is not a readable safetensors"),
        (["verify", "{f}/truncated"], 2, r"truncated\.safetensors is not a readable"),
        (["verify", "{f}/arch"], 2, r"architecture: saved 'GPTConfig', now 'EncoderConfig'"),
        (["heads", "{f}/nanw"], 2, r"non-finite weights"),
        (["scan", "{f}/nanw", "--n", "8"], 2, r"non-finite weights"),
        (["verify", "userpkg_bad:raising_factory"], 2, r"factory cannot find its weights"),
        (["heads", "userpkg_bad:exploding"], 2, r"ZeroDivisionError at .*userpkg_bad.*divides by zero"),
        (["audit-leakage", "userpkg_bad:exploding", "--max-len", "6"], 2, r"ZeroDivisionError.*divides by zero"),
        (["heads", "userpkg_bad:black_box"], 2, r"no hooks"),
        (["report", "toy-induction", "--out", "{f}", "--force"], 2, r"holds files no previous report wrote.*claims\.toml"),
        (["demo", "--out", "{f}"], 2, r"holds files no previous report wrote"),
        (["heads", "nope-model"], 2, r"cannot load model spec 'nope-model'"),
    ]


CLI_CASES = _cli_cases()


@pytest.mark.parametrize("argv, code, match", CLI_CASES, ids=[" ".join(c[0]) or "empty" for c in CLI_CASES])
def test_cli_bad_input(argv, code, match, files, capsys):
    argv = [a.replace("{f}", str(files)) for a in argv]
    try:
        got = cli.main([*argv, "-q"])
    except SystemExit as exit_:  # argparse's own usage errors
        got = exit_.code
    err = capsys.readouterr().err
    assert got == code, err
    assert re.search(match, err, re.S), err
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.heavy
def test_closed_stdout_is_not_a_finding(tmp_path):
    """Issue 11 #10: `interp verify toy-induction | true` exited 1 ("a finding")."""
    root = Path(__file__).resolve().parents[2]
    code = "import sys; from interp.cli import main; sys.exit(main(['verify', 'toy-induction', '-q']))"
    reader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    reader.stdout.close()  # the reader went away before the first line
    _, err = reader.communicate(timeout=240)
    assert reader.returncode == 0, err.decode()
    assert b"Traceback" not in err


# --------------------------------------------------------------------------- properties (hypothesis)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)
TOKEN_ROWS = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), min_size=1, max_size=5)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _valid_rows(value) -> bool:
    return (isinstance(value, list) and bool(value) and all(
        isinstance(r, list) and r and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < VOCAB for v in r)
        for r in value))


@PROPERTY
@given(value=JSON_VALUES | TOKEN_ROWS)
def test_prompt_file_parser_accepts_exactly_token_rows(value, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(value))
    if _valid_rows(value):
        prompts = _json_prompts(path, VOCAB)
        for i, row in enumerate(value):
            assert prompts.tokens[i, : len(row)].tolist() == row
            if prompts.attention_mask is not None:
                assert prompts.attention_mask[i].sum() == len(row)
        assert (prompts.attention_mask is None) == (len({len(r) for r in value}) == 1)
    else:
        with pytest.raises(SpecError, match=str(path).replace(".", r"\.")) as info:
            _json_prompts(path, VOCAB)
        assert exit_code_for(info.value) == 2


@PROPERTY
@given(text=st.text(max_size=60))
def test_prompt_text_file_gives_lines_or_a_named_error(text, tmp_path):
    from interp.specs import _read_lines

    path = tmp_path / "p.txt"
    path.write_text(text, encoding="utf-8")
    try:
        lines = _read_lines(path)
    except SpecError as error:
        assert str(path) in str(error)
    else:
        assert lines and all(line and not line.startswith("#") and line == line.strip() for line in lines)


CLAIM_KEYS = st.sampled_from(["L0H1", "L1H0", "l1h2", "L0H1 ~ L0H3", "L9H9", "model", "LxH1", "L0H1 ~ L0H2 ~ L0H3", ""])
CLAIM_VALUES = st.sampled_from(['"induction"', '"not induction"', '["previous_token", "positional"]', "3", "[]",
                                '"inductoin"', '""', "true", '["induction", 2]'])
TOP_LINES = st.sampled_from(['model = "toy-induction"', "model = 3", "alpha = 0.05", "alpha = 2", "alpha = true",
                             "colour = 1", "[prompts]\nkind = \"repeated\"", "[prompts]\nn = 0", "[prompts]\nkind = \"x\"",
                             "[prompts]\nseed = -4", "[prompts]\nbogus = 1", "prompts = 3", "= broken", "[claims", ""])


@PROPERTY
@given(top=st.lists(TOP_LINES, max_size=3), claims=st.lists(st.tuples(CLAIM_KEYS, CLAIM_VALUES), max_size=4),
       header=st.booleans(), noise=st.text(max_size=8))
def test_claims_parser_returns_a_file_or_an_error_with_file_line_column(top, claims, header, noise):
    from interp.analyses.claims.registry import head_claim_kinds, pair_claim_kinds

    kinds = set(head_claim_kinds()) | set(pair_claim_kinds()) | {"causal"}
    body = "\n".join(top) + ("\n[claims]\n" if header else "\n") + "\n".join(f'"{k}" = {v}' for k, v in claims)
    for text in (body, body + noise):
        try:
            parsed = parse_claims_text(text, "c.toml", valid_kinds=kinds)
        except ClaimsFileError as error:
            assert str(error).startswith("c.toml:"), str(error)
            assert exit_code_for(error) == 2
        else:
            assert isinstance(parsed, ClaimsFile) and parsed.claims
            assert all(c.kind in kinds for c in parsed.claims)


TENSORS = st.one_of(
    st.builds(lambda shape, dtype: torch.zeros(shape, dtype=dtype),
              st.lists(st.integers(0, 3), max_size=3).map(tuple),
              st.sampled_from([torch.long, torch.int32, torch.float32, torch.bool, torch.float16])),
    st.lists(st.lists(st.integers(0, 5), max_size=3), max_size=3),
    st.none(), st.integers(), st.text(max_size=3),
)


@PROPERTY
@given(tokens=TENSORS, mask=st.none() | TENSORS)
def test_promptset_is_valid_or_names_what_is_wrong(tokens, mask):
    try:
        prompts = data.PromptSet(tokens, mask)
    except (ValueError, TypeError) as error:
        text = str(error)
        assert "PromptSet" in text or "attention_mask" in text, text
        assert exit_code_for(error) == 2 or isinstance(error, TypeError)
    else:
        assert prompts.tokens.ndim == 2 and not prompts.tokens.is_floating_point()
        assert mask is None or prompts.attention_mask.shape == prompts.tokens.shape


@PROPERTY
@given(rows=TOKEN_ROWS, side=st.sampled_from(["right", "left"]))
def test_padded_sets_keep_every_row_and_check_against_the_vocabulary(rows, side):
    prompts = data.pad(rows, padding_side=side)
    assert len(prompts) == len(rows) and prompts.real_lengths().tolist() == [len(r) for r in rows]
    assert data.check_prompts(prompts, d_vocab=VOCAB) is prompts
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \[0, 1\)") if max(map(max, rows)) >= 1 \
            else _no_error():
        data.check_prompts(prompts, d_vocab=1)
    half = prompts[torch.arange(len(rows)).flip(0)]
    assert half.row_numbers([0]) == [len(rows) - 1]  # errors name the user's row, not the position in a subset


class _no_error:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
