"""Per-head hooks for any model that calls `torch.nn.functional.scaled_dot_product_attention`.

`hook_sdpa(model)` makes a user's model (nanoGPT-style, a Hugging Face model in SDPA mode, a
module calling SDPA itself) a TransformerLens hook root without touching its code:

1. A probe forward on a few token ids, under a `torch.overrides.TorchFunctionMode`, records
   every SDPA call: which module made it (the innermost module whose forward was running,
   tracked with forward pre-hooks), the shapes, the mask and scale, and which Linear (or Hugging
   Face `Conv1D`) took the merged heads afterwards (the output projection) and which produced
   v (the value projection).
2. Each calling module gets HookPoints `hook_q`, `hook_k`, `hook_v` (batch, pos, head, d_head),
   `hook_attn_scores`, `hook_pattern` (batch, head, query, key), `hook_z` (batch, pos, head,
   d_head) and, where the output projection was found, `hook_result` (batch, pos, head,
   d_model): named by the module's path, e.g. `transformer.h.0.attn.hook_pattern`.
3. While any of these hooks is live, the model's forward runs under the mode: each SDPA call
   is computed by the explicit path (q k^T * scale, the mask or `is_causal` applied as -inf,
   softmax, pattern @ v; `enable_gqa` repeats key/value heads; dropout as the kernel would, in
   training only, after `hook_pattern`), each step through its hook. With no hook live the
   forward is the model's own, kernel and all: nothing is intercepted.

q, k, v are hooked as the call received them. Where the caller repeated key/value heads
before the call (Hugging Face's `repeat_kv` when a mask is passed), `hook_k` / `hook_v` carry
the repeated heads and the site says so in its notes; with `enable_gqa` they carry the
key/value heads (the site's `n_kv_heads`).

Attention written by hand in the common form (nanoGPT's non-flash path, minGPT, Hugging
Face's eager attention):
`softmax(q @ k.transpose(-2, -1) * scale, masked) @ v` on (batch, head, pos, d_head) tensors
inside one module is recognised by the probe from its three ops and their shapes, and hooked
the same way: `hook_q` / `hook_k` on the operands of the first matmul, `hook_attn_scores` on
the softmax input (scale and mask as the module applied them; a "large negative" mask such as
finfo.min written as -inf), `hook_pattern` on its output,
`hook_v` / `hook_z` on the second matmul. Other forms (einsum, a softmax of one's own, 3-D
batched heads) are not recognised: such a model gets no per-head hooks (`NoSDPACalls`), and
the leakage audit still runs it as a black box.

Limits, each raised or noted clearly: one attention call per module per forward (a module
called twice, e.g. shared layers, is refused); calls must be 4-D (batch, head, pos, d_head);
the hooks fire only on the root model's forward (calling a submodule directly runs it
unhooked); while a hook is live, every torch call of the forward passes through the mode
(Python-level dispatch, small beside attention on these shapes: see benchmarks/bench_sdpa.py).

Over 600 lines for one reason: the probe, the hook installation and the hand-written-attention
recogniser share their call records and must change together; split, each half would import the other.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeGuard, cast

import einops
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp.errors import BadInput, ModelError
from interp.mha import AttentionHookedModel
from interp.models.components import hook_is_live, pooled
from interp.sites import ROLES, AttentionSite

KERNEL = F.scaled_dot_product_attention  # the builtin the mode recognises (torch._C._nn)
# hand-written attention, softmax(q @ k^T * scale + mask) @ v, is recognised through these
MATMULS = (torch.matmul, torch._C.TensorBase.matmul, torch.Tensor.__matmul__)
SOFTMAXES = (F.softmax, torch.softmax, torch._C.TensorBase.softmax)
_EXPLICIT_ROLES = ("q", "k", "v", "attn_scores", "pattern")
TO_POS = "batch head pos d_head -> batch pos head d_head"  # the layout hooks see
TO_HEAD = "batch pos head d_head -> batch head pos d_head"  # the layout the kernel takes


class NoSDPACalls(BadInput):
    """The model neither called scaled_dot_product_attention on the probe input nor computed attention
    by hand in the recognised form."""


@dataclass
class SDPASite:
    """One module that computes attention (an SDPA call, or by hand), as the probe saw it, with its hook points."""

    path: str  # module path of the caller ("" for the root)
    n_heads: int  # query heads
    n_kv_heads: int  # heads of k and v as the call received them
    d_head: int  # query/key width
    d_value: int  # value width
    scale: float | None  # the call's scale=, None for 1/sqrt(d_head)
    causal: bool | None
    kv_groups: int = 1  # > 1: the caller repeated each key/value head this many times before the call
    caller_groups: int = 1  # the calling module's num_key_value_groups (Hugging Face), 1 if it has none
    out_proj: str | None = None  # path of the Linear applied to the merged heads
    v_proj: tuple[str, int] | None = None  # (path of the Linear producing v, first column of v)
    manual: bool = False  # attention written by hand (matmul, softmax, matmul) rather than an SDPA call
    hooks: dict[str, HookPoint] = field(default_factory=dict, repr=False)
    stage: int = field(default=0, repr=False)  # where a hand-written attention is in the current forward

    def live(self, roles) -> bool:
        return any(role in self.hooks and hook_is_live(self.hooks[role]) for role in roles)

    def notes(self) -> tuple[str, ...]:
        notes = []
        if self.manual:
            notes.append(
                "attention written by hand (q @ k^T, softmax, @ v), recognised by its shapes: hook_attn_scores is the "
                "softmax input as the module computed it (scale and mask included)"
            )
        if self.kv_groups > 1:
            notes.append(
                f"the caller repeats {self.n_heads // self.kv_groups} key/value heads to {self.n_heads} before "
                "the call (repeat_kv): hook_k / hook_v carry the repeated heads as the call received them, so "
                "query heads of one group share identical k and v"
            )
        if self.caller_groups > 1:
            notes.append(
                f"the caller shares each key/value head among {self.caller_groups} query heads and decides per call how: "
                "with enable_gqa (hook_k / hook_v have the key/value heads) or by repeating them first (repeat_kv, e.g. "
                "when an attention mask is passed; hook_k / hook_v then have one head per query head); they carry what "
                "the call received"
            )
        if self.n_kv_heads != self.n_heads:
            notes.append(
                f"grouped-query attention (enable_gqa): hook_k / hook_v have {self.n_kv_heads} heads, each shared by "
                f"{self.n_heads // self.n_kv_heads} query heads"
            )
        if self.out_proj is None:
            notes.append(
                "hook_result unavailable: no Linear taking the merged heads (batch, pos, head * d_head) was "
                "found after the call, so per-head writes to the residual stream cannot be split"
            )
        return tuple(notes)


# --------------------------------------------------------------------------- module tracking


def linear_weight(module: nn.Module) -> torch.Tensor | None:
    """The (in, out) matrix of an nn.Linear or a Hugging Face Conv1D; None for anything else."""
    if isinstance(module, nn.Linear):
        return module.weight.t()
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return weight
    return None


@contextlib.contextmanager
def _module_stack(root: nn.Module, on_enter: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """A list that holds, during a forward, the paths of the modules whose forward is running
    (innermost last); `on_enter(path)` runs as each starts. The hooks are removed on exit, whatever happens."""
    stack: list[str] = []
    handles = []

    def push(path: str) -> Callable:
        def hook(_module, _args):
            stack.append(path)
            if on_enter is not None:
                on_enter(path)

        return hook

    def pop(_module, _args, _output):
        if stack:
            stack.pop()

    try:
        for path, module in root.named_modules():
            if path and not isinstance(module, HookPoint):
                handles.append(module.register_forward_pre_hook(push(path)))
                handles.append(module.register_forward_hook(pop, always_call=True))
        yield stack
    finally:
        for handle in handles:
            handle.remove()


# --------------------------------------------------------------------------- the explicit path


def _call_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _check_shapes(path: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> None:
    where = f"module {path!r}" if path else "the root module"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise BadInput(
            f"{where} called scaled_dot_product_attention with query {tuple(query.shape)}, key {tuple(key.shape)}, "
            f"value {tuple(value.shape)}; per-head hooks need 4-D (batch, head, pos, d_head) tensors. Reshape to "
            "(batch, head, pos, d_head) before the call (e.g. x.view(batch, pos, n_heads, d_head).transpose(1, 2)), "
            "or use the black-box leakage audit for this model."
        )
    n_heads, n_kv = query.shape[1], key.shape[1]
    if n_kv != n_heads and not (enable_gqa and n_kv and n_heads % n_kv == 0 and value.shape[1] == n_kv):
        raise BadInput(
            f"{where} called scaled_dot_product_attention with {n_heads} query heads and {n_kv} key heads "
            f"(value {value.shape[1]}); they must match, or divide with enable_gqa=True."
        )


def _apply_mask(scores: torch.Tensor, attn_mask, is_causal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores (batch, head, query, key) with every entry the call excludes set to -inf, and the
    rows that allow no key at all (..., query, 1), or None when no row can be empty."""
    n_query, n_key = scores.shape[-2:]
    if is_causal:
        if attn_mask is not None:
            raise BadInput("scaled_dot_product_attention got both attn_mask and is_causal=True; pass one of them.")
        # top-left aligned, as the kernel aligns it: row 0 always keeps key 0, so no row is empty
        allowed = torch.ones(n_query, n_key, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill_(~allowed, float("-inf")), None
    if attn_mask is None:
        return scores, None
    if attn_mask.dtype == torch.bool:  # True = may attend (the opposite of nn.MultiheadAttention's convention)
        excluded = ~attn_mask
        in_place = torch.broadcast_shapes(excluded.shape, scores.shape) == scores.shape
        scores = scores.masked_fill_(excluded, float("-inf")) if in_place else scores.masked_fill(excluded, float("-inf"))
    else:
        # Hugging Face writes finfo.min for "not allowed": the same exclusion, written as -inf
        mask = attn_mask.to(scores.dtype)
        excluded = mask <= torch.finfo(scores.dtype).min / 2
        scores = scores + mask.masked_fill(excluded, float("-inf"))
    empty = excluded.all(-1, keepdim=True)
    return scores, (empty if bool(empty.any()) else None)


def _explicit(site: SDPASite, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
    """SDPA written out, each step through the site's hooks; returns z (batch, pos, head, d_value)."""
    hooks = site.hooks
    q = hooks["q"](einops.rearrange(query, TO_POS))  # (batch, pos, head, d_head)
    k = hooks["k"](einops.rearrange(key, TO_POS))
    v = hooks["v"](einops.rearrange(value, TO_POS))
    groups = q.shape[2] // k.shape[2]
    if groups > 1:  # enable_gqa: each key/value head serves `groups` consecutive query heads
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    # the matmuls einsum would make, into the pool's tensors inside `run_with_cache` (`reuse_buffers`)
    square = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])  # (batch, head, query, key)
    scores = torch.matmul((q * scale).transpose(1, 2), k.permute(0, 2, 3, 1), out=pooled(site, "attn_scores", square, q))
    scores, empty = _apply_mask(scores, attn_mask, is_causal)
    scores = hooks["attn_scores"](scores)  # (batch, head, query, key)
    out = pooled(site, "pattern", tuple(scores.shape), scores)
    pattern = torch.softmax(scores, dim=-1) if out is None else torch.ops.aten._softmax.out(scores, -1, False, out=out)
    if empty is not None:  # a query with no allowed key attends to nothing: the kernel returns zeros there, not NaN
        pattern = pattern.masked_fill(empty, 0.0)
    pattern = hooks["pattern"](pattern)
    weights = F.dropout(pattern, p=dropout_p) if dropout_p > 0 else pattern
    z_shape = (weights.shape[0], weights.shape[1], weights.shape[2], v.shape[-1])  # (batch, head, query, d_value)
    z = torch.matmul(weights, v.transpose(1, 2), out=pooled(site, "z", z_shape, v))
    return z.transpose(1, 2)  # (batch, query, head, d_value)


