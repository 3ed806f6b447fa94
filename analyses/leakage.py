"""Causal-leakage audit: can any output position depend on a later token, where does it enter, how much?

`audit(model)` accepts a HookedGPT / HookedEncoder, a TransformerBridge, any `nn.Module`, a
spec for `interp.load`, or any callable mapping a LongTensor (batch, seq) to a tensor
(batch, seq, ...). Attention weights alone prove nothing (a mask applied after the softmax
leaves a triangular pattern and leaks through the normaliser; normalisation or convolution over
time leaks with no attention at all), so the verdict rests on what the outputs do:

- truncation: the output at position q must not change when every position after a cut is
  removed. Run once per prefix length, it compares every length 1..L with the full length L and
  covers every (query, source) pair with a change that cannot miss: the later tokens are gone.
- perturbation: for each cut t, every token after t is replaced by a different token (shifted
  resampling, so each later position really changes), several draws, many cuts per forward pass;
  outputs at positions <= t must not move. Run at several lengths.
- gradient: the Jacobian of each position's output with respect to every later input embedding
  (through `hook_embed` or the token `nn.Embedding`): exactly zero for a correct model, so a
  leak of any size from one position into one other is seen; it counts a leak above
  tol * GRADIENT_TOL_FACTOR (its rounding is ~1e-8, its unit one source position's Jacobian).
- pattern: attention weight above the diagonal at every attention site (reported, never trusted alone).
- batch: an example's outputs must not depend on the other examples of its batch.
- padding: for models taking an `attention_mask`, pad-token content must not move real positions,
  and right padding must give real positions the outputs of the unpadded sequence.
- localisation: when a leak is found, the same paired runs are repeated with every hook point
  (or, for plain modules, every submodule output) captured, in forward order; the first site
  whose outputs at observed positions move is `first_leaking_site`.

Vocabulary: a *cut* t splits a sequence into observed positions <= t and changed positions > t;
*influence* is the largest absolute change of an observed output divided by the outputs' spread
(the root mean square of the outputs minus each feature's mean over batch and position, so a
common offset cannot hide a leak; floored at 1e-2 of the RMS, see `_scale`): 1e-4 means a change
of 1e-4 of the output scale; it is 0.0 exactly when nothing moved. Influences at or below `tol`
(default 5e-5) are float rounding ("numerical noise"): on 8 seeds of every correct zoo model
rounding reached 2.4e-6, 1.0e-5 under an offset of -300 (one ulp of the offset, at most 1.2e-5 by
construction of the floor), 1.2e-6 on random GPT-2 / HookedGPT models and 2.8e-5 on the trained
toy-induction model at 128 tokens (comparing different lengths runs different kernels), while the
smallest planted leak (about 1e-4 of the output) measured 9.96e-5 or more. A decoder that numbers
positions from the start of a left-padded row (Hugging Face GPT-2 without position_ids) gets a
note, not a leak: no information flows from the pads, which the pad-content test checks.
Bidirectional encoders (cfg.causal False, or Hugging Face attention modules with is_causal
False) are reported as bidirectional by design; their padding mask is audited instead.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Sequence, get_args

import pandas as pd
import torch
from torch import nn

from interp import distributed
from interp.errors import BadInput, BadType, InterpError, ModelError
from interp.modelinfo import check_finite_weights, context_length, model_config, vocab_size

Method = Literal["truncation", "perturbation", "gradient", "pattern", "batch", "padding"]
METHODS: tuple[str, ...] = get_args(Method)
Verdict = Literal["exact_zero", "numerical_noise", "leak", "bidirectional"]
LeakKind = Literal["future", "batch", "padding"]
METHOD_KIND: dict[str, str] = {
    "truncation": "future", "perturbation": "future", "gradient": "future", "pattern": "future",
    "batch": "batch", "padding": "padding",
}
TRUSTED = ("truncation", "perturbation", "gradient", "batch", "padding")  # "pattern" never decides alone
TABLE_COLUMNS = ["method", "site", "length", "query_pos", "source_pos", "influence", "detail"]
MAX_ROWS_PER_METHOD = 200
DEFAULT_TOL = 5e-5  # float32: rounding measured <= 2.8e-5 (toy-induction, 128 tokens), the smallest planted leak >= 9.96e-5
SPREAD_FLOOR = 1e-2  # the scale is the outputs' spread, but at least this fraction of their RMS
GRADIENT_TOL_FACTOR = 0.1  # the gradient is exactly zero for a correct model (rounding measured <= 2.1e-8): it
# counts a leak above tol * 0.1 (its unit is one source position's Jacobian; the 1e-4 planted leak measures >= 3.4e-5)
FUTURE_METHODS = ("truncation", "perturbation", "gradient")  # the trusted methods that can show a future leak
ONES_MASK_DETAIL = " [attention_mask all ones]"  # appended to the detail of runs made with a mask of ones
HALF_PRECISION_TOL = 2e-2  # float16 / bfloat16 weights: leaks below this cannot be told from rounding
MAX_TOL = 1e-2  # float32: a tol above 1% of the output scale would call real leaks rounding
MAX_TOL_HALF = 5e-2  # float16 / bfloat16: the default is 2e-2, so the bound sits above it
LOCALISE_FRACTION = 0.1  # a site carries the leak when it moves by more than this fraction of the leak's own size
PATTERN_TOL = 1e-6  # attention weight on a masked key is exactly 0; anything above this is weight on a later key


# ---------------------------------------------------------------------------------------------
# The model, seen as tokens -> (batch, seq, features)
# ---------------------------------------------------------------------------------------------

def _config(model: Any) -> Any:
    return model_config(model)


infer_vocab_size = vocab_size  # the one helper lives in interp.modelinfo
infer_n_ctx = context_length


def declared_bidirectional(model: Any) -> bool:
    """Whether the model says it is an encoder: cfg.causal / cfg.is_causal False, or every
    attention module carrying an `is_causal` flag (Hugging Face) has it False."""
    cfg = _config(model)
    for name in ("causal", "is_causal"):
        value = getattr(cfg, name, None)
        if isinstance(value, bool):
            return not value
    if isinstance(model, nn.Module) and hasattr(model, "hook_dict"):
        import interp.loading  # noqa: F401  (registers the TransformerBridge site finder)
        from interp.hooks import attention_sites

        try:
            flags = {site.causal for site in attention_sites(model)}
        except (TypeError, AttributeError):
            flags = set()
        if flags == {False}:
            return True
        if True in flags:
            return False
    if isinstance(model, nn.Module):
        flags = {m.is_causal for m in model.modules() if m is not model and isinstance(getattr(m, "is_causal", None), bool)}
        if flags == {False}:
            return True
    return False


def _accepts_attention_mask(model: Callable) -> bool:
    forward = model.forward if isinstance(model, nn.Module) else model
    try:
        return "attention_mask" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def _first_tensor(out: Any) -> Any:
    """The per-position output of a forward: a tensor, `.logits`, `.last_hidden_state`, or the first element."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, dict) and out:
        return _first_tensor(out.get("logits", next(iter(out.values()))))
    if isinstance(out, (tuple, list)) and out:
        return _first_tensor(out[0])
    return out


