"""Issue 36 (round 4, data loss): every output flag goes through `interp.outdir.write_output` and is checked by
`interp.outdir.check_outputs` before any work. A device, a FIFO or an open descriptor is written in place, never
renamed over; an output that is one of the command's inputs, or another output, or that cannot be written, is
refused with exit 2 before the model loads, so nothing is half written and a leak's exit 1 never turns into 2.

Each test names its finding id (shared/repros/round4/FINDINGS.md). The CLI is called in-process
(`interp.cli.main`) except where fd 1 itself is the point (L16 L18: a child process with its stdout redirected).
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from interp import cli
from interp.cli import common

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "models" / "checkpoints"
AUDIT = ["audit-leakage", "toy-induction", "--max-len", "8", "-q"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod, and writes refused to root, need root (CI containers)")


@pytest.fixture
def no_load(monkeypatch):
    """Loading the model fails the test: the refusals under test must come before any work."""
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the outputs were checked")
    monkeypatch.setattr(common, "_load", load)


def run(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr().err


@needs_root
def test_L13_a_character_device_stays_a_device(tmp_path, capsys):
    node = tmp_path / "mynull"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    code, err = run([*AUDIT, "--junit", str(node), "--json", str(node)], capsys)  # a device takes both
    assert code == 0, err
    assert stat.S_ISCHR(node.stat().st_mode) and sorted(os.listdir(tmp_path)) == ["mynull"]


def test_L14_a_fifo_gets_the_document(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    code, err = run([*AUDIT, "--json", str(fifo)], capsys)
    reader.join(30)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.stat().st_mode) and json.loads(got[0])["command"] == "audit-leakage"


def test_L15_L17_a_pipe_descriptor_gets_the_document(capsys):
    """`--json >(cmd)` is /dev/fd/N: an open pipe, written through its descriptor."""
    read, write = os.pipe()
    try:
        code, err = run([*AUDIT, "--json", f"/dev/fd/{write}"], capsys)
    finally:
        os.close(write)
    with os.fdopen(read) as pipe:
        document = json.loads(pipe.read())
    assert code == 0, err
    assert document["command"] == "audit-leakage"


@pytest.mark.heavy
def test_L16_L18_dev_stdout_keeps_what_the_command_printed(tmp_path):
    """`--json /dev/stdout > out.txt` replaced out.txt: the verdict table was lost. fd 1 is the point: a child process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out.txt"
    with open(out, "w") as stdout:
        done = subprocess.run([sys.executable, "-m", "interp.cli", *AUDIT, "--json", "/dev/stdout"], stdout=stdout,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "Leakage audit" in text and text.count('"command": "audit-leakage"') == 1
    assert text.index("Leakage audit") < text.index('"command"')  # appended after the table, at fd 1's offset
    piped = subprocess.run([sys.executable, "-m", "interp.cli", *AUDIT, "--json", "/dev/stdout"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)  # into a pipe (L17)
    assert piped.returncode == 0 and piped.stdout.count('"command": "audit-leakage"') == 1, piped.stderr


def test_L19_the_models_own_checkpoint_is_refused(tmp_path, capsys, no_load):
    ck = tmp_path / "ck"
    ck.mkdir()
    for suffix in (".safetensors", ".json"):
        shutil.copy(CHECKPOINTS / f"toy-induction{suffix}", ck / f"toy{suffix}")
    before = (ck / "toy.json").read_bytes()
    for target in ("toy.json", "toy.safetensors"):
        code, err = run(["audit-leakage", str(ck / "toy"), "-q", "--json", str(ck / target)], capsys)
        assert code == 2 and f"--json {ck / target} is one of the command's inputs" in err, err
    assert (ck / "toy.json").read_bytes() == before
    code, err = run(["verify", "-q", "--json", str(CHECKPOINTS / "toy-induction.json")], capsys)  # the default model
    assert code == 2 and "one of the command's inputs" in err


def test_W06_a_prompt_file_is_refused(tmp_path, capsys, no_load):
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2, 3, 4], [5, 6, 7, 8]]")
    code, err = run(["circuit", "toy-induction", "--prompts", str(prompts), "-q", "--json", str(prompts)], capsys)
    assert code == 2 and "is one of the command's inputs" in err
    assert prompts.read_text() == "[[1, 2, 3, 4], [5, 6, 7, 8]]"