class _Interceptor(TorchFunctionMode):
    """Routes SDPA calls made by a hooked site to its explicit path; everything else runs as is."""

    def __init__(self, sites: dict[str, SDPASite], stack: list[str]):
        super().__init__()
        self.sites, self.stack = sites, stack

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        site = self.sites.get(self.stack[-1] if self.stack else "")
        if site is not None and site.manual:
            return _by_hand(site, func, args, kwargs)
        if func is not KERNEL or site is None:
            return func(*args, **kwargs)
        call = _call_arguments(*args, **kwargs)
        query, key, value, _, _, _, _, enable_gqa = call
        _check_shapes(site.path, query, key, value, enable_gqa)
        if site.live(_EXPLICIT_ROLES):
            z = _explicit(site, *call)  # (batch, pos, head, d_value)
        else:
            z = einops.rearrange(func(*args, **kwargs), TO_POS)
        return einops.rearrange(site.hooks["z"](z), TO_HEAD)


def _is_qk(a: Any, b: Any) -> bool:
    """a (batch, head, query, d) @ b (batch, head, d, key): the scores matmul of hand-written attention."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 4 and b.dim() == 4
            and a.shape[:2] == b.shape[:2] and a.shape[-1] == b.shape[-2])


def _by_hand(site: SDPASite, func, args, kwargs) -> Any:
    """Hand-written attention of a hooked site: q @ k^T, softmax and @ v, each step through its hooks.
    `site.stage` (reset as the module's forward starts) says which step comes next; any other op runs as is."""
    hooks = site.hooks
    if func in MATMULS and site.stage in (0, 2) and len(args) >= 2 and _is_qk(*args[:2]) and not kwargs:
        left, right = args[:2]
        if site.stage == 0:  # scores = q @ k^T
            site.stage = 1
            q = hooks["q"](einops.rearrange(left, TO_POS))
            k = hooks["k"](einops.rearrange(right.transpose(-2, -1), TO_POS))
            return einops.einsum(q, k, "batch query head d_head, batch key head d_head -> batch head query key")
        site.stage = 3  # z = pattern @ v
        v = hooks["v"](einops.rearrange(right, TO_POS))
        z = einops.einsum(left, v, "batch head query key, batch key head d_head -> batch query head d_head")
        return einops.rearrange(hooks["z"](z), TO_HEAD)
    if func in SOFTMAXES and site.stage == 1 and args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
        site.stage = 2
        return hooks["pattern"](_hand_softmax(hooks["attn_scores"], func, args, kwargs))
    return func(*args, **kwargs)


def _hand_softmax(scores_hook: HookPoint, func, args, kwargs) -> torch.Tensor:
    """The module's softmax with its scores through the hook; a "large negative" mask (Hugging Face's
    finfo.min) written as -inf, as the hook names promise. A row the mask excludes entirely keeps the
    module's own result (uniform over finfo.min entries), so outputs do not change."""
    raw = args[0]  # (batch, head, query, key)
    masked = raw <= torch.finfo(raw.dtype).min / 2 if raw.is_floating_point() else torch.zeros_like(raw, dtype=torch.bool)
    has_masked = bool(masked.any())
    scores = scores_hook(raw.masked_fill(masked, float("-inf")) if has_masked else raw)
    pattern = func(scores, *args[1:], **kwargs)
    if has_masked:
        empty = masked.all(-1, keepdim=True)
        if bool(empty.any()):
            pattern = torch.where(empty, func(raw, *args[1:], **kwargs), pattern)
    return pattern


def _result_hook(site: SDPASite) -> Callable:
    """A forward hook for the output projection: the same output, computed per head through hook_result."""

    def per_head(module, args, output):
        merged, weight = args[0], linear_weight(module)  # merged: (batch, pos, head * d_value)
        if merged.shape[-1] != site.n_heads * site.d_value or weight is None:
            return None
        w_o = einops.rearrange(weight, "(head d_head) d_model -> head d_head d_model", head=site.n_heads)
        z = einops.rearrange(merged, "... pos (head d_head) -> ... pos head d_head", head=site.n_heads)
        if z.dim() == 4:  # (batch, pos, head, d_value): the matmul einsum makes, head outermost, into the pool's tensor
            batch, n_pos = z.shape[:2]
            out = pooled(site, "result", (site.n_heads, batch * n_pos, w_o.shape[-1]), z)
            heads = torch.matmul(einops.rearrange(z, "batch pos head d_head -> head (batch pos) d_head"), w_o, out=out)
            written = einops.rearrange(heads, "head (batch pos) d_model -> batch pos head d_model", batch=batch)
        else:
            written = einops.einsum(z, w_o, "... pos head d_head, head d_head d_model -> ... pos head d_model")
        result = site.hooks["result"](written)
        out = result.sum(dim=-2)
        return out + module.bias if module.bias is not None else out

    return per_head


if TYPE_CHECKING:  # the type checker sees the nn.Module this class is always mixed into (see _intercepted_class)
    _ForwardBase = nn.Module
else:
    _ForwardBase = object


class _InterceptedForward(_ForwardBase):
    """First base of a hooked model's class: its forward runs under the interceptor only while a hook is live."""

    def forward(self, *args, **kwargs):
        sites: dict[str, SDPASite] = self.__dict__["_interp_sdpa_sites"]
        if not any(site.live(ROLES) for site in sites.values()):
            return super().forward(*args, **kwargs)

        def restart(path: str) -> None:  # a hand-written attention starts over as its module is entered
            if path in sites:
                sites[path].stage = 0

        for site in sites.values():
            site.stage = 0
        with _module_stack(self, restart) as stack, _result_hooks(self, sites), _Interceptor(sites, stack):
            return super().forward(*args, **kwargs)


@contextlib.contextmanager
def _result_hooks(model: nn.Module, sites: dict[str, SDPASite]) -> Iterator[None]:
    handles = [
        model.get_submodule(site.out_proj).register_forward_hook(_result_hook(site))
        for site in sites.values() if site.out_proj is not None and site.live(("result",))
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# --------------------------------------------------------------------------- the probe


@dataclass
class _Call:
    """One SDPA call seen by the probe."""

    path: str
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    output: torch.Tensor  # (batch, head, pos, d_value)
    scores: torch.Tensor | None = None  # hand-written attention: the softmax input (batch, head, query, key)


class _Recorder(TorchFunctionMode):
    """Runs every SDPA call unchanged and records it, with the Linear calls around it, in order."""

    def __init__(self, stack: list[str], events: list):
        super().__init__()
        self.stack, self.events = stack, events

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is KERNEL:
            query, key, value, attn_mask, _, is_causal, scale, enable_gqa = _call_arguments(*args, **kwargs)
            path = self.stack[-1] if self.stack else ""
            _check_shapes(path, query, key, value, enable_gqa)
            self.events.append(_Call(path, query.detach(), key.detach(), value.detach(),
                                     None if attn_mask is None else attn_mask.detach(), bool(is_causal), scale,
                                     bool(enable_gqa), out.detach()))
        elif func in MATMULS and len(args) >= 2 and _is_qk(*args[:2]):
            self.events.append(("matmul", self.stack[-1] if self.stack else "", args[0].detach(), args[1].detach(), out.detach()))
        elif func in SOFTMAXES and args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            self.events.append(("softmax", self.stack[-1] if self.stack else "", args[0].detach(), None, out.detach()))
        return out


def default_example(model: nn.Module) -> tuple[torch.Tensor]:
    """Two short sequences of token ids from the model's vocabulary (its nn.Embedding or config)."""
    from interp.modelconfig import context_length, vocab_size

    d_vocab = vocab_size(model)
    if d_vocab is None:
        raise BadInput(
            f"cannot tell the vocabulary of a {type(model).__name__} (no config vocab_size and no nn.Embedding), "
            "so there are no token ids to probe it with; pass example=(inputs...) that its forward accepts."
        )
    n_pos = min(8, context_length(model) or 8)
    param = next(model.parameters(), None)
    device = param.device if param is not None else "cpu"
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, d_vocab, (2, n_pos), generator=generator).to(device),)


