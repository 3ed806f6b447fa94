"""Pattern substitution: a head attends where we say, its post-softmax pattern replaced for a forward.

- `substitute_pattern(model, layer, head, pattern)`: replace one head's pattern (an ideal one
  from `ideal_pattern`, any tensor or callable, or the head's own weights permuted among the
  allowed keys: the faithfulness control "does it matter *where* the head looks?"); a context
  manager whose hooks are removed in `finally`. `permuted_pattern` and `uniform_pattern` name two uses.
- `PatternSubstitution(head, pattern, permute)`: the same substitution as an intervention of `interp.Run`,
  its pattern a name, a tensor, or a `PatternSource` computed per batch.
- `ideal_pattern`, `on_real_positions`, `permute_among_allowed`, `check_pattern_rows`: the patterns and checks.
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Protocol, Union, cast, get_args

import einops
import torch
from torch import nn

from interp.data import PromptSet
from interp.errors import BadType
from interp.heads import head_label, parse_head
from interp.hooks import AttentionSite, hooked
from interp.interventions.common import _check_choice, _is_source, _sites_by_layer, check_heads, tensor_digest

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint

IdealPattern = Literal["previous_token", "first_token", "self", "uniform"]
PatternSpec = Union[torch.Tensor, Callable[[int], torch.Tensor], str, None]

IDEAL_PATTERNS: tuple[str, ...] = get_args(IdealPattern)
ROW_SUM_TOLERANCE = 1e-4  # a substituted pattern's rows must sum to one within this


def ideal_pattern(kind: IdealPattern, n_pos: int, *, causal: bool = True) -> torch.Tensor:
    """An idealised (query, key) pattern whose rows sum to one.

    previous_token: all weight on query - 1 (query 0, which has no previous token: on itself);
    first_token: all on key 0; self: all on the query; uniform: equal on every allowed key.
    """
    _check_choice("kind", kind, IDEAL_PATTERNS)
    if n_pos < 1:
        raise ValueError(f"n_pos={n_pos} must be at least 1.")
    query = torch.arange(n_pos)
    pattern = torch.zeros(n_pos, n_pos)  # (query, key)
    if kind == "previous_token":
        pattern[query, (query - 1).clamp(min=0)] = 1.0
    elif kind == "first_token":
        pattern[:, 0] = 1.0
    elif kind == "self":
        pattern[query, query] = 1.0
    else:
        allowed = torch.ones(n_pos, n_pos).tril() if causal else torch.ones(n_pos, n_pos)
        pattern = allowed / allowed.sum(-1, keepdim=True)
    return pattern


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
        _check_choice("pattern", pattern, IDEAL_PATTERNS)
    elif not (pattern is None or isinstance(pattern, torch.Tensor) or callable(pattern)):
        raise BadType(
            f"pattern must be a tensor, a callable n_pos -> (query, key), one of {list(IDEAL_PATTERNS)} or None, "
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
        if isinstance(pattern, str) and pattern == "uniform":
            return allowed.to(original.dtype) / allowed.sum(-1, keepdim=True).clamp(min=1)
        if isinstance(pattern, str):
            name = cast(IdealPattern, pattern)  # substitute_pattern checked it against IDEAL_PATTERNS
            return on_real_positions(lambda m: ideal_pattern(name, m, causal=bool(self.site.causal)), allowed, own)
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
                "which this causal model cannot attend to; use a lower-triangular pattern (e.g. ideal_pattern(..., causal=True))."
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
) -> Iterator[nn.Module]:
    """Replace one head's post-softmax pattern at `hook_pattern` for the duration of the block.

    `pattern`: a (query, key) tensor (every prompt), a (batch, query, key) tensor, a callable
    `n_pos -> (query, key)`, a name for `ideal_pattern` ("uniform" is uniform over the keys the
    model actually allows, padding excluded), or None for the head's own pattern (useful with
    `permute_keys`). `permute_keys=True` shuffles each row's weights among the allowed keys:
    same weights, random places. Rows must sum to one; a causal model refuses weight on future keys.
    """
    check_heads(model, [(layer, head)])
    site = _sites_by_layer(model)[layer]
    _check_pattern_spec(pattern, head_label((layer, head)))
    substitution = _PatternSubstitution(site=site, head=head, pattern=pattern, permute_keys=permute_keys,
                                        generator=torch.Generator().manual_seed(seed))
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

    `pattern`: "uniform" (over the keys the model allows) or another `ideal_pattern` name, a (query, key) or
    (batch, query, key) tensor (rows summing to one; named in `spec()` by its shape and a digest of its
    values), None (the head's own; with `permute=True` its weights shuffled among the allowed keys of each
    row), or a `PatternSource` computed per batch.
    """

    head: tuple[int, int]  # parsed into a Head
    pattern: str | torch.Tensor | PatternSource | None = "uniform"
    permute: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", parse_head(self.head))
        if isinstance(self.pattern, str) and self.pattern not in IDEAL_PATTERNS:
            raise ValueError(f"pattern={self.pattern!r}: a name here must be one of {list(IDEAL_PATTERNS)} ('uniform': over "
                             "the keys the model allows); pass None (the head's own, with permute=True), a tensor or a "
                             "PatternSource for another pattern.")
        if isinstance(self.pattern, torch.Tensor):
            _check_pattern_spec(self.pattern, self.label)
        elif not (self.pattern is None or isinstance(self.pattern, str) or _is_source(self.pattern)):
            raise BadType(f"PatternSubstitution pattern for {self.label} is of type {type(self.pattern).__name__}; expected one "
                          f"of {list(IDEAL_PATTERNS)}, None, a (query, key) or (batch, query, key) tensor, or a "
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
        so sources with equal spec() but different patterns are told apart); None where spec() says it all."""
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
        return substitute_pattern(run.model, layer, head, pattern, permute_keys=self.permute, seed=run.seed)


def permuted_pattern(model: nn.Module, layer: int, head: int, *, seed: int = 0) -> contextlib.AbstractContextManager[nn.Module]:
    """Context manager: the head keeps its own weights, shuffled among the allowed keys of each row."""
    return substitute_pattern(model, layer, head, None, permute_keys=True, seed=seed)


def uniform_pattern(model: nn.Module, layer: int, head: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Context manager: the head attends uniformly to every allowed key."""
    return substitute_pattern(model, layer, head, "uniform")
