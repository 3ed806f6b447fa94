"""The versions of what the toolkit writes for other programs to read, in one place (stdlib only, so
`interp --version` needs no torch). A change of a shape bumps its number and gets a CHANGELOG.md entry;
CHANGELOG.md's newest heading, the docs' schemas page and `interp --version` all name these numbers (tested)."""

JSON_SCHEMA = 4  # the CLI's `--json` envelope and each command's `result` (2: `error`, written on every exit code;
# 3: audit-leakage's `result.contracts`, `interp circuit`'s `curve` and `values`; 4: `interp claims`' per-claim
# `evidence` with `write_change` and per-prompt `values`, `interp circuit`'s circuit schema 2: `untested`, `write_change`)
REPORT_SCHEMA = 7  # report.json's `schema_version`, the CSVs' columns and `columns.md` (5: "attend"; 6: "circuit"'s curve,
# values; 7: "circuit"'s circuit schema 2: `untested`, `write_change`)
