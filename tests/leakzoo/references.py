"""Black-box reference verdicts for the four contracts of modern stacks, each computed from an explicit
mask written here, independently of the toolkit's audit: the audit's modes are judged against them.
The product's modes (`interp.analyses.leakage.contracts`) grew from this module's principle and keep its rules; this
module stays as written, the independent check (tests/analyses/leakage/test_contracts_zoo.py and test_contracts_hf.py
hold the two verdicts equal), so a bug shared by a copy cannot pass both.

Every reference changes only what must not matter and measures the protected outputs (all logits),
in float64 where the model casts:
- `documents`: the block-diagonal mask, causal inside each document. A token may move only outputs of
  its own document at or after it (else kind `document`, or `future` inside its document), and must move
  the later outputs of its own document (else `over-masked`: the model cut a document).
- `kv_cache`: prefill a prefix, decode one token or a chunk at a time: every position's logits must equal
  the full forward (kind `kv_cache`), and inside one call the tokens after a position must not move it
  (kind `future`).
- `windows`: the layers' windowed masks composed: a token j may move output i only when i is within
  reach of j through every layer (kind `window`; `future` for j > i).
- `backends`: each attention implementation must equal eager at every position (kind `backend`) and be
  causal (kind `future`).

A change counts when it exceeds `threshold`, relative to the largest |logit| of the row: sqrt(eps) of the
dtype (1.5e-8 in float64), or 100 times the measured floor when that is larger. The floor is what the same
computation moves by rounding alone: the same row run alone and inside the perturbed batch; and where shapes
or kernels differ between the runs compared (KV cache, implementations), the float32 deviation of each run
from its float64 twin, since some models keep parts in float32 when cast. Perturbations at one shape move
protected outputs by exactly 0 in a correct model; correct zoo models sit below 1e-15 in float64 and every
bug of the zoo above 1e-2, so no verdict hangs on the threshold (the tests assert both margins). Models
that do not run in float64 (compiled FlexAttention on CPU) run in float32, said in `notes`.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Kind = str  # "document" | "over-masked" | "future" | "kv_cache" | "window" | "backend"
DOCUMENT_CONVENTIONS = (("position_ids",), ("cu_seq_lens", "cu_seqlens"), ("document_ids", "seq_ids", "segment_ids"))
IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
ALL_ONES = object()  # in a run's arguments: an all-ones attention_mask shaped as the rows called


@dataclass(frozen=True)
class Finding:
    """One protected output that moved (or, for `over-masked`, one that should have and did not)."""

    kind: Kind
    run: str  # which call pattern: "attention_mask=ones", "prefix 9, chunk 3", "sdpa vs eager"...
    query: int  # the position whose logits moved
    key: int | None  # the perturbed position (for `future` in a call: the first of the tokens changed); None for comparisons
    influence: float  # max |change of a logit| over the row's largest |logit|


@dataclass(frozen=True)
class Reference:
    """A contract's reference verdict: what leaks, where first, by how much."""

    contract: str
    findings: tuple[Finding, ...]
    max_influence: float  # the largest change at a protected output (comparisons included), relative
    threshold: float
    floor: float
    dtype: str
    runs: tuple[str, ...]
    notes: tuple[str, ...] = ()
    run_influence: tuple[tuple[str, float], ...] = ()  # each run's largest change at a protected output

    def influence_in(self, run: str) -> float:
        return dict(self.run_influence).get(run, 0.0)

    @property
    def leaks(self) -> bool:
        return bool(self.findings)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(f.kind for f in self.findings)

    def first(self, kind: Kind | None = None) -> Finding | None:
        """The earliest finding (by query, then key) of `kind`, or of any kind."""
        hits = [f for f in self.findings if kind is None or f.kind == kind]
        return min(hits, key=lambda f: (f.query, -1 if f.key is None else f.key), default=None)

    def runs_with(self, kind: Kind) -> frozenset[str]:
        return frozenset(f.run for f in self.findings if f.kind == kind)

    def worst(self, kind: Kind) -> float:
        return max((f.influence for f in self.findings if f.kind == kind), default=0.0)

    def __str__(self) -> str:
        if not self.leaks:
            return f"{self.contract}: clean (max influence {self.max_influence:.1e}, threshold {self.threshold:.1e}, {self.dtype})"
        parts = []
        for kind in sorted(self.kinds):
            first = self.first(kind)
            assert first is not None
            where = f"query {first.query}" + ("" if first.key is None else f" from key {first.key}")
            parts.append(f"{kind} ({where}, {self.worst(kind):.1e}, runs: {', '.join(sorted(self.runs_with(kind)))})")
        return f"{self.contract}: " + "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# Calling a model
