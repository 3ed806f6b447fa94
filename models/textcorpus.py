"""A natural-text corpus every machine already has: the Python standard library's own source.

Nothing is copied into the repository: the files are read from the installed interpreter
(`sysconfig.get_paths()["stdlib"]`). The filter is fixed (`.py` files outside `test/`, `tests/`,
`idlelib/` and `site-packages/`), and a file is held out when the first byte of the SHA-256 of
its relative path (POSIX form) is below `HELD_OUT_BELOW` (26/256, about 10%), so the split does
not depend on the order files are listed in, nor on which other files an installation has.

Text is bytes (the model's vocabulary is the 256 byte values): no tokenizer to ship. Files are
joined with `SEPARATOR` (a NUL byte, which does not occur in the filtered sources), which marks
document boundaries. `checksum` hashes every (relative path, file SHA-256) pair in order, so two
installations with the same filtered files give the same checksum.

Baselines: `ngram_bits` fits unigram / bigram byte models with add-one (Laplace) smoothing on
the training split and scores held-out bytes in bits per byte.
"""
from __future__ import annotations

import hashlib
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

EXCLUDED_DIRS = ("test", "tests", "idlelib", "site-packages")
# the corpora a recipe may name: the folders each leaves out (site-packages is never Python's own text)
CORPORA = {"stdlib": EXCLUDED_DIRS, "stdlib-with-tests": ("site-packages",)}
HELD_OUT_BELOW = 26  # a file is held out when sha256(relative path)[0] < 26 (26/256 ~ 10%)
SEPARATOR = b"\x00"  # joins files; a document boundary the model sees
VOCAB = 256  # byte values


def stdlib_root() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str) -> bool:
    """The split, decided by a hash of the file's relative path alone."""
    return hashlib.sha256(relative_path.encode("utf-8")).digest()[0] < HELD_OUT_BELOW


def corpus_files(root: str | Path | None = None, excluded: tuple[str, ...] = EXCLUDED_DIRS) -> list[str]:
    """Relative POSIX paths of the .py files under `root` (default: the stdlib) outside `excluded` folders, sorted."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a folder; pass the Python standard library's folder "
                                "(sysconfig.get_paths()['stdlib']).")
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if any(part in excluded for part in relative.parts[:-1]) or not path.is_file():
            continue
        files.append(relative.as_posix())
    if not files:
        raise FileNotFoundError(f"no .py files under {root} outside {excluded}; is it a Python standard library?")
    return sorted(files)


@dataclass(frozen=True)
class TextCorpus:
    """The filtered files split into training and held-out byte streams."""

    root: str
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]
    train: bytes  # training files joined by SEPARATOR
    held_out: bytes  # held-out files joined by SEPARATOR
    checksum: str  # sha256 over (path, file sha256) of every file, in sorted order
    n_bytes: int  # total bytes of all files (separators not counted)
    python_version: str
    excluded: tuple[str, ...] = EXCLUDED_DIRS  # the folders left out

    def summary(self) -> dict:
        """What a card records about the corpus (no text)."""
        return {"root": self.root, "python_version": self.python_version, "n_files": len(self.train_files) + len(self.held_out_files),
                "n_train_files": len(self.train_files), "n_held_out_files": len(self.held_out_files),
                "n_bytes": self.n_bytes, "n_train_bytes": len(self.train), "n_held_out_bytes": len(self.held_out),
                "checksum": self.checksum, "filter": f".py files outside {list(self.excluded)} directories",
                "split": f"held out when sha256(relative path)[0] < {HELD_OUT_BELOW} (of 256)"}


def load_corpus(root: str | Path | None = None, excluded: tuple[str, ...] = EXCLUDED_DIRS) -> TextCorpus:
    """Read and split the corpus; deterministic for a given set of files."""
    import platform

    root = Path(root) if root is not None else stdlib_root()
    files = corpus_files(root, excluded)
    digest = hashlib.sha256()
    train: list[bytes] = []
    held_out: list[bytes] = []
    train_names: list[str] = []
    held_names: list[str] = []
    total = 0
    for relative in files:
        data = (root / relative).read_bytes().replace(SEPARATOR, b"")
        total += len(data)
        digest.update(relative.encode("utf-8") + b"\n" + hashlib.sha256(data).hexdigest().encode() + b"\n")
        (held_out if is_held_out(relative) else train).append(data)
        (held_names if is_held_out(relative) else train_names).append(relative)
    if not train or not held_out:
        raise ValueError(f"the split of {len(files)} files under {root} left one side empty "
                         f"({len(train)} training, {len(held_out)} held out); the corpus is too small.")
    return TextCorpus(root=str(root), train_files=tuple(train_names), held_out_files=tuple(held_names),
                      train=SEPARATOR.join(train), held_out=SEPARATOR.join(held_out), checksum=digest.hexdigest(),
                      n_bytes=total, python_version=platform.python_version(), excluded=tuple(excluded))


def named_corpus(name: str, root: str | Path | None = None) -> TextCorpus:
    """The corpus a recipe names (a key of CORPORA), read from `root` (default: the stdlib)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; expected one of {sorted(CORPORA)}.")
    return load_corpus(root, CORPORA[name])


