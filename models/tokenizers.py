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


def shipped_tokenizer(metadata: dict[str, Any], d_vocab: int) -> ByteTokenizer | SymbolTokenizer | None:
    """The tokenizer a checkpoint's training task implies (its JSON's `metadata.task.task`), or None."""
    task = (metadata.get("task") or {}).get("task") if isinstance(metadata.get("task"), dict) else None
    if task == "stdlib-bytes" and d_vocab == 256:
        return ByteTokenizer()
    if task == "induction":
        return SymbolTokenizer(d_vocab)
    return None
