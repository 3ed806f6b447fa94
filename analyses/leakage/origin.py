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

Frames beyond the one that called the model (the audit, pytest, a console-script launcher) are never
model code: an op inside torch's own modules with no model frame has no line (`Origin.frame` None).

What the origin says is measured: the positions its moved row depends on are found one changed
position at a time (`MAX_SINGLE` at most; "row 0 now depends on position 1", not a range), and when
the op consumed a mask that lets a query see a later key (its own argument, or the mask applied to its
input one op before, read as that op reads it: `polarity`), the mask is followed back through the
recorded ops to the op that made it leak (`tril`, a slice, a comparison: `Origin.built`, the line to
fix, `Origin.location`), or to the buffer it was read from, named by its attribute (`attn.bias`) and,
when the model was built under `recording_construction` (the CLI and `audit(spec)` do), the line
that last wrote it (`register_buffer(..., tril(...))` in `__init__`, a `fill_` in the factory).

The sequence length of the pair is chosen unlike every parameter dimension of the model, so a
positional axis is not mistaken for a head or width axis. Memory: the reference's restricted
outputs are kept for a window of ops within `MAX_BYTES`; the passes stop once past the window,
and the next window starts where the last ended, so the cost grows with the depth of the origin,
not with the model's activations.
"""
from __future__ import annotations

import contextlib
import importlib.util
import linecache
import math
import os
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator

import einops
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from interp.analyses.leakage.methods import _change, _scale, restrict
from interp.modelinfo import context_length

MAX_BYTES = 256 * 2**20  # reference outputs kept per window
_TORCH_DIRS = tuple(str(Path(str(module.__file__)).resolve().parent) for module in (torch, einops))  # ops pass through these
_INTERP = Path(str(importlib.util.find_spec("interp").origin)).resolve().parent  # type: ignore[union-attr]  # interp/ holds (a checkout: links to) models/ and analyses/
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
    """The first op at which the leak of `kind` appears, what it did there, and where what it consumed was built."""

    kind: str  # "future", "batch" or "padding"
    frame: Frame | None  # the op's call site in model code; None when every frame lies in torch or a library
    op: str  # the torch function, e.g. "softmax", "scaled_dot_product_attention", "view"
    detail: str  # e.g. "row 5 now depends on position 6"
    influence: float  # the op's restricted change, relative to its outputs' spread (inf: a code path changed)
    mask: str | None = None  # what the mask given to the op lets through, e.g. "key 6 is visible to query 5"
    user_frame: Frame | None = None  # the first frame in the user's own files, when `frame` lies in a library
    built: Frame | None = None  # the line that built the mask or positions the op consumed (`construction`)
    built_by: str | None = None  # what was built there, e.g. "tril" or "buffer h.0.attn.bias (built in __init__)"

    @property
    def location(self) -> Frame | None:
        """The line to fix: where the mask or positions were built when known, else the op's own line, or for an op
        inside an installed library the user's line that called it; None when no line of model code is involved."""
        return self.built or self.user_frame or self.frame

    def to_dict(self) -> dict[str, Any]:
        where = self.location
        return {"file": None if where is None else where.file, "line": None if where is None else where.line,
                "function": None if where is None else where.function, "code": None if where is None else where.code,
                "op": self.op, "kind": self.kind, "detail": self.detail, "mask": self.mask,
                "influence": self.influence if math.isfinite(self.influence) else None,
                "op_frame": _frame_dict(self.frame), "user_frame": _frame_dict(self.user_frame),
                "built": _frame_dict(self.built), "built_by": self.built_by}

    def __str__(self) -> str:
        if self.frame is None and self.user_frame is None and self.built is None:
            text = f"no line of model code: the leak first appears in {self.op} inside torch or a library: {self.detail}"
        else:
            site = self.frame or self.user_frame
            assert site is not None or self.built is not None
            text = _short(site or self.built) + f": {self.detail}"  # type: ignore[arg-type]
        if self.mask:
            text += f" ({self.mask})"
        if self.built is not None:
            text += f"; what it consumed ({self.built_by}) was built at {_short(self.built)}"
        elif self.built_by is not None:
            text += f"; what it consumed is the {self.built_by}, built before the audit could record it"
        if self.user_frame is not None and self.frame is not None:
            text += f"; called from {Path(self.user_frame.file).name}:{self.user_frame.line} in {self.user_frame.function}"
        return text


def _short(frame: Frame) -> str:
    return f"{Path(frame.file).name}:{frame.line} in {frame.function}: {frame.code}"


def _frame_dict(frame: Frame | None) -> dict[str, Any] | None:
    return None if frame is None else vars(frame).copy()


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


