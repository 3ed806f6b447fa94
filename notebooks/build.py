"""Build the investigation notebooks from their scripts and, with --execute, run them and store their outputs.

    make notebooks          # = OMP_NUM_THREADS=1 PYTHONHASHSEED=0 .venv/bin/python notebooks/build.py --execute

Each notebook is a script, `notebooks/NN_topic.py`, in jupytext's percent format: `# %%` starts a code
cell, `# %% [markdown]` a Markdown cell (its lines commented with `# `), and a cell's tags and metadata
follow its marker (`# %% tags=["conclusion"]`). Edit the script, never the .ipynb: this driver turns every
`NN_*.py` beside it into `NN_*.ipynb` and, with --execute, runs it top to bottom with nbclient (one
thread, PYTHONHASHSEED=0, no timing metadata, cell ids derived from the cells) and stores its outputs. The
notebooks are committed *with* their outputs, so a reader on a code host sees the evidence;
tests/notebooks/test_notebooks.py checks that every script has its .ipynb and that the .ipynb is what the script
generates, executes the notebooks afresh and compares each run's `results` with the committed one.

Each notebook is an investigation: a question, hypotheses, evidence with controls, figures of the heads
it discusses (CIs as error bars: `interp.analyses.report.plot_ci_bars`), and a Markdown conclusion
generated from a `results` dict, so the prose cannot drift from the numbers. Three tagged cells are required:

- `viewer`: `display(interp.show(model, prompt, layer=..., head=...))`, the inline viewer;
- `results`, hidden and collapsed (`# %% tags=["results", "remove-output"] jupyter={"source_hidden": true,
  "outputs_hidden": true}`): builds `results` and ends with
  `display({"text/x-interp-results": json.dumps(results, sort_keys=True)}, raw=True)` (`RESULTS_MIME`, which no
  front end renders: the numbers are stored for the tests, never shown);
- `conclusion`: a `Markdown(...)` read from `results`.

Cells call the library: a helper a cell would need that the library lacks belongs in the library (in the
module it is about, with a docstring and a test), not in a `def` in a cell.

To add a notebook: write `notebooks/NN_topic.py` with the next number (copy an existing one's first cells),
run `python notebooks/build.py --execute NN_topic`, add its checks to tests/notebooks/test_notebooks.py (the tests find
its cells by their tags) and commit the script with its executed .ipynb. To check an edit without touching
the committed files: `python notebooks/build.py --execute --out /tmp/nb 03_minilm`, then
`INTERP_NOTEBOOKS=/tmp/nb python -m pytest tests/notebooks/test_notebooks.py`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat

HERE = Path(__file__).resolve().parent
RESULTS_MIME = "text/x-interp-results"  # a MIME type no front end renders: the numbers are stored, not shown
SCRIPT = re.compile(r"^\d\d_\w+\.py$")  # 01_attention_from_the_lesson.py; not this driver
KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
          "language_info": {"name": "python"}}


def scripts(folder: Path = HERE) -> list[Path]:
    """Every notebook script in `folder` (`NN_topic.py`), in order."""
    return sorted(path for path in folder.iterdir() if SCRIPT.match(path.name))


def select(names: list[str], folder: Path = HERE) -> list[Path]:
    """The scripts named by `names` ('03_minilm', '03_minilm.py' or '03_minilm.ipynb'); all when none."""
    every = {path.stem: path for path in scripts(folder)}
    stems = [Path(name).stem if name.endswith((".py", ".ipynb")) else name for name in names]
    unknown = [name for name, stem in zip(names, stems) if stem not in every]
    if unknown:
        raise ValueError(f"no notebook script {', '.join(map(repr, unknown))} in {folder}; the notebooks are "
                         f"{', '.join(every)} (a new one is a script NN_topic.py there).")
    return [every[stem] for stem in stems] if names else list(every.values())


def notebook(script: Path) -> nbformat.NotebookNode:
    """The notebook a script describes: its cells (sources, tags and metadata), the python3 kernel, and ids
    derived from each cell's content, so a rebuild changes no id of a cell that did not change."""
    built = jupytext.read(script, fmt="py:percent")
    built.metadata = nbformat.from_dict(KERNEL)
    seen: set[str] = set()
    for index, cell in enumerate(built.cells):
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:12]
        cell.id = digest if digest not in seen else f"{digest}-{index}"
        seen.add(cell.id)
    return built


def write(script: Path, folder: Path = HERE) -> Path:
    """Write the script's notebook into `folder` as NN_topic.ipynb (sources only; outputs come from `execute`)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{script.stem}.ipynb"
    nbformat.write(notebook(script), path)
    return path


def execute(path: Path, timeout: int = 3600) -> float:
    """Run a notebook top to bottom in place, deterministically (one thread, seeded cells, no timing
    metadata), so its committed outputs are what a fresh run gives; returns the seconds it took. `timeout`: per
    cell, a hang guard (notebook 07's circuit discovery on SmolLM2 takes about ten minutes on one thread)."""
    import nbclient

    built = nbformat.read(path, as_version=4)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    client = nbclient.NotebookClient(built, timeout=timeout, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(HERE.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    for cell in built.cells:
        cell.metadata.pop("execution", None)
    built.metadata.pop("widgets", None)
    nbformat.write(built, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--execute", action="store_true", help="also run each notebook and store its outputs")
    parser.add_argument("--out", type=Path, default=HERE, metavar="DIR",
                        help="write (and execute) the notebooks in DIR instead of notebooks/, e.g. to check one "
                             "without touching the committed files: --execute --out /tmp/nb 03_minilm; "
                             "then INTERP_NOTEBOOKS=DIR pytest tests/notebooks/test_notebooks.py compares against DIR")
    parser.add_argument("names", nargs="*", help="only these notebooks ('03_minilm', with or without .py / .ipynb); "
                                                 "default all")
    args = parser.parse_args(argv)
    try:
        chosen = select(args.names)
    except ValueError as error:
        parser.error(str(error))
    for script in chosen:
        path = write(script, args.out)
        print("wrote", path, flush=True)
        if args.execute:
            print(f"executed {path.name} in {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
