"""Where a leak enters, down to the line of code: the first torch operation at which an earlier
position comes to depend on what it must not see.

Two forward passes that differ only in what must not matter (`OpPair`): the later tokens
resampled (a future leak), the later positions removed (a leak through the sequence's length),
another row of the batch changed (batch mixing), or the pads' content changed (padding). Every
torch call of both passes is seen under a `TorchFunctionMode`, in execution order. An op's output
is *restricted* to what the observed positions may depend on: along every axis whose size is the
sequence length, the observed positions only (so a score of query q on a later key, which may
differ before the mask, is not compared; after the softmax, every entry of an observed row is);
along an axis of the batch size, the observed row (an axis of batch x length is unflattened
first). The first op whose restricted outputs differ by more than the threshold is the origin:
its file, line, function, op name and source line (`Origin`), where the call site is the first
frame outside torch and this toolkit; when that frame lies in an installed library (a Hugging
Face module), the first frame in the user's own files is named too.

The sequence length of the pair is chosen unlike every parameter dimension of the model, so a
positional axis is not mistaken for a head or width axis. Memory: the reference's restricted
outputs are kept for a window of ops within `MAX_BYTES`; the passes stop once past the window,
and the next window starts where the last ended, so the cost grows with the depth of the origin,
not with the model's activations.
"""
from __future__ import annotations

import linecache
import os
import math
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import einops
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import interp
from interp.analyses.leakage.methods import _change, _scale, restrict
from interp.modelinfo import context_length

MAX_BYTES = 256 * 2**20  # reference outputs kept per window
_TORCH_DIRS = tuple(str(Path(str(module.__file__)).resolve().parent) for module in (torch, einops))  # ops pass through these
_INTERP = Path(str(interp.__file__)).resolve().parent  # interp/ holds (a checkout: links to) models/ and analyses/
_MODEL_DIRS = tuple({str(_INTERP / "models") + os.sep, str((_INTERP / "models").resolve()) + os.sep})  # our models: user code
_TOOLKIT_DIRS = tuple({str(_INTERP) + os.sep, str((_INTERP / "analyses").resolve()) + os.sep})
_INSTALLED = {"site-packages", "dist-packages"}  # installed code, whichever environment's path put it there
_LIBRARY_DIRS = tuple({str(Path(p).resolve()) for key in ("purelib", "platlib", "stdlib") if (p := sysconfig.get_paths().get(key))})


@dataclass(frozen=True)
class Frame:
    """One line of source: where an op was called."""

    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}: {self.code}"


@dataclass(frozen=True)
class Origin:
    """The first op at which the leak of `kind` appears, and what it did there."""

    kind: str  # "future", "batch" or "padding"
    frame: Frame  # the op's call site
    op: str  # the torch function, e.g. "softmax", "scaled_dot_product_attention", "view"
    detail: str  # e.g. "row 5 now depends on positions 6..12"
    influence: float  # the op's restricted change, relative to its outputs' spread (inf: a code path changed)
    mask: str | None = None  # what the mask given to the op lets through, e.g. "key 6 is visible to query 5"
    user_frame: Frame | None = None  # the first frame in the user's own files, when `frame` lies in a library

    def to_dict(self) -> dict[str, Any]:
        user = None if self.user_frame is None else vars(self.user_frame)
        return {"file": self.frame.file, "line": self.frame.line, "function": self.frame.function, "op": self.op,
                "code": self.frame.code, "kind": self.kind, "detail": self.detail, "mask": self.mask,
                "influence": self.influence if math.isfinite(self.influence) else None, "user_frame": user}

    def __str__(self) -> str:
        text = f"{Path(self.frame.file).name}:{self.frame.line} in {self.frame.function}: {self.frame.code}: {self.detail}"
        if self.mask:
            text += f" ({self.mask})"
        if self.user_frame is not None:
            text += f"; called from {Path(self.user_frame.file).name}:{self.user_frame.line} in {self.user_frame.function}"
        return text


@dataclass(frozen=True)
class OpPair:
    """Two inputs whose observed outputs must agree: `reference` and `variant` tokens (rows, pos),
    the same attention `mask` rows (or None), the observed `row` and positions `keep` (indices,
    valid in both: the variant may be the prefix alone)."""

    kind: str
    reference: torch.Tensor
    variant: torch.Tensor
    row: int
    keep: torch.Tensor
    describe: Callable[[int], str]  # the observed position that moved -> the detail's words
    mask: torch.Tensor | None = None  # the reference's attention_mask
    variant_mask: torch.Tensor | None = None  # the variant's, when it differs in length


class _Stop(BaseException):
    """Ends a pass past its window (a BaseException, so the model's own `except Exception` lets it through)."""