def test_W08_a_claims_file_is_refused(tmp_path, capsys, no_load):
    claims = tmp_path / "my.claims.toml"
    shutil.copy(ROOT / "examples" / "circuit.claims.toml", claims)
    before = claims.read_text()
    code, err = run(["claims", str(claims), "-q", "--json", str(claims)], capsys)
    assert code == 2 and "is one of the command's inputs" in err
    model_file = tmp_path / "model.claims.toml"  # the checkpoint a claims file names is an input too
    model_file.write_text(f'model = "{tmp_path / "ck"}"\n[claims]\nL1H2 = "induction"\n')
    (tmp_path / "ck.json").write_text("{}")
    code, err = run(["claims", str(model_file), "-q", "--json", str(tmp_path / "ck.json")], capsys)
    assert code == 2 and "is one of the command's inputs" in err
    assert claims.read_text() == before


def test_L02_L22_W07_two_outputs_on_one_file_are_refused(tmp_path, capsys, no_load):
    same = str(tmp_path / "same.out")
    cases = [[*AUDIT, "--sarif", same, "--junit", same], [*AUDIT, "--sarif", same, "--json", same],
             ["circuit", "toy-induction", "-q", "--png", str(tmp_path / "c.png"), "--json", str(tmp_path / "c.png")]]
    for argv in cases:
        code, err = run(argv, capsys)
        assert code == 2 and "are the same file" in err, err
    assert os.listdir(tmp_path) == []


def test_L05_every_output_is_checked_before_the_audit(tmp_path, capsys, no_load):
    (tmp_path / "afile").write_text("a regular file")
    code, err = run([*AUDIT, "--sarif", str(tmp_path / "ok.sarif"), "--junit", str(tmp_path / "afile" / "x.xml"),
                     "--json", str(tmp_path / "ok.json")], capsys)
    assert code == 2 and "afile is a file, not a folder" in err
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_L20_c009_c011_targets_refused_before_loading_with_their_own_names(tmp_path, capsys, no_load):
    (tmp_path / "x.png").mkdir()
    cases = [([*AUDIT, "--json", ""], "--json needs a FILE (or - for stdout)"),
             (["circuit", "toy-induction", "-q", "--png", str(tmp_path / "x.png")], "is a directory"),
             (["circuit", "toy-induction", "-q", "--png", str(tmp_path / "no" / "c.png")], "does not exist")]
    if os.geteuid() == 0:  # root may write anywhere but /proc
        cases.append((["circuit", "toy-induction", "-q", "--png", "/proc/c.png"], "cannot create a file in /proc"))
    for argv, message in cases:
        code, err = run(argv, capsys)
        assert code == 2 and message in err and ".tmp" not in err, err


def test_a_report_json_inside_its_own_out_folder_is_refused(tmp_path, capsys, no_load):
    code, err = run(["report", "--out", str(tmp_path / "rep"), "-q", "--json", str(tmp_path / "rep" / "report.json")],
                    capsys)
    assert code == 2 and "lies inside the output folder --out" in err


def test_other_ranks_write_no_output_of_their_own(tmp_path):
    """--workers N: ranks other than 0 point every output away, so a pipe or a device gets one document."""
    import argparse

    from interp import launch

    seen = {}
    args = argparse.Namespace(json="-", sarif=str(tmp_path / "s"), junit=None, png=str(tmp_path / "c.png"), out=None)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

    def handler(a):
        seen.update(vars(a))
        return 0

    from unittest import mock

    with mock.patch("interp.distributed.init_from_env"), mock.patch("interp.distributed.is_main", return_value=False), \
            mock.patch("interp.distributed.rank", return_value=1), mock.patch("interp.distributed.default_backend",
                                                                              return_value="gloo"):
        launch._run_rank(handler, args)
    assert all(str(tmp_path) not in str(seen[flag]) and seen[flag] != "-" for flag in ("json", "sarif", "png"))
    assert seen["junit"] is None
