"""interp.progress: one progress library (rich) for the whole toolkit; stages cover everything a caller runs."""
import re
from pathlib import Path

from interp.progress import Bar, Stages, tracked

ROOT = Path(__file__).resolve().parents[2]


def test_no_toolkit_module_imports_tqdm():
    offenders = [str(path.relative_to(ROOT)) for package in ("interp", "models", "analyses", "benchmarks")
                 for path in (ROOT / package).rglob("*.py")
                 if re.search(r"^\s*(from|import) tqdm", path.read_text(), flags=re.M)]
    assert offenders == []


def test_stages_time_each_stage_and_can_be_extended_while_open():
    stages = Stages(["a", "b"], enabled=False)
    with stages:
        assert stages.run("a", lambda: 1) == 1
        with stages.extend(["b", "c"]) as inner:  # re-entrant: an inner block keeps the same stages
            assert inner is stages
            inner.run("b", lambda: None)
        stages.run("c", lambda: None)
    assert stages.names == ["a", "b", "c"] and list(stages.timings) == ["a", "b", "c"]
    assert all(t >= 0 for t in stages.timings.values())


def test_enabled_bar_draws_on_stderr_and_counts(capsys):
    with Bar(3, "work", enabled=True, unit="steps") as bar:
        for _ in tracked(range(2), 2, "inner", enabled=False):
            bar.advance(note="x")
        bar.grow(1)
        bar.advance()
    assert bar.completed == 3 and bar.total == 4
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout stays free for JSON


def test_disabled_stages_print_nothing(capsys):
    with Stages(["only"], enabled=False) as stages:
        stages.run("only", lambda: None)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
