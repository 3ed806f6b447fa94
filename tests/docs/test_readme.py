"""The README's tour runs as written, and its promises hold."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_starts_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_FD11_the_readme_says_where_make_demo_puts_the_command():
    """`interp` is not on PATH after `make demo`: the README says to run `.venv/bin/interp` or activate `.venv`."""
    text = " ".join(README.read_text().split())
    assert "run it as `.venv/bin/interp`, or activate" in text


@pytest.mark.heavy
def test_readme_python_tour_runs_and_claims_hold():
    source = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(source, str(README), "exec"), namespace)  # noqa: S102 - our own README
    model, prompts = namespace["model"], namespace["prompts"]
    table = namespace["test_claims"](model, [namespace["claims"].induction_head(1, 2),
                                             namespace["claims"].previous_token_head(0, 2)], prompts)
    assert table.verdict.tolist() == ["supported", "supported"]
    assert namespace["leakage"].audit(model).causal
    effect = namespace["effect"]  # the tour's Run.effect: the induction head matters, and the CI says how surely
    assert effect.ci_low > 0.5 and effect.n_prompts == len(prompts) == len(effect.values)
    assert effect.behaviour == "next-token loss on the repeated copies"


def test_readme_layout_names_every_module_and_folder():
    """The Layout section lists each .py file of models/, interp/ and analyses/, and each folder beside them."""
    root = README.parent
    layout = re.search(r"## Layout\n\n```\n(.*?)```", README.read_text(), re.S).group(1)
    words = set(re.findall(r"[\w.]+/?", layout))
    missing = []
    for package in ("models", "interp", "analyses"):
        for path in sorted((root / package).rglob("*.py")):
            if path.name != "__init__.py" and path.name not in words:
                missing.append(str(path.relative_to(root)))
        for folder in sorted(p for p in (root / package).iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
            if f"{folder.name}/" not in words:
                missing.append(str(folder.relative_to(root)) + "/")
    assert not missing, f"README's Layout section does not list {missing}"