def as_tensor(data: bytes) -> torch.Tensor:
    """Bytes as a 1-D LongTensor of ids in [0, 256)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def random_windows(stream: torch.Tensor, batch_size: int, n_pos: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, n_pos) windows starting at uniform random offsets of `stream`; seeded."""
    if stream.numel() <= n_pos:
        raise ValueError(f"the stream has {stream.numel()} tokens, fewer than a window of {n_pos}.")
    starts = torch.randint(0, stream.numel() - n_pos, (batch_size,), generator=generator)
    return stream[starts[:, None] + torch.arange(n_pos)]  # (batch, pos)


def eval_windows(stream: torch.Tensor, n_pos: int, max_windows: int | None = None) -> torch.Tensor:
    """(n, n_pos) non-overlapping windows from the start of `stream`, evenly spaced when capped."""
    n_full = stream.numel() // n_pos
    if n_full < 1:
        raise ValueError(f"the stream has {stream.numel()} tokens, fewer than a window of {n_pos}.")
    windows = stream[: n_full * n_pos].view(n_full, n_pos)
    if max_windows is not None and n_full > max_windows:
        windows = windows[torch.linspace(0, n_full - 1, max_windows).round().long()]
    return windows


def ngram_counts(stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unigram (vocab,) and bigram (previous, next) counts of a byte stream."""
    unigram = torch.bincount(stream, minlength=VOCAB).double()
    bigram = torch.bincount(stream[:-1] * VOCAB + stream[1:], minlength=VOCAB * VOCAB).double().view(VOCAB, VOCAB)
    return unigram, bigram


def ngram_bits(train_stream: torch.Tensor, windows: torch.Tensor) -> dict:
    """Add-one smoothed unigram and bigram bits per byte on the predicted positions of `windows`
    (every byte after the first of each window, the positions a model's next-token loss covers)."""
    unigram, bigram = ngram_counts(train_stream)
    log_unigram = torch.log2((unigram + 1) / (unigram.sum() + VOCAB))  # (vocab,)
    log_bigram = torch.log2((bigram + 1) / (bigram.sum(-1, keepdim=True) + VOCAB))  # (previous, next)
    previous, target = windows[:, :-1].flatten(), windows[:, 1:].flatten()
    return {"unigram_bits": float(-log_unigram[target].mean()),
            "bigram_bits": float(-log_bigram[previous, target].mean()), "n_predicted": int(target.numel())}


def bits_per_byte(mean_nats: float) -> float:
    return mean_nats / math.log(2)


# ---------------------------------------------------------------- prompts of held-out text


def clean_starts(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Start offsets of every window of `seq_len` tokens that contains no file separator."""
    is_separator = (stream == SEPARATOR[0]).long()
    separators_before = torch.cat([torch.zeros(1, dtype=torch.long), is_separator.cumsum(0)])  # (n + 1,)
    starts = torch.arange(stream.numel() - seq_len + 1)
    inside = separators_before[starts + seq_len] - separators_before[starts]  # separators in each window
    return starts[inside == 0]


def text_windows(stream: torch.Tensor, n: int, seq_len: int, *, seed: int = 0) -> torch.Tensor:
    """(n, seq_len) windows of one file each, at seeded random offsets of `stream` (e.g. the held-out bytes)."""
    if n < 1 or seq_len < 2:
        raise ValueError(f"need n >= 1 and seq_len >= 2; got n={n}, seq_len={seq_len}.")
    starts = clean_starts(stream, seq_len)
    if starts.numel() == 0:
        raise ValueError(f"no window of {seq_len} bytes lies inside one file; use a shorter seq_len.")
    chosen = starts[torch.randint(0, starts.numel(), (n,), generator=torch.Generator().manual_seed(seed))]
    return stream[chosen[:, None] + torch.arange(seq_len)]  # (n, seq_len)


def planted_repeats(stream: torch.Tensor, n: int, prefix_len: int, offset: int, *, seed: int = 0) -> torch.Tensor:
    """(n, offset + 2 * prefix_len): `offset` bytes of text, then a span of `prefix_len` bytes from
    elsewhere in the stream, then the same span again: a planted repeat of real text, whose second
    copy is predictable only by looking back (the induction test on natural text)."""
    if prefix_len < 2 or offset < 0:
        raise ValueError(f"need prefix_len >= 2 and offset >= 0; got prefix_len={prefix_len}, offset={offset}.")
    before = text_windows(stream, n, max(offset, 2), seed=seed)[:, :offset]  # (n, offset)
    span = text_windows(stream, n, prefix_len, seed=seed + 1)  # (n, prefix_len)
    return torch.cat([before, span, span], dim=1)


def decode(tokens) -> str:
    """Byte ids back to text (invalid UTF-8 shown as U+FFFD)."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def encode(text: str) -> torch.Tensor:
    """Text as its UTF-8 byte ids, a 1-D LongTensor."""
    return as_tensor(text.encode("utf-8"))


# ---------------------------------------------------------------- the shipped corpus vs the one found


def compare_corpus(recorded: dict, found: TextCorpus) -> str | None:
    """None when the corpus found is the one a card recorded (same checksum); otherwise what differs."""
    if recorded.get("checksum") == found.checksum:
        return None
    return (f"the corpus found differs from the one the model was trained and measured on: "
            f"{len(found.train_files) + len(found.held_out_files)} files, {found.n_bytes:,} bytes, checksum "
            f"{found.checksum[:12]}... (Python {found.python_version}, {found.root}) versus "
            f"{recorded.get('n_files')} files, {recorded.get('n_bytes', 0):,} bytes, checksum "
            f"{str(recorded.get('checksum'))[:12]}... (Python {recorded.get('python_version')}). Held-out figures "
            "measured here are on the corpus found, not the card's.")


@dataclass(frozen=True)
class HeldOutReport:
    """Held-out bits per byte of a model and of the n-gram baselines on the corpus found here."""

    bits_per_byte: float
    unigram_bits: float
    bigram_bits: float
    n_windows: int
    n_predicted: int
    corpus_matches_card: bool
    note: str | None  # what differs from the card's corpus, if anything

    @property
    def ratio_to_bigram(self) -> float:
        return self.bits_per_byte / self.bigram_bits


def held_out_report(model, recorded_corpus: dict, *, n_windows: int = 256, corpus: TextCorpus | None = None,
                    batch_size: int = 64) -> HeldOutReport:
    """Measure `model` on `n_windows` evenly spaced held-out windows of the corpus found here (the
    card's figures used 2048), with unigram / bigram baselines on the same bytes, and say whether
    that corpus is the one the card recorded."""
    corpus = corpus or load_corpus()
    windows = eval_windows(as_tensor(corpus.held_out), model.cfg.n_ctx, n_windows)
    found = evaluate_text(model, windows, batch_size=batch_size)
    baselines = ngram_bits(as_tensor(corpus.train), windows)
    note = compare_corpus(recorded_corpus, corpus)
    return HeldOutReport(found["bits"], baselines["unigram_bits"], baselines["bigram_bits"], found["n_windows"],
                         found["n_predicted"], note is None, note)


@torch.no_grad()
def evaluate_text(model, windows: torch.Tensor, batch_size: int = 64) -> dict:
    """Mean next-byte loss of `model` on (n, pos) windows, in nats and bits per byte."""
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch_size):
        chunk = windows[start : start + batch_size]
        per = model(chunk, return_type="loss", loss_per_token=True)  # (batch, pos - 1)
        total += float(per.double().sum())
        count += per.numel()
    nats = total / count
    return {"nats": nats, "bits": nats / math.log(2), "n_predicted": count, "n_windows": int(windows.shape[0])}