# ---------------------------------------------------------------------------------------------

def parameters(model: torch.nn.Module) -> set[str]:
    """The names the model's forward takes explicitly (not through **kwargs)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in inspect.signature(model.forward).parameters.values() if p.kind in kinds}


def logits_of(output) -> torch.Tensor:
    """Logits from a tensor, a (logits, ...) tuple or an output object with `.logits`."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return output[0]
    return output.logits


def cache_of(output):
    """The cache an output carries: transformers 5 names it `cache`, earlier ones and the zoo `past_key_values`."""
    if isinstance(output, (tuple, list)):
        return output[1]
    for name in ("cache", "past_key_values"):
        found = getattr(output, name, None)
        if found is not None:
            return found
    return None


def vocab_size(model: torch.nn.Module) -> int:
    return int(model.config.vocab_size)


def _cast(model: torch.nn.Module, probe: Callable[[torch.nn.Module], object]) -> tuple[torch.nn.Module, str, tuple[str, ...]]:
    """A float64 copy of the model when it runs in float64 (probe succeeds), else the model itself in float32."""
    double = copy.deepcopy(model).to(torch.float64)
    try:
        with torch.no_grad():
            probe(double)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        return model, "float32", (f"float64 refused ({type(error).__name__}: {first}); measured in float32",)
    return double, "float64", ()


def _threshold(dtype: str, floor: float) -> float:
    eps = torch.finfo(torch.float64 if dtype == "float64" else torch.float32).eps
    return max(eps ** 0.5, 100.0 * floor)