class _Trace(TorchFunctionMode):
    """Calls `visit(index, func, args, kwargs, out)` for every torch call of a forward, in order."""

    def __init__(self, visit: Callable[..., None]):
        super().__init__()
        self.visit, self.index = visit, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _tensors(out):
            self.visit(self.index, func, args, kwargs, out)
            self.index += 1
        return out


def _tensors(out: Any) -> list[torch.Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_complex()]


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    return {"__getitem__": "getitem", "__get__": "attribute"}.get(name, name.strip("_") or name)


def _influence(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Largest change of b from a over a's spread; 0 equal, inf for unequal non-float values, None if shapes differ."""
    if a.shape != b.shape:
        return None
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    a32, b32 = a.float(), b.float()
    change = float(_change(a32, b32).max()) if a32.numel() else 0.0
    if change == 0.0:
        return 0.0
    finite = a32[torch.isfinite(a32)]
    return change / (_scale(finite) if finite.numel() else 1.0)


def _moved_position(a: torch.Tensor, b: torch.Tensor, axis: int, keep: torch.Tensor) -> int:
    """The observed position (an index into `keep`'s values) whose entries moved most."""
    change = _change(a.float(), b.float()).movedim(axis, 0)
    change = change.reshape(change.shape[0], -1).amax(dim=1)  # (position,)
    return int(keep[int(change.argmax())])


# ---------------------------------------------------------------------------------------------
# Call sites
# ---------------------------------------------------------------------------------------------

def _where(path: str) -> str:
    """"torch" (torch and einops, through which an op passes), "toolkit", "library" or "user" for a source file."""
    resolved = str(Path(path).resolve()) if not path.startswith("<") else path
    if resolved.startswith(_TORCH_DIRS) or path.startswith("<"):
        return "torch"
    if resolved.startswith(_MODEL_DIRS):  # the toolkit's models are models like the user's (the zoo's leaks are theirs)
        return "user"
    if resolved.startswith(_TOOLKIT_DIRS):
        return "toolkit"
    if resolved.startswith(_LIBRARY_DIRS) or _INSTALLED.intersection(Path(resolved).parts):
        return "library"
    return "user"


def _frame(frame: FrameType) -> Frame:
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname, code)


def call_site(frame: FrameType | None) -> tuple[Frame | None, Frame | None]:
    """The op's call site (the first frame outside torch and the toolkit) and, when that lies in an
    installed library, the first frame in the user's files before the toolkit's own frames."""
    while frame is not None and _where(frame.f_code.co_filename) in ("torch", "toolkit"):
        frame = frame.f_back
    if frame is None:
        return None, None
    site = _frame(frame)
    if _where(frame.f_code.co_filename) != "library":
        return site, None
    outer = frame.f_back
    while outer is not None and _where(outer.f_code.co_filename) in ("library", "torch"):
        outer = outer.f_back
    user = _frame(outer) if outer is not None and _where(outer.f_code.co_filename) == "user" else None
    return site, user


# ---------------------------------------------------------------------------------------------
# Masks: what the op's mask argument lets through
# ---------------------------------------------------------------------------------------------

def _visible_later(func: Any, args: tuple, kwargs: dict, n_pos: int) -> torch.Tensor | None:
    """(query, key) True where the op's mask lets a query see a later key; None when the op takes no mask."""
    name = _op_name(func)
    if name == "scaled_dot_product_attention":
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        causal = bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False))
        if causal:
            return torch.zeros(n_pos, n_pos, dtype=torch.bool)
        if mask is None:
            return torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1)
        visible = mask if mask.dtype == torch.bool else mask.float() > -1e4  # an additive mask lets through > -1e4
    elif name in ("matmul", "bmm", "einsum"):  # attention weights times values: weight on a later key leaks
        weights = [t for t in args if isinstance(t, torch.Tensor) and t.ndim >= 2
                   and tuple(t.shape[-2:]) == (n_pos, n_pos) and t.is_floating_point()]
        if not weights or bool((weights[0] < 0).any()):
            return None
        square = weights[0].detach().reshape(-1, n_pos, n_pos).cpu().gt(0).any(dim=0)  # (query, key)
        return square & torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1)
    elif name in ("masked_fill", "masked_fill_"):
        mask = args[1] if len(args) > 1 else kwargs.get("mask")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return None
        visible = ~mask
    else:
        return None
    if visible.ndim < 2 or tuple(visible.shape[-2:]) != (n_pos, n_pos):
        return None
    square = visible.detach().reshape(-1, n_pos, n_pos).cpu().all(dim=0)  # (query, key): visible in every row and head
    return square & torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1)


def mask_words(visible: torch.Tensor | None, weights: bool = False) -> str | None:
    """"the mask lets key 6 be seen by query 5" (the first such pair, and how many there are), or None."""
    if visible is None or not bool(visible.any()):
        return None
    pairs = visible.nonzero()
    query, key = (int(v) for v in pairs[0])
    more = f"; {len(pairs)} (query, later key) pairs are visible" if len(pairs) > 1 else ""
    what = f"the attention weights give query {query} weight on key {key}" if weights else \
        f"the mask lets key {key} be seen by query {query}"
    return what + more


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------

