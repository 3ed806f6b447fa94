"""Prompt sets: seeded, reproducible batches of token ids where one prompt is one unit of statistics.

A `PromptSet` holds `tokens` (n_prompts, pos) and, for padded text, an `attention_mask`
(n_prompts, pos) with 1 for real tokens and 0 for padding; `special_mask` (n_prompts, pos) bool
marks the real tokens that are special ([CLS], [SEP], BOS), which the shuffled control keeps in
place and mean ablation matches by role (`token_roles`). `meta` records how it was made
(kind, seed, prefix length...) so reports can state their methods; `repeats` (a `Repeats`)
is the repeat structure that induction scores, claims and behaviours read.
"""
from __future__ import annotations

import hashlib
import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Literal, Sequence, get_args

import torch

from interp.errors import BadInput, BadType


@dataclass(frozen=True)
class Repeats:
    """The repeat structure of a prompt set: where a token repeats an earlier one.

    With a `period` (`repeated_tokens`' prefix_len), the token at position p >= offset + period
    repeats the token at p - period; without one, a repeat is wherever a token (or, with
    `match_len` = k, a k-gram) occurred before. `match_len` None means single tokens.
    """

    period: int | None = None  # prefix_len: length of the repeated block; None: repeats found in the tokens
    offset: int = 0  # position of the first block's first token (1 after a BOS token)
    n_repeats: int | None = None  # copies of the block (None: not built by repetition)
    match_len: int | None = None  # n-gram length that makes a repeat (None: 1, single tokens)

    def __post_init__(self) -> None:
        for name, least in (("period", 1), ("offset", 0), ("n_repeats", 1), ("match_len", 1)):
            value = getattr(self, name)
            if value is None and name != "offset":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise BadInput(f"Repeats.{name}={value!r}; expected an integer >= {least}"
                               f"{'' if name == 'offset' else ' or None'}.")

    @property
    def start(self) -> int | None:
        """First position of the second copy (offset + period); None without a period."""
        return None if self.period is None else self.offset + self.period

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "Repeats | None":
        """The structure the legacy meta keys (prefix_len, offset, n_repeats, match_len) describe; None if none."""
        if meta.get("prefix_len") is None and meta.get("match_len") is None:
            return None
        return cls(period=meta.get("prefix_len"), offset=meta.get("offset", 0) or 0, n_repeats=meta.get("n_repeats"),
                   match_len=meta.get("match_len"))

    def without_period(self) -> "Repeats | None":
        """What survives shuffling the tokens: the n-gram length, not the period (None if nothing is left)."""
        return None if self.match_len is None else Repeats(match_len=self.match_len)

    def query_mask(self, tokens: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        """(prompt, pos) bool: the repeated positions, the queries whose next token an earlier occurrence
        makes predictable. The toolkit's one definition: induction scores average over these queries and
        the next-token behaviours score their predictions.

        With a period and no `match_len`: every real position of the second and later copies
        (p >= offset + period; positions count from the row's start, padding included). Otherwise the
        real positions that end an n-gram of `match_len` tokens (1 if None) seen before, the two not
        overlapping (`ngram_targets`), within the repeated copies when there is also a period.
        `real` (prompt, pos) bool marks real tokens (None: all real).
        """
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise BadInput(f"Repeats.query_mask needs (prompt, pos) token ids, got {shape}.")
        real = torch.ones_like(tokens, dtype=torch.bool) if real is None else real.bool()
        if real.shape != tokens.shape:
            raise BadInput(f"Repeats.query_mask: real has shape {tuple(real.shape)}, tokens {tuple(tokens.shape)}; "
                           "expected one flag per token (True at real tokens).")
        if self.period is not None and self.match_len is None:  # the copies repeat by construction
            queries = torch.ones_like(real)
        else:
            queries = ngram_targets(tokens, real, self.match_len or 1).any(-1)  # (prompt, query)
        if self.start is not None:
            queries[:, : self.start] = False
        return queries & real


def ngram_targets(tokens: torch.Tensor, real: torch.Tensor, match_len: int = 1) -> torch.Tensor:
    """(batch, query, key) bool: keys j <= q - match_len whose `match_len` tokens ending at j equal those
    ending at q (all real; the n-grams do not overlap); match_len=1: the earlier occurrences of the query's token."""
    if not isinstance(match_len, int) or isinstance(match_len, bool) or match_len < 1:
        raise ValueError(f"match_len={match_len!r} must be a positive integer (the n-gram length of a repeat).")
    same = (tokens[:, :, None] == tokens[:, None, :]) & real[:, :, None] & real[:, None, :]  # (batch, query, key)
    matched = same.clone()
    for back in range(1, match_len):  # token q - back equals token j - back
        shifted = torch.zeros_like(same)
        shifted[:, back:, back:] = same[:, :-back, :-back]
        matched &= shifted
    return matched.tril(diagonal=-match_len)


@dataclass(frozen=True)
class PromptSet:
    tokens: torch.Tensor  # (prompt, pos) long
    attention_mask: torch.Tensor | None = None  # (prompt, pos) 1 = real, 0 = padding
    meta: dict[str, Any] = field(default_factory=dict)  # kind, seed, prefix_len, ...
    rows: torch.Tensor | None = None  # (prompt,) each prompt's row in the set it was taken from; None = 0..n-1
    repeats: Repeats | None = None  # repeat structure; None: derived from meta's prefix_len / match_len, if any
    special_mask: torch.Tensor | None = None  # (prompt, pos) bool, True at special real tokens ([CLS], [SEP], BOS)

    def __post_init__(self) -> None:
        if self.repeats is None:  # sets built with the legacy meta keys (users, notebooks) keep working
            object.__setattr__(self, "repeats", Repeats.from_meta(self.meta))
        elif not isinstance(self.repeats, Repeats):
            raise BadType(f"PromptSet.repeats must be an interp.data.Repeats or None, got {type(self.repeats).__name__}.")
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.ndim != 2:
            shape = tuple(self.tokens.shape) if isinstance(self.tokens, torch.Tensor) else type(self.tokens).__name__
            raise BadInput(f"PromptSet.tokens must be a (prompt, pos) tensor, got {shape}.")
        if self.tokens.is_floating_point():
            raise BadType(f"PromptSet.tokens must be integer token ids, got dtype {self.tokens.dtype}.")
        if self.attention_mask is not None and not isinstance(self.attention_mask, torch.Tensor):
            raise BadType(f"PromptSet.attention_mask must be a (prompt, pos) tensor of 0/1 or None, got "
                          f"{type(self.attention_mask).__name__}.")
        if self.rows is not None and tuple(self.rows.shape) != (self.tokens.shape[0],):
            raise BadInput(f"PromptSet.rows has shape {tuple(self.rows.shape)}; expected ({self.tokens.shape[0]},), one per prompt.")
        if self.attention_mask is not None and self.attention_mask.shape != self.tokens.shape:
            raise BadInput(
                f"attention_mask shape {tuple(self.attention_mask.shape)} differs from tokens shape "
                f"{tuple(self.tokens.shape)}."
            )
        if self.attention_mask is not None:
            self._check_mask_values(self.attention_mask)
        if self.special_mask is not None:
            self._check_special_mask(self.special_mask)

    def _check_special_mask(self, special: torch.Tensor) -> None:
        """A (prompt, pos) bool tensor, True only at real tokens; 0/1 integers are converted to bool."""
        if not isinstance(special, torch.Tensor) or special.shape != self.tokens.shape:
            shape = tuple(special.shape) if isinstance(special, torch.Tensor) else type(special).__name__
            raise BadInput(f"PromptSet.special_mask must be a (prompt, pos) tensor shaped like tokens "
                           f"{tuple(self.tokens.shape)}, got {shape}.")
        if special.dtype != torch.bool:
            if special.is_floating_point() or bool(((special != 0) & (special != 1)).any()):
                raise BadInput("PromptSet.special_mask holds values other than 0/1; expected True at special tokens.")
            special = special.bool()
            object.__setattr__(self, "special_mask", special)
        if self.attention_mask is not None and bool((special & ~self.attention_mask.bool()).any()):
            raise BadInput("PromptSet.special_mask marks padding as special; mark only real tokens "
                           "(`special & attention_mask.bool()`).")

    def _check_mask_values(self, mask: torch.Tensor) -> None:
        """0/1 entries only, and at least one real token per prompt (a fully padded prompt has no statistics)."""
        odd = mask[(mask != 0) & (mask != 1)]
        if odd.numel():
            raise BadInput(f"PromptSet.attention_mask holds {odd.flatten()[0].item()!r}; expected 1 for real tokens and "
                           "0 for padding (an additive mask converts with `(mask == 0).long()`).")
        empty = (~mask.bool().any(-1)).nonzero().flatten().tolist() if mask.ndim == 2 else []
        if empty:
            raise BadInput(f"prompts {self.row_numbers(empty[:5])} are all padding (attention_mask all 0); every prompt "
                           "needs at least one real token: drop them.")

    @property
    def kind(self) -> str:
        kind: str = self.meta.get("kind", "tokens")
        return kind

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int | slice | list[int] | torch.Tensor) -> "PromptSet":
        if isinstance(index, int):
            index = slice(index, index + 1)
        mask = None if self.attention_mask is None else self.attention_mask[index]
        special = None if self.special_mask is None else self.special_mask[index]
        rows = torch.arange(len(self)) if self.rows is None else self.rows
        return replace(self, tokens=self.tokens[index], attention_mask=mask, rows=rows[index], special_mask=special)

    def row_numbers(self, positions: Iterable[int] | torch.Tensor) -> list[int]:
        """Rows of the original set (e.g. the user's prompt file) of prompts at `positions` of this one,
        so an error about a batch or a split half names the row the user wrote."""
        numbers = [int(p) for p in positions]
        return numbers if self.rows is None else [int(self.rows[p]) for p in numbers]

    def real_mask(self) -> torch.Tensor:
        """(prompt, pos) bool, True at real (unpadded) tokens."""
        if self.attention_mask is None:
            return torch.ones(self.tokens.shape, dtype=torch.bool)
        return self.attention_mask.bool()

    def specials(self) -> torch.Tensor:
        """(prompt, pos) bool, True at special real tokens (all False without a `special_mask`)."""
        return torch.zeros(self.tokens.shape, dtype=torch.bool) if self.special_mask is None else self.special_mask

    def real_lengths(self) -> torch.Tensor:
        """(prompt,) number of real (unpadded) tokens of each prompt."""
        if self.attention_mask is None:
            return torch.full((len(self),), self.n_pos, dtype=torch.long)
        return self.attention_mask.long().sum(-1)

    def batches(self, batch_size: int) -> Iterator["PromptSet"]:
        """Consecutive batches of at most `batch_size` prompts."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1.")
        for start in range(0, len(self), batch_size):
            yield self[start : start + batch_size]

    def split(self, fraction: float = 0.5, seed: int = 0) -> tuple["PromptSet", "PromptSet"]:
        """Two disjoint random parts (e.g. one to propose claims, one to test them)."""
        if not 0 < fraction < 1 or len(self) < 2:
            raise ValueError(f"cannot split {len(self)} prompts with fraction={fraction}; need >= 2 prompts and 0 < fraction < 1.")
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        cut = min(max(1, round(fraction * len(self))), len(self) - 1)
        return self[order[:cut]], self[order[cut:]]

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for a model forward: the attention mask when there is padding."""
        return {} if self.attention_mask is None else {"attention_mask": self.attention_mask}