def probe(model: nn.Module, example: Any = None) -> list:
    """Run one forward (eval mode, no grad) and return its events in the order they happened: SDPA
    `_Call`s, ("linear", path, input, output) for every Linear / Conv1D, and ("matmul" | "softmax", path,
    left, right, output) for the 4-D products and softmaxes that hand-written attention is made of."""
    kwargs = example if isinstance(example, dict) else {}
    if example is None:
        args = default_example(model)
    else:
        args = () if isinstance(example, dict) else (example if isinstance(example, tuple) else (example,))
    events: list = []

    def log_linear(path: str) -> Callable:
        def hook(_module, inputs, output):
            if inputs and isinstance(inputs[0], torch.Tensor) and isinstance(output, torch.Tensor):
                events.append(("linear", path, inputs[0].detach(), output.detach()))

        return hook

    handles = [m.register_forward_hook(log_linear(p)) for p, m in model.named_modules() if linear_weight(m) is not None]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _module_stack(model) as stack, _Recorder(stack, events):
            model(*args, **kwargs)
    except BadInput:
        raise
    except Exception as error:
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in (*args, *kwargs.values())]
        raise ModelError(
            f"{type(model).__name__}.forward failed on the probe input {shapes} "
            f"({'token ids' if example is None else 'the example given'}): {type(error).__name__}: {error}. "
            "Per-head SDPA hooks need one forward to find the attention calls; pass example=(inputs...) that the "
            "model accepts (e.g. interp.hook_sdpa(model, example=batch))."
        ) from error
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return events


