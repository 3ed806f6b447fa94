"""Pattern substitution: a head attends where we say, its post-softmax pattern replaced for a forward.

- `substitute_pattern(model, layer, head, pattern)`: replace one head's pattern (a head type's ideal
  pattern by name, "uniform", any tensor or callable, or the head's own weights permuted among the
  allowed keys: the faithfulness control "does it matter *where* the head looks?"); a context
  manager whose hooks are removed in `finally`. `permuted_pattern` and `uniform_pattern` name two uses.
- `PatternSubstitution(head, pattern, permute)`: the same substitution as an intervention of `interp.Run`,
  its pattern a name, a tensor, or a `PatternSource` computed per batch.
- `pattern_names`, `on_real_positions`, `permute_among_allowed`, `check_pattern_rows`: the names and checks.

The ideal patterns are the head types' (`interp.head_types`: `HeadType.ideal_pattern`, uniform over the
type's target keys), named by the type ("previous_token", "first_token", "induction", a registered type's
name) or its ideal name ("self"); "uniform" is no head type: uniform over the keys the model allows.
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Union, cast

import einops
import torch
from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput, BadType
from interp.head_types import BUILTIN_HEAD_TYPES, HeadType, TargetBatch, ideal_head_type, ideal_pattern_names
from interp.heads import head_label, parse_head
from interp.hooks import AttentionSite, hooked
from interp.interventions.common import _is_source, _sites_by_layer, check_heads, tensor_digest

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint

PatternSpec = Union[torch.Tensor, Callable[[int], torch.Tensor], str, None]

_UNIFORM = "uniform"  # the one pattern name that is no head type: uniform over the keys the model allows
ROW_SUM_TOLERANCE = 1e-4  # a substituted pattern's rows must sum to one within this


def pattern_names() -> list[str]:
    """The names a substituted pattern may be given by: "uniform", then each registered head type's ideal
    pattern (`interp.head_types.ideal_pattern_names`: the type's name, and its ideal name, e.g. "self")."""
    return [_UNIFORM, *ideal_pattern_names()]


def _check_pattern_name(name: str) -> None:
    if name not in pattern_names():
        raise ValueError(f"pattern={name!r} is not supported; expected one of {pattern_names()} ('uniform': over the "
                         "keys the model allows; the others: a head type's ideal pattern, interp.head_types), a tensor, "
                         "a callable n_pos -> (query, key), or None.")


def _reads_tokens(head_type: HeadType, causal: bool) -> bool:
    """Whether the type's ideal pattern depends on the tokens (as induction's does): it differs between a prompt
    of one repeated token and one of distinct tokens."""
    same, distinct = (TargetBatch.from_prompts(PromptSet(tokens), causal=causal)
                      for tokens in (torch.zeros(1, 6, dtype=torch.long), torch.arange(6)[None]))
    return not torch.equal(head_type.ideal_pattern(same), head_type.ideal_pattern(distinct))


def _check_ideal_fits(head_type: HeadType, name: str, causal: bool, prompts: PromptSet | None) -> None:
    """A head type's ideal pattern can be laid on this model's forward: it needs no bidirectional model
    where the model is causal, and no tokens where none were given."""
    if head_type.needs == "bidirectional" and causal:
        raise BadInput(f"pattern={name!r}: {head_type.name} needs a bidirectional model (no query of a causal model "
                       "sees a later key), and this model's attention is causal.")
    if prompts is None and _reads_tokens(head_type, causal):
        raise BadInput(f"pattern={name!r}: {head_type.name}'s ideal pattern depends on the tokens, which the "
                       "substitution's hooks do not see; pass prompts= (the PromptSet of the forward), or use "
                       "interp.PatternSubstitution in an interp.Run, which passes them.")


def _target_batch(allowed: torch.Tensor, prompts: PromptSet | None) -> TargetBatch:
    """The batch a head type's ideal pattern is built on inside the hook. allowed: (batch, query, key), the keys
    the model lets each query attend; real tokens are the keys some query may attend (padding excluded). Tokens
    and repeats come from `prompts` (checked to be the forward's shape); without them, position only."""
    real = allowed.any(dim=-2)  # (batch, key)
    if prompts is None:
        tokens = torch.zeros(real.shape, dtype=torch.long, device=allowed.device)  # unread: see _reads_tokens
    elif tuple(prompts.tokens.shape) != tuple(real.shape):
        raise BadInput(f"prompts= has {tuple(prompts.tokens.shape)} (batch, pos) tokens, but the forward's attention "
                       f"pattern is {tuple(allowed.shape)} (batch, query, key); pass the PromptSet the model reads "
                       "(with its BOS, if the behaviour adds one).")
    else:
        tokens = prompts.tokens.to(allowed.device)
    return TargetBatch(tokens, real, allowed & real[:, :, None], real.long().argmax(-1),
                       None if prompts is None else prompts.repeats)


def on_real_positions(make: Callable[[int], torch.Tensor], allowed: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """An n-position pattern `make(n)` laid on each prompt's real (unpadded) positions.

    allowed: (batch, query, key), True where a key may be attended; own: the head's own
    (batch, query, key) pattern. A prompt with m real tokens gets `make(m)` on its real queries
    and keys, so "previous token" and "first token" count from the first real token whatever the
    padding side; padded queries keep the head's own row (no real position reads them). Without
    padding this is `make(n)` for every prompt.
    """
    batch, n_query, n_key = allowed.shape
    real = allowed.any(dim=-2)  # (batch, key): keys some query may attend, i.e. real tokens
    if bool(real.all()):
        return torch.as_tensor(make(n_query))
    out = own.clone()  # (batch, query, key); clone: `own` may be the caller's cached pattern
    for row in range(batch):
        positions = real[row].nonzero().flatten()  # (m,)
        if len(positions) == 0:
            continue
        block = torch.as_tensor(make(len(positions))).to(out)  # (m, m)
        if block.shape != (len(positions), len(positions)):
            raise ValueError(f"a pattern for {len(positions)} real positions has shape {tuple(block.shape)}; "
                             f"expected ({len(positions)}, {len(positions)}).")
        laid = torch.zeros(len(positions), n_key, dtype=out.dtype, device=out.device)
        laid[:, positions] = block
        out[row, positions] = laid
    return out


def _allowed_keys(original: torch.Tensor, causal: bool | None) -> torch.Tensor:
    """(batch, query, key) True where a key may be attended: causally allowed and not padding.

    Padding is read off the head's own pattern: a key that no head and no query gives any
    weight to was masked (masked keys get exactly 0 after softmax of -inf).
    """
    batch, _, n_query, n_key = original.shape
    allowed = torch.ones(batch, n_query, n_key, dtype=torch.bool, device=original.device)
    if causal:
        allowed &= torch.ones(n_query, n_key, dtype=torch.bool, device=original.device).tril()
    padded = original.sum(dim=(1, 2)) == 0  # (batch, key)
    allowed &= ~einops.rearrange(padded, "batch key -> batch 1 key")
    return allowed


def permute_among_allowed(pattern: torch.Tensor, allowed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shuffle each row's weights among its allowed keys: (batch, query, key) -> same shape, same row sums."""
    n_key = pattern.shape[-1]
    position = torch.arange(n_key, dtype=torch.float32, device=pattern.device).expand(pattern.shape)
    inf = torch.tensor(float("inf"), device=pattern.device)
    in_order = torch.where(allowed, position, inf).argsort(dim=-1)  # allowed keys first, ascending
    noise = torch.rand(pattern.shape, generator=generator).to(pattern.device)
    shuffled = torch.where(allowed, noise, inf).argsort(dim=-1)  # allowed keys first, random order
    # positions past the allowed count pair disallowed keys with disallowed keys: zeros stay zeros
    return torch.zeros_like(pattern).scatter(-1, in_order, pattern.gather(-1, shuffled))


def check_pattern_rows(pattern: torch.Tensor, what: str = "pattern") -> None:
    """Every row sums to one (or is all zero, a padded query); raise naming the worst row otherwise."""
    if not torch.isfinite(pattern).all():
        raise ValueError(f"{what} contains NaN or inf.")
    if (pattern < 0).any():
        raise ValueError(f"{what} has negative weights (min {pattern.min().item():.3g}); attention weights are >= 0.")
    sums = pattern.sum(-1)
    bad = ((sums - 1).abs() > ROW_SUM_TOLERANCE) & (sums != 0)
    if bad.any():
        worst = (sums - 1).abs().masked_fill(~bad, -1).argmax()
        row = tuple(int(i) for i in torch.unravel_index(worst, sums.shape))
        raise ValueError(
            f"{what}: row {row} sums to {sums.flatten()[worst].item():.6f}, not 1; "
            "attention rows must sum to one over the keys (normalise with p / p.sum(-1, keepdim=True))."
        )


def _check_pattern_spec(pattern: PatternSpec, label: str) -> None:
    """A pattern argument of a kind substitute_pattern takes; a tensor's rows must sum to one."""
    if isinstance(pattern, str):
        _check_pattern_name(pattern)
    elif not (pattern is None or isinstance(pattern, torch.Tensor) or callable(pattern)):
        raise BadType(
            f"pattern must be a tensor, a callable n_pos -> (query, key), one of {pattern_names()} or None, "
            f"got {type(pattern).__name__}."
        )
    if isinstance(pattern, torch.Tensor):
        if pattern.ndim not in (2, 3):
            raise ValueError(f"pattern has shape {tuple(pattern.shape)}; expected (query, key) or (batch, query, key).")
        check_pattern_rows(pattern, f"pattern for {label}")


@dataclass(kw_only=True)
class _PatternSubstitution:
    """The hooks of one `substitute_pattern`: `read_mask` on the scores notes which keys the model
    allows, `replace` on the pattern puts the new pattern in the head's place."""

    site: AttentionSite
    head: int
    pattern: PatternSpec
    permute_keys: bool
    generator: torch.Generator
    prompts: PromptSet | None = None  # the forward's prompts: tokens and repeats for a head type's ideal pattern
    allowed: torch.Tensor | None = None  # (batch, query, key), from the scores of the current forward

    @property
    def label(self) -> str:
        return head_label((self.site.layer, self.head))

    def read_mask(self, scores: torch.Tensor, hook: HookPoint | None = None) -> None:  # (batch, head, query, key)
        # masked keys are -inf in the scores; a near-one-hot head's real keys can be exactly 0 after softmax
        if bool(scores.isneginf().any()) or not self.site.causal:
            self.allowed = ~scores[:, self.head].isneginf()

    def replace(self, original: torch.Tensor, hook: HookPoint | None = None) -> torch.Tensor:  # (batch, head, query, key)
        allowed, self.allowed = self.allowed, None  # (batch, query, key)
        if allowed is None:  # no scores hook, or one carrying weights (some bridges): read it off the pattern
            allowed = _allowed_keys(original, self.site.causal)
        new = self._checked(self._target(original, allowed), original, allowed)  # (batch, query, key)
        if self.permute_keys:
            new = permute_among_allowed(new, allowed, self.generator)
        out = original.clone()  # clone: the caller's cache may hold `original`
        out[:, self.head] = new
        return out

    def _target(self, original: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The pattern asked for, before shape checks: (query, key) or (batch, query, key)."""
        pattern, own = self.pattern, original[:, self.head]  # own: (batch, query, key)
        if pattern is None:
            return own
        if isinstance(pattern, str) and pattern == _UNIFORM:
            return allowed.to(original.dtype) / allowed.sum(-1, keepdim=True).clamp(min=1)
        if isinstance(pattern, str):
            batch = _target_batch(allowed, self.prompts)
            ideal = ideal_head_type(pattern).ideal_pattern(batch).to(own)  # (batch, query, key)
            return torch.where(batch.real[:, :, None], ideal, own)  # padded queries keep their own rows
        if isinstance(pattern, torch.Tensor):
            return pattern

        def make(m: int) -> torch.Tensor:
            made = torch.as_tensor(pattern(m))
            check_pattern_rows(made, f"pattern({m}) for {self.label}")
            return made

        return on_real_positions(make, allowed, own)

    def _checked(self, new: torch.Tensor, original: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """`new` on the head's device, dtype and (batch, query, key) shape; refused where it does not fit,
        or puts weight on keys a causal model cannot attend."""
        batch, _, n_query, n_key = original.shape
        new = new.to(device=original.device, dtype=original.dtype)
        if new.shape[-2:] != (n_query, n_key) or (new.ndim == 3 and new.shape[0] != batch):
            raise ValueError(
                f"substituted pattern for {self.label} has shape {tuple(new.shape)}, but the "
                f"head's pattern is (batch={batch}, query={n_query}, key={n_key}); pass a (query, key) tensor "
                "for this sequence length, or a callable n_pos -> (query, key)."
            )
        new = new.expand(batch, n_query, n_key)
        if self.site.causal and bool((new.masked_fill(allowed, 0) > 1e-6).any()) and self.pattern is not None:
            raise ValueError(
                f"substituted pattern for {self.label} puts weight on future (or padded) keys, "
                "which this causal model cannot attend to; use a lower-triangular pattern (e.g. a head type's ideal pattern "
                "on a causal batch: get_head_type(name).ideal_pattern(TargetBatch.from_prompts(prompts)))."
            )
        return new


@contextlib.contextmanager
def substitute_pattern(
    model: nn.Module,
    layer: int,
    head: int,
    pattern: PatternSpec = None,
    *,
    permute_keys: bool = False,
    seed: int = 0,
    prompts: PromptSet | None = None,
) -> Iterator[nn.Module]:
    """Replace one head's post-softmax pattern at `hook_pattern` for the duration of the block.

    `pattern`: a (query, key) tensor (every prompt), a (batch, query, key) tensor, a callable
    `n_pos -> (query, key)`, a name (`pattern_names()`: a head type's ideal pattern, laid on each
    prompt's real positions, padded queries keeping their own rows; "uniform": uniform over the keys the
    model actually allows, padding excluded), or None for the head's own pattern (useful with
    `permute_keys`). `permute_keys=True` shuffles each row's weights among the allowed keys:
    same weights, random places. Rows must sum to one; a causal model refuses weight on future keys.
    `prompts`: the PromptSet of the forward, needed by a head type whose ideal pattern reads the tokens
    (induction, duplicate_token); the hooks see only the pattern.
    """
    check_heads(model, [(layer, head)])
    site = _sites_by_layer(model)[layer]
    _check_pattern_spec(pattern, head_label((layer, head)))
    if isinstance(pattern, str) and pattern != _UNIFORM:
        _check_ideal_fits(ideal_head_type(pattern), pattern, bool(site.causal), prompts)
    substitution = _PatternSubstitution(site=site, head=head, pattern=pattern, permute_keys=permute_keys,
                                        generator=torch.Generator().manual_seed(seed), prompts=prompts)
    hooks: list[tuple[str, Callable[..., Any]]] = [(site.hook("pattern"), substitution.replace)]
    if "attn_scores" in site.hooks:
        hooks.insert(0, (site.hook("attn_scores"), substitution.read_mask))
    with hooked(model, hooks):
        yield model


class PatternSource(Protocol):
    """A pattern computed per batch of an `interp.Run` (e.g. a head type's ideal pattern), named by `spec()`.

    `spec()` names the source in reports; `interp.Run` memoises a substitution's effect under it *and* a digest
    of what the source returns on the run's prompts (`PatternSubstitution.fingerprint`), so two sources with an
    equal spec() but different patterns never share a number."""

    def spec(self) -> dict[str, Any]: ...

    def __call__(self, run: Any, batch: PromptSet) -> PatternSpec: ...


def _pattern_digest(pattern: PatternSpec, batch: PromptSet) -> str:
    """What a PatternSource returned for one batch, as text: a tensor's digest, a name, or a callable's
    patterns at the lengths `substitute_pattern` asks of it on this batch (its real lengths and its width)."""
    if isinstance(pattern, torch.Tensor):
        return tensor_digest(pattern)
    if pattern is None or isinstance(pattern, str):
        return repr(pattern)
    lengths = {batch.n_pos}
    if batch.attention_mask is not None:
        lengths |= {int(n) for n in batch.attention_mask.sum(-1)}
    return "callable:" + ",".join(tensor_digest(torch.as_tensor(pattern(n))) for n in sorted(lengths) if n > 0)


@dataclass(frozen=True, eq=False)
class PatternSubstitution:
    """Replace one head's post-softmax pattern (`substitute_pattern`), as an intervention of `interp.Run`.

    `pattern`: "uniform" (over the keys the model allows) or a head type's ideal pattern by name
    (`pattern_names()`: "previous_token", "first_token", "self", "induction", a registered type's; built on
    each batch's tokens), a (query, key) or (batch, query, key) tensor (rows summing to one; named in `spec()`
    by its shape and a digest of its values), None (the head's own; with `permute=True` its weights shuffled
    among the allowed keys of each row), or a `PatternSource` computed per batch.
    """

    head: tuple[int, int]  # parsed into a Head
    pattern: str | torch.Tensor | PatternSource | None = "uniform"
    permute: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", parse_head(self.head))
        if isinstance(self.pattern, str) and self.pattern not in pattern_names():
            raise ValueError(f"pattern={self.pattern!r}: a name here must be one of {pattern_names()} ('uniform': over "
                             "the keys the model allows; the others: a head type's ideal pattern, interp.head_types); "
                             "pass None (the head's own, with permute=True), a tensor or a PatternSource for another "
                             "pattern.")
        if isinstance(self.pattern, torch.Tensor):
            _check_pattern_spec(self.pattern, self.label)
        elif not (self.pattern is None or isinstance(self.pattern, str) or _is_source(self.pattern)):
            raise BadType(f"PatternSubstitution pattern for {self.label} is of type {type(self.pattern).__name__}; expected one "
                          f"of {pattern_names()}, None, a (query, key) or (batch, query, key) tensor, or a "
                          "PatternSource (an object with spec() and __call__(run, batch) -> pattern). A plain callable "
                          "n_pos -> (query, key) works with substitute_pattern; give it a spec() to use it here.")
        if not isinstance(self.permute, bool):
            raise BadType(f"PatternSubstitution permute={self.permute!r} must be True or False.")

    def spec(self) -> dict[str, Any]:
        pattern: Any = self.pattern
        if isinstance(pattern, torch.Tensor):
            pattern = {"tensor": list(pattern.shape), "blake2b": tensor_digest(pattern)}
        elif pattern is not None and not isinstance(pattern, str):
            pattern = pattern.spec()
        return {"substitute": list(self.head), "pattern": pattern, "permute": self.permute}

    def fingerprint(self, run: Any) -> str | None:
        """With a PatternSource: a digest of the patterns it gives on the run's batches (part of `Run`'s memo key,
        so sources with equal spec() but different patterns are told apart); with a registered head type's name, the
        type itself (a type registered again under its name with replace=True is another pattern); None where spec()
        says it all."""
        if isinstance(self.pattern, str) and self.pattern != _UNIFORM:
            head_type = ideal_head_type(self.pattern)
            return None if head_type.name in BUILTIN_HEAD_TYPES else repr(head_type)
        if not _is_source(self.pattern):
            return None
        source = cast(PatternSource, self.pattern)
        digest = hashlib.blake2b(digest_size=16)
        for batch in run.prompts.batches(run.batch_size):
            model_batch = run.behaviour.model_prompts(batch)
            digest.update(_pattern_digest(source(run, model_batch), model_batch).encode())
        return digest.hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PatternSubstitution) and self.spec() == other.spec() and (
            self.pattern is other.pattern or not _is_source(self.pattern) or self.pattern == other.pattern)

    def __hash__(self) -> int:
        return hash(repr(sorted(self.spec().items())))

    @property
    def label(self) -> str:
        return head_label(self.head)

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        given = self.pattern
        pattern = cast(PatternSource, given)(run, batch) if _is_source(given) else cast(PatternSpec, given)
        layer, head = self.head
        return substitute_pattern(run.model, layer, head, pattern, permute_keys=self.permute, seed=run.seed,
                                  prompts=batch)


def permuted_pattern(model: nn.Module, layer: int, head: int, *, seed: int = 0) -> contextlib.AbstractContextManager[nn.Module]:
    """Context manager: the head keeps its own weights, shuffled among the allowed keys of each row."""
    return substitute_pattern(model, layer, head, None, permute_keys=True, seed=seed)


def uniform_pattern(model: nn.Module, layer: int, head: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Context manager: the head attends uniformly to every allowed key."""
    return substitute_pattern(model, layer, head, "uniform")
