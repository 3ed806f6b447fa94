"""The documents contract (`audit(..., packed=True)`): several documents packed in one row must not read each other.

The model declares where documents start in the first convention its forward accepts (`DOCUMENT_CONVENTIONS`):
`position_ids` restarting at 0 at each document start (Hugging Face's padding-free convention), `cu_seq_lens` /
`cu_seqlens` offsets, or `document_ids` / `seq_ids` / `segment_ids`; or the caller names the token that ends each
document (`doc_sep`), which the model finds itself. Each token of the row is changed, one at a time: the outputs of
every other document and the earlier outputs of its own must not move (kind `document`, or `future` inside its
document), and the later outputs of its own document that its mask lets it reach must move (else `over-masked`: the
model cut a document; an EOS token planted inside a document must not cut it). Some stacks change path when a mask
or a cache is given, so the row runs with the convention alone, with `use_cache=False`, with an all-ones
`attention_mask` and with `use_cache=True`, where the forward takes them.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interp.analyses.leakage.contracts.common import (
    ALL_ONES,
    ContractFinding,
    ContractResult,
    announce_cost,
    call_rows,
    change,
    float64_twin,
    influence,
    judged,
    parameters,
    replace_tokens,
    sample_tokens,
    scale_of,
    scaled,
    timed,
    user_class,
    with_arguments,
)
from interp.analyses.leakage.contracts.locate import origin_of_change, origin_of_hidden
from interp.analyses.leakage.contracts.windows import declared_chunk, declared_windows, reach, same_chunk
from interp.analyses.leakage.fast import FLOAT64_COST
from interp.errors import BadInput
from interp.specs import check_token_rows

DOCUMENT_CONVENTIONS = (("position_ids",), ("cu_seq_lens", "cu_seqlens"), ("document_ids", "seq_ids", "segment_ids"))
LENGTHS = (5, 4, 7)  # the packed documents' lengths: three documents, 16 tokens, unequal so no period hides a leak
INNER_EOS = 12  # a row position inside the third document where the model's EOS is planted (it must not cut it)


def document_convention(model: Any) -> str:
    """The first convention of the model's forward signature that says where documents start; a BadInput naming the
    four when it takes none."""
    names = parameters(model)
    for group in DOCUMENT_CONVENTIONS:
        for name in group:
            if name in names:
                return name
    wanted = "; ".join(" / ".join(f"`{n}`" for n in group) + (" resetting to 0 at each document start"
                                                               if group == ("position_ids",) else "")
                       for group in DOCUMENT_CONVENTIONS)
    raise BadInput(f"the documents contract needs to tell the model where documents start, and "
                   f"{user_class(model).__qualname__}.forward takes none of the conventions: {wanted}; or give the "
                   "token that separates documents, which the model finds itself (--doc-sep TOKEN, "
                   "audit(doc_sep=TOKEN))")


def eos_of(model: Any) -> int | None:
    """The model's end-of-document token, as its config declares it (`eos_token_id`, nanoGPT's `eot_token`)."""
    config = getattr(model, "config", None)
    for name in ("eos_token_id", "eot_token"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


@dataclass(frozen=True)
class Layout:
    """Documents packed in one row: their lengths, a separator ending each but the last (or none), and EOS tokens
    planted inside documents, which must not cut them."""

    lengths: tuple[int, ...] = LENGTHS
    doc_sep: int | None = None
    inner_eos: tuple[int, ...] = ()
    eos: int | None = None
    given: tuple[int, ...] | None = None  # the caller's packed row (`packed_prompts`), else tokens are drawn

    @classmethod
    def of_row(cls, row: Sequence[int], doc_sep: int) -> Layout:
        """The documents of a caller's packed row: the runs of tokens between separators."""
        lengths, current = [], 0
        for token in row:
            if token == doc_sep:
                lengths.append(current)
                current = 0
            else:
                current += 1
        return cls(tuple(lengths) + (current,), doc_sep=doc_sep, given=tuple(row))

    def documents(self) -> torch.Tensor:
        """(T,): the document of each position (a separator belongs to the document it ends)."""
        ids: list[int] = []
        for index, length in enumerate(self.lengths):
            ids += [index] * (length + (self.doc_sep is not None and index < len(self.lengths) - 1))
        return torch.tensor(ids)

    def separators(self) -> torch.Tensor:
        is_sep = torch.zeros(len(self.documents()), dtype=torch.bool)
        if self.doc_sep is not None:
            is_sep[torch.tensor(self.lengths[:-1]).add(1).cumsum(0) - 1] = True
        return is_sep

    def specials(self) -> list[int]:
        return [t for t in (self.eos, self.doc_sep) if t is not None]

    def tokens(self, vocab: int, generator: torch.Generator) -> torch.Tensor:
        if self.given is not None:
            return torch.tensor(self.given, dtype=torch.long)
        tokens = sample_tokens(len(self.documents()), vocab, self.specials(), generator)
        if self.doc_sep is not None:
            tokens[self.separators()] = self.doc_sep
        for position in self.inner_eos:
            assert self.eos is not None  # planted only where the model declares its EOS (`layout_for`)
            tokens[position] = self.eos
        return tokens

    def structural(self) -> torch.Tensor:
        """(T,) bool: the positions never changed (separators, planted EOS tokens)."""
        fixed = self.separators().clone()
        fixed[list(self.inner_eos)] = True
        return fixed

    def convention_kwargs(self, convention: str) -> dict[str, torch.Tensor]:
        if convention == "doc_sep":
            return {}
        if convention == "position_ids":
            return {"position_ids": torch.cat([torch.arange(n) for n in self.lengths])[None]}
        if convention in ("cu_seq_lens", "cu_seqlens"):
            return {convention: torch.tensor([0, *torch.tensor(self.lengths).cumsum(0).tolist()])}
        return {convention: self.documents()[None]}


