"""One namespace: the toolkit's modules live under `interp` only, so a user's own `models.py` or
`analyses.py` beside their notebook changes nothing, and the former top-level names are refused clearly."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# what a user might well have beside their notebook: names our code must never pick up
USER_MODELS = '''"""The user's own models.py: a factory, and names that would break the toolkit if it imported this."""
io = None
HookedGPT = None
GPTConfig = None


def build():
    from interp.models import GPTConfig, HookedGPT

    return HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, n_ctx=16, d_vocab=32, seed=0))
'''
USER_ANALYSES = 'raise ImportError("the toolkit imported the user\'s own analyses.py")\n'


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    (tmp_path / "models.py").write_text(USER_MODELS)
    (tmp_path / "analyses.py").write_text(USER_ANALYSES)
    return tmp_path


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}  # the folder itself is first on sys.path
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.heavy
def test_the_tour_runs_from_a_folder_holding_models_and_analyses(user_folder: Path) -> None:
    tour = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    (user_folder / "tour.py").write_text(tour + "\nprint('tour done')\n")
    result = _run(["tour.py"], user_folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tour done" in result.stdout


@pytest.mark.heavy
def test_the_cli_runs_from_a_folder_holding_models_and_analyses(user_folder: Path) -> None:
    result = _run(["-m", "interp.cli", "heads", "toy-induction", "--n", "8", "-q", "--json", "-"], user_folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"command": "heads"' in result.stdout


@pytest.mark.heavy
def test_a_users_own_models_module_is_still_a_factory(user_folder: Path) -> None:
    """`models:build` next to the user's code means their module: the toolkit's former name takes nothing away."""
    result = _run(["-m", "interp.cli", "audit-leakage", "models:build", "-q"],
                  user_folder)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("spec", ["models.constructed:induction_circuit", "analyses.positional:focus"])
def test_former_top_level_names_are_refused_with_the_new_path(tmp_path: Path, spec: str) -> None:
    result = _run(["-m", "interp.cli", "heads", spec, "--n", "8"], tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"'interp.{spec}'" in result.stderr


def test_former_names_are_refused_from_python_too() -> None:
    import interp
    from interp.errors import BadInput

    with pytest.raises(BadInput, match=r"Use 'interp\.models\.constructed:induction_circuit'"):
        interp.load("models.constructed:induction_circuit")


def test_no_generic_top_level_package_is_installed() -> None:
    """The distribution's top-level names are `interp` alone (its RECORD, as pip installed it)."""
    import sysconfig
    from importlib.metadata import distributions

    installed = [d for d in distributions(path=[sysconfig.get_paths()["purelib"]])
                 if d.metadata["Name"] == "interp-attention"]  # not a build's egg-info in the working folder
    assert len(installed) == 1, installed
    files = installed[0].files or []
    tops = {Path(str(f)).parts[0] for f in files if not str(f).startswith(("interp_attention", "__editable__", ".."))}
    tops.discard("__pycache__")
    assert tops <= {"interp", "bin"}, tops
    import interp.analyses
    import interp.models

    package = Path(interp.__file__).parent
    assert Path(interp.models.__file__).parent.parent == package  # a checkout links models/ there; a wheel holds it
    assert Path(interp.analyses.__file__).parent.parent == package
    assert (package / "py.typed").is_file()


# --------------------------------------------------------------------------- the visible, typed surface

INIT = ROOT / "interp" / "__init__.py"
HELPERS = {"importlib", "ModuleType", "TYPE_CHECKING", "Any", "annotations", "quiet_tqdm_import_warning", "_EXPORTS"}


def _type_checking_imports(path: Path) -> dict[str, str]:
    """name -> module of each `from module import name as name` inside the file's `if TYPE_CHECKING:` block."""
    import ast

    block = next(node for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    found: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{ast.unparse(node)}: `name as name` makes it a re-export"
            found[alias.name] = node.module
    return found


def test_dir_shows_the_public_names_and_hides_the_helpers() -> None:
    import interp

    shown = dir(interp)
    assert interp.__all__ == sorted(interp._EXPORTS) and len(interp.__all__) > 40
    assert set(interp.__all__) <= set(shown)
    assert {"Run", "load", "HeadAblation", "test_claims"} <= set(shown)
    assert not HELPERS & set(shown), HELPERS & set(shown)
    assert all(hasattr(interp, name) for name in shown)


def test_dir_and_import_load_no_torch() -> None:
    code = "import sys, interp; names = dir(interp); print('Run' in names, 'torch' in sys.modules)"
    result = _run(["-c", code], ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]


def test_type_checkers_see_each_public_name_from_the_module_it_is_loaded_from() -> None:
    import interp

    assert _type_checking_imports(INIT) == interp._EXPORTS


def test_each_public_name_is_its_modules_object() -> None:
    import importlib

    import interp

    for name, module in interp._EXPORTS.items():
        assert getattr(interp, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        interp.no_such_name  # noqa: B018


@pytest.mark.parametrize("package", ["interp.cli", "interp.models", "interp.models.convert"])
def test_every_name_in_a_packages_all_resolves(package: str) -> None:
    import importlib

    module = importlib.import_module(package)
    assert [name for name in module.__all__ if not hasattr(module, name)] == []


# public names mypy sees as Any in this check, with why
ANY_IN_THIS_CHECK: dict[str, str] = {}
MYPY_CONFIG = """[mypy]
python_version = 3.11
mypy_path = {root}
ignore_missing_imports = True
implicit_reexport = False
follow_imports = skip

[mypy-interp,interp.*]
follow_imports = silent
"""


@pytest.mark.heavy
def test_mypy_sees_each_public_name_as_what_it_is(tmp_path: Path) -> None:
    """mypy on a user's file: `interp.Run` is the class (assigning it to an int is an error), no public name is Any,
    and a name left out of a subpackage's `__all__` is an explicit re-export. Third-party packages are skipped (Any):
    the toolkit's own modules are what is checked, in seconds, where following torch costs minutes."""
    from mypy import api

    import interp

    lines = ["import interp", "from interp.analyses.leakage import DEFAULT_TOL, audit", "from interp.run import Run",
             "", "cls: type[Run] = interp.Run", "wrong: int = interp.Run", "tol: float = DEFAULT_TOL"]
    lines += [f"reveal_type(interp.{name})" for name in interp.__all__]
    user = tmp_path / "user.py"
    user.write_text("\n".join(lines) + "\n")
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG.format(root=ROOT))
    out, err, status = api.run(["--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"),
                                "--no-error-summary", str(user)])
    assert err == "", err
    rows = out.splitlines()
    errors = [row for row in rows if ": error:" in row]
    assert len(errors) == 1 and 'user.py:6: error: Incompatible types in assignment (expression has type "type[Run]"' \
        in errors[0], out
    revealed = [row.split('Revealed type is "', 1)[1] for row in rows if "Revealed type is" in row]
    assert len(revealed) == len(interp.__all__), out
    assert [name for name, kind in zip(interp.__all__, revealed) if kind.startswith("Any")] == list(ANY_IN_THIS_CHECK)
    assert revealed[interp.__all__.index("Run")].endswith("-> interp.run.Run\"")
