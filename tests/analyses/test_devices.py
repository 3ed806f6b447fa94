"""`device=` / `dtype=` on the analyses outside `interp.analyses.redundancy` (its own are in tests/analyses/redundancy/test_redundancy.py).

Every entry point moves a copy of the model through `interp.launch.move`: the numbers in bfloat16
are those of a copy cast by hand, close to float32's within the tolerances below, the caller's
model is left as it was, device="cpu" changes nothing, and a bad device or dtype is a BadInput.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from interp import claims as interp_claims
from interp.analyses import claims as hc
from interp.analyses import induction, leakage, positional, report
from interp.analyses.claims import scanning
from interp.data import repeated_tokens
from interp.errors import BadInput
from interp.models.zoo import build

BF16_WEIGHT_ATOL = 5e-3  # attention weights and rates, mean distance (in positions): bfloat16 vs float32 on tiny_gpt (7e-4 seen)
BF16_COPYING_ATOL = 1e-2  # OV eigenvalue copying score in [-1, 1] (1e-3 seen)
BF16_EFFECT_ATOL = 1e-2  # a claim's observational effect, an attention weight (7e-5 seen)


def _prompts(n: int = 8):
    return repeated_tokens(n, 8, 40, seed=3)


def _columns(frame, names):
    return {name: frame[name].to_numpy(dtype=float) for name in names}


def _tensors(values: dict):
    return {name: value.numpy().astype(float) for name, value in values.items()}


def _verdicts(verdicts):
    return {"effect": np.array([e.effect for v in verdicts for e in v.evidence], dtype=float)}


WEIGHTS = ["prev_token", "self_token", "first_token", "local_window", "mean_distance", "entropy"]
CLAIMS = [hc.previous_token_head(0, 1), hc.induction_head(1, 2)]
EVIDENCE = ["observational"]

# entry point -> (call(model, prompts, **placement) -> {name: array}, {name: bfloat16 tolerance} or None
# where the output is not a number to compare, e.g. a list of claims)
PLACED = {
    "positional.focus": (lambda m, p, **k: _columns(positional.focus(m, p, **k), WEIGHTS),
                         dict.fromkeys(WEIGHTS, BF16_WEIGHT_ATOL)),
    "positional.focus_per_prompt": (lambda m, p, **k: _tensors({w: v for w, v in positional.focus_per_prompt(m, p, **k).items()
                                                                if w in WEIGHTS}),
                                    dict.fromkeys(WEIGHTS, BF16_WEIGHT_ATOL)),
    "positional.offset_profile": (lambda m, p, **k: _columns(positional.offset_profile(m, p, **k), ["weight"]),
                                  {"weight": BF16_WEIGHT_ATOL}),
    "induction.scores": (lambda m, p, **k: _columns(induction.scores(m, p, **k), ["induction", "duplicate_token", "copying"]),
                         {"induction": BF16_WEIGHT_ATOL, "duplicate_token": BF16_WEIGHT_ATOL, "copying": BF16_COPYING_ATOL}),
    "induction.scores_per_prompt": (lambda m, p, **k: _tensors(induction.scores_per_prompt(m, p, **k)),
                                    {"induction": BF16_WEIGHT_ATOL, "duplicate_token": BF16_WEIGHT_ATOL}),
    "induction.copying_scores": (lambda m, p, **k: {"copying": induction.copying_scores(m, **k).numpy().astype(float)},
                                 {"copying": BF16_COPYING_ATOL}),
    "claims.propose": (lambda m, p, **k: {"claims": np.array([c.name for c in hc.propose(m, p, **k)])}, None),
    "claims.scan": (lambda m, p, **k: _columns(hc.scan(m, _prompts(16), evidence=EVIDENCE, **k), ["observational"]),
                         {"observational": BF16_EFFECT_ATOL}),
    "claims.test_claims": (lambda m, p, **k: _columns(interp_claims.test_claims(m, CLAIMS, p, evidence=EVIDENCE, **k),
                                                      ["observational"]),
                           {"observational": BF16_EFFECT_ATOL}),
    "claims.evaluate_claims": (lambda m, p, **k: _verdicts(interp_claims.evaluate_claims(m, CLAIMS, p, evidence=EVIDENCE, **k)),
                               {"effect": BF16_EFFECT_ATOL}),
    # the audit's tol follows the dtype: its influences are compared with their own precision's rounding
    "leakage.audit": (lambda m, p, **k: {"tol": np.array(leakage.audit(m, max_len=8, methods=("truncation",), **k).tol)},
                      None),
    "report.compute": (lambda m, p, **k: _columns(report.compute(m, prompts=_prompts(16), leakage_len=8, **k).heads,
                                                  WEIGHTS + ["induction", "importance"]),
                       {**dict.fromkeys(WEIGHTS + ["induction"], BF16_WEIGHT_ATOL), "importance": 1e-2}),
}


def _assert_same(a: dict, b: dict, name: str) -> None:
    assert a.keys() == b.keys(), name
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}.{key}")


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(PLACED))
def test_dtype_runs_a_cast_copy_close_to_float32(tiny_gpt, name):
    call, tolerances = PLACED[name]
    prompts = _prompts()
    full, half = call(tiny_gpt, prompts), call(tiny_gpt, prompts, dtype="bfloat16")
    assert next(tiny_gpt.parameters()).dtype == torch.float32  # the caller's model was copied, not cast
    _assert_same(half, call(copy.deepcopy(tiny_gpt).to(torch.bfloat16), prompts), name)  # what a cast by hand gives
    if tolerances is None:
        return
    moved = 0.0
    for key, atol in tolerances.items():
        gap = float(np.nanmax(np.abs(half[key] - full[key])))
        assert gap <= atol, (name, key, gap)
        moved = max(moved, gap)
    assert moved > 1e-7, "bfloat16 gave float32's numbers exactly: the dtype was not applied"


def test_propose_measures_the_cast_copy(tiny_gpt, monkeypatch):
    seen = []
    measure = scanning.argmax_offsets_per_prompt

    def spy(model, prompts, **kwargs):
        seen.append(next(model.parameters()).dtype)
        return measure(model, prompts, **kwargs)

    monkeypatch.setattr(scanning, "argmax_offsets_per_prompt", spy)
    hc.propose(tiny_gpt, _prompts(), dtype=torch.float16)
    assert seen == [torch.float16]


def test_the_audits_tolerance_follows_the_dtype(tiny_gpt):
    assert leakage.audit(tiny_gpt, max_len=8, methods=("truncation",)).tol == leakage.DEFAULT_TOL
    half = leakage.audit(build("hooked_gpt_unmasked_layer"), max_len=16, dtype="bfloat16")
    assert half.tol == leakage.HALF_PRECISION_TOL and half.verdict == "leak"


def test_build_report_hands_the_placement_to_compute(tiny_gpt, tmp_path, monkeypatch):
    seen = {}

    def fake_compute(model, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    import interp.analyses.report.build as report_build

    monkeypatch.setattr(report_build, "compute", fake_compute)  # build_report's own name for it
    with pytest.raises(RuntimeError, match="stop here"):
        report.build_report(tiny_gpt, tmp_path / "out", prompts=_prompts(), device="cpu", dtype="bfloat16")
    assert (seen["device"], seen["dtype"]) == ("cpu", "bfloat16")


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(PLACED))
def test_device_cpu_gives_the_same_numbers(tiny_gpt, name):
    call = PLACED[name][0]
    prompts = _prompts()
    _assert_same(call(tiny_gpt, prompts, device="cpu", dtype=torch.float32), call(tiny_gpt, prompts), name)


BAD = [
    (dict(device="nonsense"), "is not a device"),
    (dict(device="cuda:99"), "CUDA device"),
    (dict(device="xla"), "not supported"),
    (dict(dtype="float64"), "dtype='float64' is not supported"),
    (dict(dtype=torch.int8), "is not supported"),
]


@pytest.mark.parametrize("name", list(PLACED))
@pytest.mark.parametrize("placement,message", BAD)
def test_bad_device_or_dtype_is_bad_input(tiny_gpt, name, placement, message):
    with pytest.raises(BadInput, match=message):
        PLACED[name][0](tiny_gpt, _prompts(4), **placement)


@pytest.mark.parametrize("placement,message", BAD[:1] + BAD[3:4])
def test_build_report_refuses_a_bad_placement_and_writes_nothing(tiny_gpt, tmp_path, placement, message):
    with pytest.raises(BadInput, match=message):
        report.build_report(tiny_gpt, tmp_path / "out", prompts=_prompts(4), **placement)
    assert not (tmp_path / "out").exists()


def test_a_plain_callable_cannot_be_moved():
    with pytest.raises(BadInput, match="cannot be moved"):
        leakage.audit(lambda tokens: tokens[..., None].float(), max_len=4, dtype="bfloat16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(PLACED))
def test_on_gpu_equals_cpu(tiny_gpt, name):
    call, tolerances = PLACED[name]
    prompts = _prompts()
    cpu, gpu = call(tiny_gpt, prompts), call(tiny_gpt, prompts, device="cuda")
    for key in cpu:
        if cpu[key].dtype.kind in "fc":
            np.testing.assert_allclose(gpu[key], cpu[key], rtol=1e-4, atol=1e-5, err_msg=f"{name}.{key}")
        else:
            np.testing.assert_array_equal(gpu[key], cpu[key], err_msg=f"{name}.{key}")
    half = call(tiny_gpt, prompts, device="cuda", dtype="bfloat16")
    for key, atol in (tolerances or {}).items():
        assert float(np.nanmax(np.abs(half[key] - cpu[key]))) <= atol, (name, key)
    assert next(tiny_gpt.parameters()).device.type == "cpu"
