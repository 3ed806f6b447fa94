"""The contract modes on tiny random Hugging Face models (Llama, Qwen2, Mistral with a window of 4, GPT-2, as
`leakzoo.measure_hf_contracts` builds them): each verdict equals the explicit-mask reference's (`leakzoo.references`),
kinds and leaking call patterns alike. What transformers 5.x really does is pinned in test_leakage_contracts_hf.py:
packed documents read each other in the default call, with an all-ones mask and with use_cache=True.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from leakzoo import measure_hf_contracts as measure  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)
from leakzoo import references  # noqa: E402
from leakzoo.references import Layout  # noqa: E402

from interp.analyses.leakage.contracts import run_contracts  # noqa: E402
from interp.analyses.leakage.contracts.documents import INNER_EOS  # noqa: E402

FAMILIES = measure.FAMILIES


def _leaking_runs(findings) -> set[str]:
    return {f.run for f in findings if f.kind != "over-masked"}


@pytest.mark.parametrize("family", FAMILIES)
def test_documents_equal_the_reference(family):
    mine = run_contracts(measure.build(family, "sdpa"), vocab=measure.VOCAB, packed=True)["document"]
    reference = references.documents(measure.build(family, "sdpa"), Layout(inner_eos=(INNER_EOS,), eos=measure.EOS))
    assert set(mine.found) == set(reference.kinds) == {"document"}, (mine.where, str(reference))
    assert _leaking_runs(mine.findings) == _leaking_runs(reference.findings) == {
        "default", "attention_mask=ones", "use_cache=True"}
    assert mine.first("document").query == reference.first("document").query


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_equals_the_reference(family):
    mine = run_contracts(measure.build(family, "sdpa"), vocab=measure.VOCAB, kv_cache=True)["kv_cache"]
    reference = references.kv_cache(measure.build(family, "sdpa"))
    assert set(mine.found) == set(reference.kinds) == set(), (mine.where, str(reference))
    assert mine.status in ("exact zero", "noise") and mine.max_influence < 1e-12


@pytest.mark.parametrize("family", [f for f in FAMILIES if f == "mistral"])
def test_window_equals_the_reference(family):
    mine = run_contracts(measure.build(family, "sdpa"), vocab=measure.VOCAB, windowed=True)["window"]
    reference = references.windows(measure.build(family, "sdpa"))
    assert set(mine.found) == set(reference.kinds) == set(), (mine.where, str(reference))
    assert set(mine.runs) == set(reference.runs)


@pytest.mark.parametrize("family", FAMILIES)
def test_backends_equal_the_reference(family):
    implementations = ("eager", "sdpa")
    mine = run_contracts(measure.build(family, "eager"), vocab=measure.VOCAB, attn_impls=implementations)["backend"]
    reference = references.backends(measure.build(family, "eager"), implementations)
    assert set(mine.found) == set(reference.kinds) == set(), (mine.where, str(reference))


def test_documents_leak_under_every_implementation_and_only_there():
    """With --attn-impls, the documents contract runs under each implementation: transformers' packing path is
    taken only without a cache and a mask, under eager, sdpa and flex_attention alike."""
    results = run_contracts(measure.build("llama", "eager"), vocab=measure.VOCAB, packed=True, attn_impls="all")
    documents = results["document"]
    leaking = {f.run for f in documents.findings}
    assert leaking == {f"{impl}: {run}" for impl in ("eager", "sdpa", "flex_attention")
                       for run in ("default", "attention_mask=ones", "use_cache=True")}
    assert results["backend"].status in ("exact zero", "noise")


class _CausalMask4D(torch.nn.Module):
    """Mistral called with an explicit causal 4D mask (0 / the dtype's minimum), which transformers takes as given: the
    window is replaced by plain causal attention. `output_attentions` is passed through, so the weights are seen."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, use_cache=None, output_attentions=False):
        n, dtype = input_ids.shape[1], next(self.model.parameters()).dtype
        mask = torch.zeros(n, n, dtype=dtype).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), torch.finfo(dtype).min)
        return self.model(input_ids=input_ids, use_cache=use_cache, output_attentions=output_attentions,
                          attention_mask=mask.expand(input_ids.shape[0], 1, n, n))


def test_window_per_layer_under_eager_equals_the_reference():
    """Under eager the weights are observed (output_attentions) and each layer is checked: Mistral keeps its window
    (clean, as the reference says); with an explicit 4D causal mask, which replaces the window, both layers break it
    and the verdict is the reference's (window, at length 12 only)."""
    clean = run_contracts(measure.build("mistral", "eager"), vocab=measure.VOCAB, windowed=True)["window"]
    assert clean.status == "exact zero" and not references.windows(measure.build("mistral", "eager")).kinds
    assert any("attention weights checked (2 layers observed: layer 0, layer 1)" in n for n in clean.notes)
    mine = run_contracts(_CausalMask4D(measure.build("mistral", "eager")), vocab=measure.VOCAB, windowed=True)["window"]
    reference = references.windows(_CausalMask4D(measure.build("mistral", "eager")))
    assert set(mine.found) == set(reference.kinds) == {"window"}, (mine.where, str(reference))
    assert _leaking_runs(mine.findings) == set(reference.runs_with("window")) == {"length 12"}
    assert {f.layer for f in mine.findings if f.layer is not None} == {0, 1}
    assert "in layer 0 (layer 0), head" in mine.origin.detail
