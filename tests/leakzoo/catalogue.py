"""What each case of the contract zoos (`packed`, `kvcache`, `windows`, `backends`) must be judged: the
kinds of leak its explicit-mask reference finds (none for a correct model), the runs they show in where
that is the point of the case, and, for a bug in how a mask is *built*, the `# SITE:` lines applying
it, which count as its origin too. The reference verdicts are asserted in
tests/analyses/leakage/test_leakage_contracts_zoo.py; the audit's modes are to be judged against the same table.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from leakzoo import references
from leakzoo.references import Layout, Reference
from leakzoo.stack import EOS

ZOO = Path(__file__).resolve().parent
INNER_EOS = 12  # an EOS inside the third document of the default layout (5, 4, 7), which must not cut it


@dataclass(frozen=True)
class ContractCase:
    """One zoo model and what its contract's reference must say about it."""

    spec: str  # "leakzoo.module:factory"
    contract: str  # "document" | "kv_cache" | "window" | "backend"
    kinds: frozenset[str] = frozenset()  # the kinds of leak found; empty: correct
    sites: tuple[str, ...] = ()  # `# SITE:` labels that also count as the origin (a bug in how a mask is built)
    runs: frozenset[str] | None = None  # where the case is about a call pattern: the only runs that leak
    doc_sep: int | None = None  # documents: the separator, for a model that finds documents itself
    flex: bool = False  # the bug shows only under FlexAttention (seconds on CPU the first time in a process)
    weights_only: bool = False  # windows: only the layers' masks / weights show the bug, never the outputs

    @property
    def id(self) -> str:
        return self.spec.removeprefix("leakzoo.")

    @property
    def module(self) -> str:
        return self.spec.split(":")[0]

    @property
    def factory(self) -> str:
        return self.spec.split(":")[1]

    @property
    def path(self) -> Path:
        return ZOO / (self.module.split(".")[-1] + ".py")

    @property
    def correct(self) -> bool:
        return not self.kinds

    def model(self) -> torch.nn.Module:
        return getattr(importlib.import_module(self.module), self.factory)()

    def reference(self, model: torch.nn.Module | None = None,
                  implementations: tuple[str, ...] = references.IMPLEMENTATIONS) -> Reference:
        """The case's contract, judged by its explicit-mask reference (back-ends: under `implementations`)."""
        model = self.model() if model is None else model
        if self.contract == "document":
            layout = Layout(doc_sep=self.doc_sep) if self.doc_sep is not None else Layout(inner_eos=(INNER_EOS,), eos=EOS)
            return references.documents(model, layout)
        if self.contract == "kv_cache":
            return references.kv_cache(model)
        if self.contract == "window":
            return references.window_masks(model) if self.weights_only else references.windows(model)
        return references.backends(model, implementations)


def _case(spec, contract, kinds=(), **options) -> ContractCase:
    return ContractCase(spec, contract, frozenset(kinds), **options)


PACKED = "packed-sdpa"
CASES = [
    # documents
    _case("leakzoo.packed:hf_packed", "document"),
    _case("leakzoo.packed:hf_chunked", "document"),
    _case("leakzoo.packed:varlen_packed", "document"),
    _case("leakzoo.packed:nano_document_ids", "document"),
    _case("leakzoo.packed:nano_doc_sep", "document", doc_sep=EOS),
    _case("leakzoo.packed:packing_needs_no_mask", "document", {"document"}, sites=(PACKED,),
          runs=frozenset({"attention_mask=ones"})),
    _case("leakzoo.packed:causal_kernel_drops_documents", "document", {"document"}, sites=("fused-causal",)),
    _case("leakzoo.packed:eos_keyed_mask", "document", {"document", "over-masked"}, sites=(PACKED,)),
    _case("leakzoo.packed:positions_reset_only", "document", {"document"}, sites=(PACKED,)),
    _case("leakzoo.packed:chunked_replaces_documents", "document", {"document"}, sites=(PACKED,)),
    _case("leakzoo.packed:eos_over_masks", "document", {"over-masked"}, sites=(PACKED,)),
    _case("leakzoo.packed:varlen_off_by_one", "document", {"document", "over-masked"}, sites=(PACKED,)),
    # KV cache
    _case("leakzoo.kvcache:hf_dynamic", "kv_cache"),
    _case("leakzoo.kvcache:hf_legacy", "kv_cache"),
    _case("leakzoo.kvcache:nano_step", "kv_cache"),
    _case("leakzoo.kvcache:ring_window", "kv_cache"),
    _case("leakzoo.kvcache:top_left_causal", "kv_cache", {"kv_cache"}),
    _case("leakzoo.kvcache:decode_noop_mask", "kv_cache", {"kv_cache", "future"}, sites=("step-sdpa",)),
    _case("leakzoo.kvcache:ring_prefill_overwrite", "kv_cache", {"kv_cache", "future"}, sites=("ring-overwrite-sdpa",)),
    _case("leakzoo.kvcache:ring_mask_by_slot", "kv_cache", {"kv_cache"}, sites=("ring-slot-sdpa",)),
    # sliding windows
    _case("leakzoo.windows:hf_window", "window"),
    _case("leakzoo.windows:hf_mixed", "window"),
    _case("leakzoo.windows:nano_window", "window"),
    _case("leakzoo.windows:noncausal_when_short", "window", {"future"}, sites=("window-sdpa",),
          runs=frozenset({"length 3"})),
    _case("leakzoo.windows:additive_multiplied", "window", {"future", "window"}, sites=("nano-window-softmax",)),
    _case("leakzoo.windows:off_by_one", "window", {"window"}, sites=("window-sdpa",), runs=frozenset({"length 12"})),
    _case("leakzoo.windows:two_sided_window", "window", {"future"}, sites=("window-sdpa",)),
    _case("leakzoo.windows:one_layer_wide", "window", {"window"}, sites=("window-sdpa",), runs=frozenset({"length 12"})),
    _case("leakzoo.windows:hidden_by_full_layer", "window", {"window"}, sites=("window-sdpa",),
          runs=frozenset({"length 12"}), weights_only=True),
    # attention implementations
    _case("leakzoo.backends:hf_switchable", "backend"),
    _case("leakzoo.backends:hf_switchable_window", "backend"),
    _case("leakzoo.backends:nano_switchable", "backend"),
    _case("leakzoo.backends:flex_cropped_block_mask", "backend", {"backend", "future"}, sites=("switch-flex",), flex=True,
          runs=frozenset({"flex_attention", "flex_attention vs eager"})),
    _case("leakzoo.backends:sdpa_drops_window", "backend", {"backend", "window"},
          runs=frozenset({"sdpa", "sdpa vs eager"})),
    _case("leakzoo.backends:block_sparse_window", "backend", {"backend"}, sites=("switch-flex",), flex=True,
          runs=frozenset({"flex_attention vs eager"})),
    _case("leakzoo.backends:sdpa_wrong_scale", "backend", {"backend"}, runs=frozenset({"sdpa vs eager"})),
]
