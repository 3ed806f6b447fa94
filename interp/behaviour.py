"""Behaviour: what causal evidence measures, as one named, typed choice.

Necessity, sufficiency, faithfulness (`interp.analyses.claims`) and importance, joint ablation,
compensation and pruning (`interp.analyses.redundancy`) all ask how much an intervention hurts a
*behaviour*. A `Behaviour` says which one, and every report states it by name:

  next_token_loss    causal LMs: next-token cross-entropy (nats) per prompt, at the predictions
                     the prompts make predictable (the repeated copies of `repeated_tokens`
                     prompts, else every real position); reads the logits
  next_token_margin  the same predictions' logit margin: minus the correct token's logit over the
                     mean logit; linear in the logits, so effects add up where the loss saturates
  masked_lm_loss     models with a trained masked-LM head: about 15% of each prompt's real,
                     non-special tokens are replaced by the mask token (chosen from the prompt's
                     own tokens, so the same prompt is masked the same way in any batch), and the
                     cross-entropy of the original tokens there is the value; reads the logits
  embedding_change   sentence encoders (what MiniLM is for): the mean-pooled final hidden state
                     over real positions, as cosine distance to the clean run's embedding
                     (0 = unchanged, 1 = orthogonal); reads the final hidden state, never the
                     (possibly random) LM head
  output_squared_error  models whose logits are numbers (compiled Tracr programs): the squared change of
                     the output columns from the clean run's, averaged over the positions after BOS
  a user callable    `behaviour(output, prompts) -> (prompt,)`, `output` the final logits
                     (`reads="logits"`, the default) or final hidden state (`reads="hidden"`)
  an activation      `reads="activation"` with `hook=` a hook name: `output` is that hook's
                     activation (the forward stops once it has fired), e.g. a head's pre-softmax
                     score at chosen (query, key) pairs (`interp.analyses.qk`); a `Run` measures
                     such a behaviour with one hooked forward per intervention

Every value is loss-like: larger = the behaviour is damaged more; an intervention's effect is
`value(intervened) - value(clean)`. A behaviour that `compares_to_clean` is 0 on the clean run.

Vocabulary: the *final hidden state* is what the unembedding reads, (batch, pos, d_model): for
our models `ln_final(resid)` after the last block (the "final residual stream"); analyses that
resume a forward from cached residuals stop there and never run the unembedding for such a
behaviour. `default_behaviour(model)` follows the model: a causal LM with an LM head gets the
next-token loss; an encoder (or any model whose head is random, `model.head_is_random`) gets
the embedding change; an encoder that declares a trained MLM head (`head_is_random = False`)
gets the masked-LM loss.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence, Union, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn

from interp.data import PromptSet, Repeats
from interp.errors import BadInput
from interp.hooks import attention_sites, check_hook_names, hooked
from interp.models.gpt import HookedGPT, masked_next_token_loss, next_token_targets

Reads = Literal["logits", "hidden", "activation"]
Positions = Literal["auto", "all", "repeats"]
BehaviourName = Literal["next-token", "masked-lm", "embedding"]  # the CLI's names
BEHAVIOUR_NAMES: tuple[str, ...] = get_args(BehaviourName)
READS: tuple[str, ...] = get_args(Reads)
MASK_RATE = 0.15  # fraction of real tokens masked for the masked-LM loss (Devlin et al. 2019)


class UndefinedOnPrompts(BadInput):
    """The prompts cannot define the behaviour (e.g. no repeated copy to predict, nothing to mask)."""


@dataclass(frozen=True)
class Behaviour:
    """One behaviour: its name, what it reads, whether it compares with the clean run, and how.

    `fn(output, prompts)` -> (prompt,), or `fn(output, prompts, clean)` when `compares_to_clean`
    (`clean` = `summarise(clean output, prompts)` of the same prompts). `target_weights(prompts)`
    -> (prompt, pos - 1) weights of next-token predictions (rows sum to one) lets an analysis fuse
    the unembedding with the cross-entropy; `model_prompts(prompts)` gives the prompts the model
    reads (the masked-LM loss masks tokens; the behaviour still sees the original prompts).
    """

    name: str  # "next_token_loss", "masked_lm_loss", "embedding_change", or the user's function name
    reads: Reads  # "logits" (batch, pos, d_vocab) or "hidden": the final hidden state (batch, pos, d_model)
    fn: Callable[..., torch.Tensor] = field(compare=False, repr=False)
    compares_to_clean: bool = False  # the value is a distance from the clean run's output (0 there)
    summarise: Callable[[torch.Tensor, PromptSet], torch.Tensor] | None = field(default=None, compare=False, repr=False)
    description: str = ""  # one line for reports' Methods sections
    unit: str = ""  # "nats", "cosine distance", ...
    target_weights: Callable[[PromptSet], torch.Tensor] | None = field(default=None, compare=False, repr=False)
    prepare: Callable[[PromptSet], PromptSet] | None = field(default=None, compare=False, repr=False)
    params: tuple = ()  # the parameters that distinguish two behaviours of one name, e.g. (("positions", "all"),)
    hook: str = ""  # reads="activation": the hook whose activation `fn` reads; "" for the other reads
    # reads the logits at each prompt's last real position only: an engine may unembed that position alone and
    # pass `fn` logits of shape (batch, 1, d_vocab) (on a 49k vocabulary the unembedding is a fifth of a forward)
    last_position: bool = False

    def __post_init__(self) -> None:
        if self.reads not in READS:
            raise BadInput(f"behaviour {self.name!r}: reads={self.reads!r}; expected one of {list(READS)}.")
        if (self.reads == "activation") != bool(self.hook):
            raise BadInput(f"behaviour {self.name!r}: reads={self.reads!r} with hook={self.hook!r}; a behaviour reads a "
                           "hook's activation exactly when reads='activation' and hook names it (e.g. "
                           "'blocks.1.attn.hook_attn_scores').")
        if self.compares_to_clean and self.summarise is None:
            raise BadInput(f"behaviour {self.name!r} compares to the clean run but has no summarise function; "
                           "pass summarise=lambda output, prompts: ... (what the clean run is compared by).")

    def __call__(self, output: torch.Tensor, prompts: PromptSet, clean: torch.Tensor | None = None) -> torch.Tensor:
        """Per-prompt value (prompt,) of the model's `output` on `prompts` (clean: the clean summary)."""
        if self.compares_to_clean:
            if clean is None:
                raise BadInput(f"behaviour {self.name!r} compares with the clean run; pass clean=behaviour.summarise(...).")
            return self.fn(output, prompts, clean)
        return self.fn(output, prompts)

    def model_prompts(self, prompts: PromptSet) -> PromptSet:
        """The prompts the model reads (identity unless the behaviour masks tokens)."""
        return prompts if self.prepare is None else self.prepare(prompts)

    def clean_summary(self, output: torch.Tensor, prompts: PromptSet) -> torch.Tensor | None:
        """What the clean run is kept as, for behaviours that compare with it; None otherwise."""
        # __post_init__ refuses compares_to_clean without summarise
        return self.summarise(output, prompts) if self.compares_to_clean and self.summarise is not None else None

    def describe(self, prompts: PromptSet | None = None) -> str:
        """The behaviour's short name, for these prompts where it depends on them (the next-token loss
        says which predictions it scores); `description` has the long form."""
        positions = dict(self.params).get("positions")
        if self.name == "next_token_loss" and prompts is not None and positions in get_args(Positions):
            return next_token_description(prompts, cast(Positions, positions))  # one of Positions, checked above
        return self.name

    def spec(self) -> dict[str, Any]:
        """Plain data for reports and JSON."""
        return {"name": self.name, "reads": self.reads, "compares_to_clean": self.compares_to_clean,
                "unit": self.unit, "description": self.description, **dict(self.params),
                **({"hook": self.hook} if self.hook else {})}