def _merged(heads: torch.Tensor) -> torch.Tensor:
    return einops.rearrange(heads, "batch head pos d_head -> batch pos (head d_head)")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-5, rtol=1e-4)


def _out_projection(events: list, index: int, call: _Call) -> str | None:
    """The first Linear after the call (and before the next one) whose input is the merged heads."""
    merged = _merged(call.output)
    for event in events[index + 1:]:
        if isinstance(event, _Call):
            return None
        if event[0] == "linear" and _same(event[2], merged):
            return event[1]
    return None


def _value_projection(events: list, index: int, value: torch.Tensor) -> tuple[str, int] | None:
    """The last Linear before the call whose output holds the merged value heads as a column block."""
    merged = _merged(value)
    width = merged.shape[-1]
    for event in reversed(events[:index]):
        if isinstance(event, _Call):
            return None
        if event[0] != "linear":
            continue
        _, path, _, output = event
        if output.shape[:-1] != merged.shape[:-1]:
            continue
        for start in range(0, output.shape[-1] - width + 1, width):
            if _same(output[..., start:start + width], merged):
                return path, start
    return None


def _repeat_groups(model: nn.Module, call: _Call) -> int:
    """How many times the caller repeated each key/value head (1 when it did not)."""
    groups = getattr(model.get_submodule(call.path) if call.path else model, "num_key_value_groups", 1)
    if not isinstance(groups, int) or groups <= 1 or call.key.shape[1] % groups:
        return 1
    for tensor in (call.key, call.value):
        grouped = einops.rearrange(tensor, "batch (kv group) pos d -> batch kv group pos d", group=groups)
        if not torch.equal(grouped, grouped[:, :, :1].expand_as(grouped)):
            return 1
    return groups