_BOUNDARY: list[FrameType] = []  # the frame that called the model (`_run`): nothing beyond it is model code


def call_site(frame: FrameType | None) -> tuple[Frame | None, Frame | None]:
    """The op's call site (the first frame outside torch and the toolkit) and, when that lies in an
    installed library, the first frame in the user's files before the toolkit's own frames. Frames beyond
    the one that called the model (the audit itself, the console-script launcher) are never model code:
    an op with no model frame before that boundary has no call site (None, None)."""
    boundary = _BOUNDARY[-1] if _BOUNDARY else None
    while frame is not None and frame is not boundary and _where(frame.f_code.co_filename) in ("torch", "toolkit"):
        frame = frame.f_back
    if frame is None or frame is boundary:
        return None, None
    site = _frame(frame)
    if _where(frame.f_code.co_filename) != "library":
        return site, None
    outer = frame.f_back
    while outer is not None and outer is not boundary and _where(outer.f_code.co_filename) in ("library", "torch", "toolkit"):
        outer = outer.f_back
    user = _frame(outer) if outer is not None and outer is not boundary and _where(outer.f_code.co_filename) == "user" else None
    return site, user


# ---------------------------------------------------------------------------------------------
# Masks: what the op's mask argument lets through
# ---------------------------------------------------------------------------------------------

def op_visibility(func: Any, args: tuple, kwargs: dict, n_pos: int) -> torch.Tensor | None:
    """(..., query, key) bool, True where an attention op's mask lets a query see a key, as the op was called
    (`scaled_dot_product_attention`'s mask or `is_causal`, an additive mask letting through > -1e4, or the boolean
    mask of `masked_fill`); None when the op takes no square mask over the positions."""
    name = _op_name(func)
    if name == "scaled_dot_product_attention":
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False)):
            return torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
        if mask is None:
            return torch.ones(n_pos, n_pos, dtype=torch.bool)
        visible = mask if mask.dtype == torch.bool else mask.float() > -1e4
    elif name in ("masked_fill", "masked_fill_"):
        mask = args[1] if len(args) > 1 else kwargs.get("mask")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return None
        visible = ~mask
    else:
        return None
    if visible.ndim < 2 or tuple(visible.shape[-2:]) != (n_pos, n_pos):
        return None
    return visible.detach()


def _visible_later(func: Any, args: tuple, kwargs: dict, n_pos: int) -> torch.Tensor | None:
    """(query, key) True where the op's mask lets a query see a later key; None when the op takes no mask."""
    later = torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1)
    if _op_name(func) in ("matmul", "bmm", "einsum"):  # attention weights times values: weight on a later key leaks
        weights = [t for t in args if isinstance(t, torch.Tensor) and t.ndim >= 2
                   and tuple(t.shape[-2:]) == (n_pos, n_pos) and t.is_floating_point()]
        if not weights or bool((weights[0] < 0).any()):
            return None
        return weights[0].detach().reshape(-1, n_pos, n_pos).cpu().gt(0).any(dim=0) & later  # (query, key)
    visible = op_visibility(func, args, kwargs, n_pos)
    if visible is None:
        return None
    return visible.reshape(-1, n_pos, n_pos).cpu().all(dim=0) & later  # (query, key): visible in every row and head


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
    """One forward under the trace; False when `visit` stopped it. This frame is the boundary of model code
    (`call_site`)."""
    kwargs = {} if mask is None else {"attention_mask": mask}
    _BOUNDARY.append(sys._getframe())
    try:
        with torch.no_grad(), _Trace(visit):
            model(tokens, **kwargs)
    except _Stop:
        return False
    finally:
        _BOUNDARY.pop()
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


@dataclass
class _Found:
    """What `_compare_window` found: the op's index, the origin, and (for the dependence set) the observed position
    that moved with the reference's restricted output there."""

    index: int
    origin: Origin
    position: int | None = None
    reference: tuple[torch.Tensor, int] | None = None


def _compare_window(model: Callable, pair: OpPair, window: _Window, threshold: float) -> _Found | None:
    found: list[_Found] = []
    n_rows, n_pos = pair.variant.shape
    producers = _Producers(n_pos)

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if index > window.end:
            raise _Stop
        if index < window.start:
            producers.record(func, args, kwargs, out)
            return
        name, kept = window.stored[index]
        if name != _op_name(func):
            found.append(_Found(index, _origin(pair, func, args, kwargs, math.inf, "the two runs took different code "
                                               "paths here", producers, model)))
            raise _Stop
        for reference, tensor in zip(kept, _tensors(out)):
            mine = restrict(tensor, n_rows=n_rows, n_pos=n_pos, row=pair.row, keep=pair.keep)
            if reference is None or mine is None:
                continue
            value = _influence(reference[0], mine[0])
            if value is not None and value > threshold:
                moved = _moved_position(reference[0], mine[0], reference[1], pair.keep)
                origin = _origin(pair, func, args, kwargs, value, pair.describe(moved), producers, model)
                found.append(_Found(index, origin, moved, reference))
                raise _Stop
        producers.record(func, args, kwargs, out)

    _run(model, pair.variant, pair.mask if pair.variant_mask is None else pair.variant_mask, visit)
    return found[0] if found else None


