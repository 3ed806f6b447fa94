"""`interp circuit`: discover a circuit, print its edges with their effects and its tests, draw it."""
from __future__ import annotations

import math
from pathlib import Path

from interp.cli.common import DEFAULT_SPEC, EXIT_FINDING, EXIT_OK, _load, _prompt_spec, _prompts
from interp.cli.output import _emit_json, _out_console
from interp.cli.tables import _frame_table
from interp.errors import BadInput
from interp.outdir import stream_fd, write_output

MIN_PROMPTS = 4  # two halves (propose, test) of two prompts each: resampling needs another prompt in each


def cmd_circuit(args) -> int:
    from interp.analyses.circuits.summary import circuit_summary

    _prompt_spec(args)  # bad flags fail before the model loads
    png = _png_target(args.png)
    spec = args.spec or DEFAULT_SPEC
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    prompts = _prompts(model, args)
    if len(prompts) < MIN_PROMPTS:
        raise BadInput(f"{len(prompts)} prompts: pass --n {MIN_PROMPTS} at least (or a prompt file of {MIN_PROMPTS} rows "
                       "or more). The circuit is proposed on one half of the prompts and tested on the other, and "
                       "resampling gives each prompt another one's activations, so each half needs 2 prompts.")
    found = circuit_summary(model, prompts, method=args.method, threshold=args.threshold, behaviour=args.behaviour,
                            seed=args.seed, max_edges=getattr(args, "max_edges", None),
                            curve=getattr(args, "curve", False), progress=not args.quiet)
    console = _out_console(args)
    circuit = found.circuit
    title = (f"Circuit of {spec} ({circuit.method}, threshold {circuit.threshold:g} of the gap = {circuit.tau:.3g} "
             f"{found.unit}): {len(circuit.edges)} edges, {len(circuit.nodes)} nodes; ")
    unmeasured = int(found.edges["effect"].isna().sum())
    if found.nodes is not None:
        console.print(title + "each kept head's or MLP's removal cost from the circuit on the held-out half (effect: "
                      "its write patched for every reader; score: its removal on the proposing half)")
        console.print(_frame_table(found.nodes, width=console.width, columns=["node", "score", "effect", "ci_low", "ci_high"],
                                   title=f"Kept nodes ({found.unit})"))
        console.print(f"the {len(found.edges)} edges between these nodes are the circuit (--json lists them); a head-level "
                      "circuit is measured by its nodes, not edge by edge")
    else:
        console.print(_frame_table(found.edges, title=title + "effects on the held-out half", width=console.width,
                                   columns=["edge", "score", "effect", "ci_low", "ci_high"]))
    if unmeasured and found.nodes is None:
        console.print(f"{unmeasured} of {len(found.edges)} edges have no effect measured (the {len(found.edges) - unmeasured} "
                      "of largest |score| were path patched); --json lists them all")
    if circuit.untested:
        shown = sorted(circuit.untested)[:5]
        console.print(f"[yellow]{len(circuit.untested)} edges kept untested[/yellow] (the corruption does not change "
                      f"their sender's write, so no patch can test them): {', '.join(shown)}"
                      + (f" and {len(circuit.untested) - len(shown)} more" if len(circuit.untested) > len(shown) else "")
                      + f". First: {circuit.untested[shown[0]]}")
    tests = found.tests_frame()
    if len(tests):
        console.print(_frame_table(tests, title=f"Tests on {int(tests['n_prompts'].iloc[0])} held-out prompts "
                                   f"({found.behaviour})", width=console.width,
                                   columns=["test", "value", "ci_low", "ci_high", "unit"]))
    _print_eap(console, circuit)
    if found.curve is not None:
        _print_curve(console, found.curve)
    if png is not None:
        _draw(found, spec, png)
        console.print(f"drawing written to {png}")
    _emit_json(args, "circuit", spec, found.to_json())
    if not circuit.edges:  # nothing to test: its completeness or minimality would read as a result
        console.print(f"[yellow]no edge kept[/yellow]: at threshold {circuit.threshold:g} no edge's removal moves the "
                      f"behaviour by {circuit.tau:.3g} {found.unit}, so the circuit is empty and its tests say nothing. "
                      "Pass a lower --threshold, or more prompts (--n).")
        return EXIT_FINDING
    return EXIT_OK


