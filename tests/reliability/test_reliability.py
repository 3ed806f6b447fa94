"""Issue 11's numbered defects, one test each (the bad-input table is tests/reliability/test_bad_input.py,
output folders tests/interp/test_outdir.py). Each test failed on main before the fix."""
from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
import torch

from interp import cli, data
from interp.analyses import leakage
from interp.analyses.leakage import audit
from interp.errors import BadInput
from interp.models import GPTConfig, HookedGPT
from interp.models.zoo import build

VOCAB = 40


def tiny(seed: int = 0, **overrides) -> HookedGPT:
    config = dict(n_layers=2, n_heads=2, d_model=16, d_vocab=VOCAB, n_ctx=32, seed=seed)
    return HookedGPT(GPTConfig(**{**config, **overrides})).eval()


# ------------------------------------------------------------------ 2. safety checks talked into a pass

def test_pattern_status_is_judged_on_attention_weight_not_on_tol():
    report = audit(build("hooked_gpt_unmasked_layer", 0), max_len=8, methods=("pattern", "truncation"))
    loose = dataclasses.replace(report, tol=10.0)  # what `--tol 1e9` used to do to the status word
    status = {row["method"]: row["status"] for row in loose.summary_rows()}
    assert status["pattern"] == "weight above diagonal"
    assert leakage.method_tol("pattern", 1e9) == leakage.PATTERN_TOL


@pytest.mark.parametrize("tol", [float("inf"), 1e9, 0.5, float("nan")])
def test_a_tolerance_that_hides_leaks_is_refused(tol):
    with pytest.raises(BadInput, match=r"must be a finite number in \(0, 0\.01\]"):
        audit(build("no_mask", 0), max_len=8, tol=tol)


# ------------------------------------------------------------------ 4. NaN weights named by the audit

def test_audit_names_nan_weights_not_a_masked_row():
    model = tiny()
    with torch.no_grad():
        model.blocks[0].attn.W_Q[1, 2, 3] = float("nan")
    with pytest.raises(Exception) as info:
        audit(model, max_len=8)
    assert "blocks.0.attn.W_Q" in str(info.value) and "fully masked" not in str(info.value)


# ------------------------------------------------------------------ 5. config fingerprint

def test_fingerprint_recorded_and_old_checkpoints_load_with_a_note(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    import interp
    from interp.models import io

    interp.save(tiny(), tmp_path / "m")
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as handle:
        header = handle.metadata()
    assert json.loads(header[io.CONFIG_KEY])["architecture"] == "GPTConfig"
    assert interp.load(str(tmp_path / "m")).load_notes == []
    save_file(load_file(str(tmp_path / "m.safetensors")), str(tmp_path / "m.safetensors"))  # as saved before fingerprints
    old = interp.load(str(tmp_path / "m"))
    assert "saved before config fingerprints" in old.load_notes[0]


def test_shipped_checkpoint_carries_its_fingerprint():
    import interp

    model = interp.load("toy-induction")
    assert model.load_notes == []


# ------------------------------------------------------------------ round 4 (issue 36): checkpoints


def _saved(tmp_path, name="m", **metadata):
    import interp

    interp.save(tiny(), tmp_path / name)
    if metadata:
        path = tmp_path / f"{name}.json"
        document = json.loads(path.read_text())
        document["metadata"].update(metadata)
        path.write_text(json.dumps(document))
    return tmp_path / name


def test_corrupted_weights_are_refused_by_their_digest(tmp_path):
    """d006: flipped tensor bytes, header and shapes intact, are refused at load; a file saved before the digest
    loads unchecked; the shipped checkpoints carry one."""
    import struct

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    import interp
    from interp.errors import CheckpointError
    from interp.models import io

    path = _saved(tmp_path)
    weights = tmp_path / "m.safetensors"
    raw = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[start + 10] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"m\.safetensors: the tensors' SHA-256 differs from the one recorded"):
        interp.load(str(path))
    with safe_open(str(weights), "pt") as handle:
        header = {k: v for k, v in handle.metadata().items() if k != io.TENSORS_KEY}
    save_file(load_file(str(weights)), str(weights), metadata=header)  # as saved before digests
    assert interp.load(str(path)).load_notes == []
    for name in ("toy-induction", "stdlib-bytes", "stdlib-bpe"):
        with safe_open(f"models/checkpoints/{name}.safetensors", "pt") as handle:
            recorded = handle.metadata()[io.TENSORS_KEY]
        assert recorded == io.tensors_digest(load_file(f"models/checkpoints/{name}.safetensors"))