def _causal(call: _Call) -> bool | None:
    """True for a causal call, False for a bidirectional one, None for any other mask."""
    n_query, n_key = call.query.shape[2], call.key.shape[2]
    if call.is_causal:
        return n_query == n_key or None
    mask = call.attn_mask if call.scores is None else call.scores
    if mask is None:
        return False
    allowed = mask if mask.dtype == torch.bool else torch.isfinite(mask) & (mask > torch.finfo(mask.dtype).min / 2)
    allowed = allowed.expand(*call.query.shape[:2], n_query, n_key)
    if allowed.all():
        return False
    lower = torch.ones(n_query, n_key, dtype=torch.bool, device=mask.device).tril(n_key - n_query)
    return True if torch.equal(allowed, lower.expand_as(allowed)) else None


def _hand_written_calls(events: list) -> list:
    """Events with each hand-written attention (q @ k^T, softmax, pattern @ v in one module, shapes
    agreeing) turned into a `_Call` at the place of its last matmul; modules calling SDPA are left alone."""
    callers = {e.path for e in events if isinstance(e, _Call)}
    steps: dict[str, list] = {}  # path -> the matched steps so far
    ambiguous: set[str] = set()  # two candidate q @ k^T before one softmax: which is which is a guess, so none
    result = []
    for event in events:
        if isinstance(event, _Call) or event[0] == "linear" or event[1] in callers or event[1] in ambiguous:
            result.append(event)
            continue
        kind, path, left, right, out = event
        found = steps.setdefault(path, [])
        if kind == "matmul" and len(found) in (0, 3):
            found[:] = [event]
        elif kind == "matmul" and len(found) == 1:
            ambiguous.add(path)
        elif kind == "softmax" and len(found) == 1 and left.shape == found[0][4].shape:
            found.append(event)
        elif kind == "matmul" and len(found) == 2 and left.shape == found[1][4].shape:
            qk, softmax = found
            found[:] = [qk, softmax, event]
            result.append(_Call(path, qk[2], qk[3].transpose(-2, -1), right, None, False, _scale(qk, softmax),
                                False, out, scores=softmax[2]))
    return result


