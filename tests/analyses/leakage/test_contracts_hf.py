"""The contract modes on tiny random Hugging Face models (Llama, Qwen2, Mistral with a window of 4, GPT-2, as
`leakzoo.measure_hf_contracts` builds them): each verdict equals the explicit-mask reference's (`leakzoo.references`),
kinds and leaking call patterns alike. What transformers 5.x really does is pinned in test_leakage_contracts_hf.py:
packed documents read each other in the default call, with an all-ones mask and with use_cache=True.
"""
from __future__ import annotations

import pytest

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