def _origin(pair: OpPair, func: Any, args: tuple, kwargs: dict, influence: float, detail: str,
            producers: "_Producers", model: Callable) -> Origin:
    site, user = call_site(sys._getframe(1))
    visible = _visible_later(func, args, kwargs, pair.reference.shape[1]) if pair.kind == "future" else None
    words = mask_words(visible, weights=_op_name(func) in ("matmul", "bmm", "einsum"))
    built, built_by = producers.construction(func, args, kwargs, model, by_length=pair.variant.shape != pair.reference.shape)
    return Origin(pair.kind, site, _op_name(func), detail, influence, words, user, built, built_by)


def find_origin(model: Callable, pair: OpPair, threshold: float) -> Origin | None:
    """The first op whose restricted output differs between the pair's runs by more than `threshold`; for a
    future leak with the later tokens resampled, the positions it depends on, one at a time (`dependence`).

    Both inputs run once untraced first: a model's first forward may do work of its own (a weight check,
    a cache filled per shape) that a later one skips, and the traced passes must take the same path."""
    _run(model, pair.reference, pair.mask, lambda *args: None)
    _run(model, pair.variant, pair.mask if pair.variant_mask is None else pair.variant_mask, lambda *args: None)
    start = 0
    while True:
        window = _reference_window(model, pair, start)
        if window.end < start:
            return None
        found = _compare_window(model, pair, window, threshold)
        if found is not None:
            return _with_dependence(model, pair, found, threshold)
        if window.finished:
            return None
        start = window.end + 1


# ---------------------------------------------------------------------------------------------
# What the op depends on: one changed position at a time
# ---------------------------------------------------------------------------------------------

MAX_SINGLE = 32  # a dependence set is measured one position at a time when at most this many positions changed


def _with_dependence(model: Callable, pair: OpPair, found: _Found, threshold: float) -> Origin:
    """The origin, its detail naming the positions its moved row depends on (measured one at a time) when the pair
    changed at most MAX_SINGLE positions of one length; else as found."""
    changed = (pair.reference != pair.variant).any(dim=0).nonzero().flatten() if pair.reference.shape == pair.variant.shape else None
    if found.position is None or found.reference is None or changed is None or not 0 < len(changed) <= MAX_SINGLE:
        return found.origin
    sources = [int(s) for s in changed if _moves_alone(model, pair, found, int(s), threshold)]
    words = dependence_words(found.position, sources, [int(s) for s in changed])
    return replace(found.origin, detail=words)


def _moves_alone(model: Callable, pair: OpPair, found: _Found, source: int, threshold: float) -> bool:
    """Whether the op at `found.index` moves at the found position when only `source` takes the variant's token."""
    assert found.reference is not None and found.position is not None
    tokens = pair.reference.clone()
    tokens[:, source] = pair.variant[:, source]
    n_rows, n_pos = tokens.shape
    at = int((pair.keep == found.position).nonzero()[0])  # the position's index among the observed ones
    moved: list[bool] = []

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if index < found.index:
            return
        outputs = [restrict(t, n_rows=n_rows, n_pos=n_pos, row=pair.row, keep=pair.keep) for t in _tensors(out)]
        assert found.reference is not None
        reference, axis = found.reference
        mine = next((o for o in outputs if o is not None and o[0].shape == reference.shape), None)
        if mine is not None:
            value = _influence(reference.select(axis, at), mine[0].select(axis, at))
            moved.append(value is not None and value > threshold)
        raise _Stop

    _run(model, tokens, pair.mask, visit)
    return bool(moved and moved[0])


def dependence_words(row: int, sources: list[int], changed: list[int]) -> str:
    """"row 0 now depends on position 1" (or "positions 1, 3..5"): the measured set; the changed span when no single
    position moves the row alone (the dependence needs several together)."""
    if not sources:
        return (f"row {row} now depends on positions {_spans(changed)} together (no single one of them moves it "
                "alone)")
    return f"row {row} now depends on position{'s' if len(sources) > 1 else ''} {_spans(sources)}"


