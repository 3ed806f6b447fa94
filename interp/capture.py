"""Streaming capture: run a model over a PromptSet in batches and keep only per-prompt statistics.

The flow of every observational analysis: for each batch, hooks sit on the attention sites
an analysis needs and nowhere else (other layers keep the fused SDPA fast path); inside each
hook a *reducer* turns the batch's tensor (e.g. the pattern, (batch, head, query, key)) into
per-prompt statistics (batch, head, ...); the forward stops after the last needed site; the
batch's statistics, stacked to (batch, layer, head, ...), go into an *accumulator*.
Nothing of size (prompts x layers x heads x T x T) is ever kept: the largest tensor alive is
one batch's pattern at one layer.

Accumulators are mergeable: `a.merge(b)` after streaming two shards equals streaming both in
one pass. `PerPromptAccumulator` keeps one row per prompt (what bootstrap CIs need; memory is
n_prompts x layers x heads scalars per metric). `MomentAccumulator` keeps sums, sums of squares
and counts, so its memory does not depend on the number of prompts at all.

Across processes (torch.distributed): inside a process group `stream` runs only this rank's
shard of the prompts (whole batches, contiguous, `interp.distributed.shard`) and merges the
accumulator over ranks before returning (`interp.distributed.merge`): `MomentAccumulator` by
`all_reduce` of its sums, `PerPromptAccumulator` (or any accumulator with `merge`) by
`all_gather_object` in rank order, which is global prompt order. Every rank returns what one
process returns; pass a fresh (empty) accumulator, or its earlier contents count once per rank.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, get_args

import torch
from torch import nn

import interp.distributed as distributed
from interp.data import PromptSet, Repeats, check_prompts
from interp.errors import BadInput, user_failure
from interp.hooks import AttentionSite, Role, attention_sites, hooked
from interp.modelinfo import check_finite_weights

EarlyStop = Literal["auto", "stop_at_layer", "exception", "none"]
Reducer = Callable[[torch.Tensor, "BatchContext"], "dict[str, torch.Tensor]"]


class StopForward(Exception):
    """Raised by a capture hook after the last site it needs; caught by `stream`, never seen by users."""


@dataclass(frozen=True)
class BatchContext:
    """What a reducer knows about the batch besides the hooked tensor.

    `tokens` (batch, pos) and `attention_mask` (batch, pos) bool (None: no padding) are on
    the model's device. Real tokens of a prompt must be contiguous (right or left padding).
    """

    site: AttentionSite
    tokens: torch.Tensor  # (batch, pos)
    attention_mask: torch.Tensor | None  # (batch, pos) bool, True = real token
    causal: bool
    meta: dict  # the PromptSet's meta (kind, seed, ...)
    repeats: Repeats | None = None  # the PromptSet's repeat structure

    @functools.cached_property
    def real(self) -> torch.Tensor:
        """(batch, pos) bool: True at real (non-padding) tokens."""
        if self.attention_mask is None:
            return torch.ones(self.tokens.shape, dtype=torch.bool, device=self.tokens.device)
        return self.attention_mask

    @functools.cached_property
    def allowed(self) -> torch.Tensor:
        """(batch, 1, query, key) bool: the query is real and may attend to the key."""
        real = self.real
        allowed = real[:, None, :, None] & real[:, None, None, :]
        if self.causal:
            n = real.shape[1]
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=real.device).tril()
        return allowed

    @functools.cached_property
    def first_real(self) -> torch.Tensor:
        """(batch,) index of each prompt's first real token (0 unless left-padded)."""
        return self.real.long().argmax(-1)


