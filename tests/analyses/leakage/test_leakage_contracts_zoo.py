"""Known answers for the contracts of modern stacks (issue 40): packed documents, KV caches, sliding
windows and attention implementations. Every case of the zoos (tests/leakzoo/packed.py, kvcache.py,
windows.py, backends.py) is judged by its contract's explicit-mask reference (leakzoo.references):
each correct model is clean, each bug is caught with the kinds `leakzoo.catalogue` lists, far from
the threshold on both sides, first where the mechanism says; each `# BUG` marker exists once.

The references themselves are checked on constructed answers: the composed reach of windowed layers,
document layouts and conventions, the float32 fallback, NaN outputs, a model without a cache.
"""
from __future__ import annotations

import re
import tokenize

import pytest
import torch

pytest.importorskip("transformers")

from leakzoo import marked_line, references  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)
from leakzoo.catalogue import CASES, INNER_EOS, ContractCase  # noqa: E402
from leakzoo.references import Finding, Layout  # noqa: E402

CLEAN = 1e-12  # float64: what a correct model's protected outputs may move, relative (they measure ~1e-15)
CAUGHT = 1e-4  # the least a leak of the zoo moves them (they measure 1e-2 and more)
NO_FLEX = ("eager", "sdpa")


def _params(cases, flex_heavy: bool = True):
    return [pytest.param(c, id=c.id, marks=[pytest.mark.heavy] if (flex_heavy and c.flex) else []) for c in cases]


def _implementations(case: ContractCase) -> tuple[str, ...]:
    return references.IMPLEMENTATIONS if case.flex else NO_FLEX


@pytest.fixture(scope="module")
def verdicts() -> dict[str, references.Reference]:
    """Each case judged once (back-ends without FlexAttention unless the bug needs it)."""
    return {}


def _verdict(case: ContractCase, verdicts: dict) -> references.Reference:
    if case.id not in verdicts:
        verdicts[case.id] = case.reference(implementations=_implementations(case))
    return verdicts[case.id]


@pytest.mark.parametrize("case", _params(CASES))
def test_reference_verdict(case, verdicts):
    verdict = _verdict(case, verdicts)
    assert verdict.kinds == case.kinds, str(verdict)
    assert verdict.dtype == "float64", verdict.notes
    if case.correct:
        assert verdict.max_influence < CLEAN, str(verdict)
    for kind in case.kinds - {"over-masked"}:
        assert verdict.worst(kind) > CAUGHT, str(verdict)
    if case.runs is not None:
        assert set().union(*(verdict.runs_with(kind) for kind in case.kinds)) == case.runs, str(verdict)


@pytest.mark.parametrize("case", _params([c for c in CASES if "over-masked" in c.kinds]))
def test_over_masking_is_exact(case, verdicts):
    """A cut document: the earlier tokens of the document move nothing after the cut, exactly."""
    verdict = _verdict(case, verdicts)
    assert all(f.influence == 0.0 for f in verdict.findings if f.kind == "over-masked")


# ---------------------------------------------------------------------------------------------
# Where each mechanism shows first (layout: documents of 5, 4, 7 tokens at 0, 5, 9; an EOS at 12)
# ---------------------------------------------------------------------------------------------

FIRST = {
    # the first token of the second document reads the first document
    ("packing_needs_no_mask", "document"): (5, 0),
    ("causal_kernel_drops_documents", "document"): (5, 0),
    ("eos_keyed_mask", "document"): (5, 0),
    ("positions_reset_only", "document"): (5, 0),
    ("chunked_replaces_documents", "document"): (5, 0),
    ("varlen_off_by_one", "document"): (5, 0),
    # the token after the EOS no longer reads the start of its document (position 9)
    ("eos_keyed_mask", "over-masked"): (INNER_EOS + 1, 9),
    ("eos_over_masks", "over-masked"): (INNER_EOS + 1, 9),
    # the second document's first token went to the first: the second document's next token lost it
    ("varlen_off_by_one", "over-masked"): (6, 5),
    # prefix 1: the first decoded token (position 1) reads key 0 only, not itself
    ("top_left_causal", "kv_cache"): (1, None),
    # a chunk of 3 decoded after a prefix of 1: its first token reads the next ones
    ("decode_noop_mask", "future"): (1, 2),
    # a prefill of 5 > W = 4 into the ring: position 0 reads the slot position 4 overwrote
    ("ring_prefill_overwrite", "future"): (0, 1),
    ("noncausal_when_short", "future"): (0, 1),
    # W + 1 keys in each of 2 layers: the first token out of reach, L (W - 1) + 1 = 7 back, moves
    ("off_by_one", "window"): (7, 0),
}