ROLE_START, ROLE_CONTENT, ROLE_END, ROLE_PAD = 0, 1, 2, -1  # TokenRoles.kind values


@dataclass(frozen=True)
class TokenRoles:
    """Each position's token role, for comparing positions across prompts of different lengths.

    `kind` (prompt, pos): ROLE_START for the leading run of special tokens ([CLS], BOS), ROLE_END
    for the trailing run ([SEP]), ROLE_CONTENT for every other real token (a special token between
    content, e.g. a pair's middle [SEP], included), ROLE_PAD for padding. `index` (prompt, pos):
    a start special's rank in its run, an end special's rank counted from the end (0 = last), a
    content token's rank among the prompt's real tokens (from the first real token, whatever the
    padding side); -1 at padding. Two positions have the same role when both agree.
    """

    kind: torch.Tensor  # (prompt, pos) long
    index: torch.Tensor  # (prompt, pos) long

    def key(self, width: int) -> torch.Tensor:
        """(prompt, pos) one integer per role, kind * width + index (-1 at padding); `width` > every index."""
        return torch.where(self.kind == ROLE_PAD, -1, self.kind * width + self.index)


def token_roles(prompts: PromptSet) -> TokenRoles:
    """The token role of every position of `prompts` (see `TokenRoles`).

    Without padding and special tokens every position is content with index = position, so roles
    are positions; with the same layout in every prompt (e.g. a BOS column), too.
    """
    real, special = prompts.real_mask(), prompts.specials() & prompts.real_mask()  # (prompt, pos)
    content = real & ~special
    rank = real.long().cumsum(-1) - 1  # (prompt, pos) rank among real tokens
    n_real = real.long().sum(-1, keepdim=True)  # (prompt, 1)
    leading = special & (content.long().cumsum(-1) == 0)  # no content token before
    trailing = special & ~leading & (content.long().flip(-1).cumsum(-1).flip(-1) == 0)  # none after
    kind = torch.full(real.shape, ROLE_CONTENT, dtype=torch.long)
    kind[leading], kind[trailing], kind[~real] = ROLE_START, ROLE_END, ROLE_PAD
    index = torch.where(trailing, n_real - 1 - rank, rank)
    return TokenRoles(kind, torch.where(real, index, -1))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check_counts(n: int, **lengths: int) -> None:
    if n < 1:
        raise ValueError(f"n={n}: a prompt set needs at least one prompt.")
    for name, value in lengths.items():
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1.")