def _print_curve(console, curve) -> None:
    """MIB's faithfulness curve (signed ranking, with CIs; |score| ranking and the random baseline beside it), then
    CPR and CMD with their CIs against the random rankings' mean and spread."""
    import pandas as pd

    frame = curve.frame()
    by = {name: rows.reset_index(drop=True) for name, rows in frame.groupby("ranking", sort=False)}
    table = by["signed"][["fraction", "n_edges", "faithfulness", "ci_low", "ci_high"]].assign(
        n_edges=by["signed"]["n_edges"].astype(int), absolute=by["absolute"]["faithfulness"])
    if "random" in by:
        table = table.assign(random=by["random"]["faithfulness"])
    title = (f"Faithfulness curve of the {curve.score_name} scores (MIB) on {curve.n_prompts} held-out prompts: "
             f"n_edges of {curve.n_total_edges} kept (top fraction, dangling pruned), ranked by signed score [CI]; "
             "absolute: ranked by |score|; random: mean of the random rankings")
    console.print(_frame_table(table, title=title, width=console.width))
    areas = curve.areas()[["metric", "value", "ci_low", "ci_high", "random", "random_low", "random_high"]]
    console.print(_frame_table(pd.DataFrame(areas), width=console.width, title="CPR (signed scores; higher is better) "
                               "and CMD (|scores|; lower is better); random: mean, min and max of "
                               f"{curve.random.n_rankings if curve.random is not None else 0} random rankings"))


def _png_target(path: str | None) -> Path | None:
    """--png FILE: a .png name, a device or a stream (where and whether it can be written: `check_targets`, before the
    model loads)."""
    if path is None:
        return None
    target = Path(path)
    if target.suffix.lower() != ".png" and stream_fd(path) is None and not _is_device(target):
        raise BadInput(f"--png {path!r}: expected a .png file name, e.g. --png circuit.png.")
    return target


def _is_device(path: Path) -> bool:
    """A character device or a named pipe (/dev/null, a FIFO): written in place whatever its name."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _draw(found, spec: str, png: Path) -> None:
    """The circuit's drawing as a PNG, written whole or not at all."""
    from interp.analyses.circuits.drawing import MAX_LABELS, draw_circuit

    faith = found.test.faithfulness.mean if found.test is not None else math.nan
    title = f"{spec}: {found.circuit.method} circuit" + (f", faithfulness {faith:.2f}" if math.isfinite(faith) else "")
    if found.nodes is not None:
        title += "; an edge's width: its sender's removal cost"
    fig = draw_circuit(found.edges_to_draw(), title=title, unit=found.unit,
                       max_labels=0 if found.nodes is not None else MAX_LABELS)
    write_output(png, lambda tmp: fig.savefig(tmp, format="png", metadata={"Software": None}), what="PNG")


def _print_eap(console, circuit) -> None:
    """How an EAP circuit was chosen (top-n by |estimate|, exact faithfulness on the proposing half), and its notes."""
    selection = circuit.selection
    if selection is not None:
        i = selection.chosen
        console.print(f"EAP kept the top {selection.n_selected[i]} edges by |estimate| (fraction {selection.fraction:g}; "
                      f"{selection.n_edges[i]} after pruning): exact faithfulness {selection.faithfulness[i]:.3f} on the "
                      f"proposing half (target {selection.target:g}); estimates vs exact patching, Spearman "
                      f"{selection.spearman:.2f} on {selection.n_sampled} edges")
    for note in circuit.notes:
        console.print(f"[yellow]note[/yellow]: {note}")
