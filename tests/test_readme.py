"""The README's tour runs as written, and its promises hold."""
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_starts_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_readme_python_tour_runs_and_claims_hold():
    source = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(source, str(README), "exec"), namespace)  # noqa: S102 - our own README
    model, prompts = namespace["model"], namespace["prompts"]
    table = namespace["test_claims"](model, [namespace["head_claims"].induction_head(1, 2),
                                             namespace["head_claims"].previous_token_head(0, 2)], prompts)
    assert table.verdict.tolist() == ["supported", "supported"]
    assert namespace["leakage"].audit(model).causal