def check_size(n: int, n_pos: int, what: str) -> None:
    """Refuse, before allocating, a (n, n_pos) long tensor larger than the memory available."""
    import os

    size = n * n_pos * 8  # int64 token ids
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if size > available:
        raise BadInput(f"{what}: {n} prompts x {n_pos} positions would take {size / 2**30:.1f} GiB of token ids, more than "
                       f"the {available / 2**30:.1f} GiB available; ask for fewer or shorter prompts.")


def random_tokens(n: int, seq_len: int, d_vocab: int, *, seed: int = 0, bos: int | None = None) -> PromptSet:
    """`n` prompts of uniformly random token ids (optionally after a fixed BOS token)."""
    _check_counts(n, seq_len=seq_len, d_vocab=d_vocab)
    check_size(n, seq_len, "random_tokens")
    tokens = torch.randint(0, d_vocab, (n, seq_len), generator=_generator(seed))  # (prompt, pos)
    if bos is not None:
        tokens = torch.cat([torch.full((n, 1), bos), tokens], dim=1)
    return PromptSet(tokens, meta={"kind": "random", "seed": seed, "d_vocab": d_vocab, "bos": bos},
                     special_mask=_bos_mask(tokens, bos))


def repeated_tokens(
    n: int, prefix_len: int, d_vocab: int, *, seed: int = 0, bos: int | None = None, n_repeats: int = 2
) -> PromptSet:
    """A random prefix followed by the same prefix again: the induction test (Olsson et al. 2022).

    `repeats.period` (also `meta["prefix_len"]`) is the repeat period and `repeats.offset` the
    position of the first prefix token (1 with a BOS token, else 0): the token at position
    p >= offset + prefix_len repeats the token at p - prefix_len.
    """
    _check_counts(n, prefix_len=prefix_len, d_vocab=d_vocab, n_repeats=n_repeats)
    if prefix_len < 2:
        raise BadInput(
            f"prefix_len={prefix_len}: with a repeat period of 1 the induction target (the token after the previous "
            "occurrence) is the query itself, so induction cannot be told from self-attention; use prefix_len >= 2."
        )
    check_size(n, prefix_len * n_repeats, "repeated_tokens")
    prefix = torch.randint(0, d_vocab, (n, prefix_len), generator=_generator(seed))  # (prompt, prefix_pos)
    tokens = prefix.repeat(1, n_repeats)  # (prompt, pos)
    if bos is not None:
        tokens = torch.cat([torch.full((n, 1), bos), tokens], dim=1)
    repeats = Repeats(period=prefix_len, offset=0 if bos is None else 1, n_repeats=n_repeats)
    meta = {"kind": "repeated", "seed": seed, "d_vocab": d_vocab, "bos": bos,
            "prefix_len": prefix_len, "offset": repeats.offset, "n_repeats": n_repeats}
    return PromptSet(tokens, meta=meta, repeats=repeats, special_mask=_bos_mask(tokens, bos))


