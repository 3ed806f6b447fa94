"""The handlers of `interp report`, `demo`, `claims`, `scan`, `heads`, `verify` and `train`
(`audit-leakage` is in `interp.cli.audit`); each imports its analyses only when it runs."""
from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.audit import deliver
from interp.cli.common import (
    DEFAULT_SPEC,
    EXIT_FINDING,
    EXIT_OK,
    _check_max_len_flag,
    _input_files,
    _load,
    _prompt_spec,
    _prompts,
    _select,
)
from interp.cli.isolate import Outcome, capturing_console, console_settings
from interp.cli.isolate import run as run_isolated
from interp.cli.output import _emit_json, _frame_records, _out_console, check_targets
from interp.cli.tables import _frame_table
from interp.errors import BadInput  # no torch: --help stays fast


def cmd_report(args) -> int:
    from interp.analyses import report

    layers, heads = _select(args)
    prompt_spec = _prompt_spec(args)  # bad flags fail before the model loads
    spec = args.spec or DEFAULT_SPEC
    out = Path(args.out) if args.out else Path("reports") / _slug(spec)
    report.check_out_dir(out, args.force)
    max_cards = getattr(args, "max_cards", None) or report.MAX_CARDS
    report.check_cards_before_loading(spec, layers, heads, max_cards)  # a too-large report fails before the load
    claims = None
    if args.claims:
        from interp.analyses.claims.registry import read_claims

        claims = read_claims(args.claims)
        check_targets(args, _claims_file_inputs(claims, spec))
    model = _load(spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    max_len = getattr(args, "max_len", None)  # `interp demo` passes none
    if max_len is not None:
        _check_max_len_flag(model, max_len)  # against the model's own context length, before any work
    prompt_spec = report.model_prompt_spec(model, prompt_spec, asked=getattr(args, "prompts", None) is not None)
    result = report.build_report(
        model, out, spec=spec, prompt_spec=prompt_spec, layers=layers, heads=heads, claims_file=claims,
        seed=args.seed, force=args.force, progress=not args.quiet, behaviour=getattr(args, "behaviour", None),
        max_cards=max_cards, colour_scale=getattr(args, "colour_scale", None) or "common",
        leakage_len=report.LEAKAGE_LEN if max_len is None else max_len,
        bidirectional=True if getattr(args, "bidirectional", False) else None,
    )
    console = _out_console(args)
    console.print(f"report written to [bold]{result.out_dir}[/bold] (open {result.out_dir / 'report.html'})")
    # the behaviour and ablation of each causal number are in the report's tables; the terminal keeps the verdicts
    console.print(_frame_table(result.highlights, title="Strongest findings", width=console.width,
                               columns=["finding", "heads", "family", "evidence", "verdict", "causal"]))
    _emit_json(args, "report", spec, result.to_json())
    return EXIT_OK


def cmd_demo(args) -> int:
    """`interp report` on the embedded default; replaces an earlier demo report, never other files."""
    out = Path(args.out)
    force = True  # replaces only a previous report's own files (interp.outdir); refuses, naming them, if others are there
    args_report = argparse.Namespace(
        spec=DEFAULT_SPEC, out=str(out), force=force, prompts=None, n=args.n, seed=args.seed, prefix_len=None,
        layers=None, heads=None, claims=None, quiet=args.quiet, json=None, behaviour=None,
    )
    return cmd_report(args_report)


def cmd_claims(args) -> int:
    from interp.analyses.claims.registry import (
        EDGE_CLAIM_KINDS,
        MODEL_CLAIM_KINDS,
        head_claim_kinds,
        pair_claim_kinds,
        read_claims,
        run_claims,
    )

    if args.list_kinds:
        kinds = {"one head (L1H2 = ...):": sorted(head_claim_kinds()), "a pair (\"L0H1 ~ L0H3\" = ...):":
                 sorted(pair_claim_kinds()), "an edge (\"L0H0 -> L1H2 via k\" = ...):": list(EDGE_CLAIM_KINDS),
                 "the model (model = ...):": list(MODEL_CLAIM_KINDS)}
        print("claim kinds (prefix with 'not ' to expect a refutation):")
        print(_kind_list(kinds, _out_console(args).width))
        return EXIT_OK
    if len(args.paths) == 1:
        spec, claims_path = None, args.paths[0]
    elif len(args.paths) == 2:
        spec, claims_path = args.paths
        if Path(spec).suffix == ".toml" and Path(spec).is_file() and not Path(claims_path).is_file():
            raise BadInput(f"the arguments are [SPEC] FILE, model first: {spec!r} is a claims file and {claims_path!r} "
                             f"is not; run: interp claims {claims_path} {spec}")
    else:
        raise BadInput(f"expected [SPEC] FILE (or --list-kinds), got {len(args.paths)} arguments: {args.paths}.")
    claims_file = read_claims(claims_path)
    spec = spec or claims_file.model
    if spec is None:
        raise BadInput(f"{claims_path} names no model: pass a SPEC (interp claims toy-induction {claims_path}) or add model = \"...\" to the file.")
    check_targets(args, [*_input_files(args), *_claims_file_inputs(claims_file, spec)])  # the files the claims file names
    args.spec = spec  # for the envelope, and the failure documents (`interp.cli.failure`)
    args.console_settings = console_settings(_out_console(args))
    # the model runs in a child process: a module that calls sys.exit(0) on import cannot end --strict with exit 0
    outcome = run_isolated(args, lambda a: _claims_outcome(a, claims_file, claims_path, run_claims), f"the model spec {spec!r}")
    return deliver(args, "claims", spec, outcome)


def _claims_outcome(args, claims_file, claims_path: str, run_claims) -> Outcome:
    """Load the model, test the claims, render the table (in the child, `interp.cli.isolate`)."""
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    overrides = {k: v for k, v in {"n": args.n, "seed": args.seed, "prefix_len": args.prefix_len}.items() if v is not None}
    frame = run_claims(model, claims_file, prompt_overrides=overrides, progress=not args.quiet, behaviour=args.behaviour)
    console = capturing_console(args.console_settings)
    shown = frame.assign(reasons=[_short_reasons(r, p) for r, p in zip(frame["reasons"], frame["passed"])])
    console.print(_frame_table(shown, title=f"Claims in {claims_path} on {args.spec}",
                               columns=["name", "expect", "verdict", "p_adjusted", "passed", "reasons"], width=console.width,
                               drop_first=("expect",)))
    n_failed = int((~frame["passed"]).sum())
    console.print(f"{len(frame) - n_failed} of {len(frame)} claims as expected" + (f"; {n_failed} not" if n_failed else ""))
    result = {"file": str(claims_path), "behaviour": _behaviour_names(frame), "n_claims": len(frame),
              "n_as_expected": len(frame) - n_failed, "claims": _frame_records(frame)}
    code = EXIT_FINDING if (args.strict and n_failed) else EXIT_OK
    return Outcome(code, console.file.getvalue(), {}, result if args.json is not None else None)


def _claims_file_inputs(claims_file, spec: str) -> list[str]:
    """The files a claims file makes a command read: its model's and its prompt file."""
    from interp.specnames import spec_files

    files = [str(f) for f in spec_files(spec)]
    return files + ([claims_file.prompts.file] if claims_file.prompts.file else [])


def _kind_list(kinds: dict[str, list[str]], width: int) -> str:
    """One entry per `kinds` key, its names after it in a column, filled at spaces to `width`."""
    import textwrap

    indent = 2 + max(map(len, kinds)) + 1
    return "\n".join(textwrap.fill(", ".join(names), width, initial_indent=f"  {what:<{indent - 3}} ",
                                    subsequent_indent=" " * indent, break_long_words=False)
                     for what, names in kinds.items())


def _behaviour_names(frame) -> str:
    """The behaviours the claims' causal evidence measured, joined ("" when none ran)."""
    if "behaviour" not in frame.columns:
        return ""
    return ", ".join(dict.fromkeys(str(b) for b in frame["behaviour"] if isinstance(b, str) and b))


def _short_reasons(reasons: str, passed: bool, width: int = 110) -> str:
    """All the reasons of a claim that missed its expected verdict; the start of them for a claim that got it
    (cut, never split at "; ": a reason may itself contain one)."""
    return str(reasons) if not passed else _cut(str(reasons), width)


def _cut(text: str, width: int) -> str:
    """`text` shortened to at most `width` characters at a space, marked with " ..." when cut."""
    return text if len(text) <= width else text[: width - 4].rsplit(" ", 1)[0] + " ..."


def _deciding_reasons(frame) -> list[str]:
    """Per row, the reason that decided the verdict, read from the Verdict objects that
    `interp.claims.verdict_frame` keeps in `frame.attrs["verdicts"]` (`interp.claims.decide` puts the
    deciding evidence first); without them, the joined reasons text."""
    verdicts = _verdicts(frame)
    if verdicts is None:
        return [str(r) for r in frame["reasons"]]
    return [_deciding_reason(v) for v in verdicts]


def _deciding_reason(verdict) -> str:
    """A verdict's first reason, as its evidence's numbers when it names one that measured a number:
    "sufficiency failed (not decisive): -0.465 [-0.584, -0.371], needs CI > 0.5" (the prose, with
    what was measured and where the threshold comes from, stays in --json); else the reason itself whole."""
    first = verdict.reasons[0] if verdict.reasons else ""
    evidence = next((e for e in verdict.evidence if first.startswith(f"{e.kind} ")), None)
    if evidence is None or ": " not in first:
        return first
    numbers = (evidence.effect, evidence.ci_low, evidence.ci_high)
    if not all(isinstance(x, float) and x == x for x in numbers):  # not measured (NaN): the reason says why
        return first
    outcome = first.split(": ", 1)[0]  # "necessity failed (not decisive)", "observational passed", ...
    effect, low, high = numbers
    return f"{outcome}: {effect:.3f} [{low:.3f}, {high:.3f}], needs {evidence.rule}"


def _verdicts(frame) -> list | None:
    """The Verdict objects behind a verdict frame's rows, or None when the frame does not carry them."""
    verdicts = frame.attrs.get("verdicts")
    return None if verdicts is None or len(verdicts) != len(frame) else list(verdicts)


# evidence kind (interp.claims.EVIDENCE_KINDS, in its order) -> its short name in the terminal (tested to match)
EVIDENCE_SHORT = {"observational": "obs", "control_shuffled": "shuf", "control_random_init": "rand",
                  "necessity": "nec", "sufficiency": "suf", "faithfulness": "faith", "zero": "zero", "qk_attribution": "qk",
                  "stability": "stab"}
MARKS = {"utf-8": {True: "\u2713", False: "\u2717", None: "?", "absent": "\u2013"},  # check, cross, ?, en dash
         "ascii": {True: "+", False: "x", None: "?", "absent": "-"}}


def _marks_for(encoding: str) -> dict:
    """The outcome marks a stream in `encoding` can print: the UTF-8 ones, or ASCII ones for any other."""
    return MARKS["utf-8" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else "ascii"]


def _evidence_marks(frame, marks: dict) -> list[str]:
    """Per row, every evidence kind's outcome in one cell, e.g. "obs+ shuf+ rand+ nec? suf- faith+"
    (passed, failed, undecided, not tested): the kinds any row tested, each row in the same order."""
    verdicts = _verdicts(frame)
    if verdicts is None:
        outcomes = [{k: _passed_cell(row.get(f"{k}_passed")) for k in EVIDENCE_SHORT if f"{k}_passed" in frame.columns}
                    for _, row in frame.iterrows()]
    else:
        outcomes = [{e.kind: e.passed for e in v.evidence} for v in verdicts]
    kinds = [k for k in EVIDENCE_SHORT if any(k in row and row[k] != "absent" for row in outcomes)]
    return [" ".join(EVIDENCE_SHORT[k] + marks[row.get(k, "absent")] for k in kinds) for row in outcomes]


def _passed_cell(value) -> bool | None | str:
    """A frame's `<kind>_passed` cell as an outcome: True, False, or "absent" (missing or NaN)."""
    return value if isinstance(value, bool) else bool(value) if value in (0, 1) else "absent"


EVIDENCE_NAMES = {"obs": "observational", "shuf": "shuffled control", "rand": "random-init control", "nec": "necessity",
                  "suf": "sufficiency", "faith": "faithfulness", "zero": "zero ablation (off-distribution, supporting only)",
                  "qk": "QK attribution (supporting only)", "stab": "stability"}


def _evidence_legend(cells: list[str], marks: dict) -> str:
    """The key to the evidence column: the short names its `cells` use, and the marks."""
    used = {word[:-1] for cell in cells for word in cell.split()}  # each word: a short name and one mark
    kinds = ", ".join(f"{short} {EVIDENCE_NAMES[short]}" for short in EVIDENCE_SHORT.values() if short in used)
    if not kinds:  # no claims shown
        return ""
    return (f"evidence: {kinds}; {marks[True]} passed, {marks[False]} failed, {marks[None]} undecided, "
            f"{marks['absent']} not tested")


def cmd_scan(args) -> int:
    from interp.analyses import claims

    _prompt_spec(args)  # bad flags fail before the model loads
    layers, heads = _select(args)
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    prompts = _prompts(model, args)
    from interp.analyses.claims.registry import claim_evidence_for
    from interp.analyses.report import select_heads

    chosen = select_heads(model, layers, heads) if layers is not None or heads is not None else None
    everything = claims.scan(model, prompts, seed=args.seed, evidence=claim_evidence_for(model), progress=not args.quiet,
                             behaviour=args.behaviour, heads=chosen)
    console = _out_console(args)
    marks = _marks_for(console.encoding)
    everything = everything.assign(reason=_deciding_reasons(everything), evidence=_evidence_marks(everything, marks))
    frame = everything[everything["verdict"] == "supported"] if args.supported_only else everything
    columns = ["label", "claim", "verdict", "p_adjusted", "evidence", "reason"]
    console.print(_frame_table(frame, title=f"Scan of {args.spec or DEFAULT_SPEC}: claims proposed on half of "
                               f"{len(prompts)} {prompts.kind} prompts, tested on the other half", columns=columns,
                               width=console.width, drop_first=("p_adjusted",), keep_whole=("evidence",)))
    legend = _evidence_legend(list(frame["evidence"]), marks)
    if legend:
        console.print(legend)
    counts = {v: int((everything["verdict"] == v).sum()) for v in VERDICTS}
    behaviour = _behaviour_names(everything)
    console.print(_scan_footer(counts, args.supported_only) + (f"; behaviour: {behaviour}" if behaviour else ""))
    _emit_json(args, "scan", args.spec or DEFAULT_SPEC, {
        "counts": counts, "shown": "supported" if args.supported_only else "all",
        "n_hidden": len(everything) - len(frame), "behaviour": behaviour,
        "claims": _frame_records(frame.drop(columns=[c for c in ("evidence", "reason") if c in frame.columns]))})
    return EXIT_OK


VERDICTS = ("supported", "refuted", "inconclusive")


def _scan_footer(counts: dict[str, int], supported_only: bool) -> str:
    """What the scan found, and what --supported-only hid (never "0 refuted" when they were only hidden)."""
    if not supported_only:
        return ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + " (full reasons in --json)"
    hidden = [f"{counts[v]} {v}" for v in VERDICTS[1:] if counts[v]]
    text = f"{counts['supported']} supported shown"
    return text + (f"; {' and '.join(hidden)} hidden by --supported-only" if hidden else "; none hidden") + \
        " (full reasons in --json)"


def cmd_heads(args) -> int:
    from interp.analyses import report

    _prompt_spec(args)  # bad flags fail before the model loads
    layers, heads = _select(args)
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    prompts = _prompts(model, args)
    frame = report.head_metrics(model, prompts, seed=args.seed, layers=layers, heads=heads)
    console = _out_console(args)
    shown, hidden = _heads_columns(frame)
    console.print(_frame_table(frame, title=f"Heads of {args.spec or DEFAULT_SPEC} on {len(prompts)} {prompts.kind} prompts "
                               "(means over prompts)", columns=shown, width=console.width, footer=hidden))
    _emit_json(args, "heads", args.spec or DEFAULT_SPEC, {"heads": _frame_records(frame)})
    return EXIT_OK


def _heads_columns(frame) -> tuple[list[str], list[str]]:
    """The metric means shown in the terminal, and footer lines counting what is left for --json."""
    shown = [c for c in frame.columns if not c.endswith(("_ci_low", "_ci_high", "_argmax")) and c not in ("layer", "head")
             and not frame[c].isna().all()]
    n_ci = sum(c.endswith("_ci_low") and not frame[c].isna().all() for c in frame.columns)
    argmax = [c for c in frame.columns if c.endswith("_argmax") and not frame[c].isna().all()]
    undefined = [c for c in frame.columns if not c.endswith(("_ci_low", "_ci_high")) and c not in ("layer", "head")
                 and frame[c].isna().all()]
    parts = [f"{n_ci} CIs"] + ([f"{len(argmax)} argmax rates"] if argmax else [])
    notes = [f"not shown: {', '.join(parts)} (all in --json)"]
    if undefined:
        notes.append(f"undefined for this model and prompts: {', '.join(undefined)}")
    return shown, notes


def cmd_verify(args) -> int:
    import interp.verify as verify

    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    frame = verify.verify_hooks(model)
    passed = frame["passed"].astype(bool) if "passed" in frame.columns else None
    spec = args.spec or DEFAULT_SPEC
    console = _out_console(args)
    n_failed = None if passed is None else int((~passed).sum())
    if n_failed != 0 or getattr(args, "verbose", False):  # all passed: one line, the table only when asked
        console.print(_frame_table(frame, title=f"Hook self-test of {spec}", width=console.width))
    _emit_json(args, "verify", spec, {"n_checks": len(frame), "n_failed": n_failed, "checks": _frame_records(frame)})
    if n_failed is None:  # no "passed" column
        return EXIT_OK
    console.print(_verify_summary(spec, len(frame), n_failed, getattr(args, "verbose", False)))
    return EXIT_FINDING if n_failed else EXIT_OK


def _verify_summary(spec: str, n_checks: int, n_failed: int, verbose: bool) -> str:
    """The line `interp verify` ends with (its only line when every check passes without --verbose)."""
    if n_failed:
        return f"{n_checks - n_failed} of {n_checks} hook checks passed on {spec}; {n_failed} failed (see the table)"
    return f"all {n_checks} hook checks passed on {spec}" + ("" if verbose else " (--verbose for the table)")


def cmd_train(args) -> int:
    """`interp train ARGS` runs `interp.experiments.train` (toy-induction, stdlib-bytes); `interp train stdlib-bpe
    ARGS` runs `interp.experiments.stdlib_bpe` (its `train` and `finish`). Their own parsers read the arguments:
    their help, their usage errors (exit 2), their exit codes."""
    argv = [a for a in args.train_args if a != "--"]
    if argv[:1] == ["stdlib-bpe"]:
        from interp.experiments import stdlib_bpe

        entry, argv = stdlib_bpe.main, argv[1:]
    else:
        from interp.experiments import train

        entry = train.main
    code: str | int | None
    try:
        code = entry(argv)
    except SystemExit as exit_:
        code = exit_.code
    return int(code or 0)


def _slug(spec: str) -> str:
    name = Path(spec.split(":")[-1]).name if spec else DEFAULT_SPEC
    name = name.removesuffix(".safetensors").removesuffix(".json")
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "model"
