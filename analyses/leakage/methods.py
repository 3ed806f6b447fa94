"""The leakage audit's black-box methods and localisation.

Each method runs a model (through `adapter.ModelAdapter`: any model seen as tokens -> (batch,
seq, features)) on paired inputs and returns `Finding` rows (`types`); `localise` repeats a
pair with every site captured to say where a leak enters. Above `types` and `adapter`, below
`fast` (the incremental reference) and `stages` (`audit`). The methods are described in
`interp.analyses.leakage`'s docstring, which re-exports every public name here.
"""
from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import pandas as pd
import torch
from torch import nn

import interp.distributed as distributed
from interp.analyses.leakage.adapter import ModelAdapter, _first_tensor
from interp.analyses.leakage.types import (
    LOCALISE_FRACTION,
    MAX_ROWS_PER_METHOD,
    SPREAD_FLOOR,
    Finding,
    Pair,
    method_tol,
)

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


def _rows(method: str, length: int, influence: torch.Tensor, tol: float | torch.Tensor, *, query: torch.Tensor,
          source: torch.Tensor | None, site: str = "output", detail: str = "", ones_mask: bool = False) -> list[Finding]:
    """Table rows for a matrix of influences (NaN = not measured): those above tol, plus the maximum.
    `tol`: the threshold of every entry, or one per entry (shaped like `influence`); each row keeps its own.
    `ones_mask`: the runs passed an all-ones attention_mask (`ModelAdapter.with_ones_mask`)."""
    flat = influence.flatten()
    threshold = torch.as_tensor(tol, dtype=torch.float64).expand(influence.shape).flatten()
    measured = ~torch.isnan(flat)
    if not measured.any():
        return []
    keep = (flat.double() > threshold) & measured
    top = int(torch.where(measured, flat, torch.full_like(flat, -1.0)).argmax())
    keep[top] = True
    index = keep.nonzero().flatten()
    if len(index) > MAX_ROWS_PER_METHOD:
        index = index[flat[index].argsort(descending=True)[:MAX_ROWS_PER_METHOD]]
    q, s = query.flatten(), None if source is None else source.flatten()
    return [
        {"method": method, "site": site, "length": length, "query_pos": int(q[i]),
         "source_pos": None if s is None else int(s[i]), "influence": float(flat[i]), "detail": detail,
         "ones_mask": ones_mask, "threshold": float(threshold[i])}
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
def truncation(adapter: ModelAdapter, prompts: torch.Tensor, tol: float, progress: Callable = lambda *a, **k: None, *,
               lengths: Sequence[int] | None = None) -> list[Finding]:
    """Each prefix length L < T of `lengths` (default every one) against the full length T: outputs at positions
    < L must not move.

    Every length covers every (query, source) pair with a change that cannot miss (the later positions are
    removed). Cost: the sum of the prefix lengths, about T^2 / 2 tokens per prompt for every length.
    """
    n_prompts, n_pos = prompts.shape
    full = adapter(prompts)  # (prompt, pos, feature)
    scale = _scale(full)
    influence = torch.full((n_pos - 1, n_pos), math.nan)  # (cut, query)
    for length in (range(1, n_pos) if lengths is None else sorted(set(lengths))):
        if not 1 <= length < n_pos:
            continue
        if not distributed.mine(length):  # prefixes shared out over a process group, merged below
            continue
        out = adapter(prompts[:, :length])
        influence[length - 1, :length] = _change(out, full[:, :length]).amax(dim=(0, 2)) / scale
        progress(1, "truncation")
    influence = distributed.fmax_merge(influence)
    cuts, queries = torch.meshgrid(torch.arange(n_pos - 1), torch.arange(n_pos), indexing="ij")
    return _rows("truncation", n_pos, influence, tol, query=queries, source=cuts + 1,
                 detail="every position from the source on removed", ones_mask=adapter.ones_mask)


def spread_cuts(n_pos: int, max_cuts: int | None) -> torch.Tensor:
    """The cuts `perturbation` makes at a length: every one (0..n_pos-2), or `max_cuts` spread evenly (the last kept)."""
    cuts = torch.arange(n_pos - 1)
    if max_cuts is not None and len(cuts) > max_cuts:
        cuts = torch.linspace(0, n_pos - 2, max_cuts).round().long().unique()
    return cuts


@torch.no_grad()
def perturbation(adapter: ModelAdapter, prompts: torch.Tensor, vocab: int, tol: float, *, draws: int = 2,
                 seed: int = 0, max_cuts: int | None = None, progress: Callable = lambda *a, **k: None) -> tuple[list[Finding], torch.Tensor]:
    """For each cut t, every token after t resampled to a different token (`draws` times);
    outputs at positions <= t must not move. The (prompt, cut, draw) rows run n_prompts at a time, the base
    run's shape, so a correct model rounds them as it rounds the base (the floor: `floor`).

    Returns the table rows and the (cut, query) influence matrix (NaN where not measured).
    `max_cuts` spreads at most that many cuts evenly (always including the last); None: every cut.
    """
    n_prompts, n_pos = prompts.shape
    cuts = spread_cuts(n_pos, max_cuts)
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
    for rows, out in adapter.chunks(perturbed, shard=True, rows=n_prompts):  # the base's shape: the same rounding
        change = _change(out, base[prompt_idx[rows]].to(out.device)).amax(dim=-1).cpu()  # (row, pos)
        change = change.masked_fill(later[rows], math.nan) / scale
        for cut in cut_idx[rows].unique().tolist():
            mine = change[cut_idx[rows] == cut].amax(dim=0)  # (pos,)
            influence[cut] = torch.fmax(influence[cut], mine)
        progress(1, f"perturbation L={n_pos}")
    influence = distributed.fmax_merge(influence)  # (cut, query) over the ranks' row blocks
    cut_grid, queries = torch.meshgrid(torch.arange(n_pos - 1), torch.arange(n_pos), indexing="ij")
    found = _rows("perturbation", n_pos, influence, tol, query=queries, source=cut_grid + 1,
                  detail="every token from the source on resampled", ones_mask=adapter.ones_mask)
    return found, influence


def embedding_module(model: Any, vocab: int | None) -> nn.Module | None:
    """Where input embeddings enter: `hook_embed`, else the token nn.Embedding; None for black boxes."""
    if not isinstance(model, nn.Module):
        return None
    hook_dict = getattr(model, "hook_dict", None)
    if isinstance(hook_dict, dict) and "hook_embed" in hook_dict:
        return hook_dict["hook_embed"]
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    matching = [m for m in embeddings if m.num_embeddings == vocab]
    return (matching or embeddings)[0] if embeddings else None


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
             progress: Callable = lambda *a, **k: None) -> list[Finding]:
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
    memory = backward_bytes(adapter.model, n_pos)  # copies per backward: as many as FORWARD_MODE_BYTES of activations
    step = adapter.rows_per_forward(n_pos) if memory is None else min(adapter.rows_per_forward(n_pos),
                                                                        max(1, FORWARD_MODE_BYTES // memory))
    for start in range(0, len(queries), step):
        mine = queries[start:start + step]
        tokens = prompt.reshape(1, n_pos).expand(len(mine), n_pos)
        with torch.enable_grad(), _embedding_leaf(embed) as leaves:
            out = adapter(tokens, fresh=True)  # (copy, pos, feature)
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
                 site="input embedding", detail="|d out[query] / d embed[source]| / max over allowed sources",
                 ones_mask=adapter.ones_mask)


CUT_DETAIL = "derivative of the output wrt every embedding after the cut (exact zero for a causal model)"


FORWARD_MODE_BYTES = 2**28  # a backward that would keep more activations than this runs in forward mode instead
# (and the exhaustive gradient's copies are batched within it): SmolLM2-135M's audit stays under 4 GB at 2,048 tokens


def backward_bytes(model: Any, n_pos: int) -> int | None:
    """About the activations a backward through `model` keeps for one sequence of `n_pos` tokens (None when its
    config does not say: n_layers, d_model, d_mlp)."""
    cfg = getattr(model, "cfg", None)
    n_layers, d_model = getattr(cfg, "n_layers", None), getattr(cfg, "d_model", None)
    if not isinstance(n_layers, int) or not isinstance(d_model, int):
        return None
    d_mlp = getattr(cfg, "d_mlp", None) or 4 * d_model
    return n_pos * n_layers * (12 * d_model + 4 * d_mlp) * 4


def gradient_at_cuts(adapter: ModelAdapter, embed: nn.Module, prompt: torch.Tensor, tol: float, cuts: list[int], *,
                     seed: int = 0, forward_mode: bool = False, progress: Callable = lambda *a, **k: None) -> list[Finding]:
    """The gradient test at a long length, one cut at a time: the derivative of every output at positions <= cut
    with respect to every input embedding after it, exactly zero through a masked softmax.

    Reverse mode (a random projection of the outputs up to the cut, one backward), or with `forward_mode` a random
    tangent on the embeddings after the cut carried through one forward under the math attention kernel: the
    memory of a forward, not of a backward, so it runs at the audited length of a deep model (2,048 tokens of
    SmolLM2-135M); a model whose ops lack forward-mode formulas falls back to reverse mode. Covers every
    (query <= cut, source > cut) pair of each cut; `gradient` names exact pairs at a short length.
    Influence: the derivative's norm at an observed position over its largest norm at an allowed one."""
    n_pos = prompt.shape[-1]
    generator = _generator(seed, "gradient-cuts", n_pos)
    influence = torch.full((n_pos - 1, n_pos), math.nan)  # (cut, query)
    for cut in cuts:
        norms = (_cut_tangent_norms if forward_mode else _cut_gradient_norms)(adapter, embed, prompt.reshape(1, n_pos),
                                                                              cut, generator)
        if norms is None:
            return []
        later = torch.arange(n_pos) > cut
        allowed = norms[later].max().clamp_min(1e-30)
        influence[cut] = (norms / allowed).masked_fill(later, math.nan)
        progress(1, f"gradient L={n_pos}")
    cut_grid, queries = torch.meshgrid(torch.arange(n_pos - 1), torch.arange(n_pos), indexing="ij")
    return _rows("gradient", n_pos, influence, tol, query=queries, source=cut_grid + 1, site="input embedding",
                 detail=CUT_DETAIL, ones_mask=adapter.ones_mask)


def _cut_tangent_norms(adapter: ModelAdapter, embed: nn.Module, tokens: torch.Tensor, cut: int,
                       generator: torch.Generator) -> torch.Tensor | None:
    """(pos,) the norm of d out[pos] along a random direction of the embeddings after `cut`; None when the
    embedding's output is not (1, pos, d_model)."""
    import torch.autograd.forward_ad as forward_ad
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n_pos = tokens.shape[-1]
    after = (torch.arange(n_pos) > cut).to(adapter.device)[None, :, None]  # (1, pos, 1)
    directions: list[torch.Tensor] = []

    def dual(_module, _inputs, output):
        if not isinstance(output, torch.Tensor) or directions or output.shape[:2] != tokens.shape:
            return None
        direction = torch.randn(output.shape, generator=generator).to(output) * after
        directions.append(direction)
        return forward_ad.make_dual(output, direction)

    try:
        with torch.no_grad(), forward_ad.dual_level(), sdpa_kernel(SDPBackend.MATH), _hooked(embed, dual):
            tangent = forward_ad.unpack_dual(adapter(tokens, fresh=True)).tangent
    except (NotImplementedError, RuntimeError):  # an op without a forward-mode formula: reverse mode, one backward
        return _cut_gradient_norms(adapter, embed, tokens, cut, generator)
    if not directions:
        return None
    if tangent is None:  # no output depends on the embeddings at all
        return torch.zeros(n_pos)
    return tangent.detach().double().cpu()[0].norm(dim=-1)


def _cut_gradient_norms(adapter: ModelAdapter, embed: nn.Module, tokens: torch.Tensor, cut: int,
                        generator: torch.Generator) -> torch.Tensor | None:
    """`_cut_tangent_norms` by reverse mode: a random projection of the outputs up to the cut, the gradient
    norms at positions after it (the influence's unit: its norms at positions up to the cut)."""
    n_pos = tokens.shape[-1]
    with torch.enable_grad(), _embedding_leaf(embed) as leaves:
        out = adapter(tokens, fresh=True)  # (1, pos, feature)
        if not leaves or leaves[0].shape[:2] != tokens.shape:
            return None
        project = torch.randn(out.shape, generator=generator).to(out) * (torch.arange(n_pos) <= cut)[None, :, None]
        (grad,) = torch.autograd.grad((out * project.to(out.device)).sum(), leaves[0])
    norms = grad.detach().double().cpu()[0].norm(dim=-1)  # (source,)
    return _as_query_norms(norms, cut)


def _as_query_norms(norms: torch.Tensor, cut: int) -> torch.Tensor:
    """Reverse-mode norms (per source, of all queries up to the cut together) in the layout of forward-mode ones
    (per query): the largest norm after the cut at the cut's own query, whose projection included it, zeros at
    the other observed queries, and the allowed dependence (the largest norm up to the cut) after it."""
    n_pos = len(norms)
    per_query = torch.zeros(n_pos, dtype=norms.dtype)
    per_query[cut] = norms[cut + 1:].max()
    per_query[cut + 1:] = norms[: cut + 1].max()
    return per_query


@contextlib.contextmanager
def _hooked(module: nn.Module, hook: Callable) -> Iterator[None]:
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def pattern_check(model: Any, adapter: ModelAdapter, prompts: torch.Tensor, tol: float) -> tuple[list[Finding], str | None]:
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
        adapter(prompts, fresh=True)
    rows = []
    query_grid, key_grid = torch.meshgrid(torch.arange(n_pos), torch.arange(n_pos), indexing="ij")
    for name, weights in found.items():
        rows += _rows("pattern", n_pos, weights, method_tol("pattern", tol), query=query_grid, source=key_grid, site=name,
                      detail="attention weight on a later key")
    return rows, None


@torch.no_grad()
def batch_mixing(adapter: ModelAdapter, prompts: torch.Tensor, vocab: int, tol: float, *, seed: int = 0) -> list[Finding]:
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


@dataclass(frozen=True)
class PaddingInputs:
    """The padding check's inputs: the real tokens alone, and per side ("right", "left") two padded versions
    (pads of `pad_id`, and resampled pads) with their attention mask (1 real, 0 pad)."""

    unpadded: torch.Tensor  # (prompt, real_pos)
    sides: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # side -> (tokens_a, tokens_b, mask), each (prompt, pos)


def padding_inputs(prompts: torch.Tensor, vocab: int, *, pad_id: int = 0, seed: int = 0) -> PaddingInputs:
    """The last third of each prompt made padding, on the right and on the left (see `PaddingInputs`)."""
    n_prompts, n_pos = prompts.shape
    n_pad = max(1, n_pos // 3)
    real = prompts[:, : n_pos - n_pad]  # (prompt, real_pos)
    pads_a = torch.full((n_prompts, n_pad), pad_id)
    pads_b = _resample(pads_a, vocab, _generator(seed, "padding", n_pos))
    ones, zeros = torch.ones_like(real), torch.zeros_like(pads_a)
    sides = {"right": (torch.cat([real, pads_a], 1), torch.cat([real, pads_b], 1), torch.cat([ones, zeros], 1)),
             "left": (torch.cat([pads_a, real], 1), torch.cat([pads_b, real], 1), torch.cat([zeros, ones], 1))}
    return PaddingInputs(real, sides)


@torch.no_grad()
def padding_check(adapter: ModelAdapter, prompts: torch.Tensor, vocab: int, tol: float, *, pad_id: int = 0,
                  seed: int = 0, bidirectional: bool = False) -> tuple[list[Finding], list[str], Pair]:
    """Padding must be inert: pad content must not move real positions (left and right padding),
    right padding must reproduce the unpadded outputs, and (encoders) a fully masked row gives no NaN.

    Returns table rows, notes (left padding that shifts position ids is noted, not counted: no
    information flows from the pads) and the pair of the worst pad-content change, for localisation.
    """
    n_prompts, n_pos = prompts.shape
    inputs = padding_inputs(prompts, vocab, pad_id=pad_id, seed=seed)
    unpadded = adapter(inputs.unpadded)
    scale = _scale(unpadded)
    rows: list[Finding] = []
    notes: list[str] = []
    worst: Pair = {"influence": -1.0}
    for side, (tokens_a, tokens_b, mask) in inputs.sides.items():
        real_pos = mask[0].bool()
        out_a = adapter(tokens_a, mask, finite_where=mask)
        out_b = adapter(tokens_b, mask, finite_where=mask)
        content = _change(out_a[:, real_pos], out_b[:, real_pos]).amax(dim=(0, 2)) / scale  # (real_pos,)
        versus = _change(out_a[:, real_pos], unpadded).amax(dim=(0, 2)) / scale
        positions = real_pos.nonzero().flatten()
        rows += _rows("padding", n_pos, content[None], tol, query=positions[None], source=None,
                      detail=f"{side} padding: pad content changed")
        if float(content.max()) > worst["influence"]:
            worst = {"influence": float(content.max()), "tokens_a": tokens_a[:1], "tokens_b": tokens_b[:1],
                     "mask": mask[:1], "row": 0, "observe": real_pos}
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
    """Hook points of a hooked model, else every submodule: the sites localisation watches. Split q/k/v
    inputs are left out: watching them changes the forward (ln1 once per head), and what they carry is
    resid_pre, watched already."""
    if not isinstance(model, nn.Module):
        return []
    from transformer_lens.hook_points import HookPoint

    split = ("hook_q_input", "hook_k_input", "hook_v_input")
    hook_points = [(name, m) for name, m in model.named_modules() if isinstance(m, HookPoint) and not name.endswith(split)]
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


def restrict(tensor: torch.Tensor, *, n_rows: int, n_pos: int, row: int, keep: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """The observed part of an op's output and its first positional axis; None if it has no positional axis."""
    t = tensor.detach()
    if n_rows > 1:
        for axis in reversed(range(t.ndim)):
            if t.shape[axis] == n_rows * n_pos:
                t = t.unflatten(axis, (n_rows, n_pos))
    positional: list[int] = []
    for axis in reversed(range(t.ndim)):
        if t.shape[axis] == n_pos:
            t = t.index_select(axis, keep.to(t.device))
            positional = [axis] + [a for a in positional]
        elif n_rows > 1 and t.shape[axis] == n_rows:
            t = t.select(axis, row)
            positional = [a - 1 for a in positional]
    return (t, positional[0]) if positional else None


def _observed(tensor: torch.Tensor, row: int, observe: torch.Tensor, n_rows: int) -> torch.Tensor | None:
    """The observed positions of one row of a site tensor, positions first; None if not positional.
    Only the first positional axis is restricted: a hook's scores are masked already (-inf in both runs on
    a later key), so a score that moves on a later key is the mask's own failure, seen where it happens."""
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
def localise(adapter: ModelAdapter, sites: list[tuple[str, nn.Module]], pairs: list[Pair], tol: float) -> pd.DataFrame:
    """Influence at every site, in forward order, for paired runs that differ only where a leak may enter.

    Each pair has `tokens_a`, `tokens_b` (rows, pos), optional `mask`, the observed `row` and the
    `observe` positions (bool, pos). A site's influence is its largest change at observed
    positions over the spread of its outputs (`_scale`).
    """
    order: list[str] = []
    worst: dict[str, tuple[float, int | None]] = {}
    for pair in pairs:
        captured = []
        for tokens in (pair["tokens_a"], pair["tokens_b"]):
            with _capturing(sites) as seen:
                with torch.no_grad():
                    out = adapter(tokens, pair.get("mask"), finite_where=pair.get("mask"), fresh=True)
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


def _future_pairs(prompt: torch.Tensor, cuts: list[int], vocab: int, seed: int) -> list[Pair]:
    generator = _generator(seed, "localise", prompt.shape[-1])
    n_pos = prompt.shape[-1]
    pairs: list[Pair] = []
    for cut in cuts:
        later = torch.arange(n_pos) > cut
        changed = torch.where(later, _resample(prompt, vocab, generator), prompt)
        pairs.append({"tokens_a": prompt[None], "tokens_b": changed[None], "row": 0, "observe": ~later})
    return pairs


def _batch_pairs(prompts: torch.Tensor, vocab: int, seed: int) -> list[Pair]:
    generator = _generator(seed, "localise-batch", prompts.shape[-1])
    pair = prompts[:2]
    all_pos = torch.ones(prompts.shape[-1], dtype=torch.bool)
    pairs: list[Pair] = []
    for row in (0, 1):
        changed = pair.clone()
        changed[1 - row] = _resample(pair[1 - row], vocab, generator)
        pairs.append({"tokens_a": pair, "tokens_b": changed, "row": row, "observe": all_pos})
    return pairs


def _odd_length(max_len: int) -> int:
    return max_len if max_len % 2 or max_len < 5 else max_len - 1


def _first(located: pd.DataFrame) -> str | None:
    leaking = located[located["leaks"]]
    return None if leaking.empty else str(leaking.iloc[0]["site"])