def _bos_mask(tokens: torch.Tensor, bos: int | None) -> torch.Tensor | None:
    """(prompt, pos) True at the BOS column (position 0) when there is a BOS token, else None."""
    if bos is None:
        return None
    special = torch.zeros(tokens.shape, dtype=torch.bool)
    special[:, 0] = True
    return special


def shuffled(prompts: PromptSet, *, seed: int = 0, keep_first: bool | None = None) -> PromptSet:
    """Control: each prompt's content tokens in a random order (its own permutation).

    Special tokens (`special_mask`: [CLS], [SEP], BOS) and padding stay in place; only the real,
    non-special tokens move, so the bag of content tokens is unchanged and a metric that survives
    shuffling depends on position, not on content. `keep_first` (default: keep it when the set has a
    BOS token in `meta` but no `special_mask`) also pins the first real token. The repeat period is
    dropped (the repeats are wherever the tokens went); `match_len` is kept.
    """
    if keep_first is None:
        keep_first = prompts.meta.get("bos") is not None and prompts.special_mask is None
    generator = _generator(seed)
    tokens = prompts.tokens.clone()
    fixed = prompts.specials() | ~prompts.real_mask()  # (prompt, pos)
    for row in range(len(prompts)):
        real = prompts.real_mask()[row].nonzero().flatten()
        if keep_first and len(real):
            fixed[row, real[0]] = True
        movable = (~fixed[row]).nonzero().flatten()
        tokens[row, movable] = tokens[row, movable[torch.randperm(len(movable), generator=generator)]]
    repeats = None if prompts.repeats is None else prompts.repeats.without_period()
    meta = {k: v for k, v in prompts.meta.items() if k not in ("prefix_len", "offset", "n_repeats")}
    meta.update(kind=f"shuffled({prompts.kind})", shuffle_seed=seed)
    return replace(prompts, tokens=tokens, meta=meta, repeats=repeats)


# ---------------------------------------------------------------------------------------------
# Text: a character tokenizer, the shipped corpus, tokenised and padded prompt sets
# ---------------------------------------------------------------------------------------------

