"""Direct logit attribution: each component's direct contribution to the logit of the right token.

In a pre-norm model the final residual stream is a sum of writes:

    embed        the token embedding (and any additive extras: token types), `blocks.0.hook_resid_pre`
                 minus the position embedding
    pos_embed    the learned position embedding (models that add one as it is; where the embeddings are
                 normalised together, an encoder's embedding LayerNorm, `embed` holds them all)
    L{l}H{h}     head h of layer l: z @ W_O[h] (`hook_result`), without b_O
    MLP{l}       layer l's MLP output, its b_out included (`hook_mlp_out`), as TransformerLens counts it
    bias         the attention output biases b_O of every layer (no head owns them)

The logit of token t at a position is ln_final(resid) . W_U[:, t] + b_U[t]. The final norm divides by a
per-position scale that depends on the whole stream; here it is **frozen** at its value in the clean run
(`ln_final.hook_scale`), which makes ln_final linear: ((x - mean x) / scale) * w + b (RMSNorm: no
centring, no b; no norm: scale 1). So component c contributes (centred(c) / scale) . (w * W_U[:, t]),
and the components sum *exactly* to the logit minus the readout's constant ln_final.b . W_U[:, t] + b_U[t],
reported as the `readout_bias` row: all rows together sum to the clean logit. This is what
TransformerLens's `cache.logit_attrs` computes on a full residual decomposition, component for component.
Frozen means: the number says what c adds to the logit *given* the clean run's scale; removing c would
also change the scale (and every later component), which this does not measure (`interp.Run` effects do).

What the logit is (the *target*), per prompt:

- default: the behaviour's scored next-token predictions (`Behaviour.target_weights`: the default
  next-token loss scores the repeated copies of repeated prompts, else every position); query q's logit
  of token q + 1, averaged over them with the behaviour's weights;
- `answer=`: the logit of `answer` (one token per prompt, or one for all) at each prompt's last real token;
  with `incorrect=` the logit difference answer - incorrect there.

The model reads the prompts as given (a masked-LM behaviour's masking is not applied; it has no default
target, so pass `answer=`). Only pre-norm models with a plain unembedding qualify: post-norm blocks
normalise the stream between writers, so it is no sum of components there (refused, as `interp.paths`).

On a model hooked by intercepting its attention (a user's own module, `interp.load(module)`), which has no
blocks to read, the rows are each head's write z_h @ W_O[h] (hook_z through the output projection the probe
found), `bias` (the output projections' biases), `rest` (everything else in the final residual stream: the
embeddings, MLPs and any other writer, which the toolkit cannot tell apart there) and `readout_bias`, through
the final norm and unembedding that `interp.intercepted.layout` finds (a pre-norm model is assumed, as above).

Computed per batch from one forward with only the hooks needed (memory independent of the number of
prompts); per-prompt values kept, a 95% bootstrap CI over prompts (`interp.stats.bootstrap`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, Union

import pandas as pd
import torch
from torch import nn

import interp.distributed as distributed
from interp.behaviour import BehaviourLike
from interp.data import PromptSet
from interp.errors import BadInput
from interp.hooks import attention_sites, hooked
from interp.intercepted import Norm, head_writes, layout, norm_input, output_projection
from interp.launch import Device, DType
from interp.modelinfo import user_class, vocab_size
from interp.paths import check_graph_model
from interp.run import Run, as_run
from interp.stats import bootstrap

AnswerLike = Union[int, Sequence[int], torch.Tensor, None]
UNIT = "logit"
FROZEN_SCALE = ("ln_final's scale frozen at its clean-run value (per prompt and position), so the rows sum exactly to the "
                "clean logit; the readout_bias row is ln_final.b . W_U[:, t] + b_U[t]")
_CENTRES = {"LN": True, "RMS": False, None: False}  # cfg.normalization_type -> whether ln_final centres


@dataclass(frozen=True)
class LogitAttribution:
    """Per-prompt direct contributions: `values[:, i]` is component `labels[i]`'s, in logits; `logit` the clean
    logit (or logit difference) read off the model's own output, so `values.sum(1)` equals it."""

    labels: tuple[str, ...]  # "embed", "pos_embed", "L0H0", ..., "MLP0", ..., "bias", "readout_bias" ("rest": intercepted)
    kinds: tuple[str, ...]  # "embed", "pos_embed", "head", "mlp", "bias", "readout_bias", "rest"
    layers: tuple[int | None, ...]
    heads: tuple[int | None, ...]
    values: torch.Tensor  # (prompt, component) float64
    logit: torch.Tensor  # (prompt,) float64
    target: str  # what the logit is, in words
    seed: int

    def frame(self) -> pd.DataFrame:
        """One row per component: mean over prompts, its 95% bootstrap CI, `share` of the residual stream's
        total (the rows but readout_bias), n_prompts, unit; `attrs` say what the target and the frozen scale are."""
        mean, low, high = bootstrap(self.values, seed=self.seed, label="direct_logit_attribution")
        stream = float(mean[torch.tensor([k != "readout_bias" for k in self.kinds])].sum())
        frame = pd.DataFrame({
            "component": list(self.labels), "kind": list(self.kinds),
            "layer": pd.array(list(self.layers), dtype="Int64"), "head": pd.array(list(self.heads), dtype="Int64"),
            "mean": mean.tolist(), "ci_low": low.tolist(), "ci_high": high.tolist(),
            "share": [float("nan") if k == "readout_bias" or stream == 0 else float(m) / stream
                      for k, m in zip(self.kinds, mean.tolist())],
            "n_prompts": len(self.values), "unit": UNIT})
        frame.attrs.update(frozen_scale=FROZEN_SCALE, target=self.target, logit=float(self.logit.mean()))
        return frame