@pytest.mark.parametrize("seed, match", [("abc", r"seed='abc' must be a whole number"), (-1, "seed=-1"), (True, "seed=True"),
                                         (2**64, r"seed=18446744073709551616")])
def test_a_config_seed_that_is_not_a_whole_number_is_a_checkpoint_error(tmp_path, capsys, seed, match):
    """d027: not an internal error from torch.manual_seed: a CheckpointError (exit 2) naming the seed."""
    import interp
    from interp.errors import CheckpointError

    path = _saved(tmp_path)
    config = tmp_path / "m.json"
    document = json.loads(config.read_text())
    document["config"]["seed"] = seed
    config.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=match):
        interp.load(str(path))
    assert cli.main(["verify", str(path), "-q"]) == 2
    assert "seed" in capsys.readouterr().err


def test_a_config_nested_too_deeply_is_not_valid_json(tmp_path, capsys):
    """d047: a RecursionError inside json is a CheckpointError (exit 2), not an internal error."""
    import interp
    from interp.errors import CheckpointError

    path = _saved(tmp_path)
    (tmp_path / "m.json").write_text('{"config": ' + "[" * 50000 + "]" * 50000 + "}")
    with pytest.raises(CheckpointError, match=r"m\.json is not valid JSON: nested too deeply"):
        interp.load(str(path))
    assert cli.main(["verify", str(path), "-q"]) == 2


def test_saved_files_get_the_umasks_mode(tmp_path):
    """d048: safetensors writes 0600; the atomic writer gives every new file the umask's usual mode."""
    import os

    from interp.models.files import write_atomic

    old = os.umask(0o022)
    try:
        _saved(tmp_path)
        write_atomic(tmp_path / "w.bin", lambda tmp: (tmp.unlink(), tmp.write_bytes(b"x"), os.chmod(tmp, 0o600)))
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}
    assert modes == {"m.json": "0o644", "m.safetensors": "0o644", "w.bin": "0o644"}


@pytest.mark.parametrize("metadata, match", [
    ({"bos": 9999}, r"metadata\.bos = 9999 is not a token of the model's vocabulary \(ids 0\.\.39, d_vocab 40\)"),
    ({"task": {"bos_token": 40}}, r"metadata\.task\.bos_token = 40"),
    ({"task": {"bos_token_id": "1"}}, r"metadata\.task\.bos_token_id = '1'"),
    ({"bos": -1}, r"metadata\.bos = -1"),
])
def test_a_bos_outside_the_vocabulary_is_refused_at_load(tmp_path, metadata, match):
    """d024: refused when loaded, not later as the prompts' fault."""
    import interp
    from interp.errors import CheckpointError

    with pytest.raises(CheckpointError, match=match):
        interp.load(str(_saved(tmp_path, **metadata)))
    assert interp.load(str(_saved(tmp_path, "ok", bos=39))).metadata["bos"] == 39


@pytest.mark.parametrize("tokenizer, match", [
    ("garbage", r"metadata\.tokenizer is str, not \{\"kind\": \"bpe\", \"json\": \.\.\.\}"),
    ({"kind": "xyz", "json": "{}"}, r"metadata\.tokenizer has kind 'xyz', not 'bpe'"),
    ({"kind": "bpe"}, r"metadata\.tokenizer has no 'json' text"),
    ({"kind": "bpe", "json": "{not json"}, r"metadata\.tokenizer does not rebuild"),
    (None, r"was trained with a BPE tokenizer \(metadata\.recipe\) but carries none"),
])
def test_a_bad_or_missing_carried_tokenizer_is_named_in_a_load_note(tmp_path, tokenizer, match):
    """d031 d032 d052: the model loads (token ids work) with no tokenizer, and a note says which entry is bad."""
    import re

    import interp

    extra = {"recipe": {"vocab_size": VOCAB}} if tokenizer is None else {"tokenizer": tokenizer}
    model = interp.load(str(_saved(tmp_path, **extra)))
    assert model.tokenizer is None and any(re.search(match, note) for note in model.load_notes), model.load_notes


def test_edited_config_that_keeps_shapes_is_refused(tmp_path):
    import interp
    from interp.errors import CheckpointError

    interp.save(tiny(), tmp_path / "m")
    document = json.loads((tmp_path / "m.json").read_text())
    document["config"]["architecture"] = "EncoderConfig"  # would load the causal weights as a bidirectional model
    (tmp_path / "m.json").write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=r"architecture: saved 'GPTConfig', now 'EncoderConfig'.*Restore the JSON"):
        interp.load(str(tmp_path / "m"))


