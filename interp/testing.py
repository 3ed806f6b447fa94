"""Assertions for users' own test suites (and, below, a pytest plugin for claims files).

`assert_causal(model)` runs `interp.analyses.leakage.audit` and raises an AssertionError that says
where the leak enters and how large it is; `assert_bidirectional_padding_inert(encoder)` is the
encoders' counterpart (bidirectional by design, padding inert, examples unmixed). This module is loaded by pytest as a plugin
(entry point `interp_claims`), so it imports nothing heavy at import time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd
    from _pytest._code.code import ExceptionInfo, TerminalRepr, TracebackStyle

    from interp.analyses.leakage import LeakageReport


def _leak_message(report: Any) -> str:
    """What an AssertionError says: the verdict, the first leaking site, the worst rows."""
    kinds = ", ".join(report.leaks) or "none"
    lines = [
        f"{report.model_name} is not causal: verdict {report.verdict!r}, leaks found: {kinds}; "
        f"max influence {report.max_influence:.3g} of the output scale (tol {report.tol:g}).",
    ]
    if report.bidirectional:
        lines.append("The model is bidirectional by design (an encoder): every position reads later ones.")
    for kind, origin in report.origins.items():
        op = origin.frame or origin.user_frame
        if op is None:
            lines.append(f"The {kind} leak appears in {origin.op} inside torch or a library: no line of model code.")
        else:
            lines.append(f"The {kind} leak appears at {op.file}:{op.line} in {op.function} ({origin.op}): {op.code}")
        lines.append(f"  {origin.detail}" + (f"; {origin.mask}" if origin.mask else ""))
        if origin.built is not None:
            lines.append(f"  what it consumed ({origin.built_by}) was built at {origin.built}")
        elif origin.built_by is not None:
            lines.append(f"  what it consumed is the {origin.built_by}")
        if origin.user_frame is not None and origin.frame is not None:
            lines.append(f"  called from {origin.user_frame}")
    if report.first_leaking_site:
        lines.append(f"First leaking site (forward order): {report.first_leaking_site}.")
    for reason in report.incomplete.values():
        lines.append(f"Not checked: {reason}")
    if "future" in report.leaks and not report.bidirectional:
        lines.append("If the model is meant to attend both ways (an encoder), use assert_bidirectional_padding_inert, "
                     "or declare it: audit(..., bidirectional=True).")
    table = report.table
    import pandas as pd

    from interp.analyses.leakage import above_threshold, describe_row

    worst = table[above_threshold(table, report.tol) & (table["method"] != "pattern")]
    if not report.bidirectional or "padding" in report.leaks:
        if report.bidirectional:
            worst = worst[worst["method"] == "padding"]
        # the largest row of each method first (the gradient's exact pair is small in output units, and
        # would be crowded out by the cut-based rows), then the largest of the rest
        ranked = worst.sort_values("influence", ascending=False)
        shown = pd.concat([ranked.drop_duplicates("method"), ranked]).drop_duplicates().head(6)
        for _, row in shown.iterrows():
            lines.append(f"  {describe_row(row)}")
    lines.append("Full report: interp.analyses.leakage.audit(model) (print it, or .to_json()).")
    return "\n".join(lines)


def assert_causal(model: Any, **audit_kwargs: Any) -> LeakageReport:
    """Raise an AssertionError unless `model` is causal (no position reads a later token, no
    example reads another, padding is inert); return the `LeakageReport` otherwise.

    Keyword arguments go to `interp.analyses.leakage.audit` (max_len, vocab_size, tol, lengths, ...). The model
    is expected to be causal unless it declares itself an encoder (`interp.analyses.leakage.declaration`): what its
    attention calls look like excuses nothing. The message names the line of code where each leak appears.
    """
    from interp.analyses.leakage import audit

    report = audit(model, **audit_kwargs)
    if not report.causal:
        raise AssertionError(_leak_message(report))
    return report


def assert_bidirectional_padding_inert(model: Any, **audit_kwargs: Any) -> LeakageReport:
    """Raise an AssertionError unless `model` is a bidirectional encoder whose padding is inert (pad
    content moves no real position, right padding reproduces the unpadded outputs, a fully masked
    row gives no NaN) and whose examples do not mix; return the `LeakageReport` otherwise.

    The encoder's counterpart of `assert_causal`, which fails on every encoder by design. The model must
    declare itself an encoder (a HookedEncoder, a Hugging Face encoder config) or the caller must, with
    `bidirectional=True`.
    """
    from interp.analyses.leakage import audit

    report = audit(model, **audit_kwargs)
    if not report.bidirectional:
        raise AssertionError(
            f"{report.model_name} is not declared bidirectional (verdict {report.verdict!r}): the audit treats it as "
            "causal. Use assert_causal for decoders; for an encoder that does not declare itself (a HookedEncoder "
            "or a Hugging Face encoder config does), pass bidirectional=True."
        )
    if report.leaks:
        raise AssertionError(_leak_message(report))
    return report


# =============================================================================================
# Claims files: `interp claims SPEC FILE` and a pytest plugin that collects them as tests
# =============================================================================================
#
# A claims file (format: `interp.specs`) pins interpretations of a model's heads, e.g.
#
#     model = "toy-induction"
#     [prompts]
#     kind = "repeated"
#     n = 64
#     [claims]
#     L1H2 = "induction"
#     L0H0 = "not induction"
#     "L0H2 -> L1H2 via k" = "composes"
#
# `read_claims(path)` parses one (errors give FILE:LINE:COLUMN); `run_claims(model, file)` tests
# every claim of the file at once (one Benjamini-Hochberg correction over the file) and returns
# one row per claim with `expect` and `passed`; both live in `interp.analyses.claims.registry`, with the claim
# kinds they accept, and are re-exported here. As a pytest plugin (entry point `pytest11`,
# name `interp_claims`), files named `claims*.toml` or `*.claims.toml` become test files with
# one item per claim; an item fails with the verdict's reasons. The model comes from
# `--interp-model SPEC`, else the file's `model`, else the ini option `interp_model`.

import fnmatch as _fnmatch

# the face's own names (interp.read_claims, interp.run_claims): `name as name`, an explicit re-export
from interp.analyses.claims.registry import read_claims as read_claims
from interp.analyses.claims.registry import run_claims as run_claims
from interp.errors import EXIT_INPUT, exit_code_for
from interp.specs import ClaimEntry, ClaimsFileError

CLAIMS_FILE_PATTERNS = ("claims*.toml", "*.claims.toml")
def claim_failure_message(row: pd.Series, reasons: Sequence[str]) -> str:
    """Why a claim did not get its expected verdict, for a test report: one line per reason of its verdict."""
    expected = "supported" if row["expect"] == "supported" else "refuted"
    listed = "\n  - ".join(reasons)
    return (f"claim {row['name']!r} expected {expected}, got {row['verdict']} "
            f"(adjusted p = {row.get('p_adjusted', float('nan')):.3g}):\n  - {listed}")


try:  # the plugin half needs pytest; the CLI half above does not
    import pytest as _pytest

    _HAS_PYTEST = True
except ImportError:  # pragma: no cover
    _HAS_PYTEST = False

if _HAS_PYTEST:

    class ClaimFailed(AssertionError):
        """A claim did not get its expected verdict."""

    _MODELS = _pytest.StashKey[dict[str, Any]]()  # model spec -> the model loaded for it

    def pytest_addoption(parser: _pytest.Parser) -> None:
        group = parser.getgroup("interp", "interp claims files (claims*.toml, *.claims.toml)")
        group.addoption("--interp-model", action="store", default=None, metavar="SPEC",
                        help="model spec to test claims files against (overrides the files' model = ...)")
        parser.addini("interp_model", "default model spec for claims files that name none", default=None)

    def pytest_collect_file(file_path: Path, parent: _pytest.Collector) -> ClaimsTomlFile | None:
        if file_path.suffix == ".toml" and any(_fnmatch.fnmatch(file_path.name, p) for p in CLAIMS_FILE_PATTERNS):
            return ClaimsTomlFile.from_parent(parent, path=file_path)
        return None

    class ClaimsTomlFile(_pytest.File):
        """A claims file: one item per claim; the claims run together, once, on first use."""

        def collect(self) -> Iterator[ClaimItem]:
            self.claims_file = read_claims(self.path)
            self._outcome: pd.DataFrame | Exception | None = None
            for entry in self.claims_file.claims:
                # "L0H0 -> L1H2 via k: composes" -> "L0H0->L1H2-via-k-composes"
                name = entry.name.replace(" -> ", "->").replace(": ", "-").replace(" ", "-")
                yield ClaimItem.from_parent(self, name=name, entry=entry)

        def model_spec(self) -> str:
            config = self.config
            spec = config.getoption("interp_model") or self.claims_file.model or config.getini("interp_model")
            if not spec:
                raise _pytest.UsageError(
                    f"{self.path} names no model: add model = \"...\" to it, pass --interp-model SPEC, "
                    "or set interp_model in the pytest ini file."
                )
            return spec

        def outcome(self) -> pd.DataFrame | Exception:
            """The claims' result frame (computed once), or the exception computing it raised."""
            if self._outcome is None:
                try:
                    spec = self.model_spec()
                    models = self.config.stash.setdefault(_MODELS, {})
                    if spec not in models:
                        from interp.loading import load

                        models[spec] = load(spec)
                    self._outcome = run_claims(models[spec], self.claims_file)
                except Exception as error:  # every item of the file reports the same failure
                    self._outcome = error
            return self._outcome

        def repr_failure(self, excinfo: ExceptionInfo[BaseException],
                         style: TracebackStyle | None = None) -> str | TerminalRepr:
            """The error message alone for a bad claims file. (`style`: Node's signature; a Collector's
            representation takes none.)"""
            if isinstance(excinfo.value, ClaimsFileError):
                return str(excinfo.value)
            return super().repr_failure(excinfo)

    class ClaimItem(_pytest.Item):
        """One claim of a claims file."""

        def __init__(self, *, entry: ClaimEntry, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.entry = entry

        def runtest(self) -> None:
            assert isinstance(self.parent, ClaimsTomlFile)  # ClaimsTomlFile.collect makes every ClaimItem
            outcome = self.parent.outcome()
            if isinstance(outcome, BaseException):
                raise outcome
            row = outcome[outcome["name"] == self.entry.name].iloc[0]
            if not bool(row["passed"]):
                raise ClaimFailed(claim_failure_message(row, outcome.attrs["reasons"][self.entry.name]))

        def repr_failure(self, excinfo: ExceptionInfo[BaseException],
                         style: TracebackStyle | None = None) -> str | TerminalRepr:
            error = excinfo.value
            if isinstance(error, ClaimFailed):
                return f"{self.path}:{self.entry.line}: {error}"
            if isinstance(error, _pytest.UsageError) or exit_code_for(error) == EXIT_INPUT:  # bad input, a failing model
                return f"{self.path}:{self.entry.line}: could not test the claims: {type(error).__name__}: {error}"
            return super().repr_failure(excinfo, style)

        def reportinfo(self) -> tuple[Path, int, str]:
            return self.path, max(0, self.entry.line - 1), f"claim {self.entry.name}"
