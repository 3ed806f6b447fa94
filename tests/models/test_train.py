"""`python -m interp.models.train` is refused, naming where the command went (models/train.py; the command itself:
tests/interp/experiments/test_train.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_old_command_is_refused_naming_the_new_one():
    result = subprocess.run([sys.executable, "-m", "interp.models.train", "--help"], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert "moved: run `interp train" in result.stderr and "interp.experiments.train" in result.stderr


def test_the_old_module_names_the_new_one_and_imports_no_toolkit():
    from interp.models import train

    with pytest.raises(AttributeError, match="moved to interp.experiments.train"):
        _ = train.main
    source = (ROOT / "models" / "train.py").read_text()
    assert "import interp" not in source and "from interp" not in source
