"""The docs site (docs/, mkdocs.yml): its tutorials' code runs as written, taken from the Markdown
files themselves; its tables agree with the code; the site builds strictly and offline.

A ```python block runs unless the line just before its fence is a skip marker with a reason,
`<!-- docs-test: skip (why it cannot run here) -->`. A page's blocks run in order in one namespace,
in a scratch folder that holds a link to examples/ (so `examples/claims.toml` reads as in a checkout).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
SKIP_MARKER = re.compile(r"<!--\s*docs-test:\s*skip\s*(?:\((?P<reason>[^)]*)\))?\s*-->")
FENCE = re.compile(r"^```python\s*\n(?P<code>.*?)^```\s*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One ```python block of a page: its code, the line it starts on (1-based), skip reason or None."""

    code: str
    line: int
    skip: str | None


def python_blocks(text: str, where: str = "<page>") -> list[Block]:
    """Every ```python block of a Markdown text, in order, with its skip marker's reason (if any)."""
    blocks = []
    for match in FENCE.finditer(text):
        first_line = text.count("\n", 0, match.start("code")) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP_MARKER.search(before)
        reason = None
        if marker:
            reason = (marker.group("reason") or "").strip()
            if not reason:
                raise ValueError(f"{where}:{first_line - 1}: a docs-test skip marker needs its reason: "
                                 "<!-- docs-test: skip (why) -->.")
        blocks.append(Block(match.group("code"), first_line, reason))
    return blocks


def nav_pages(nav) -> list[str]:
    """The Markdown files mkdocs.yml's nav lists, depth first."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav for page in nav_pages(item)]


def _config() -> dict:
    return yaml.safe_load(MKDOCS_YML.read_text())


PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
RUNNABLE = [page for page in PAGES if python_blocks((DOCS / page).read_text(), page)]


# --------------------------------------------------------------------------- the extractor itself


def test_python_blocks_finds_blocks_lines_and_skip_reasons():
    text = ("# t\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n\n"
            "<!-- docs-test: skip (needs a GPU) -->\n```python\ny = 2\n```\n")
    blocks = python_blocks(text)
    assert [(b.code, b.line, b.skip) for b in blocks] == [("x = 1\n", 4, None), ("y = 2\n", 13, "needs a GPU")]


def test_a_skip_marker_without_a_reason_is_refused():
    with pytest.raises(ValueError, match="page.md:2: a docs-test skip marker needs its reason"):
        python_blocks("<!-- docs-test: skip -->\n```python\nx = 1\n```\n", "page.md")


# --------------------------------------------------------------------------- the pages


def test_mkdocs_nav_lists_every_page_and_only_pages_that_exist():
    listed = nav_pages(_config()["nav"])
    assert sorted(listed) == PAGES, "docs/*.md and mkdocs.yml's nav must name the same pages"
    assert len(listed) == len(set(listed))


def test_every_tutorial_has_code_that_runs():
    tutorials = [page for page in PAGES if page.startswith("tutorials/")]
    assert len(tutorials) >= 5
    for page in tutorials:
        blocks = python_blocks((DOCS / page).read_text(), page)
        assert any(b.skip is None for b in blocks), f"{page} has no python block the tests run"


@pytest.mark.parametrize("page", RUNNABLE)
def test_page_code_runs(page, tmp_path, monkeypatch):
    """The page's python blocks, run in order in one namespace, as a reader would paste them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    namespace: dict = {"__name__": f"docs_{Path(page).stem.replace('-', '_')}"}
    for block in python_blocks((DOCS / page).read_text(), page):
        if block.skip is not None:
            continue
        padded = "\n" * (block.line - 1) + block.code  # tracebacks name the Markdown file's own lines
        exec(compile(padded, str(DOCS / page), "exec"), namespace)  # noqa: S102 - our own docs


# --------------------------------------------------------------------------- tables that must agree with the code


def _schema_number(field: str) -> int:
    rows = [line for line in (DOCS / "schemas.md").read_text().splitlines() if line.startswith("|") and f"| `{field}` | **" in line]
    assert len(rows) == 1, f"schemas.md needs one table row for `{field}`"
    return int(re.search(r"\*\*(\d+)\*\*", rows[0]).group(1))


def test_FD10_the_own_model_page_promises_only_what_holds():
    """The own-model tutorial once said TransformerLens names "are being added as aliases" (they work) and that
    "everything that works on the shipped models works here" (not claim verdicts, not path patching)."""
    text = " ".join((DOCS / "tutorials" / "own-model.md").read_text().split())
    assert "are being added as aliases" not in text
    assert "Everything that works on the shipped models works here" not in text


