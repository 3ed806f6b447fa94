"""Train `stdlib-bpe`: a small attention-only model of Python source in which induction heads form.

    OMP_NUM_THREADS=1 interp train stdlib-bpe train --corpus stdlib-with-tests --steps 36000 --decay-steps 36000
        --minutes 85 --n-ctx 256 --batch-size 4 --lr 2e-3 --n-layers 3 --eval-every 1000 --out runs/stdlib-bpe  (one line)

(the shipped recipe; its card has the command that made it) reads the standard library's source
(`interp.models.textcorpus`: the corpus of `stdlib-bytes`, or with `--corpus stdlib-with-tests` its tests too), trains a
byte-level BPE tokenizer on the training files (`tokenizers`, already installed with transformer-lens),
then trains the model on windows of the token stream, timing a few steps first and refusing a run
whose estimate exceeds `--max-minutes`. Every `--eval-every` steps it measures the model on held-out
probes (`track`) and keeps a snapshot, so the run records when the induction heads formed. Every flag is
checked before the corpus is read (exit 2, nothing written); `--out` must be absent or empty, or hold an
earlier run that `--force` replaces (its own files only: `earlier_run_files`), so two runs never mix.

Why BPE and not bytes or whole identifiers: Aoyama et al. (2025) find that induction heads form when a
bigram that recurs in the context is reliably followed by the same token. On the held-out stdlib, at a
context of 512 tokens, the next token after the latest earlier occurrence of the current token is the
right one for 0.43-0.46 of the repeated positions with a 2,048-piece BPE, 0.29-0.31 with whole
identifiers (regex pieces) and 0.41 with bytes, and BPE repeats reach furthest back in the text.

Why three attention-only layers and not two: in every 2-layer run on this corpus (rotary or learned
positions, 4 or 8 heads, with or without planted copies, up to 2.3e7 tokens here and 6.7e7 in an earlier
session) the layer-0 heads became self / bag-of-tokens heads and the previous-token head formed in layer 1,
the last layer, where no later head can read it; no induction head formed. With a third layer, the
previous-token head of layer 1 feeds an induction head in layer 2 (the pilots and the curve are in the card).

Why the standard library's tests too (`--corpus stdlib-with-tests`): on the modules alone (3.1M training
tokens) the same recipe formed its induction head after 7.7e6 tokens, and its copy ratio (second copy of a
held-out span over the first) stalled near 0.61 while the training loss drew away from the held-out loss, six
epochs in. The tests triple the tokens (9.5M), and they repeat longer spans more often and more reliably:
after a repeated 4-token prefix the next token is the one that followed it before in 0.79 of cases in the
test files against 0.70 in the modules, and such repeats are half again as frequent (0.245 of positions
against 0.158: the card's table, `repetition`). With them the head formed after 3.1e6 tokens and the copy
ratio reached 0.42 (the card).

`track` measures with the toolkit's own head types (`interp.head_types`: previous-token, induction on
natural repeats, and a variant of induction counting only earlier occurrences 16 or more tokens back), and the
card's intervals are `interp.stats`' percentile bootstrap. `interp train stdlib-bpe ...` runs `main` (the console
script's subcommand; `python -m interp.experiments.stdlib_bpe` too).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, get_args

import torch

from interp.data import PromptSet
from interp.head_types import HeadType, TargetBatch, get_head_type
from interp.models.arguments import real, whole
from interp.models.config import GPTConfig, PosEmbedType
from interp.models.files import remove_files, write_atomic
from interp.models.gpt import HookedGPT
from interp.models.io import read_checkpoint_config, save_checkpoint
from interp.models.textcorpus import CORPORA, SEPARATOR, TextCorpus, eval_windows, named_corpus, random_windows
from interp.models.tokenizers import BPETokenizer, train_bpe
from interp.stats import bootstrap, ratio_bootstrap

NAME = "stdlib-bpe"
PROG = "interp train stdlib-bpe"  # the command a run records (`interp.cli`'s subcommand)
SEPARATOR_TOKEN = "<|file|>"  # id 0: joins files, as the NUL byte does in stdlib-bytes
MIN_VOCAB = 257  # the 256 bytes and the separator
MIN_CTX = 24  # the probes (`Probes.build`) score positions [1, 12) against [n_ctx - 12, n_ctx - 2)


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the trained weights (with the corpus and the thread count)."""

    vocab_size: int = 2048  # BPE pieces, the separator included
    n_ctx: int = 512
    batch_size: int = 4
    lr: float = 1e-3  # peak AdamW learning rate, after a linear warm-up
    warmup_steps: int = 200
    decay_steps: int = 0  # cosine decay to a tenth of `lr` by this step (0: constant after the warm-up)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 3
    init_range: float = 0.02
    positional_embedding_type: str = "rotary"
    copy_fraction: float = 0.0  # windows given a planted copy of one of their own spans (0: natural text only)
    copy_max: float = 0.25  # longest planted span, as a fraction of the window (spans are 8 tokens or longer)
    qk_bias_init: float = 0.0  # std of the query and key biases at init (0: zeros, HookedGPT's default)
    seed: int = 0
    corpus: str = "stdlib"  # which files: a key of textcorpus.CORPORA ("stdlib-with-tests" adds the stdlib's tests)

    def __post_init__(self) -> None:
        """Each field in the range its command-line flag accepts (`RECIPE_TYPES`, `CHOICES`): ValueError naming it."""
        for name, value in asdict(self).items():
            allowed = CHOICES.get(name)
            try:
                if isinstance(value, bool):
                    raise argparse.ArgumentTypeError("a bool is not a recipe value")
                if allowed is not None and value not in allowed:
                    raise argparse.ArgumentTypeError(f"{value!r} is not one of {allowed}")
                RECIPE_TYPES[name](str(value))
            except argparse.ArgumentTypeError as error:
                raise ValueError(f"Recipe {name}={value!r}: {error}.") from None

    def build(self, d_vocab: int) -> HookedGPT:
        """The model at initialisation. With `qk_bias_init`, the query and key biases start random: under rotary
        positions the bias-bias term is the only content-free (purely positional) part of a layer-0 score, and
        with both biases at zero its gradient is zero too, so a layer-0 previous-token head must climb out of a
        saddle; random biases remove it."""
        model = HookedGPT(self.model_config(d_vocab))
        if self.qk_bias_init:
            generator = torch.Generator().manual_seed(self.seed + 2)
            with torch.no_grad():
                for block in model.blocks:
                    for bias in (block.attn.b_Q, block.attn.b_K):
                        bias.copy_(torch.randn(bias.shape, generator=generator) * self.qk_bias_init)
        return model

    def model_config(self, d_vocab: int) -> GPTConfig:
        return GPTConfig(n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model, n_ctx=self.n_ctx,
                         d_vocab=d_vocab, attn_only=True, normalization_type="LN",
                         positional_embedding_type=self.positional_embedding_type,  # type: ignore[arg-type]
                         init_range=self.init_range, seed=self.seed, model_name=NAME)


# ---------------------------------------------------------------- the token streams


