"""`verify_hooks(model)`: prove that each attention hook carries what its name promises.

A hook's name is a claim. For every attention site of a supported model (see
`interp.attention_sites`) one cached forward pass checks:

- `hooks_present`: the site exposes all seven roles (q, k, v, attn_scores, pattern, z, result);
- `scores_qk`: attn_scores == q k^T / sqrt(d_head) (or the site's own `scale`) at every unmasked
  entry; grouped-query k (fewer heads than q) is repeated to the query heads first;
- `scores_masked_inf`: masked entries are -inf, not a large finite number (`finfo.min`), and a
  causal site masks everything above the diagonal;
- `pattern_softmax`: pattern == softmax(attn_scores) over the key axis;
- `rows_sum_to_one`: every pattern row with an allowed key sums to one;
- `z_pattern_v`: z == pattern @ v;
- `result_sum`: the heads' results sum to the attention module's output (or the site's
  `output_module`, e.g. the output projection SDPA interception found) up to one constant
  vector (the output bias), which equals `b_O` / `out_proj.bias` where the model has one;
and two extra forwards per hook check `edit_<role>`: adding noise at the hook changes the
model's output at all (compared with an identity hook at the same point, so both runs take
the same code path) (a hook whose edits are discarded is a read-only copy, not an intervention point).

Default input: token ids from the model's vocabulary (`interp.modelinfo`: its config or its
nn.Embedding), else embeddings for a hooked MultiheadAttention model.

Grouped-query attention (`site.n_kv_heads` < `n_heads`): the k and v hooks carry the key/value
heads as computed, and query head h is checked against key/value head h // (n_heads // n_kv_heads).

Limits: the checks use the model's own default forward (no padding, no additive float
masks such as ALiBi, which `scores_qk` would report as a mismatch); tolerances are
absolute 1e-4 plus relative 1e-4 in float32 and float64, 2e-3 + 4e-3 in float16 and
2e-2 + 2e-2 in bfloat16 (`TOLERANCES`: a few units of each format's rounding).
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, cast

import einops
import pandas as pd
import torch
from torch import nn

from interp.hooks import ROLES, AttentionSite, attention_sites
from interp.sites import hook_root

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle
    from transformer_lens.hook_points import HookPoint

ATOL, RTOL = 1e-4, 1e-4
# (atol, rtol) per dtype of the hooked tensor: a few units of its rounding (bfloat16 keeps 8
# significant bits, float16 11); float32 and float64 use ATOL, RTOL
TOLERANCES = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 4e-3)}


def _hooks(model: nn.Module, fwd_hooks: list[tuple[str, Callable[..., Any]]]) -> ContextManager[Any]:
    """`model.hooks(fwd_hooks, reset_hooks_end=True)`: every model with attention sites has it, but
    torch types an unknown module attribute as Tensor | Module."""
    return hook_root(model).hooks(fwd_hooks=fwd_hooks, reset_hooks_end=True)


def _first(output: Any) -> torch.Tensor:
    """The main tensor of a model or module output (logits, hidden states, (out, weights)...)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output:
        return _first(output[0])
    for name in ("logits", "last_hidden_state"):
        if hasattr(output, name):
            return cast(torch.Tensor, getattr(output, name))
    raise TypeError(f"cannot find a tensor in a model output of type {type(output).__name__}.")


def _model_output(model: nn.Module, output: Any) -> torch.Tensor:
    """The model's logits where it reads token ids (`interp.modelinfo.output_logits`: its `output=` selector, a
    clear error for a dict or tuple it cannot tell apart); the main tensor of an embeddings model's output."""
    from interp.modelinfo import output_logits, vocab_size
    from interp.validate import output_selector

    if output_selector(model) is not None or vocab_size(model):
        return output_logits(output, model)
    return _first(output)


