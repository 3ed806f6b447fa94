"""What `transformers` 5.x really does under the contracts of issue 40, pinned: tiny random Llama, Qwen2,
Mistral (sliding window 4) and GPT-2 under eager, sdpa and flex_attention (unfused), judged by the
explicit-mask references (`leakzoo.measure_hf_contracts`, which prints the whole table).

Found on transformers 5.24 / torch 2.13 CPU, float64:
- packed documents (`position_ids` restarting at 0) are isolated only with `use_cache=False` and no
  `attention_mask`: the default call (`use_cache` taken from `config.use_cache`, True), an all-ones mask,
  or `use_cache=True` let every later document read the earlier ones, under every implementation, in
  evaluation and in training mode; an explicit 4D block-diagonal mask isolates them in every call;
- prefill + decode equals the full forward (to ~1e-16), nothing later in a call moves earlier logits;
- Mistral's window holds for prompts shorter and longer than the window, but not under an explicit 4D
  mask, which replaces it;
- the implementations agree (within their own float32 deviation) and are each causal; GPT-2 takes no
  flex_attention.
If a release changes any of these, this file says which and the table in the docs needs a new look.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from leakzoo import measure_hf_contracts as measure  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)

LEAKING = {"default", "attention_mask=ones", "use_cache=True"}
LEAKING_RUNS = LEAKING | {f"train(), {run}" for run in LEAKING}
ISOLATED_RUNS = {"use_cache=False", "train(), use_cache=False", "4D mask, default", "4D mask, use_cache=False",
                 "4D mask, use_cache=True"}


@pytest.fixture(scope="module", params=measure.FAMILIES)
def table(request) -> tuple[str, list[measure.Row]]:
    return request.param, measure.measure((request.param,), flex="eager")


def _rows(rows, contract):
    return [r for r in rows if r.contract == contract]


@pytest.mark.heavy
def test_packed_documents_isolated_only_without_cache_or_mask(table):
    family, rows = table
    documents = _rows(rows, "document")
    implementations = {"eager", "sdpa"} | ({"flex_attention"} if family != "gpt2" else set())
    assert {r.implementation for r in documents} == implementations
    for implementation in implementations:
        assert {r.run for r in documents if r.implementation == implementation} == LEAKING_RUNS | ISOLATED_RUNS
    for row in documents:
        assert row.dtype == "float64"
        if row.run in LEAKING_RUNS:
            assert row.verdict == "document" and row.first == "document: query 5 from key 0", row
            assert row.max_influence > 1e-2
        else:
            assert (row.verdict, row.max_influence) == ("clean", 0.0), row


@pytest.mark.heavy
def test_kv_cache_and_windows_hold(table):
    family, rows = table
    windows = [r for r in _rows(rows, "window") if not r.run.startswith("4D mask")]
    for row in _rows(rows, "kv_cache") + windows:
        assert row.verdict == "clean" and row.max_influence < 1e-12, row
    assert {r.run for r in windows} == ({"length 3", "length 12"} if family == "mistral" else set())


@pytest.mark.heavy
def test_a_4d_mask_replaces_the_window(table):
    family, rows = table
    explicit = {r.run: r for r in _rows(rows, "window") if r.run.startswith("4D mask")}
    if family != "mistral":
        assert not explicit
        return
    for implementation in ("eager", "sdpa", "flex_attention"):
        mine = {r.run: r for r in _rows(rows, "window") if r.implementation == implementation}
        assert mine["4D mask, length 3"].verdict == "clean"
        assert mine["4D mask, length 12"].verdict == "window"
        assert mine["4D mask, length 12"].first == "window: query 7 from key 0"


@pytest.mark.heavy
def test_backends_hold(table):
    family, rows = table
    backends = _rows(rows, "backend")
    assert backends and all(r.verdict == "clean" for r in backends), backends
    compared = {r.run for r in backends if " vs " in r.run}
    assert compared == ({"sdpa vs eager"} if family == "gpt2" else {"sdpa vs eager", "flex_attention vs eager"})


@pytest.mark.heavy
def test_gpt2_refuses_flex_attention(table):
    family, rows = table
    refused = [r for r in rows if r.verdict.startswith("n/a")]
    if family == "gpt2":
        assert [r.implementation for r in refused] == ["flex_attention"]
        assert "does not support an attention implementation through torch's flex_attention" in refused[0].verdict
    else:
        assert not refused