BehaviourLike = Union[Behaviour, str, Callable[..., torch.Tensor], None]


# ---------------------------------------------------------------------------------------------
# next-token loss


def next_token_mask(prompts: PromptSet, positions: Positions = "auto") -> torch.Tensor:
    """(prompt, pos - 1) bool over next-token predictions (query q predicts token q + 1) that are scored.

    "all": every prediction whose query and target are real tokens; "repeats": only those whose query
    is a repeated position (`prompts.repeats.query_mask`: the second and later copies of
    `interp.data.repeated_tokens` prompts, or right after a repeated n-gram for natural repeats,
    `Repeats(match_len=k)`), where an earlier occurrence makes the next token predictable; "auto":
    "repeats" when the prompts have a repeat structure (`prompts.repeats`), else "all".
    UndefinedOnPrompts when "repeats" leaves a prompt with nothing to score.
    """
    if positions not in get_args(Positions):
        raise BadInput(f"positions={positions!r}; expected one of {list(get_args(Positions))}.")
    n, n_pos = prompts.tokens.shape
    if n_pos < 2:
        raise UndefinedOnPrompts(f"the next-token loss needs prompts of at least 2 tokens; these have {n_pos}.")
    mask = next_token_targets(prompts.attention_mask, (n, n_pos))
    repeats = prompts.repeats
    if positions == "all" or (positions == "auto" and repeats is None):
        return mask
    if repeats is None:
        raise UndefinedOnPrompts(f"induction_loss needs prompts from interp.data.repeated_tokens (a repeat period) or "
                                 f"with natural repeats (`PromptSet(..., repeats=Repeats(match_len=k))`); got kind "
                                 f"{prompts.kind!r} without `prompts.repeats`. Use positions='all' for the loss at every "
                                 "position.")
    if repeats.start is not None and repeats.start > n_pos - 2:
        raise UndefinedOnPrompts(f"the prompts ({n_pos} tokens) have no repeated token to predict after position "
                                 f"{repeats.start + 1}.")
    mask = mask & repeats.query_mask(prompts.tokens, prompts.real_mask())[:, :-1]
    empty = (~mask.any(-1)).nonzero().flatten().tolist()
    if empty:
        raise UndefinedOnPrompts(f"prompts {prompts.row_numbers(empty[:5])} have no repeated position to score "
                                 f"({_repeat_words(repeats)}); drop them, or use positions='all' for every position.")
    return mask


