"""One definition per concept: a public top-level name is defined in one module of the toolkit.

What is scanned (with `ast`, not by importing): every `*.py` under `interp/`, `analyses/` and `models/` (the
symlinks `interp/analyses` and `interp/models` are read once, as `analyses/` and `models/`). A module's public
definitions are its top-level
- classes and functions (`def`, `async def`, `class`) whose name does not start with `_`;
- type aliases: `type X = ...`, `X: TypeAlias = ...`, and `X = <type expression>` where the expression is a
  subscripted generic from `typing`, `collections.abc` or the builtins (`Literal[...]`, `tuple[int, int]`,
  `Callable[..., T]`, `dict[str, Head]` ...) or a `|` union of names, such generics and `None`.
Not counted: constants and other assignments, `TypeVar`s (type parameters, not concepts), names a module
imports (a re-export is the same definition), and names inside classes or functions.

Exempt by rule: the per-family converter functions `config` and `state_dict` of `models/convert/*.py` (each
family module answers the same two questions for its own checkpoints) and `main` (a module's command-line entry
point). Any other name defined twice needs a line in `ALLOWED` with its reason.
"""
import ast
import builtins
import collections.abc
import typing
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("interp", "analyses", "models")
SYMLINKS = {"interp/analyses", "interp/models"}  # the same files as analyses/ and models/
CONVERTER_FUNCTIONS = {"config", "state_dict"}
GENERICS = ({n for n in dir(typing) if not n.startswith("_")} | {n for n in dir(collections.abc) if n[0].isupper()}
            | {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)})

# name -> why the same public name is defined in more than one module (keep this list short)
ALLOWED: dict[str, str] = {}


def _is_type_expression(node: ast.expr) -> bool:
    if isinstance(node, ast.Subscript):
        base = node.value
        name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None
        return name in GENERICS
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return all(_is_union_member(side) for side in (node.left, node.right))
    return False


def _is_union_member(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, (ast.Name, ast.Attribute)):
        return True
    return _is_type_expression(node)


def _alias_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines as type aliases (see the module docstring)."""
    if type_alias := getattr(ast, "TypeAlias", None):  # `type X = ...` (Python 3.12+)
        if isinstance(node, type_alias):
            return [node.name.id]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        if ast.unparse(node.annotation).split(".")[-1] == "TypeAlias" or _is_type_expression(node.value):
            return [node.target.id]
    if isinstance(node, ast.Assign) and _is_type_expression(node.value):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def public_definitions(source: str) -> list[str]:
    """The public classes, functions and type aliases a module's source defines at its top level."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        else:
            names.extend(_alias_names(node))
    return [name for name in names if not name.startswith("_")]


def _modules() -> list[Path]:
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    return [p for p in files if not any(str(p.relative_to(ROOT)).startswith(link + "/") for link in SYMLINKS)]


def _exempt(name: str, module: str) -> bool:
    return name == "main" or (name in CONVERTER_FUNCTIONS and module.startswith("models/convert/"))


def definitions() -> dict[str, list[str]]:
    """Public name -> the modules (paths from the repository root) that define it, exempt names left out."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        module = str(path.relative_to(ROOT))
        for name in public_definitions(path.read_text(encoding="utf-8")):
            if not _exempt(name, module):
                where[name].append(module)
    return where


def test_no_public_name_is_defined_in_two_modules():
    twice = {name: modules for name, modules in definitions().items() if len(modules) > 1 and name not in ALLOWED}
    assert twice == {}, "rename or merge these (one definition per concept), or list one in ALLOWED with its reason"


def test_the_allow_list_names_real_duplicates():
    where = definitions()
    stale = [name for name in ALLOWED if len(where.get(name, [])) < 2]
    assert stale == [], "these are defined once now: drop them from ALLOWED"


def test_the_scan_reads_the_whole_toolkit_once():
    modules = [str(p.relative_to(ROOT)) for p in _modules()]
    assert len(modules) > 100 and len(modules) == len(set(modules))
    assert "interp/run.py" in modules and "analyses/leakage/types.py" in modules and "models/gpt.py" in modules
    assert not any(m.startswith(("interp/analyses/", "interp/models/")) for m in modules)


def test_what_counts_as_a_public_definition():
    source = '''
from typing import Literal, TypeAlias, TypeVar
import typing as t
class Shape: ...
def build(): ...
async def fetch(): ...
def _helper(): ...
Kind = Literal["a", "b"]
Pair = tuple[int, int]
Maybe = int | None
Fn = t.Callable[[int], int]
Explicit: TypeAlias = "Shape"
Annotated_: type[Shape] = dict[str, Shape]
T = TypeVar("T")
LIMIT = 3
TABLE = {"a": 1}
row = TABLE["a"]
_Private = Literal["x"]
from os import path
'''
    assert public_definitions(source) == ["Shape", "build", "fetch", "Kind", "Pair", "Maybe", "Fn", "Explicit",
                                          "Annotated_"]


def test_the_rules_exempt_converters_and_entry_points_only():
    assert _exempt("main", "analyses/text_heads.py")
    assert _exempt("config", "models/convert/gpt2.py") and _exempt("state_dict", "models/convert/llama.py")
    assert not _exempt("config", "interp/loading.py")
    assert not _exempt("measure", "models/convert/gpt2.py")