def _scale(qk: tuple, softmax: tuple) -> float | None:
    """The factor between q k^T and the softmax input, where one factor explains every finite entry."""
    raw, scores = qk[4].double(), softmax[2].double()
    finite = torch.isfinite(scores) & (softmax[2] > torch.finfo(softmax[2].dtype).min / 2)  # not masked
    if not finite.any():
        return None
    factor = float((scores[finite] * raw[finite]).sum() / (raw[finite] ** 2).sum().clamp(min=1e-300))
    return factor if torch.allclose(scores[finite], factor * raw[finite], atol=1e-5, rtol=1e-4) else None


# --------------------------------------------------------------------------- hooking a model


def _sites_from(model: nn.Module, events: list) -> dict[str, SDPASite]:
    events = _hand_written_calls(events)
    calls = [(i, e) for i, e in enumerate(events) if isinstance(e, _Call)]
    if not calls:
        raise NoSDPACalls(
            f"{type(model).__name__} has no hooks, never called torch.nn.functional.scaled_dot_product_attention on "
            "the probe input, and computes no attention by hand in the recognised form (softmax(q @ k^T ...) @ v on "
            "(batch, head, pos, d_head) tensors, in one module): per-head hooks are unavailable. The leakage audit "
            "still runs it as a black box; for per-head analyses call F.scaled_dot_product_attention in its attention, "
            "use nn.MultiheadAttention, or convert it to a HookedGPT."
        )
    sites: dict[str, SDPASite] = {}
    for index, call in calls:
        if call.path in sites:
            raise BadInput(
                f"module {call.path or type(model).__name__!r} called scaled_dot_product_attention more than once in one "
                "forward (a shared layer, or several attentions in one module); per-head hooks are named by module, one "
                "call each. Give each attention call a module of its own."
            )
        caller = model.get_submodule(call.path) if call.path else model
        caller_groups = getattr(caller, "num_key_value_groups", 1)
        groups = 1 if call.enable_gqa else _repeat_groups(model, call)
        value = call.value[:, ::groups] if groups > 1 else call.value
        sites[call.path] = SDPASite(
            path=call.path, n_heads=call.query.shape[1], n_kv_heads=call.key.shape[1], d_head=call.query.shape[-1],
            d_value=call.value.shape[-1], scale=call.scale, causal=_causal(call), kv_groups=groups,
            caller_groups=caller_groups if isinstance(caller_groups, int) and caller_groups > 1 else 1,
            out_proj=_out_projection(events, index, call), v_proj=_value_projection(events, index, value),
            manual=call.scores is not None,
        )
    return sites


