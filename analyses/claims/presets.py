"""The built-in head claims: one preset per head type of `interp.analyses.head_types`
(`head_type_claim`; a type registered there becomes one too) and the positional claim, each
citing where its threshold comes from:

  previous_token   more than half of the attention on query - 1          (Clark et al. 2019)
  next_token       more than half on query + 1 (bidirectional models)    (Clark et al. 2019)
  self_token       more than half on the query's own position            (Clark et al. 2019)
  first_token      more than half on the first position (a sink head)    (Clark et al. 2019; Xiao et al. 2023)
  local_window     more than half within `window` positions of the query (Clark et al. 2019's rule)
  induction        more than half on the token after an earlier occurrence of the current token,
                   on repeated random tokens, with a copying OV circuit   (Olsson et al. 2022)
  duplicate_token  more than half on earlier occurrences of the current token (Olsson et al. 2022;
                   Wang et al. 2022)
  positional       the maximum weight sits at one relative offset (or on the first position) for
                   at least 90% of queries, and still does on shuffled tokens (Voita et al. 2019)

Each claim carries the evidence that tests it: observational and the controls
(`interp.analyses.claims.evidence`), necessity, sufficiency and faithfulness
(`interp.analyses.claims.causal`), and stability (`interp.claims.Stability`, on demand: the
observational outcome and the head ranking survive random halves of the prompts, another batch
composition, and bfloat16).

References: Clark et al. 2019, "What does BERT look at? An analysis of BERT's attention";
Voita et al. 2019, "Analyzing multi-head self-attention: specialized heads do the heavy lifting";
Elhage et al. 2021, "A mathematical framework for transformer circuits"; Olsson et al. 2022,
"In-context learning and induction heads"; Wang et al. 2022, "Interpretability in the wild";
Xiao et al. 2023, "Efficient streaming language models with attention sinks".
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Literal, Mapping, get_args

from interp.analyses.claims.causal import FAITHFULNESS, Faithfulness, Necessity, Sufficiency
from interp.analyses.claims.common import PositionalParams
from interp.analyses.claims.evidence import Observational, RandomInitControl, ShuffledControl
from interp.analyses.head_types import (
    ELHAGE,
    HEAD_TYPES,
    VOITA,
    HeadType,
    HeadTypeParams,
    get_head_type,
)
from interp.claims import Claim, EvidenceFn, Stability, Threshold
from interp.heads import head_label

ClaimKind = Literal[
    "previous_token", "next_token", "self_token", "first_token", "local_window", "induction", "duplicate_token",
    "positional",
]
CLAIM_KINDS: tuple[str, ...] = get_args(ClaimKind)  # the built-in kinds; `PRESETS` also has registered head types
# short citations (the titles are in the module docstring's references): CLARK, VOITA, ... from interp.analyses.head_types
SUFFICIENCY = "toolkit convention: most (over half) of the loss difference; not a published number"


def head_type_claim(head_type: HeadType | str, layer: int, head: int, *, threshold: float | None = None,
                    sufficiency: float | None = None, copying: float | None = None, **params: Any) -> Claim:
    """The claim "head (layer, head) is a `head_type` head", with every evidence kind that applies:
    observational (the metric against `threshold`, default the type's), the shuffled control the type
    expects, the random-init control, necessity, faithfulness, stability, and sufficiency (its ideal
    pattern recovers the behaviour) when the type has a sufficiency threshold. `params` override the
    type's own (e.g. window); `copying` the OV copying threshold of types that check one."""
    t = get_head_type(head_type) if isinstance(head_type, str) else head_type
    unknown = sorted(set(params) - set(dict(t.params)))
    if unknown:
        raise TypeError(f"{t.name} claims take no parameter {unknown[0]!r}; they take threshold, sufficiency"
                        f"{''.join(', ' + k for k in dict(t.params))}.")
    threshold = t.threshold if threshold is None else threshold
    values = {**dict(t.params), **params}
    evidence: dict[str, Any] = {
        "observational": Observational(),
        "control_shuffled": ShuffledControl(t.shuffle, decisive=t.shuffle_decisive),
        "control_random_init": RandomInitControl(),
        "necessity": Necessity(),
        "faithfulness": Faithfulness(),
        "stability": Stability(),
    }
    thresholds = {"observational": Threshold(threshold, t.citation)}
    if t.sufficiency is not None:
        evidence["sufficiency"] = Sufficiency()
        thresholds["sufficiency"] = Threshold(t.sufficiency if sufficiency is None else sufficiency, SUFFICIENCY)
        thresholds["faithfulness"] = FAITHFULNESS
    if t.copying is not None:
        thresholds["copying"] = Threshold(t.copying if copying is None else copying, ELHAGE)
    return Claim(t.name, ((layer, head),), t.describe(head_label((layer, head)), threshold, **values),
                 HeadTypeParams(t, tuple(values.items())), thresholds, evidence)


def previous_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the head's attention on the previous token (Clark et al. 2019: > 0.5)."""
    return head_type_claim("previous_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def next_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention on the next token (Clark et al. 2019: > 0.5). Defined for
    bidirectional models only: on a causal model the metric is undefined and the verdict inconclusive."""
    return head_type_claim("next_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def self_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention on the query's own position (Clark et al. 2019's rule)."""
    return head_type_claim("self_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def first_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """A sink head: more than `threshold` of the attention on the first position (Clark et al. 2019's
    [CLS] heads; Xiao et al. 2023's attention sinks)."""
    return head_type_claim("first_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def local_window_head(layer: int, head: int, *, threshold: float = 0.5, window: int = 3, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention within `window` positions of the query (|q - k| <= window),
    Clark et al. 2019's majority rule applied to a band. The random-init control matters most here:
    on short prompts even a uniform head puts most of its weight near the query."""
    if window != 3:
        raise ValueError(f"window={window}: interp.analyses.positional measures local_window with window=3; use window=3.")
    return head_type_claim("local_window", layer, head, threshold=threshold, sufficiency=sufficiency, window=window)


def induction_head(layer: int, head: int, *, threshold: float = 0.5, copying: float = 0.0, sufficiency: float = 0.5) -> Claim:
    """An induction head (Olsson et al. 2022): on repeated random tokens, more than `threshold` of the
    attention of repeat queries on the token after the earlier occurrence of the current token
    (prefix matching), an OV circuit that copies (eigenvalue copying score > `copying`), and no such
    attention to where the target *was* once the tokens are shuffled (copying from a fixed offset fails)."""
    return head_type_claim("induction", layer, head, threshold=threshold, sufficiency=sufficiency, copying=copying)


def duplicate_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention of repeat queries on earlier occurrences of the current token
    (Olsson et al. 2022; Wang et al. 2022), not to where they *were* once the tokens are shuffled."""
    return head_type_claim("duplicate_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def positional_head(layer: int, head: int, *, offset: int | str | None = None, threshold: float = 0.9) -> Claim:
    """Positional, not content-based (Voita et al. 2019): the maximum weight sits at relative offset
    `offset` (an int k - q, or "first" for position 0) for at least `threshold` of the queries, and still
    does on shuffled tokens. `offset=None` takes the modal offset of the prompts under test.

    Choosing the offset on the tested prompts does not inflate the test when threshold > 0.5:
    each query has one maximum, so the offsets' argmax rates sum to one and at most one offset
    can pass; "the modal offset passes" is then the same event as "some offset passes"."""
    if offset is None and threshold <= 0.5:
        raise ValueError(
            f"positional_head with offset=None needs threshold > 0.5 (got {threshold}): below that, several "
            "offsets could pass and picking one on the tested prompts would bias the test; name the offset."
        )
    if offset is not None and offset != "first":
        offset = int(offset)
    where = ("the first position" if offset == "first" else "one relative offset" if offset is None
             else f"relative offset {offset}")
    evidence: dict[str, EvidenceFn] = {
        "observational": Observational(),
        "control_shuffled": ShuffledControl("stay", decisive=True),
        "control_random_init": RandomInitControl(),
        "necessity": Necessity(),  # knocks out the attention at the offset's key
        "stability": Stability(),
    }
    return Claim("positional", ((layer, head),),
                 f"{head_label((layer, head))} is positional: its maximum weight sits at {where} for >= {threshold:.0%} of queries, "
                 "whatever the tokens",
                 PositionalParams(offset), {"observational": Threshold(threshold, VOITA)}, evidence)


_NAMED_PRESETS: dict[str, Callable[..., Claim]] = {
    "previous_token": previous_token_head,
    "next_token": next_token_head,
    "self_token": self_token_head,
    "first_token": first_token_head,
    "local_window": local_window_head,
    "induction": induction_head,
    "duplicate_token": duplicate_token_head,
    "positional": positional_head,
}


class _Presets(Mapping):
    """kind -> claim factory (layer, head, **params): the built-in presets, then one per head type
    registered since (`interp.analyses.head_types.register`), read live from the registry."""

    def __getitem__(self, kind: str) -> Callable[..., Claim]:
        if kind in _NAMED_PRESETS:
            return _NAMED_PRESETS[kind]
        if kind in HEAD_TYPES:
            return functools.partial(head_type_claim, HEAD_TYPES[kind])
        raise KeyError(kind)

    def __iter__(self) -> Iterator[str]:
        return iter([*_NAMED_PRESETS, *(name for name in HEAD_TYPES if name not in _NAMED_PRESETS)])

    def __len__(self) -> int:
        return len(list(iter(self)))


PRESETS: Mapping[str, Callable[..., Claim]] = _Presets()


def make_claim(kind: str, layer: int, head: int, **params) -> Claim:
    """A preset claim by kind name (`CLAIM_KINDS`, or a registered head type), e.g. make_claim("induction", 1, 2)."""
    if kind not in PRESETS:
        raise ValueError(f"unknown claim kind {kind!r}; expected one of {list(PRESETS)}.")
    return PRESETS[kind](layer, head, **params)