def _spans(positions: list[int]) -> str:
    """1, 3..5, 9: sorted positions with runs written as ranges."""
    runs: list[list[int]] = []
    for position in sorted(positions):
        if runs and position == runs[-1][-1] + 1:
            runs[-1].append(position)
        else:
            runs.append([position])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}" for run in runs)


# ---------------------------------------------------------------------------------------------
# Where the mask or positions the op consumed were built
# ---------------------------------------------------------------------------------------------

@dataclass
class _Made:
    """An op that made or consumed a structural tensor (a mask, positions): its name, line, structural inputs."""

    op: str
    site: Frame | None
    inputs: list[torch.Tensor]  # held: a temporary mask (`bias[:T, :T] == 0`) is gone by the time its consumer runs


MAX_MADE = 20_000  # ops recorded per traced forward (masks and positions are few; a cap keeps memory bounded)


class _Producers:
    """The ops of one traced forward that touch masks or positions, by the identity of the tensors they made
    (held, so an identity is never reused within the forward)."""

    def __init__(self, n_pos: int):
        self.n_pos = n_pos
        self.made: dict[int, tuple[torch.Tensor, _Made]] = {}

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if len(self.made) >= MAX_MADE:
            return
        inputs = [t for t in _arg_tensors(args, kwargs) if _structural(t, self.n_pos)]
        outputs = _tensors(out)
        if not inputs and not any(_structural(t, self.n_pos) for t in outputs):
            return
        site, user = call_site(sys._getframe(2))
        made = _Made(_op_name(func), site or user, inputs)
        for tensor in outputs:
            self.made[id(tensor)] = (tensor, made)

    def get(self, tensor: torch.Tensor) -> _Made | None:
        entry = self.made.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def construction(self, func: Any, args: tuple, kwargs: dict, model: Callable, *,
                     by_length: bool) -> tuple[Frame | None, str | None]:
        """Where what the op consumed went wrong: a mask that lets a query see a later key (its own argument, or
        the mask applied to its input one op before), followed back to the op that made it so, or to the buffer
        it was read from; with `by_length` (the variant is a prefix), positions read by the op."""
        consumer = _op_name(func)
        for tensor in _arg_tensors(args, kwargs):
            made = None if _mask_like(tensor) else self.get(tensor)
            candidates = [(tensor, consumer)] if made is None else [(u, made.op) for u in made.inputs]
            for mask, consumed_by in candidates:
                if _mask_like(mask) and _leaky(mask, polarity(consumed_by, mask)):
                    return self._walk(mask, model)
        if by_length:
            for tensor in _arg_tensors(args, kwargs):
                made = self.get(tensor)
                if made is not None and not tensor.is_floating_point() and self.n_pos in tensor.shape:
                    return made.site, f"positions from {made.op}"
        return None, None

    def _inputs(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        made = self.get(tensor)
        return [] if made is None else made.inputs

    def _walk(self, mask: torch.Tensor, model: Callable) -> tuple[Frame | None, str | None]:
        """Back from a leaky mask to the op whose structural inputs were all sound (it made the mask leak), or to
        the buffer or parameter it came from (named, with the line that built it when the model was recorded)."""
        for _ in range(64):  # a chain of views and comparisons: short
            made = self.get(mask)
            if made is None:
                name = owner(model, mask)
                if name is None:
                    return None, None
                return built_at(model, name), f"buffer {name}"
            leaky = [u for u in self._inputs(mask) if _mask_like(u) and _leaky(u)]
            if not leaky or made.op in STRUCTURE_OPS or not any(_square(u) for u in self._inputs(mask)):
                return made.site, made.op  # it made the mask leak, gave it its triangle, or made a square from none
            mask = leaky[0]
        return None, None


STRUCTURE_OPS = frozenset({"tril", "triu"})  # ops that give a mask its triangle: the line where a wrong one is built


def _arg_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    items = [*args, *kwargs.values()]
    return [t for t in items if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def _structural(tensor: torch.Tensor, n_pos: int) -> bool:
    """A mask or positions: boolean or integer with a positional axis, or a float mask (`_mask_like`)."""
    if tensor.dtype == torch.bool or not (tensor.is_floating_point() or tensor.is_complex()):
        return n_pos in tensor.shape or _square(tensor)
    return _mask_like(tensor)


def _square(tensor: torch.Tensor) -> bool:
    return tensor.ndim >= 2 and tensor.shape[-1] == tensor.shape[-2] and tensor.shape[-1] > 1


def _mask_like(tensor: torch.Tensor) -> bool:
    """A square (..., n, n) boolean tensor, or a float one holding only 0 and 1 (a keep-mask) or only 0 and large
    negatives (an additive mask)."""
    if not _square(tensor) or tensor.is_complex() or not (tensor.dtype == torch.bool or tensor.is_floating_point()):
        return False
    if tensor.dtype == torch.bool:
        return True
    values = tensor.detach()
    return bool(((values == 0) | (values == 1)).all()) or bool(((values == 0) | (values <= -1e4)).all())


Polarity = str  # "keep" (nonzero: visible), "block" (nonzero or a large negative: hidden), "either" (unknown)


def polarity(consumer: str, mask: torch.Tensor) -> Polarity:
    """How the op `consumer` reads a mask: masked_fill hides where it is True; an attention call keeps where a
    boolean mask is True and adds a float one (large negatives hide); `where` keeps; `mul` keeps the nonzero."""
    if consumer in ("masked_fill", "masked_fill_", "add", "add_", "sub"):
        return "block"
    if consumer == "scaled_dot_product_attention":
        return "keep" if mask.dtype == torch.bool else "block"
    if consumer in ("where", "mul", "mul_"):
        return "keep"
    return "either"


def _leaky(mask: torch.Tensor, reading: Polarity = "either") -> bool:
    """Whether a square mask lets some query see a later key when read as `reading`: a keep-mask that marks something
    above the diagonal; a block-mask (nonzero, or for floats a value <= -1e4, hides) that leaves something above it
    open; read either way (upstream of the op that consumes it), a mask sound under neither reading, or one that
    marks all or nothing (it masks nothing)."""
    values = mask.detach().reshape(-1, mask.shape[-2], mask.shape[-1]).cpu()  # (slice, query, key)
    above = torch.ones(mask.shape[-2], mask.shape[-1], dtype=torch.bool).triu(1)
    marked = values != 0
    hidden = values <= -1e4 if values.is_floating_point() and bool((values < 0).any()) else marked
    keep_sound = not bool((marked & above).any())
    block_sound = bool(hidden[:, above].all())
    if reading == "keep":
        return not keep_sound
    if reading == "block":
        return not block_sound
    return not (keep_sound or block_sound) or bool(marked.all()) or not bool(marked.any())


def _pointer(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (meta, a wrapper subclass)
        return None


def owner(model: Callable, tensor: torch.Tensor) -> str | None:
    """The qualified name of the model's buffer or parameter whose memory `tensor` reads (a view of it), or None."""
    if not isinstance(model, nn.Module):
        return None
    pointer = tensor.untyped_storage().data_ptr()
    for name, held in [*model.named_buffers(), *model.named_parameters()]:
        if held.untyped_storage().data_ptr() == pointer:
            return name
    return None


BUILT_AT = "_interp_built_at"  # a recorded model's {buffer or parameter name: the line that last wrote it}


def built_at(model: Callable, name: str) -> Frame | None:
    """The line that built the model's buffer or parameter `name`, when its construction was recorded."""
    return (getattr(model, BUILT_AT, None) or {}).get(name)


class _Construction(TorchFunctionMode):
    """Records, per tensor memory, the line of model code that last wrote it (`recording_construction`)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[int, Frame] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = _arg_tensors(args, kwargs or {})
        name = getattr(func, "__name__", "") or ""
        if (name.endswith("_") and not name.endswith("__")) or name == "__setitem__":  # in place: the first argument's memory is written
            written = inputs[:1]
        else:  # a new tensor; a view (memory of an input) writes nothing
            read = {_pointer(t) for t in inputs}
            written = [t for t in _tensors(out) if _pointer(t) not in read]
        site = None
        for tensor in written:
            if site is None:
                site, user = call_site(sys._getframe(1))
                site = site or user
                if site is None:
                    break
            try:
                self.lines[tensor.untyped_storage().data_ptr()] = site
            except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, a wrapper subclass)
                continue
        return out


@contextlib.contextmanager
def recording_construction() -> Iterator[Callable[[Any], Any]]:
    """While a model is built inside the block, note the line that last wrote each tensor's memory; the yielded
    `attach(model)` stores, for each of its buffers and parameters, that line on the model (`built_at`), so an
    origin that reads a mask buffer (`register_buffer` in `__init__`, then opened by `fill_` in the factory) names
    the line that built it. Returns the model given."""
    recorder = _Construction()

    def attach(model: Any) -> Any:
        if isinstance(model, nn.Module):
            found = {name: recorder.lines[pointer] for name, held in [*model.named_buffers(), *model.named_parameters()]
                     if (pointer := held.untyped_storage().data_ptr()) in recorder.lines}
            object.__setattr__(model, BUILT_AT, found)
        return model

    with recorder:
        yield attach


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