def _repeat_words(repeats: Repeats) -> str:
    """Where `repeats` says the scored predictions are: 'on the repeated copies', 'after a repeated 2-gram', ..."""
    after = f"after a repeated {repeats.match_len or 1}-gram"
    if repeats.period is None:
        return after
    return "on the repeated copies" + ("" if repeats.match_len is None else f", {after}")


def next_token_description(prompts: PromptSet, positions: Positions = "auto") -> str:
    """'next-token loss on every position', '... on the repeated copies' or '... after a repeated k-gram'
    for these prompts (the predictions `next_token_mask` scores)."""
    repeats = prompts.repeats
    if positions == "all" or (positions == "auto" and repeats is None):
        return "next-token loss on every position"
    return f"next-token loss {'on the repeated copies' if repeats is None else _repeat_words(repeats)}"


def next_token_weights(prompts: PromptSet, positions: Positions = "auto") -> torch.Tensor:
    """(prompt, pos - 1) float weights of the scored predictions, each row summing to one (or all zero)."""
    weights = next_token_mask(prompts, positions).float()
    return weights / weights.sum(-1, keepdim=True).clamp(min=1.0)


def check_next_token_targets(prompts: PromptSet) -> None:
    """A BadInput naming the prompts with fewer than 2 real tokens: their next-token loss has no target
    (it would be NaN, or a silent 0 under padding)."""
    short = (prompts.real_lengths() < 2).nonzero().flatten()
    if len(short):
        raise BadInput(
            f"prompts {prompts.row_numbers(short[:5])} have fewer than 2 real tokens, so the next-token loss has no "
            "target there; drop them or use longer prompts."
        )


_WHERE = {"auto": "at the repeated positions when the prompts have a repeat structure, else at every real position",
          "all": "at every real position", "repeats": "at the repeated positions (`Repeats.query_mask`)"}


