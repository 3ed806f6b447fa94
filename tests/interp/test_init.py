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