# ------------------------------------------------------------------ 6. induction is never self-attention

def test_a_repeat_period_of_one_is_refused_not_scored_as_induction():
    from interp.analyses import induction

    with pytest.raises(BadInput, match="prefix_len=1"):
        data.repeated_tokens(4, 1, VOCAB)
    tokens = torch.tensor([[5, 5, 7, 7, 9, 9]] * 4)  # every repeat is the previous token
    period_one = data.PromptSet(tokens, meta={"kind": "repeated", "prefix_len": 1, "offset": 0})
    with pytest.raises(BadInput, match=r"prefix_len=1: the induction target .* is the query itself"):
        induction.scores(tiny(), period_one)  # reported the self_token score (0.886) as induction


# ------------------------------------------------------------------ 8. padded prompts in claims / scan / report

def test_ideal_patterns_are_laid_on_each_prompts_real_positions():
    from interp.data import PromptSet
    from interp.head_types import TargetBatch, get_head_type
    from interp.interventions import on_real_positions

    def ideal_pattern(name, m):  # (m, m): the head type's ideal pattern on m unpadded positions
        return get_head_type(name).ideal_pattern(TargetBatch.from_prompts(PromptSet(torch.arange(m)[None])))[0]

    allowed = torch.ones(2, 5, 5, dtype=torch.bool).tril()
    allowed[0, :, :2] = False  # left padding: keys 0, 1 are padding
    allowed[1, :, 4] = False  # right padding: key 4
    own = torch.full((2, 5, 5), 0.2)
    laid = on_real_positions(lambda m: ideal_pattern("previous_token", m), allowed, own)
    assert laid[0, 2, 2] == 1.0 and laid[0, 3, 2] == 1.0 and laid[0, 2, :2].sum() == 0  # first real token: itself
    assert laid[1, 0, 0] == 1.0 and laid[1, 3, 2] == 1.0 and laid[1, :4, 4].sum() == 0
    assert torch.equal(laid[1, 4], own[1, 4])  # a padded query keeps the head's own row
    first = on_real_positions(lambda m: ideal_pattern("first_token", m), allowed, own)
    assert (first[0, 2:, 2] == 1.0).all()  # the first *real* token, not the pad at key 0


def test_claims_run_on_ragged_prompts():
    from interp.analyses import claims

    model = tiny()
    rows = [[3, 4, 5, 6, 3, 4, 5, 6], [7, 8, 9, 7, 8, 9]] * 8
    prompts = data.pad(rows)
    frame = claims.scan(model, prompts, seed=0, evidence=("observational", "sufficiency"))
    assert len(frame) and not frame["reasons"].str.contains("future \\(or padded\\)").any()


# ------------------------------------------------------------------ 11. a factory is called once, API = CLI