def next_token_loss(positions: Positions = "auto") -> Behaviour:
    """Next-token cross-entropy (nats) per prompt, averaged over the predictions `next_token_mask` scores."""
    if positions not in get_args(Positions):
        raise BadInput(f"positions={positions!r}; expected one of {list(get_args(Positions))}.")

    def loss(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
        check_next_token_targets(prompts)
        return masked_next_token_loss(logits, prompts.tokens, next_token_mask(prompts, positions))

    def weights(prompts: PromptSet) -> torch.Tensor:
        check_next_token_targets(prompts)
        return next_token_weights(prompts, positions)

    where = _WHERE[positions]
    return Behaviour("next_token_loss", "logits", loss, description=f"next-token cross-entropy (nats) {where}",
                     unit="nats", target_weights=weights,
                     params=(("positions", positions),))


def next_token_margin(positions: Positions = "auto") -> Behaviour:
    """Minus the correct next token's logit over the mean logit, per prompt, averaged over the predictions
    `next_token_mask` scores (logits; larger = worse, like a loss). Unlike the loss it is linear in the logits:
    with the final norm's scale held fixed, the logits are linear in the heads' writes, so ablation effects on
    the margin add up exactly, and any interaction left in the loss comes from the softmax or the norm."""
    if positions not in get_args(Positions):
        raise BadInput(f"positions={positions!r}; expected one of {list(get_args(Positions))}.")

    def margin(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
        check_next_token_targets(prompts)
        scored = logits[:, :-1].float()  # (prompt, pos - 1, vocab): query q predicts token q + 1
        correct = scored.gather(-1, prompts.tokens[:, 1:, None].to(logits.device))[..., 0]  # (prompt, pos - 1)
        weights = next_token_weights(prompts, positions).to(logits.device)  # rows sum to one over the scored
        return -((correct - scored.mean(-1)) * weights).sum(-1)

    where = _WHERE[positions]
    return Behaviour("next_token_margin", "logits", margin, unit="logits", params=(("positions", positions),),
                     description=f"minus the correct next token's logit over the mean logit {where}")


# ---------------------------------------------------------------------------------------------
# masked-LM loss


def mlm_positions(prompts: PromptSet, special_ids: tuple[int, ...] = (), rate: float = MASK_RATE) -> torch.Tensor:
    """(prompt, pos) bool: the positions the masked-LM loss masks and scores.

    About `rate` of each prompt's real tokens that are not special ids (at least one), drawn from a
    generator seeded by the prompt's own tokens: a prompt is masked the same way in any batch.
    """
    tokens = prompts.tokens
    real = torch.ones_like(tokens, dtype=torch.bool) if prompts.attention_mask is None else prompts.attention_mask.bool()
    candidates = real & ~torch.isin(tokens, torch.tensor(special_ids, dtype=tokens.dtype))
    chosen = torch.zeros_like(candidates)
    weights = torch.arange(1, tokens.shape[1] + 1, dtype=torch.long)
    for row in range(len(tokens)):
        where = candidates[row].nonzero().flatten()
        if len(where) == 0:
            raise UndefinedOnPrompts(f"prompt {row} has no real, non-special token to mask for the masked-LM loss; drop it.")
        seed = int((tokens[row].long() * weights).sum()) % (2 ** 31)
        order = torch.randperm(len(where), generator=torch.Generator().manual_seed(seed))
        chosen[row, where[order[: max(1, round(rate * len(where)))]]] = True
    return chosen


def _mask_token(model: nn.Module | None, mask_token_id: int | None) -> tuple[int, tuple[int, ...]]:
    tokenizer = getattr(model, "tokenizer", None)
    if mask_token_id is None:
        mask_token_id = getattr(tokenizer, "mask_token_id", None)
    if mask_token_id is None:
        raise BadInput("masked_lm_loss needs the mask token id: the model has no tokenizer with mask_token_id; "
                       "pass masked_lm_loss(mask_token_id=...) (BERT's [MASK] is 103).")
    special = tuple(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ()))
    return int(mask_token_id), special


def masked_lm_loss(model: nn.Module | None = None, *, mask_token_id: int | None = None, rate: float = MASK_RATE) -> Behaviour:
    """Masked-LM cross-entropy (nats) per prompt: about `rate` of the real tokens masked (`mlm_positions`),
    scored on recovering them. For models with a trained MLM head; the mask id comes from
    `model.tokenizer.mask_token_id` unless given."""
    if not 0 < rate < 1:
        raise BadInput(f"rate={rate}; the masked fraction must be in (0, 1), e.g. 0.15.")
    mask_id, special = _mask_token(model, mask_token_id)

    def prepare(prompts: PromptSet) -> PromptSet:
        masked = prompts.tokens.masked_fill(mlm_positions(prompts, special, rate), mask_id)
        return dataclasses.replace(prompts, tokens=masked)

    def loss(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
        logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        scored = mlm_positions(prompts, special, rate).to(logits.device)  # (batch, pos)
        tokens = prompts.tokens.to(logits.device)
        per = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none").view(tokens.shape)
        weights = scored.to(per.dtype)
        return (per * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)

    return Behaviour("masked_lm_loss", "logits", loss, description=f"masked-LM cross-entropy (nats) of the original "
                     f"tokens at {rate:.0%} of the real tokens, replaced by the mask token {mask_id}", unit="nats",
                     prepare=prepare, params=(("mask_token_id", mask_id), ("rate", rate)))


# ---------------------------------------------------------------------------------------------
# embedding change


def mean_pool(hidden: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
    """(batch, pos, d_model) -> (batch, d_model): the mean over real (non-padded) positions."""
    if prompts.attention_mask is None:
        return hidden.mean(1)
    real = prompts.attention_mask.to(hidden.device, hidden.dtype)[..., None]  # (batch, pos, 1)
    return (hidden * real).sum(1) / real.sum(1).clamp(min=1.0)


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 - cos(a, b) per row, computed as |a/|a| - b/|b||^2 / 2: exactly 0 for equal rows, accurate near 0."""
    a = a / a.norm(dim=-1, keepdim=True).clamp(min=1e-30)
    b = b / b.norm(dim=-1, keepdim=True).clamp(min=1e-30)
    return 0.5 * (a - b).pow(2).sum(-1)


def embedding_change() -> Behaviour:
    """Cosine distance between the mean-pooled final hidden state and the clean run's (0 = unchanged)."""

    def distance(hidden: torch.Tensor, prompts: PromptSet, clean: torch.Tensor) -> torch.Tensor:
        return cosine_distance(mean_pool(hidden, prompts), clean.to(hidden.device, hidden.dtype))

    return Behaviour("embedding_change", "hidden", distance, compares_to_clean=True, summarise=mean_pool,
                     description="cosine distance of the sentence embedding (final hidden state mean-pooled over real "
                                 "positions) from the clean run's", unit="cosine distance")


# ---------------------------------------------------------------------------------------------
# logit difference (indirect-object identification)


def last_real_positions(prompts: PromptSet) -> torch.Tensor:
    """(prompt,) the index of each prompt's last real (unpadded) position, whichever side the padding is."""
    real = prompts.real_mask()  # (prompt, pos)
    return (real.long() * torch.arange(real.shape[1])).argmax(-1)


def last_real_logits(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
    """(prompt, d_vocab) the logits (or any (prompt, pos, ...) tensor) at each prompt's last real position."""
    last = last_real_positions(prompts).to(logits.device)
    return logits[torch.arange(logits.shape[0], device=logits.device), last]


def prompt_ids(prompts: PromptSet, key: str, who: str) -> torch.Tensor:
    """(prompt,) the token ids `prompts.meta[key]` holds for these prompts (`rows` index the set they came from)."""
    ids = prompts.meta.get(key)
    if ids is None:
        raise UndefinedOnPrompts(f"{who} needs meta[{key!r}], one token id per prompt (interp.data.ioi_prompts makes "
                                 "them); these prompts have none.")
    ids = torch.as_tensor(ids, dtype=torch.long)
    rows = torch.arange(len(prompts)) if prompts.rows is None else prompts.rows
    if ids.ndim != 1 or int(rows.max()) >= len(ids):
        raise UndefinedOnPrompts(f"{who}: meta[{key!r}] holds {tuple(ids.shape)} ids but the prompts reach row "
                                 f"{int(rows.max())}; expected one id per prompt of the set they came from.")
    return ids[rows]


def logit_difference(answer: str = "answer", incorrect: str = "incorrect") -> Behaviour:
    """logit(incorrect) - logit(answer) at each prompt's last real position: the logit difference of Wang et
    al. (2022), negated so that it is loss-like as every behaviour (larger = the behaviour damaged; on the clean
    run of a model that gets the task right it is negative, and -value is the logit difference reported in the
    IOI literature). The ids are `prompts.meta[answer]` and `prompts.meta[incorrect]` (`interp.data.ioi_prompts`)."""

    def value(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
        # (prompt, d_vocab); an engine may have unembedded the last real position alone (`last_position`)
        final = logits[:, 0] if logits.shape[1] == 1 else last_real_logits(logits, prompts)
        right = prompt_ids(prompts, answer, "logit_difference").to(final.device)
        wrong = prompt_ids(prompts, incorrect, "logit_difference").to(final.device)
        return (final.gather(-1, wrong[:, None]) - final.gather(-1, right[:, None]))[:, 0]

    return Behaviour("logit_difference", "logits", value, unit="logit",
                     description=f"minus the logit difference, logit(meta['{incorrect}']) - logit(meta['{answer}']), at "
                                 "each prompt's last real position (Wang et al. 2022's metric, negated: loss-like)",
                     params=(("answer", answer), ("incorrect", incorrect)), last_position=True)
# numeric outputs (compiled programs: interp.models.convert.tracr)


def output_squared_error(columns: Sequence[int]) -> Behaviour:
    """The squared change of the output columns `columns` of the logits from the clean run's, summed over the
    columns and averaged over every real position after the first (BOS), per prompt (0 on the clean run).
    For models whose logits are numbers, not next-token scores: a compiled Tracr program's output dimension
    (its `metadata["output_columns"]`), where the clean output is the program's exact answer."""
    picked = [int(c) for c in columns]
    if not picked or len(set(picked)) != len(picked) or min(picked) < 0:
        raise BadInput(f"output_squared_error: columns={list(columns)!r}; expected distinct logit columns >= 0, e.g. "
                       "model.metadata['output_columns'].")

    def summarise(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
        if max(picked) >= logits.shape[-1]:
            raise BadInput(f"output_squared_error: column {max(picked)} is beyond the model's {logits.shape[-1]} logits.")
        return logits[..., picked].double()  # (prompt, pos, column)

    def error(logits: torch.Tensor, prompts: PromptSet, clean: torch.Tensor) -> torch.Tensor:
        squared = (summarise(logits, prompts) - clean.to(logits.device)).pow(2).sum(-1)  # (prompt, pos)
        real = prompts.real_mask().to(logits.device).clone()  # (prompt, pos)
        real[:, 0] = False  # BOS: the program has no output there
        return (squared * real).sum(-1) / real.sum(-1).clamp(min=1)

    return Behaviour("output_squared_error", "logits", error, compares_to_clean=True, summarise=summarise,
                     description=f"squared change of the output (logit columns {picked}) from the clean run's, "
                                 "averaged over the positions after the first", unit="squared output",
                     params=(("columns", tuple(picked)),))


# ---------------------------------------------------------------------------------------------
# choosing a behaviour


def custom_behaviour(fn: Callable[[torch.Tensor, PromptSet], torch.Tensor], *, reads: Reads = "logits",
                     name: str | None = None, description: str = "") -> Behaviour:
    """A user's `fn(output, prompts) -> (prompt,)` (larger = behaviour damaged) as a Behaviour."""
    if not callable(fn):
        raise BadInput(f"a behaviour must be callable as fn(output, prompts) -> (prompt,); got {type(fn).__name__}.")
    name = name or str(getattr(fn, "__name__", "custom"))
    return Behaviour(name, reads, fn, description=description or f"user behaviour {name} on the final {reads}")


_ALIASES = {"next-token": "next-token", "next_token": "next-token", "next_token_loss": "next-token",
            "masked-lm": "masked-lm", "masked_lm": "masked-lm", "masked_lm_loss": "masked-lm", "mlm": "masked-lm",
            "embedding": "embedding", "embedding_change": "embedding", "embedding-change": "embedding"}


def as_behaviour(behaviour: BehaviourLike, model: nn.Module | None = None, *, positions: Positions = "auto") -> Behaviour:
    """A Behaviour from a Behaviour, a name (`BEHAVIOUR_NAMES`), a callable, or None (the model's default).
    `positions`: which predictions a next-token loss chosen by name or by default scores."""
    if behaviour is None:
        if model is None:
            raise BadInput("no behaviour and no model to choose one by; pass behaviour= or the model.")
        return default_behaviour(model, positions=positions)
    if isinstance(behaviour, Behaviour):
        return behaviour
    if isinstance(behaviour, str):
        name = _ALIASES.get(behaviour.strip().lower())
        if name is None:
            raise BadInput(f"unknown behaviour {behaviour!r}; expected one of {list(BEHAVIOUR_NAMES)} "
                           "or a callable behaviour(output, prompts) -> (prompt,).")
        if name == "next-token":
            return next_token_loss(positions)
        return masked_lm_loss(model) if name == "masked-lm" else embedding_change()
    if callable(behaviour):
        return custom_behaviour(behaviour)
    raise BadInput(f"behaviour={behaviour!r} is neither a name {list(BEHAVIOUR_NAMES)}, a Behaviour nor a callable.")


def _causal(model: nn.Module) -> bool | None:
    cfg_causal = getattr(getattr(model, "cfg", None), "causal", None)
    if isinstance(cfg_causal, bool):
        return cfg_causal
    sites = attention_sites(model)
    return sites[0].causal if sites else None


def default_behaviour(model: nn.Module, *, positions: Positions = "auto") -> Behaviour:
    """The behaviour the model is for: next-token loss for a causal LM with a real head (scoring
    `positions`, see `next_token_mask`); masked-LM loss for an encoder that declares a trained MLM
    head (`model.head_is_random is False`); else (an encoder, or a random head) the change of the
    sentence embedding."""
    head_random = getattr(model, "head_is_random", None)
    if getattr(getattr(model, "cfg", None), "lm_head", "unembed") is None:
        return embedding_change()  # no head at all (a bare encoder, e.g. MiniLM converted natively): no logits to score
    if _causal(model) is False:
        return masked_lm_loss(model) if head_random is False else embedding_change()
    return embedding_change() if head_random else next_token_loss(positions)


# ---------------------------------------------------------------------------------------------
# running a model to the output a behaviour reads


def final_hidden_hook(model: nn.Module) -> str:
    """Hook name carrying the final hidden state on a model that is not a HookedGPT.

    Encoders through the bridge (BERT-family, post-norm): the last block's output, since their
    `ln_final` belongs to the (random) MLM head; others: `ln_final.hook_out` where present.
    """
    names = getattr(model, "hook_dict", {})
    sites = attention_sites(model)
    last = f"blocks.{len(sites) - 1}.hook_resid_post" if sites else None
    if _causal(model) is not False and "ln_final.hook_out" in names:
        return "ln_final.hook_out"
    if last is not None and last in names:
        return last
    raise BadInput(f"{type(model).__name__} exposes no hook with the final hidden state (ln_final.hook_out or "
                   f"{last}); use a behaviour that reads the logits (reads='logits').")


def final_output(model: nn.Module, prompts: PromptSet, reads: Reads, hook: str = "") -> torch.Tensor:
    """The model's final logits or final hidden state on `prompts` (hooks already attached stay live);
    for reads="activation", the activation of `hook` (`activation_output`).

    HookedGPT-like models stop before the unembedding for "hidden": `ln_final(resid)` after the
    last block."""
    device = next(model.parameters()).device
    tokens = prompts.tokens.to(device)
    kwargs = {k: v.to(device) for k, v in prompts.model_kwargs().items()}
    if reads == "activation":
        return activation_output(model, tokens, kwargs, hook)
    if reads == "logits":
        from interp.modelinfo import output_logits

        return output_logits(model(tokens, **kwargs), model)  # .logits, {'logits': ...}, --logits-key (SDPA interception)
    if isinstance(model, HookedGPT):
        return model.ln_final(model(tokens, stop_at_layer=len(model.blocks), **kwargs))
    name, kept = final_hidden_hook(model), {}

    def keep(activation: torch.Tensor, hook=None) -> None:
        kept["hidden"] = activation

    with hooked(model, [(name, keep)]):
        model(tokens, **kwargs)
    return kept["hidden"]


class _Captured(Exception):
    """Raised by an activation read's hook once it holds its tensor: the rest of the forward is not needed."""


def activation_output(model: nn.Module, tokens: torch.Tensor, kwargs: dict[str, torch.Tensor], hook: str) -> torch.Tensor:
    """The activation of `hook` in a forward on `tokens` (the forward stops there; hooks already attached stay
    live and run first). A hook the forward never reaches is a BadInput."""
    kept: dict[str, torch.Tensor] = {}

    def keep(activation: torch.Tensor, hook=None) -> None:
        kept["activation"] = activation.detach().clone()
        raise _Captured

    try:
        check_hook_names(model, [hook])
    except KeyError as error:  # an unknown hook, with close matches
        raise BadInput(f"behaviour: {error.args[0]}") from None
    try:
        with hooked(model, [(hook, keep)]):
            model(tokens, **kwargs)
    except _Captured:
        pass
    if "activation" not in kept:
        raise BadInput(f"the behaviour reads hook {hook!r}, which this forward of {type(model).__name__} never reached; "
                       "name a hook the forward runs through (model.hook_dict lists them).")
    return kept["activation"]


def check_values(values: Any, n: int, what: str, behaviour: Behaviour) -> torch.Tensor:
    """The behaviour's per-prompt values, or a clear BadInput (wrong shape, NaN or inf)."""
    if not isinstance(values, torch.Tensor) or values.shape != (n,):
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise BadInput(f"behaviour {behaviour.name!r} must return one loss per prompt, shape ({n},); got {shape}.")
    if not torch.isfinite(values).all():
        bad = (~torch.isfinite(values)).nonzero().flatten()[:5].tolist()
        raise BadInput(f"the behaviour {behaviour.name!r} is NaN or inf ({what}) for prompts at batch rows {bad}; "
                         "check the model's weights (interp.verify_hooks), the prompts and the behaviour.")
    return values


@torch.no_grad()
def clean_summaries(model: nn.Module, prompts: PromptSet, behaviour: Behaviour, *, batch_size: int = 32) -> torch.Tensor | None:
    """(prompt, ...) what the clean run is compared by (e.g. the pooled embeddings); None when not needed."""
    summarise = behaviour.summarise
    if not behaviour.compares_to_clean or summarise is None:  # Behaviour has summarise when it compares
        return None
    parts = []
    for batch in prompts.batches(batch_size):
        output = final_output(model, behaviour.model_prompts(batch), behaviour.reads, behaviour.hook)
        parts.append(summarise(output, batch).detach().cpu())
    return torch.cat(parts)


@torch.no_grad()
def measure(model: nn.Module, prompts: PromptSet, behaviour: Behaviour, *,
            intervene: Callable[[PromptSet], Any] | None = None, clean: torch.Tensor | None = None,
            batch_size: int = 32, what: str = "") -> torch.Tensor:
    """Per-prompt behaviour (prompt,) float64 under an intervention: `intervene(batch)` -> a context
    manager (hooks) per batch, given the prompts the model reads. `clean`: `clean_summaries(...)`,
    computed here when the behaviour needs it and none is given."""
    import contextlib

    if behaviour.compares_to_clean and clean is None:
        clean = clean_summaries(model, prompts, behaviour, batch_size=batch_size)
    out, start = [], 0
    for batch in prompts.batches(batch_size):
        run = behaviour.model_prompts(batch)
        with contextlib.nullcontext() if intervene is None else intervene(run):
            output = final_output(model, run, behaviour.reads, behaviour.hook)
        reference = None if clean is None else clean[start:start + len(batch)]
        values = check_values(behaviour(output, batch, reference), len(batch), what or "a run", behaviour)
        out.append(values.detach().double().cpu())
        start += len(batch)
    return torch.cat(out)



def __getattr__(name: str) -> Any:
    from interp.removed import removed

    raise removed(__name__, name)  # a name removed in 0.x says what replaces it