def _default_inputs(model: nn.Module, sites: list[AttentionSite]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A small, seeded input for the model: token ids if it has a vocabulary, else embeddings."""
    from interp.modelinfo import context_length, vocab_size

    generator = torch.Generator().manual_seed(0)
    d_vocab = vocab_size(model)  # the config's, or the model's nn.Embedding's: token ids, never floats
    if d_vocab:
        n_pos = min(8, context_length(model) or 8)
        low = 1000 if d_vocab > 2000 else 0  # skip special tokens of real vocabularies
        return (torch.randint(low, d_vocab, (2, n_pos), generator=generator),), {}
    from interp.mha import HookedMultiheadAttention

    first = next((m for m in model.modules() if isinstance(m, HookedMultiheadAttention)), None)
    if first is None:
        raise ValueError(
            f"verify_hooks cannot guess an input for a {type(model).__name__}; pass tokens=... "
            "(a tensor, or a tuple of positional arguments for the model's forward)."
        )
    width = first.original.embed_dim  # the wrapper copies it, untyped
    shape = (2, 6, width) if first.batch_first else (6, 2, width)
    x = torch.randn(shape, generator=generator)
    if isinstance(model, HookedMultiheadAttention):
        return (x, x, x), {}
    return (x,), {}


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[bool, str]:
    """Equal within the tolerance of `dtype` (default: the actual tensor's; see TOLERANCES)."""
    if actual.shape != expected.shape:
        return False, f"shape {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
    atol, rtol = TOLERANCES.get(dtype or actual.dtype, (ATOL, RTOL))
    actual, expected = actual.double(), expected.double()
    # -inf must match -inf exactly (masked scores); NaN anywhere is a failure, never a zero
    if actual.isnan().any() or expected.isnan().any():
        return False, f"NaN in {int(actual.isnan().sum())} hooked and {int(expected.isnan().sum())} recomputed entries"
    if not torch.equal(actual.isinf(), expected.isinf()) or not torch.equal(actual[actual.isinf()], expected[expected.isinf()]):
        return False, "infinite entries differ (the mask is not what the hook claims)"
    a, e = actual.nan_to_num(0.0, 0.0, 0.0), expected.nan_to_num(0.0, 0.0, 0.0)
    err = (a - e).abs().max().item() if a.numel() else 0.0
    ok = bool(torch.allclose(a, e, atol=atol, rtol=rtol))
    return ok, f"max abs error {err:.2e}"


def _scores_qk(site: AttentionSite, q: torch.Tensor, k: torch.Tensor, scores: torch.Tensor) -> tuple[bool, str]:
    """attn_scores == q k^T * scale at every finite entry; a post-softmax tensor is named as such."""
    scale = site.scale if site.scale is not None else 1 / math.sqrt(site.d_head)
    expected = einops.einsum(
        q.double(), k.double(), "batch query head d_head, batch key head d_head -> batch head query key"
    ) * scale
    if expected.shape != scores.shape:
        return False, f"scores shape {tuple(scores.shape)} vs q k^T shape {tuple(expected.shape)}"
    finite = torch.isfinite(scores)
    ok, detail = _close(scores[finite], expected[finite].to(scores.dtype))
    if not ok and scores.min() >= 0 and torch.allclose(scores.sum(-1), torch.ones_like(scores.sum(-1)), atol=1e-4):
        detail += "; the tensor is non-negative with rows summing to one: post-softmax weights, not scores"
    return ok, detail


def _scores_masked_inf(site: AttentionSite, scores: torch.Tensor) -> tuple[bool, str]:
    """Masked scores are -inf (not a finite minimum), and a causal site masks everything above the diagonal."""
    finite_min = torch.finfo(scores.dtype).min
    near_min = int((torch.isfinite(scores) & (scores <= finite_min / 2)).sum())
    n_inf = int((scores == float("-inf")).sum())
    ok, detail = near_min == 0, f"{n_inf} entries -inf, {near_min} entries at a finite minimum"
    if site.causal:
        n_q, n_k = scores.shape[-2:]
        above = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1 + n_k - n_q)
        not_inf = int((scores[..., above] != float("-inf")).sum())
        ok = ok and not_inf == 0
        detail += f"; {not_inf} entries above the diagonal not -inf"
    return ok, detail


def _pattern_checks(got: dict[str, torch.Tensor]) -> list[tuple[str, bool, str]]:
    """(check, passed, detail) of pattern_softmax, rows_sum_to_one and z_pattern_v, for the roles present."""
    checks: list[tuple[str, bool, str]] = []
    if {"attn_scores", "pattern"} <= set(got):
        # rows with no allowed key (padded queries) have no softmax; the kernel and our hooks give zeros there
        has_key = torch.isfinite(got["attn_scores"]).any(-1)
        expected = torch.softmax(got["attn_scores"].double(), dim=-1).to(got["pattern"].dtype)
        checks.append(("pattern_softmax", *_close(got["pattern"][has_key], expected[has_key])))
    if "pattern" in got:
        pattern = got["pattern"]
        sums = pattern.double().sum(-1)
        has_key = sums > 0.5 if "attn_scores" not in got else torch.isfinite(got["attn_scores"]).any(-1)
        ok, detail = _close(sums[has_key], torch.ones_like(sums[has_key]), pattern.dtype)
        checks.append(("rows_sum_to_one", ok, f"{int(has_key.sum())} rows; {detail}"))
    if {"pattern", "v", "z"} <= set(got):
        expected = einops.einsum(
            got["pattern"].double(), got["v"].double(), "batch head query key, batch key head d_head -> batch query head d_head"
        )
        checks.append(("z_pattern_v", *_close(got["z"], expected.to(got["z"].dtype))))
    return checks


def _site_checks(
    site: AttentionSite, cache: dict[str, torch.Tensor], module_out: torch.Tensor | None, bias: torch.Tensor | None
) -> list[dict[str, Any]]:
    """The rows of one site's cached checks, in the module docstring's order (the edit checks run apart)."""
    missing = [r for r in ROLES if r not in site.hooks or site.hooks[r] not in cache]
    why = [note for note in getattr(site, "notes", ()) if "unavailable" in note]
    checks = [("hooks_present", not missing,
               (f"missing {missing}" + "".join(f"; {w}" for w in why)) if missing else "all 7 roles fire")]
    got = _per_query_head(site, {r: cache[site.hooks[r]].detach() for r in ROLES if r not in missing})
    if {"q", "k", "attn_scores"} <= set(got):
        checks.append(("scores_qk", *_scores_qk(site, got["q"], got["k"], got["attn_scores"])))
        checks.append(("scores_masked_inf", *_scores_masked_inf(site, got["attn_scores"])))
    checks += _pattern_checks(got)
    if "result" in got and module_out is not None:
        checks.append(("result_sum", *_result_sum(got["result"], module_out, bias)))
    return [{"layer": site.layer, "site": site.module, "check": check, "passed": bool(passed), "detail": detail}
            for check, passed, detail in checks]


def _result_sum(result: torch.Tensor, module_out: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, str]:
    """Whether the heads' results (batch, pos, head, d_model) sum to the module's output up to one constant
    vector (equal to `bias` where given). In half precision each head's result is rounded before the sum, so
    the relative tolerance of the model's dtype scales with the summands' magnitude, sum_h |result_h|."""
    summed = result.double().sum(dim=2)  # (batch, pos, d_model)
    scale = result.double().abs().sum(dim=2)  # (batch, pos, d_model)
    out = module_out.detach().double()
    if out.shape != summed.shape and out.ndim == 3 and out.transpose(0, 1).shape == summed.shape:
        out = out.transpose(0, 1)  # a (pos, batch, d_model) module output
    if out.shape != summed.shape:
        return False, f"module output shape {tuple(out.shape)} vs summed results {tuple(summed.shape)}"
    offset = out - summed
    constant = offset.reshape(-1, offset.shape[-1]).mean(0)  # (d_model,)
    atol, rtol = TOLERANCES.get(module_out.dtype, (ATOL, RTOL))
    err = (summed + constant - out).abs()
    ok = bool((err <= atol + rtol * torch.maximum(scale, out.abs())).all())
    detail = f"max abs error {err.max().item():.2e}"
    if bias is not None:  # the constant is a mean of rounded rows: the same scaled tolerance, on the mean scale
        expected = bias.detach().double().to(constant.device)
        if expected.shape != constant.shape:
            return False, f"{detail}; output bias shape {tuple(expected.shape)} vs offset {tuple(constant.shape)}"
        gap = (constant - expected).abs()  # (d_model,)
        ok = ok and bool((gap <= atol + rtol * scale.reshape(-1, scale.shape[-1]).mean(0)).all())
        detail = f"{detail}; offset vs output bias max abs error {gap.max().item():.2e}"
    return ok, detail


def _per_query_head(site: AttentionSite, got: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Grouped-query attention: k and v carry n_kv_heads heads; query head h reads kv head
    h // (n_heads // n_kv_heads), so repeat each kv head over its group before comparing."""
    n_kv = site.n_kv_heads or site.n_heads
    if n_kv == site.n_heads:
        return got
    out = dict(got)
    for role in ("k", "v"):
        if role in got and got[role].shape[2] == n_kv:
            out[role] = got[role].repeat_interleave(site.n_heads // n_kv, dim=2)  # (batch, pos, head, d_head)
    return out


def _output_module(site: AttentionSite) -> str:
    output = getattr(site, "output_module", None)
    return output if output is not None else site.module


def _module_output_hooks(model: nn.Module, sites: list[AttentionSite], store: dict[str, torch.Tensor]) -> list[RemovableHandle]:
    handles = []
    for site in sites:
        try:
            path = _output_module(site)
            module = model.get_submodule(path) if path else model
        except AttributeError:
            continue

        def keep(_module: nn.Module, _args: Any, output: Any, name: str = site.module) -> None:
            store[name] = _first(output)

        handles.append(module.register_forward_hook(keep))
    return handles


def _output_bias(model: nn.Module, site: AttentionSite) -> torch.Tensor | None:
    try:
        module = model.get_submodule(_output_module(site)) if _output_module(site) else model
    except AttributeError:
        return None
    if _output_module(site) != site.module:  # the output projection itself
        bias = getattr(module, "bias", None)
        return bias if isinstance(bias, torch.Tensor) else None
    b_O = getattr(module, "b_O", None)
    if isinstance(b_O, torch.Tensor):
        return b_O
    out_proj = getattr(module, "out_proj", None) or getattr(module, "o", None)
    bias = getattr(out_proj, "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


def _weights_row(model: nn.Module) -> dict[str, Any]:
    """Non-finite weights make every other check meaningless (and the fused kernel can hide them)."""
    bad = [name for name, param in model.named_parameters() if not torch.isfinite(param).all()]
    detail = f"NaN or inf in {bad[:5]}" if bad else "all parameters finite"
    return {"layer": None, "site": "model", "check": "weights_finite", "passed": not bad, "detail": detail}


def _forward_inputs(
    model: nn.Module, sites: list[AttentionSite], tokens: Any, forward_kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The forward pass's (args, kwargs): `tokens` (or a guessed default) on the model's device, plus `forward_kwargs`."""
    if tokens is None:
        args, kwargs = _default_inputs(model, sites)
    else:
        args, kwargs = (tokens if isinstance(tokens, tuple) else (tokens,)), {}
    device = _device(model)
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs.update(forward_kwargs)
    return args, kwargs


def _cached_forward(
    model: nn.Module, sites: list[AttentionSite], args: tuple[Any, ...], kwargs: dict[str, Any], guessed: bool
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward pass: (every hook of `sites` by the name asked for, each site's module output by site.module).
    A guessed input the forward refuses is a ValueError asking for tokens=...; no hook stays attached."""
    module_out: dict[str, torch.Tensor] = {}
    handles = _module_output_hooks(model, sites, module_out)
    cache: dict[str, torch.Tensor] = {}

    def saver(name: str) -> Callable[[torch.Tensor, HookPoint], None]:
        # keyed by the name asked for: a bridge's alias (hook_q) fires as its target (q.hook_out)
        def save(tensor: torch.Tensor, hook: HookPoint) -> None:
            cache[name] = tensor.detach()

        return save

    names = [name for site in sites for name in site.hooks.values()]
    try:
        with _hooks(model, [(name, saver(name)) for name in names]):
            model(*args, **kwargs)
    except TypeError as error:
        if not guessed:
            raise
        raise ValueError(
            f"verify_hooks guessed an input of shape {[tuple(a.shape) for a in args]} for a "
            f"{type(model).__name__}, and its forward refused it ({error}); pass tokens=... "
            "(a tensor, or a tuple of positional arguments)."
        ) from error
    finally:
        for handle in handles:
            handle.remove()
    return cache, module_out


@contextmanager
def _checking(model: nn.Module) -> Iterator[None]:
    """Eval mode with non-finite weights allowed, both restored afterwards: a HookedGPT refuses NaN
    weights, and here each check shows what NaN does (setattr: a flag torch's typing lacks)."""
    was_training = model.training
    model.eval()
    allowed_before = getattr(model, "allow_non_finite_weights", None)
    setattr(model, "allow_non_finite_weights", True)  # noqa: B010 -- a flag torch's typing lacks
    try:
        yield
    finally:
        model.train(was_training)
        if allowed_before is None:
            del model.allow_non_finite_weights
        else:
            model.allow_non_finite_weights = allowed_before


def verify_hooks(model: nn.Module, tokens: Any = None, **forward_kwargs: Any) -> pd.DataFrame:
    """Check every attention hook of `model`; returns a DataFrame (layer, site, check, passed, detail).

    `tokens` is the model input: a tensor, or a tuple of positional arguments (default: a
    small seeded batch of token ids, or of embeddings for a hooked MultiheadAttention model);
    `forward_kwargs` go to the forward pass (e.g. `attention_mask=`). The model is run in
    eval mode under `torch.no_grad()`; no hook stays attached afterwards.
    """
    sites = attention_sites(model)
    if not sites:
        raise ValueError(f"{type(model).__name__} has no attention sites to verify.")
    args, kwargs = _forward_inputs(model, sites, tokens, forward_kwargs)
    rows: list[dict[str, Any]] = [_weights_row(model)]
    with _checking(model), torch.no_grad():
        cache, module_out = _cached_forward(model, sites, args, kwargs, guessed=tokens is None)
        for site in sites:
            rows += _site_checks(site, cache, module_out.get(site.module), _output_bias(model, site))
            rows += _edit_checks(model, site, args, kwargs)
    return pd.DataFrame(rows, columns=["layer", "site", "check", "passed", "detail"])


def _noise_hook(seed: int) -> Callable[[torch.Tensor, HookPoint], torch.Tensor]:
    def add_noise(tensor: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        generator = torch.Generator(device=tensor.device).manual_seed(seed)
        noise = torch.randn(tensor.shape, generator=generator, device=tensor.device, dtype=tensor.dtype)
        scale = tensor[torch.isfinite(tensor)].float().std().clamp(min=0.1).item() if tensor.numel() > 1 else 1.0
        return tensor + noise * scale

    return add_noise


def _identity(tensor: torch.Tensor, hook: HookPoint) -> torch.Tensor:
    return tensor


def _edit_checks(model: nn.Module, site: AttentionSite, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Noise at each hook must move the output. The reference run has an identity hook at the same
    point, so both runs take the same code path and a discarded edit shows as exactly zero change."""
    rows = []
    for offset, (role, name) in enumerate(sorted(site.hooks.items())):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _hooks(model, [(name, _identity)]):
                base = _model_output(model, model(*args, **kwargs)).detach()
            with _hooks(model, [(name, _noise_hook(1000 + offset))]):
                edited = _model_output(model, model(*args, **kwargs)).detach()
        change = (edited.double() - base.double()).nan_to_num(0.0).abs().max().item()
        scale = base.double().nan_to_num(0.0).abs().max().item()
        detail = f"noise at {name} moved the output by up to {change:.2e} (output scale {scale:.2e})"
        said = [str(w.message) for w in caught if "hook" in str(w.message)]
        if said:  # e.g. TransformerLens's bridge announcing that it discards the edit
            detail += f"; the model warned: {said[0]}"
        rows.append({"layer": site.layer, "site": site.module, "check": f"edit_{role}", "passed": change > 0, "detail": detail})
    return rows