PaddingSide = Literal["right", "left"]
UnknownPolicy = Literal["error", "unk"]

PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"


class CharTokenizer:
    """One token per character, for character-level language models.

    Ids: 0 is `<pad>`, 1 is `<unk>`, then the alphabet's characters in sorted order, so the
    vocabulary depends only on the set of characters. A character outside the alphabet
    raises a ValueError naming it (`unknown="error"`, the default: a silent `<unk>` hides
    a wrong corpus) or maps to id 1 (`unknown="unk"`). `decode` drops `<pad>` and writes
    `<unk>` as U+FFFD.
    """

    pad_token_id = 0
    unk_token_id = 1

    def __init__(self, alphabet: str, *, unknown: UnknownPolicy = "error"):
        if unknown not in get_args(UnknownPolicy):
            raise ValueError(f"unknown={unknown!r}; expected one of {list(get_args(UnknownPolicy))}.")
        chars = sorted(set(alphabet))
        if not chars:
            raise ValueError("CharTokenizer needs a non-empty alphabet; pass the training text or its characters.")
        self.unknown = unknown
        self.alphabet = "".join(chars)
        self._ids = {char: i + 2 for i, char in enumerate(chars)}
        self._chars = [PAD_TOKEN, UNK_TOKEN, *chars]

    @classmethod
    def from_text(cls, text: str, *, unknown: UnknownPolicy = "error") -> "CharTokenizer":
        """The tokenizer whose alphabet is every character of `text`."""
        return cls(text, unknown=unknown)

    @property
    def vocab_size(self) -> int:
        return len(self._chars)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, unknown={self.unknown!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and (self.alphabet, self.unknown) == (other.alphabet, other.unknown)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, one per character."""
        if self.unknown == "unk":
            return [self._ids.get(char, self.unk_token_id) for char in text]
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            char = error.args[0]
            raise ValueError(
                f"character {char!r} (U+{ord(char):04X}) is not in this CharTokenizer's alphabet of "
                f"{len(self.alphabet)} characters; build the tokenizer from text that contains it, "
                "or pass unknown='unk' to map it to <unk>."
            ) from None

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Text of a sequence of ids (a list or a 1-D tensor); padding is dropped."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        out = []
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside this CharTokenizer's vocabulary [0, {self.vocab_size}).")
            if i == self.pad_token_id:
                continue
            out.append("\ufffd" if i == self.unk_token_id else self._chars[i])
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, e.g. for a checkpoint's JSON metadata."""
        return {"kind": "char", "alphabet": self.alphabet, "unknown": self.unknown}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CharTokenizer":
        return cls(data["alphabet"], unknown=data.get("unknown", "error"))


def corpus_text() -> str:
    """The small English corpus shipped in `models/data/*.txt` (original prose, public-domain style)."""
    from importlib.resources import files

    folder = files("interp.models").joinpath("data")
    parts = sorted((entry for entry in folder.iterdir() if entry.name.endswith(".txt")), key=lambda e: e.name)
    if not parts:
        raise FileNotFoundError(f"no .txt files in {folder}; the package data models/data/*.txt is missing (reinstall).")
    return "\n\n".join(part.read_text(encoding="utf-8").strip() for part in parts)


_DEFAULT_TOKENIZER: CharTokenizer | None = None


def corpus_tokenizer() -> CharTokenizer:
    """The CharTokenizer of `corpus_text()` (built once): what `char_prompts` uses by default."""
    global _DEFAULT_TOKENIZER
    if _DEFAULT_TOKENIZER is None:
        _DEFAULT_TOKENIZER = CharTokenizer.from_text(corpus_text())
    return _DEFAULT_TOKENIZER


def _check_padding_side(padding_side: str) -> None:
    if padding_side not in get_args(PaddingSide):
        raise ValueError(f"padding_side={padding_side!r}; expected one of {list(get_args(PaddingSide))}.")


def _check_n_ctx(prompts: PromptSet, n_ctx: int | None) -> PromptSet:
    if n_ctx is not None and prompts.n_pos > n_ctx:
        raise ValueError(
            f"prompts are {prompts.n_pos} tokens long but the model's context is n_ctx={n_ctx}; "
            f"pass max_len={n_ctx} (or shorter texts)."
        )
    return prompts


def pad(
    sequences: Iterable[Sequence[int] | torch.Tensor],
    *,
    pad_id: int = 0,
    padding_side: PaddingSide = "right",
    max_len: int | None = None,
    n_ctx: int | None = None,
    meta: dict[str, Any] | None = None,
) -> PromptSet:
    """A padded PromptSet from sequences of different lengths (lists or 1-D tensors of ids).

    `attention_mask` marks real tokens with 1. Sequences longer than `max_len` are truncated
    (keeping their start); `n_ctx`, when given, is checked after truncation. A set with no
    padding at all gets `attention_mask=None`, so models keep their unmasked fast path.
    """
    _check_padding_side(padding_side)
    rows = [torch.as_tensor(s, dtype=torch.long).flatten() for s in sequences]
    if not rows:
        raise ValueError("pad() got no sequences; a prompt set needs at least one prompt.")
    if max_len is not None:
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be at least 1.")
        rows = [row[:max_len] for row in rows]
    empty = [i for i, row in enumerate(rows) if len(row) == 0]
    if empty:
        raise ValueError(f"sequences {empty[:5]} are empty; every prompt needs at least one token.")
    width = max(len(row) for row in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (prompt, pos)
    mask = torch.zeros(len(rows), width, dtype=torch.long)  # (prompt, pos)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if padding_side == "right" else slice(width - len(row), width)
        tokens[i, span], mask[i, span] = row, 1
    meta = {"kind": "padded", "padding_side": padding_side, "pad_id": pad_id, **(meta or {})}
    prompts = PromptSet(tokens, None if bool(mask.all()) else mask, meta)
    return _check_n_ctx(prompts, n_ctx)


def text_prompts(
    texts: str | Iterable[str],
    tokenizer: Any,  # a CharTokenizer, a shipped model's tokenizer, or any Hugging Face tokenizer
    *,
    max_len: int | None = None,
    padding_side: PaddingSide = "right",
    n_ctx: int | None = None,
) -> PromptSet:
    """Tokenise `texts` (one prompt each) into a padded PromptSet.

    `tokenizer` is a `CharTokenizer` or a Hugging Face tokenizer (e.g.
    `transformers.AutoTokenizer.from_pretrained(folder)`; its special tokens such as [CLS] and
    [SEP] are added as the model expects, and marked in `special_mask`). `max_len` truncates;
    `n_ctx` checks the result fits the model. The mask is None when no text needed padding.
    """
    _check_padding_side(padding_side)
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError("text_prompts got no texts; pass a non-empty list of strings.")
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t]
    if bad:
        raise ValueError(f"texts {bad[:5]} are empty or not strings; every prompt must be a non-empty string.")
    meta = {"kind": "text", "n_texts": len(texts), "max_len": max_len}
    if isinstance(tokenizer, CharTokenizer) or (not callable(tokenizer) and callable(getattr(tokenizer, "encode", None))):
        # ours: CharTokenizer and the shipped checkpoints' tokenizers (interp.models.tokenizers), text -> list of ids;
        # one without a padding id pads with 0 under the attention mask
        meta["tokenizer"] = "char" if isinstance(tokenizer, CharTokenizer) else type(tokenizer).__name__
        pad_id = getattr(tokenizer, "pad_token_id", None)
        return pad([tokenizer.encode(t) for t in texts], pad_id=0 if pad_id is None else pad_id, padding_side=padding_side,
                   max_len=max_len, n_ctx=n_ctx, meta=meta)
    if not callable(tokenizer):
        raise BadType(
            f"tokenizer must be a CharTokenizer or a Hugging Face tokenizer (or a shipped model's tokenizer, which has "
            f"encode), got {type(tokenizer).__name__}."
        )
    previous_side = getattr(tokenizer, "padding_side", None)
    try:
        tokenizer.padding_side = padding_side
        encoded = tokenizer(texts, padding=True, truncation=max_len is not None, max_length=max_len, return_tensors="pt")
    finally:
        if previous_side is not None:
            tokenizer.padding_side = previous_side
    mask = encoded["attention_mask"].long()
    special = _special_tokens(tokenizer, encoded, mask)
    meta.update(tokenizer=getattr(tokenizer, "name_or_path", type(tokenizer).__name__), padding_side=padding_side,
                pad_id=tokenizer.pad_token_id)
    prompts = PromptSet(encoded["input_ids"].long(), None if bool(mask.all()) else mask, meta,
                        special_mask=special if bool(special.any()) else None)
    return _check_n_ctx(prompts, n_ctx)


def _special_tokens(tokenizer: Any, encoded: Any, mask: torch.Tensor) -> torch.Tensor:
    """(prompt, pos) bool: the special tokens the tokenizer added ([CLS], [SEP], BOS...), padding excluded.

    Read off the ids: every id in `all_special_ids` except the unknown token's (an [UNK] stands for
    a word of the text), at real positions only (padding is the attention mask's business).
    """
    ids = encoded["input_ids"].long()
    special_ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    special_ids.discard(getattr(tokenizer, "unk_token_id", None))
    if not special_ids:
        return torch.zeros(ids.shape, dtype=torch.bool)
    return torch.isin(ids, torch.tensor(sorted(special_ids), dtype=torch.long)) & mask.bool()


def char_prompts(
    n: int, seq_len: int, *, seed: int = 0, tokenizer: CharTokenizer | None = None, text: str | None = None
) -> PromptSet:
    """`n` windows of `seq_len` characters at seeded random offsets into `text` (default: the corpus).

    Windows may overlap (the corpus is a few KB); all have the same length, so there is no mask.
    """
    _check_counts(n, seq_len=seq_len)
    check_size(n, seq_len, "char_prompts")
    text = corpus_text() if text is None else text
    tokenizer = corpus_tokenizer() if tokenizer is None else tokenizer
    if len(text) < seq_len:
        raise ValueError(f"seq_len={seq_len} is longer than the text ({len(text)} characters); pass a shorter seq_len.")
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)  # (char,)
    starts = torch.randint(0, len(text) - seq_len + 1, (n,), generator=_generator(seed))
    tokens = ids[starts[:, None] + torch.arange(seq_len)]  # (prompt, pos)
    return PromptSet(tokens, meta={"kind": "char", "seed": seed, "seq_len": seq_len, "vocab_size": tokenizer.vocab_size})