def direct_logit_attribution(model: nn.Module | Run, prompts: PromptSet | None = None, *, answer: AnswerLike = None,
                             incorrect: AnswerLike = None, behaviour: BehaviourLike = None, batch_size: int | None = None,
                             seed: int | None = None, device: Device = None, dtype: DType = None) -> pd.DataFrame:
    """Each component's direct contribution to the right token's logit, per prompt, with CIs (see the module).

    `model`: a Run, or a model with its prompts and the Run's options. Default target: the behaviour's
    scored next-token predictions; `answer` (and `incorrect`): a token (pair) at the last real position.
    Columns: component, kind, layer, head, mean, ci_low, ci_high, share, n_prompts, unit ("logit");
    `attrs["frozen_scale"]` says the final norm's scale is frozen from the clean run (so the rows sum to the
    clean logit, `attrs["logit"]`). Per-prompt values: `logit_attributions`."""
    run = as_run(model, prompts, where="direct_logit_attribution", behaviour=behaviour, batch_size=batch_size,
                 seed=seed, device=device, dtype=dtype)
    return logit_attributions(run, answer=answer, incorrect=incorrect).frame()


def logit_attributions(run: Run, *, answer: AnswerLike = None, incorrect: AnswerLike = None) -> LogitAttribution:
    """`direct_logit_attribution`'s per-prompt values on a Run (memoised in it by target)."""
    model: Any = run.model  # a HookedGPT-like model, checked next
    _check_model(model)
    n, d_vocab = len(run.prompts), int(model.cfg.d_vocab) if _has_blocks(model) else int(vocab_size(model) or 0)
    answers = _tokens(answer, n, d_vocab, "answer")
    wrong = _tokens(incorrect, n, d_vocab, "incorrect")
    if wrong is not None and answers is None:
        raise BadInput("direct_logit_attribution: incorrect= needs answer= (the logit difference answer - incorrect).")
    if answers is None and run.behaviour.target_weights is None:
        raise BadInput(f"direct_logit_attribution: the behaviour {run.behaviour.name!r} scores no next-token predictions, "
                       "so there is no right token by default; pass answer= (one token id per prompt).")
    key = ("direct_logit_attribution", _key(answers), _key(wrong))
    return run.cached(key, lambda: _attribute(run, answers, wrong))


