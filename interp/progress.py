"""Progress display: one library (rich) for every bar the toolkit shows.

rich already draws the CLI's tables and is a dependency of transformer-lens; tqdm is no longer
used by the toolkit (huggingface_hub, which transformer-lens imports, still imports
`tqdm.auto`: see `quiet_tqdm_import_warning`). Bars go to stderr (stdout may carry JSON).

- `Bar(total, description, enabled)`: a counter of passes / claims / steps; `bar.advance(n,
  note)`; a context manager.
- `Stages(names, enabled)`: a list of named stages run one after another (`stages.run(name, fn)`),
  each timed (`stages.timings`); more stages may be appended while it runs
  (`stages.extend([...])`), so a caller can cover work done after the computation (plotting,
  writing files) in the same bar, and the bar says "done" only when the last one finished.

In a Jupyter kernel without ipywidgets rich cannot draw a live bar (it would warn); there the
bars print nothing, and notebooks stay free of progress noise.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")

IPROGRESS_WARNING = "IProgress not found"  # tqdm.autonotebook's warning in Jupyter without ipywidgets


def quiet_tqdm_import_warning() -> None:
    """Silence tqdm's "IProgress not found" import warning, raised in Jupyter without ipywidgets when
    huggingface_hub (imported by transformer-lens) imports `tqdm.auto`; the toolkit draws no tqdm bar."""
    warnings.filterwarnings("ignore", message=IPROGRESS_WARNING)


def _live_console(enabled: bool):
    """A stderr console that can draw a live bar, or None (disabled, or Jupyter without ipywidgets)."""
    if not enabled:
        return None
    from rich.console import Console

    console = Console(stderr=True)
    if console.is_jupyter:
        try:
            import ipywidgets  # noqa: F401  (rich draws Jupyter bars with it)
        except ImportError:
            return None
    return console


class Bar:
    """A rich progress bar over `total` units of work, or nothing when `enabled` is False."""

    def __init__(self, total: int, description: str, *, enabled: bool = True, unit: str = ""):
        self.total, self.description, self.unit = total, description, unit
        self.completed = 0
        self._progress = None
        console = _live_console(enabled)
        if console is not None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn(unit), TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                                      console=console, transient=False)
            self._progress.start()
            self._task = self._progress.add_task(description, total=total, note="")

    def advance(self, n: int = 1, note: str | None = None) -> None:
        self.completed += n
        if self._progress is not None:
            if note is None:
                self._progress.update(self._task, advance=n)
            else:
                self._progress.update(self._task, advance=n, note=note)

    def describe(self, description: str) -> None:
        self.description = description
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def grow(self, n: int) -> None:
        """Add `n` units of work still to come."""
        self.total += n
        if self._progress is not None:
            self._progress.update(self._task, total=self.total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def tracked(items: Iterable[T], total: int, description: str, *, enabled: bool = True, unit: str = "") -> Iterable[T]:
    """Iterate over `items` with a bar (a rich replacement for `tqdm(items)`)."""
    with Bar(total, description, enabled=enabled, unit=unit) as bar:
        for item in items:
            yield item
            bar.advance()


class Stages:
    """Named stages run in order under one bar; `timings[name]` is each stage's wall time (s)."""

    def __init__(self, names: Iterable[str], enabled: bool = False, description: str = "stages"):
        self.names = list(names)
        self.enabled, self.description = enabled, description
        self.timings: dict[str, float] = {}
        self._bar: Bar | None = None
        self._depth = 0

    def extend(self, names: Iterable[str]) -> "Stages":
        """Append stages still to come (e.g. plotting and writing after the computation)."""
        names = [n for n in names if n not in self.names]
        self.names.extend(names)
        if self._bar is not None:
            self._bar.grow(len(names))
        return self

    def run(self, name: str, fn: Callable[[], T]) -> T:
        if self._bar is not None:
            self._bar.describe(name)
        start = time.perf_counter()
        result = fn()
        self.timings[name] = time.perf_counter() - start
        if self._bar is not None:
            self._bar.advance()
        return result

    def __enter__(self) -> "Stages":
        # re-entrant: a caller that extended the stages keeps the bar open across inner `with` blocks
        self._depth += 1
        if self._depth == 1:
            self._bar = Bar(len(self.names), self.description, enabled=self.enabled, unit="stages")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._bar is not None:
            self._bar.describe("done" if exc[0] is None else "stopped")
            self._bar.close()
            self._bar = None
