"""The leakage-CI tutorial tells the truth (issue 39): its verdict table is the enum's values, and its GitHub
Actions example runs: each `run:` step in a fresh folder with a sample `mygpt.py` (the install step replaced by
this environment), and every file a later `with:` step names exists afterwards, for a clean model (exit 0), a
leaking one (exit 1) and one whose factory raises (exit 2)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from interp.analyses.leakage import VERDICTS

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorials" / "leakage-ci.md"

MYGPT = '''
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d=16, T=16, leaky=False):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.tril(torch.ones(T, T), diagonal=1 if leaky else 0))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        att = (q @ k.transpose(-2, -1)) / C ** 0.5
        att = att.masked_fill(self.bias[:T, :T] == 0, float("-inf"))
        return x + F.softmax(att, dim=-1) @ v


class GPT(nn.Module):
    def __init__(self, leaky=False):
        super().__init__()
        self.block_size = 16
        self.wte, self.wpe = nn.Embedding(32, 16), nn.Embedding(16, 16)
        self.block = Block(leaky=leaky)
        self.head = nn.Linear(16, 32)

    def forward(self, idx):
        return self.head(self.block(self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))))


def build():
    torch.manual_seed(0)
    return GPT(leaky=LEAKY).eval()
'''
CASES = {"clean": (MYGPT.replace("LEAKY", "False"), 0), "leaking": (MYGPT.replace("LEAKY", "True"), 1),
         "raising": (MYGPT.replace("    torch.manual_seed(0)\n    return GPT(leaky=LEAKY).eval()",
                                   "    raise RuntimeError('the checkpoint is missing')"), 2)}


def _section(heading: str) -> str:
    text = TUTORIAL.read_text()
    start = text.index(heading)
    end = text.find("\n### ", start + len(heading))
    return text[start:end if end != -1 else None]


def test_the_verdict_table_lists_the_enum():
    table = [line for line in _section("### The verdict").splitlines() if line.startswith("|")]
    rows = table[2:]  # after the header and its rule
    documented = {re.match(r"\| `([a-z_]+)`", row).group(1) for row in rows}
    assert documented == set(VERDICTS)
    assert "`\"causal\"`" not in TUTORIAL.read_text() and "verdict == \"causal\"" not in TUTORIAL.read_text()


def _workflow() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    blocks = re.findall(r"```yaml\n(.*?)```", _section("### In GitHub Actions"), flags=re.S)
    (block,) = [b for b in blocks if "audit-leakage" in b]
    return yaml.safe_load(block)["steps"]


def _named_files(step: dict) -> list[str]:
    given = step.get("with") or {}
    return [str(given[key]) for key in ("sarif_file", "path") if key in given]


@pytest.mark.heavy
@pytest.mark.parametrize("case", list(CASES))
def test_the_github_actions_example_runs(case, tmp_path):
    source, expected = CASES[case]
    (tmp_path / "mygpt.py").write_text(source)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # this checkout's interp; mygpt comes from the folder
    code, ran = None, 0
    for step in _workflow():
        if "run" in step:
            if "pip install" in step["run"]:
                continue  # the install step: this test's environment has the toolkit
            done = subprocess.run(step["run"], shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)
            code, ran = done.returncode, ran + 1
            continue
        for name in _named_files(step):
            assert (tmp_path / name).is_file(), f"{case}: {name} is missing after exit {code}: {done.stderr[-600:]}"
    assert ran == 1 and code == expected, done.stderr[-1500:]