def check_prompts(prompts: PromptSet, *, n_ctx: int | None = None, d_vocab: int | None = None) -> PromptSet:
    """Raise a clear error for an empty set, prompts longer than `n_ctx`, ids outside [0, d_vocab)."""
    if not isinstance(prompts, PromptSet):
        raise BadType(
            f"expected a PromptSet, got {type(prompts).__name__}; build one with interp.data.random_tokens, "
            "repeated_tokens, text_prompts or pad."
        )
    if len(prompts) == 0 or prompts.n_pos == 0:
        raise ValueError(f"the prompt set is empty (tokens shape {tuple(prompts.tokens.shape)}); pass at least one prompt.")
    _check_n_ctx(prompts, n_ctx)
    if d_vocab is not None:
        # padding ids too: the model embeds every position
        low, high = int(prompts.tokens.min()), int(prompts.tokens.max())
        if low < 0 or high >= d_vocab:
            raise ValueError(
                f"token id {low if low < 0 else high} is outside the model's vocabulary [0, {d_vocab}); "
                "build the prompts with the model's d_vocab or tokenizer."
            )
    return prompts


# ---------------------------------------------------------------------------------------------
# indirect-object identification (Wang et al. 2022), from the toolkit's own lists

IOI_NAMES = ("Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "Mark", "Lisa", "David", "Emma", "Peter", "Laura",
             "Daniel", "Kate", "Michael", "Jane", "Robert", "Susan", "George", "Alice", "Frank", "Helen", "Jack", "Rose",
             "Henry", "Amy", "Sam", "Grace", "Ben", "Lucy", "Adam", "Claire", "Luke", "Ruth", "Eric", "Julia", "Steve",
             "Nancy", "Chris")
