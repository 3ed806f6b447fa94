"""Mechanical mutants of the correct nanoGPT- and minGPT-style attention, made by editing the text
of their modules (`leakzoo.nanostyle`, `leakzoo.mingptstyle`) at the lines marked `# SITE: ...`.

`generate(folder)` writes each mutant as a module `folder/<name>.py` (put `folder` on sys.path to
import it) and returns `(mutants, skipped)`: the mutants that leak, each with its factory spec and
the line of the edit, and the ones judged not to leak the future, each with the reason.

Edits: delete the mask line; `tril` -> `triu` where the mask is built; `float('-inf')` -> `0`; the
mask sliced from the wrong corner; the mask moved after the softmax (filling 0, since -inf after
the softmax is NaN); `is_causal=True` -> `False` (nanoGPT's flash path).

Judged by reasoning (and checked with `interp.analyses.leakage.audit` in tests/analyses/leakage/test_leakage_zoo.py):
- `[:, :, -T:, -T:]`: the bottom-right T x T corner of a lower-triangular matrix is itself lower
  triangular: the same mask, no leak (equivalent);
- `float('-inf')` -> `-1e9`: exp(-1e9 - max) is exactly 0 in float32: equivalent;
- `[:, :, :T, -T:]` (top-right corner) hides more, not less: for T < block_size query 0 sees no
  key at all and its row is NaN (the model breaks, nothing leaks);
- the mask line moved verbatim after the softmax: -inf weights times values give NaN (broken,
  not a leak).
"""
from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass, replace
from pathlib import Path

from leakzoo import mingptstyle, nanostyle


@dataclass(frozen=True)
class Mutant:
    """One text edit of a correct module, written to `path` and built by `spec`'s factory."""

    name: str  # also the module's name
    source: str  # the module edited: "nanostyle" or "mingptstyle"
    edit: str  # what was changed, in words
    spec: str  # "module:factory"
    path: Path
    line: int  # 1-based line of the edit in the mutant; for a deletion the line that now follows it
    deleted: bool  # the edit deleted a line (`line` is the one after the gap)
    mask_built: bool  # the edit is where the mask is built: the applying line and the softmax count too
    also: tuple[int, ...]  # those lines (the mask applied, the softmax), for mask-built edits
    leaks: bool  # the judgement: the mutant's outputs depend on later tokens
    reason: str = ""  # for the ones that do not leak: why

    @property
    def expected_exit(self) -> int:
        """1: a leak; 0: equivalent to the original; 2: broken (NaN), refused as a bad model."""
        return 1 if self.leaks else 2 if self.reason.startswith("NaN") else 0


@dataclass(frozen=True)
class Edit:
    name: str
    edit: str
    site: str  # label of the `# SITE:` line edited
    old: str = ""  # replaced on that line ("" with delete)
    new: str = ""
    delete: bool = False
    after: str = ""  # label of the line the edited line is moved after
    leaks: bool = True
    reason: str = ""
    corrupts: tuple[str, ...] = ()  # labels of the attention calls the edit corrupts (they count as its origin too)


def _edits(prefix: str, buffer: str, flash: bool) -> list[Edit]:
    mask, soft, build = f"{prefix}-mask", f"{prefix}-softmax", f"{prefix}-build"
    nan_row = "NaN: for T < block_size query 0 sees no key (the model breaks; nothing leaks)"
    edits = [
        Edit("delete_mask", "the masked_fill line deleted", mask, delete=True),
        Edit("triu", "tril -> triu where the mask is built", build, "torch.tril(", "torch.triu("),
        # scores filled with 0 keep the same weight in both runs: the first output to move is the weights times v
        Edit("inf_to_zero", "float('-inf') -> 0 in the masked_fill", mask, "float('-inf')", "0",
             corrupts=(f"{prefix}-av",)),
        Edit("wrong_corner", "the mask sliced from the bottom-left corner", mask,
             f"{buffer}[:, :, :T, :T]", f"{buffer}[:, :, -T:, :T]"),
        Edit("after_softmax", "the masked_fill moved after the softmax (filling 0)", mask,
             "float('-inf')", "0.0", after=soft),
        Edit("corner_bottom_right", "the mask sliced from the bottom-right corner", mask,
             f"{buffer}[:, :, :T, :T]", f"{buffer}[:, :, -T:, -T:]", leaks=False,
             reason="equivalent: a lower-triangular matrix's bottom-right corner is lower triangular"),
        Edit("inf_to_big", "float('-inf') -> -1e9", mask, "float('-inf')", "-1e9", leaks=False,
             reason="equivalent: exp(-1e9) is exactly 0 in float32"),
        Edit("corner_top_right", "the mask sliced from the top-right corner", mask,
             f"{buffer}[:, :, :T, :T]", f"{buffer}[:, :, :T, -T:]", leaks=False, reason=nan_row),
        Edit("after_softmax_inf", "the masked_fill moved verbatim after the softmax", mask, after=soft,
             leaks=False, reason="NaN: -inf weights times the values (the model breaks; nothing leaks)"),
    ]
    if flash:
        edits.append(Edit("not_causal", "is_causal=True -> False", f"{prefix}-sdpa", "is_causal=True", "is_causal=False"))
    return [replace(e, name=f"{prefix}_{e.name}") for e in edits]


