"""Tokenizers of the shipped checkpoints, so `model.to_tokens("...")`, `to_str_tokens` and `to_string`
work on them as on a TransformerLens model (`head_detector.detect_head(model, "some text", ...)`).

- `ByteTokenizer` (`stdlib-bytes`): a token is one byte of the UTF-8 text, id = byte value (256 ids).
- `SymbolTokenizer` (`toy-induction`): the model was trained on repeated *random* token ids (its card:
  "tokens uniform in [0, 256)", BOS id 255 also an ordinary token), so it has no alphabet of characters;
  each id is a symbol written as its decimal number, and a string is those numbers separated by
  whitespace ("5 17 5 17"). Token labels are the ids the toolkit already shows.

Neither changes which prompts the report picks by default (`text_prompts_by_default = False`): the
shipped models' reports keep repeated random tokens unless text is asked for.

`TokenMethods` is those methods over any model's `tokenizer`: HookedGPT's, and a user's own model's when
interception hooked it (`interp.hook_sdpa`) and its factory attached a tokenizer.
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


class TokenMethods:
    """TransformerLens's token methods (`to_tokens`, `to_str_tokens`, `to_string`, `to_single_token`) over the model's
    `tokenizer` attribute: HookedGPT's, and those of a user's model hooked by interception (`interp.hook_sdpa`) whose
    factory attached a tokenizer. A model tells `_pads_right_safely` whether right padding leaves its real
    positions as they are (a causal model)."""

    def _pads_right_safely(self) -> bool:
        return False

    def to_tokens(self, tokens, prepend_bos: bool | None = None, padding_side: str = "right",
                  move_to_device: bool = True) -> torch.Tensor:
        """Tokens as a (batch, pos) LongTensor (TransformerLens's `to_tokens`); strings need `model.tokenizer` (a
        CharTokenizer, a shipped model's, or a converted model's Hugging Face tokenizer).

        Strings of unequal lengths are padded on the right, as TransformerLens pads them: with the tokenizer's pad
        id, its BOS id where it has none (0 where it has neither); a causal model's real positions never read the
        padding. An encoder's would: it needs the attention mask `interp.data.text_prompts` builds, and so does
        padding on the left. `prepend_bos`: None keeps what the tokenizer writes; True puts the BOS token first
        (once); False takes away a BOS the tokenizer put first.
        """
        if isinstance(tokens, str):
            return self.to_tokens([tokens], prepend_bos, padding_side, move_to_device)
        if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, str) for t in tokens):
            tokenizer = getattr(self, "tokenizer", None)
            if tokenizer is None:
                raise ValueError(
                    f"{type(self).__name__} has no tokenizer to encode the string {tokens[0][:30]!r}; "
                    "pass token ids as a LongTensor, or set model.tokenizer."
                )
            encoded = [self._with_bos(list(tokenizer.encode(text)), prepend_bos) for text in tokens]
            tokens = self._padded(encoded, padding_side)
        tokens = torch.as_tensor(tokens)
        tokens = tokens.unsqueeze(0) if tokens.ndim == 1 else tokens
        device = getattr(self, "device", None) if move_to_device else None
        return tokens.to(device) if isinstance(device, torch.device) else tokens

    def _bos_id(self) -> int | None:
        """The BOS id: the tokenizer's `bos_token_id`, else the checkpoint metadata's `bos`; None when neither says."""
        found = getattr(getattr(self, "tokenizer", None), "bos_token_id", None)
        if found is None:
            metadata = getattr(self, "metadata", None) or {}
            found = next((metadata[k] for k in ("bos", "bos_token", "bos_token_id") if metadata.get(k) is not None), None)
        return None if found is None else int(found)

    def _with_bos(self, ids: list[int], prepend_bos: bool | None) -> list[int]:
        if prepend_bos is None:
            return ids
        bos = self._bos_id()
        if bos is None:
            if prepend_bos:
                raise ValueError(f"prepend_bos=True: {type(self).__name__} has no BOS token (its tokenizer has no "
                                 "bos_token_id and its checkpoint metadata names no bos); pass prepend_bos=False.")
            return ids
        starts = bool(ids) and ids[0] == bos
        return ([bos] + ids if not starts else ids) if prepend_bos else (ids[1:] if starts else ids)

    def _padded(self, encoded: list[list[int]], padding_side: str) -> list[list[int]]:
        """Sequences of one length: right-padded for a causal model (see `to_tokens`), else refused."""
        width = max(len(ids) for ids in encoded)
        if all(len(ids) == width for ids in encoded):
            return encoded
        if padding_side != "right" or not self._pads_right_safely():
            why = "padding on the left" if padding_side != "right" else "an encoder's padding"
            raise ValueError(
                f"the {len(encoded)} strings encode to lengths {sorted({len(ids) for ids in encoded})}, and {why} is "
                "read by the real positions: such a batch needs an attention mask. Use "
                f"interp.data.text_prompts(texts, model.tokenizer, padding_side={padding_side!r}).")
        tokenizer = getattr(self, "tokenizer", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        pad = pad if pad is not None else self._bos_id()
        pad = 0 if pad is None else int(pad)
        return [ids + [pad] * (width - len(ids)) for ids in encoded]

    def _tokenizer_or_raise(self, what: str) -> Any:
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(f"{type(self).__name__} has no tokenizer, so {what}; pass token ids, "
                             "or set model.tokenizer.")
        return tokenizer

    def _token_string(self, token_id: int) -> str:
        tokenizer = self._tokenizer_or_raise("its token ids cannot be written as strings")
        write = getattr(tokenizer, "token_string", None)
        return str(write(token_id)) if write is not None else str(tokenizer.decode([token_id]))

    def to_str_tokens(self, tokens) -> list[str] | list[list[str]]:
        """Each token as a string (TransformerLens's `to_str_tokens`): a list for one sequence (a string,
        a list of ids, a 1-D tensor or a (1, pos) batch), a list of lists for a (batch, pos) tensor."""
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens)[0]
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2 and tokens.shape[0] > 1:
            return [[self._token_string(int(i)) for i in row] for row in tokens]
        return [self._token_string(int(i)) for i in tokens.flatten()]

    def to_string(self, tokens) -> str | list[str]:
        """Token ids back to text (TransformerLens's `to_string`): one string for a sequence, a list for a batch."""
        tokenizer = self._tokenizer_or_raise("its token ids cannot be decoded")
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return [str(tokenizer.decode(row.tolist())) for row in tokens]
        return str(tokenizer.decode(tokens.flatten().tolist()))

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (TransformerLens's `to_single_token`)."""
        ids = self.to_tokens(string)[0]
        if ids.numel() != 1:
            raise ValueError(f"{string!r} encodes to {ids.numel()} tokens {ids.tolist()}, not one; pass a token id.")
        return int(ids[0])
