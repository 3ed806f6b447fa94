"""Known answers for the leakage audit on third-party-style code (`tests/leakzoo/`): through the CLI
(`interp audit-leakage pkg.mod:factory`, run in-process), every bug exits 1 and every correct model
exits 0; each leak's `result.origin` names the `# BUG` line of the source file (within two lines),
or for a bug in how a mask is *built* the line that applies the mask or the softmax after it.

Also: the mechanical mutants of the correct nanoGPT- and minGPT-style attention (`leakzoo.mutants`),
the Python API on the same models, and stdout holding exactly one JSON document with `--json -`.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from leakzoo import marked_line, mutants  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)

TESTS = Path(__file__).resolve().parents[2]
ROOT = TESTS.parent
TOLERANCE = 2  # lines between the reported origin and the marked line


@dataclass(frozen=True)
class Case:
    """One zoo model and what the audit must say about it."""

    spec: str  # "leakzoo.module:factory"
    exit: int  # expected exit code: 0 correct, 1 a leak
    flags: tuple[str, ...] = ()
    built: bool = False  # the bug is in how a mask is built: the `also` lines (applying it, softmax) count too
    also: tuple[str, ...] = ()  # `# SITE:` labels of lines that also count as the origin

    @property
    def id(self) -> str:
        return self.spec.removeprefix("leakzoo.") + "".join(self.flags)

    @property
    def path(self) -> Path:
        return TESTS / Path(*self.spec.split(":")[0].split(".")).with_suffix(".py")

    @property
    def factory(self) -> str:
        return self.spec.split(":")[1]

    def lines(self) -> set[int]:
        """Lines that count as the origin: the `# BUG` line and, where said, the `also` lines."""
        return {marked_line(self.path, "BUG", self.factory)} | {marked_line(self.path, "SITE", s) for s in self.also}


NANO_APPLY = ("nano-mask", "nano-softmax")
MIN_APPLY = ("min-mask", "min-softmax")

CASES = [
    # correct: exit 0, no false alarm
    Case("leakzoo.nanostyle:flash", 0),
    Case("leakzoo.nanostyle:manual", 0),
    Case("leakzoo.mingptstyle:gpt", 0),
    Case("leakzoo.plain:lm", 0),
    Case("leakzoo.plain:writes_fd1", 0),
    Case("leakzoo.hfwrap:wrapped", 0),
    Case("leakzoo.hfmodels:gpt2_eager", 0),
    Case("leakzoo.hfmodels:gpt2_sdpa", 0),
    Case("leakzoo.hfmodels:llama_eager", 0),
    Case("leakzoo.hfmodels:llama_sdpa", 0),
    Case("leakzoo.hfmodels:qwen2_sdpa", 0),
    Case("leakzoo.hfmodels:mistral_sdpa", 0),
    Case("leakzoo.hfmodels:neox_eager", 0),
    Case("leakzoo.hfmodels:neox_sdpa", 0),
    Case("leakzoo.hfmodels:bert", 0),  # a declared Hugging Face encoder
    Case("leakzoo.hfmodels:bert", 0, flags=("--bidirectional",)),
    # bugs: exit 1, origin at the `# BUG` line
    Case("leakzoo.nanostyle:no_mask", 1),
    Case("leakzoo.nanostyle:off_by_one", 1, built=True, also=NANO_APPLY),
    Case("leakzoo.nanostyle:open_pair", 1, built=True, also=NANO_APPLY),
    Case("leakzoo.nanostyle:mask_after_softmax", 1),
    Case("leakzoo.nanostyle:wrong_corner", 1),
    Case("leakzoo.nanostyle:prints_and_leaks", 1),
    Case("leakzoo.nanostyle:sdpa_not_causal", 1),
    Case("leakzoo.nanostyle:sdpa_float_mask", 1),
    Case("leakzoo.mingptstyle:head_split_reshape", 1),
    Case("leakzoo.mingptstyle:last_layer_unmasked", 1, built=True, also=MIN_APPLY),
    Case("leakzoo.plain:ln_over_time", 1),
    Case("leakzoo.plain:tiny_mean", 1),
    Case("leakzoo.plain:packed_batch", 1),  # a batch leak
    Case("leakzoo.plain:positions_from_right", 1, built=True, also=("plain-pos",)),  # length-dependent
    Case("leakzoo.hfwrap:drops_mask", 1, also=("wrap-sdpa",)),  # a padding leak; or the attention call it corrupts
]


def _param(case: Case):
    return pytest.param(case, id=case.id)


def audit_cli(spec: str, flags: tuple[str, ...], folder: Path) -> tuple[int, dict | None]:
    """`interp audit-leakage SPEC --json FILE FLAGS` in-process: the exit code and the envelope (None if none)."""
    from interp import cli

    target = folder / "audit.json"
    target.unlink(missing_ok=True)
    try:
        code = cli.main(["audit-leakage", spec, "--quiet", "--json", str(target), *flags])
    except SystemExit as stop:  # argparse: an unknown flag
        code = stop.code if isinstance(stop.code, int) else 2
    return code, json.loads(target.read_text()) if target.exists() else None


def _same_file(reported: str, expected: Path) -> bool:
    path = Path(reported)
    if path.is_absolute():
        return path.resolve() == expected.resolve()
    return expected.resolve().as_posix().endswith("/" + path.as_posix())


def _assert_origin(envelope: dict | None, path: Path, lines: set[int], what: str) -> None:
    assert envelope is not None, f"{what}: no JSON envelope written"
    origin = envelope["result"].get("origin")
    assert origin, f"{what}: result has no origin: {sorted(envelope['result'])}"
    assert _same_file(origin["file"], path), f"{what}: origin in {origin['file']}, expected {path}"
    near = min(abs(origin["line"] - line) for line in lines)
    assert near <= TOLERANCE, f"{what}: origin line {origin['line']} ({origin.get('code')!r}), expected one of {sorted(lines)}"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_cli_exit_code(case, on_path, tmp_path):
    code, envelope = audit_cli(case.spec, case.flags, tmp_path)
    assert code == case.exit, f"{case.id}: exit {code}, expected {case.exit}"
    assert envelope is not None and envelope["result"]["exit_code"] == case.exit
    result = envelope["result"]
    if case.exit == 0:  # no false alarm: a correct model has no origin
        assert not result.get("origin") and not result.get("origins")
    # only a declared encoder (or the user's flag) is called bidirectional, never an undeclared decoder
    assert (result["verdict"] == "bidirectional") == case.factory.startswith("bert"), result["headline"]


@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.exit])
def test_cli_names_the_line(case, on_path, tmp_path):
    _, envelope = audit_cli(case.spec, case.flags, tmp_path)
    _assert_origin(envelope, case.path, case.lines(), case.id)
    assert envelope is not None and len(envelope["result"]["origins"]) == len(envelope["result"]["leaks"])


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not c.flags])
def test_python_api_verdict(case, on_path, capsys):
    from interp.analyses import leakage

    module, factory = case.spec.split(":")
    report = leakage.audit(getattr(importlib.import_module(module), factory)())
    assert report.exit_code == case.exit, str(report)
    assert report.bidirectional == case.factory.startswith("bert")


def test_markers_are_where_the_table_says():
    """Each case's marked lines exist once; build-bug cases name the lines applying the mask."""
    for case in CASES:
        if case.exit:
            assert case.lines(), case.id
        assert case.built <= bool(case.also), case.id