def test_schema_page_versions_equal_the_code():
    from interp.schemas import JSON_SCHEMA, REPORT_SCHEMA

    assert _schema_number("schema") == JSON_SCHEMA
    assert _schema_number("schema_version") == REPORT_SCHEMA
    text = (DOCS / "schemas.md").read_text()
    assert f"(`schema` {JSON_SCHEMA})" in text and f"(`schema_version` {REPORT_SCHEMA})" in text


def test_changelog_names_the_version_and_both_schemas():
    """CHANGELOG.md's newest section names the distribution's version and both schema versions, as
    `interp --version` prints them and the docs' schemas page states them."""
    from interp.cli.output import toolkit_version
    from interp.schemas import JSON_SCHEMA, REPORT_SCHEMA

    changelog = (DOCS.parent / "CHANGELOG.md").read_text()
    newest = next(line for line in changelog.splitlines() if line.startswith("## "))
    assert newest.startswith(f"## {toolkit_version()}"), newest
    assert f"JSON schema {JSON_SCHEMA}, report schema {REPORT_SCHEMA}" in newest, newest


def _first_column(page: str, heading: str) -> list[str]:
    """The backticked names in the first column of the table under `heading` on a page."""
    section = (DOCS / page).read_text().split(heading, 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `") or line.startswith("| [`")]
    return [re.search(r"`([^`]+)`", row).group(1) for row in rows]


def test_claims_page_lists_every_claim_kind_and_key():
    from dataclasses import fields

    from interp.analyses.claims.registry import claim_kinds
    from interp.specs import _TOP_KEYS, PromptSpec

    page = "tutorials/claims-files.md"
    assert sorted(_first_column(page, "### Claim kinds")) == claim_kinds()
    assert _first_column(page, "### `[prompts]`") == [f.name for f in fields(PromptSpec)]
    top = [name.strip("[]") for name in _first_column(page, "### Top level")]
    assert sorted(top) == sorted(_TOP_KEYS)


def test_public_names_page_lists_every_export():
    import interp

    names = [name.removeprefix("interp.") for name in _first_column("api/interp.md", "## Public names")]
    assert names == sorted(interp._EXPORTS)


# --------------------------------------------------------------------------- the built site


def _site(tmp_path_factory) -> Path:
    """The site `make test` built just before (INTERP_DOCS_SITE), else a strict build of our own."""
    built = os.environ.get("INTERP_DOCS_SITE")
    if built:
        return Path(built)
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


@pytest.mark.heavy
def test_site_builds_strictly_and_loads_nothing_from_the_network(tmp_path_factory):
    site = _site(tmp_path_factory)
    pages = sorted(site.rglob("*.html"))
    assert (site / "index.html").is_file() and (site / "api" / "run.html").is_file()
    remote = re.compile(r"""\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I)
    offenders = [str(p.relative_to(site)) for p in pages if remote.search(p.read_text(encoding="utf-8"))]
    assert not offenders, f"pages referring to the network: {offenders}"
    css = [p for p in site.rglob("*.css") if re.search(r"@import\s+url\(\s*['\"]?https?:", p.read_text(encoding="utf-8"))]
    assert not css
    run_page = (site / "api" / "run.html").read_text(encoding="utf-8")
    assert "interp.run.Run" in run_page and "effect" in run_page  # the API reference comes from the docstrings


def test_claims_page_example_is_the_shipped_example_file():
    """The TOML shown on the claims page says what examples/claims.toml says (comments aside)."""
    from interp.analyses.claims.registry import claim_kinds, read_claims
    from interp.specs import parse_claims_text

    text = (DOCS / "tutorials" / "claims-files.md").read_text()
    shown = re.search(r"```toml\n(# examples/claims.toml.*?)```", text, re.S).group(1)
    page = parse_claims_text(shown, "claims-files.md", valid_kinds=claim_kinds())
    shipped = read_claims(ROOT / "examples" / "claims.toml")
    assert (page.model, page.alpha, page.prompts) == (shipped.model, shipped.alpha, shipped.prompts)
    assert [e.name for e in page.claims] == [e.name for e in shipped.claims]


def test_leakage_page_names_every_key_of_the_audit_json(tmp_path):
    from interp.cli import main

    section = (DOCS / "tutorials" / "leakage-ci.md").read_text().split("### The JSON `result`", 1)[1].split("\n#", 1)[0]
    first_cells = [row.split("|")[1] for row in section.splitlines() if row.startswith("| `")]
    documented = {name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)}
    out = tmp_path / "audit.json"
    assert main(["audit-leakage", "toy-induction", "--max-len", "8", "--json", str(out)]) == 0
    keys = set(json.loads(out.read_text())["result"])
    assert keys <= documented, f"keys of the audit's JSON result missing from leakage-ci.md: {sorted(keys - documented)}"
