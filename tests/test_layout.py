"""The tests mirror the package: the test of `interp/run.py` is `tests/interp/test_run.py`, of
`analyses/leakage/ci.py` `tests/analyses/leakage/test_ci.py`, of `models/gpt.py` `tests/models/test_gpt.py`.
A test file under `tests/interp/`, `tests/analyses/` or `tests/models/` is named after a module of the mirrored
folder (`test_NAME.py` or `test_NAME_ASPECT.py`, NAME a module or subpackage there; `test_init.py` for the package
itself; a subpackage's own name for tests of it as a whole), or is listed below with its reason."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
MIRRORED = ("interp", "analyses", "models")  # tests/interp/cli/ mirrors interp/cli/, tests/analyses/ analyses/ ...

# test files that check one concern across several modules, with why they are not named after one
CROSS_CUTTING = {
    "analyses/test_devices.py": "device= and dtype= of every analysis outside redundancy",
    "models/test_lesson.py": "the seed lesson's worked examples, through models and hooks together",
    "models/test_tl_compat.py": "TransformerLens's own tools on every kind of model we build or convert",
}


def _source_folder(test_folder: Path) -> Path:
    """tests/interp/cli -> interp/cli; tests/analyses/leakage -> analyses/leakage."""
    return ROOT / test_folder.relative_to(TESTS)


def _names(folder: Path) -> set[str]:
    """The module and subpackage names of a source folder, and its own name (the package as a whole)."""
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return names | {folder.name, "init"}


def _named_after_a_module(test: Path) -> bool:
    folder = _source_folder(test.parent)
    if not folder.is_dir():
        return False
    stem = test.stem.removeprefix("test_")
    return any(stem == name or stem.startswith(name + "_") for name in _names(folder))


def test_every_mirrored_test_file_is_named_after_a_module():
    tests = [p for top in MIRRORED for p in (TESTS / top).rglob("test_*.py")]
    assert len(tests) > 50
    strays = [str(p.relative_to(TESTS)) for p in tests
              if str(p.relative_to(TESTS)) not in CROSS_CUTTING and not _named_after_a_module(p)]
    assert strays == [], "name these after the module they test, or list them in CROSS_CUTTING with a reason"


def test_the_cross_cutting_list_names_files_that_exist():
    assert [name for name in CROSS_CUTTING if not (TESTS / name).is_file()] == []


def test_no_flat_test_modules_remain_beside_the_layout():
    flat = sorted(p.name for p in TESTS.glob("test_*.py") if p.name != "test_layout.py")
    assert flat == [], "move them under tests/interp/, tests/analyses/, tests/models/ or tests/reliability/"
