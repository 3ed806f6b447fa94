"""Tokenizers of the shipped checkpoints, so `model.to_tokens("...")`, `to_str_tokens` and `to_string`
work on them as on a TransformerLens model (`head_detector.detect_head(model, "some text", ...)`).

- `ByteTokenizer` (`stdlib-bytes`): a token is one byte of the UTF-8 text, id = byte value (256 ids).
- `SymbolTokenizer` (`toy-induction`): the model was trained on repeated *random* token ids (its card:
  "tokens uniform in [0, 256)", BOS id 255 also an ordinary token), so it has no alphabet of characters;
  each id is a symbol written as its decimal number, and a string is those numbers separated by
  whitespace ("5 17 5 17"). Token labels are the ids the toolkit already shows.

Neither changes which prompts the report picks by default (`text_prompts_by_default = False`): the
shipped models' reports keep repeated random tokens unless text is asked for.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch


def _ids(ids: Iterable[int] | torch.Tensor) -> list[int]:
    return [int(i) for i in (ids.flatten().tolist() if isinstance(ids, torch.Tensor) else ids)]


class ByteTokenizer:
    """One token per byte of the UTF-8 encoding; `decode` writes an invalid byte sequence as U+FFFD."""

    vocab_size = 256
    pad_token_id = None  # no padding id: every byte value is a real token
    text_prompts_by_default = False

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        values = _ids(ids)
        bad = [i for i in values if not 0 <= i < 256]
        if bad:
            raise ValueError(f"token id {bad[0]} is not a byte value; ByteTokenizer's ids are 0..255.")
        return bytes(values).decode("utf-8", errors="replace")

    def token_string(self, token_id: int) -> str:
        """One byte as a string: its character for ASCII, `\\xNN` for a byte of a multi-byte character."""
        return bytes([token_id]).decode("utf-8", errors="backslashreplace")


class SymbolTokenizer:
    """`vocab_size` abstract symbols, each written as its id in decimal; strings are whitespace-separated ids."""

    pad_token_id = None
    text_prompts_by_default = False

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"SymbolTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if not word.isdigit() or int(word) >= self.vocab_size:
                raise ValueError(
                    f"{word!r} is not a token of this model: its {self.vocab_size} tokens are abstract symbols "
                    f"written as their ids 0..{self.vocab_size - 1}, separated by spaces (e.g. '5 17 5 17')."
                )
            ids.append(int(word))
        return ids

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        return " ".join(self.token_string(i) for i in _ids(ids))

    def token_string(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size}).")
        return str(token_id)


def shipped_tokenizer(metadata: dict[str, Any], d_vocab: int) -> ByteTokenizer | SymbolTokenizer | BPETokenizer | None:
    """The tokenizer a checkpoint's training task implies (its JSON's `metadata.task.task`), or the one it
    carries (`metadata.tokenizer`: {"kind": "bpe", "json": ...}), or None."""
    carried = metadata.get("tokenizer")
    if isinstance(carried, dict) and carried.get("kind") == "bpe":
        tokenizer = BPETokenizer(str(carried["json"]))
        if tokenizer.vocab_size != d_vocab:
            raise ValueError(f"the checkpoint's tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
                             f"is {d_vocab}; the JSON's metadata.tokenizer belongs to another model.")
        return tokenizer
    task = (metadata.get("task") or {}).get("task") if isinstance(metadata.get("task"), dict) else None
    if task == "stdlib-bytes" and d_vocab == 256:
        return ByteTokenizer()
    if task == "induction":
        return SymbolTokenizer(d_vocab)
    return None


class BPETokenizer:
    """A byte-level BPE tokenizer (the `tokenizers` library, installed with transformer-lens), kept as its
    JSON text: saved in a checkpoint's metadata and rebuilt from it, never unpickled."""

    pad_token_id = None
    text_prompts_by_default = False  # reports keep repeated tokens: the shipped English text has no repeats to test induction on

    def __init__(self, json_text: str):
        from tokenizers import Tokenizer

        self._json = json_text
        self._tokenizer = Tokenizer.from_str(json_text)
        self.vocab_size = self._tokenizer.get_vocab_size()

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"

    @property
    def sha256(self) -> str:
        import hashlib

        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def to_str(self) -> str:
        return self._json

    def token_id(self, piece: str) -> int:
        found = self._tokenizer.token_to_id(piece)
        if found is None:
            raise ValueError(f"{piece!r} is not a token of this tokenizer.")
        return int(found)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch(texts)]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        values = _ids(ids)
        bad = [i for i in values if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size}).")
        return self._tokenizer.decode(values, skip_special_tokens=False)

    def token_string(self, token_id: int) -> str:
        """One token as the text it stands for (a piece of a multi-byte character shows as U+FFFD)."""
        return self.decode([token_id])


def train_bpe(texts: list[str], vocab_size: int, special_tokens: list[str]) -> BPETokenizer:
    """A byte-level BPE of `vocab_size` pieces (the special tokens first) trained on `texts`; ValueError when
    `vocab_size` cannot hold the 256 bytes and the special tokens (the trainer would silently make it larger)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    smallest = 256 + len(special_tokens)
    if vocab_size < smallest:
        raise ValueError(f"vocab_size={vocab_size}: a byte-level BPE holds at least the 256 bytes and "
                         f"{len(special_tokens)} special token(s), so {smallest} or more.")

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return BPETokenizer(tokenizer.to_str())