IOI_PLACES = ("store", "park", "school", "office", "beach", "station", "market", "hospital", "library", "restaurant",
              "garden", "museum", "church", "cinema", "bank", "airport", "hotel", "zoo", "farm", "party")
IOI_OBJECTS = ("drink", "book", "ball", "gift", "key", "letter", "ring", "bag", "card", "cake", "phone", "hat", "pen",
               "bottle", "box", "coin", "flower", "cup", "toy", "ticket")
# {first} and {second} are the two names of the opening clause, {subject} the one who gives (the other one is the
# indirect object, the answer); one token per slot, so every template has the same length (14 tokens under SmolLM2's)
IOI_TEMPLATES = (
    "When {first} and {second} went to the {place}, {subject} gave a {object} to",
    "After {first} and {second} arrived at the {place}, {subject} handed a {object} to",
    "While {first} and {second} were at the {place}, {subject} passed a {object} to",
    "Once {first} and {second} got to the {place}, {subject} offered a {object} to",
)


def _plain_ids(tokenizer: Any, text: str) -> list[int]:
    """`text`'s ids without special tokens (a Hugging Face tokenizer's add_special_tokens=False; ours add none)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:  # the toolkit's own tokenizers take the text alone
        return list(tokenizer.encode(text))


def single_tokens(tokenizer: Any, words: Sequence[str]) -> tuple[list[str], list[str]]:
    """(words that are one token with a leading space under `tokenizer`, those that are not)."""
    kept = [w for w in words if len(_plain_ids(tokenizer, " " + w)) == 1]
    return kept, [w for w in words if w not in kept]


def ioi_prompts(n: int, seed: int = 0, tokenizer: Any = None, *, corrupted: bool = False) -> PromptSet:
    """`n` indirect-object prompts in the manner of Wang et al. (2022), from the toolkit's own templates and
    name, place and object lists: "When Mary and John went to the store, John gave a drink to" -> " Mary".

    Half the prompts name the indirect object first ("ABBA"), half second ("BABA"), drawn with `seed`. Names,
    places and objects are those of `IOI_NAMES`, `IOI_PLACES`, `IOI_OBJECTS` that are one token with a
    leading space under `tokenizer` (checked here; `meta["dropped"]` lists the others); no chat template, no
    special tokens. `meta["answer"]` and `meta["incorrect"]` are each prompt's token ids of the indirect
    object and of the subject (what `interp.behaviour.logit_difference` reads, through `PromptSet.rows`);
    `meta["positions"]` the token positions of "io", "s1", "s2" and "end" (the last real token); `meta["template"]`
    and `meta["order"]` how each was made. `corrupted=True`: the same draws with the subject's second mention
    and both names of the opening clause replaced by three other names ("ABC", the usual IOI baseline), row
    for row; its answer and incorrect ids are the clean prompts' (what patching from it removes).
    """
    _check_counts(n)
    if tokenizer is None:
        raise BadInput("ioi_prompts needs the model's tokenizer (model.tokenizer, or a Hugging Face tokenizer).")
    tokenizer = getattr(tokenizer, "tokenizer", None) or tokenizer  # a model: its tokenizer
    lists = {}
    dropped: list[str] = []
    for what, words in (("names", IOI_NAMES), ("places", IOI_PLACES), ("objects", IOI_OBJECTS)):
        lists[what], missing = single_tokens(tokenizer, words)
        dropped += missing
    if len(lists["names"]) < 5 or not lists["places"] or not lists["objects"]:
        raise BadInput(f"under this tokenizer too few of the toolkit's names, places and objects are single tokens with a "
                       f"leading space ({len(lists['names'])} names, {len(lists['places'])} places, {len(lists['objects'])} "
                       "objects; at least 5 names and one of each other needed): IOI prompts need one token per slot.")
    generator = _generator(seed)
    rows, meta_rows = [], []
    for _ in range(n):
        names = [lists["names"][int(i)] for i in torch.randperm(len(lists["names"]), generator=generator)[:5]]
        template = int(torch.randint(len(IOI_TEMPLATES), (1,), generator=generator))
        place = lists["places"][int(torch.randint(len(lists["places"]), (1,), generator=generator))]
        thing = lists["objects"][int(torch.randint(len(lists["objects"]), (1,), generator=generator))]
        order = "ABBA" if bool(torch.randint(2, (1,), generator=generator)) else "BABA"
        io, s = names[0], names[1]
        first, second = (io, s) if order == "ABBA" else (s, io)
        subject = s
        if corrupted:
            first, second, subject = names[2], names[3], names[4]
        text = IOI_TEMPLATES[template].format(first=first, second=second, subject=subject, place=place, object=thing)
        rows.append(_plain_ids(tokenizer, text))
        meta_rows.append((io, s, template, order, first, second, subject))
    answers = [_plain_ids(tokenizer, " " + io)[0] for io, *_ in meta_rows]
    incorrect = [_plain_ids(tokenizer, " " + s)[0] for _, s, *_ in meta_rows]
    prompts = pad(rows, pad_id=0, padding_side="right")
    positions = _ioi_positions(tokenizer, rows, meta_rows)
    meta = {**prompts.meta, "kind": "ioi", "seed": seed, "corrupted": corrupted, "answer": answers, "incorrect": incorrect,
            "positions": positions, "template": [m[2] for m in meta_rows], "order": [m[3] for m in meta_rows],
            "dropped": dropped, "io_name": [m[0] for m in meta_rows], "s_name": [m[1] for m in meta_rows]}
    return replace(prompts, meta=meta)


def _ioi_positions(tokenizer: Any, rows: list[list[int]], meta_rows: list[tuple[Any, ...]]) -> dict[str, list[int]]:
    """Per prompt, the positions of the opening clause's names ("io" and "s1": where the indirect object and the
    subject are first named), the subject's second mention ("s2") and the last token ("end")."""
    out: dict[str, list[int]] = {"io": [], "s1": [], "s2": [], "end": []}
    for ids, (_, _, _, order, first, second, subject) in zip(rows, meta_rows):
        first_at = ids.index(_plain_ids(tokenizer, " " + first)[0])
        second_at = ids.index(_plain_ids(tokenizer, " " + second)[0], first_at + 1)
        out["io"].append(first_at if order == "ABBA" else second_at)
        out["s1"].append(second_at if order == "ABBA" else first_at)
        out["s2"].append(len(ids) - 1 - ids[::-1].index(_plain_ids(tokenizer, " " + subject)[0]))
        out["end"].append(len(ids) - 1)
    return out


def prompt_fingerprint(prompts: PromptSet) -> str:
    """A digest of the prompt set's tokens, attention mask and special-token mask (shape and bytes): equal
    content, equal key."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in (prompts.tokens, prompts.attention_mask, prompts.special_mask):
        if tensor is None:
            digest.update(b"none")
            continue
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()