def _device(model: nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def _model_limits(model: nn.Module) -> dict[str, int | None]:
    cfg = getattr(model, "cfg", None)
    return {"n_ctx": getattr(cfg, "n_ctx", None), "d_vocab": getattr(cfg, "d_vocab", None)}


def can_stop_early(model: nn.Module) -> bool:
    """Whether `model(tokens, stop_at_layer=n)` runs only blocks 0..n-1 (and no unembedding): our HookedGPT /
    HookedEncoder (converted models included), or any model whose forward takes `stop_at_layer`
    (TransformerLens's bridge). The one place the toolkit decides whether a forward can stop early."""
    from interp.models.gpt import HookedGPT

    if isinstance(model, HookedGPT):
        return True
    try:
        return "stop_at_layer" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def stop_after(model: nn.Module, layers: Iterable[int]) -> dict[str, Any]:  # keyword arguments for any forward
    """Forward keyword arguments that stop after the last of `layers` (the layers a set of hooks sits on):
    `{"stop_at_layer": max(layers) + 1}` where the model can stop early (`can_stop_early`), else `{}`."""
    last = max(layers)
    return {"stop_at_layer": last + 1} if can_stop_early(model) else {}


def select_sites(model: nn.Module, layers: Iterable[int] | None = None) -> list[AttentionSite]:
    """The model's attention sites, restricted to `layers` (None: all), in forward order."""
    sites = attention_sites(model)
    if layers is None:
        return sites
    from interp.validate import check_layers

    wanted = list(check_layers(layers, "layers") or ())  # whole numbers only: 0.5 is no layer
    known = {site.layer: site for site in sites}
    missing = [layer for layer in wanted if layer not in known]
    if missing or not wanted:
        raise BadInput(f"layers {missing or wanted} do not exist; this model has attention layers {sorted(known)}.")
    return [known[layer] for layer in wanted]


def _infer_causal(pattern: torch.Tensor, role: str = "pattern") -> bool:
    """For sites that do not say: causal when no weight sits above the diagonal of the pattern."""
    if role != "pattern":
        raise ValueError(
            f"this attention site does not say whether it is causal, and a {role!r} tensor cannot show it; "
            "stream role='pattern' for such models, or pass a model whose sites declare causality."
        )
    return bool(torch.triu(pattern.detach().float(), diagonal=1).abs().max() == 0)


@dataclass(frozen=True)
class _StreamPlan:
    """What `stream` hooks and how each batch's forward stops."""

    sites: list[AttentionSite]  # the chosen sites, in forward order
    names: list[str]  # each site's hook name for the role
    role: str
    stop_kwargs: dict[str, int]  # {"stop_at_layer": n} when the model stops there, else {}
    raise_after_last: bool  # raise StopForward from the last site's hook


def _plan_stream(model: nn.Module, layers: Iterable[int] | None, role: Role, early_stop: EarlyStop) -> _StreamPlan:
    """The sites to hook and how to stop: `stop_at_layer` where asked (or "auto") and the model can."""
    sites = select_sites(model, layers)
    stoppable = can_stop_early(model)
    if early_stop == "stop_at_layer" and not stoppable:
        raise ValueError(
            f"early_stop='stop_at_layer' needs a HookedGPT or HookedEncoder (or a forward that takes stop_at_layer), "
            f"got {type(model).__name__}; use early_stop='exception' or 'auto'."
        )
    use_stop_at_layer = early_stop in ("stop_at_layer", "auto")
    return _StreamPlan(sites, [site.hook(role) for site in sites], role,
                       stop_after(model, [site.layer for site in sites]) if use_stop_at_layer else {},
                       early_stop in ("exception", "auto"))


def stream(
    model: nn.Module,
    prompts: PromptSet,
    reduce: Reducer,
    *,
    layers: Iterable[int] | None = None,
    role: Role = "pattern",
    batch_size: int = 32,
    accumulator=None,
    early_stop: EarlyStop = "auto",
    forward: Callable[[nn.Module, PromptSet], object] | None = None,
):
    """Run `model` over `prompts` in batches; `reduce` each batch at each site; accumulate.

    `reduce(tensor, ctx)` gets the hooked tensor (for role "pattern": (batch, head, query,
    key)) and a `BatchContext`, and returns {metric: (batch, head, ...)}; those are stacked
    over the chosen layers into (batch, layer, head, ...) and passed to
    `accumulator.update` (default: a new `PerPromptAccumulator`), which is returned.

    `early_stop`: "exception" raises `StopForward` from the hook of the last needed site
    (caught here; hooks are always removed), so nothing after that hook runs, not even the
    rest of its own layer; "stop_at_layer" passes `stop_at_layer` to a model that can stop early
    (`can_stop_early`: HookedGPT / HookedEncoder; the rest of the last layer runs, the unembedding
    does not); "auto" does both where the model can stop early and "exception" elsewhere; "none"
    runs the whole forward. `forward(model, batch)` overrides how a batch is fed to the model (default
    `model(batch.tokens, **batch.model_kwargs())`; the batch is already on the model's device).
    """
    if early_stop not in get_args(EarlyStop):
        raise ValueError(f"early_stop={early_stop!r}; expected one of {list(get_args(EarlyStop))}.")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1.")
    check_prompts(prompts, **_model_limits(model))
    check_finite_weights(model)
    plan = _plan_stream(model, layers, role, early_stop)
    accumulator = PerPromptAccumulator() if accumulator is None else accumulator
    device = _device(model)
    was_training = model.training
    model.eval()
    try:
        for batch in distributed.shard(prompts, batch_size).prompts.batches(batch_size):
            outputs = _stream_batch(model, batch, reduce, plan, forward=forward, device=device)
            accumulator.update({
                metric: torch.stack([outputs[site.layer][metric] for site in plan.sites], dim=1)  # (batch, layer, head, ...)
                for metric in outputs[plan.sites[0].layer]
            })
    finally:
        model.train(was_training)
    return distributed.merge(accumulator)


def _stream_batch(model: nn.Module, batch: PromptSet, reduce: Reducer, plan: _StreamPlan, *,
                  forward: Callable[[nn.Module, PromptSet], object] | None,
                  device: torch.device) -> dict[int, dict[str, torch.Tensor]]:
    """One batch's forward with the plan's hooks: {layer: {metric: (batch, head, ...)}}."""
    tokens = batch.tokens.to(device)
    mask = None if batch.attention_mask is None else batch.attention_mask.to(device).bool()
    outputs: dict[int, dict[str, torch.Tensor]] = {}

    def make_hook(site: AttentionSite, last: bool):
        def hook(tensor: torch.Tensor, hook=None):
            causal = site.causal if site.causal is not None else _infer_causal(tensor, plan.role)
            context = BatchContext(site, tokens, mask, causal, batch.meta, batch.repeats)
            outputs[site.layer] = {name: value.detach() for name, value in reduce(tensor, context).items()}
            if last and plan.raise_after_last:
                raise StopForward
            return None

        return hook

    fwd_hooks = [(name, make_hook(site, site is plan.sites[-1])) for name, site in zip(plan.names, plan.sites)]
    device_batch = PromptSet(tokens, mask.long() if mask is not None else None, batch.meta, repeats=batch.repeats)
    try:
        with torch.no_grad(), hooked(model, fwd_hooks):
            if forward is not None:
                forward(model, device_batch)
            else:
                model(tokens, **plan.stop_kwargs, **device_batch.model_kwargs())
    except StopForward:
        pass
    except Exception as error:  # the user's model failing is theirs to fix, and says where
        failure = user_failure(error, f"the model {type(model).__name__}")
        if failure is None:
            raise
        raise failure from error
    missing = [name for name, site in zip(plan.names, plan.sites) if site.layer not in outputs]
    if missing:
        raise RuntimeError(
            f"hooks {missing} never fired during the forward pass; the model does not run through "
            "them (check attention_sites(model) and the `forward` argument)."
        )
    return outputs


class PerPromptAccumulator:
    """Keeps every prompt's statistics, in prompt order: {metric: (prompt, ...)} on the CPU.

    Memory grows by one (layer, head, ...) row per prompt and metric, never by T x T.
    `merge(other)` appends `other`'s prompts after this one's.
    """

    def __init__(self):
        self._chunks: dict[str, list[torch.Tensor]] = {}
        self.n_prompts = 0

    @classmethod
    def from_result(cls, result: dict[str, torch.Tensor]) -> "PerPromptAccumulator":
        acc = cls()
        acc.update(result)
        return acc

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        """Add a batch: {metric: (batch, ...)}; every metric must have the same batch size."""
        sizes = {name: value.shape[0] for name, value in batch.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"metrics disagree on the batch size: {sizes}.")
        if self._chunks and set(batch) != set(self._chunks):
            raise ValueError(f"batch has metrics {sorted(batch)}, expected {sorted(self._chunks)}.")
        for name, value in batch.items():
            self._chunks.setdefault(name, []).append(value.detach().float().cpu())
        self.n_prompts += next(iter(sizes.values()))

    def merge(self, other: "PerPromptAccumulator") -> "PerPromptAccumulator":
        """Append `other`'s prompts (in place); returns self."""
        if other.n_prompts == 0:
            return self
        if self._chunks and set(other._chunks) != set(self._chunks):
            raise ValueError(f"cannot merge metrics {sorted(other._chunks)} into {sorted(self._chunks)}.")
        for name, chunks in other._chunks.items():
            self._chunks.setdefault(name, []).extend(chunks)
        self.n_prompts += other.n_prompts
        return self

    def state_numel(self) -> int:
        """Number of stored scalars (grows with prompts, never with T)."""
        return sum(chunk.numel() for chunks in self._chunks.values() for chunk in chunks)

    def result(self) -> dict[str, torch.Tensor]:
        """{metric: (prompt, ...)}."""
        if self.n_prompts == 0:
            raise ValueError("the accumulator is empty; stream at least one prompt first.")
        return {name: torch.cat(chunks) for name, chunks in self._chunks.items()}


class MomentAccumulator:
    """Sum, sum of squares and count of per-prompt values: memory independent of the number of prompts.

    NaN marks a value a prompt does not have (e.g. an offset longer than the prompt); it is
    skipped and not counted. `result()` gives the mean and a normal-approximation interval
    mean +- z * sd / sqrt(n) (sd with Bessel's correction; fine for n >= ~30, optimistic below).
    """

    def __init__(self):
        self._state: dict[str, list[torch.Tensor]] = {}  # metric -> [sum, sum_sq, count], float64

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        for name, value in batch.items():
            value = value.detach().double().cpu()
            present = ~torch.isnan(value)
            value = value.nan_to_num(0.0)
            parts = [value.sum(0), value.pow(2).sum(0), present.sum(0).double()]
            if name not in self._state:
                self._state[name] = parts
            else:
                if self._state[name][0].shape != parts[0].shape:
                    raise ValueError(
                        f"metric {name!r}: batch shape {tuple(parts[0].shape)} differs from {tuple(self._state[name][0].shape)}."
                    )
                for total, part in zip(self._state[name], parts):
                    total += part

    def merge(self, other: "MomentAccumulator") -> "MomentAccumulator":
        """Add `other`'s sums (in place); returns self."""
        for name, parts in other._state.items():
            if name not in self._state:
                self._state[name] = [p.clone() for p in parts]
            else:
                if self._state[name][0].shape != parts[0].shape:
                    raise ValueError(
                        f"cannot merge metric {name!r} of shape {tuple(parts[0].shape)} into "
                        f"{tuple(self._state[name][0].shape)}: the shards measured different models or layers."
                    )
                for total, part in zip(self._state[name], parts):
                    total += part
        return self

    def tensors(self) -> list[torch.Tensor]:
        """The state tensors, in a fixed order: all-reduce each with SUM to combine ranks."""
        return [t for name in sorted(self._state) for t in self._state[name]]

    def state_numel(self) -> int:
        return sum(t.numel() for t in self.tensors())

    def layout(self) -> dict[str, tuple[int, ...]]:
        """{metric: shape}: what `align` needs so ranks that saw no prompt can join an all-reduce."""
        return {name: tuple(parts[0].shape) for name, parts in self._state.items()}

    def align(self, layout: dict[str, tuple[int, ...]]) -> None:
        """Add zero state for metrics in `layout` this accumulator has not seen (an empty shard)."""
        for name, shape in layout.items():
            if name not in self._state:
                self._state[name] = [torch.zeros(shape, dtype=torch.float64) for _ in range(3)]

    def result(self, confidence: float = 0.95) -> dict[str, dict[str, torch.Tensor]]:
        """{metric: {"mean", "ci_low", "ci_high", "n"}} (NaN where n == 0; zero-width CI where n == 1)."""
        if not self._state:
            raise ValueError("the accumulator is empty; stream at least one prompt first.")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence={confidence} must be in (0, 1).")
        z = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(0.5 + confidence / 2)).item()
        out = {}
        for name, (total, total_sq, n) in self._state.items():
            mean = total / n  # NaN where n == 0
            var = ((total_sq - n * mean.pow(2)) / (n - 1).clamp(min=1)).clamp(min=0)
            half = z * var.sqrt() / n.sqrt()
            out[name] = {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n}
        return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values (..., query) over positions where mask (broadcastable) is True; NaN where none."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1)  # 0/0 -> NaN by design

