"""What a model hooked by intercepting its attention (`interp.hook_sdpa`, `hook_attention`) exposes beyond its
attention hooks: the norm before its unembedding, each attention layer's input norm and output projection.

Such a model has per-head q, k, v, pattern and z hooks but no split q/k/v inputs, so edge patching into one
head's query, key or value is impossible there. Two things still are, given these modules:

- direct logit attribution per head: z_h @ W_O[h] read through the final norm (its scale frozen at the clean
  run's value, which makes it affine) into the unembedding (`interp.analyses.circuits.dla`);
- head -> layer patching (`LayerInputPatch`): a sender head's write from a corrupted run replacing its clean
  write in what one later attention layer reads, q, k and v of all its heads at once. The change enters the
  layer's input norm (a forward pre-hook adding it to the norm's input), so the norm sees the patched
  residual stream, as HookedGPT's split inputs do; the residual stream itself keeps the clean write.

and QK attribution (`interp.analyses.qk.intercepted`) where q and k are a Linear's output columns as they are
(`projections`), or nn.MultiheadAttention's packed maps.

All three need a pre-norm model (each attention layer reads `norm(resid)` and adds its output projection's output
to `resid`), the layout of GPT-2, nanoGPT, Llama and their forks. The modules are found by one probe forward: a
norm is the attention's input norm when its output is the attention module's input and it sits in the same block
(`h.0.ln_1` beside `h.0.attn`); a norm elsewhere (an earlier block's, an embedding norm) marks a post-norm layout
(`InterceptedLayout.post_norm`, refused). The final norm is the one whose output the unembedding reads; a block's output
read directly is the stream itself (no final norm). Norms are recognised by kind (LayerNorm, RMSNorm) and checked
on the probe: the frozen-scale formula must give the norm's own output, or the norm counts as unknown (refused).
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from interp.data import PromptSet, prompt_fingerprint
from interp.errors import BadInput
from interp.heads import Head
from interp.hooks import attention_sites, hooked
from interp.modelinfo import ov_weights, user_class, vocab_size
from interp.sites import AttentionSite


def has_split_inputs(model: nn.Module) -> bool:
    """A HookedGPT-like model: blocks whose heads read split q/k/v inputs (`blocks.{l}.attn.hook_q_input`), where
    edges can be patched; the analyses here are for hooked models without them."""
    blocks = getattr(model, "blocks", None)
    return blocks is not None and all(hasattr(block, "hook_q_input") for block in blocks)


@dataclass(frozen=True)
class Norm:
    """A norm the toolkit can freeze: y = ((x - mean x if centres) / scale) * weight + bias,
    scale = sqrt(mean((x - mean x if centres)^2) + eps)."""

    path: str
    centres: bool  # LayerNorm centres, RMSNorm does not
    eps: float

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 1) float64 the norm's per-position scale on its input x."""
        x = x.double()
        if self.centres:
            x = x - x.mean(-1, keepdim=True)
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def affine(self, model: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The norm's weight and bias (None where it has none)."""
        module = model.get_submodule(self.path)
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        return (weight if isinstance(weight, torch.Tensor) else None, bias if isinstance(bias, torch.Tensor) else None)

    def frozen(self, model: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        x = x.double()
        centred = x - x.mean(-1, keepdim=True) if self.centres else x
        weight, bias = self.affine(model)
        out = centred / scale * (1.0 if weight is None else weight.double())
        return out + (0.0 if bias is None else bias.double())


@dataclass(frozen=True)
class InterceptedLayout:
    """The modules around an intercepted model's attention, by path ("" none found)."""

    readout: str  # the unembedding (the last Linear to the vocabulary)
    final_norm: Norm | None  # the norm whose output the unembedding reads; None: it reads something else
    input_norms: dict[int, Norm | None] = field(default_factory=dict)  # attention layer -> its input norm
    # what produced the readout's / an attention's input where it is no norm the toolkit can freeze ("" none: the stream)
    final_unknown: str = ""
    input_unknown: dict[int, str] = field(default_factory=dict)
    post_norm: tuple[str, ...] = ()  # attention inputs read from a norm outside their block (a post-norm layout)


_LAYOUTS: weakref.WeakKeyDictionary[nn.Module, InterceptedLayout] = weakref.WeakKeyDictionary()


def layout(model: nn.Module) -> InterceptedLayout:
    """The readout, the final norm and each attention layer's input norm of an intercepted model (memoised)."""
    if model not in _LAYOUTS:
        _LAYOUTS[model] = _probe(model)
    return _LAYOUTS[model]


def _norm_kind(module: nn.Module) -> bool | None:
    """True: a LayerNorm (centres), False: an RMSNorm, None: not a norm the toolkit can freeze."""
    name = type(module).__name__
    if isinstance(module, nn.LayerNorm) or name.endswith("LayerNorm"):
        return True
    if isinstance(module, nn.RMSNorm) or name.endswith("RMSNorm"):
        return False
    return None


def _eps(module: nn.Module) -> float:
    eps = getattr(module, "eps", None)
    eps = getattr(module, "variance_epsilon", None) if eps is None else eps
    return float(torch.finfo(torch.float32).eps if eps is None else eps)


def readout_module(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The last nn.Linear mapping to the vocabulary (a language-model head), with its path."""
    d_vocab = vocab_size(model)
    heads = [(path, m) for path, m in model.named_modules() if isinstance(m, nn.Linear) and m.out_features == d_vocab]
    return heads[-1] if heads else None


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


@torch.no_grad()
def _probe(model: nn.Module) -> InterceptedLayout:
    from interp.sdpa import default_example

    found = readout_module(model)
    if found is None:
        raise BadInput(f"{user_class(model).__name__} has no nn.Linear to its vocabulary ({vocab_size(model)}) as its last "
                       "layer, so its logits are no linear readout of the residual stream.")
    readout_path, readout = found
    # every submodule's output (but those that pass their input on), to tell which one a reader's input came from
    modules = {path: m for path, m in model.named_modules() if path and not isinstance(m, (nn.Dropout, nn.Identity))}
    sites = attention_sites(model)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # module path -> (input, output)
    inputs: dict[str, torch.Tensor] = {}  # site module path or "readout" -> its input
    outputs: dict[str, torch.Tensor] = {}  # site module path -> its output (the first tensor of a tuple)
    handles = [m.register_forward_hook(_keep_io(seen, path)) for path, m in modules.items()]
    handles.append(readout.register_forward_pre_hook(_keep_input(inputs, "readout"), with_kwargs=True))
    for site in [s for s in sites if s.module]:
        module = model.get_submodule(site.module)
        handles.append(module.register_forward_pre_hook(_keep_input(inputs, site.module), with_kwargs=True))
        handles.append(module.register_forward_hook(_keep_output_of(outputs, site.module)))
    try:
        model(*default_example(model))
    finally:
        for handle in handles:
            handle.remove()

    def norm_of(x: torch.Tensor | None) -> tuple[Norm | None, str]:
        """The norm whose output `x` is, or None and what else produced it ("": the residual stream itself, summed in a
        forward or returned by a block)."""
        for path, (inp, out) in seen.items():
            if x is not None and out.shape == x.shape and torch.equal(out, x):
                module = modules[path]
                if _norm_kind(module) is None and any(True for _ in module.children()):
                    return None, ""  # a block's output: the stream as the block returns it
                norm = _checked(model, path, module, inp, out) if _norm_kind(module) is not None else None
                return norm, "" if norm is not None else f"{path} ({type(module).__name__})"
        return None, ""

    final, final_unknown = norm_of(inputs.get("readout"))
    norm_inputs = {path: io[0] for path, io in seen.items() if _norm_kind(modules[path]) is not None}
    per_site = {s.layer: _unless_post_norm(s, norm_inputs, inputs, outputs, *norm_of(inputs.get(s.module)))
                if s.module else (None, "the model itself") for s in sites}
    post_norm = tuple(what for _, what in per_site.values() if POST_NORM in what)
    return InterceptedLayout(readout_path, final, {layer: norm for layer, (norm, _) in per_site.items()}, final_unknown,
                  {layer: what for layer, (_, what) in per_site.items() if what}, post_norm)


POST_NORM = "a post-norm layout, which normalises the stream between writers"


def _unless_post_norm(site: AttentionSite, norm_inputs: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor],
                      outputs: dict[str, torch.Tensor], norm: Norm | None, what: str) -> tuple[Norm | None, str]:
    """The site's input norm, unless the block is post-norm: the attention's output added to its own *input* is
    what a norm then reads (x = norm(x + attn(x))), where a pre-norm block adds it to the norm's input instead."""
    x, out = inputs.get(site.module), outputs.get(site.module)
    if x is None or out is None or x.shape != out.shape:
        return norm, what
    summed = x + out
    for path, seen_input in norm_inputs.items():
        if seen_input.shape == summed.shape and torch.allclose(seen_input, summed, atol=1e-5, rtol=1e-5):
            return None, f"its input from {norm.path if norm else 'the stream'}, and {site.module}'s input plus its output " \
                         f"is what {path} normalises: {POST_NORM}"
    return norm, what


def _keep_output_of(outputs: dict[str, torch.Tensor], key: str) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        first = output if isinstance(output, torch.Tensor) else next(
            (t for t in output if isinstance(t, torch.Tensor)), None) if isinstance(output, (tuple, list)) else None
        if first is not None:
            outputs[key] = first.detach()
    return hook


@dataclass(frozen=True)
class _Projection:
    """Where one side's map lives: columns [start, start + n_heads * d_head) of a Linear's output, or the packed
    map `side` (0 q, 1 k) of an nn.MultiheadAttention; read from the live weights on each use."""

    path: str
    start: int
    n_heads: int
    d_head: int
    repeat: int  # query heads per key/value head
    mha_side: int | None = None

    def read(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(head, d_model, d_head) map and (head, d_head) bias, repeated to one per query head."""
        from interp.sdpa import linear_weight

        module = model.get_submodule(self.path)
        width = self.n_heads * self.d_head
        if self.mha_side is not None:
            weight = module.in_weights()[self.mha_side].t()  # type: ignore[operator]  # (d_model, embed_dim)
            packed = getattr(module, "in_proj_bias", None)
            bias = packed.chunk(3)[self.mha_side] if isinstance(packed, torch.Tensor) else torch.zeros(width)
        else:
            weight = linear_weight(module)[:, self.start:self.start + width]  # type: ignore[index]  # (d_model, width)
            full = getattr(module, "bias", None)
            bias = full[self.start:self.start + width] if isinstance(full, torch.Tensor) else torch.zeros(width)
        W = weight.reshape(-1, self.n_heads, self.d_head).transpose(0, 1)  # (head, d_model, d_head)
        b = bias.reshape(self.n_heads, self.d_head)
        return W.detach().repeat_interleave(self.repeat, 0), b.detach().repeat_interleave(self.repeat, 0)


_PROJECTIONS: weakref.WeakKeyDictionary[nn.Module, dict[int, dict[str, _Projection]]] = weakref.WeakKeyDictionary()


def projections(model: nn.Module) -> dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Per attention layer, the query ("q") and key ("k") maps where visible: (head, d_model, d_head) weights and
    (head, d_head) biases of the Linear whose output holds the call's q (k) as a column block, exactly (k's repeated
    to one per query head under grouped-query attention). A side is missing where the model transforms it after the
    projection (rotary positions, a norm on q and k): the call's q is then no Linear's output. Where the maps are
    is found once (memoised); their weights are read as they are now."""
    if model not in _PROJECTIONS:
        _PROJECTIONS[model] = _find_projections(model)
    return {layer: {side: where.read(model) for side, where in sides.items()}
            for layer, sides in _PROJECTIONS[model].items()}


@torch.no_grad()
def _find_projections(model: nn.Module) -> dict[int, dict[str, _Projection]]:
    from interp.sdpa import default_example, linear_weight

    linears = {path: m for path, m in model.named_modules() if linear_weight(m) is not None}
    outputs: list[tuple[str, torch.Tensor]] = []
    calls: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        calls[hook.name] = act.detach()

    sites = attention_sites(model)
    names = [site.hooks[side] for site in sites for side in ("q", "k") if side in site.hooks]
    handles = [m.register_forward_hook(_keep_output(outputs, path)) for path, m in linears.items()]
    inputs: dict[str, torch.Tensor] = {}
    handles += [model.get_submodule(s.module).register_forward_pre_hook(_keep_input(inputs, s.module), with_kwargs=True)
                for s in sites if s.module]
    try:
        with hooked(model, [(name, keep) for name in names]):
            model(*default_example(model))
    finally:
        for handle in handles:
            handle.remove()
    found: dict[int, dict[str, _Projection]] = {}
    for site in sites:
        for side in ("q", "k"):
            act = calls.get(site.hooks.get(side, ""))  # (batch, pos, head, d_head)
            if act is None:
                continue
            where = _column_block(outputs, act) or _mha_block(model, site, side, inputs.get(site.module), act)
            if where is not None:  # key/value heads shared by query heads: repeated to one per query head
                found.setdefault(site.layer, {})[side] = dataclasses.replace(where, repeat=site.n_heads // where.n_heads)
    return found


def _column_block(outputs: list[tuple[str, torch.Tensor]], act: torch.Tensor) -> _Projection | None:
    """The Linear output that holds `act` (batch, pos, head, d_head) as a block of columns, exactly."""
    n_heads, d_head = act.shape[2], act.shape[3]
    merged = act.flatten(2)  # (batch, pos, head * d_head)
    width = merged.shape[-1]
    for path, out in outputs:
        if out.shape[:-1] != merged.shape[:-1]:
            continue
        for start in range(0, out.shape[-1] - width + 1, d_head):
            if torch.equal(out[..., start:start + width], merged):
                return _Projection(path, start, n_heads, d_head, 1)
    return None


def _mha_block(model: nn.Module, site: AttentionSite, side: str, x: torch.Tensor | None,
               act: torch.Tensor) -> _Projection | None:
    """nn.MultiheadAttention's packed query or key map, where the call's q (k) is exactly its input through it."""
    from interp.mha import HookedMultiheadAttention

    module = model.get_submodule(site.module)
    if not isinstance(module, HookedMultiheadAttention) or x is None:
        return None
    where = _Projection(site.module, 0, act.shape[2], act.shape[3], 1, "qk".index(side))
    W, b = where.read(model)
    if x.shape[-1] != W.shape[1]:
        return None
    projected = torch.einsum("bpm,hmd->bphd", x, W) + b
    return where if torch.allclose(projected, act, atol=1e-5, rtol=1e-5) else None


def _keep_output(outputs: list[tuple[str, torch.Tensor]], path: str) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor):
            outputs.append((path, output.detach()))
    return hook


def _keep_io(seen: dict[str, tuple[torch.Tensor, torch.Tensor]], path: str) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
            seen[path] = (args[0].detach(), output.detach())
    return hook


def _keep_input(inputs: dict[str, torch.Tensor], key: str) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _first_tensor(args, kwargs)
        if x is not None:
            inputs[key] = x.detach()
    return hook


def _checked(model: nn.Module, path: str, module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> Norm | None:
    """The norm, if the frozen-scale formula reproduces its output on the probe (else None: unknown)."""
    norm = Norm(path, bool(_norm_kind(module)), _eps(module))
    mine = norm.frozen(model, x, norm.scale(x))
    return norm if torch.allclose(mine, out.double(), atol=1e-4, rtol=1e-4) else None


def output_projection(model: nn.Module, site: AttentionSite) -> nn.Module | None:
    """The module applied to the merged heads: the SDPA probe's out_proj, nn.MultiheadAttention's out_proj."""
    from interp.sdpa import is_intercepted, sdpa_sites

    if is_intercepted(model):
        found = sdpa_sites(model).get(site.module)
        return None if found is None or found.out_proj is None else model.get_submodule(found.out_proj)
    module = model.get_submodule(site.module) if site.module else model
    out = getattr(module, "out_proj", None)
    return out if isinstance(out, nn.Module) else None


def head_writes(model: nn.Module, site: AttentionSite, z: torch.Tensor) -> torch.Tensor:
    """(batch, pos, head, d_model) each head's write z_h @ W_O[h] (no output bias), from hook_z (batch, pos, head, d_head)."""
    ov = ov_weights(model, site)
    if ov is None:
        raise BadInput(f"the attention at {site.module!r} has no visible output projection (a Linear taking the merged "
                       "heads), so its heads' writes cannot be split.")
    return torch.einsum("bphd,hdm->bphm", z.double(), ov.W_O.double())


@contextlib.contextmanager
def norm_input(model: nn.Module, norm: Norm) -> Iterator[dict[str, torch.Tensor]]:
    """Capture the input of `norm` during the forwards inside the block: `kept["x"]` (detached)."""
    kept: dict[str, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple[Any, ...]) -> None:
        kept["x"] = args[0].detach()

    handle = model.get_submodule(norm.path).register_forward_pre_hook(keep)
    try:
        yield kept
    finally:
        handle.remove()


def site_of(model: nn.Module, layer: int) -> AttentionSite:
    sites = attention_sites(model)
    if not 0 <= layer < len(sites):
        raise BadInput(f"layer {layer} is not an attention layer of {user_class(model).__name__}; it has {len(sites)} "
                       f"(0 .. {len(sites) - 1}).")
    return sites[layer]


def check_patchable(model: nn.Module, sender: Head, layer: int) -> Norm:
    """The receiver layer's input norm, after checking that `sender` -> `layer` (attention input) can be patched."""
    sender_site = site_of(model, sender[0])
    site_of(model, layer)
    if not 0 <= sender[1] < sender_site.n_heads:
        raise BadInput(f"{sender_site.label(sender[1])}: layer {sender[0]} has {sender_site.n_heads} heads.")
    if sender[0] >= layer:
        raise BadInput(f"{sender_site.label(sender[1])} -> L{layer} (attention input): a head writes only into later "
                       f"layers; choose a receiver layer after {sender[0]}.")
    if "z" not in sender_site.hooks or ov_weights(model, sender_site) is None:
        raise BadInput(f"{sender_site.label(sender[1])}'s write cannot be split from its layer's: the attention at "
                       f"{sender_site.module!r} exposes no hook_z or no output projection.")
    found = layout(model)
    norm = found.input_norms.get(layer)
    if norm is None:
        reads = found.input_unknown.get(layer) or "the residual stream without a norm"
        raise BadInput(f"{sender_site.label(sender[1])} -> L{layer} (attention input) needs layer {layer}'s attention to "
                       f"read a LayerNorm or RMSNorm of the residual stream (a pre-norm block), where the sender's change "
                       f"can be added before the norm; in {user_class(model).__name__} it reads {reads}. {what_works(model)}")
    return norm


def what_works(model: nn.Module) -> str:
    """What runs on this intercepted model as it is, for refusals: only what its layout allows (never advice that
    leads to another refusal)."""
    found = layout(model)
    sites = attention_sites(model)
    works = []
    if not found.post_norm and not found.final_unknown and all(
            "z" in site.hooks and output_projection(model, site) is not None for site in sites):
        works.append("direct logit attribution per head (interp.analyses.circuits.direct_logit_attribution)")
    if not found.post_norm and any(found.input_norms.get(site.layer) is not None for site in sites[1:]):
        works.append("head -> layer patching where a later attention reads a norm "
                     "(interp.analyses.circuits.attention_input_patch)")
    works.append("head ablations (interp.Run) and attention patterns")
    return "What works on this model: " + ", ".join(works) + "."


@dataclass(frozen=True)
class LayerInputPatch:
    """`sender`'s write from a corrupted run replacing its clean write in what attention layer `layer` reads
    (q, k and v of all its heads): an `interp.Run` intervention for intercepted models (see the module)."""

    sender: Head
    layer: int
    source: PromptSet | None = field(default=None, compare=False, hash=False)  # None: resample within the Run

    @property
    def label(self) -> str:
        return f"L{self.sender[0]}H{self.sender[1]} -> L{self.layer} (attention input)"

    def spec(self) -> dict[str, Any]:
        source = "resample" if self.source is None else {"prompts": prompt_fingerprint(self.source)}
        return {"intervention": "layer_input_patch", "edges": [self.label], "source": source}

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        from interp.paths import corrupted_prompts

        norm = check_patchable(run.model, self.sender, self.layer)
        site = site_of(run.model, self.sender[0])
        clean = _sender_write(run.model, site, self.sender[1], batch)
        corrupted = _sender_write(run.model, site, self.sender[1], corrupted_prompts(run, batch, self.source))
        return _added(run.model, norm, (corrupted - clean))


@torch.no_grad()
def _sender_write(model: nn.Module, site: AttentionSite, head: int, prompts: PromptSet) -> torch.Tensor:
    """(batch, pos, d_model) one head's write on `prompts`."""
    kept: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        kept["z"] = act.detach()

    device = next(model.parameters()).device
    with hooked(model, [(site.hooks["z"], keep)]):
        model(prompts.tokens.to(device), **{k: v.to(device) for k, v in prompts.model_kwargs().items()})
    return head_writes(model, site, kept["z"])[:, :, head]


@contextlib.contextmanager
def _added(model: nn.Module, norm: Norm, delta: torch.Tensor) -> Iterator[nn.Module]:
    """The forward with `delta` (batch, pos, d_model) added to the input of `norm`; the hook removed after."""
    def add(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        if x.shape != delta.shape:
            raise BadInput(f"{norm.path} read a {tuple(x.shape)} input; the patch is {tuple(delta.shape)}: the norm is "
                           "called on something else than the batch's residual stream.")
        return (x + delta.to(x.dtype), *args[1:])

    handle = model.get_submodule(norm.path).register_forward_pre_hook(add)
    try:
        yield model
    finally:
        handle.remove()


__all__ = ["InterceptedLayout", "LayerInputPatch", "has_split_inputs", "what_works", "Norm", "check_patchable", "head_writes", "layout", "norm_input",
           "output_projection", "projections", "readout_module"]