@pytest.mark.parametrize("name, kind", list(FIRST))
def test_first_affected_position(name, kind, verdicts):
    case = next(c for c in CASES if c.factory == name)
    first = _verdict(case, verdicts).first(kind)
    assert first is not None and (first.query, first.key) == FIRST[name, kind], first


def test_window_off_by_one_reaches_exactly_one_more_per_layer(verdicts):
    """Two layers of W + 1 = 5 keys reach 8 back: the out-of-reach pairs found are those 7 and 8 back, no further."""
    case = next(c for c in CASES if c.factory == "off_by_one")
    found = {f.query - f.key for f in _verdict(case, verdicts).findings if f.kind == "window"}
    assert found == {7, 8}


SDPA_WINDOWS = [c for c in CASES if c.module == "leakzoo.windows" and c.factory in (
    "hf_window", "hf_mixed", "noncausal_when_short", "off_by_one", "two_sided_window", "one_layer_wide",
    "hidden_by_full_layer")]  # the window zoo that calls scaled_dot_product_attention with its masks


@pytest.mark.parametrize("case", _params(SDPA_WINDOWS))
def test_the_mask_reference_agrees_with_the_catalogue(case):
    """Each layer's mask, read at its attention call, against its window: the catalogue's kinds and leaking runs."""
    verdict = references.window_masks(case.model())
    assert verdict.kinds == case.kinds, str(verdict)
    if case.runs is not None:
        assert set().union(*(verdict.runs_with(kind) for kind in case.kinds)) == case.runs, str(verdict)


def test_only_the_masks_show_a_window_hidden_by_a_full_layer():
    case = next(c for c in CASES if c.factory == "hidden_by_full_layer")
    assert not references.windows(case.model()).leaks  # every earlier token is in reach through the full layer
    verdict = references.window_masks(case.model())
    assert {f.query - f.key for f in verdict.findings} == {4}  # W + 1 = 5 keys: the one 4 back is outside W = 4


def test_packing_path_leaks_only_with_a_mask(verdicts):
    """The packing path taken only without a mask: clean in the default run, leaking with an all-ones mask."""
    case = next(c for c in CASES if c.factory == "packing_needs_no_mask")
    verdict = _verdict(case, verdicts)
    assert set(verdict.runs) == {"default", "use_cache=False", "attention_mask=ones", "use_cache=True"}
    assert verdict.runs_with("document") == {"attention_mask=ones"}


# ---------------------------------------------------------------------------------------------
# The zoo's source: markers and factories
# ---------------------------------------------------------------------------------------------

ZOO_FILES = sorted({c.path for c in CASES})


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not c.correct])
def test_bug_marker_once(case):
    line = marked_line(case.path, "BUG", case.factory)
    assert line > 0
    for site in case.sites:
        assert marked_line(case.path, "SITE", site) > 0


@pytest.mark.parametrize("path", ZOO_FILES, ids=lambda p: p.name)
def test_every_marked_bug_is_a_case(path):
    """No `# BUG` line without its case in the catalogue, no catalogued bug of the file without its line."""
    with open(path, encoding="utf-8") as source:
        comments = [t.string for t in tokenize.generate_tokens(source.readline) if t.type == tokenize.COMMENT]
    marked = {m.group(1) for c in comments if (m := re.match(r"#\s*BUG:\s*([a-z0-9_]+)", c))}
    cased = {c.factory for c in CASES if c.path == path and not c.correct}
    assert marked == cased


def test_each_contract_has_a_correct_model_and_three_bugs():
    for contract in ("document", "kv_cache", "window", "backend"):
        mine = [c for c in CASES if c.contract == contract]
        assert sum(c.correct for c in mine) >= 1 and sum(not c.correct for c in mine) >= 3, contract


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.contract != "backend"][:6])
def test_factories_are_deterministic(case):
    first, second = case.model(), case.model()
    assert not first.training
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------------------------------
# The references on constructed answers
# ---------------------------------------------------------------------------------------------