# ---------------------------------------------------------------------------------------------
# Mutants
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mutant_folder(tmp_path_factory) -> tuple[Path, dict[str, mutants.Mutant]]:
    folder = tmp_path_factory.mktemp("mutants")
    leaky, skipped = mutants.generate(folder)
    return folder, {m.name: m for m in leaky + skipped}


# the default suite's share of the sweep (the rest is marked slow): a deletion, a mask-built edit,
# a moved mask, a wrong slice, two equivalent mutants and a broken (NaN) one
REPRESENTATIVE = {"nano_delete_mask", "nano_triu", "min_after_softmax", "min_wrong_corner", "nano_corner_bottom_right",
                  "nano_inf_to_big", "min_corner_top_right"}


def _mutant_params(leaking: bool | None = None):
    params = []
    for name in mutants.names(leaking):
        short = name.removeprefix("leakzoo_mutant_")
        params.append(pytest.param(name, id=short, marks=[] if short in REPRESENTATIVE else [pytest.mark.slow]))
    return params


def test_mutants_are_judged(mutant_folder):
    """Every edit applied where it was meant; leaking and non-leaking ones listed, each with its reason."""
    _, made = mutant_folder
    assert sorted(made) == sorted(mutants.names())
    for mutant in made.values():
        text = mutant.path.read_text().splitlines()
        assert 1 <= mutant.line <= len(text)
        assert mutant.leaks or mutant.reason, mutant.name
        assert mutant.mask_built <= bool(mutant.also)  # a mask-built edit always names where the mask is applied
        assert all("@ v" in text[line - 1] for line in mutant.also) if not mutant.mask_built else True
        if mutant.deleted:
            assert "softmax" in text[mutant.line - 1], (mutant.name, text[mutant.line - 1])
    assert {m.expected_exit for m in made.values()} == {0, 1, 2}