@pytest.fixture()
def counting_factory(tmp_path, monkeypatch):
    (tmp_path / "userpkg_count.py").write_text(textwrap.dedent('''
        import torch
        CALLS = []

        class Causal(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(13, 8)

            def forward(self, tokens):
                return self.embed(tokens).cumsum(1)

        def factory():
            CALLS.append(1)
            with open(__file__ + ".calls", "a") as calls:  # the CLI calls it in its child process: counted on disk
                calls.write("1")
            return Causal()
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module("userpkg_count")
    module.CALLS.clear()
    yield module
    monkeypatch.delitem(__import__("sys").modules, "userpkg_count")


def test_a_factory_is_called_once_and_python_audits_what_the_cli_audits(counting_factory, capsys):
    code = cli.main(["audit-leakage", "userpkg_count:factory", "--max-len", "6", "-q", "--json", "-"])
    assert Path(counting_factory.__file__ + ".calls").read_text() == "1"  # once, in the child running the model
    cli_verdict = json.loads(capsys.readouterr().out)["result"]["verdict"]
    counting_factory.CALLS.clear()
    report = audit("userpkg_count:factory", max_len=6, vocab_size=13)
    assert len(counting_factory.CALLS) == 1
    assert code == 0 and report.verdict == cli_verdict and report.causal


# ------------------------------------------------------------------ 12. messages pointing at the right place

def test_errors_name_the_row_of_the_users_file_not_of_a_split_half():
    from interp.analyses.positional import _check_lengths

    prompts = data.pad([[1, 2, 3]] * 5 + [[4]] + [[1, 2, 3]] * 4)
    _, second = prompts.split(0.5, seed=0)
    half = second if 5 in second.rows.tolist() else _
    with pytest.raises(ValueError, match=r"prompts \[5\] have fewer than 2"):
        _check_lengths(half)


def test_seed_beyond_64_bits_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["heads", "--seed", str(2**70)])
    assert exit_.value.code == 2 and "outside [0, 2**32 - 1]" in capsys.readouterr().err


# ------------------------------------------------------------------ 13. leakage messages

def test_assert_causal_names_the_gradients_exact_pair_in_words():
    from interp.testing import assert_causal

    with pytest.raises(AssertionError) as info:
        assert_causal(build("single_pair", 0), max_len=12)
    text = str(info.value)
    assert "gradient: the output at position" in text and "reads position" in text and "exact pair" in text
    assert "source_pos" not in text and "from position" not in text
    assert "were removed" in text or "were resampled" in text  # cut-based rows say every later position changed


def test_a_leak_just_above_tol_is_localised_where_it_enters():
    model = build("tiny_leak", 0)
    size = audit(model).max_influence
    report = audit(model, tol=0.9 * size)
    assert report.verdict == "leak" and report.first_leaking_site == "blocks.0.mixer"  # was "output"
    assert leakage.localisation_threshold(1e-3, 5e-5) == 5e-5
    assert leakage.localisation_threshold(1e-4, 5e-5) == pytest.approx(1e-5)


def test_encoder_headline_is_the_padding_audit_and_one_line_assertion(tiny_encoder):
    from interp.testing import assert_bidirectional_padding_inert, assert_causal

    report = assert_bidirectional_padding_inert(tiny_encoder, max_len=10)
    audited = report.table[report.table["method"].isin(["padding", "batch"])]["influence"].max()
    assert report.max_influence == pytest.approx(audited)  # not the by-design future dependence
    with pytest.raises(AssertionError, match="padding"):
        assert_bidirectional_padding_inert(build("encoder_padding_bug", 0), max_len=10)
    buggy = audit(build("encoder_padding_bug", 0), max_len=10)
    padding = buggy.table[buggy.table["method"] == "padding"]["influence"].max()
    assert buggy.leaks == ("padding",) and buggy.max_influence == pytest.approx(padding)  # was 1.63, the future dependence
    assert not any("pad content does not matter" in note for note in buggy.notes)  # contradicted the padding verdict
    with pytest.raises(AssertionError, match="not declared bidirectional.*assert_causal"):
        assert_bidirectional_padding_inert(tiny(), max_len=8)
    with pytest.raises(AssertionError):
        assert_causal(tiny_encoder, max_len=10)


def test_a_user_model_that_raises_is_a_model_error_naming_where(tmp_path, monkeypatch):
    """Issue 11 #9 from Python: the user's forward failing inside an analysis says it is theirs, and where."""
    from interp.analyses import positional
    from interp.errors import ModelError

    (tmp_path / "userpkg_raises.py").write_text(textwrap.dedent('''
        from interp.models import HookedGPT

        class Broken(HookedGPT):
            def forward(self, tokens, *args, **kwargs):
                raise RuntimeError("the user's cache is full")
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    from userpkg_raises import Broken

    model = Broken(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=VOCAB, n_ctx=32, seed=0)).eval()
    with pytest.raises(ModelError, match=r"the model Broken raised RuntimeError at .*userpkg_raises\.py:6"):
        positional.focus(model, data.repeated_tokens(8, 4, VOCAB))


# ------------------------------------------------------------------ one mapping of exceptions to exit codes

@pytest.mark.parametrize("error, code", [
    ("BadInput", 2), ("BadType", 2), ("ModelError", 2), ("CheckpointError", 2), ("InternalError", 3),
])
def test_each_error_class_maps_to_its_exit_code_once(error, code):
    from interp import errors

    instance = getattr(errors, error)("x")
    assert errors.exit_code_for(instance) == code
    assert isinstance(errors.CheckpointError("x"), ValueError) and isinstance(errors.BadType("x"), TypeError)


def test_exit_codes_of_foreign_exceptions():
    from interp.errors import exit_code_for

    assert exit_code_for(BrokenPipeError()) == 0  # a closed stdout is not a finding
    assert exit_code_for(FileNotFoundError("x")) == 2 and exit_code_for(ValueError("x")) == 2
    assert exit_code_for(RuntimeError("x")) == 3 and exit_code_for(ZeroDivisionError()) == 3  # bugs stay bugs
