"""Plain-data specs read from command-line flags and files: prompt sets and claims files.

Nothing here imports torch at module level: the `interp` command parses flags and claims
files before it decides whether to load a model.

Claims files
------------
A claims file is TOML. It names the claims to test, and optionally the model and the prompts
to test them on::

    model = "toy-induction"        # optional: the default model spec (a CLI/pytest spec wins)
    alpha = 0.05                   # optional: false discovery rate (Benjamini-Hochberg)

    [prompts]                      # optional: how to build the prompt set
    kind = "repeated"              # repeated | random | text
    n = 64                         # number of prompts
    prefix_len = 20                # repeated: length of the repeated block
    seed = 0

    [claims]
    L1H2 = "induction"                         # one claim about head 2 of layer 1
    L0H1 = ["previous_token", "positional"]    # several claims about one head
    L0H0 = "not induction"                     # pin a negative: passes when refuted
    "L0H1 ~ L0H3" = "redundant"                # a claim about a pair of heads
    "L0H0 -> L1H2 via k" = "composes"          # a claim about an edge: L1H2's key reads L0H0's write
    "L0H0 -> L1H2 via q" = "not composes"      # ... refuted: the edge's effect lies within the practical minimum
    model = "causal"                           # a claim about the whole model

Heads are labelled `L{layer}H{head}`, 0-based. An edge is `SENDER -> RECEIVER via q|k|v` between heads
(`interp.paths`), the receiver in a later layer than the sender. A claim kind prefixed with `not ` expects the
verdict "refuted"; any other claim expects "supported" (an inconclusive verdict fails both).
Which kinds exist is decided by `interp.analyses.claims.registry` (`interp claims --list-kinds`).
Syntax errors are reported as `FILE:LINE:COLUMN: message`.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Literal, get_args

from interp.errors import BadInput
from interp.heads import Head, head_label, parse_head
from interp.validate import check_head_pair

PromptKind = Literal["repeated", "random", "text"]
PROMPT_KINDS: tuple[str, ...] = get_args(PromptKind)
Expect = Literal["supported", "refuted"]

_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


SEED_MAX = 2**32 - 1  # torch generators take 64 bits; analyses add small offsets to a seed


class SpecError(BadInput):
    """A flag, prompt spec or claims file is malformed; the message says where and how to fix it."""


class ClaimsFileError(SpecError):
    """A claims file that cannot be read; the message starts with FILE:LINE:COLUMN."""


# --------------------------------------------------------------------------- prompt specs


@dataclass(frozen=True)
class PromptSpec:
    """How to build a prompt set; plain data, so reports can print it in their methods section."""

    kind: str = "repeated"  # repeated | random | text, or "file" when `file` is given
    n: int | None = None  # number of prompts; None = the analysis's default
    seed: int = 0  # seed of the prompt generator
    prefix_len: int | None = None  # repeated: length of the repeated block (default from n_ctx)
    n_repeats: int | None = None  # repeated: copies of the block (default 2)
    seq_len: int | None = None  # random: sequence length (default from n_ctx)
    file: str | None = None  # text file (one prompt a line) or JSON list of token-id lists
    max_len: int | None = None  # text: truncate/pad to this many tokens

    def __post_init__(self) -> None:
        if self.file is None and self.kind not in PROMPT_KINDS:
            raise SpecError(
                f"unknown prompt kind {self.kind!r}; expected one of {list(PROMPT_KINDS)} or a path to a "
                "prompt file (.txt: one text a line; .json: a list of token-id lists)."
            )
        for name in ("n", "prefix_len", "n_repeats", "seq_len", "max_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SpecError(f"prompts: {name}={value!r} must be a positive integer.")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= SEED_MAX:
            raise SpecError(f"prompts: seed={self.seed!r} must be an integer in [0, 2**32 - 1].")

    @classmethod
    def parse(cls, kind_or_file: str | None, **overrides: Any) -> "PromptSpec":
        """From a `--prompts KIND|FILE` flag: a known kind, else an existing file."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if kind_or_file is None:
            return cls(**overrides)
        if kind_or_file in PROMPT_KINDS:
            return cls(kind=kind_or_file, **overrides)
        path = Path(kind_or_file)
        if path.suffix in (".txt", ".json") or path.exists():
            if not path.is_file():
                raise SpecError(f"prompt file {kind_or_file!r} does not exist; pass a prompt kind {list(PROMPT_KINDS)} or an existing file.")
            return cls(kind="file", file=str(path), **overrides)
        import difflib

        close = difflib.get_close_matches(kind_or_file.lower(), PROMPT_KINDS, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise SpecError(
            f"unknown prompt kind {kind_or_file!r}; expected one of {list(PROMPT_KINDS)} or a path to a prompt "
            f"file (.txt one text a line, .json a list of token-id lists).{hint}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def default_texts() -> list[str]:
    """Sentences of the corpus shipped with the toolkit (`interp.data.corpus_text`), one prompt each."""
    from interp.data import corpus_text

    text = " ".join(corpus_text().split())
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)]
    return [s for s in sentences if len(s.split()) >= 4]


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"prompt file {path} is not UTF-8 text (byte {error.start}: {error.reason}); save it as "
                        "UTF-8, one prompt a line.") from None
    except OSError as error:
        raise SpecError(f"prompt file {path} cannot be read: {error}") from None
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines:
        raise SpecError(f"prompt file {path} has no non-empty lines.")
    return lines


