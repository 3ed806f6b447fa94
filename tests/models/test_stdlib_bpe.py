"""`python -m interp.models.stdlib_bpe` is refused, naming where the command went (models/stdlib_bpe.py; the command itself:
tests/interp/experiments/test_stdlib_bpe.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_old_command_is_refused_naming_the_new_one():
    result = subprocess.run([sys.executable, "-m", "interp.models.stdlib_bpe", "--help"], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert "moved: run `interp train" in result.stderr and "interp.experiments.stdlib_bpe" in result.stderr


def test_the_old_module_names_the_new_one_and_imports_no_toolkit():
    from interp.models import stdlib_bpe

    with pytest.raises(AttributeError, match="moved to interp.experiments.stdlib_bpe"):
        _ = stdlib_bpe.main
    source = (ROOT / "models" / "stdlib_bpe.py").read_text()
    assert "import interp" not in source and "from interp" not in source
