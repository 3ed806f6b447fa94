"""Prompt sets: seeded, reproducible batches of token ids where one prompt is one unit of statistics.

A `PromptSet` holds `tokens` (n_prompts, pos) and, for padded text, an `attention_mask`
(n_prompts, pos) with 1 for real tokens and 0 for padding. `meta` records how it was made
(kind, seed, prefix length...) so reports can state their methods.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import torch


@dataclass(frozen=True)
class PromptSet:
    tokens: torch.Tensor  # (prompt, pos) long
    attention_mask: torch.Tensor | None = None  # (prompt, pos) 1 = real, 0 = padding
    meta: dict[str, Any] = field(default_factory=dict)  # kind, seed, prefix_len, ...

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.ndim != 2:
            shape = tuple(self.tokens.shape) if isinstance(self.tokens, torch.Tensor) else type(self.tokens).__name__
            raise ValueError(f"PromptSet.tokens must be a (prompt, pos) tensor, got {shape}.")
        if self.tokens.is_floating_point():
            raise TypeError(f"PromptSet.tokens must be integer token ids, got dtype {self.tokens.dtype}.")
        if self.attention_mask is not None and self.attention_mask.shape != self.tokens.shape:
            raise ValueError(
                f"attention_mask shape {tuple(self.attention_mask.shape)} differs from tokens shape "
                f"{tuple(self.tokens.shape)}."
            )

    @property
    def kind(self) -> str:
        return self.meta.get("kind", "tokens")

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index) -> "PromptSet":
        if isinstance(index, int):
            index = slice(index, index + 1)
        mask = None if self.attention_mask is None else self.attention_mask[index]
        return replace(self, tokens=self.tokens[index], attention_mask=mask)

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


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check_counts(n: int, **lengths: int) -> None:
    if n < 1:
        raise ValueError(f"n={n}: a prompt set needs at least one prompt.")
    for name, value in lengths.items():
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1.")


def random_tokens(n: int, seq_len: int, d_vocab: int, *, seed: int = 0, bos: int | None = None) -> PromptSet:
    """`n` prompts of uniformly random token ids (optionally after a fixed BOS token)."""
    _check_counts(n, seq_len=seq_len, d_vocab=d_vocab)
    tokens = torch.randint(0, d_vocab, (n, seq_len), generator=_generator(seed))  # (prompt, pos)
    if bos is not None:
        tokens = torch.cat([torch.full((n, 1), bos), tokens], dim=1)
    return PromptSet(tokens, meta={"kind": "random", "seed": seed, "d_vocab": d_vocab, "bos": bos})


def repeated_tokens(
    n: int, prefix_len: int, d_vocab: int, *, seed: int = 0, bos: int | None = None, n_repeats: int = 2
) -> PromptSet:
    """A random prefix followed by the same prefix again: the induction test (Olsson et al. 2022).

    `meta["prefix_len"]` is the repeat period and `meta["offset"]` the position of the first
    prefix token (1 with a BOS token, else 0): the token at position p >= offset + prefix_len
    repeats the token at p - prefix_len.
    """
    _check_counts(n, prefix_len=prefix_len, d_vocab=d_vocab, n_repeats=n_repeats)
    prefix = torch.randint(0, d_vocab, (n, prefix_len), generator=_generator(seed))  # (prompt, prefix_pos)
    tokens = prefix.repeat(1, n_repeats)  # (prompt, pos)
    if bos is not None:
        tokens = torch.cat([torch.full((n, 1), bos), tokens], dim=1)
    meta = {"kind": "repeated", "seed": seed, "d_vocab": d_vocab, "bos": bos,
            "prefix_len": prefix_len, "offset": 0 if bos is None else 1, "n_repeats": n_repeats}
    return PromptSet(tokens, meta=meta)


def shuffled(prompts: PromptSet, *, seed: int = 0, keep_first: bool | None = None) -> PromptSet:
    """Control: each prompt's tokens in a random order (its own permutation), padding kept in place.

    The bag of tokens is unchanged, so a metric that survives shuffling depends on position,
    not on content. `keep_first` (default: keep it when the set has a BOS token) pins position 0.
    """
    keep_first = prompts.meta.get("bos") is not None if keep_first is None else keep_first
    generator = _generator(seed)
    tokens = prompts.tokens.clone()
    for row in range(len(prompts)):
        real = torch.arange(prompts.n_pos) if prompts.attention_mask is None else prompts.attention_mask[row].nonzero().flatten()
        movable = real[1:] if keep_first else real
        tokens[row, movable] = tokens[row, movable[torch.randperm(len(movable), generator=generator)]]
    meta = {**prompts.meta, "kind": f"shuffled({prompts.kind})", "shuffle_seed": seed}
    return replace(prompts, tokens=tokens, meta=meta)
