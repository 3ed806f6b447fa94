"""How tables are printed: a DataFrame as a rich Table that fits the terminal.

The column fitter stays hand-written: given every column, rich's own layout (`overflow="fold"`,
`no_wrap`, `min_width`) squeezes them all at 80 and 120 columns, cutting headers inside a word
("duplicate_to") and numbers ("0.07" for 0.074), or, with each column's `min_width`, runs past the
width; it can neither leave a column out nor break a header only after an underscore. So
`_fit_columns` decides which headers break ("duplicate_/token") and which columns go (named in the
caption: at 80 columns `interp heads` shows 8 of its 11 columns, each whole), and rich lays out
the rest.
"""
from __future__ import annotations

from typing import Any

from interp.cli.output import INTEGER_KEYS, _columns_env


def _cell(column: str, value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return ""
        if column in INTEGER_KEYS and value.is_integer():
            return str(int(value))
        if column.startswith("p_"):
            from interp.analyses.report.format import format_p  # one way to write a p-value, as in the report

            return format_p(value)
        if column in ("max_influence", "influence"):
            return f"{value:.3g}"
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return "; ".join(map(str, value))
    return str(value)


FOLDING_COLUMNS = ("reasons", "reason", "detail")  # long prose: wraps at spaces inside its column
FOLDING_MIN_WIDTH = 20
TABLE_OVERHEAD = 3  # per column: one space of padding either side and a rule (rich's default box)


def _header_lines(column: str, split: bool) -> list[str]:
    """The header's lines: whole, or broken after each underscore (never inside a word)."""
    if not split or "_" not in column:
        return [column]
    parts = column.split("_")
    return [p + "_" for p in parts[:-1]] + [parts[-1]]


def _wraps(column: str, cells: dict[str, list[str]]) -> bool:
    """Prose columns, and text columns with spaces, wrap at spaces inside their column."""
    return column in FOLDING_COLUMNS or any(" " in text for text in cells[column])


def _column_need(column: str, cells: dict[str, list[str]], split: bool) -> int:
    """The narrowest the column can be without breaking a word (prose: at least FOLDING_MIN_WIDTH)."""
    header = max(len(line) for line in _header_lines(column, split))
    if column in FOLDING_COLUMNS:
        return max(header, FOLDING_MIN_WIDTH)
    if _wraps(column, cells):
        return max([header, *(len(word) for text in cells[column] for word in text.split())])
    return max([header, *map(len, cells[column])])


def _fit_columns(columns: list[str], cells: dict[str, list[str]], width: int,
                 drop_first: tuple[str, ...] = ()) -> tuple[dict[str, bool], list[str]]:
    """Which headers to break at underscores, and which columns to leave out, so the table fits `width`.

    All headers are broken (a uniform look) before any column is dropped; then the columns in
    `drop_first` go (in that order), then columns from the right (never the first). A column that
    wraps at spaces needs only its longest word (prose: FOLDING_MIN_WIDTH).
    Returns ({column: split}, dropped columns in table order)."""
    need = lambda column, split: _column_need(column, cells, split)

    split = {c: False for c in columns}
    kept = list(columns)
    total = lambda: 1 + sum(need(c, split[c]) + TABLE_OVERHEAD for c in kept)
    if total() > width:
        split = {c: True for c in columns}
    order = [c for c in drop_first if c in kept[1:]] + [c for c in reversed(kept[1:]) if c not in drop_first]
    while total() > width and order:
        kept.remove(order.pop(0))
    return split, [c for c in columns if c not in kept]


def _whole_widths(kept: list[str], cells: dict[str, list[str]], split: dict[str, bool], width: int,
                  keep_whole: tuple[str, ...]) -> dict[str, int]:
    """Widths that keep each `keep_whole` column's cells on one line, for those the table's spare room allows
    (in that order); rich would otherwise share the room among all wrapping columns and wrap short cells too."""
    spare = width - 1 - sum(_column_need(c, cells, split[c]) + TABLE_OVERHEAD for c in kept)
    widths = {}
    for column in (c for c in keep_whole if c in kept):
        full = max([*map(len, _header_lines(column, split[column])), *map(len, cells[column])])
        extra = full - _column_need(column, cells, split[column])
        if extra <= spare:
            widths[column], spare = full, spare - extra
    return widths


def _frame_table(frame, title: str | None = None, columns: list[str] | None = None, max_rows: int = 80,
                 width: int | None = None, footer: list[str] | None = None, drop_first: tuple[str, ...] = (),
                 keep_whole: tuple[str, ...] = ()):
    """A rich Table from a DataFrame: fixed 3 decimals (p-values 3 significant digits), counts as integers,
    verdicts coloured; headers never wrap inside a word, and what does not fit in `width` is left out and
    counted in the caption (as are rows beyond `max_rows`), with the other `footer` lines. The cells of the
    `keep_whole` columns stay on one line where the width allows."""
    from rich.table import Table

    columns = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    shown = frame.head(max_rows)
    cells = {c: [_cell(c, v) for v in shown[c]] for c in columns}
    split, dropped = _fit_columns(columns, cells, width or _columns_env() or 120, drop_first)
    kept = [c for c in columns if c not in dropped]
    whole = _whole_widths(kept, cells, split, width or _columns_env() or 120, keep_whole)
    table = Table(title=title, show_lines=False, header_style="bold")
    for column in kept:
        folding = _wraps(column, cells) and column not in whole  # rich would shrink a whole column that may wrap
        need = None if column in FOLDING_COLUMNS else _column_need(column, cells, split[column])
        table.add_column("\n".join(_header_lines(str(column), split[column])), overflow="fold", no_wrap=not folding,
                         max_width=70 if column in ("reasons", "reason") else None, min_width=whole.get(column, need))
    colours = {"supported": "green", "refuted": "red", "inconclusive": "yellow", "True": "green", "False": "red"}
    for i in range(len(shown)):
        row = []
        for column in kept:
            text = cells[column][i]
            colour = colours.get(text)
            row.append(f"[{colour}]{text}[/{colour}]" if colour else text)
        table.add_row(*row)
    notes = list(footer or [])
    if len(frame) > max_rows:
        notes.append(f"{len(frame) - max_rows} more rows not shown")
    if dropped:
        notes.append(f"{len(dropped)} column{'s' if len(dropped) > 1 else ''} not shown at {width or _columns_env() or 120} "
                     f"columns: {', '.join(dropped)}")
    if len(frame) > max_rows or dropped:
        notes[-1] += "; use --json for all of them"
    table.caption = "\n".join(notes) or None
    return table