def _has_blocks(model: Any) -> bool:
    """A HookedGPT-like model (blocks with split inputs), read through its own weights and hooks."""
    blocks = getattr(model, "blocks", None)
    return blocks is not None and all(hasattr(block, "hook_q_input") for block in blocks)


def _check_model(model: Any) -> None:
    if not _has_blocks(model) and hasattr(model, "hook_dict"):
        _intercepted_readout(model)
        return
    check_graph_model(model, "direct logit attribution")
    cfg = model.cfg
    if getattr(cfg, "lm_head", "unembed") != "unembed" or not hasattr(model, "unembed"):
        raise BadInput(f"direct logit attribution needs logits = ln_final(resid) @ W_U + b_U; this "
                       f"{user_class(model).__name__} has lm_head={getattr(cfg, 'lm_head', None)!r}. Use a model with a plain "
                       "unembedding (cfg.lm_head='unembed').")
    if cfg.normalization_type not in _CENTRES:
        raise BadInput(f"direct logit attribution: final norm {cfg.normalization_type!r}; expected one of {list(_CENTRES)}.")


def _tokens(value: AnswerLike, n: int, d_vocab: int, name: str) -> torch.Tensor | None:
    """(prompt,) long token ids from an int (every prompt) or one per prompt; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadInput(f"direct_logit_attribution: {name}={value!r}; expected a token id or one per prompt.")
    tokens = torch.as_tensor(value)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise BadInput(f"direct_logit_attribution: {name} must be integer token ids, got dtype {tokens.dtype}.")
    tokens = tokens.long().expand(n) if tokens.ndim == 0 else tokens.long()
    if tokens.shape != (n,):
        raise BadInput(f"direct_logit_attribution: {name} has shape {tuple(tokens.shape)}; expected ({n},), one token "
                       "id per prompt (or a single id for all).")
    bad = ((tokens < 0) | (tokens >= d_vocab)).nonzero().flatten()
    if len(bad):
        raise BadInput(f"direct_logit_attribution: {name}[{int(bad[0])}] = {int(tokens[bad[0]])} is outside the "
                       f"vocabulary [0, {d_vocab}).")
    return tokens


def _key(tokens: torch.Tensor | None) -> tuple[int, ...] | None:
    return None if tokens is None else tuple(tokens.tolist())


@dataclass(frozen=True)
class _Layout:
    """The components of one model, in row order, and which optional writers (position table, MLPs) it has."""

    labels: tuple[str, ...]
    kinds: tuple[str, ...]
    layers: tuple[int | None, ...]
    heads: tuple[int | None, ...]
    has_pos: bool
    has_mlp: bool
    n_layers: int


def _layout(model: Any) -> _Layout:
    if not _has_blocks(model):
        rows_: list[tuple[str, str, int | None, int | None]] = [("rest", "rest", None, None)]
        for site in attention_sites(model):
            rows_ += [(site.label(head), "head", site.layer, head) for head in range(site.n_heads)]
        rows_ += [("bias", "bias", None, None), ("readout_bias", "readout_bias", None, None)]
        labels_, kinds_, layers_, heads_ = zip(*rows_)
        return _Layout(labels_, kinds_, layers_, heads_, False, False, len(attention_sites(model)))
    cfg = model.cfg
    # the position embedding is its own row only where it is added to the stream as it is (not normalised with
    # the token embedding, as an encoder's embedding LayerNorm does)
    has_pos = hasattr(model, "hook_pos_embed") and not getattr(cfg, "embed_norm", False)
    rows: list[tuple[str, str, int | None, int | None]] = [("embed", "embed", None, None)]
    rows += [("pos_embed", "pos_embed", None, None)] * has_pos
    for layer, block in enumerate(model.blocks):
        rows += [(f"L{layer}H{head}", "head", layer, head) for head in range(block.cfg.n_heads)]
        rows += [] if block.cfg.attn_only else [(f"MLP{layer}", "mlp", layer, None)]
    rows += [("bias", "bias", None, None), ("readout_bias", "readout_bias", None, None)]
    labels, kinds, layers, heads = zip(*rows)
    return _Layout(labels, kinds, layers, heads, has_pos, not cfg.attn_only, cfg.n_layers)


def _attribute(run: Run, answers: torch.Tensor | None, wrong: torch.Tensor | None) -> LogitAttribution:
    model: Any = run.model
    layout = _layout(model)
    values, logits = [], []
    for indices, batch in distributed.shard(run.prompts, run.batch_size).batches(run.batch_size):
        rows = torch.as_tensor(list(indices), dtype=torch.long)
        targets, weights = _targets(run, batch, None if answers is None else answers[rows],
                                    None if wrong is None else wrong[rows])
        compute = _batch if _has_blocks(model) else _batch_intercepted
        part, logit = compute(model, layout, batch, targets, weights)
        values.append(part.cpu())
        logits.append(logit.cpu())
    empty = torch.zeros(0, len(layout.labels), dtype=torch.float64)
    local = (torch.cat(values), torch.cat(logits)) if values else (empty, empty[:, 0])
    if answers is None:
        scored = run.behaviour.describe(run.prompts)
        target = f"logit of the next token, averaged over the predictions the behaviour scores ({scored})"
    else:
        target = "logit of answer" + (" minus logit of incorrect" if wrong is not None else "") + " at the last real token"
    return LogitAttribution(layout.labels, layout.kinds, layout.layers, layout.heads,
                            distributed.gather_prompts(local[0]), distributed.gather_prompts(local[1]), target, run.seed)


def _targets(run: Run, batch: PromptSet, answers: torch.Tensor | None, wrong: torch.Tensor | None
             ) -> tuple[tuple[torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """((right, wrong) token per (batch, pos), weights (batch, pos)): which logit each position reads, and how much
    it counts in the prompt's value (rows sum to one)."""
    n, n_pos = batch.tokens.shape
    if answers is None:
        target_weights = run.behaviour.target_weights
        assert target_weights is not None  # logit_attributions refuses a behaviour without them
        weights = torch.zeros(n, n_pos, dtype=torch.float64)
        weights[:, :-1] = target_weights(batch).double()  # query q predicts token q + 1
        right = torch.zeros_like(batch.tokens)
        right[:, :-1] = batch.tokens[:, 1:]
        return (right, None), weights
    real = batch.real_mask()
    last = n_pos - 1 - real.flip(-1).long().argmax(-1)  # (batch,) each prompt's last real position
    weights = torch.zeros(n, n_pos, dtype=torch.float64)
    weights[torch.arange(n), last] = 1.0
    right = answers[:, None].expand(n, n_pos)  # (batch, pos): the same token read at every position
    return (right, None if wrong is None else wrong[:, None].expand(n, n_pos)), weights