def test_reach_composes_windows():
    reached = references.reach(12, [4, 4])
    distance = torch.arange(12)[:, None] - torch.arange(12)[None, :]
    assert torch.equal(reached, (distance >= 0) & (distance <= 6))
    assert torch.equal(references.reach(12, [4, None]), distance >= 0)  # a full layer reaches everything earlier
    assert torch.equal(references.reach(5, [2, 3, 2]), (distance[:5, :5] >= 0) & (distance[:5, :5] <= 4))


def test_layout_with_separators():
    layout = Layout(lengths=(2, 3, 1), doc_sep=9)
    assert layout.documents().tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert layout.separators().nonzero().flatten().tolist() == [2, 6]
    tokens = layout.tokens(16, torch.Generator().manual_seed(0))
    assert tokens[[2, 6]].tolist() == [9, 9] and (tokens[~layout.separators()] != 9).all()
    assert layout.convention_kwargs("doc_sep") == {}


def test_layout_conventions():
    layout = Layout(lengths=(2, 3))
    assert layout.convention_kwargs("position_ids")["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    assert layout.convention_kwargs("cu_seqlens")["cu_seqlens"].tolist() == [0, 2, 5]
    assert layout.convention_kwargs("segment_ids")["segment_ids"].tolist() == [[0, 0, 1, 1, 1]]


def test_document_convention_is_the_first_the_signature_takes():
    class Both(torch.nn.Module):
        def forward(self, input_ids, document_ids=None, position_ids=None):
            return input_ids

    class Varlen(torch.nn.Module):
        def forward(self, input_ids, cu_seq_lens=None, **kwargs):
            return input_ids

    class Neither(torch.nn.Module):
        def forward(self, input_ids, **kwargs):  # **kwargs declares nothing
            return input_ids

    assert references.document_convention(Both()) == "position_ids"
    assert references.document_convention(Varlen()) == "cu_seq_lens"
    with pytest.raises(TypeError, match=r"position_ids, cu_seq_lens/cu_seqlens, document_ids/seq_ids/segment_ids.*doc_sep"):
        references.document_convention(Neither())


def test_inner_eos_cannot_be_the_separator():
    case = next(c for c in CASES if c.factory == "nano_doc_sep")
    with pytest.raises(ValueError, match="separator"):
        references.documents(case.model(), Layout(doc_sep=1, inner_eos=(3,), eos=1))


def test_kv_cache_needs_a_cache():
    case = next(c for c in CASES if c.factory == "varlen_packed")  # a forward without past_key_values, no step()
    with pytest.raises(TypeError, match="past_key_values.*step"):
        references.kv_cache(case.model())


class _Float32Only(torch.nn.Module):
    """Refuses float64, as compiled FlexAttention on CPU does; otherwise a causal running sum."""

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"vocab_size": 8})()
        self.embed = torch.nn.Embedding(8, 8)

    def forward(self, input_ids, **kwargs):
        if self.embed.weight.dtype == torch.float64:
            raise NotImplementedError("float64 is not supported here")
        return self.embed(input_ids).cumsum(1)


def test_float32_fallback_is_said():
    verdict = references.windows(_Float32Only(), [None], lengths=(6,))
    assert verdict.dtype == "float32" and not verdict.leaks
    assert any("float64 refused (NotImplementedError: float64 is not supported here)" in n for n in verdict.notes)
    assert verdict.threshold == pytest.approx(torch.finfo(torch.float32).eps ** 0.5)


def test_nan_counts_as_an_infinite_change():
    """A protected output turned NaN by a perturbation (an empty mask row, say) is a leak, not a comparison that fails."""
    rows = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[1.0, float("nan")], [3.0, 4.5]]])  # (row, pos, vocab)
    change = references._influence(rows, scale=2.0)
    assert change.tolist() == [[float("inf"), 0.25]]


def test_reference_summary_names_kind_query_and_runs():
    verdict = references.Reference("document", (Finding("document", "default", 5, 0, 0.5),), 0.5, 1e-8, 0.0,
                                    "float64", ("default",))
    assert str(verdict) == "document: document (query 5 from key 0, 5.0e-01, runs: default)"
    assert verdict.first() == verdict.first("document") and verdict.first("window") is None
