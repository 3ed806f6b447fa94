"""The leakage audit's view of a model: tokens -> (batch, seq, features), and what the model declares.

`ModelAdapter` runs any supported model (a hooked model, a Hugging Face model, a plain
`nn.Module`, a callable) on token batches; `declaration` says who declares a model
bidirectional. Above `types` (it imports nothing of the audit), below `methods`.
"""
from __future__ import annotations

import copy
import inspect
from typing import Any, Callable, Iterator

import torch
from torch import nn

import interp.distributed as distributed
from interp.errors import BadType, InterpError, ModelError
from interp.modelinfo import context_length, model_config, vocab_size
from interp.models.config import EncoderConfig
from interp.models.zoo import ZooConfig

# ---------------------------------------------------------------------------------------------
# The model, seen as tokens -> (batch, seq, features)
# ---------------------------------------------------------------------------------------------

def _config(model: Any) -> Any:
    return model_config(model)


infer_vocab_size = vocab_size  # the one helper lives in interp.modelinfo
infer_n_ctx = context_length


# Hugging Face architectures that are encoders unless their config says `is_decoder=True` (a BERT used as a
# decoder is causal and audited as one); only these, with `is_decoder` False, declare a model bidirectional.
HF_ENCODER_TYPES = frozenset({
    "albert", "bert", "camembert", "convbert", "deberta", "deberta-v2", "distilbert", "electra", "ernie", "esm",
    "flaubert", "funnel", "ibert", "layoutlm", "longformer", "luke", "mobilebert", "modernbert", "mpnet", "mra",
    "nezha", "nystromformer", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "squeezebert",
    "xlm", "xlm-roberta", "xlm-roberta-xl", "xmod", "yoso", "big_bird", "megatron-bert", "canine", "data2vec-text",
})


OWN_CONFIGS = (EncoderConfig, ZooConfig)  # the toolkit's own configs: their `causal` field is a declaration


def _hf_config(model: Any) -> Any:
    """The Hugging Face config of `model` (itself, or wrapped by a TransformerBridge): one with `model_type`."""
    for holder in (model, getattr(model, "original_model", None), getattr(model, "model", None)):
        config = getattr(holder, "config", None)
        if config is not None and isinstance(getattr(config, "model_type", None), str):
            return config
    return None


def declaration(model: Any, bidirectional: bool | None = None) -> str | None:
    """Who declares `model` bidirectional (the reason, for the report), or None: a causal model is expected.

    Declarations are what the model *is*, never what a forward pass shows: the user's flag
    (`bidirectional=True`; `False` audits even an encoder as causal), our `HookedEncoder` and the
    audit's own zoo encoders (`causal = False` on `OWN_CONFIGS`), or a Hugging Face encoder architecture whose config
    has `is_decoder=False`. An attention call seen without a mask, an `is_causal=False` attribute
    or a `cfg.causal` on some other object is observation: reported (`observed_masking`), never an excuse.
    """
    if bidirectional is not None:
        if not isinstance(bidirectional, bool):
            raise BadType(f"bidirectional={bidirectional!r} must be True, False or None (None: read the model's declaration).")
        return "declared by the caller (bidirectional=True)" if bidirectional else None
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, OWN_CONFIGS) and cfg.causal is False:
        return f"declared by its config ({type(cfg).__name__}.causal = False: an encoder)"
    config = _hf_config(model)
    if config is not None and config.model_type in HF_ENCODER_TYPES and getattr(config, "is_decoder", False) is False:
        return f"declared by its Hugging Face config (model_type {config.model_type!r}, is_decoder=False: an encoder)"
    return None


def declared_bidirectional(model: Any, bidirectional: bool | None = None) -> bool:
    """Whether the model declares itself an encoder (`declaration`)."""
    return declaration(model, bidirectional) is not None