@dataclass(frozen=True)
class TokenCorpus:
    """The corpus as token streams, files joined by the separator token."""

    tokenizer: BPETokenizer
    train: torch.Tensor  # (n_train_tokens,) long
    held_out: torch.Tensor  # (n_held_out_tokens,) long
    corpus: TextCorpus

    def summary(self) -> dict:
        return {**self.corpus.summary(), "tokenizer_sha256": self.tokenizer.sha256, "d_vocab": self.tokenizer.vocab_size,
                "n_train_tokens": int(self.train.numel()), "n_held_out_tokens": int(self.held_out.numel()),
                "held_out_tokens_per_byte": self.held_out_tokens_per_byte}

    @property
    def held_out_tokens_per_byte(self) -> float:
        return float(self.held_out.numel() / len(self.corpus.held_out))


def encode_stream(tokenizer: BPETokenizer, data: bytes) -> torch.Tensor:
    """Files of `data` (joined by SEPARATOR) as one token stream joined by the separator token."""
    separator = tokenizer.token_id(SEPARATOR_TOKEN)
    files = [f.decode("utf-8", errors="replace") for f in data.split(SEPARATOR)]
    pieces: list[int] = []
    for i, ids in enumerate(tokenizer.encode_batch(files)):
        if i:
            pieces.append(separator)
        pieces.extend(ids)
    return torch.tensor(pieces, dtype=torch.long)


def token_corpus(vocab_size: int, corpus: TextCorpus | None = None, tokenizer: BPETokenizer | None = None, *,
                 corpus_name: str = "stdlib") -> TokenCorpus:
    """Read the corpus (`corpus`, or the one `corpus_name` names), train (or reuse) the tokenizer on the training
    files, and encode both splits."""
    corpus = corpus or named_corpus(corpus_name)
    if tokenizer is None:
        files = [f.decode("utf-8", errors="replace") for f in corpus.train.split(SEPARATOR)]
        tokenizer = train_bpe(files, vocab_size, special_tokens=[SEPARATOR_TOKEN])
    return TokenCorpus(tokenizer, encode_stream(tokenizer, corpus.train), encode_stream(tokenizer, corpus.held_out), corpus)


def plant_copies(windows: torch.Tensor, fraction: float, generator: torch.Generator, longest: float = 0.25) -> torch.Tensor:
    """A copy of `windows` where a `fraction` of rows repeat one of their own spans (8 tokens to `longest` of
    the row) later in the row, overwriting what was there; the rest untouched. Only for the planted variant."""
    out = windows.clone()
    n_rows, n_pos = windows.shape
    if not 0 < longest <= 0.5 or int(n_pos * longest) < 8:
        raise ValueError(f"longest={longest}: a planted span is 8 to n_pos * longest tokens and must fit twice in "
                         f"{n_pos} positions; expected 8 / n_pos <= longest <= 0.5.")
    chosen = torch.rand(n_rows, generator=generator) < fraction
    for row in chosen.nonzero().flatten().tolist():
        length = int(torch.randint(8, int(n_pos * longest) + 1, (1,), generator=generator))
        source = int(torch.randint(0, max(1, n_pos - 2 * length), (1,), generator=generator))
        target = int(torch.randint(source + length, n_pos - length + 1, (1,), generator=generator))
        out[row, target : target + length] = windows[row, source : source + length]
    return out


def clean_windows(stream: torch.Tensor, n: int, n_pos: int, separator: int, seed: int) -> torch.Tensor:
    """(n, n_pos) windows inside one file each, at seeded random offsets."""
    is_separator = torch.cat([torch.zeros(1, dtype=torch.long), (stream == separator).long().cumsum(0)])
    starts = torch.arange(stream.numel() - n_pos + 1)
    starts = starts[is_separator[starts + n_pos] == is_separator[starts]]
    if starts.numel() == 0:
        raise ValueError(f"no window of {n_pos} tokens lies inside one file.")
    chosen = starts[torch.randint(0, starts.numel(), (n,), generator=torch.Generator().manual_seed(seed))]
    return stream[chosen[:, None] + torch.arange(n_pos)]


def repeated_spans(stream: torch.Tensor, n: int, span: int, offset: int, separator: int, seed: int) -> torch.Tensor:
    """(n, offset + 2 span): `offset` tokens of held-out text, a held-out span, the same span again. The
    copy is made at measurement time, never in training: the second copy is predictable only by looking back."""
    before = clean_windows(stream, n, max(offset, 2), separator, seed)[:, :offset]
    spans = clean_windows(stream, n, span, separator, seed + 1)
    return torch.cat([before, spans, spans], dim=1)


# ---------------------------------------------------------------- measurements while training