@dataclass
class _Window:
    start: int
    stored: dict[int, tuple[str, list[tuple[torch.Tensor, int] | None]]]
    end: int = -1  # last index stored
    finished: bool = False  # the reference ran to its end inside this window


def _run(model: Callable, tokens: torch.Tensor, mask: torch.Tensor | None, visit: Callable[..., None]) -> bool:
    """One forward under the trace; False when `visit` stopped it."""
    kwargs = {} if mask is None else {"attention_mask": mask}
    try:
        with torch.no_grad(), _Trace(visit):
            model(tokens, **kwargs)
    except _Stop:
        return False
    return True


def _reference_window(model: Callable, pair: OpPair, start: int) -> _Window:
    window = _Window(start, {})
    used = 0
    n_rows, n_pos = pair.reference.shape

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        nonlocal used
        if index < start:
            return
        if used > MAX_BYTES and index > start:
            raise _Stop
        kept = [restrict(t, n_rows=n_rows, n_pos=n_pos, row=pair.row, keep=pair.keep) for t in _tensors(out)]
        kept = [None if k is None else (k[0].clone(), k[1]) for k in kept]
        used += sum(k[0].numel() * k[0].element_size() for k in kept if k is not None)
        window.stored[index] = (_op_name(func), kept)
        window.end = index

    window.finished = _run(model, pair.reference, pair.mask, visit)
    return window


def _compare_window(model: Callable, pair: OpPair, window: _Window, threshold: float) -> Origin | None:
    found: list[Origin] = []
    n_rows, n_pos = pair.variant.shape

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if index < window.start:
            return
        if index > window.end:
            raise _Stop
        name, kept = window.stored[index]
        if name != _op_name(func):
            found.append(_origin(pair, func, args, kwargs, math.inf, "the two runs took different code paths here"))
            raise _Stop
        for reference, tensor in zip(kept, _tensors(out)):
            mine = restrict(tensor, n_rows=n_rows, n_pos=n_pos, row=pair.row, keep=pair.keep)
            if reference is None or mine is None:
                continue
            value = _influence(reference[0], mine[0])
            if value is not None and value > threshold:
                moved = _moved_position(reference[0], mine[0], reference[1], pair.keep)
                found.append(_origin(pair, func, args, kwargs, value, pair.describe(moved)))
                raise _Stop

    _run(model, pair.variant, pair.mask if pair.variant_mask is None else pair.variant_mask, visit)
    return found[0] if found else None


def _origin(pair: OpPair, func: Any, args: tuple, kwargs: dict, influence: float, detail: str) -> Origin:
    site, user = call_site(sys._getframe(1))
    frame = site or Frame("<unknown>", 0, "<unknown>", "")
    visible = _visible_later(func, args, kwargs, pair.reference.shape[1]) if pair.kind == "future" else None
    words = mask_words(visible, weights=_op_name(func) in ("matmul", "bmm", "einsum"))
    return Origin(pair.kind, frame, _op_name(func), detail, influence, words, user)


def find_origin(model: Callable, pair: OpPair, threshold: float) -> Origin | None:
    """The first op whose restricted output differs between the pair's runs by more than `threshold`.

    Both inputs run once untraced first: a model's first forward may do work of its own (a weight check,
    a cache filled per shape) that a later one skips, and the traced passes must take the same path."""
    _run(model, pair.reference, pair.mask, lambda *args: None)
    _run(model, pair.variant, pair.mask if pair.variant_mask is None else pair.variant_mask, lambda *args: None)
    start = 0
    while True:
        window = _reference_window(model, pair, start)
        if window.end < start:
            return None
        origin = _compare_window(model, pair, window, threshold)
        if origin is not None or window.finished:
            return origin
        start = window.end + 1


def parameter_sizes(model: Any) -> set[int]:
    """Every axis size of the model's parameters and buffers except the context length's (which positions share)."""
    if not isinstance(model, nn.Module):
        return set()
    sizes = {size for tensor in [*model.parameters(), *model.buffers()] for size in tensor.shape}
    return sizes - {context_length(model)}


def pair_length(model: Any, preferred: int, max_len: int) -> int:
    """A sequence length near `preferred` (at most max_len, at least 3) that no parameter axis has, so that
    positional axes are told from the others; `preferred` when none is free."""
    taken = parameter_sizes(model)
    for length in sorted(range(3, max_len + 1), key=lambda n: (abs(n - preferred), -n)):
        if length not in taken:
            return length
    return preferred


def batch_rows(model: Any, n_pos: int) -> int:
    """A batch size (2..9) that no parameter axis has and that is not the sequence length."""
    taken = parameter_sizes(model) | {n_pos}
    return next((n for n in range(3, 10) if n not in taken), 3)
