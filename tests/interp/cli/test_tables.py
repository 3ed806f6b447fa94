"""The `interp` command at 80 and 120 columns (issue 23): no line of any command's help or output is
longer than $COLUMNS, help shows real defaults, `verify` says one line when all pass, and `scan` shows
every evidence kind's outcome.

The slow parts run once: the scan's verdicts and the hook self-test are computed in module fixtures
and handed to the CLI through monkeypatch, which then renders them at each width. The demo's findings
table is checked at 80 columns by the demo test in tests/interp/cli/test_cli.py (one report run in all)."""
import inspect
import os
import types

import pytest

from interp import cli
from interp.cli import commands
from interp.cli import parser as cli_parser

WIDTHS = [80, 120]
CONSTRUCTED = "interp.models.constructed:induction_circuit"


def _longest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _subparsers() -> dict:
    return cli.build_parser()._subparsers._group_actions[0].choices


# --------------------------------------------------------------------------- help


def test_fill_line_breaks_at_spaces_and_keeps_an_examples_indent():
    filled = cli_parser._fill_line("alpha beta gamma delta epsilon", 12, "")
    assert filled.splitlines() == ["alpha beta", "gamma delta", "epsilon"]
    example = cli_parser._fill_line("  interp report --n 64 --out reports/toy", 20, "").splitlines()
    assert example[0] == "  interp report --n" and all(line.startswith("      ") for line in example[1:])
    assert cli_parser._fill_line("   ", 20, "") == ""
    assert cli_parser._fill_line("a-very-long-word-kept-whole", 10, "  ") == "  a-very-long-word-kept-whole"


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_fits_the_terminal(width, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(width))  # argparse sizes its formatter from $COLUMNS when it formats
    texts = {"interp": cli.build_parser().format_help()}
    texts.update({name: sub.format_help() for name, sub in _subparsers().items()})
    assert cli.main(["train", "--", "--help"]) == 0  # interp.experiments.train's own help
    texts["train --"] = capsys.readouterr().out
    assert len(texts) == 12
    too_long = {name: _longest(text) for name, text in texts.items() if _longest(text) > width}
    assert not too_long, too_long
    assert "toy-\n" not in "".join(texts.values()).replace(" ", "")  # "toy-induction" is never broken at its hyphen
    if width == 80:  # the descriptions are filled to the width, not left at their source lines
        assert "exit codes: 0 ok, 1 a finding (leak, failed check, refuted claim with\n--strict, empty circuit)" in texts["interp"]


def test_help_shows_each_commands_default_number_of_prompts():
    import interp.specs
    from interp.analyses import leakage, report
    from interp.cli.common import AUDIT_PROMPTS_DEFAULT, PROMPTS_DEFAULT

    assert PROMPTS_DEFAULT == report.DEFAULT_N
    assert PROMPTS_DEFAULT == inspect.signature(interp.specs.build_prompts).parameters["default_n"].default
    assert AUDIT_PROMPTS_DEFAULT == inspect.signature(leakage.audit).parameters["n_prompts"].default
    helps = {name: next(a.help for a in sub._actions if "--n" in a.option_strings)
             for name, sub in _subparsers().items() if "--n" in sub._option_string_actions}
    assert set(helps) == {"report", "audit-leakage", "claims", "scan", "heads", "circuit", "demo", "qk"}
    for name in ("report", "scan", "heads", "circuit", "demo", "qk"):
        assert helps[name] == f"number of prompts (default: {PROMPTS_DEFAULT})"
    assert helps["audit-leakage"] == f"number of prompts (default: {AUDIT_PROMPTS_DEFAULT} per length)"
    assert helps["claims"] == f"number of prompts (default: the file's prompts.n, else {PROMPTS_DEFAULT})"
    assert not any("per command" in sub.format_help() for sub in _subparsers().values())