def _attach_hook_points(model: nn.Module, site: SDPASite) -> None:
    module = model.get_submodule(site.path) if site.path else model
    roles = [r for r in ROLES if r != "result" or site.out_proj is not None]
    taken = [f"hook_{r}" for r in roles if hasattr(module, f"hook_{r}")]
    if taken:
        raise BadInput(
            f"module {site.path or type(model).__name__!r} already has attributes {taken}; hook_sdpa would overwrite them. "
            "Rename them, or hook the model with its own HookPoints."
        )
    for role in roles:
        point = HookPoint()
        module.add_module(f"hook_{role}", point)
        site.hooks[role] = point


_INTERCEPTED_CLASSES: dict[type, type] = {}


def _intercepted_class(cls: type) -> type:
    if cls not in _INTERCEPTED_CLASSES:
        _INTERCEPTED_CLASSES[cls] = type(
            f"SDPAHooked{cls.__name__}", (_InterceptedForward, cls, AttentionHookedModel),
            {"_interp_original_class": cls, "__module__": cls.__module__},
        )
    return _INTERCEPTED_CLASSES[cls]


def is_intercepted(model: Any) -> TypeGuard[AttentionHookedModel]:
    """Whether `hook_sdpa` hooked `model` (its class then derives from AttentionHookedModel)."""
    return isinstance(model, nn.Module) and "_interp_sdpa_sites" in model.__dict__


