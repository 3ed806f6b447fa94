"""Issue 43, item 5: short functions. No function or method in `interp/`, `analyses/` or `models/` is over
`MAX_LINES` lines, counted as `end_lineno - lineno + 1` of its `def` (signature and docstring included, decorators
not; nested functions counted on their own and inside their parent). A function that must be longer needs a line in
`ALLOWED` with its reason; the list is empty. `/work/shared/tools/check_architecture.py` prints the same measure with
the import rules; this test keeps the threshold in the suite, where a change that breaks it fails.
"""
from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("interp", "analyses", "models")  # interp/analyses and interp/models are symlinks to the last two: not walked
MAX_LINES = 60

# "path/to/module.py:Qualified.name" -> why it may be longer than MAX_LINES
ALLOWED: dict[str, str] = {}


def function_lengths(source: str) -> dict[str, int]:
    """Qualified name ("outer.inner", "Class.method") -> lines of every function and method in `source`."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def source_files() -> list[Path]:
    """Every .py file of the packages, symlinked folders not followed (each file once)."""
    files = []
    for package in PACKAGES:
        for folder, dirs, names in os.walk(ROOT / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(folder) / name for name in sorted(names) if name.endswith(".py")]
    return files


def long_functions() -> dict[str, int]:
    """"path:name" -> lines, for every function over MAX_LINES."""
    found = {}
    for path in source_files():
        where = path.relative_to(ROOT).as_posix()
        for name, lines in function_lengths(path.read_text(encoding="utf-8")).items():
            if lines > MAX_LINES:
                found[f"{where}:{name}"] = lines
    return found


def test_the_count_includes_signature_and_docstring_and_nested_functions():
    source = textwrap.dedent('''
        @decorator
        def outer(
            a,
        ):
            """Doc."""

            def inner():
                return 1
            return inner


        class Holder:
            def method(self):
                pass
    ''')
    assert function_lengths(source) == {"outer": 8, "outer.inner": 2, "Holder.method": 2}


def test_the_walk_sees_every_package_once():
    files = [path.relative_to(ROOT).as_posix() for path in source_files()]
    assert len(files) == len(set(files)) > 100
    assert "analyses/leakage/stages.py" in files and "models/gpt.py" in files
    assert not any(f.startswith(("interp/analyses/", "interp/models/")) for f in files)  # the symlinks


def test_no_function_is_over_60_lines():
    over = {name: lines for name, lines in long_functions().items() if name not in ALLOWED}
    assert over == {}, f"split these into named steps (at most {MAX_LINES} lines each), or list one in ALLOWED with its reason"


def test_the_allow_list_names_functions_still_over_the_limit():
    stale = sorted(set(ALLOWED) - set(long_functions()))
    assert stale == [], "these are short now (or gone): drop them from ALLOWED"