class ModelAdapter:
    """Runs any supported model on token batches and returns float outputs (batch, seq, features).

    `max_rows` (None or 1) caps the rows per forward: set to 1 once the model is known to mix
    the examples of a batch, so that mixing cannot pass for a causal leak.
    """

    def __init__(self, model: Callable, *, max_tokens: int = 4096):
        if not callable(model):
            raise BadType(f"model must be an nn.Module or a callable tokens -> outputs, got {type(model).__name__}.")
        self.model = model
        self.module = model if isinstance(model, nn.Module) else None
        self.name = getattr(_config(model), "model_name", None) or type(model).__name__
        self.takes_mask = _accepts_attention_mask(model)
        self.max_tokens = max_tokens
        self.max_rows: int | None = None
        self.ones_mask = False  # pass attention_mask=ones when a call gives none (see `with_ones_mask`)
        params = list(self.module.parameters()) if self.module is not None else []
        self.device = params[0].device if params else torch.device("cpu")
        self.dtype = params[0].dtype if params else torch.float32

    def __call__(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 finite_where: torch.Tensor | None = None, check_finite: bool = True) -> torch.Tensor:
        """Outputs (batch, seq, features) as float; NaN at checked positions raises a ValueError."""
        if self.max_rows is not None and tokens.shape[0] > self.max_rows:
            step = self.max_rows
            return torch.cat([
                self(tokens[i:i + step], None if attention_mask is None else attention_mask[i:i + step],
                     finite_where=None if finite_where is None else finite_where[i:i + step], check_finite=check_finite)
                for i in range(0, tokens.shape[0], step)
            ])
        tokens = tokens.to(self.device)
        if attention_mask is None and self.ones_mask:
            attention_mask = torch.ones_like(tokens)
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(self.device).long()}
        out = _first_tensor(self._run(tokens, kwargs))
        batch, n_pos = tokens.shape
        if not isinstance(out, torch.Tensor) or out.ndim < 2 or tuple(out.shape[:2]) != (batch, n_pos):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            hint = (" It looks sequence-first: transpose it to (batch, seq, ...)."
                    if isinstance(out, torch.Tensor) and out.ndim >= 2 and tuple(out.shape[:2]) == (n_pos, batch) else "")
            raise ValueError(
                f"the model returned {shape} for tokens of shape ({batch}, {n_pos}); the audit needs one output "
                f"per position, shaped (batch, seq, ...) = ({batch}, {n_pos}, ...).{hint} Wrap the model, e.g. "
                "`audit(lambda tokens: model(tokens).logits)`."
            )
        out = out.reshape(batch, n_pos, -1).float().cpu()  # comparisons run on the CPU, in float32
        if check_finite:
            watched = out if finite_where is None else out[finite_where.to(out.device).bool()]
            if not torch.isfinite(watched).all():
                cause = ("a fully masked attention row (every key padding) is the usual cause: fill it with zeros"
                         if attention_mask is not None and not bool(attention_mask.bool().all(-1).all()) else
                         "no position was padded, so the cause is inside the model (an overflow, a division by zero, "
                         "or NaN produced by its own code)")
                raise ModelError(
                    f"the model returned NaN or inf for tokens of shape ({batch}, {n_pos}); the audit compares "
                    f"outputs and cannot compare NaN. {cause}. Fix the model, or audit a smaller max_len."
                )
        return out

    def _run(self, tokens: torch.Tensor, kwargs: dict) -> Any:
        """The model's forward; its own failure becomes a ModelError that says which model and where."""
        try:
            return self.model(tokens, **kwargs)
        except (InterpError, ValueError):  # already a message about the input (ours, or the model's own check)
            raise
        except Exception as error:
            from interp.errors import user_frame

            where = user_frame(error, ()) or "its forward"
            raise ModelError(f"the model {self.name} raised {type(error).__name__} at {where} on tokens of shape "
                             f"{tuple(tokens.shape)}: {error}") from error

    def with_ones_mask(self) -> "ModelAdapter":
        """A copy that passes an all-ones attention_mask wherever a call gives none: a model may take
        another code path when it is handed a mask (a fast path that drops the causal mask when no
        position is padded), and that path must be audited too."""
        other = copy.copy(self)
        other.ones_mask = True
        return other

    def rows_per_forward(self, n_pos: int) -> int:
        rows = max(1, self.max_tokens // max(n_pos, 1))
        return rows if self.max_rows is None else min(rows, self.max_rows)

    def chunks(self, tokens: torch.Tensor, *, shard: bool = False) -> Iterator[tuple[slice, torch.Tensor]]:
        """Outputs for consecutive row blocks of `tokens`, as few forward passes as memory allows.
        `shard`: in a process group, only this rank's blocks (every world-th); merge the results."""
        step = self.rows_per_forward(tokens.shape[1])
        for index, start in enumerate(range(0, tokens.shape[0], step)):
            if shard and not distributed.mine(index):
                continue
            rows = slice(start, min(start + step, tokens.shape[0]))
            yield rows, self(tokens[rows])


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------

def _generator(seed: int, purpose: str, length: int = 0) -> torch.Generator:
    """A seeded generator per purpose and length, so one method's draws never shift another's."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{purpose}/{length}".encode()))


def _prompts(n: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    from interp.data import random_tokens

    return random_tokens(n, length, vocab, seed=zlib.crc32(f"{seed}/prompts/{length}".encode())).tokens  # (prompt, pos)


def _resample(tokens: torch.Tensor, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Every token replaced by a different one: (token + uniform{1..vocab-1}) mod vocab."""
    shift = torch.randint(1, vocab, tokens.shape, generator=generator)
    return (tokens + shift) % vocab


def _scale(out: torch.Tensor) -> float:
    """The unit influences are measured in: the outputs' spread, i.e. the root mean square of
    `out` minus each feature's mean over batch and position (last axis = features).

    A common offset carries no information, so it must not dilute a leak (a leak of 1e-3 under an
    offset of -300 is 2e-3 of the spread but 3e-6 of the RMS). The spread is floored at
    SPREAD_FLOOR of the RMS: below that the offset's own float rounding (one ulp is 1.2e-7 of it)
    would approach tol; 1.0 when the outputs are all zero.
    """
    x = out.detach().float()
    flat = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(-1, 1)  # (sample, feature)
    rms = float(flat.pow(2).mean().sqrt())
    spread = float((flat - flat.mean(dim=0, keepdim=True)).pow(2).mean().sqrt())
    value = max(spread, SPREAD_FLOOR * rms)
    return value if value > 0 and math.isfinite(value) else 1.0


def _change(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b|, 0 where equal (including equal infinities), inf where one side is not finite."""
    diff = (a - b).abs()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return torch.where(same, torch.zeros_like(diff), diff.nan_to_num(nan=math.inf))


def _rows(method: str, length: int, influence: torch.Tensor, tol: float, *, query: torch.Tensor,
          source: torch.Tensor | None, site: str = "output", detail: str = "") -> list[dict]:
    """Table rows for a matrix of influences (NaN = not measured): those above tol, plus the maximum."""
    flat = influence.flatten()
    measured = ~torch.isnan(flat)
    if not measured.any():
        return []
    keep = (flat > tol) & measured
    top = int(torch.where(measured, flat, torch.full_like(flat, -1.0)).argmax())
    keep[top] = True
    index = keep.nonzero().flatten()
    if len(index) > MAX_ROWS_PER_METHOD:
        index = index[flat[index].argsort(descending=True)[:MAX_ROWS_PER_METHOD]]
    q, s = query.flatten(), None if source is None else source.flatten()
    return [
        {"method": method, "site": site, "length": length, "query_pos": int(q[i]),
         "source_pos": None if s is None else int(s[i]), "influence": float(flat[i]), "detail": detail}
        for i in index.tolist()
    ]


class _Progress:
    """A progress bar (interp.progress, rich) when asked for, else nothing."""

    def __init__(self, enabled: bool, total: int):
        from interp.progress import Bar

        self.bar = Bar(total, "leakage audit", enabled=enabled, unit="passes")

    def __call__(self, n: int = 1, stage: str | None = None) -> None:
        self.bar.advance(n, stage)

    def close(self) -> None:
        self.bar.close()


# ---------------------------------------------------------------------------------------------
# Methods: each returns table rows (dicts with TABLE_COLUMNS)
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def truncation(adapter: ModelAdapter, prompts: torch.Tensor, tol: float, progress: Callable = lambda *a, **k: None) -> list[dict]:
    """Every prefix length L < T against the full length T: outputs at positions < L must not move.

    Covers every (query, source) pair at every length with a change that cannot miss (the later
    positions are removed). Cost: sum of prefix lengths, about T^2 / 2 tokens per prompt.
    """
    n_prompts, n_pos = prompts.shape
    full = adapter(prompts)  # (prompt, pos, feature)
    scale = _scale(full)
    influence = torch.full((n_pos - 1, n_pos), math.nan)  # (cut, query)
    for length in range(1, n_pos):
        if not distributed.mine(length):  # prefixes shared out over a process group, merged below
            continue
        out = adapter(prompts[:, :length])
        influence[length - 1, :length] = _change(out, full[:, :length]).amax(dim=(0, 2)) / scale
        progress(1, "truncation")
    influence = distributed.fmax_merge(influence)
    cuts, queries = torch.meshgrid(torch.arange(n_pos - 1), torch.arange(n_pos), indexing="ij")
    return _rows("truncation", n_pos, influence, tol, query=queries, source=cuts + 1,
                 detail="every position from the source on removed")


@torch.no_grad()
def perturbation(adapter: ModelAdapter, prompts: torch.Tensor, vocab: int, tol: float, *, draws: int = 2,
                 seed: int = 0, max_cuts: int | None = None, progress: Callable = lambda *a, **k: None) -> tuple[list[dict], torch.Tensor]:
    """For each cut t, every token after t resampled to a different token (`draws` times);
    outputs at positions <= t must not move. All (prompt, cut, draw) rows share few forward passes.

    Returns the table rows and the (cut, query) influence matrix (NaN where not measured).
    `max_cuts` spreads at most that many cuts evenly (always including the last); None: every cut.
    """
    n_prompts, n_pos = prompts.shape
    cuts = torch.arange(n_pos - 1)
    if max_cuts is not None and len(cuts) > max_cuts:
        cuts = torch.linspace(0, n_pos - 2, max_cuts).round().long().unique()
    generator = _generator(seed, "perturbation", n_pos)
    prompt_idx, cut_idx = torch.meshgrid(torch.arange(n_prompts), cuts, indexing="ij")
    prompt_idx = prompt_idx.flatten().repeat(draws)  # (row,)
    cut_idx = cut_idx.flatten().repeat(draws)  # (row,)
    base_rows = prompts[prompt_idx]  # (row, pos)
    later = torch.arange(n_pos) > cut_idx[:, None]  # (row, pos): positions after the cut
    perturbed = torch.where(later, _resample(base_rows, vocab, generator), base_rows)
    base = adapter(prompts)  # (prompt, pos, feature)
    scale = _scale(base)
    influence = torch.full((n_pos - 1, n_pos), math.nan)  # (cut, query)
    for rows, out in adapter.chunks(perturbed, shard=True):
        change = _change(out, base[prompt_idx[rows]].to(out.device)).amax(dim=-1).cpu()  # (row, pos)
        change = change.masked_fill(later[rows], math.nan) / scale
        for cut in cut_idx[rows].unique().tolist():
            mine = change[cut_idx[rows] == cut].amax(dim=0)  # (pos,)
            influence[cut] = torch.fmax(influence[cut], mine)
        progress(1, f"perturbation L={n_pos}")
    influence = distributed.fmax_merge(influence)  # (cut, query) over the ranks' row blocks
    cut_grid, queries = torch.meshgrid(torch.arange(n_pos - 1), torch.arange(n_pos), indexing="ij")
    rows = _rows("perturbation", n_pos, influence, tol, query=queries, source=cut_grid + 1,
                 detail="every token from the source on resampled")
    return rows, influence


def embedding_module(model: Any, vocab: int | None) -> nn.Module | None:
    """Where input embeddings enter: `hook_embed`, else the token nn.Embedding; None for black boxes."""
    if not isinstance(model, nn.Module):
        return None
    hook_dict = getattr(model, "hook_dict", None)
    if isinstance(hook_dict, dict) and "hook_embed" in hook_dict:
        return hook_dict["hook_embed"]
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    matching = [m for m in embeddings if m.num_embeddings == vocab]
    return (matching or embeddings or [None])[0]


@contextlib.contextmanager
def _embedding_leaf(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Replace the module's output by a leaf tensor that requires grad; yields the leaves made."""
    leaves: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        if not isinstance(output, torch.Tensor) or leaves:
            return None
        leaf = output.detach().requires_grad_(True)
        leaves.append(leaf)
        return leaf

    handle = module.register_forward_hook(hook)
    try:
        yield leaves
    finally:
        handle.remove()


def gradient(adapter: ModelAdapter, embed: nn.Module, prompt: torch.Tensor, tol: float, *, seed: int = 0,
             progress: Callable = lambda *a, **k: None) -> list[dict]:
    """Jacobian of each query's output wrt every later input embedding, as a norm relative to
    its largest Jacobian onto an earlier (allowed) position.

    One copy of the prompt per query position, a random projection of that query's output
    only; the gradient at later positions is exactly zero for a correct model. The copies share
    forward and backward passes unless the model mixes examples.
    """
    n_pos = prompt.shape[-1]
    queries = torch.arange(n_pos - 1)
    generator = _generator(seed, "gradient", n_pos)
    influence = torch.full((n_pos - 1, n_pos), math.nan)  # (query, source)
    step = adapter.rows_per_forward(n_pos)
    for start in range(0, len(queries), step):
        mine = queries[start:start + step]
        tokens = prompt.reshape(1, n_pos).expand(len(mine), n_pos)
        with torch.enable_grad(), _embedding_leaf(embed) as leaves:
            out = adapter(tokens)  # (copy, pos, feature)
            if not leaves or leaves[0].shape[:2] != tokens.shape:
                return []
            project = torch.randn(out.shape, generator=generator).to(out.device)
            project = project * (torch.arange(n_pos) == mine[:, None]).to(out.device)[..., None]
            (grad,) = torch.autograd.grad((out * project).sum(), leaves[0])
        norms = grad.detach().float().flatten(2).norm(dim=-1).cpu()  # (copy, source)
        earlier = torch.arange(n_pos) <= mine[:, None]  # (copy, source)
        allowed = norms.masked_fill(~earlier, 0.0).amax(dim=-1, keepdim=True).clamp_min(1e-30)
        influence[mine] = (norms / allowed).masked_fill(earlier, math.nan)
        progress(1, "gradient")
    query_grid, sources = torch.meshgrid(torch.arange(n_pos - 1), torch.arange(n_pos), indexing="ij")
    return _rows("gradient", n_pos, influence, tol, query=query_grid, source=sources,
                 site="input embedding", detail="|d out[query] / d embed[source]| / max over allowed sources")


@torch.no_grad()
def pattern_check(model: Any, adapter: ModelAdapter, prompts: torch.Tensor, tol: float) -> tuple[list[dict], str | None]:
    """Largest attention weight above the diagonal at every attention site (never trusted alone)."""
    from interp.hooks import attention_sites, hooked

    try:
        sites = [site for site in attention_sites(model) if "pattern" in site.hooks]
    except (TypeError, AttributeError) as error:
        return [], f"pattern check skipped: {str(error).split(';')[0]}"
    if not sites:
        return [], "pattern check skipped: no attention site exposes a pattern hook"
    n_pos = prompts.shape[1]
    above = torch.ones(n_pos, n_pos, dtype=torch.bool).triu(diagonal=1)  # (query, key)
    found: dict[str, torch.Tensor] = {}

    def record(pattern: torch.Tensor, hook) -> None:
        weights = pattern.detach().float().cpu().amax(dim=(0, 1))  # (query, key)
        found[hook.name] = weights.masked_fill(~above, math.nan)

    with hooked(model, [(site.hook("pattern"), record) for site in sites]):
        adapter(prompts)
    rows = []
    query_grid, key_grid = torch.meshgrid(torch.arange(n_pos), torch.arange(n_pos), indexing="ij")
    for name, weights in found.items():
        rows += _rows("pattern", n_pos, weights, method_tol("pattern", tol), query=query_grid, source=key_grid, site=name,
                      detail="attention weight on a later key")
    return rows, None


@torch.no_grad()
def batch_mixing(adapter: ModelAdapter, prompts: torch.Tensor, vocab: int, tol: float, *, seed: int = 0) -> list[dict]:
    """Each example's outputs must be the same alone and in a batch, and must not move when the
    other examples of the batch change (checked in both directions: even rows, then odd rows)."""
    n_prompts, n_pos = prompts.shape
    together = adapter(prompts)  # (prompt, pos, feature)
    scale = _scale(together)
    alone = torch.cat([adapter(prompts[i:i + 1]) for i in range(n_prompts)])
    influence = _change(together, alone).amax(dim=-1) / scale  # (prompt, pos)
    generator = _generator(seed, "batch", n_pos)
    for parity in (0, 1):
        changed = (torch.arange(n_prompts) % 2 == parity)[:, None]  # (prompt, 1)
        other = adapter(torch.where(changed, _resample(prompts, vocab, generator), prompts))
        moved = (_change(other, together).amax(dim=-1) / scale).masked_fill(changed, 0.0)
        influence = torch.maximum(influence, moved)
    per_pos = influence.amax(dim=0)[None]  # (1, pos)
    return _rows("batch", n_pos, per_pos, tol, query=torch.arange(n_pos)[None], source=None,
                 detail="change of an example's outputs caused by the rest of its batch")


@torch.no_grad()
def padding_check(adapter: ModelAdapter, prompts: torch.Tensor, vocab: int, tol: float, *, pad_id: int = 0,
                  seed: int = 0, bidirectional: bool = False) -> tuple[list[dict], list[str], dict]:
    """Padding must be inert: pad content must not move real positions (left and right padding),
    right padding must reproduce the unpadded outputs, and (encoders) a fully masked row gives no NaN.

    Returns table rows, notes (left padding that shifts position ids is noted, not counted: no
    information flows from the pads) and the configuration of the worst leak for localisation.
    """
    n_prompts, n_pos = prompts.shape
    n_pad = max(1, n_pos // 3)
    real = prompts[:, : n_pos - n_pad]  # (prompt, real_pos)
    n_real = real.shape[1]
    generator = _generator(seed, "padding", n_pos)
    pads_a = torch.full((n_prompts, n_pad), pad_id)
    pads_b = _resample(pads_a, vocab, generator)
    unpadded = adapter(real)
    scale = _scale(unpadded)
    rows, notes, worst = [], [], {"influence": -1.0}
    for side in ("right", "left"):
        def cat(real_part: torch.Tensor, pad_part: torch.Tensor) -> torch.Tensor:
            return torch.cat([real_part, pad_part] if side == "right" else [pad_part, real_part], dim=1)

        mask = cat(torch.ones(n_prompts, n_real, dtype=torch.long), torch.zeros(n_prompts, n_pad, dtype=torch.long))
        real_pos = mask[0].bool()
        out_a = adapter(cat(real, pads_a), mask, finite_where=mask)
        out_b = adapter(cat(real, pads_b), mask, finite_where=mask)
        content = _change(out_a[:, real_pos], out_b[:, real_pos]).amax(dim=(0, 2)) / scale  # (real_pos,)
        versus = _change(out_a[:, real_pos], unpadded).amax(dim=(0, 2)) / scale
        positions = real_pos.nonzero().flatten()
        rows += _rows("padding", n_pos, content[None], tol, query=positions[None], source=None,
                      detail=f"{side} padding: pad content changed")
        if float(content.max()) > worst["influence"]:
            worst = {"influence": float(content.max()), "tokens_a": cat(real, pads_a)[:1], "tokens_b": cat(real, pads_b)[:1],
                     "mask": mask[:1], "observe": real_pos}
        if side == "right":
            rows += _rows("padding", n_pos, versus[None], tol, query=positions[None], source=None,
                          detail="right padding vs unpadded")
        elif float(versus.max()) > tol and float(content.max()) <= tol:  # else the padding rows tell it
            notes.append(
                f"left padding moves real positions by {float(versus.max()):.2e} of the output scale although pad "
                "content does not matter: the model numbers positions from the start of the padded row; pass "
                "position_ids (or left-pad only with models that derive positions from the attention mask)."
            )
    if bidirectional:
        mask = torch.ones(2, n_pos, dtype=torch.long)
        mask[1] = 0
        out = adapter(prompts[:2] if n_prompts >= 2 else prompts.repeat(2, 1), mask, check_finite=False)
        bad = (~torch.isfinite(out[1])).any(dim=-1).float() * math.inf  # (pos,)
        rows += _rows("padding", n_pos, torch.nan_to_num(bad, nan=0.0)[None], tol, query=torch.arange(n_pos)[None],
                      source=None, detail="fully masked row: inf means NaN or inf in the output")
    return rows, notes, worst


# ---------------------------------------------------------------------------------------------
# Localisation: the same paired runs with every site captured, in forward order
# ---------------------------------------------------------------------------------------------

def site_modules(model: Any) -> list[tuple[str, nn.Module]]:
    """Hook points of a hooked model, else every submodule: the sites localisation watches."""
    if not isinstance(model, nn.Module):
        return []
    from transformer_lens.hook_points import HookPoint

    hook_points = [(name, m) for name, m in model.named_modules() if isinstance(m, HookPoint)]
    if not hook_points:
        return [(name, m) for name, m in model.named_modules() if name]
    # a hook point may have several names (TransformerBridge aliases): keep the plainest
    names: dict[int, list[str]] = {}
    for name, m in [*hook_points, *getattr(model, "hook_dict", {}).items()]:
        names.setdefault(id(m), []).append(name)
    plainest = {key: min(found, key=lambda n: ("_original_component" in n, n.count("."), len(n)))
                for key, found in names.items()}
    return [(plainest[id(m)], m) for _, m in hook_points]


@contextlib.contextmanager
def _capturing(sites: list[tuple[str, nn.Module]]) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Record every site's output tensor, in the order the forward pass produces them."""
    seen: list[tuple[str, torch.Tensor]] = []
    calls: dict[str, int] = {}

    def make(name: str):
        def hook(_module, _inputs, output):
            tensor = _first_tensor(output)
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                calls[name] = calls.get(name, 0) + 1
                key = name if calls[name] == 1 else f"{name}#{calls[name]}"
                seen.append((key, tensor.detach().float().cpu().clone()))
        return hook

    handles = [module.register_forward_hook(make(name)) for name, module in sites]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _observed(tensor: torch.Tensor, row: int, observe: torch.Tensor, n_rows: int) -> torch.Tensor | None:
    """The observed positions of one row of a site tensor, positions first; None if not positional."""
    n_pos = observe.shape[0]
    if tensor.ndim >= 2 and tensor.shape[0] == n_rows:
        batch_axis = 0
    elif tensor.ndim >= 2 and tensor.shape[1] == n_rows and tensor.shape[0] == n_pos:
        batch_axis = 1  # sequence-first layout
    else:
        return None
    one = tensor.select(batch_axis, row)
    axes = [axis for axis in range(one.ndim) if one.shape[axis] == n_pos]
    if not axes:
        return None
    return one.movedim(axes[0], 0)[observe]


@torch.no_grad()
def localise(adapter: ModelAdapter, sites: list[tuple[str, nn.Module]], pairs: list[dict], tol: float) -> pd.DataFrame:
    """Influence at every site, in forward order, for paired runs that differ only where a leak may enter.

    Each pair has `tokens_a`, `tokens_b` (rows, pos), optional `mask`, the observed `row` and the
    `observe` positions (bool, pos). A site's influence is its largest change at observed
    positions over the spread of its outputs (`_scale`).
    """
    order: list[str] = []
    worst: dict[str, tuple[float, int]] = {}
    for pair in pairs:
        captured = []
        for tokens in (pair["tokens_a"], pair["tokens_b"]):
            with _capturing(sites) as seen:
                with torch.no_grad():
                    out = adapter(tokens, pair.get("mask"), finite_where=pair.get("mask"))
            captured.append(seen + [("output", out)])
        for (name, a), (name_b, b) in zip(*captured):
            if name != name_b or a.shape != b.shape:
                continue
            a_obs = _observed(a, pair["row"], pair["observe"], tokens.shape[0])
            b_obs = _observed(b, pair["row"], pair["observe"], tokens.shape[0])
            if a_obs is None or b_obs is None:
                continue
            if name not in worst:
                order.append(name)
                worst[name] = (0.0, None)
            finite = a[torch.isfinite(a)]
            scale = _scale(finite) if finite.numel() else 1.0
            change = _change(a_obs, b_obs).flatten(1).amax(dim=1) / scale if a_obs.numel() else torch.zeros(1)
            value = float(change.max()) if change.numel() else 0.0
            if value > worst[name][0]:
                positions = pair["observe"].nonzero().flatten()
                worst[name] = (value, int(positions[int(change.argmax())]))
    threshold = localisation_threshold(worst.get("output", (0.0, None))[0], tol)
    return pd.DataFrame(
        [{"order": i, "site": name, "influence": worst[name][0], "query_pos": worst[name][1],
          "leaks": worst[name][0] > threshold} for i, name in enumerate(order)],
        columns=["order", "site", "influence", "query_pos", "leaks"],
    )


def localisation_threshold(leak: float, tol: float) -> float:
    """The influence above which a site counts as carrying the leak: a fraction of the leak's own size
    at the output (never more than tol). A leak just above tol enters at a site that measures just
    under tol; judged against tol, the blame would fall on a later, per-position layer that cannot
    leak. Sites upstream of the leak see identical inputs at observed positions: exactly 0."""
    if not leak > 0:
        return tol
    return min(tol, LOCALISE_FRACTION * leak)


def _future_pairs(prompt: torch.Tensor, cuts: list[int], vocab: int, seed: int) -> list[dict]:
    generator = _generator(seed, "localise", prompt.shape[-1])
    n_pos = prompt.shape[-1]
    pairs = []
    for cut in cuts:
        later = torch.arange(n_pos) > cut
        changed = torch.where(later, _resample(prompt, vocab, generator), prompt)
        pairs.append({"tokens_a": prompt[None], "tokens_b": changed[None], "row": 0, "observe": ~later})
    return pairs


def _batch_pairs(prompts: torch.Tensor, vocab: int, seed: int) -> list[dict]:
    generator = _generator(seed, "localise-batch", prompts.shape[-1])
    pair = prompts[:2]
    all_pos = torch.ones(prompts.shape[-1], dtype=torch.bool)
    pairs = []
    for row in (0, 1):
        changed = pair.clone()
        changed[1 - row] = _resample(pair[1 - row], vocab, generator)
        pairs.append({"tokens_a": pair, "tokens_b": changed, "row": row, "observe": all_pos})
    return pairs


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LeakageReport:
    """What the audit found. `table` has one row per measured dependence worth showing (every
    value above tol, plus each method's maximum): `site`, `query_pos`, `source_pos`, `influence`,
    `method`, with `length` and `detail`. For cut-based methods `source_pos` is the first changed
    position (all later ones changed too); for the gradient it is exact. `sites` lists the
    localisation, one row per site in forward order.
    """

    model_name: str
    verdict: Verdict
    max_influence: float  # largest trusted influence (relative to the output scale; for a bidirectional model only
    # the batch and padding methods count, future dependence being by design); nan if none measured
    first_leaking_site: str | None
    leaks: tuple[str, ...]  # kinds found: "future", "batch", "padding"
    table: pd.DataFrame
    sites: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["kind", "order", "site", "influence", "query_pos", "leaks"]))
    first_leaking_sites: dict[str, str | None] = field(default_factory=dict)  # per leak kind
    tol: float = DEFAULT_TOL
    lengths: tuple[int, ...] = ()
    n_prompts: int = 0
    methods: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def causal(self) -> bool:
        """No position read a later one, no example read another, padding was inert."""
        return self.verdict in ("exact_zero", "numerical_noise")

    @property
    def bidirectional(self) -> bool:
        return self.verdict == "bidirectional"

    @property
    def exit_code(self) -> int:
        """0: nothing wrong (causal, or bidirectional by design with inert padding); 1: a leak."""
        return 1 if self.leaks else 0

    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per method: its largest influence, where, and a status word (for a rich table)."""
        rows = []
        for method in self.methods:
            mine = self.table[self.table["method"] == method]
            if mine.empty:
                rows.append({"method": method, "status": "skipped", "max_influence": None, "where": ""})
                continue
            top = mine.loc[mine["influence"].idxmax()]
            value = float(top["influence"])
            status = "leak" if value > method_tol(method, self.tol) else ("exact zero" if value == 0 else "noise")
            if method == "pattern":
                status = "weight above diagonal" if value > PATTERN_TOL else "triangular"
            elif self.bidirectional and METHOD_KIND[method] == "future":
                status = "bidirectional"
            source = "" if pd.isna(top["source_pos"]) else (
                f" reads {int(top['source_pos'])}" if method in ("gradient", "pattern")
                else f" when {int(top['source_pos'])}..{int(top['length']) - 1} changed")
            where = f"{top['site']} L={int(top['length'])} q={int(top['query_pos'])}{source}"
            rows.append({"method": method, "status": status, "max_influence": value, "where": where})
        return rows

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.summary_rows(), columns=["method", "status", "max_influence", "where"])

    def to_dict(self) -> dict[str, Any]:
        def clean(records):
            return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in records]

        table = self.table.astype(object).where(self.table.notna(), None)
        sites = self.sites.astype(object).where(self.sites.notna(), None)
        return {
            "model": self.model_name, "causal": self.causal, "verdict": self.verdict,
            "max_influence": None if math.isnan(self.max_influence) else self.max_influence,
            "first_leaking_site": self.first_leaking_site, "first_leaking_sites": self.first_leaking_sites,
            "leaks": list(self.leaks), "exit_code": self.exit_code, "tol": self.tol, "lengths": list(self.lengths),
            "n_prompts": self.n_prompts, "methods": list(self.methods), "notes": list(self.notes),
            "seconds": round(self.seconds, 3), "summary": clean(self.summary_rows()),
            "table": clean(table.to_dict("records")), "sites": clean(sites.to_dict("records")),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=lambda v: v.item() if hasattr(v, "item") else str(v))

    def __str__(self) -> str:
        words = {
            "exact_zero": "causal: no output moved at all",
            "numerical_noise": f"causal: outputs moved by float rounding only (<= tol {self.tol:g})",
            "leak": f"LEAK ({', '.join(self.leaks)})",
            "bidirectional": "bidirectional by design (an encoder); padding audited instead"
                             + (f"; LEAK ({', '.join(self.leaks)})" if self.leaks else ""),
        }
        lines = [f"Leakage audit of {self.model_name}: {words[self.verdict]}"]
        if not math.isnan(self.max_influence):
            lines.append(f"  max influence {self.max_influence:.3g} of the output scale")
        if self.first_leaking_site:
            lines.append(f"  first leaking site: {self.first_leaking_site}")
        lines.append(f"  lengths {list(self.lengths)}, {self.n_prompts} prompts, {self.seconds:.1f} s")
        for row in self.summary_rows():
            value = "-" if row["max_influence"] is None else f"{row['max_influence']:.3g}"
            lines.append(f"  {row['method']:<13} {row['status']:<22} {value:>10}  {row['where']}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------

def _default_lengths(max_len: int) -> tuple[int, ...]:
    middle = (max_len // 2) | 1  # odd, so no position axis is mistaken for a head or width axis
    return tuple(sorted({max_len, max(2, min(middle, max_len)), min(5, max_len)}))


def _resolve_sizes(model: Any, max_len: int | None, vocab_size: int | None,
                   lengths: Sequence[int] | None) -> tuple[int, int, tuple[int, ...]]:
    """max_len, vocabulary size and perturbed lengths: given, or inferred from the model; checked."""
    n_ctx = infer_n_ctx(model)
    if max_len is None:
        if n_ctx is None:
            raise ValueError(
                f"cannot tell the context length of a {type(model).__name__}; pass max_len=N (the longest "
                "sequence the model accepts)."
            )
        max_len = n_ctx
    if n_ctx is not None and max_len > n_ctx:
        raise ValueError(f"max_len={max_len} exceeds the model's context n_ctx={n_ctx}; pass max_len<={n_ctx}.")
    if max_len < 2:
        raise ValueError(f"max_len={max_len}: a leak needs at least two positions; pass max_len>=2.")
    vocab = vocab_size or infer_vocab_size(model)
    if vocab is None or vocab < 2:
        raise ValueError(
            f"cannot tell the vocabulary size of a {type(model).__name__}; pass vocab_size=N (token ids 0..N-1)."
        )
    lengths = tuple(sorted(set(lengths))) if lengths is not None else _default_lengths(max_len)
    bad = [length for length in lengths if not 2 <= length <= max_len]
    if bad:
        raise ValueError(f"lengths {bad} are outside [2, max_len={max_len}]; pass lengths between 2 and {max_len}.")
    return max_len, vocab, lengths


def _planned_passes(adapter, methods, bidirectional, max_len, lengths, n_prompts, draws, max_cuts, grad_len) -> int:
    """Progress-bar steps: one per truncation prefix, perturbation or gradient chunk, other method."""
    steps = 1 + sum(m in methods for m in ("batch", "padding"))  # + localisation
    if bidirectional:
        return steps
    future = max_len - 1 if "truncation" in methods else 0
    steps += "pattern" in methods
    if "perturbation" in methods:
        for length in lengths:
            cuts = length - 1 if max_cuts is None else min(length - 1, max_cuts)
            future += math.ceil(n_prompts * cuts * draws / adapter.rows_per_forward(length))
    if "gradient" in methods:
        future += math.ceil((grad_len - 1) / adapter.rows_per_forward(grad_len))
    return steps + future * (2 if adapter.takes_mask else 1)  # with a mask of ones too


def _localisation_length(found: dict[int, torch.Tensor]) -> int:
    odd = [length for length in found if length % 2 and length >= 5]
    return max(odd) if odd else max(found)


def audit(
    model: Any,
    *,
    max_len: int | None = None,
    vocab_size: int | None = None,
    n_prompts: int = 2,
    seed: int = 0,
    tol: float | None = None,
    lengths: Sequence[int] | None = None,
    methods: Sequence[str] = METHODS,
    draws: int = 2,
    max_cuts: int | None = 16,
    gradient_len: int = 24,
    localise_leaks: bool = True,
    pad_token_id: int | None = None,
    progress: bool = False,
) -> LeakageReport:
    """Audit `model` for dependence of any output position on later tokens (and on other examples
    of its batch, and on padding). Returns a `LeakageReport`; see the module docstring for methods.

    max_len: longest length audited (default cfg.n_ctx); lengths: the lengths perturbed (default
    max_len, an odd middle length and 5; truncation always covers every length up to max_len);
    draws: resamplings per cut; max_cuts: cuts perturbed per length (None: all; truncation and the
    gradient cover every cut regardless); gradient_len: length of the Jacobian test; tol: largest
    influence called rounding (default 5e-5, or 2e-2 for float16 / bfloat16 models). Cost: the
    truncation runs every prefix of max_len (about n_prompts * max_len^2 / 2 tokens), so for
    long contexts pass a smaller max_len or watch `progress=True`.
    """
    start = time.perf_counter()
    if isinstance(model, (str, os.PathLike)):  # as the CLI does: a factory without hooks is a black box
        from interp.loading import load_auditable

        model = load_auditable(model)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected a subset of {list(METHODS)}.")
    adapter = ModelAdapter(model)
    if tol is None:  # rounding of the model's own precision: half-precision models round 1e3 times coarser
        tol = HALF_PRECISION_TOL if adapter.dtype in (torch.float16, torch.bfloat16) else DEFAULT_TOL
    check_tol(tol, adapter.dtype)
    check_weights_finite(model)
    if n_prompts < 1 or draws < 1:
        raise ValueError(f"n_prompts={n_prompts} and draws={draws} must both be at least 1.")
    max_len, vocab, lengths = _resolve_sizes(model, max_len, vocab_size, lengths)
    methods = tuple(m for m in METHODS if m in methods)
    bidirectional = declared_bidirectional(model)
    pad_id = pad_token_id if pad_token_id is not None else getattr(_config(model), "pad_token_id", None) or 0

    embed = embedding_module(model, vocab) if "gradient" in methods and not bidirectional else None
    if not bidirectional and not ({"truncation", "perturbation"} & set(methods)) and embed is None:
        reason = ["gradient skipped: no input embedding found (a black-box callable)"] if "gradient" in methods else []
        raise ValueError(_no_future_method_message(methods, reason))
    n_rows = max(n_prompts, 2)
    from analyses import leakage_fast  # incremental reference and cost estimate (imports this module)

    if progress and not bidirectional:
        leakage_fast.announce(model, adapter, max_len=max_len, vocab=vocab, lengths=lengths, n_prompts=n_prompts,
                              methods=methods, draws=draws, max_cuts=max_cuts, gradient_len=gradient_len)
    tick = _Progress(progress, _planned_passes(adapter, methods, bidirectional, max_len, lengths, n_prompts, draws,
                                               max_cuts, min(gradient_len, max_len)))
    rows: list[dict] = []
    notes: list[str] = []
    site_tables: list[pd.DataFrame] = []
    first_sites: dict[str, str | None] = {}
    sites = site_modules(model) if localise_leaks else []
    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        with torch.no_grad():
            long_prompts = _prompts(n_rows, max_len, vocab, seed)  # (prompt, pos)
            if "batch" in methods:
                batch_rows = batch_mixing(adapter, long_prompts, vocab, tol, seed=seed)
                rows += batch_rows
                tick(1, "batch")
                if any(r["influence"] > tol for r in batch_rows):
                    if sites:
                        pairs = _batch_pairs(_prompts(2, _odd_length(max_len), vocab, seed), vocab, seed)
                        located = localise(adapter, sites, pairs, tol)
                        site_tables.append(located.assign(kind="batch"))
                        first_sites["batch"] = _first(located)
                    adapter.max_rows = 1  # from here on one example per forward: mixing must not pose as a leak
                    notes.append("the model mixes examples of a batch: the other tests ran one example per forward pass")

            future_found: dict[bool, dict[int, torch.Tensor]] = {False: {}, True: {}}  # ones mask? -> length -> influence
            if bidirectional:
                short = lengths[0]
                perturbed, _ = perturbation(adapter, _prompts(n_prompts, short, vocab, seed), vocab, tol,
                                            draws=1, seed=seed, max_cuts=max_cuts)
                rows += perturbed
                notes.append("declared bidirectional (an encoder): future dependence is by design and not counted")
            else:
                # a model taking a mask is audited twice: as called without one, and with a mask of ones
                variants = [adapter, adapter.with_ones_mask()] if adapter.takes_mask else [adapter]
                for variant in variants:
                    suffix = ONES_MASK_DETAIL if variant.ones_mask else ""
                    if "truncation" in methods:
                        rows += _tagged(leakage_fast.truncation_rows(model, variant, long_prompts[:n_prompts], tol,
                                                                     progress=tick), suffix)
                    if "perturbation" in methods:
                        for length in lengths:
                            found, influence = perturbation(variant, _prompts(n_prompts, length, vocab, seed), vocab,
                                                            tol, draws=draws, seed=seed, progress=tick,
                                                            max_cuts=leakage_fast.perturbation_cuts(model, length, max_cuts))
                            rows += _tagged(found, suffix)
                            if float(influence.nan_to_num(0.0).max()) > tol:
                                future_found[variant.ones_mask][length] = influence
                    if "gradient" in methods and embed is not None:
                        grad_rows = gradient(variant, embed, _prompts(1, min(gradient_len, max_len), vocab, seed)[0],
                                             method_tol("gradient", tol), seed=seed, progress=tick)
                        if not grad_rows and not variant.ones_mask:
                            notes.append("gradient skipped: the embedding output is not (batch, seq, d_model)")
                        rows += _tagged(grad_rows, suffix)
                if "gradient" in methods and embed is None:
                    notes.append("gradient skipped: no input embedding found (a black-box callable)")
                if not any(row["method"] in FUTURE_METHODS for row in rows):
                    raise ValueError(_no_future_method_message(methods, notes))
                if "pattern" in methods:
                    pattern_rows, note = pattern_check(model, adapter, _prompts(n_prompts, max_len, vocab, seed), tol)
                    rows += pattern_rows
                    notes += [note] if note else []
                    tick(1, "pattern")

            if "padding" in methods:
                if adapter.takes_mask:
                    pad_rows, pad_notes, worst = padding_check(
                        adapter, _prompts(n_prompts, _odd_length(max_len), vocab, seed), vocab, tol,
                        pad_id=pad_id, seed=seed, bidirectional=bidirectional)
                    rows += pad_rows
                    notes += pad_notes
                    if sites and worst["influence"] > tol:
                        pair = {"tokens_a": worst["tokens_a"], "tokens_b": worst["tokens_b"], "mask": worst["mask"],
                                "row": 0, "observe": worst["observe"]}
                        located = localise(adapter, sites, [pair], tol)
                        site_tables.append(located.assign(kind="padding"))
                        first_sites["padding"] = _first(located)
                else:
                    notes.append("padding skipped: the model takes no attention_mask")
                tick(1, "padding")

        table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
        table["source_pos"] = table["source_pos"].astype("Int64")
        trusted = table[table["method"].isin(TRUSTED)]
        if bidirectional:
            trusted = trusted[trusted["method"].map(METHOD_KIND) != "future"]
        leaks = tuple(sorted({METHOD_KIND[m] for m in trusted.loc[above_threshold(trusted, tol), "method"]},
                             key=lambda k: get_args(LeakKind).index(k)))
        if "future" in leaks and sites:
            future_rows = trusted[trusted["method"].isin(FUTURE_METHODS) & above_threshold(trusted, tol)]
            masked = bool(future_rows["detail"].str.endswith(ONES_MASK_DETAIL).all())  # seen only with a mask of ones
            if masked:
                notes.append("the future leak appears only when the model is given an all-ones attention_mask")
            with torch.no_grad():
                located = _localise_future(adapter.with_ones_mask() if masked else adapter, sites, future_found[masked],
                                           future_rows[future_rows["detail"].str.endswith(ONES_MASK_DETAIL) == masked],
                                           max_len, vocab, seed, tol)
            site_tables.append(located.assign(kind="future"))
            first_sites["future"] = _first(located)
            if first_sites["future"] is None:
                notes.append("the leak did not reproduce under token resampling at any site (it depends on the "
                             "presence of later positions rather than their content); localise it by hand")
        tick(1, "localisation")
    finally:
        tick.close()
        if isinstance(model, nn.Module) and was_training:
            model.train()

    everything = table[table["method"].isin(TRUSTED)]
    if bidirectional:  # the headline is what was audited (batch, padding), not the by-design future dependence
        everything = everything[everything["method"].map(METHOD_KIND) != "future"]
    max_influence = float(everything["influence"].max()) if not everything.empty else math.nan
    if bidirectional:
        verdict: Verdict = "bidirectional"
    elif leaks:
        verdict = "leak"
    else:
        verdict = "exact_zero" if max_influence == 0.0 else "numerical_noise"
    if leaks and not sites:
        first_sites = {kind: "output" for kind in leaks}
    first = next((first_sites.get(kind) for kind in leaks if first_sites.get(kind)), None)
    if leaks and first is None:
        first = "output"
    site_frame = (pd.concat(site_tables, ignore_index=True)[["kind", "order", "site", "influence", "query_pos", "leaks"]]
                  if site_tables else pd.DataFrame(columns=["kind", "order", "site", "influence", "query_pos", "leaks"]))
    return LeakageReport(
        model_name=adapter.name, verdict=verdict, max_influence=max_influence, first_leaking_site=first,
        leaks=leaks, table=table, sites=site_frame, first_leaking_sites=first_sites, tol=float(tol),
        lengths=tuple(sorted(set(lengths) | {max_len})), n_prompts=n_prompts, methods=methods,
        notes=tuple(notes), seconds=time.perf_counter() - start,
    )


def describe_row(row: Any) -> str:
    """One table row in plain words: which output moved, and what was changed to move it.

    For cut-based methods the source is the first of *all* the positions changed (a later token
    leaks in, which one is not known); the gradient names the exact pair.
    """
    method, query, length = row["method"], int(row["query_pos"]), int(row["length"])
    source = None if row["source_pos"] is None or pd.isna(row["source_pos"]) else int(row["source_pos"])
    size = f"{float(row['influence']):.3g}"
    if method == "gradient":
        return f"gradient: the output at position {query} reads position {source} (exact pair; influence {size}, length {length})"
    if method in ("truncation", "perturbation"):
        verb = "removed" if method == "truncation" else "resampled"
        return (f"{method}: the output at position {query} moved by {size} when positions {source}..{length - 1} were {verb} "
                f"(some later token leaks in; the gradient row names which)")
    if method == "pattern":
        return f"pattern: at {row['site']}, query {query} puts weight {size} on the later key {source} (length {length})"
    if method == "batch":
        return f"batch: the output at position {query} moved by {size} when another example of its batch changed (length {length})"
    return f"{method}: the output at real position {query} moved by {size} ({row['detail']}, length {length})"


def method_tol(method: str, tol: float) -> float:
    """The influence above which `method` counts a leak: tol, or tol * GRADIENT_TOL_FACTOR for the gradient.

    The pattern check's unit is an attention weight, not an output change: a masked key gets
    exactly 0, so any weight above PATTERN_TOL is weight on a later key, whatever `tol` says.
    """
    if method == "pattern":
        return PATTERN_TOL
    return tol * GRADIENT_TOL_FACTOR if method == "gradient" else tol


def check_tol(tol: Any, dtype: torch.dtype = torch.float32) -> float:
    """`tol` as a float, or a BadInput: it must be finite, positive and small enough to see a leak.

    A tolerance above MAX_TOL (MAX_TOL_HALF for float16 / bfloat16 models) would call real
    leaks rounding: `--tol inf` must not turn an unmasked model into "causal".
    """

    limit = MAX_TOL_HALF if dtype in (torch.float16, torch.bfloat16) else MAX_TOL
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or not 0 < tol <= limit:
        raise BadInput(
            f"tol={tol!r} must be a finite number in (0, {limit:g}]: an influence relative to the output scale below "
            f"which a change counts as float rounding. Rounding measures <= 3e-5 in float32 (default {DEFAULT_TOL:g}, "
            f"{HALF_PRECISION_TOL:g} for half precision); a larger tol would call real leaks rounding."
        )
    return float(tol)


def check_weights_finite(model: Any) -> None:
    """A ModelError naming NaN / inf weights (`interp.modelinfo.check_finite_weights`): the audit compares
    outputs, and NaN weights would be blamed on something else (a fully masked row) or hide a leak."""
    check_finite_weights(model)


def above_threshold(table: pd.DataFrame, tol: float) -> pd.Series:
    """Rows whose influence is above their method's threshold."""
    return table["influence"] > table["method"].map(lambda method: method_tol(method, tol)).astype(float)


def _tagged(rows: list[dict], suffix: str) -> list[dict]:
    """Rows with `suffix` appended to their detail (marks runs made with an all-ones mask)."""
    return [{**row, "detail": row["detail"] + suffix} for row in rows]


def _no_future_method_message(methods: Sequence[str], notes: Sequence[str]) -> str:
    why = "; ".join(note for note in notes if "skipped" in note)
    return (
        f"methods={tuple(methods)} cannot show a dependence on later tokens for this model"
        + (f" ({why})" if why else "")
        + ": a causal verdict needs at least one of 'truncation' or 'perturbation' (any model) or 'gradient' "
        "(models with an nn.Embedding or hook_embed); 'pattern' is never trusted alone. Include them, e.g. "
        "methods=('truncation', 'perturbation', 'gradient'), or leave methods at its default."
    )


def _odd_length(max_len: int) -> int:
    return max_len if max_len % 2 or max_len < 5 else max_len - 1


def _first(located: pd.DataFrame) -> str | None:
    leaking = located[located["leaks"]]
    return None if leaking.empty else str(leaking.iloc[0]["site"])


def _localise_future(adapter, sites, future_found, table, max_len, vocab, seed, tol) -> pd.DataFrame:
    """Localise a future leak with perturbation pairs at the cuts where it was seen (at most 4).

    `table` holds the future-method rows above tol that `adapter` (plain or with a mask of ones) produced."""
    if future_found:
        length = _localisation_length(future_found)
        per_cut = future_found[length].nan_to_num(0.0).amax(dim=1)  # (cut,)
        cuts = [int(c) for c in per_cut.argsort(descending=True)[:4] if float(per_cut[c]) > tol]
    else:  # seen only by truncation or the gradient: cuts from the table
        leaking = table[(table["method"].isin(["truncation", "gradient"])) & above_threshold(table, tol)]
        if leaking.empty:
            return localise(adapter, sites, [], tol)
        length = int(leaking["length"].max())
        mine = leaking[leaking["length"] == length].nlargest(4, "influence")
        cuts = sorted({int(s) - 1 if m == "truncation" else int(q)
                       for m, q, s in zip(mine["method"], mine["query_pos"], mine["source_pos"])})
    prompt = _prompts(1, length, vocab, seed)[0]
    return localise(adapter, sites, _future_pairs(prompt, cuts, vocab, seed), tol)