def hook_sdpa(model: nn.Module, example: Any = None) -> nn.Module:
    """Give every module of `model` that calls `scaled_dot_product_attention` per-head hooks.

    The model is changed in place (hook points added to the calling modules, its class given
    the `HookedRootModule` methods) and returned; its state dict and outputs are unchanged.
    `example`: an input for the probe forward (a tensor, a tuple of positional arguments or a
    dict of keyword arguments);
    default two sequences of token ids from the model's vocabulary. Calling it twice is
    harmless; undo with `unhook_sdpa`.
    """
    if not isinstance(model, nn.Module):
        raise BadInput(f"hook_sdpa needs an nn.Module, got {type(model).__name__}.")
    if is_intercepted(model):
        return model
    if isinstance(model, HookedRootModule):
        raise BadInput(
            f"{type(model).__name__} is already a hook root (it has HookPoints of its own); use its hooks, "
            "or pass the model before hooking it."
        )
    sites = _sites_from(model, probe(model, example))
    for site in sites.values():
        _attach_hook_points(model, site)
    model.__class__ = _intercepted_class(type(model))
    model = cast(AttentionHookedModel, model)  # its class now derives from AttentionHookedModel
    model.is_caching, model.context_level = False, 0
    model.__dict__["_interp_sdpa_sites"] = sites  # read back through __dict__ (is_intercepted, sdpa_sites)
    _attach_surface(model, sites)
    model.setup()
    return model


def _attach_surface(model: nn.Module, sites: dict[str, SDPASite]) -> None:
    """TransformerLens's surface (`interp.tl_surface`): cfg, and on a nanoGPT layout the stacked weights."""
    import interp.tl_surface as tl_surface

    attention = [(model.get_submodule(s.path) if s.path else model, s.n_heads, s.d_head) for s in sites.values()]
    first = next(iter(sites.values()), None)
    out = model.get_submodule(first.out_proj) if first is not None and first.out_proj is not None else None
    tl_surface.attach(model, attention, d_model=getattr(out, "out_features", None))


def unhook_sdpa(model: nn.Module) -> nn.Module:
    """Undo `hook_sdpa`: hook points removed, the original class back; returns the model."""
    if not is_intercepted(model):
        raise BadInput(f"{type(model).__name__} was not hooked by hook_sdpa; there is nothing to undo.")
    model.reset_hooks(including_permanent=True)
    import interp.tl_surface as tl_surface

    tl_surface.detach(model)
    for site in model.__dict__.pop("_interp_sdpa_sites").values():
        module = model.get_submodule(site.path) if site.path else model
        for role in site.hooks:
            delattr(module, f"hook_{role}")
    model.__class__ = model._interp_original_class
    for attr in ("hook_dict", "mod_dict", "hook_aliases", "is_caching", "context_level"):
        model.__dict__.pop(attr, None)
    return model


def sdpa_sites(model: nn.Module) -> dict[str, SDPASite]:
    """The probe's record of each calling module (path -> SDPASite) of a model hooked by hook_sdpa."""
    if not is_intercepted(model):
        raise BadInput(f"{type(model).__name__} was not hooked by hook_sdpa.")
    return model.__dict__["_interp_sdpa_sites"]


def intercepted_sites(model: nn.Module) -> list[AttentionSite] | None:
    """Sites of a model hooked by hook_sdpa, in the order the probe saw the calls."""
    if not is_intercepted(model):
        return None
    sites = []
    for layer, site in enumerate(sdpa_sites(model).values()):
        prefix = f"{site.path}." if site.path else ""
        hooks = {role: f"{prefix}hook_{role}" for role in ROLES if role in site.hooks}
        sites.append(AttentionSite(
            layer, site.path, site.n_heads, site.d_head, site.causal, hooks,
            scale=site.scale, n_kv_heads=site.n_kv_heads, output_module=site.out_proj, notes=site.notes(),
        ))
    return sites