SOURCES = {  # module, SITE prefix, the mask buffer's name, factory of the masked path, of the flash path
    "nanostyle": (nanostyle, "nano", "self.bias", "manual", "flash"),
    "mingptstyle": (mingptstyle, "min", "self.mask", "gpt", None),
}


def _site(lines: list[str], label: str) -> int:
    """0-based index of the line ending in `# SITE: label`."""
    pattern = re.compile(rf"#\s*SITE:\s*{re.escape(label)}\s*$")
    hits = [i for i, line in enumerate(lines) if pattern.search(line)]
    if len(hits) != 1:
        raise LookupError(f"expected one '# SITE: {label}' line, found {len(hits)}")
    return hits[0]


def apply(text: str, edit: Edit) -> tuple[str, int]:
    """The edited text and the 1-based line of the edit (for a deletion: the line now in its place)."""
    lines = text.splitlines()
    index = _site(lines, edit.site)
    if edit.delete:
        del lines[index]
        return "\n".join(lines) + "\n", index + 1
    line = lines[index]
    if edit.old:
        if edit.old not in line:
            raise LookupError(f"{edit.name}: {edit.old!r} not on line {index + 1}: {line.strip()}")
        line = line.replace(edit.old, edit.new, 1)
    if edit.after:
        target = _site(lines, edit.after)
        del lines[index]
        target = target - 1 if target > index else target
        lines.insert(target + 1, line.replace(f"# SITE: {edit.site}", f"# SITE: {edit.site} (moved)"))
        return "\n".join(lines) + "\n", target + 2
    lines[index] = line
    return "\n".join(lines) + "\n", index + 1


def _mask_lines(text: str, prefix: str) -> tuple[int, ...]:
    """1-based lines where the mutant applies its mask and takes the softmax."""
    lines = text.splitlines()
    return tuple(_site(lines, f"{prefix}-{label}") + 1 for label in ("mask", "softmax"))


def _site_lines(text: str, labels: tuple[str, ...]) -> tuple[int, ...]:
    lines = text.splitlines()
    return tuple(_site(lines, label) + 1 for label in labels)


def names(leaking: bool | None = None) -> list[str]:
    """The mutants' module names in `generate`'s order (only those judged to leak, or not to, when
    `leaking` says so), without writing anything."""
    return [f"leakzoo_mutant_{e.name}" for _, prefix, buffer, _, flash in SOURCES.values()
            for e in _edits(prefix, buffer, flash is not None) if leaking is None or e.leaks == leaking]


def generate(folder: str | Path) -> tuple[list[Mutant], list[Mutant]]:
    """Write every mutant into `folder`; (those that leak, those judged not to)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made: list[Mutant] = []
    for source, (module, prefix, buffer, factory, flash) in SOURCES.items():
        text = Path(inspect.getfile(module)).read_text()
        for edit in _edits(prefix, buffer, flash is not None):
            mutated, line = apply(text, edit)
            name = f"leakzoo_mutant_{edit.name}"
            path = folder / f"{name}.py"
            path.write_text(mutated)
            built = edit.site.endswith("-build")
            made.append(Mutant(
                name=name, source=source, edit=edit.edit,
                spec=f"{name}:{flash if edit.site.endswith('-sdpa') else factory}", path=path, line=line,
                deleted=edit.delete, mask_built=built,
                also=(_mask_lines(mutated, prefix) if built else ()) + _site_lines(mutated, edit.corrupts),
                leaks=edit.leaks, reason=edit.reason,
            ))
    importlib.invalidate_caches()  # the folder's new modules importable now
    return [m for m in made if m.leaks], [m for m in made if not m.leaks]