def _read(model: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, pos, d_model) the readout direction of each position's token, w * W_U[:, t], and (batch, pos) the
    readout's constant ln_final.b . W_U[:, t] + b_U[t], float64."""
    W_U, b_U = model.W_U.double(), model.b_U.double()
    tokens = tokens.to(W_U.device)
    gain = getattr(model.ln_final, "w", None)
    bias = getattr(model.ln_final, "b", None)
    columns = W_U.T[tokens]  # (batch, pos, d_model)
    constant = b_U[tokens] + (0.0 if bias is None else columns @ bias.double())  # (batch, pos)
    return (columns if gain is None else columns * gain.double()), constant


@torch.no_grad()
def _batch(model: Any, layout: _Layout, batch: PromptSet, targets: tuple[torch.Tensor, torch.Tensor | None],
           weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch's (batch, component) contributions and (batch,) clean logits, from one forward."""
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        acts[hook.name] = act.detach()

    names = ["blocks.0.hook_resid_pre"] + ["hook_pos_embed"] * layout.has_pos
    names += [f"blocks.{layer}.attn.hook_z" for layer in range(layout.n_layers)]
    names += [f"blocks.{layer}.hook_mlp_out" for layer in range(layout.n_layers)] if layout.has_mlp else []
    has_scale = hasattr(model.ln_final, "hook_scale")
    names += ["ln_final.hook_scale"] * has_scale
    device = next(model.parameters()).device
    with hooked(model, [(name, keep) for name in names]):
        output = model(batch.tokens.to(device), **{k: v.to(device) for k, v in batch.model_kwargs().items()})
    direction, constant = _read(model, targets[0])
    logit = output.gather(-1, targets[0].to(device)[..., None])[..., 0].double()  # (batch, pos)
    if targets[1] is not None:
        wrong_direction, wrong_constant = _read(model, targets[1])
        direction, constant = direction - wrong_direction, constant - wrong_constant
        logit = logit - output.gather(-1, targets[1].to(device)[..., None])[..., 0].double()
    weights = weights.to(device)
    if _CENTRES[model.cfg.normalization_type]:
        direction = direction - direction.mean(-1, keepdim=True)  # centring x is centring the direction instead
    scale = acts["ln_final.hook_scale"].double() if has_scale else torch.ones_like(weights)[..., None]
    reader = direction * (weights[..., None] / scale)  # (batch, pos, d_model): d logit / d component write
    return _contributions(model, layout, acts, reader, (constant * weights).sum(-1)), (logit * weights).sum(-1)


def _contributions(model: Any, layout: _Layout, acts: dict[str, torch.Tensor], reader: torch.Tensor,
                   readout: torch.Tensor) -> torch.Tensor:
    """(batch, component) each component's write dotted with the reader, summed over positions, in row order."""
    def dot(write: torch.Tensor) -> torch.Tensor:  # (batch, pos, d_model) -> (batch,)
        return (write.double() * reader).sum((1, 2))

    pos = acts["hook_pos_embed"] if layout.has_pos else None
    columns = [dot(acts["blocks.0.hook_resid_pre"] - (0 if pos is None else pos))]
    columns += [] if pos is None else [dot(pos)]
    bias = torch.zeros(reader.shape[-1], dtype=torch.float64, device=reader.device)
    for layer, block in enumerate(model.blocks):
        z = acts[f"blocks.{layer}.attn.hook_z"].double()  # (batch, pos, head, d_head)
        read_z = torch.einsum("bqm,hdm->bqhd", reader, block.attn.W_O.double())  # the reader seen through each W_O
        columns += list((z * read_z).sum((1, 3)).unbind(-1))  # (batch,) per head
        bias = bias + block.attn.b_O.double()
        if layout.has_mlp:
            columns.append(dot(acts[f"blocks.{layer}.hook_mlp_out"]))
    columns += [reader.sum(1) @ bias, readout]
    return torch.stack(columns, -1)  # (batch, component)


# --------------------------------------------------------------------------- models hooked by interception


@dataclass(frozen=True)
class _Readout:
    """An intercepted model's logits: unembedding (d_model, d_vocab), its bias, the final norm (None: none)."""

    W_U: torch.Tensor
    b_U: torch.Tensor | None
    norm: Norm | None


def _intercepted_readout(model: nn.Module) -> _Readout:
    """The readout of an intercepted model, after checking that each head's write and the final norm are visible."""
    what_works = ("What works on it: head ablations (interp.Run), attention patterns and head claims; "
                  "a nanoGPT-layout model converts to a HookedGPT (interp.load('ckpt.pt')), where everything works.")
    for site in attention_sites(model):
        if "z" not in site.hooks or output_projection(model, site) is None:
            raise BadInput(f"direct logit attribution per head needs each attention's output projection (a Linear taking "
                           f"the merged heads); the attention at {site.module!r} of {user_class(model).__name__} has none "
                           f"visible, so its heads' writes cannot be split. {what_works}")
    found = layout(model)
    if found.post_norm:
        raise BadInput(f"direct logit attribution needs a pre-norm model; an attention of {user_class(model).__name__} reads "
                       f"{found.post_norm[0]}, so the final stream is no sum of the heads' writes. {what_works}")
    if found.final_unknown:
        raise BadInput(f"direct logit attribution: {user_class(model).__name__}'s unembedding reads the output of "
                       f"{found.final_unknown}, neither a LayerNorm nor an RMSNorm whose output the toolkit can reproduce, "
                       f"so it cannot be made linear (its scale frozen) and read back to the heads. {what_works}")
    readout = model.get_submodule(found.readout)
    assert isinstance(readout, nn.Linear)  # readout_module finds only nn.Linear
    bias = readout.bias
    return _Readout(readout.weight.t(), bias if isinstance(bias, torch.Tensor) else None, found.final_norm)


def _read_intercepted(model: nn.Module, readout: _Readout, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_read` for an intercepted model: (batch, pos, d_model) readout directions, (batch, pos) constants, float64."""
    W_U = readout.W_U.double()
    tokens = tokens.to(W_U.device)
    gain, bias = readout.norm.affine(model) if readout.norm is not None else (None, None)
    columns = W_U.T[tokens]  # (batch, pos, d_model)
    constant = (0.0 if readout.b_U is None else readout.b_U.double()[tokens]) + (
        0.0 if bias is None else columns @ bias.double())
    constant = constant if isinstance(constant, torch.Tensor) else torch.zeros(tokens.shape, dtype=torch.float64)
    return (columns if gain is None else columns * gain.double()), constant


@torch.no_grad()
def _batch_intercepted(model: Any, layout_: _Layout, batch: PromptSet, targets: tuple[torch.Tensor, torch.Tensor | None],
                       weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_batch` on an intercepted model: per-head writes from hook_z, the rest from the final residual stream."""
    from interp.modelinfo import output_logits

    readout, sites = _intercepted_readout(model), attention_sites(model)
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        acts[hook.name] = act.detach()

    device = next(model.parameters()).device
    # the final residual stream: the final norm's input, or the unembedding's where it reads the stream itself
    stream = _readout_input(model) if readout.norm is None else norm_input(model, readout.norm)
    with hooked(model, [(site.hooks["z"], keep) for site in sites]), stream as resid:
        output = output_logits(model(batch.tokens.to(device), **{k: v.to(device) for k, v in batch.model_kwargs().items()}),
                               model)
    final = resid["x"]
    direction, constant = _read_intercepted(model, readout, targets[0])
    logit = output.gather(-1, targets[0].to(device)[..., None])[..., 0].double()  # (batch, pos)
    if targets[1] is not None:
        wrong_direction, wrong_constant = _read_intercepted(model, readout, targets[1])
        direction, constant = direction - wrong_direction, constant - wrong_constant
        logit = logit - output.gather(-1, targets[1].to(device)[..., None])[..., 0].double()
    weights = weights.to(device)
    scale = torch.ones_like(weights)[..., None] if readout.norm is None else readout.norm.scale(final)
    if readout.norm is not None and readout.norm.centres:
        direction = direction - direction.mean(-1, keepdim=True)
    reader = direction * (weights[..., None] / scale)  # (batch, pos, d_model): d logit / d component write
    heads = [torch.einsum("bphm,bpm->bh", head_writes(model, site, acts[site.hooks["z"]]), reader) for site in sites]
    bias = sum((_out_bias(model, site, reader.shape[-1]) for site in sites), torch.zeros(reader.shape[-1], dtype=torch.float64))
    bias_row = reader.sum(1) @ bias.to(reader.device)
    rest = (final.double() * reader).sum((1, 2)) - torch.cat(heads, -1).sum(-1) - bias_row
    values = torch.cat([rest[:, None], *heads, bias_row[:, None], (constant * weights).sum(-1)[:, None]], -1)
    return values, (logit * weights).sum(-1)


def _out_bias(model: nn.Module, site: Any, d_model: int) -> torch.Tensor:
    """(d_model,) the output projection's bias (zeros where it has none)."""
    bias = getattr(output_projection(model, site), "bias", None)
    return bias.detach().double().cpu() if isinstance(bias, torch.Tensor) else torch.zeros(d_model, dtype=torch.float64)


@contextlib.contextmanager
def _readout_input(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    kept: dict[str, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple[Any, ...]) -> None:
        kept["x"] = args[0].detach()

    handle = model.get_submodule(layout(model).readout).register_forward_pre_hook(keep)
    try:
        yield kept
    finally:
        handle.remove()


__all__ = ["FROZEN_SCALE", "LogitAttribution", "direct_logit_attribution", "logit_attributions"]
