"""The contracts of modern training and inference stacks, audited on top of causality (`audit(..., packed=True,
window=W, kv_cache=True, attn_impls=[...])`): the same black-box principle as the causal audit (change only what must
not matter; the protected outputs must not move; judged against the floor measured on the model), one verdict per
contract (`ContractResult`, `LeakageReport.contracts[kind]`), each leak located at its line of code.

- `documents` (kind `document`, including a document cut by over-masking): packed documents must not read each other;
- `windows` (kind `window`): a layer declared to see W keys sees no more (its weights, where seen, name the layer);
- `kvcache` (kind `kv_cache`): prefill then decode equals the full forward; nothing later in a call moves it;
- `backends` (kind `backend`): each attention implementation equals the first, and each keeps the other contracts.

Layout: `common` (the verdict, calls, measures) <- `locate` (origins), `layerwise` (the windows per layer, from the
attention weights) <- `windows` <- `documents`, `kvcache`, `backends`; `run_contracts` (here) runs the modes asked
for, in that order.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from interp.analyses.leakage.contracts.backends import (
    _current,
    audit_backends,
    check_implementations,
    flex_stance,
    set_implementation,
)
from interp.analyses.leakage.contracts.common import (
    CONTRACT_KINDS,
    ContractFinding,
    ContractKind,
    ContractResult,
    user_class,
)
from interp.analyses.leakage.contracts.documents import (
    DOCUMENT_CONVENTIONS,
    audit_documents,
    check_doc_sep,
    document_convention,
)
from interp.analyses.leakage.contracts.kvcache import Cached, audit_kv_cache
from interp.analyses.leakage.contracts.windows import audit_windows, check_window, declared_windows
from interp.errors import BadInput, InterpError, ModelError

FLAGS = {"document": "--packed / --doc-sep", "window": "--window", "kv_cache": "--kv-cache",
         "backend": "--attn-impls"}

__all__ = ["CONTRACT_KINDS", "ContractFinding", "ContractKind", "ContractResult", "DOCUMENT_CONVENTIONS",
           "check_contract_arguments", "run_contracts"]


def check_contract_arguments(model: Any, *, packed: bool = False, doc_sep: Any = None, window: Any = None, vocab: int,
                             kv_cache: bool = False, attn_impls: Any = None,
                             packed_prompts: Sequence[Sequence[int]] | None = None, max_len: int | None = None,
                             compiled: bool = False) -> None:
    """The contract arguments against the model, before any forward pass (a BadInput: exit 2): a separator outside
    the vocabulary or absent from the packed prompts given, a model taking no document convention, a window below 1
    or none declared (window="config")."""
    if doc_sep is not None or packed_prompts is not None:
        check_doc_sep(doc_sep, vocab, packed_prompts, max_len)
    elif packed:
        document_convention(model)
    if window == "config":
        if not any(declared_windows(model)):
            raise BadInput(f"{user_class(model).__qualname__} declares no sliding window (config `sliding_window` / "
                           "`layer_types`, `window_size`): give the window its layers must keep (--window W, "
                           "audit(window=W))")
    elif window is not None:
        check_window(window)
    if kv_cache:
        Cached(model)
    if attn_impls is not None:
        check_implementations(model, attn_impls)
    elif compiled:
        raise BadInput("compiled FlexAttention (--compiled, audit(compiled=True)) applies to the implementations "
                       "compared: add --attn-impls (e.g. --attn-impls eager,flex_attention), or drop --compiled")


def run_contracts(model: Any, *, vocab: int, packed: bool = False, doc_sep: int | None = None,
                  window: int | None = None, windowed: bool = False, kv_cache: bool = False,
                  attn_impls: Sequence[str] | str | None = None, seed: int = 0, progress: bool = False,
                  max_len: int | None = None,
                  packed_prompts: Sequence[Sequence[int]] | None = None,
                  compiled: bool = False) -> dict[str, ContractResult]:
    """Each contract asked for, by kind (`windowed`: the window contract with the model's declared window;
    `packed_prompts`: the caller's packed rows for the documents contract, with `doc_sep`; `compiled`: FlexAttention
    as the model calls it, compiled where the model compiles it, instead of forced unfused)."""
    modes: list[tuple[str, Callable[[], ContractResult]]] = []
    if packed or doc_sep is not None or packed_prompts is not None:
        modes.append(("document", lambda: audit_documents(model, vocab=vocab, doc_sep=doc_sep, seed=seed,
                                                          progress=progress, prompts=packed_prompts,
                                                          max_len=max_len if packed_prompts is not None else None)))
    if window is not None or windowed:
        modes.append(("window", lambda: audit_windows(model, vocab=vocab, window=window, seed=seed, progress=progress,
                                                      max_len=max_len)))
    if kv_cache:
        modes.append(("kv_cache", lambda: audit_kv_cache(model, vocab=vocab, seed=seed, progress=progress)))
    if attn_impls is not None:
        modes.append(("backend", lambda: audit_backends(model, vocab=vocab, attn_impls=attn_impls, seed=seed,
                                                        progress=progress, compiled=compiled)))
    results = {kind: _running(kind, mode) for kind, mode in modes}
    backend = results.get("backend")
    if backend is not None:
        implementations = [run for run in backend.runs if " vs " not in run]
        for kind, mode in modes:
            if kind != "backend" and len(implementations) > 1:
                results[kind] = under_each(model, implementations, kind, mode, compiled=compiled)
    return results


def _running(kind: str, mode: Callable[[], ContractResult]) -> ContractResult:
    try:
        return mode()
    except InterpError:
        raise
    except Exception as error:  # the user's model failed on the mode's calls: exit 2, saying which mode
        raise ModelError(f"the {kind} contract could not run: the model raised {type(error).__name__}: {error} "
                         f"(under {FLAGS[kind]}; see `interp audit-leakage --help`)") from error


def under_each(model: Any, implementations: list[str], kind: str, mode: Callable[[], ContractResult], *,
               compiled: bool = False) -> ContractResult:
    """The contract `kind` audited under each attention implementation (FlexAttention unfused unless `compiled`), as
    one verdict: its
    runs and findings named "implementation: run", the largest floor, the first origin found; the model's own
    implementation restored after."""
    original = _current(model)
    done: list[tuple[str, ContractResult]] = []
    try:
        with flex_stance(compiled):
            for name in implementations:
                set_implementation(model, name)
                done.append((name, _running(kind, mode)))
    finally:
        if original in implementations:
            set_implementation(model, original)
    findings = tuple(replace(f, run=f"{name}: {f.run}") for name, result in done for f in result.findings)
    runs = {f"{name}: {run}": value for name, result in done for run, value in result.runs.items()}
    statuses = {result.status for _, result in done}
    status = next((word for word in ("leak", "noise", "exact zero", "not applicable") if word in statuses), "noise")
    origin = next((result.origin for _, result in done if result.origin is not None), None)
    shared = set.intersection(*(set(result.notes) for _, result in done)) if done else set()
    notes = tuple(dict.fromkeys(note if note in shared else f"{name}: {note}" for name, result in done
                                for note in result.notes))
    return ContractResult(kind, status, max(result.max_influence for _, result in done),
                          max(result.floor for _, result in done), max(result.threshold for _, result in done),
                          "float64" if all(result.dtype == "float64" for _, result in done) else "float32",
                          findings, runs, notes + (f"audited under each implementation: {', '.join(implementations)}",),
                          origin, sum(result.seconds for _, result in done))
