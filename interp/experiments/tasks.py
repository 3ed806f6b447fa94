"""Training tasks for the small models, and the measurements their checkpoint cards record.

`InductionTask`: sequences of random tokens in which a random *prefix* of random length is
repeated. A sequence is `[BOS?] [offset random tokens] [prefix] [prefix] [prefix]...` cut to
`n_pos`; the prefix length, the offset and the BOS are drawn anew for every sequence, and some
lengths are held out. Varying them is what makes real induction form: trained on one fixed
prefix length (and position), a 2-layer model can predict the repeats by copying from a fixed
offset instead, and fails on any other length (see `fixed_prefix_task`).

`evaluate_induction` measures a model on prompts `[BOS?] [offset tokens] [prefix] [prefix]`:
the next-token loss on the first and on the second copy (the same L-1 predictions each:
x_1..x_{L-1}), and per head the toolkit's own metrics (`interp.head_types`): the previous-token
score (mean attention from query q to q-1, over q >= 1) and the induction score (mean attention from each
query in the second copy to the tokens after the earlier occurrences of its token, Olsson et al. 2022: the
copy in the first block and any chance repeat before it, as `interp.analyses.induction.scores` counts them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.data import PromptSet, Repeats
from interp.head_types import TargetBatch, get_head_type
from interp.heads import head_label
from interp.models.textcorpus import evaluate_text  # noqa: F401  (lives with the corpus; importable here too)

TASKS = ("induction",)


@dataclass(frozen=True)
class InductionTask:
    """Repeated random tokens with varied prefix length, offset and BOS."""

    d_vocab: int = 64  # token ids are drawn uniformly from [0, d_vocab)
    n_pos: int = 128  # length of every training sequence
    prefix_lens: tuple[int, ...] = tuple(n for n in range(4, 56) if n not in (7, 16, 25, 37, 49))  # drawn uniformly
    held_out_prefix_lens: tuple[int, ...] = (7, 16, 25, 37, 49)  # never trained on; evaluated
    max_offset: int = 16  # random tokens before the first copy: uniform in [0, max_offset]
    bos_token: int | None = -1  # id put at position 0 with probability bos_prob; negative counts from the end
    # of the vocabulary (-1: d_vocab - 1); the id also occurs as an ordinary token
    bos_prob: float = 0.5
    distinct_prefix: bool = False  # draw a prefix's tokens without replacement (no token twice in one copy):
    # a token then has one earlier occurrence to match, so matching the previous token alone is exact and
    # blurring the previous-token head over neighbours (to match bigrams against chance repeats) buys nothing

    def __post_init__(self) -> None:
        if not self.prefix_lens:
            raise ValueError("prefix_lens is empty; give at least one prefix length to train on.")
        overlap = sorted(set(self.prefix_lens) & set(self.held_out_prefix_lens))
        if overlap:
            raise ValueError(f"prefix lengths {overlap} are both trained on and held out; remove them from one.")
        longest = 1 + self.max_offset + 2 * max(self.prefix_lens)
        if longest > self.n_pos:
            raise ValueError(
                f"n_pos={self.n_pos} cannot hold two copies of the longest prefix ({max(self.prefix_lens)}) "
                f"after BOS and max_offset={self.max_offset} tokens (needs {longest}); lower them or raise n_pos."
            )
        if self.bos_token is not None and self.bos_token < 0:
            object.__setattr__(self, "bos_token", self.d_vocab + self.bos_token)
        if self.bos_token is not None and not 0 <= self.bos_token < self.d_vocab:
            raise ValueError(f"bos_token={self.bos_token} is outside the vocabulary [0, {self.d_vocab}).")
        if not 0.0 <= self.bos_prob <= 1.0:
            raise ValueError(f"bos_prob={self.bos_prob} must be a probability in [0, 1].")
        if self.distinct_prefix and max(self.prefix_lens) > self.d_vocab:
            raise ValueError(f"distinct_prefix=True needs d_vocab >= the longest prefix ({max(self.prefix_lens)}), "
                             f"got d_vocab={self.d_vocab}; shorten the prefixes or set distinct_prefix=False.")

    def sample(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """A (batch, n_pos) batch of token ids; deterministic given the generator's state."""
        lens = torch.tensor(self.prefix_lens)[torch.randint(len(self.prefix_lens), (batch_size,), generator=generator)]
        offsets = torch.randint(0, self.max_offset + 1, (batch_size,), generator=generator)
        has_bos = torch.rand(batch_size, generator=generator) < self.bos_prob
        noise = torch.randint(0, self.d_vocab, (batch_size, self.n_pos), generator=generator)  # (batch, pos)
        # (batch, d_vocab): a random order of the vocabulary per row, the source of distinct prefixes
        order = torch.rand(batch_size, self.d_vocab, generator=generator).argsort(-1) if self.distinct_prefix else None
        tokens = noise.clone()
        pos = torch.arange(self.n_pos)
        for row in range(batch_size):
            start = int(offsets[row]) + int(has_bos[row] and self.bos_token is not None)
            prefix_len = int(lens[row])
            repeats = pos[start:]
            # from `start` on, the token at p repeats the one at start + (p - start) % prefix_len
            source = noise[row, start:] if order is None else order[row]  # the prefix is source[:prefix_len]
            tokens[row, repeats] = source[(repeats - start) % prefix_len]
            if start > int(offsets[row]) and self.bos_token is not None:  # the first test implies the second
                tokens[row, 0] = self.bos_token
        return tokens

    def to_dict(self) -> dict:
        return {"task": "induction", "d_vocab": self.d_vocab, "n_pos": self.n_pos,
                "prefix_lens": list(self.prefix_lens), "held_out_prefix_lens": list(self.held_out_prefix_lens),
                "max_offset": self.max_offset, "bos_token": self.bos_token, "bos_prob": self.bos_prob,
                "distinct_prefix": self.distinct_prefix}