def observed_masking(model: Any) -> str | None:
    """What the attention sites saw of masking (evidence for the report, never a verdict), or None."""
    if not (isinstance(model, nn.Module) and hasattr(model, "hook_dict")):
        return None
    from interp.hooks import attention_sites

    try:
        flags = [site.causal for site in attention_sites(model)]
    except (TypeError, AttributeError, InterpError):
        return None
    if not flags:
        return None
    unmasked = sum(flag is False for flag in flags)
    if unmasked == 0:
        return None
    return (f"{unmasked} of {len(flags)} attention call(s) were seen without a causal mask (no is_causal, no "
            "triangular mask); observed, not declared: the model is audited as causal")


def user_forward(model: Callable) -> Callable:
    """The forward the user wrote: through our hooking wrappers (`hook_sdpa`, `hook_attention`) to their class's own."""
    original = getattr(type(model), "_interp_original_class", None)
    if isinstance(model, nn.Module) and original is not None:
        return original.forward
    return model.forward if isinstance(model, nn.Module) else model


def _accepts_attention_mask(model: Callable) -> bool:
    """Whether the model the user gave takes an `attention_mask` (its own forward's signature, read through our
    wrappers; a `**kwargs` forward of a Hugging Face model counts)."""
    try:
        parameters = inspect.signature(user_forward(model)).parameters
    except (TypeError, ValueError):
        return False
    if "attention_mask" in parameters:
        return True
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return var_kw and _hf_config(model) is not None


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


MEMO_BYTES = 256 * 2**20  # outputs larger than this are not kept (`ModelAdapter.remember`)
MEMO_TOTAL = 2**30  # nor any once the kept ones add up to this


class _Memo(dict):
    """Outputs kept by input (`ModelAdapter.remember`), shared by an adapter and its copies."""

    active = True
    size = 0

    def keep(self, key: tuple, out: torch.Tensor) -> None:
        size = out.numel() * out.element_size()
        if self.active and size <= MEMO_BYTES and self.size + size <= MEMO_TOTAL:
            self[key] = out
            self.size += size


def final_hidden_readable(model: Any) -> bool:
    """Whether the audit reads `model`'s final hidden state instead of its logits: an exact HookedGPT with our
    unembedding, whose head is position-wise by construction (`ln_final`, then a linear map per position), so
    the hidden state carries every dependence the logits can show at a fraction of the width (576 vs 49,152 on
    SmolLM2-135M)."""
    from interp.models.components import UNEMBED_CLASSES
    from interp.models.gpt import HookedGPT

    return type(model) is HookedGPT and type(getattr(model, "unembed", None)) in UNEMBED_CLASSES