@pytest.mark.parametrize("width", WIDTHS)
def test_claims_list_kinds_fits(width, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main(["claims", "--list-kinds"]) == 0
    out = capsys.readouterr().out
    assert "previous_token" in out and "redundant" in out and _longest(out) <= width, out


def test_kind_list_puts_the_names_in_one_column():
    text = commands._kind_list({"one:": ["a", "bb", "cc"], "three:": ["d"]}, 15)
    assert text.splitlines() == ["  one:   a, bb,", "         cc", "  three: d"]


# --------------------------------------------------------------------------- verify


@pytest.fixture(scope="module")
def hook_checks():
    """toy-induction's hook self-test (every check passes), computed once."""
    import interp

    frame = interp.verify_hooks(interp.load("toy-induction"))
    assert frame["passed"].astype(bool).all()
    return frame


def _verify(monkeypatch, capsys, frame, width: int, *flags: str) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr("interp.verify.verify_hooks", lambda model: frame.copy())
    code = cli.main(["verify", "-q", *flags])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("width", WIDTHS)
def test_verify_says_one_line_when_every_check_passes(width, hook_checks, monkeypatch, capsys):
    code, out = _verify(monkeypatch, capsys, hook_checks, width)
    assert code == 0
    assert out.splitlines() == [f"all {len(hook_checks)} hook checks passed on toy-induction (--verbose for the table)"]
    code, out = _verify(monkeypatch, capsys, hook_checks, width, "--verbose")
    assert code == 0 and "Hook self-test of toy-induction" in out and "scores_qk" in out
    assert _longest(out) <= width
    assert out.splitlines()[-1] == f"all {len(hook_checks)} hook checks passed on toy-induction"


@pytest.mark.parametrize("width", WIDTHS)
def test_verify_prints_the_table_when_a_check_fails(width, hook_checks, monkeypatch, capsys):
    failing = hook_checks.copy()
    failing.loc[failing.index[2], "passed"] = False
    code, out = _verify(monkeypatch, capsys, failing, width)
    assert code == 1 and "Hook self-test of toy-induction" in out and _longest(out) <= width
    n = len(failing)
    assert out.splitlines()[-1] == f"{n - 1} of {n} hook checks passed on toy-induction; 1 failed (see the table)"


# --------------------------------------------------------------------------- scan


@pytest.fixture(scope="module")
def scan_frame():
    """The scan of the constructed induction circuit on 64 prompts (two halves of 32, a verdict's minimum)."""
    from interp.analyses import claims
    from interp.analyses.claims.registry import claim_evidence_for
    from interp.models.constructed import induction_circuit
    from interp.specs import PromptSpec, build_prompts

    model = induction_circuit(n_ctx=32)  # short prompts: the scan takes a third of the time it takes at 128
    prompts = build_prompts(model, PromptSpec(n=64))
    return claims.scan(model, prompts, seed=0, evidence=claim_evidence_for(model))


@pytest.mark.heavy
@pytest.mark.parametrize("width", WIDTHS)
def test_scan_fits_and_shows_every_evidence_kinds_outcome(width, scan_frame, monkeypatch, capsys):
    from interp.analyses import claims

    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(claims, "scan", lambda *args, **kwargs: scan_frame.copy())
    assert cli.main(["scan", CONSTRUCTED, "--n", "64", "-q"]) == 0
    out = capsys.readouterr().out
    assert _longest(out) <= width, out
    assert "…" not in out and " ..." not in out  # no reason is cut
    # the supported induction head: every kind it was tested on, with its outcome, not only "observational passed"
    assert "obs✓" in out and "shuf✓" in out and "rand✓" in out and "nec✓" in out and "suf" in out
    assert "evidence: obs observational, shuf shuffled control, rand random-init control, nec necessity" in \
        " ".join(out.split())
    assert "observational passed: 1.000 [1.000, 1.000], needs CI > 0.5" in commands._deciding_reasons(scan_frame)
    assert "needs" in out and "decisive" in out  # the deciding reasons, as their numbers
    # at 80 columns p_adjusted is the first column to go, named in the caption; at 120 all fit
    assert ("1 column not shown at 80 columns: p_adjusted" in out) == (width == 80) and ("not shown" in out) == (width == 80)


def _verdict(*outcomes: tuple[str, bool | None], reason: str = "", effect: float = 0.5):
    evidence = tuple(types.SimpleNamespace(kind=k, passed=p, effect=effect, ci_low=0.25, ci_high=0.75, rule="CI > 0.1")
                     for k, p in outcomes)
    return types.SimpleNamespace(evidence=evidence, reasons=(reason,) if reason else ())


def test_evidence_marks_list_each_kind_in_one_order():
    import pandas as pd

    frame = pd.DataFrame({"reasons": ["", ""]})
    frame.attrs["verdicts"] = [_verdict(("necessity", False), ("observational", True)),
                               _verdict(("observational", None), ("faithfulness", True))]
    ascii_marks = commands._marks_for("ascii")
    assert commands._evidence_marks(frame, ascii_marks) == ["obs+ necx faith-", "obs? nec- faith+"]
    assert commands._evidence_marks(frame, commands._marks_for("UTF-8"))[0] == "obs\u2713 nec\u2717 faith\u2013"
    assert commands._marks_for("cp1252") == ascii_marks
    legend = commands._evidence_legend(["obs+ nec- faith+"], ascii_marks)
    assert legend == "evidence: obs observational, nec necessity, faith faithfulness; + passed, x failed, ? undecided, " \
                     "- not tested"


def test_evidence_marks_without_verdicts_read_the_passed_columns():
    import pandas as pd

    frame = pd.DataFrame({"observational_passed": [True, False], "necessity_passed": [float("nan"), True]})
    assert commands._evidence_marks(frame, commands._marks_for("ascii")) == ["obs+ nec-", "obsx nec+"]
    assert commands._evidence_legend([], commands._marks_for("ascii")) == ""


def test_evidence_short_names_cover_every_kind():
    from interp.claims import EVIDENCE_KINDS

    assert tuple(commands.EVIDENCE_SHORT) == EVIDENCE_KINDS
    assert set(commands.EVIDENCE_NAMES) == set(commands.EVIDENCE_SHORT.values())


def test_deciding_reason_gives_the_numbers_of_the_evidence_it_names():
    verdict = _verdict(("observational", True), ("sufficiency", False),
                       reason="sufficiency failed (not decisive): fraction of loss recovered = 0.5 [0.25, 0.75] (long)")
    assert commands._deciding_reason(verdict) == "sufficiency failed (not decisive): 0.500 [0.250, 0.750], needs CI > 0.1"
    p_value = "every evidence passed but the adjusted p-value 0.2 does not clear alpha=0.05"
    assert commands._deciding_reason(_verdict(("observational", True), reason=p_value)) == p_value
    unmeasured = _verdict(("necessity", None), reason="necessity undecided: no loss to measure", effect=float("nan"))
    assert commands._deciding_reason(unmeasured) == "necessity undecided: no loss to measure"
    assert commands._deciding_reason(_verdict()) == ""


# --------------------------------------------------------------------------- claims

CLAIMS_TOML = """[prompts]
kind = "repeated"
n = 32
[claims]
L0H0 = "previous_token"
L1H0 = ["induction", "not previous_token"]
"L0H1 ~ L0H2" = "redundant"
"""


@pytest.fixture(scope="module")
def claims_run(tmp_path_factory):
    """A claims file on the constructed circuit (one missing its expected verdict), and its verdicts, once."""
    from interp.analyses.claims.registry import read_claims, run_claims
    from interp.models.constructed import induction_circuit

    path = tmp_path_factory.mktemp("claims") / "claims.toml"
    path.write_text(CLAIMS_TOML)
    return path, run_claims(induction_circuit(), read_claims(str(path)))


@pytest.mark.heavy
@pytest.mark.parametrize("width", WIDTHS)
def test_claims_table_fits(width, claims_run, monkeypatch, capsys):
    from interp.analyses.claims import registry

    path, frame = claims_run
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(registry, "run_claims", lambda *args, **kwargs: frame.copy())
    assert cli.main(["claims", CONSTRUCTED, str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "3 of 4 claims as expected; 1 not" in out and _longest(out) <= width, out


# --------------------------------------------------------------------------- audit-leakage (demo: tests/interp/cli/test_cli.py)


@pytest.mark.parametrize("width", WIDTHS)
def test_audit_leakage_output_and_cost_line_fit(width, monkeypatch, capsys):
    """A planted leak (tests/leakzoo: layer norm over time) prints every part: the verdict table, the
    origin's line of code, the largest influences, notes, and on stderr the cost estimate."""
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main(["audit-leakage", "leakzoo.plain:ln_over_time"]) == 1
    captured = capsys.readouterr()
    assert "LEAK" in captured.out and "origin (future)" in captured.out and "Largest influences" in captured.out
    assert _longest(captured.out) <= width, captured.out
    cost = [line for line in captured.err.splitlines() if "ETA" in line or "tokens through" in line]
    assert cost and _longest(captured.err) <= width, captured.err
    words = captured.err.split()  # filled at spaces: no word is cut at the line's end ("perturba/tion")
    assert "perturbation" in words and all(w.startswith("perturbation") for w in words if w.startswith("perturb"))
    assert "ETA about" in " ".join(words)


def test_whole_widths_keep_a_short_column_on_one_line_only_where_it_fits():
    from interp.cli import tables

    cells = {"label": ["L0H0"], "evidence": ["obs+ shuf+ nec-"], "reason": ["a long reason " * 4]}
    split = {c: False for c in cells}
    need = 1 + sum(tables._column_need(c, cells, False) + tables.TABLE_OVERHEAD for c in cells)  # 5 + 8 + 20 + 10
    assert need == 43
    grow = len("obs+ shuf+ nec-") - len("evidence")
    assert tables._whole_widths(list(cells), cells, split, need + grow, ("evidence",)) == {"evidence": 15}
    assert tables._whole_widths(list(cells), cells, split, need + grow - 1, ("evidence",)) == {}
    assert tables._whole_widths(["label", "reason"], cells, split, 200, ("evidence",)) == {}  # a dropped column


# --------------------------------------------------------------------------- error lines on stderr

MESSAGE = ("interp heads: error: names_filter names unknown hook 'blocks.0.attn.hook_patern'; did you mean "
           "['blocks.0.attn.hook_pattern', 'blocks.1.attn.hook_pattern'] (model.hook_dict lists them all)? A "
           "well-known-hyphenated-word and a path /tmp/some/long/folder/name/report.json stay whole.\n"
           "A second line of the message, filled on its own.")


@pytest.mark.parametrize("width", WIDTHS + [30])
def test_fill_message_breaks_at_spaces_only_and_rejoins_to_the_text(width):
    from interp.cli import output

    lines = output.fill_message(MESSAGE, width).splitlines()
    assert len(lines) > 2 and all(len(line) <= width or " " not in line for line in lines)  # a longer word: alone
    assert (max(len(line) for line in lines) <= width) == (width >= len("/tmp/some/long/folder/name/report.json"))
    assert " ".join(lines).split(" ") == " ".join(MESSAGE.split("\n")).split(" ")  # no word split, none lost
    first, second = MESSAGE.split("\n")
    assert " ".join(lines) == f"{first} {second}"
    assert output.fill_message(MESSAGE, None) == MESSAGE
    assert output.fill_message("a\n\nb", 10) == "a\n\nb"  # its own blank lines are kept


def test_stderr_width_is_columns_else_the_terminals_else_none(monkeypatch):
    from interp.cli import output

    assert output.stderr_width() is None  # pytest's capture: a file, not a terminal, and no $COLUMNS
    monkeypatch.setenv("COLUMNS", "97")
    assert output.stderr_width() == 97
    monkeypatch.setenv("COLUMNS", "wide")
    assert output.stderr_width() is None  # not a number: as if unset
    monkeypatch.delenv("COLUMNS")
    pty = pytest.importorskip("pty")
    import fcntl
    import io
    import struct
    import termios

    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 101, 0, 0))
        with io.open(follower, "w", closefd=False) as terminal:
            monkeypatch.setattr("sys.stderr", terminal)
            assert output.stderr_width() == 101  # stderr's own terminal
    finally:
        os.close(leader)
        os.close(follower)


ERRORS = {
    "bad input": ["heads", ""],  # BadInput: the spec is empty
    "usage": ["report", "--backend", "a-backend-name-that-is-not-one-of-the-four"],  # argparse: an invalid choice
    "arguments": ["claims", "one", "two", "three", "four", "five", "six", "seven"],  # BadInput from a handler
}


def _error_lines(err: str) -> list[str]:
    """The error message's lines: from the `interp ...: error:` line on (argparse prints its usage first)."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if ": error: " in line)
    return lines[start:]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("case", list(ERRORS))
def test_error_lines_fit_the_terminal_and_stay_one_line_in_logs(case, width, monkeypatch, capsys):
    def run() -> str:
        try:
            code = cli.main(ERRORS[case])
        except SystemExit as exit_:  # argparse exits
            code = exit_.code
        assert code == 2
        return capsys.readouterr().err

    plain = _error_lines(run())  # no $COLUMNS and no terminal: one line, as logs and CI greps want it
    assert len(plain) == 1 and len(plain[0]) > width
    monkeypatch.setenv("COLUMNS", str(width))
    err = run()
    lines = _error_lines(err)
    assert len(lines) > 1 and _longest(err) <= width, err
    assert " ".join(lines) == plain[0]  # the message unchanged once re-joined, no word split