def fixed_prefix_task(prefix_len: int, d_vocab: int = 64, bos_token: int | None = -1) -> InductionTask:
    """The control: always BOS + prefix + prefix, one length, no offset (the setting that fools)."""
    return InductionTask(d_vocab=d_vocab, n_pos=1 + 2 * prefix_len, prefix_lens=(prefix_len,),
                         held_out_prefix_lens=(), max_offset=0, bos_token=bos_token,
                         bos_prob=1.0 if bos_token is not None else 0.0)


def repeated_prompts(n: int, prefix_len: int, d_vocab: int, *, offset: int = 0, bos: int | None = None,
                     seed: int = 0) -> tuple[torch.Tensor, int]:
    """`[bos?] [offset random tokens] [prefix] [prefix]` as (n, pos), and where the first copy starts."""
    if n < 1 or prefix_len < 2 or offset < 0:
        raise ValueError(f"need n >= 1, prefix_len >= 2 and offset >= 0; got n={n}, prefix_len={prefix_len}, offset={offset}.")
    generator = torch.Generator().manual_seed(seed)
    filler = torch.randint(0, d_vocab, (n, offset), generator=generator)
    prefix = torch.randint(0, d_vocab, (n, prefix_len), generator=generator)
    parts = ([torch.full((n, 1), bos)] if bos is not None else []) + [filler, prefix, prefix]
    start = offset + (bos is not None)
    return torch.cat(parts, dim=1), start


@torch.no_grad()
def evaluate_induction(model, prefix_len: int, *, offset: int = 0, bos: int | None = None,
                       n: int = 64, seed: int = 1234, d_vocab: int | None = None) -> dict:
    """Losses on the first and second copy, and per-head previous-token and induction scores.

    Returns {"prefix_len", "offset", "bos", "loss_first", "loss_second",
    "prev_token": {"L0H0": ...}, "induction": {...}}.
    """
    d_vocab = d_vocab or model.cfg.d_vocab
    tokens, start = repeated_prompts(n, prefix_len, d_vocab, offset=offset, bos=bos, seed=seed)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"prompts of {tokens.shape[1]} tokens exceed n_ctx={model.cfg.n_ctx}; "
                         "lower prefix_len or offset.")
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    per = model.loss(logits, tokens, per_token=True)  # (n, pos - 1): per[:, p] predicts token p + 1
    first = per[:, start : start + prefix_len - 1]  # predicting x_1 .. x_{L-1} of the first copy
    second = per[:, start + prefix_len : start + 2 * prefix_len - 1]  # ... of the second copy
    prompts = PromptSet(tokens, repeats=Repeats(period=prefix_len, offset=start, n_repeats=2))
    scores = head_scores([cache[name] for name in names], prompts, ("previous_token", "induction"))
    prev, induction = ({label: round(value, 4) for label, value in scores[kind].items()}
                       for kind in ("previous_token", "induction"))
    return {"prefix_len": prefix_len, "offset": offset, "bos": bos,
            "loss_first": round(float(first.mean()), 4), "loss_second": round(float(second.mean()), 4),
            "prev_token": prev, "induction": induction}


def head_scores(patterns: list[torch.Tensor], prompts: PromptSet, kinds: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """{kind: {"L0H0": score}}: each head type's metric (`interp.head_types`), averaged over the prompts
    that have a query it scores. patterns: one (prompt, head, query, key) tensor per layer."""
    batch = TargetBatch.from_prompts(prompts)
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        head_type = get_head_type(kind)
        per_layer = [head_type.metric_values(pattern, batch).nanmean(0) for pattern in patterns]  # (head,) each
        out[kind] = {head_label((layer, head)): float(score) for layer, scores in enumerate(per_layer)
                     for head, score in enumerate(scores.tolist())}
    return out


# ---------------------------------------------------------------- natural text (bytes of the Python stdlib)

TEXT_TASKS = ("stdlib-bytes",)


@dataclass(frozen=True)
class TextTask:
    """Next-byte prediction on random windows of a corpus's training stream (`interp.models.textcorpus`)."""

    train_stream: torch.Tensor  # (n_bytes,) ids in [0, 256): the training files joined by NUL
    n_pos: int = 256  # window length
    d_vocab: int = 256  # byte values

    def __post_init__(self) -> None:
        if self.train_stream.ndim != 1 or self.train_stream.numel() <= self.n_pos:
            raise ValueError(f"train_stream must be a 1-D stream longer than n_pos={self.n_pos}; "
                             f"got shape {tuple(self.train_stream.shape)}.")

    def sample(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """A (batch, n_pos) batch of windows at random offsets; deterministic given the generator's state."""
        from interp.models.textcorpus import random_windows

        return random_windows(self.train_stream, batch_size, self.n_pos, generator)

    def to_dict(self) -> dict:
        return {"task": "stdlib-bytes", "n_pos": self.n_pos, "d_vocab": self.d_vocab,
                "n_train_bytes": int(self.train_stream.numel()), "sampling": "uniform random window offsets"}

