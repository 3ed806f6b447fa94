"""The investigation notebooks run top to bottom, and their key cells say what they should.

Each notebook is executed once (module-scoped) with nbclient on the venv's python3 kernel;
cells are found by their tag (set in notebooks/make_notebooks.py) and their text outputs
checked: the verdict strings, the numbers a reader is told to look at, not just the absence
of errors.
"""
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMINGS: dict[str, float] = {}  # notebook -> seconds, for the curious (pytest --pdb, or print)


def execute(name: str) -> dict[str, str]:
    """Run a notebook; return tag -> the cell's text output (stdout and text/plain results)."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell and traceback, if any cell fails
    TIMINGS[name] = time.perf_counter() - start
    outputs: dict[str, str] = {}
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        texts = []
        for output in cell.get("outputs", []):
            if output.output_type == "stream" and output.name == "stdout":
                texts.append(output.text)
            elif output.output_type in ("execute_result", "display_data") and "text/plain" in output.data:
                texts.append(output.data["text/plain"])
        for tag in cell.metadata.get("tags", []):
            outputs[tag] = "\n".join(texts)
    return outputs


def test_notebooks_are_generated_from_the_script_and_stripped():
    """The committed notebooks are what make_notebooks.py writes (no stale edits, no stored outputs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, cells in [("01_attention_from_the_lesson.ipynb", module.LESSON), ("02_induction_circuit.ipynb", module.INDUCTION),
                        ("03_minilm.ipynb", module.MINILM)]:
        stored = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert [c.source for c in stored.cells] == [c.source for c in cells], f"{name} is stale: rerun make_notebooks.py"
        assert all(not c.get("outputs") for c in stored.cells if c.cell_type == "code"), f"{name} has stored outputs"


@pytest.fixture(scope="module")
def lesson():
    return execute("01_attention_from_the_lesson.ipynb")


def test_lesson_weights_over_values(lesson):
    assert "context of query 0: [3.0, 2.0]" in lesson["weights-over-values"]


def test_lesson_hooks_equal_the_hand_computation(lesson):
    out = lesson["scores-mask-softmax"]
    for line in ("scores match: True", "future entries -inf: True", "weights match: True", "rows sum to one: True",
                 "mixed values match: True"):
        assert line in out
    assert "-inf" in out  # the masked score table is shown


def test_lesson_multihead_weights_and_self_test(lesson):
    out = lesson["multihead"]
    assert "per-head pattern shape: (1, 2, 4, 4)" in out
    assert "hook_pattern equals torch's per-head weights: True" in out
    passed, total = map(int, re.search(r"verify_hooks: (\d+) of (\d+) checks passed", out).groups())
    assert passed == total > 0


def test_lesson_audit_tells_the_correct_from_the_broken_model(lesson):
    table = lesson["audit-side-by-side"]
    rows = [line for line in table.splitlines() if "masked_fill" in line or "mask_after_softmax" in line]
    assert len(rows) == 2
    correct, broken = rows
    assert "True" in correct and "False" not in correct
    assert "False" in broken and "blocks.0" in broken  # the leak is localised to the first block
    assert "leak" in lesson["audit-broken"].lower()


@pytest.fixture(scope="module")
def induction():
    return execute("02_induction_circuit.ipynb")


def _verdict_lines(text: str) -> dict[str, str]:
    """'L0H1 previous_token: supported' lines -> {'L0H1 previous_token': 'supported'} (in order)."""
    return dict(re.findall(r"^(L\d+H\d+ \w+): (supported|refuted|inconclusive)$", text, flags=re.M))


def test_induction_scan_finds_candidates_in_both_layers(induction):
    match = re.search(r"previous-token head: L(\d)H\d+; candidate induction head: L(\d)H\d+", induction["candidates"])
    assert match and match.groups() == ("0", "1")


def test_induction_claims_false_ones_refuted_true_ones_pass_their_observational_tests(induction):
    text = induction["reasons"]
    verdicts = list(_verdict_lines(text).values())
    assert len(verdicts) == 4, text
    # the scan's claims are never refuted, and the metric and both controls hold for them; whether the
    # ablation tests pass depends on the circuit (several induction heads make any one unnecessary)
    assert all(v in ("supported", "inconclusive") for v in verdicts[:2]), text
    passed_lines = re.findall(r"passed: (.*)$", text, flags=re.M)
    for line in passed_lines[:2]:
        assert "observational True, control_shuffled True, control_random_init True" in line, text
    assert verdicts[2:] == ["refuted", "refuted"], text


def test_induction_heads_are_jointly_necessary(induction):
    text = induction["joint"]
    alone = [float(x) for x in re.findall(r"L\dH\d+ \+([\d.]+)", text.splitlines()[0])]
    together = float(re.search(r"together: \+([\d.]+) nats", text).group(1))
    assert alone and together > 1.0 and together > max(alone), text


def test_induction_generalises_to_unseen_repeat_lengths(induction):
    table = induction["generalise"]
    assert table.count("supported") == 2, table


def test_induction_pattern_substitution_recovers_most_of_the_loss(induction):
    text = induction["substitution"]
    clean, ablated, substituted = map(float, re.search(
        r"clean ([\d.]+), L\dH\d+ ablated ([\d.]+), exact previous-token pattern ([\d.]+)", text).groups())
    assert ablated > clean + 0.5  # the previous-token head matters
    recovered = float(re.search(r"recovered by the idealised pattern: (-?[\d.]+)%", text).group(1))
    assert recovered > 50.0  # the checkpoint's card: the exact pattern recovers most of the loss (Olsson et al.: ~99%)
    assert substituted < ablated


@pytest.mark.real
def test_minilm_notebook():
    out = execute("03_minilm.ipynb")
    assert "6 layers x 12 heads, causal=False" in out["load"]
    prev_row = next(line for line in out["positional"].splitlines() if "prev_token" in line)
    assert float(prev_row.split()[3]) > 0.9  # a near-perfect previous-token head (FACTS.md)
    assert re.search(r"(\d+) sink heads", out["sinks"]) and int(re.search(r"(\d+) sink heads", out["sinks"]).group(1)) >= 3
    verdicts = _verdict_lines(out["reasons"])
    assert list(verdicts.values())[0] == "supported"  # the previous-token head
    assert "refuted" in verdicts.values()  # the false claims about the same heads