def build_prompts(model, spec: PromptSpec, *, default_n: int = 64):
    """A `interp.data.PromptSet` for `model` from a spec; sizes default from the model's context.

    Repeated prompts get `prefix_len = min(20, (n_ctx - 1) // 2)` by default; text prompts use
    the model's own tokenizer when it has one, else a character tokenizer.
    """
    import interp.data as data
    from interp.modelinfo import context_length, vocab_size

    n = spec.n or default_n
    d_vocab = vocab_size(model)  # config, else the model's nn.Embedding
    n_ctx = context_length(model) or 512
    bos = _bos_token(model)
    room = n_ctx - (1 if bos is not None else 0)
    if spec.kind == "repeated":
        n_repeats = spec.n_repeats or 2
        prefix_len = spec.prefix_len or max(1, min(20, room // n_repeats))
        if n_repeats * prefix_len > room:
            raise SpecError(
                f"prefix_len={prefix_len} repeated {n_repeats} times does not fit the model's context n_ctx={n_ctx}"
                f"{' after its BOS token' if bos is not None else ''}; use prefix_len <= {room // n_repeats}."
            )
        vocab = _need_vocab(d_vocab, spec.kind)
        return data.repeated_tokens(n, prefix_len, _token_range(vocab, bos), seed=spec.seed, bos=bos, n_repeats=n_repeats)
    if spec.kind == "random":
        seq_len = spec.seq_len or min(40, room)
        if seq_len > room:
            raise SpecError(f"seq_len={seq_len} exceeds the model's context n_ctx={n_ctx}; use seq_len <= {room}.")
        vocab = _need_vocab(d_vocab, spec.kind)
        return data.random_tokens(n, seq_len, _token_range(vocab, bos), seed=spec.seed, bos=bos)
    if spec.kind == "file":
        assert spec.file is not None  # PromptSpec refuses the kind "file" without a file
        if spec.file.endswith(".json"):
            return _json_prompts(Path(spec.file), d_vocab, n=spec.n, n_ctx=context_length(model))
        texts = _read_lines(Path(spec.file))
    else:
        texts = default_texts()
    return _text_prompts(model, texts, spec, n=spec.n, max_len=spec.max_len or min(64, n_ctx))


def _need_vocab(d_vocab: int | None, kind: str) -> int:
    """The vocabulary size a token-id prompt kind draws from; a SpecError if the model has none."""
    if d_vocab is None:
        raise SpecError(
            f"prompt kind {kind!r} needs the model's vocabulary size (a config's d_vocab / vocab_size, or an "
            "nn.Embedding) and this model has none; use --prompts text or a .json file of token ids."
        )
    return d_vocab


def _bos_token(model) -> int | None:
    """The model's BOS token id, from its checkpoint metadata (`bos` or `bos_token`), if it has one."""
    metadata = getattr(model, "metadata", None) or {}
    sources = [metadata] + [v for v in metadata.values() if isinstance(v, dict)]
    for source in sources:
        for key in ("bos", "bos_token", "bos_token_id"):
            if source.get(key) is not None:
                return int(source[key])
    return None


def _token_range(d_vocab: int, bos: int | None) -> int:
    """Ids drawn for prompt bodies: every id but a BOS id at the end of the vocabulary."""
    return d_vocab - 1 if bos is not None and bos == d_vocab - 1 else d_vocab


def _json_prompts(path: Path, d_vocab, *, n: int | None = None, n_ctx: int | None = None):
    """The token-id rows of a .json prompt file, the first `n` of them (as for a .txt file), each checked against
    the vocabulary and the context."""
    import json

    import torch

    from interp.data import PromptSet

    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise SpecError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: cannot read the prompt file: {error}") from None
    check_token_rows(rows, str(path), d_vocab)
    rows = rows[:n] if n else rows
    longest = max(range(len(rows)), key=lambda i: len(rows[i]))
    if n_ctx is not None and len(rows[longest]) > n_ctx:
        raise SpecError(f"{path}: row {longest} holds {len(rows[longest])} token ids but the model's context is "
                        f"n_ctx={n_ctx}; shorten the file's rows to {n_ctx} tokens at most (or use --prompts repeated "
                        "or random, which fit the context).")
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    ragged = bool((mask == 0).any())
    return PromptSet(tokens, mask if ragged else None, meta={"kind": "file", "file": str(path)})


def check_token_rows(rows: Any, where: str, d_vocab: int | None = None) -> None:
    """A SpecError naming the row, position and value unless `rows` is a non-empty list of non-empty
    lists of integer token ids (in [0, d_vocab) when given). Floats are refused, never truncated."""
    example = "e.g. [[1, 2, 3], [4, 5, 6]]"
    if not isinstance(rows, list) or not rows:
        raise SpecError(f"{where}: expected a non-empty JSON list of non-empty token-id lists, {example}; got "
                        f"{_short(rows)}.")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise SpecError(f"{where}: row {i} is {_short(row)}; every row must be a non-empty list of token ids, {example}.")
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{where}: row {i}, position {j} holds {_short(value)}; token ids must be integers "
                                f"(a float such as 1.5 is not truncated), {example}.")
            if value < 0 or (d_vocab is not None and value >= d_vocab):
                limit = f"[0, {d_vocab})" if d_vocab is not None else "non-negative"
                raise SpecError(f"{where}: row {i}, position {j} holds token id {value}; ids must be {limit} for this model.")


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _text_prompts(model, texts: list[str], spec: PromptSpec, *, n: int | None, max_len: int):
    import interp.data as data

    texts = texts[:n] if n else texts
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise SpecError(
            f"{type(model).__name__} has no tokenizer, so text prompts cannot be built for it; "
            "use --prompts repeated or random, or a .json file of token-id lists."
        )
    from interp.modelinfo import context_length

    n_ctx = context_length(model)
    return data.text_prompts(texts, tokenizer, max_len=max_len, n_ctx=n_ctx)


# --------------------------------------------------------------------------- claims files


@dataclass(frozen=True)
class ClaimEntry:
    """One claim line of a claims file: which heads, which kind, which verdict is expected."""

    target: str  # "L1H2", "L0H1 ~ L0H3", "L0H0 -> L1H2 via k" or "model"
    heads: tuple[Head, ...]  # ((layer, head), ...): an edge's sender and receiver; empty for a model claim
    kind: str  # claim kind, e.g. "induction"
    expect: Expect = "supported"
    line: int = 0  # 1-based line in the file (0 when unknown)
    edge: str | None = None  # an edge claim's edge, "L0H0 -> L1H2 via k" (`interp.paths.parse_edge`); None otherwise

    @property
    def name(self) -> str:
        return f"{self.target}: {'not ' if self.expect == 'refuted' else ''}{self.kind}"


@dataclass(frozen=True)
class ClaimsFile:
    """A parsed claims file."""

    claims: tuple[ClaimEntry, ...]
    model: str | None = None
    prompts: PromptSpec = field(default_factory=PromptSpec)
    alpha: float = 0.05
    path: str | None = None


_TOP_KEYS = ("model", "alpha", "prompts", "claims")


def parse_heads_flag(text: str | None) -> tuple[Head, ...] | None:
    """'L0H1,L1H2' -> ((0, 1), (1, 2)); None stays None."""
    if text is None:
        return None
    return tuple(parse_head(part) for part in text.split(",") if part.strip())


def parse_layers_flag(text: str | None) -> tuple[int, ...] | None:
    """'0,1' or '0-2' -> (0, 1) / (0, 1, 2)."""
    if text is None:
        return None
    layers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                layers.extend(range(low, high + 1))
            elif part:
                layers.append(int(part))
        except ValueError:
            raise SpecError(f"--layers {text!r}: expected layer numbers like '0,1' or '0-3'.") from None
    return tuple(layers)


def _line_of(text: str, key: str, section: str | None = None) -> int:
    """1-based line where `key = ...` appears (after `[section]` when given); 0 if not found."""
    in_section = section is None
    pattern = re.compile(r"^\s*(?:\"" + re.escape(key) + r"\"|'" + re.escape(key) + r"'|" + re.escape(key) + r")\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if section is not None and stripped.startswith("["):
            in_section = stripped.strip("[] ") == section
            continue
        if in_section and pattern.match(line):
            return number
    return 0


@dataclass(frozen=True)
class _ClaimsSource:
    """The text of a claims file and its path, to point errors at FILE:LINE:COLUMN."""

    text: str
    path: str

    def line(self, key: str, section: str | None = None) -> int:
        return _line_of(self.text, key, section)

    def fail(self, message: str, line: int = 0, column: int = 1) -> ClaimsFileError:
        return ClaimsFileError(f"{self.path}:{line or '?'}:{column if line else '?'}: {message}")


def parse_claims_text(text: str, path: str = "<claims>", *, valid_kinds: Iterable[str] | None = None) -> ClaimsFile:
    """Parse claims-file text; errors name FILE:LINE:COLUMN and the fix.

    Stages: TOML, the top-level keys, the [prompts] table, the [claims] table (checked against
    `valid_kinds` when given)."""
    source = _ClaimsSource(text, path)
    document = _toml_document(source)
    model, alpha = _top_level(document, source)
    prompts = _prompt_spec(document, source)
    kinds = sorted(valid_kinds) if valid_kinds is not None else None
    entries = _claim_entries(document, source, kinds)
    return ClaimsFile(entries, model, prompts, alpha, path)


def _toml_document(source: _ClaimsSource) -> dict[str, Any]:
    """The parsed TOML; a syntax error names its line and column."""
    try:
        return tomllib.loads(source.text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        where = _TOML_POSITION.search(message)
        if where:
            line, column = where.group(1), where.group(2)
        else:  # "(at end of document)": point at the end of the last line
            lines = source.text.splitlines() or [""]
            line, column = str(len(lines)), str(len(lines[-1]) + 1)
        reason = _TOML_POSITION.sub("", message).replace("(at end of document)", "at the end of the file").strip()
        raise ClaimsFileError(f"{source.path}:{line}:{column}: TOML syntax error: {reason}") from None


def _top_level(document: dict[str, Any], source: _ClaimsSource) -> tuple[str | None, float]:
    """The known top-level keys only; `model` and `alpha` checked: (model, alpha)."""
    unknown = sorted(set(document) - set(_TOP_KEYS))
    if unknown:
        raise source.fail(f"unknown top-level key {unknown[0]!r}; expected some of {list(_TOP_KEYS)}.", source.line(unknown[0]))
    model = document.get("model")
    if model is not None and not isinstance(model, str):
        raise source.fail(f"model = {model!r} must be a string model spec, e.g. \"toy-induction\".", source.line("model"))
    alpha = document.get("alpha", 0.05)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
        raise source.fail(f"alpha = {alpha!r} must be a number in (0, 1), e.g. 0.05.", source.line("alpha"))
    return model, float(alpha)


def _prompt_spec(document: dict[str, Any], source: _ClaimsSource) -> PromptSpec:
    """The [prompts] table as a PromptSpec (a prompt file relative to the claims file)."""
    prompt_table = document.get("prompts", {})
    if not isinstance(prompt_table, dict):
        raise source.fail("prompts must be a table: [prompts] kind = \"repeated\" ...", source.line("prompts"))
    allowed = [f.name for f in fields(PromptSpec)]
    for key in prompt_table:
        if key not in allowed:
            raise source.fail(f"unknown prompts key {key!r}; expected some of {allowed}.", source.line(key, "prompts"))
    try:
        if "file" in prompt_table and source.path != "<claims>":
            # a prompt file is relative to the claims file
            prompt_table = {**prompt_table, "file": str(Path(source.path).parent / prompt_table["file"]), "kind": "file"}
        return PromptSpec(**prompt_table)
    except (SpecError, TypeError) as error:
        key = "kind" if "kind" in str(error) else next(iter(prompt_table), "prompts")
        raise source.fail(str(error).removeprefix("prompts: "), source.line(key, "prompts")) from None


def _claim_entries(document: dict[str, Any], source: _ClaimsSource, kinds: list[str] | None) -> tuple[ClaimEntry, ...]:
    """One ClaimEntry per (target, kind) of the [claims] table, in file order; none claimed twice."""
    claim_table = document.get("claims")
    if not isinstance(claim_table, dict) or not claim_table:
        raise source.fail("no claims: add a [claims] table, e.g.\n[claims]\nL1H2 = \"induction\"", source.line("claims"))
    entries: list[ClaimEntry] = []
    for key, value in claim_table.items():
        line = source.line(key, "claims")
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise source.fail(f"{key} = {value!r}: expected a claim kind or a list of kinds, e.g. \"induction\".", line)
        target, heads = _claim_target(key.strip(), source, line)
        edge = target if "->" in target else None
        for raw in values:
            kind, expect = _claim_kind(raw, kinds, source, target=target, line=line)
            entry = ClaimEntry(target, heads, kind, expect, line, edge)
            for other in entries:
                if other.name == entry.name:
                    raise source.fail(f"{entry.name!r} is claimed twice; remove one.", line)
                if (other.target, other.kind) == (entry.target, entry.kind):
                    raise source.fail(f"{target!r} is claimed both ways: {other.name!r} (line {other.line}) and "
                                      f"{entry.name!r}; one of them always fails. Keep the one you mean.", line)
            entries.append(entry)
    return tuple(entries)


def _claim_target(target: str, source: _ClaimsSource, line: int) -> tuple[str, tuple[Head, ...]]:
    """A [claims] key as (label, heads): "model" -> ("model", ()), "L0H1~L0H3" -> ("L0H1 ~ L0H3", ((0, 1), (0, 3)))."""
    if target.lower() == "model":
        return target, ()
    if "->" in target or re.search(r"\svia\s", target, re.IGNORECASE):  # an edge, or meant as one ("L0H0 - > L1H0 via k")
        return _edge_target(target, source, line)
    try:
        heads = tuple(parse_head(part) for part in target.split("~"))
    except BadInput as error:
        raise source.fail(f"{error} Pairs are written \"L0H1 ~ L0H3\"; a whole-model claim uses the key model.", line) from None
    if len(heads) > 2:
        raise source.fail(f"{target!r}: a claim is about one head or a pair of heads (\"L0H1 ~ L0H3\").", line)
    if len(heads) == 2:
        try:
            check_head_pair(*heads, what="pair")
        except BadInput as error:
            raise source.fail(str(error), line) from None
    return " ~ ".join(map(head_label, heads)), heads


def _edge_target(target: str, source: _ClaimsSource, line: int) -> tuple[str, tuple[Head, ...]]:
    """An edge key as (its label, (sender head, receiver head)): "L0H0->L1H2 via K" -> ("L0H0 -> L1H2 via k", ...).
    Edges join two heads through q, k or v, the receiver in a later layer; into a key/value head of grouped-query
    attention ("L0H0 -> L1KV0 via k") the heads are the sender's alone (the edge, the claim's target, names the rest)."""
    from interp.paths import HEAD_VIAS, parse_edge  # torch: only a file that claims an edge pays for it

    example = "write it as \"L0H0 -> L1H2 via k\" (via q, k or v)"
    try:
        edge = parse_edge(target)
    except BadInput as error:
        raise source.fail(f"{error} An edge claim joins two heads: {example}.", line) from None
    kv = edge.receiver.kind == "kv"  # a key/value head of grouped-query attention: via k or v
    if edge.sender.kind != "head" or edge.receiver.kind not in ("head", "kv") or edge.via not in (("k", "v") if kv
                                                                                                    else HEAD_VIAS):
        raise source.fail(f"{target!r}: an edge claim joins two heads through q, k or v (a key/value head "
                          f"\"L1KV0\" through k or v); {example}.", line)
    if edge.receiver.layer <= edge.sender.layer:
        raise source.fail(f"{target!r}: the receiver {edge.receiver} (layer {edge.receiver.layer}) must sit in a later layer "
                          f"than the sender {edge.sender} (layer {edge.sender.layer}): a head reads only earlier layers; "
                          "swap them or pick a later receiver.", line)
    heads = (Head(edge.sender.layer, edge.sender.head),) + (() if kv else (Head(edge.receiver.layer, edge.receiver.head),))
    return edge.label, heads


def _claim_kind(raw: str, kinds: list[str] | None, source: _ClaimsSource, *, target: str, line: int) -> tuple[str, Expect]:
    """A claim value as (kind, expect): "not induction" -> ("induction", "refuted"); unknown kinds refused."""
    kind = raw.strip()
    expect: Expect = "supported"
    if kind.lower().startswith("not "):
        expect, kind = "refuted", kind[4:].strip()
    kind = kind.replace("-", "_").replace(" ", "_").lower()
    if kinds is not None and kind not in kinds:
        import difflib

        close = difflib.get_close_matches(kind, kinds, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise source.fail(f"{target}: unknown claim kind {raw!r}; expected one of {kinds}.{hint}", line)
    return kind, expect


def read_claims_file(path: str | Path, *, valid_kinds: Iterable[str] | None = None) -> ClaimsFile:
    """Read and parse a claims file (see the module docstring for the format)."""
    path = Path(path)
    if not path.is_file():
        raise ClaimsFileError(f"{path}: claims file not found; pass the path of a .toml claims file.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ClaimsFileError(f"{path}: cannot read the claims file: {error}") from None
    return parse_claims_text(text, str(path), valid_kinds=valid_kinds)