def layout_for(model: Any, vocab: int, doc_sep: int | None, prompts: Sequence[Sequence[int]] | None = None,
               max_len: int | None = None) -> Layout:
    """The layout audited: the first of the caller's packed prompts holding the separator (its first max_len tokens),
    else the separator given between drawn documents, else the model's EOS planted inside the third document."""
    if doc_sep is not None:
        check_doc_sep(doc_sep, vocab, prompts, max_len)
        if prompts is not None:
            return Layout.of_row(next(row for row in _cropped(prompts, max_len) if doc_sep in row), doc_sep)
        return Layout(doc_sep=doc_sep)
    if prompts is not None:
        check_doc_sep(doc_sep, vocab, prompts, max_len)
    eos = eos_of(model)
    return Layout(inner_eos=(INNER_EOS,), eos=eos) if eos is not None and 0 <= eos < vocab else Layout()


def _cropped(prompts: Sequence[Sequence[int]], max_len: int | None) -> list[list[int]]:
    return [list(row)[:max_len] for row in prompts]


def check_doc_sep(doc_sep: Any, vocab: int, prompts: Sequence[Sequence[int]] | None = None,
                  max_len: int | None = None) -> None:
    """The separator is a token id of the vocabulary and, where the caller gives the packed prompts (token-id lists),
    they are ids of the vocabulary and at least one holds the separator within its first max_len tokens."""
    if prompts is not None and doc_sep is None:
        raise BadInput("packed prompts (--packed-prompts, audit(packed_prompts=...)) tell where documents end only "
                       "through their separator: give it with --doc-sep TOKEN (eos: the config's eos_token_id)")
    if isinstance(doc_sep, bool) or not isinstance(doc_sep, int) or not 0 <= doc_sep < vocab:
        raise BadInput(f"doc_sep={doc_sep!r} is not a token id of this model's vocabulary (0..{vocab - 1}): give the id "
                       "of the token that ends each document in your packed data (often the EOS id)")
    if prompts is None:
        return
    check_token_rows([list(row) for row in prompts], "packed prompts", vocab)
    if not any(doc_sep in row for row in _cropped(prompts, max_len)):
        within = "" if max_len is None else f" within its first {max_len} tokens (--max-len)"
        raise BadInput(f"--doc-sep {doc_sep}: token {doc_sep} is absent from the packed prompts (no row of the "
                       f"{len(prompts)} holds it{within}), so each is one document and no boundary between documents "
                       f"can be checked: give prompts in which documents are packed with token {doc_sep} between "
                       "them, or the separator your data really uses (--doc-sep TOKEN; eos: the config's "
                       "eos_token_id)")


def document_runs(model: Any, layout: Layout, convention: str) -> dict[str, dict[str, Any]]:
    """The call patterns: the convention alone, then (where the forward takes them) use_cache off, an all-ones
    attention_mask, use_cache on."""
    names = parameters(model)
    base: dict[str, Any] = dict(layout.convention_kwargs(convention))
    runs: dict[str, dict[str, Any]] = {"default": dict(base)}
    off = {"use_cache": False} if "use_cache" in names else {}
    if off:
        runs["use_cache=False"] = {**base, **off}
    if "attention_mask" in names:
        runs["attention_mask=ones"] = {**base, **off, "attention_mask": ALL_ONES}
    if off:
        runs["use_cache=True"] = {**base, "use_cache": True}
    return runs