class ModelAdapter:
    """Runs any supported model on token batches and returns float outputs (batch, seq, features).

    `max_rows` (None or 1) caps the rows per forward: 1 in the copy `one_per_forward` returns,
    used once the model is known to mix the examples of a batch.
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
        self.hidden = final_hidden_readable(model)  # compare the final hidden state, not the logits
        self.memo: _Memo | None = None  # outputs kept by input (`remember`), shared by copies
        params = list(self.module.parameters()) if self.module is not None else []
        self.device = params[0].device if params else torch.device("cpu")
        self.dtype = params[0].dtype if params else torch.float32

    def remember(self) -> "ModelAdapter":
        """Keep outputs by input from now on (this adapter and its copies), so a run made to measure the noise
        floor is not made again by the method that compares it (outputs up to MEMO_BYTES each, MEMO_TOTAL in all).
        A call that watches the forward (hooks, localisation) passes `fresh=True`; `forget` ends it."""
        if self.memo is None:
            self.memo = _Memo()
        return self

    def forget(self) -> None:
        """Let the kept outputs go and keep no more (this adapter and every copy sharing its memo)."""
        if self.memo is not None:
            self.memo.active = False
            self.memo.clear()

    def __call__(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 finite_where: torch.Tensor | None = None, check_finite: bool = True, fresh: bool = False) -> torch.Tensor:
        """Outputs (batch, seq, features) as float; NaN at checked positions raises a ValueError. `fresh`: run the
        forward even when its outputs are kept (`remember`): hooks watching it must see it run."""
        if self.max_rows is not None and tokens.shape[0] > self.max_rows:
            step = self.max_rows
            return torch.cat([
                self(tokens[i:i + step], None if attention_mask is None else attention_mask[i:i + step],
                     finite_where=None if finite_where is None else finite_where[i:i + step], check_finite=check_finite,
                     fresh=fresh)
                for i in range(0, tokens.shape[0], step)
            ])
        key = None if fresh else self._memo_key(tokens, attention_mask)
        if key is not None and self.memo is not None and key in self.memo:
            out = self.memo[key]
        else:
            out = self._outputs(tokens, attention_mask)
            if key is not None and self.memo is not None:
                self.memo.keep(key, out)
        if check_finite:
            self._check_finite(out, attention_mask, finite_where)
        return out

    def _memo_key(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple | None:
        if self.memo is None or not self.memo.active or torch.is_grad_enabled():
            return None
        mask = None if attention_mask is None else attention_mask.detach().cpu().long().numpy().tobytes()
        return (tokens.detach().cpu().long().numpy().tobytes(), tuple(tokens.shape), mask, self.ones_mask, self.max_rows)

    def _outputs(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """One forward's outputs (batch, seq, features): float32, or float64 from a float64 model, on the CPU."""
        tokens = tokens.to(self.device)
        if attention_mask is None and self.ones_mask:
            attention_mask = torch.ones_like(tokens)
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(self.device).long()}
        out = self._hidden(tokens, kwargs) if self.hidden else _first_tensor(self._run(tokens, kwargs))
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
        # comparisons run on the CPU, in float32 (float64 for a float64 model: its rounding is what it is audited for)
        return out.reshape(batch, n_pos, -1).to(torch.float64 if out.dtype == torch.float64 else torch.float32).cpu()

    @staticmethod
    def _check_finite(out: torch.Tensor, attention_mask: torch.Tensor | None, finite_where: torch.Tensor | None) -> None:
        """A ModelError when the outputs hold NaN or inf at the positions watched (`finite_where`, else all)."""
        watched = out if finite_where is None else out[finite_where.to(out.device).bool()]
        if torch.isfinite(watched).all():
            return
        cause = ("a fully masked attention row (every key padding) is the usual cause: fill it with zeros"
                 if attention_mask is not None and not bool(attention_mask.bool().all(-1).all()) else
                 "no position was padded, so the cause is inside the model (an overflow, a division by zero, "
                 "or NaN produced by its own code)")
        raise ModelError(
            f"the model returned NaN or inf for tokens of shape {tuple(out.shape[:2])}; the audit compares "
            f"outputs and cannot compare NaN. {cause}. Fix the model, or audit a smaller max_len."
        )

    def _hidden(self, tokens: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """The final hidden state (batch, seq, d_model) of a native HookedGPT: its last block, then `ln_final`."""
        model: Any = self.model
        try:
            return model.ln_final(model(tokens, stop_at_layer=model.cfg.n_layers, **kwargs))
        except (InterpError, ValueError):
            raise
        except Exception as error:
            raise ModelError(f"the model {self.name} raised {type(error).__name__} on tokens of shape "
                             f"{tuple(tokens.shape)}: {error}") from error

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

    def one_per_forward(self) -> "ModelAdapter":
        """A copy that runs one example per forward pass: for a model that mixes the examples of a
        batch, so that mixing cannot pass for a causal leak."""
        other = copy.copy(self)
        other.max_rows = 1
        return other

    def rows_per_forward(self, n_pos: int) -> int:
        rows = max(1, self.max_tokens // max(n_pos, 1))
        return rows if self.max_rows is None else min(rows, self.max_rows)

    def chunks(self, tokens: torch.Tensor, *, shard: bool = False, rows: int | None = None) -> Iterator[tuple[slice, torch.Tensor]]:
        """Outputs for consecutive row blocks of `tokens`, as few forward passes as memory allows (`rows` per
        forward when given). `shard`: in a process group, only this rank's blocks (every world-th); merge the results."""
        step = self.rows_per_forward(tokens.shape[1]) if rows is None else max(1, rows)
        for index, start in enumerate(range(0, tokens.shape[0], step)):
            if shard and not distributed.mine(index):
                continue
            block = slice(start, min(start + step, tokens.shape[0]))
            yield block, self(tokens[block])