def _random_tokens(n: int, vocab: int, avoid: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """n tokens drawn from the vocabulary without the `avoid` ids."""
    allowed = torch.tensor([t for t in range(vocab) if t not in set(avoid)])
    return allowed[torch.randint(len(allowed), (n,), generator=generator)]


def _replace(tokens: torch.Tensor, positions: Sequence[int], vocab: int, avoid: Sequence[int],
             generator: torch.Generator) -> torch.Tensor:
    """A copy of tokens (T,) with each of `positions` changed to another token outside `avoid`."""
    changed = tokens.clone()
    for position in positions:
        old = int(tokens[position])
        changed[position] = _random_tokens(1, vocab, [*avoid, old], generator)[0]
    return changed


def _change(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """max |a - b| over the vocabulary, over `scale`; a NaN on either side counts as an infinite change."""
    return torch.nan_to_num((a - b).abs(), nan=float("inf")).amax(-1) / scale


def _influence(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """(rows - 1, pos): the change of each row's logits against row 0's."""
    return _change(logits[1:], logits[:1], scale)


def _scale(logits: torch.Tensor) -> float:
    """The largest finite |logit| (1 when there is none)."""
    finite = logits[torch.isfinite(logits)]
    return float(finite.abs().max()) if finite.numel() else 1.0


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------

def document_convention(model: torch.nn.Module) -> str:
    """The first convention of the model's forward signature that says where documents start."""
    names = parameters(model)
    for group in DOCUMENT_CONVENTIONS:
        for name in group:
            if name in names:
                return name
    wanted = ", ".join("/".join(group) for group in DOCUMENT_CONVENTIONS)
    raise TypeError(f"{type(model).__name__}.forward takes none of {wanted}: give `doc_sep` (the token that ends a "
                    "document, which the model finds itself)")


@dataclass(frozen=True)
class Layout:
    """Documents packed in one row: their lengths, an optional separator ending each but the last, and EOS tokens
    planted inside documents (which must not cut them)."""

    lengths: tuple[int, ...] = (5, 4, 7)
    doc_sep: int | None = None
    inner_eos: tuple[int, ...] = ()  # row positions holding an EOS inside a document
    eos: int = 1

    def documents(self) -> torch.Tensor:
        """(T,): the document of each row position (a separator belongs to the document it ends)."""
        ids = []
        for index, length in enumerate(self.lengths):
            ids += [index] * (length + (self.doc_sep is not None and index < len(self.lengths) - 1))
        return torch.tensor(ids)

    def separators(self) -> torch.Tensor:
        """(T,) bool: the separator positions."""
        is_sep = torch.zeros(len(self.documents()), dtype=torch.bool)
        if self.doc_sep is not None:
            ends = torch.tensor(self.lengths[:-1]).add(1).cumsum(0) - 1
            is_sep[ends] = True
        return is_sep

    def tokens(self, vocab: int, generator: torch.Generator) -> torch.Tensor:
        """(T,) random tokens with the separators and inner EOS tokens in place."""
        specials = self.specials()
        tokens = _random_tokens(len(self.documents()), vocab, specials, generator)
        if self.doc_sep is not None:
            tokens[self.separators()] = self.doc_sep
        for position in self.inner_eos:
            tokens[position] = self.eos
        return tokens

    def specials(self) -> list[int]:
        return [self.eos] + ([] if self.doc_sep is None else [self.doc_sep])

    def structural(self) -> torch.Tensor:
        """(T,) bool: positions never perturbed (separators, planted EOS tokens)."""
        fixed = self.separators().clone()
        fixed[list(self.inner_eos)] = True
        return fixed

    def convention_kwargs(self, convention: str) -> dict[str, torch.Tensor]:
        documents = self.documents()
        if convention == "doc_sep":
            return {}
        if convention == "position_ids":
            return {"position_ids": torch.cat([torch.arange(n) for n in self.lengths])[None]}
        if convention in ("cu_seq_lens", "cu_seqlens"):
            return {convention: torch.tensor([0, *torch.tensor(self.lengths).cumsum(0).tolist()])}
        return {convention: documents[None]}


def document_runs(model: torch.nn.Module, layout: Layout, convention: str) -> dict[str, dict]:
    """The call patterns of the documents contract: the convention alone, then (when the forward takes them)
    use_cache off, an all-ones attention_mask, use_cache on; some stacks change path when a mask or a cache is given."""
    names = parameters(model)
    base = layout.convention_kwargs(convention)
    runs: dict[str, dict] = {"default": dict(base)}
    off = {"use_cache": False} if "use_cache" in names else {}
    if off:
        runs["use_cache=False"] = {**base, **off}
    if "attention_mask" in names:
        runs["attention_mask=ones"] = {**base, **off, "attention_mask": ALL_ONES}
    if off:
        runs["use_cache=True"] = {**base, "use_cache": True}
    return runs


def _call_rows(model: torch.nn.Module, rows: torch.Tensor, kwargs: dict) -> torch.Tensor:
    call = {k: (torch.ones_like(rows) if v is ALL_ONES else v) for k, v in kwargs.items()}
    with torch.no_grad():
        return logits_of(model(rows, **call)).double()


def documents(model: torch.nn.Module, layout: Layout | None = None, *, doc_sep: int | None = None,
              convention: str | None = None, seed: int = 0) -> Reference:
    """The documents contract against the block-diagonal causal mask of `layout` (see the module docstring)."""
    layout = layout or Layout()
    if doc_sep is not None:
        layout = Layout(layout.lengths, doc_sep, layout.inner_eos, layout.eos)
    if layout.doc_sep is not None and layout.doc_sep == layout.eos and layout.inner_eos:
        raise ValueError("an EOS inside a document cannot also be the document separator: drop inner_eos or doc_sep")
    convention = "doc_sep" if layout.doc_sep is not None else (convention or document_convention(model))
    generator = torch.Generator().manual_seed(seed)
    tokens = layout.tokens(vocab_size(model), generator)
    runs = document_runs(model, layout, convention)
    model, dtype, notes = _cast(model, lambda m: _call_rows(m, tokens[None], runs["default"]))
    keys = [j for j in range(len(tokens)) if not layout.structural()[j]]
    rows = torch.stack([tokens] + [_replace(tokens, [j], vocab_size(model), layout.specials(), generator) for j in keys])
    document, is_sep = layout.documents(), layout.separators()
    visible = reach(len(tokens), declared_windows(model)) & same_chunk(len(tokens), declared_chunk(model))
    findings, floor, per_run = [], 0.0, {}
    for run, kwargs in runs.items():
        per_run[run] = 0.0
        logits = _call_rows(model, rows, kwargs)
        scale = _scale(logits[0])
        floor = max(floor, float(_change(_call_rows(model, rows[:1], kwargs)[0], logits[0], scale).max()))
        change = _influence(logits, scale)  # (key, query)
        for u, j in enumerate(keys):
            for i in range(len(tokens)):
                size = float(change[u, i])
                if document[i] != document[j] or j > i:
                    per_run[run] = max(per_run[run], size)
                    findings.append(Finding("document" if document[i] != document[j] else "future", run, i, j, size))
                elif j < i and visible[i, j] and not is_sep[i]:  # a separator's output may belong to either side
                    findings.append(Finding("over-masked", run, i, j, size))
    threshold = _threshold(dtype, floor)
    kept = tuple(f for f in findings if (f.influence <= threshold) == (f.kind == "over-masked"))
    return Reference("document", kept, max(per_run.values()), threshold, floor, dtype, tuple(runs),
                     notes + (f"convention: {convention}",), tuple(per_run.items()))


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------

class _Cached:
    """Prefill and decode calls on a model with a cache: a `step(tokens, cache) -> (logits, cache)` method
    (nanoGPT style) or a forward taking `past_key_values` / `cache` with `use_cache=True` (Hugging Face)."""

    def __init__(self, model: torch.nn.Module):
        names = parameters(model)
        if callable(getattr(model, "step", None)):
            self.style = "step"
        elif "cache" in names or "past_key_values" in names:
            self.style = "cache" if "cache" in names else "past_key_values"
        else:
            raise TypeError(f"{type(model).__name__} has no cache: it takes neither `past_key_values`/`cache` nor "
                            "has a `step(tokens, cache)` method")
        self.names = names

    def full(self, model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        """The full forward, no cache: (batch, pos, vocab)."""
        with torch.no_grad():
            if self.style == "step":
                return logits_of(model(tokens)).double()
            return logits_of(model(input_ids=tokens, use_cache=False)).double()

    def call(self, model: torch.nn.Module, tokens: torch.Tensor, start: int, cache):
        """One prefill or decode call of the new `tokens` (batch, n) at positions start.. : (logits, cache)."""
        with torch.no_grad():
            if self.style == "step":
                logits, cache = model.step(tokens, cache)
                return logits.double(), cache
            batch, n = tokens.shape
            kwargs = {"input_ids": tokens, "use_cache": True,
                      "position_ids": torch.arange(start, start + n)[None].expand(batch, -1)}
            if "attention_mask" in self.names:  # covering the cache and the new tokens, as `generate` passes it
                kwargs["attention_mask"] = torch.ones(batch, start + n, dtype=torch.long)
            if "cache_position" in self.names:
                kwargs["cache_position"] = torch.arange(start, start + n)
            if cache is not None:
                kwargs[self.style] = cache
            output = model(**kwargs)
            return logits_of(output).double(), cache_of(output)


def _calls(length: int, prefix: int, chunk: int) -> list[tuple[int, int]]:
    return [(0, prefix)] + [(s, min(s + chunk, length)) for s in range(prefix, length, chunk)]


def _decode(cached: _Cached, model, rows: torch.Tensor, calls: list[tuple[int, int]]) -> list[torch.Tensor]:
    cache, out = None, []
    for start, end in calls:
        logits, cache = cached.call(model, rows[:, start:end], start, cache)
        out.append(logits)
    return out


def kv_cache(model: torch.nn.Module, *, length: int = 12, prefixes: Sequence[int] = (1, 5, 9),
             chunks: Sequence[int] = (1, 3), seed: int = 0) -> Reference:
    """The KV-cache contract: prefill + decode equal the full forward; nothing later in a call moves it.

    Decoding runs other kernels at other shapes than the full forward, and some models keep parts in float32 even
    when cast (transformers' eager softmax): the floor is the larger of both runs' float32 deviation from float64."""
    cached = _Cached(model)
    generator = torch.Generator().manual_seed(seed)
    tokens = _random_tokens(length, vocab_size(model), [], generator)[None]
    single = copy.deepcopy(model).to(torch.float32)
    plans = {f"prefix {p}, chunk {c}": _calls(length, p, c) for p in prefixes for c in chunks}
    model, dtype, notes = _cast(model, lambda m: _decode(cached, m, tokens, next(iter(plans.values()))))
    full = cached.full(model, tokens)[0]
    scale = _scale(full)
    other = _replace(tokens[0], range(length), vocab_size(model), [], generator)
    floor = float(_change(cached.full(model, torch.stack([tokens[0], other]))[0], full, scale).max())
    decoded = {run: _decode(cached, model, tokens, calls) for run, calls in plans.items()}
    if dtype == "float64":
        floor = max(floor, float(_change(cached.full(single, tokens)[0], full, scale).max()))
        for run, calls in plans.items():
            for logits, logits32 in zip(decoded[run], _decode(cached, single, tokens, calls)):
                floor = max(floor, float(_change(logits32[0], logits[0], scale).max()))
    threshold = _threshold(dtype, floor)
    findings, per_run = [], dict.fromkeys(plans, 0.0)
    for run, calls in plans.items():
        for (start, end), logits in zip(calls, decoded[run]):
            change = _change(logits[0], full[start:end], scale)
            per_run[run] = max(per_run[run], float(change.max()))
            findings += [Finding("kv_cache", run, start + t, None, float(c)) for t, c in enumerate(change) if c > threshold]
        for k in range(len(calls)):
            found, size = _future_in_call(cached, model, tokens, calls[:k + 1], vocab_size(model), generator, scale)
            per_run[run] = max(per_run[run], size)
            findings += [Finding("future", run, q, key, s) for q, key, s in found if s > threshold]
    return Reference("kv_cache", tuple(findings), max(per_run.values()), threshold, floor, dtype, tuple(plans),
                     notes + (cached.style,), tuple(per_run.items()))


def _future_in_call(cached: _Cached, model, tokens: torch.Tensor, calls, vocab: int, generator, scale: float):
    """Inside the last call: change every token from position start+u on, for each u, and see whether the outputs
    before start+u move. Returns ([(query, first changed key, influence)], largest influence)."""
    start, end = calls[-1]
    if end - start < 2:
        return [], 0.0
    rows = [tokens[0]] + [_replace(tokens[0], range(start + u, end), vocab, [], generator) for u in range(1, end - start)]
    logits = _decode(cached, model, torch.stack(rows), calls)[-1]
    change = _influence(logits, scale)  # (u - 1, call position)
    found = [(start + t, start + u, float(change[u - 1, t])) for u in range(1, end - start) for t in range(u)]
    return found, max(s for _, _, s in found)


# ---------------------------------------------------------------------------------------------
# Sliding windows
# ---------------------------------------------------------------------------------------------

def declared_windows(model: torch.nn.Module) -> list[int | None]:
    """Each layer's window as the model's config declares it: `sliding_window` with `layer_types` (transformers),
    or `window_size` (GPTConfig); None for a full-attention layer."""
    config = model.config
    window = getattr(config, "sliding_window", None) or getattr(config, "window_size", None)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 1
    types = getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * n_layers
    return [window if kind == "sliding_attention" else None for kind in types]


def reach(length: int, layer_windows: Sequence[int | None]) -> torch.Tensor:
    """(query, key) bool: key j can move output i through the layers' causal (windowed) masks, composed."""
    index = torch.arange(length)
    distance = index[:, None] - index[None, :]  # i - j
    reached = torch.eye(length, dtype=torch.bool)
    for window in layer_windows:
        mask = (distance >= 0) & (distance < (window if window is not None else length))
        reached = (mask.double() @ reached.double()) > 0
    return reached


def declared_chunk(model: torch.nn.Module) -> int | None:
    """The chunk of chunked local attention (transformers' `attention_chunk_size`), or None."""
    return getattr(getattr(model, "config", None), "attention_chunk_size", None)


def same_chunk(length: int, chunk: int | None) -> torch.Tensor:
    """(query, key) bool: both in the same chunk of `chunk` positions (everywhere True without chunks)."""
    index = torch.arange(length) // (chunk or length)
    return index[:, None] == index[None, :]


def windows(model: torch.nn.Module, layer_windows: Sequence[int | None] | None = None, *,
            lengths: Sequence[int] = (3, 12), seed: int = 0) -> Reference:
    """The window contract against the composed windowed masks, on prompts shorter and longer than the window."""
    layer_windows = list(declared_windows(model) if layer_windows is None else layer_windows)
    generator = torch.Generator().manual_seed(seed)
    model, dtype, notes = _cast(model, lambda m: _call_rows(m, torch.zeros(1, 2, dtype=torch.long), {}))
    findings, floor, per_run = [], 0.0, {}
    span = sum(w - 1 for w in layer_windows if w is not None) if all(layer_windows) else None
    for length in lengths:
        run = f"length {length}"
        per_run[run] = 0.0
        tokens = _random_tokens(length, vocab_size(model), [], generator)
        rows = torch.stack([tokens] + [_replace(tokens, [j], vocab_size(model), [], generator) for j in range(length)])
        logits = _call_rows(model, rows, {})
        scale = _scale(logits[0])
        floor = max(floor, float(_change(_call_rows(model, rows[:1], {})[0], logits[0], scale).max()))
        change, reached = _influence(logits, scale), reach(length, layer_windows)
        for j in range(length):
            for i in range(length):
                if not reached[i, j]:
                    per_run[run] = max(per_run[run], float(change[j, i]))
                    findings.append(Finding("future" if j > i else "window", run, i, j, float(change[j, i])))
        if span is not None and length <= span + 1:
            notes += (f"{run}: no token is out of reach (the layers reach {span} back): only causality is checked",)
    threshold = _threshold(dtype, floor)
    kept = tuple(f for f in findings if f.influence > threshold)
    return Reference("window", kept, max(per_run.values()), threshold, floor, dtype, tuple(per_run),
                     notes + (f"windows per layer: {layer_windows}",), tuple(per_run.items()))


class _MaskRecorder(torch.overrides.TorchFunctionMode):
    """What each `scaled_dot_product_attention` call lets a query of the first row see, in call order."""

    def __init__(self):
        super().__init__()
        self.visible: list[torch.Tensor] = []  # (query, key) bool per call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            n_query, n_key = args[0].shape[-2], args[1].shape[-2]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            if kwargs.get("is_causal", args[5] if len(args) > 5 else False):
                seen = torch.ones(n_query, n_key, dtype=torch.bool).tril()  # torch aligns it top-left
            elif mask is None:
                seen = torch.ones(n_query, n_key, dtype=torch.bool)
            else:
                seen = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
                seen = seen.expand(*seen.shape[:-2], n_query, n_key).reshape(-1, n_query, n_key)[0]
            self.visible.append(seen.detach().cpu())
        return func(*args, **kwargs)


def window_masks(model: torch.nn.Module, layer_windows: Sequence[int | None] | None = None, *,
                 lengths: Sequence[int] = (3, 12), seed: int = 0) -> Reference:
    """The window contract per layer, for models that call `scaled_dot_product_attention` once per layer: the mask
    each call applies must hide every key outside its layer's window (kind `window`) and every later key (`future`).
    Where a full-attention layer follows, the outputs cannot show a window too wide; the masks can."""
    layer_windows = list(declared_windows(model) if layer_windows is None else layer_windows)
    generator = torch.Generator().manual_seed(seed)
    model, dtype, notes = _cast(model, lambda m: _call_rows(m, torch.zeros(1, 2, dtype=torch.long), {}))
    findings: list[Finding] = []
    for length in lengths:
        run = f"length {length}"
        recorder = _MaskRecorder()
        with recorder:
            _call_rows(model, _random_tokens(length, vocab_size(model), [], generator)[None], {})
        if len(recorder.visible) != len(layer_windows):
            notes += (f"{run}: {len(recorder.visible)} attention calls for {len(layer_windows)} layers: not judged",)
            continue
        i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
        for seen, size in zip(recorder.visible, layer_windows):
            if size is not None:
                findings += [Finding("future" if b > a else "window", run, a, b, 1.0)
                             for a, b in (seen & ((j > i) | (j <= i - size))).nonzero().tolist()]
    runs = tuple(f"length {n}" for n in lengths)
    return Reference("window", tuple(findings), 1.0 if findings else 0.0, 0.5, 0.0, dtype, runs,
                     notes + (f"windows per layer: {layer_windows}",),
                     tuple((run, 1.0 if any(f.run == run for f in findings) else 0.0) for run in runs))


# ---------------------------------------------------------------------------------------------
# Attention implementations
# ---------------------------------------------------------------------------------------------

def set_implementation(model: torch.nn.Module, implementation: str) -> None:
    """Switch the model's attention implementation: transformers' `set_attn_implementation`, or a GPTConfig's `attn_impl`."""
    if callable(getattr(model, "set_attn_implementation", None)):
        model.set_attn_implementation(implementation)
    elif hasattr(getattr(model, "config", None), "attn_impl"):
        model.config.attn_impl = implementation
    else:
        raise TypeError(f"{type(model).__name__} has no attention implementation switch "
                        "(set_attn_implementation, or config.attn_impl)")


def backends(model: torch.nn.Module, implementations: Sequence[str] = IMPLEMENTATIONS, *, length: int = 12,
             seed: int = 0) -> Reference:
    """The back-end contract: every implementation equals eager, and each is causal.

    The floor is the largest float32 deviation of an implementation from its float64 run, since implementations
    may keep parts in float32 when cast (transformers' eager softmax does)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _random_tokens(length, vocab_size(model), [], generator)
    rows = torch.stack([tokens] + [_replace(tokens, range(u, length), vocab_size(model), [], generator)
                                   for u in range(1, length)])

    def probe(m):
        for implementation in implementations:
            set_implementation(m, implementation)
            _call_rows(m, rows[:1], {})

    single = copy.deepcopy(model).to(torch.float32)
    model, dtype, notes = _cast(model, probe)
    first_rows: dict[str, torch.Tensor] = {}
    findings, floor, per_run = [], 0.0, {}
    for implementation in implementations:
        set_implementation(model, implementation)
        logits = _call_rows(model, rows, {})
        first_rows[implementation] = logits[0]
        scale = _scale(logits[0])
        floor = max(floor, float(_change(_call_rows(model, rows[:1], {})[0], logits[0], scale).max()))
        if dtype == "float64":  # the implementation's own float32 deviation: what its kernels keep in float32 shows
            set_implementation(single, implementation)
            floor = max(floor, float(_change(_call_rows(single, rows[:1], {})[0], logits[0], scale).max()))
        change = _influence(logits, scale)  # (cut - 1, pos): tokens from `cut` on changed
        per_run[implementation] = max(float(change[u - 1, :u].max()) for u in range(1, length))
        findings += [Finding("future", implementation, t, u, float(change[u - 1, t])) for u in range(1, length)
                     for t in range(u)]
        if any(declared_windows(model)):  # each implementation is held to the windows too
            within = windows(model, lengths=(length,), seed=seed)
            findings += [Finding(f.kind, implementation, f.query, f.key, f.influence) for f in within.findings]
            per_run[implementation] = max(per_run[implementation], within.max_influence)
    reference = first_rows[implementations[0]]
    scale = _scale(reference)
    for implementation in implementations[1:]:
        change = _change(first_rows[implementation], reference, scale)
        per_run[f"{implementation} vs {implementations[0]}"] = float(change.max())
        findings += [Finding("backend", f"{implementation} vs {implementations[0]}", t, None, float(c))
                     for t, c in enumerate(change)]
    set_implementation(model, implementations[0])
    threshold = _threshold(dtype, floor)
    kept = tuple(f for f in findings if f.influence > threshold)
    return Reference("backend", kept, max(per_run.values()), threshold, floor, dtype, tuple(per_run), notes,
                     tuple(per_run.items()))