def audit_documents(model: Any, *, vocab: int, doc_sep: int | None = None, seed: int = 0, progress: bool = False,
                    prompts: Sequence[Sequence[int]] | None = None, max_len: int | None = None) -> ContractResult:
    """The documents contract (see the module docstring); `prompts`: the caller's packed rows (with `doc_sep`), of
    which the first holding the separator is audited (its first `max_len` tokens)."""
    started = time.perf_counter()
    layout = layout_for(model, vocab, doc_sep, prompts, max_len)
    convention = "doc_sep" if layout.doc_sep is not None else document_convention(model)
    generator = torch.Generator().manual_seed(seed)
    tokens = layout.tokens(vocab, generator)
    runs = document_runs(model, layout, convention)
    keys = [j for j in range(len(tokens)) if not layout.structural()[j]]
    probe = tokens.expand(len(keys) + 1, -1)
    announce_cost("document", f"{len(runs)} call patterns x {len(keys) + 1} rows of {len(tokens)} tokens "
                  f"({convention}), plus one float64 copy", progress,
                  eta=lambda: scaled(timed(lambda: call_rows(model, probe, runs["default"])), len(runs) * FLOAT64_COST))
    model, dtype, notes = float64_twin(model, lambda m: call_rows(m, tokens[None], runs["default"]))
    rows = torch.stack([tokens] + [replace_tokens(tokens, [j], vocab, layout.specials(), generator) for j in keys])
    findings, floor, per_run = _measure(model, rows, keys, layout, runs)
    result = judged("document", findings, per_run, floor=floor, dtype=dtype,
                    notes=notes + (f"convention: {convention}; documents of {list(layout.lengths)} tokens"
                                   + (f", an EOS at position {layout.inner_eos[0]}" if layout.inner_eos else "")
                                   + _given(layout, prompts, max_len),))
    origin = _origin(model, result, rows, keys, layout, runs) if result.leaks else None
    return ContractResult(**{**vars(result), "origin": origin, "seconds": time.perf_counter() - started})


def _given(layout: Layout, prompts: Sequence[Sequence[int]] | None, max_len: int | None) -> str:
    """Which of the caller's packed prompts was audited."""
    if prompts is None or layout.given is None:
        return ""
    index = next(i for i, row in enumerate(_cropped(prompts, max_len)) if tuple(row) == layout.given)
    cropped = " (its first max_len tokens)" if max_len is not None and len(prompts[index]) > max_len else ""
    return f"; packed prompt {index} of {len(prompts)}{cropped}, the first holding the separator"


def _measure(model: Any, rows: torch.Tensor, keys: list[int], layout: Layout, runs: dict[str, dict[str, Any]]):
    """Every run's candidate findings, the floor (row 0 alone against inside the batch) and each run's largest change."""
    document, is_sep = layout.documents(), layout.separators()
    n_pos = rows.shape[1]
    visible = reach(n_pos, declared_windows(model)) & same_chunk(n_pos, declared_chunk(model))
    findings: list[ContractFinding] = []
    floor, per_run = 0.0, {}
    for run, kwargs in runs.items():
        logits = call_rows(model, rows, kwargs)
        scale = scale_of(logits[0])
        floor = max(floor, float(change(call_rows(model, rows[:1], kwargs)[0], logits[0], scale).max()))
        moved = influence(logits, scale)  # (key, query)
        per_run[run] = 0.0
        for u, j in enumerate(keys):
            for i in range(n_pos):
                size = float(moved[u, i])
                if document[i] != document[j] or j > i:
                    per_run[run] = max(per_run[run], size)
                    findings.append(ContractFinding("document" if document[i] != document[j] else "future", run, i, j, size))
                elif j < i and visible[i, j] and not is_sep[i]:  # a separator's output may belong to either side
                    findings.append(ContractFinding("over-masked", run, i, j, size))
    return findings, floor, per_run


def _origin(model: Any, result: ContractResult, rows: torch.Tensor, keys: list[int], layout: Layout,
            runs: dict[str, dict[str, Any]]):
    """The line where the worst leak enters, or, for a document only cut, where its mask hides the key."""
    worst = result.worst()
    assert worst is not None
    call = with_arguments(model, runs[worst.run])
    if worst.kind == "over-masked":
        first = min((f for f in result.findings if f.run == worst.run and f.kind == "over-masked"),
                    key=lambda f: (f.query, f.key or 0))
        assert first.key is not None
        return origin_of_hidden(call, rows[:1], first.query, first.key, kind="document",
                                words=f"position {first.query} no longer reads position {first.key} of its own "
                                      "document (over-masked)")
    assert worst.key is not None
    j = worst.key
    document = layout.documents()
    keep = torch.tensor([i for i in range(rows.shape[1]) if document[i] != document[j] or i < j])
    words = f"now depends on position {j}, " + ("of another document" if worst.kind == "document" else "a later one")
    return origin_of_change(call, rows[:1], rows[1 + keys.index(j)][None], keep, kind=worst.kind, leak=worst.influence,
                            words=words)