@dataclass(frozen=True)
class Probes:
    """Held-out prompts measured at every snapshot."""

    natural: torch.Tensor  # (n, n_ctx) windows of held-out files
    repeated: torch.Tensor  # (n, offset + 2 span) held-out span repeated
    offset: int
    span: int
    early: tuple[int, int]  # ICL score positions: mean loss on tokens [late) minus [early)
    late: tuple[int, int]

    @classmethod
    def build(cls, held_out: torch.Tensor, n_ctx: int, separator: int, n: int = 64, seed: int = 7) -> "Probes":
        span = n_ctx // 4
        offset = n_ctx - 2 * span
        early = (max(1, n_ctx // 20), max(2, n_ctx // 20) + 10)
        late = (n_ctx - 12, n_ctx - 2)
        return cls(clean_windows(held_out, n, n_ctx, separator, seed), repeated_spans(held_out, n, span, offset, separator, seed + 100),
                   offset, span, early, late)


FAR = 16  # `induction_far`: only earlier occurrences at least this far back count


def far_induction_target(batch: TargetBatch) -> torch.Tensor:
    """The induction target (the token after an earlier occurrence of the query's token) for occurrences at
    least `FAR` tokens back: a control against previous-token and local heads."""
    occurrences = batch.occurrences.tril(diagonal=-FAR)  # (batch, query, key)
    target = torch.zeros_like(occurrences)
    target[..., 1:] = occurrences[..., :-1]
    return target & batch.real[:, None, :]


# not registered: a column of the training curve only, never a claim kind
INDUCTION_FAR = HeadType("induction_far", "{label} attends to the token after an earlier occurrence at least 16 back",
                         far_induction_target, needs="repeats", shuffle="drop", argmax=False,
                         queries=lambda batch: far_induction_target(batch).any(-1))
TRACKED = (("induction", get_head_type("induction")), ("induction_far", INDUCTION_FAR),
           ("previous_token", get_head_type("previous_token")))


def tracked_scores(pattern: torch.Tensor, batch: TargetBatch) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> {"induction", "induction_far", "previous_token": (batch, head)}: the
    head types' metrics per window, NaN where a window has no query the type scores."""
    return {key: head_type.metric_values(pattern, batch) for key, head_type in TRACKED}


@torch.no_grad()
def track(model: HookedGPT, probes: Probes, batch_size: int = 16) -> dict:
    """Held-out loss, ICL score, copy gap and the best previous-token / induction heads, for the loss curve."""
    row: dict = {}
    names = lambda name: name.endswith("hook_pattern")  # noqa: E731
    losses, scores = [], []
    for start in range(0, probes.natural.shape[0], batch_size):
        tokens = probes.natural[start : start + batch_size]
        per_token, cache = model.run_with_cache(tokens, return_type="loss", loss_per_token=True, names_filter=names)
        losses.append(per_token)
        batch = TargetBatch.from_prompts(PromptSet(tokens))  # natural repeats of single tokens
        layers = [tracked_scores(cache[f"blocks.{layer}.attn.hook_pattern"], batch) for layer in range(model.cfg.n_layers)]
        scores.append({key: torch.stack([layer[key] for layer in layers], 1) for key, _ in TRACKED})  # (window, layer, head)
    per_token = torch.cat(losses)  # (n, pos - 1): column i predicts token i + 1
    row["held_out_nats"] = float(per_token.mean())
    row["icl_score"] = float(per_token[:, probes.late[0] - 1 : probes.late[1] - 1].mean()
                             - per_token[:, probes.early[0] - 1 : probes.early[1] - 1].mean())
    for key, _ in TRACKED:
        per_head = torch.cat([batch_scores[key] for batch_scores in scores]).nanmean(0)  # (layer, head)
        best = int(per_head.argmax())
        row[key] = round(float(per_head.max()), 4)
        row[f"{key}_head"] = "L%dH%d" % divmod(best, per_head.shape[1])
    row.update(copy_loss_summary(model, probes))
    return row


def per_token_losses(model: HookedGPT, tokens: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """(n, pos - 1) next-token losses of `tokens`, batch by batch; column i predicts token i + 1."""
    with torch.no_grad():
        return torch.cat([model(tokens[i : i + batch_size], return_type="loss", loss_per_token=True)
                          for i in range(0, tokens.shape[0], batch_size)])


def copy_per_prompt(model: HookedGPT, probes: Probes, batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second): per repeated span, the mean loss on each copy's tokens after its first, float64."""
    a, b = probes.offset, probes.offset + probes.span
    per_token = per_token_losses(model, probes.repeated, batch_size).double()
    return per_token[:, a : b - 1].mean(-1), per_token[:, b : b + probes.span - 1].mean(-1)


def copy_loss_summary(model: HookedGPT, probes: Probes, batch_size: int = 16) -> dict:
    """Mean loss on the first and the second copy of the repeated held-out spans, and their ratio."""
    first, second = (float(copy.mean()) for copy in copy_per_prompt(model, probes, batch_size))
    return {"copy_first": first, "copy_second": second, "copy_ratio": second / first}


# ---------------------------------------------------------------- training


def estimate_budget(recipe: Recipe, data: TokenCorpus, minutes: float, *, timed_steps: int = 20) -> dict:
    """Time a few steps on a throw-away model (the real run's weights and batches are untouched) and
    say what `minutes` of training buys: seconds per step, steps and tokens."""
    model = recipe.build(data.tokenizer.vocab_size).train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    began = 0.0
    for step in range(timed_steps + 2):
        if step == 2:  # the first steps allocate
            began = time.perf_counter()
        loss = model(random_windows(data.train, recipe.batch_size, recipe.n_ctx, generator), return_type="loss")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
    seconds = (time.perf_counter() - began) / timed_steps
    steps = int(minutes * 60 / seconds)
    return {"seconds_per_step": seconds, "timed_steps": timed_steps, "minutes": minutes, "steps": steps,
            "tokens": steps * recipe.batch_size * recipe.n_ctx}


def recipe_learning_rate(step: int, recipe: Recipe) -> float:
    """Linear warm-up, then constant, or a cosine down to lr / 10 at `decay_steps` (and held there)."""
    if step < recipe.warmup_steps or not recipe.decay_steps:
        return recipe.lr * min(1.0, (step + 1) / recipe.warmup_steps)
    progress = min(1.0, (step - recipe.warmup_steps) / max(1, recipe.decay_steps - recipe.warmup_steps))
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_recipe(recipe: Recipe, data: TokenCorpus, *, minutes: float, out: Path, eval_every: int = 1000,
          max_minutes: float = 90.0, steps: int | None = None, log=print) -> HookedGPT:
    """Train for `minutes` of training time (evaluation excluded) or exactly `steps` steps if given (what
    reproduces a run: its steps are recorded), a snapshot and a log row every `eval_every` steps and at
    the end under `out/`; refuses when `minutes` exceeds `max_minutes`."""
    if minutes > max_minutes:
        raise ValueError(f"--minutes {minutes} of training exceeds --max-minutes {max_minutes} (the CPU budget); "
                         "ask for less, or raise --max-minutes knowingly.")
    if (steps is not None and steps < 0) or eval_every < 1 or not math.isfinite(minutes) or minutes <= 0:
        raise ValueError(f"steps={steps} must be None or >= 0, eval_every={eval_every} >= 1 and minutes={minutes} a "
                         "finite number above 0.")
    torch.manual_seed(recipe.seed)
    model = recipe.build(data.tokenizer.vocab_size).train()
    separator = data.tokenizer.token_id(SEPARATOR_TOKEN)
    probes = Probes.build(data.held_out, recipe.n_ctx, separator)
    optimiser = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=recipe.weight_decay)
    generator = torch.Generator().manual_seed(recipe.seed)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    train_seconds, step = 0.0, 0
    recent: list[float] = []
    while True:
        done = step == steps if steps is not None else train_seconds >= minutes * 60
        if step % eval_every == 0 or done:
            model.eval()
            row = {"step": step, "tokens": step * recipe.batch_size * recipe.n_ctx, "train_seconds": round(train_seconds, 1),
                   "train_nats": round(sum(recent) / len(recent), 4) if recent else None, **track(model, probes)}
            model.train()
            recent = []
            rows.append(row)
            write_atomic(out / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
            log(json.dumps(row))
            save_checkpoint(model, out / f"step{step:06d}", {"recipe": asdict(recipe), "row": row})
            if done:
                return model.eval()
        began = time.perf_counter()
        for group in optimiser.param_groups:
            group["lr"] = recipe_learning_rate(step, recipe)
        tokens = random_windows(data.train, recipe.batch_size, recipe.n_ctx, generator)
        if recipe.copy_fraction:
            tokens = plant_copies(tokens, recipe.copy_fraction, generator, recipe.copy_max)
        loss = model(tokens, return_type="loss")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimiser.step()
        recent.append(loss.item())
        train_seconds += time.perf_counter() - began
        step += 1


RUN_FILE = re.compile(r"^(run\.json|tokenizer\.json|log\.jsonl|step\d{6}\.(json|safetensors))$")  # what `train` writes


def earlier_run_files(out: Path, force: bool) -> list[Path]:
    """The files of an earlier run in `out` that `--force` replaces (none when `out` is absent or empty); ValueError
    when `out` is a file, holds an earlier run without --force (two runs would mix: its later snapshots would stay
    beside the new run's log and tokenizer), or holds anything a run does not write."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder for the run's snapshots (absent or empty).")
    if not out.exists():
        return []
    entries = sorted(out.iterdir())
    foreign = [e.name for e in entries if e.is_symlink() or not e.is_file() or not RUN_FILE.match(e.name)]
    if entries and not force:
        raise ValueError(f"--out {out} is not empty ({len(entries)} entries, e.g. {', '.join(e.name for e in entries[:3])}): "
                         "a new run there would mix with the earlier one. Pass --force to replace an earlier run (its "
                         "snapshots, log, tokenizer and run.json are deleted first), or choose another folder.")
    if foreign:
        raise ValueError(f"--out {out} holds files no training run writes ({', '.join(foreign[:5])}); --force replaces "
                         "only a run's own files and never deletes yours: move them away, or choose another folder.")
    return entries


# ---------------------------------------------------------------- the shipped checkpoint and its card


def token_ngram_bits(train: torch.Tensor, windows: torch.Tensor, vocab_size: int) -> dict:
    """Add-one unigram and bigram bits per token, fitted on the training tokens, on the predicted
    positions of `windows` (every token after the first of each window)."""
    unigram = torch.bincount(train, minlength=vocab_size).double()
    bigram = torch.bincount(train[:-1] * vocab_size + train[1:], minlength=vocab_size**2).double().view(vocab_size, vocab_size)
    log_unigram = torch.log2((unigram + 1) / (unigram.sum() + vocab_size))
    log_bigram = torch.log2((bigram + 1) / (bigram.sum(-1, keepdim=True) + vocab_size))
    previous, target = windows[:, :-1].flatten(), windows[:, 1:].flatten()
    return {"unigram_bits_per_token": float(-log_unigram[target].mean()),
            "bigram_bits_per_token": float(-log_bigram[previous, target].mean())}


# the card's 95% intervals over prompts: interp.stats' percentile bootstrap (the method its numbers always used)
BOOTSTRAP: dict[str, Any] = {"n_resamples": 2000, "seed": 0, "method": "percentile"}


def _interval(low: torch.Tensor, high: torch.Tensor) -> tuple[float, float]:
    return float(low), float(high)


@torch.no_grad()
def held_out_figures(model: HookedGPT, data: TokenCorpus, *, n_windows: int = 1024, n_repeats: int = 256,
                     batch_size: int = 32) -> dict:
    """What the card states about the model on held-out text: bits per token and per byte against unigram
    and bigram baselines, the in-context learning score with its positions, and the copy gap of repeated spans."""
    n_ctx = model.cfg.n_ctx
    windows = eval_windows(data.held_out, n_ctx, n_windows)
    per_token = per_token_losses(model, windows, batch_size).double()  # (window, pos - 1)
    bits = float(per_token.mean()) / math.log(2)
    baselines = token_ngram_bits(data.train, windows, data.tokenizer.vocab_size)
    per_byte = data.held_out_tokens_per_byte
    separator = data.tokenizer.token_id(SEPARATOR_TOKEN)
    probes = Probes.build(data.held_out, n_ctx, separator, n=n_repeats, seed=11)
    natural = per_token_losses(model, probes.natural, batch_size).double()
    late = natural[:, probes.late[0] - 1 : probes.late[1] - 1].mean(-1) - natural[:, probes.early[0] - 1 : probes.early[1] - 1].mean(-1)
    first, second = copy_per_prompt(model, probes, batch_size)
    return {
        "n_windows": int(windows.shape[0]), "n_predicted": int(per_token.numel()),
        "bits_per_token": bits, "bits_per_byte": bits * per_byte, "held_out_tokens_per_byte": per_byte,
        "unigram_bits_per_byte": baselines["unigram_bits_per_token"] * per_byte,
        "bigram_bits_per_byte": baselines["bigram_bits_per_token"] * per_byte, **baselines,
        "icl_score": float(late.mean()), "icl_ci": _interval(*bootstrap(late, **BOOTSTRAP)[1:]), "icl_n_windows": n_repeats,
        "icl_early_tokens": list(probes.early), "icl_late_tokens": list(probes.late),
        "copy_first": float(first.mean()), "copy_second": float(second.mean()),
        "copy_ratio": float(second.mean() / first.mean()),
        "copy_ratio_ci": _interval(*ratio_bootstrap(second, first, **BOOTSTRAP)[1:]), "copy_n_prompts": n_repeats,
        "copy_span": probes.span, "copy_offset": probes.offset,
    }


def repeat_reliability(windows: torch.Tensor, k: int) -> dict:
    """How often and how reliably copying predicts the next token: at each position whose last `k` tokens
    occurred earlier in its window, whether the next token is the one that followed their latest earlier
    occurrence. `reliability`: the fraction right; `share`: such positions among all predicted ones.
    Aoyama et al. (2025) find that frequent, reliable repeats favour the formation of induction heads."""
    hits = repeats = 0
    for window in windows.tolist():  # (n_ctx,) ids
        latest: dict[tuple[int, ...], int] = {}
        for i in range(k - 1, len(window) - 1):
            key = tuple(window[i - k + 1 : i + 1])
            if key in latest:
                repeats += 1
                hits += window[latest[key] + 1] == window[i + 1]
            latest[key] = i
    return {"k": k, "reliability": hits / max(repeats, 1), "share": repeats / (windows.shape[0] * (windows.shape[1] - 1))}


TEST_FOLDERS = tuple(sorted(set(CORPORA["stdlib"]) - set(CORPORA["stdlib-with-tests"])))  # test, tests, idlelib


def repetition(data: TokenCorpus, n_ctx: int, *, max_windows: int = 2000, ks: Sequence[int] = (1, 2, 4)) -> list[dict]:
    """`repeat_reliability` on windows of the training files, for the standard library's modules and (when the
    corpus has them) its tests apart: what the training stream offers an induction head."""
    separator = data.tokenizer.token_id(SEPARATOR_TOKEN)
    files = torch.tensor_split(data.train, (data.train == separator).nonzero().flatten().tolist())  # each after the first opens with the separator
    groups: dict[str, list[torch.Tensor]] = {"modules": [], "tests": []}
    for name, tokens in zip(data.corpus.train_files, files):
        groups["tests" if any(part in TEST_FOLDERS for part in name.split("/")[:-1]) else "modules"].append(tokens)
    rows = []
    for group, pieces in groups.items():
        if pieces:
            windows = eval_windows(torch.cat(pieces), n_ctx, max_windows)
            rows += [{"files": group, "n_files": len(pieces), **repeat_reliability(windows, k)} for k in ks]
    return rows


def read_log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]


def formation_step(rows: list[dict], threshold: float = 0.5) -> dict | None:
    """The first snapshot whose best natural induction score passes `threshold`, or None."""
    return next((r for r in rows if r["induction"] >= threshold), None)


def finish(run: Path, out: Path, *, step: int | None = None, pilots: Sequence[Path] = (), variants: Sequence[Path] = (),
           earlier: dict | None = None, opening_minutes: float | None = None) -> Path:
    """Measure the run's last (or `step`) snapshot on held-out text and save it as the shipped checkpoint
    `out` (NAME.safetensors + NAME.json, the tokenizer in its metadata) with its card NAME.md. `earlier`, the
    metadata of a checkpoint this one replaces, carries its pilots and other runs into the card, with the run
    it shipped as one of them (their folders need not exist any more); `opening_minutes` adds the run's own
    opening as a pilot (`opening_pilot`)."""
    from interp.models.io import load_checkpoint

    info = json.loads((run / "run.json").read_text())
    rows = read_log(run)
    chosen = rows[-1] if step is None else next(r for r in rows if r["step"] == step)
    snapshot = run / f"step{chosen['step']:06d}"
    model = load_checkpoint(snapshot)
    tokenizer = BPETokenizer((run / "tokenizer.json").read_text())
    data = token_corpus(tokenizer.vocab_size, tokenizer=tokenizer, corpus_name=Recipe(**info["recipe"]).corpus)
    if data.corpus.checksum != info["corpus"]["checksum"]:
        raise ValueError(f"the corpus found (checksum {data.corpus.checksum[:12]}...) is not the run's "
                         f"({info['corpus']['checksum'][:12]}...): finish the run on the machine that trained it.")
    metadata = {
        "task": {"task": NAME}, "recipe": info["recipe"], "corpus": info["corpus"], "threads": info["threads"],
        "torch": info["torch"], "machine": info["machine"], "command": " ".join([PROG, *info["argv"][1:]]),
        "estimate": info.get("estimate"), "training": {"steps": chosen["step"], "tokens": chosen["tokens"],
                                                       "train_seconds": chosen["train_seconds"], "wall_seconds": info.get("wall_seconds")},
        "curve": rows, "formed_at": formation_step(rows), "held_out": held_out_figures(model, data),
        "repetition": repetition(data, model.cfg.n_ctx),
        "tokenizer": {"kind": "bpe", "sha256": tokenizer.sha256, "json": tokenizer.to_str()},
        "pilots": [extrapolated(summary, chosen["tokens"]) for summary in
                   [*(earlier or {}).get("pilots", []), *map(_summarise_run, pilots),
                    *([opening_pilot(run, opening_minutes)] if opening_minutes else [])]],
        "variants": [*(earlier_runs(earlier) if earlier else []), *map(_summarise_run, variants)],
        "reproduction": reproduction_row(Recipe(**info["recipe"]), data, threads=info["threads"]),
    }
    weights = save_checkpoint(model, out, metadata)
    previous = read_checkpoint_config(out)["metadata"]
    write_card(out.with_suffix(".md"), previous)
    return weights


REPRODUCTION_STEPS = 100


def reproduction_row(recipe: Recipe, data: TokenCorpus, *, threads: int, steps: int = REPRODUCTION_STEPS) -> dict:
    """The log row after `steps` steps of `recipe` retrained here: what the default test suite retrains and compares,
    since a run's first snapshot lies further than a quick test can train (the slow test retrains to it)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            train_recipe(recipe, data, minutes=10, steps=steps, eval_every=steps, out=Path(scratch), log=lambda line: None)
            return read_log(Path(scratch))[-1]
    finally:
        torch.set_num_threads(previous)


def _summarise_run(run: Path) -> dict:
    """A run's recipe, its curve and what it reached (for the card's pilot and variants sections)."""
    info = json.loads((run / "run.json").read_text())
    rows = read_log(run)
    return {"name": run.name, "recipe": info["recipe"], "argv": info["argv"], "estimate": info.get("estimate"),
            "curve": rows, "formed_at": formation_step(rows), "last": rows[-1]}


def opening_pilot(run: Path, minutes: float) -> dict:
    """The run's own first `minutes` of training read as its pilot: the same command stopped at the last snapshot
    within them (`--steps`) trains the same seed on the same schedule, so it logs exactly these rows."""
    summary = _summarise_run(run)
    rows = [r for r in summary["curve"] if r["train_seconds"] <= minutes * 60]
    if len(rows) < 4:
        raise ValueError(f"{run} has {len(rows)} snapshot(s) within its first {minutes:g} min; a pilot's trend needs 4 or more "
                         "(evaluate more often, --eval-every, or read a longer opening).")
    argv = list(summary["argv"])
    if "--steps" in argv:
        argv[argv.index("--steps") + 1] = str(rows[-1]["step"])
    else:
        argv += ["--steps", str(rows[-1]["step"])]
    return {**summary, "name": f"{run.name}, its first {minutes:g} min", "argv": argv, "curve": rows,
            "formed_at": formation_step(rows), "last": rows[-1]}


def extrapolate(rows: list[dict], tokens: float, key: str) -> float:
    """`key` at `tokens`, from a straight line in log(tokens) through the second half of a pilot's rows (the
    first half is the fast initial drop). A trend, not a forecast of a phase change: by definition it cannot
    see one coming."""
    late = [r for r in rows[len(rows) // 2 :] if r["tokens"] > 0]
    x = torch.tensor([math.log10(r["tokens"]) for r in late], dtype=torch.float64)
    y = torch.tensor([r[key] for r in late], dtype=torch.float64)
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    return float(y.mean() + slope * (math.log10(tokens) - x.mean()))


def aoyama_tokens(batch_size: int, n_ctx: int) -> float:
    """Training tokens at which Aoyama et al. (2025, arXiv 2511.16893) find induction heads form:
    N = T sqrt(B C) with T about 10^5.7, B the batch size and C the context length."""
    return 10**5.7 * math.sqrt(batch_size * n_ctx)


def earlier_runs(metadata: dict) -> list[dict]:
    """The other runs a shipped checkpoint's card recorded, then the run it shipped, in `_summarise_run`'s form."""
    argv = ["stdlib_bpe", *metadata["command"].split()[3:]]  # "interp train stdlib-bpe ..." (earlier: "python -m ...")
    name = Path(argv[argv.index("--out") + 1]).name if "--out" in argv else "shipped before"
    rows = metadata["curve"]
    shipped = {"name": f"{name} (shipped before)", "recipe": metadata["recipe"], "argv": argv, "estimate": metadata.get("estimate"),
               "curve": rows, "formed_at": formation_step(rows), "last": rows[-1]}
    return [*metadata.get("variants", []), shipped]


def extrapolated(summary: dict, full_tokens: float) -> dict:
    """A pilot's summary with its trend extrapolated to the full run's tokens."""
    summary = dict(summary)
    recipe = summary["recipe"]
    summary["extrapolated_to"] = full_tokens
    summary["extrapolated"] = {key: extrapolate(summary["curve"], full_tokens, key)
                               for key in ("held_out_nats", "induction", "previous_token", "copy_ratio")}
    summary["aoyama_tokens"] = aoyama_tokens(recipe["batch_size"], recipe["n_ctx"])
    return summary


# ---------------------------------------------------------------- the card


def _f(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def _curve_table(rows: list[dict], every: int = 1) -> list[str]:
    lines = ["| step | tokens | training loss (nats/token) | held-out nats/token | ICL score | induction (best head) | "
             "induction, earlier occurrence >= 16 back | previous-token (best head) | copy ratio, 2nd/1st |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        if i % every and i != len(rows) - 1:
            continue
        train_loss = "" if r["train_nats"] is None else _f(r["train_nats"])
        lines.append(f"| {r['step']} | {r['tokens']:.2e} | {train_loss} | {_f(r['held_out_nats'])} | {_f(r['icl_score'])} | "
                     f"{_f(r['induction'])} ({r['induction_head']}) | {_f(r['induction_far'])} | "
                     f"{_f(r['previous_token'])} ({r['previous_token_head']}) | {_f(r['copy_ratio'])} |")
    return lines


def _recipe_line(recipe: dict) -> str:
    return (f"{recipe['n_layers']} attention-only layers of {recipe['n_heads']} heads, d_model {recipe['d_model']}, "
            f"{recipe['positional_embedding_type']} positions, context {recipe['n_ctx']} tokens, batch {recipe['batch_size']}, "
            f"AdamW lr {recipe['lr']} (linear warm-up {recipe['warmup_steps']} steps, then "
            + (f"cosine decay to a tenth by step {recipe['decay_steps']}" if recipe.get("decay_steps") else "constant")
            + "), weight decay "
            f"{recipe['weight_decay']}, gradient clip {recipe['grad_clip']}, init std {recipe['init_range']}, seed {recipe['seed']}, "
            + (f"planted copies in {recipe['copy_fraction']:.0%} of training windows (spans of 8 tokens to "
               f"{recipe.get('copy_max', 0.25):.0%} of the window)" if recipe["copy_fraction"] else "no planted copies")
            + (f", query / key biases initialised with std {recipe['qk_bias_init']}" if recipe.get("qk_bias_init") else "")
            + f", corpus `{recipe.get('corpus', 'stdlib')}` ({CORPUS_WORDS[recipe.get('corpus', 'stdlib')]})")


CORPUS_WORDS = {"stdlib": "the standard library without its tests", "stdlib-with-tests": "the standard library with its tests"}


def write_card(path: Path, metadata: dict) -> None:
    """The card (markdown), written only from what the run and `finish` recorded in the metadata."""
    sections = [_card_intro(metadata), _card_made(metadata), _card_corpus(metadata), _card_held_out(metadata),
                _card_curve(metadata), _card_heads(metadata), _card_variants(metadata)]
    write_atomic(path, "\n".join(s for s in sections if s))


def _card_intro(m: dict) -> str:
    r = m["recipe"]
    return (f"# {NAME}\n\nA {r['n_layers']}-layer attention-only causal language model of Python source (HookedGPT: "
            f"{r['n_layers']} layers, {r['n_heads']} heads per layer, d_model {r['d_model']}, d_head "
            f"{r['d_model'] // r['n_heads']}, no MLPs, pre-norm LayerNorm, {r['positional_embedding_type']} positions, "
            f"context {r['n_ctx']} tokens) over a byte-level BPE of {m['corpus']['d_vocab']} pieces trained on the same "
            f"files, trained by the project on the `.py` source of {CORPUS_WORDS[r.get('corpus', 'stdlib')]} (of the Python "
            "that ran the command), so that induction heads can be seen forming on natural text offline (Olsson et al. 2022). "
            + (f"**Its training windows carry planted copies**: {r['copy_fraction']:.0%} of them repeat one of their own "
               f"spans (8 tokens to {r.get('copy_max', 0.25):.0%} of the window) later in the window; the model trained "
               "on natural text alone is reported beside it (Other runs), and every figure here is on held-out text "
               "whose repeats are natural or made at measurement time. " if r["copy_fraction"] else
               "No planted or duplicated spans were added to the training stream. ")
            + "Every figure below was measured by the commands "
            "that wrote this file (`interp train stdlib-bpe train`, then `finish`, then "
            "`python -m interp.analyses.text_heads`). `interp.load(\"stdlib-bpe\")` loads it with its tokenizer "
            "(`model.to_tokens(\"def f(x):\")`).\n")


def _card_made(m: dict) -> str:
    t, est = m["training"], m.get("estimate") or {}
    lines = ["## How it was made", "", f"    {m['command']}", "",
             f"- {_recipe_line(m['recipe'])}.",
             f"- {t['steps']} steps, {t['tokens']:.3g} tokens, {t['train_seconds'] / 60:.1f} min of training on "
             f"{m['threads']} torch thread(s) ({m['machine']}, torch {m['torch']}), evaluation excluded. The shipped "
             f"weights are the snapshot at step {t['steps']}; the same command with `--steps {t['steps']}` (which stops "
             "training there, whatever `--minutes` says) retrains them (same seed and thread count: the same numbers; "
             "another CPU: float rounding).",
             ]
    if m.get("reproduction"):
        r = m["reproduction"]
        lines.append(f"- Retrained here for {r['step']} steps when the card was written: held-out loss {_f(r['held_out_nats'])}, "
                     f"training loss {_f(r['train_nats'])} nats per token (what the default test suite retrains and "
                     "compares within 0.02 nats).")
    if est:
        lines.append(f"- Estimate made before training: {est['seconds_per_step'] * 1000:.1f} ms per step from "
                     f"{est['timed_steps']} timed steps, so {est['minutes']:.1f} min for the budget asked; a run whose "
                     "estimate exceeds `--max-minutes` (90) is refused.")
    for pilot in m.get("pilots") or []:
        last, ahead = pilot["last"], pilot["extrapolated"]
        lines += ["", f"### Pilot: {pilot['name']}", "", f"    {PROG} {' '.join(pilot['argv'][1:])}", "",
                  f"- {_recipe_line(pilot['recipe'])}."
                  + ("" if pilot["recipe"].get("corpus", "stdlib") == m["recipe"].get("corpus", "stdlib") else
                     " Another corpus than the shipped model's: its held-out losses are on other files, so its trend "
                     "speaks for its own corpus."),
                  f"- {last['step']} steps ({last['tokens']:.3g} tokens, {last['train_seconds'] / 60:.1f} min): held-out "
                  f"{_f(last['held_out_nats'])} nats/token, best induction {_f(last['induction'])} ({last['induction_head']}), "
                  f"best previous-token {_f(last['previous_token'])} ({last['previous_token_head']}), copy ratio "
                  f"{_f(last['copy_ratio'])}.",
                  f"- Extrapolated to the shipped run's {pilot['extrapolated_to']:.3g} tokens (a line in log tokens through "
                  f"the pilot's second half): held-out {_f(ahead['held_out_nats'])} nats/token, best induction "
                  f"{_f(ahead['induction'])}, best previous-token {_f(ahead['previous_token'])}, copy ratio "
                  f"{_f(ahead['copy_ratio'])}. A trend cannot foresee a phase change; Aoyama et al.'s law "
                  f"(10^5.7 sqrt(batch x context)) puts induction heads at {pilot['aoyama_tokens']:.3g} tokens for this "
                  "batch and context."]
    return "\n".join(lines) + "\n"


def _card_corpus(m: dict) -> str:
    c = m["corpus"]
    return "\n".join([
        "## Corpus and tokenizer", "",
        f"The `.py` files of the standard library of the Python that ran the command (Python {c['python_version']}), "
        f"{c['filter']}; none of it is copied into this repository (`interp.models.textcorpus`, as for `stdlib-bytes`).", "",
        f"- {c['n_files']} files, {c['n_bytes']:,} bytes; checksum `{c['checksum']}`",
        f"- split: {c['split']}: {c['n_train_files']} training files, {c['n_held_out_files']} held out",
        f"- tokenizer: byte-level BPE (`tokenizers`), {c['d_vocab']} pieces including the file separator `{SEPARATOR_TOKEN}` "
        f"(id 0), trained on the training files only; SHA-256 of its JSON `{c['tokenizer_sha256'][:16]}...`; shipped in "
        "this checkpoint's JSON (`metadata.tokenizer`)",
        f"- {c['n_train_tokens']:,} training tokens, {c['n_held_out_tokens']:,} held-out tokens "
        f"({c['held_out_tokens_per_byte']:.4f} tokens per byte)",
        "- another Python version has other files: the tests compare the checksum and skip, saying so, when it differs.", "",
        *_repetition_table(m.get("repetition") or []), ""])


def _repetition_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    ks = sorted({r["k"] for r in rows})
    lines = ["What the training files offer an induction head (`repeat_reliability` on up to 2,000 windows of each group): "
             "at a position whose last k tokens occurred earlier in the window, how often the next token is the one that "
             "followed them there (reliability), and how many positions are such repeats (share).", "",
             "| files | " + " | ".join(f"k={k}: reliability (share)" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for group in dict.fromkeys(r["files"] for r in rows):
        cells = {r["k"]: r for r in rows if r["files"] == group}
        n_files = next(iter(cells.values()))["n_files"]
        lines.append(f"| {group} ({n_files} files) | "
                     + " | ".join(f"{cells[k]['reliability']:.3f} ({cells[k]['share']:.3f})" for k in ks) + " |")
    return lines


def _card_held_out(m: dict) -> str:
    h = m["held_out"]
    low, high = h["copy_ratio_ci"]
    icl_low, icl_high = h["icl_ci"]
    e, l = h["icl_early_tokens"], h["icl_late_tokens"]
    return "\n".join([
        "## Held-out loss", "",
        f"{h['n_windows']} non-overlapping windows of {m['recipe']['n_ctx']} tokens evenly spaced over the held-out files, "
        f"{h['n_predicted']:,} predicted tokens. Baselines fitted on the training tokens with add-one smoothing over the "
        f"{m['corpus']['d_vocab']} pieces, scored on the same tokens. Bits per byte = bits per token x "
        f"{h['held_out_tokens_per_byte']:.4f} held-out tokens per byte.", "",
        "| model | bits per token | bits per byte |", "|---|---|---|",
        f"| unigram (add-one) | {_f(h['unigram_bits_per_token'])} | {_f(h['unigram_bits_per_byte'])} |",
        f"| bigram (add-one) | {_f(h['bigram_bits_per_token'])} | {_f(h['bigram_bits_per_byte'])} |",
        f"| **{NAME}** | **{_f(h['bits_per_token'])}** | **{_f(h['bits_per_byte'])}** |", "",
        "(`stdlib-bytes`, 4 layers with MLPs, reaches 1.877 bits per byte on "
        + ("the same held-out files.)" if m["recipe"].get("corpus", "stdlib") == "stdlib" else
           "the held-out files of the `stdlib` corpus, the standard library without its tests: not these.)"), "",
        "## In-context learning and copying", "",
        f"- **In-context learning score** (Olsson et al.: loss at a late token minus loss at an early one; theirs is token "
        f"500 vs 50, ours fits the context of {m['recipe']['n_ctx']}): mean loss on tokens {l[0]}..{l[1] - 1} minus tokens "
        f"{e[0]}..{e[1] - 1} of {h['icl_n_windows']} held-out windows: **{_f(h['icl_score'])} nats** "
        f"[{_f(icl_low)}, {_f(icl_high)}] (negative: later tokens are cheaper).",
        f"- **Copying** on {h['copy_n_prompts']} held-out spans of {h['copy_span']} tokens, each after {h['copy_offset']} tokens "
        f"of other held-out text and then repeated once (the repeat is made at measurement time, never in training): "
        f"first copy {_f(h['copy_first'])} nats/token, second copy {_f(h['copy_second'])}; the second copy costs "
        f"**{_f(h['copy_ratio'])}** of the first [{_f(low)}, {_f(high)}] (target: at most 0.5).", ""])


def _card_curve(m: dict) -> str:
    rows = m["curve"]
    formed = m.get("formed_at")
    said = (f"The best natural induction score first passes 0.5 at step {formed['step']} ({formed['tokens']:.3g} tokens)."
            if formed else "No snapshot's best natural induction score reached 0.5.")
    every = max(1, len(rows) // 30)
    return "\n".join([
        "## Training curve", "",
        "Measured at every snapshot on 64 held-out windows and 64 held-out repeated spans (`interp.experiments.stdlib_bpe.track`): "
        "*induction* is the mean attention on the token after an earlier occurrence of the query's token, over queries "
        "whose token occurred earlier in the window (natural repeats; the toolkit's `induction` metric with "
        "`Repeats(match_len=1)`), best head; the next column counts only earlier occurrences at least 16 tokens back (a "
        "control against previous-token and local heads); *copy ratio* is second-copy over first-copy loss on the "
        "repeated spans. " + said, "", *_curve_table(rows, every), ""])


def _card_heads(m: dict) -> str:
    heads = m.get("heads")
    if not heads:
        return "## Heads\n\nNot yet measured: run `python -m interp.analyses.text_heads` on this checkpoint.\n"
    return heads["markdown"]


def _formed_sentence(formed: list[dict], total: int) -> str:
    if not formed:
        return f"In none of the {total} did the best induction score reach 0.5."
    return (f"In {len(formed)} of the {total} the best induction score reached 0.5: "
            + ", ".join(f"{v['name']} at step {v['formed_at']['step']}" for v in formed) + ".")


def _card_variants(m: dict) -> str:
    variants = m.get("variants") or []
    if not variants:
        return ""
    lines = ["## Other runs", "",
             "Every other run of the search for a recipe, with the same measurements on the held-out files of its own "
             "corpus and its own tokenizer trained on that corpus (`train` with the flags shown; `--corpus` left out is "
             "`stdlib`, the standard library without its tests; all on one CPU thread). "
             + _formed_sentence([v for v in variants if v.get("formed_at")], len(variants)), "",
             "| run | flags | steps | tokens | held-out nats/token | best induction | best previous-token | copy ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for v in variants:
        last = v["last"]
        flags = " ".join(a for a in v["argv"][2:] if not a.startswith("/"))
        flags = flags.replace("--out", "").strip()
        asked = float(v["argv"][v["argv"].index("--minutes") + 1]) if "--minutes" in v["argv"] else None
        steps = int(v["argv"][v["argv"].index("--steps") + 1]) if "--steps" in v["argv"] else None
        short = last["step"] < steps if steps is not None else bool(asked and last["train_seconds"] < asked * 60 - 60)
        stopped = f" (stopped by hand after {last['train_seconds'] / 60:.0f} min)" if short else ""
        lines.append(f"| {v['name']} | `{flags}`{stopped} | {last['step']} | {last['tokens']:.3g} | {_f(last['held_out_nats'])} | "
                     f"{_f(last['induction'])} ({last['induction_head']}) | {_f(last['previous_token'])} "
                     f"({last['previous_token_head']}) | {_f(last['copy_ratio'])} |")
    return "\n".join(lines) + "\n"


# each recipe field's argument type: the range a run can use (checked at parse time, before any work)
RECIPE_TYPES: dict[str, Callable[[str], Any]] = {
    "vocab_size": whole(MIN_VOCAB, why=" (the 256 bytes and the separator: a smaller vocabulary cannot be built)"),
    "n_ctx": whole(MIN_CTX, why=" (the probes score positions [1, 12) against the last ten)"),
    "batch_size": whole(1), "lr": real(0, above=True), "warmup_steps": whole(1), "decay_steps": whole(0),
    "weight_decay": real(0), "grad_clip": real(0, above=True), "d_model": whole(1), "n_heads": whole(1),
    "n_layers": whole(1), "init_range": real(0, above=True), "positional_embedding_type": str,
    "copy_fraction": real(0, 1), "copy_max": real(0, 0.5, above=True), "qk_bias_init": real(0),
    "seed": whole(0, 2**32 - 1), "corpus": str,
}
CHOICES = {"corpus": sorted(CORPORA), "positional_embedding_type": list(get_args(PosEmbedType))}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("train", help="train, with a snapshot and a log row every --eval-every steps")
    for field, default in asdict(Recipe()).items():
        run.add_argument("--" + field.replace("_", "-"), type=RECIPE_TYPES[field], default=default,
                         choices=CHOICES.get(field))
    run.add_argument("--minutes", type=real(0, above=True), required=True, help="training time, evaluation excluded "
                     "(at most --max-minutes)")
    run.add_argument("--max-minutes", type=real(0, above=True), default=90.0)
    run.add_argument("--steps", type=whole(0), default=None, help="train exactly this many steps (refused if the estimate "
                     "exceeds --max-minutes); without it, --minutes of training")
    run.add_argument("--eval-every", type=whole(1), default=1000)
    run.add_argument("--threads", type=whole(1), default=1)
    run.add_argument("--out", type=Path, required=True, help="the run's folder: absent or empty (or an earlier run's, "
                     "with --force)")
    run.add_argument("--force", action="store_true", help="replace the earlier run in --out: its snapshots, log, "
                     "tokenizer and run.json are deleted first (no other file is touched; any other file is refused)")
    done = sub.add_parser("finish", help="measure a run's snapshot on held-out text and save it with its card")
    done.add_argument("run", type=Path, help="the folder `train --out` wrote")
    done.add_argument("--out", type=Path, required=True, help="NAME of the checkpoint (NAME.safetensors, .json, .md)")
    done.add_argument("--step", type=whole(0), default=None, help="the snapshot to ship (default: the last)")
    done.add_argument("--pilot", type=Path, action="append", default=[], help="a pilot run, summarised in the card")
    done.add_argument("--variant", type=Path, action="append", default=[], help="another full run, reported in the card")
    done.add_argument("--earlier", type=Path, default=None, help="a checkpoint this one replaces (NAME of NAME.json): its "
                      "card's pilots and other runs, and the run it shipped, are carried into the new card")
    done.add_argument("--opening-pilot", type=real(0, above=True), default=None, metavar="MINUTES", help="also report the "
                      "run's own first MINUTES of training as a pilot, with its trend extrapolated (the same command stopped "
                      "there)")
    return parser


def check_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Recipe, list[Path]]:
    """The recipe and the earlier run's files to delete (with --force), after the checks one flag alone cannot make:
    the model's shape, planted spans that fit, --minutes within --max-minutes, a usable --out. Exit 2 otherwise."""
    recipe = Recipe(**{f: getattr(args, f) for f in asdict(Recipe())})
    d_head, rest = divmod(recipe.d_model, recipe.n_heads)
    if rest:
        parser.error(f"--d-model {recipe.d_model} is not divisible by --n-heads {recipe.n_heads}: each head gets "
                     "d_model / n_heads dimensions; choose --n-heads dividing --d-model.")
    if recipe.positional_embedding_type == "rotary" and d_head % 2:
        parser.error(f"rotary positions need an even d_head = --d-model / --n-heads, got {d_head}; change either, or "
                     "pass --positional-embedding-type standard.")
    try:
        recipe.model_config(recipe.vocab_size)
    except ValueError as error:
        parser.error(f"the model's shape: {error}")
    if recipe.copy_fraction and int(recipe.n_ctx * recipe.copy_max) < 8:
        parser.error(f"--copy-max {recipe.copy_max:g}: a planted span is 8 tokens or longer, so --copy-max times --n-ctx "
                     f"{recipe.n_ctx} must be at least 8.")
    if args.minutes > args.max_minutes:
        parser.error(f"--minutes {args.minutes:g} of training exceeds --max-minutes {args.max_minutes:g} (the CPU budget); "
                     "ask for less, or raise --max-minutes knowingly.")
    try:
        return recipe, earlier_run_files(args.out, args.force)
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads if args.command == "train" else 1)
    if args.command == "finish":
        earlier = read_checkpoint_config(args.earlier)["metadata"] if args.earlier else None
        print(finish(args.run, args.out, step=args.step, pilots=args.pilot, variants=args.variant, earlier=earlier,
                     opening_minutes=args.opening_pilot))
        return 0
    recipe, replaced = check_run(args, parser)
    began = time.time()
    data = token_corpus(recipe.vocab_size, corpus_name=recipe.corpus)
    tokenize_seconds = round(time.time() - began, 1)
    print(json.dumps(data.summary()), flush=True)
    planned = estimate_budget(recipe, data, args.minutes)
    if args.steps is not None:
        planned["steps_asked"] = args.steps
        planned["minutes_for_steps"] = args.steps * planned["seconds_per_step"] / 60
        if planned["minutes_for_steps"] > args.max_minutes:
            parser.error(f"refused: {args.steps} steps at {planned['seconds_per_step'] * 1000:.1f} ms each would take "
                         f"{planned['minutes_for_steps']:.0f} min, over --max-minutes {args.max_minutes:g}; nothing was "
                         "written.")
    print(json.dumps({"estimate": planned}), flush=True)
    remove_files(args.out, [path.name for path in replaced])  # the earlier run (--force), only now the new one starts
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "tokenizer.json", data.tokenizer.to_str())
    asked = [PROG, *(sys.argv[1:] if argv is None else argv)]  # argv[1] is "train": the cards read the flags after it
    write_atomic(args.out / "run.json", json.dumps({"recipe": asdict(recipe), "corpus": data.summary(), "argv": asked,
                                                    "threads": args.threads, "torch": torch.__version__,
                                                    "machine": platform.machine(), "tokenize_seconds": tokenize_seconds,
                                                    "estimate": planned}, indent=1))
    train_recipe(recipe, data, minutes=args.minutes, out=args.out, eval_every=args.eval_every, max_minutes=args.max_minutes,
          steps=args.steps, log=lambda line: print(line, flush=True))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