@pytest.mark.parametrize("name", _mutant_params())
def test_mutant_exit_code(name, mutant_folder, on_path, monkeypatch, tmp_path):
    folder, made = mutant_folder
    monkeypatch.syspath_prepend(str(folder))
    mutant = made[name]
    code, envelope = audit_cli(mutant.spec, (), tmp_path)
    assert code == mutant.expected_exit, f"{name} ({mutant.edit}): exit {code}, expected {mutant.expected_exit}"
    if code == 0:  # an equivalent mutant is a causal decoder, not an excused "encoder"
        assert envelope is not None
        assert envelope["result"]["verdict"] != "bidirectional", envelope["result"]["headline"]


@pytest.mark.parametrize("name", _mutant_params(leaking=True))
def test_mutant_origin(name, mutant_folder, on_path, monkeypatch, tmp_path):
    folder, made = mutant_folder
    mutant = made[name]
    monkeypatch.syspath_prepend(str(folder))
    _, envelope = audit_cli(mutant.spec, (), tmp_path)
    _assert_origin(envelope, mutant.path, {mutant.line, *mutant.also}, f"{name} ({mutant.edit})")


@pytest.mark.parametrize("name", _mutant_params())
def test_mutant_python_api(name, mutant_folder, monkeypatch, capsys):
    """The judgement checked with the API: leaking mutants leak, equivalent ones are causal, broken ones refused."""
    from interp.analyses import leakage
    from interp.errors import exit_code_for

    folder, made = mutant_folder
    monkeypatch.syspath_prepend(str(folder))
    mutant = made[name]
    module, factory = mutant.spec.split(":")
    model = getattr(importlib.import_module(module), factory)()
    try:
        code = leakage.audit(model).exit_code
    except Exception as error:  # a broken (NaN) model: refused as the user's model, exit 2
        code = exit_code_for(error)
    assert code == mutant.expected_exit, f"{name} ({mutant.edit}): {mutant.reason}"


# ---------------------------------------------------------------------------------------------
# Machine output
# ---------------------------------------------------------------------------------------------

@pytest.mark.heavy
@pytest.mark.parametrize("spec, code", [("leakzoo.nanostyle:prints_and_leaks", 1), ("leakzoo.plain:writes_fd1", 0)])
def test_json_to_stdout_is_one_document(spec, code):
    """A model printing while it is built (sys.stdout) or writing to fd 1 in its forward: stdout holds only the envelope."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "interp.cli", "audit-leakage", spec, "--quiet", "--json", "-"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == code, done.stderr[-2000:]
    envelope = json.loads(done.stdout)  # raises on anything but exactly one document
    assert envelope["command"] == "audit-leakage" and envelope["result"]["exit_code"] == code
