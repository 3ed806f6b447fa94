"""The versions of what the toolkit writes for other programs to read, in one place (stdlib only, so
`interp --version` needs no torch). A change of a shape bumps its number and gets a CHANGELOG.md entry;
CHANGELOG.md's newest heading, the docs' schemas page and `interp --version` all name these numbers (tested)."""

JSON_SCHEMA = 3  # the CLI's `--json` envelope and each command's `result` (2: `error`, written on every exit code;
# 3: audit-leakage's `result.contracts`, `interp circuit`'s `curve` and `values`)
REPORT_SCHEMA = 6  # report.json's `schema_version`, the CSVs' columns and `columns.md` (5: "attend"; 6: "circuit"'s curve, values)
