"""Issue 24, files: no path outside the output folder is ever touched, no file the toolkit did
not write is ever deleted, every file is written to a temporary file and renamed, and an
unwritable --out is refused before any computation.

Items 1, 2, 3 and 17 (read-only --out) of the issue; each test failed on main before the fix.
The table at the end (`CASES`) lists every sub-case with its error class and exit code.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from interp import cli, outdir
from interp.errors import BadInput, exit_code_for

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "COLUMNS": "160"}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render_files(files: dict[str, str]):
    def render(folder):
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    return render


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (symlinks as their target) -> its content: to show nothing changed."""
    found = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[key] = "-> " + os.readlink(path)
        elif path.is_file():
            found[key] = path.read_text()
    return found


def add_to_manifest(out: Path, entries: dict) -> None:
    manifest = json.loads((out / outdir.MANIFEST).read_text())
    manifest["files"].update(entries)
    (out / outdir.MANIFEST).write_text(json.dumps(manifest))


# ------------------------------------------------------------------ 1. manifest entries outside the folder

def crafted(kind: str, tmp: Path) -> tuple[Path, dict, str]:
    """A report folder `tmp/rep` whose manifest lists a victim outside it; (out, entries, expected message)."""
    out = tmp / "rep"
    outdir.write(out, render_files({"a.csv": "1"}))
    victim = tmp / "victim.txt"
    victim.write_text("the user's file beside the report")
    digest = {"size": victim.stat().st_size, "sha256": sha(victim)}
    if kind == "parent":
        return out, {"../victim.txt": digest}, r"'\.\./victim\.txt', a path outside"
    if kind == "absolute":
        return out, {str(victim): digest}, "a path outside"
    if kind == "dotdot inside":
        return out, {"sub/../../victim.txt": digest}, "a path outside"
    if kind == "dot":
        return out, {"./../victim.txt": digest}, "a path outside"
    if kind == "symlinked folder":
        (out / "link").symlink_to(tmp)  # a received folder may carry a link to anywhere
        return out, {"link/victim.txt": digest}, r"holds files no previous report wrote.*link"
    if kind == "not an object":
        return out, {"a.csv": "sha of nothing"}, r"holds files no previous report wrote.*a\.csv"
    raise AssertionError(kind)


MANIFEST_KINDS = ["parent", "absolute", "dotdot inside", "dot", "symlinked folder", "not an object"]


@pytest.mark.parametrize("kind", MANIFEST_KINDS)
def test_a_crafted_manifest_entry_deletes_nothing_outside(kind, tmp_path):
    out, entries, message = crafted(kind, tmp_path)
    add_to_manifest(out, entries)
    before = snapshot(tmp_path)
    with pytest.raises(outdir.OutputDirError, match=message) as info:
        outdir.check_out_dir(out, force=True)  # refused up front, before any computation
    assert exit_code_for(info.value) == 2
    with pytest.raises(outdir.OutputDirError, match=message):
        outdir.write(out, render_files({"b.csv": "2"}), force=True)
    assert snapshot(tmp_path) == before
    assert not outdir.is_replaceable(out)


def test_a_manifest_that_is_a_symlink_is_neither_read_nor_written_through(tmp_path):
    out = tmp_path / "rep"
    outdir.write(out, render_files({"a.csv": "1"}))
    victim = tmp_path / "victim.json"
    victim.write_text((out / outdir.MANIFEST).read_text())  # a manifest of ours, outside: the link looks genuine
    (out / outdir.MANIFEST).unlink()
    (out / outdir.MANIFEST).symlink_to(victim)
    before = snapshot(tmp_path)
    with pytest.raises(outdir.OutputDirError, match=r"holds files no previous report wrote.*\.interp-manifest\.json"):
        outdir.write(out, render_files({"a.csv": "2"}), force=True)
    assert snapshot(tmp_path) == before


def test_cli_report_force_on_a_crafted_manifest_is_refused_before_computing(tmp_path, capsys):
    out, entries, _ = crafted("parent", tmp_path)
    add_to_manifest(out, entries)
    before = snapshot(tmp_path)
    assert cli.main(["report", "--out", str(out), "--force", "--quiet", "--n", "4"]) == 2
    err = capsys.readouterr().err
    assert "'../victim.txt', a path outside" in err and "Nothing was deleted" in err
    assert snapshot(tmp_path) == before


def test_the_manifest_message_names_the_fix(tmp_path):
    out, entries, _ = crafted("parent", tmp_path)
    add_to_manifest(out, entries)
    with pytest.raises(outdir.OutputDirError, match=r"delete .*\.interp-manifest\.json .*or choose another --out"):
        outdir.check_out_dir(out, force=True)


# ------------------------------------------------------------------ 1b. every write and delete confined at commit time

def swap_for_link(out: Path, folder: str, outside: Path) -> None:
    """What the user (or an attacker) may do while a report computes: a folder of ours becomes a link."""
    for path in (out / folder).iterdir():
        path.unlink()
    (out / folder).rmdir()
    (out / folder).symlink_to(outside)


def test_a_folder_swapped_for_a_symlink_after_the_check_is_not_written_through(tmp_path):
    out, outside = tmp_path / "rep", tmp_path / "elsewhere"
    outside.mkdir()
    outdir.write(out, render_files({"plots/x.png": "1"}))

    def render_then_swap(folder):
        render_files({"plots/x.png": "2", "plots/y.png": "3"})(folder)
        swap_for_link(out, "plots", outside)

    with pytest.raises(outdir.OutputDirError, match=r"holds files no previous report wrote.*: plots\."):
        outdir.write(out, render_then_swap, force=True)  # the commit checks the folder again
    assert list(outside.iterdir()) == []


def test_commit_confines_every_destination_even_past_the_foreign_check(tmp_path, monkeypatch):
    out, outside = tmp_path / "rep", tmp_path / "elsewhere"
    outside.mkdir()
    outdir.write(out, render_files({"plots/x.png": "1"}))
    swap_for_link(out, "plots", outside)
    monkeypatch.setattr(outdir, "foreign_files", lambda folder: [])  # the second line of defence alone
    with pytest.raises(outdir.OutputDirError, match=r"'plots/x\.png' is a path outside"):
        outdir.write(out, render_files({"a.csv": "2", "plots/x.png": "2"}), force=True)
    assert list(outside.iterdir()) == [] and not (out / "a.csv").exists()  # refused before anything moved


def test_a_file_of_ours_is_not_deleted_through_a_symlinked_folder(tmp_path):
    out, outside = tmp_path / "rep", tmp_path / "elsewhere"
    outdir.write(out, render_files({"old/x.png": "1", "a.csv": "1"}))
    outside.mkdir()

    def render_then_swap(folder):
        render_files({"a.csv": "2"})(folder)
        swap_for_link(out, "old", outside)
        (outside / "x.png").write_text("1")  # same content as ours: only the path tells them apart

    with pytest.raises(outdir.OutputDirError, match=r"holds files no previous report wrote.*: old\."):
        outdir.write(out, render_then_swap, force=True)
    assert (outside / "x.png").read_text() == "1" and (out / "a.csv").read_text() == "1"


def test_confined_refuses_every_path_outside(tmp_path):
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "link").symlink_to(tmp_path)
    (tmp_path / "rep" / "alias").symlink_to(tmp_path / "x")
    for name in ["../x", "/etc/passwd", "a/../../x", "link/x", "", ".", "a//b", "alias"]:
        with pytest.raises(outdir.OutputDirError, match="outside"):
            outdir.confined(tmp_path / "rep", name)
    assert outdir.confined(tmp_path / "rep", "plots/x.png") == (tmp_path / "rep" / "plots" / "x.png").resolve()


# ------------------------------------------------------------------ 2. old-style report folders

def legacy(tmp: Path) -> Path:
    """A report folder written before manifests, then used: an edited summary, a user file it lists."""
    out = tmp / "old"
    (out / "plots").mkdir(parents=True)
    (out / outdir.LEGACY_MARKER).write_text("written by interp.analyses.report")
    listed = ["heads.csv", "summary.md", "plots/L0H0.png", "notes.txt", "../outside.txt"]
    (out / "report.json").write_text(json.dumps({"files": listed}))
    (out / "heads.csv").write_text("x")
    (out / "summary.md").write_text("# my edits to the summary")
    (out / "plots" / "L0H0.png").write_text("png")
    (out / "notes.txt").write_text("mine")
    (tmp / "outside.txt").write_text("not even in the folder")
    return out


def test_force_on_an_old_style_report_loses_nothing(tmp_path):
    out = legacy(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(outdir.OutputDirError, match=r"written before manifests.*cannot be told from your edits") as info:
        outdir.write(out, render_files({"heads.csv": "new", "summary.md": "new"}), force=True)
    assert exit_code_for(info.value) == 2
    assert snapshot(tmp_path) == before


def test_cli_report_force_on_an_old_style_report_is_refused(tmp_path, capsys):
    out = legacy(tmp_path)
    before = snapshot(tmp_path)
    assert cli.main(["report", "--out", str(out), "--force", "--quiet", "--n", "4"]) == 2
    assert "written before manifests" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_an_old_style_report_counts_as_foreign(tmp_path):
    out = legacy(tmp_path)
    assert "summary.md" in outdir.foreign_files(out) and "heads.csv" in outdir.foreign_files(out)
    assert not outdir.is_replaceable(out)


# ------------------------------------------------------------------ 3. every file written to a temporary file and renamed

FULL_DISK = textwrap.dedent(r"""
    import json, os, resource, signal, sys
    from pathlib import Path

    folder = Path(sys.argv[1])
    from interp import cli, outdir
    import interp
    from interp.models import GPTConfig, HookedGPT
    from interp.experiments import train

    tiny = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=40, n_ctx=16, seed=0))
    toy = json.loads(Path("models/checkpoints/toy-induction.json").read_text())["metadata"]
    text = json.loads(Path("models/checkpoints/stdlib-bytes.json").read_text())["metadata"]
    EARLIER = "the earlier file, intact\n"

    def json_file(path):
        return cli.main(["verify", "--quiet", "--json", str(path)])

    def report(path):
        outdir.write(path, lambda tmp: (tmp / "big.csv").write_text("x" * 100_000), force=True)

    CASES = {
        "--json FILE": ("out.json", json_file),
        "interp.save weights": ("m.safetensors", lambda p: interp.save(tiny, p.with_suffix(""))),
        "checkpoint card (toy)": ("toy.md", lambda p: train.write_toy_card(p, toy)),
        "checkpoint card (text)": ("text.md", lambda p: train.write_text_card(p, text)),
        "report folder": ("rep", report),
    }
    for name, (file, _) in CASES.items():
        path = folder / name.replace(" ", "_") / file
        path.parent.mkdir()
        if file == "rep":
            outdir.write(path, lambda tmp: (tmp / "a.csv").write_text(EARLIER))
        else:
            path.write_text(EARLIER)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    results = {}
    for name, (file, call) in CASES.items():
        path = folder / name.replace(" ", "_") / file
        try:
            outcome = call(path)
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}"
        results[name] = {"outcome": outcome, "files": sorted(p.name for p in path.parent.iterdir())}
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    """Each writer run once on a 'full disk' (RLIMIT_FSIZE 1000 bytes, SIGXFSZ ignored), unprivileged."""
    folder = tmp_path_factory.mktemp("full")
    result = subprocess.run([sys.executable, "-c", FULL_DISK, str(folder)], capture_output=True, text=True, cwd=ROOT,
                            env=ENV, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


WRITERS = {"--json FILE": "out.json", "interp.save weights": "m.safetensors", "checkpoint card (toy)": "toy.md",
           "checkpoint card (text)": "text.md"}


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_full_disk_keeps_the_earlier_file_and_leaves_no_temp_file(name, full_disk):
    folder, results, stderr = full_disk
    path = folder / name.replace(" ", "_") / WRITERS[name]
    assert path.read_text() == "the earlier file, intact\n", f"{name}: {results[name]}"
    assert results[name]["files"] == [WRITERS[name]], f"{name} left {results[name]['files']}"
    if name == "--json FILE":
        assert results[name]["outcome"] == 2 and f"cannot write JSON to {path}: File too large" in stderr
    else:
        assert "File too large" in str(results[name]["outcome"])


@pytest.mark.heavy
def test_a_full_disk_keeps_the_earlier_report(full_disk):
    folder, results, _ = full_disk
    path = folder / "report_folder" / "rep"
    assert (path / "a.csv").read_text() == "the earlier file, intact\n"
    assert results["report folder"]["files"] == ["rep"]  # no temporary folder beside it
    assert sorted(os.listdir(path)) == [outdir.MANIFEST, "a.csv"]


def test_write_atomic_keeps_the_link_and_the_mode(tmp_path):
    from interp.models.files import write_atomic

    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    write_atomic(tmp_path / "fresh.txt", b"bytes")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "fresh.txt").stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_write_atomic_cleans_up_when_the_writer_raises(tmp_path):
    from interp.models.files import write_atomic

    (tmp_path / "f.png").write_text("earlier")

    def broken(tmp):
        Path(tmp).write_text("half")
        raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError, match="renderer failed"):
        write_atomic(tmp_path / "f.png", broken)
    assert sorted(os.listdir(tmp_path)) == ["f.png"] and (tmp_path / "f.png").read_text() == "earlier"


# a write or delete outside the helpers: the guard names the call, so a new one fails here
ANY_OBJECT = {"write_text", "write_bytes", "savefig", "save_file", "to_parquet", "unlink", "rmdir", "rmtree", "touch",
              "symlink_to", "hardlink_to", "mkstemp"}
MODULE_CALLS = {"os": {"remove", "unlink", "rename", "replace", "rmdir", "removedirs", "symlink", "link", "truncate"},
                "shutil": {"rmtree", "move", "copy", "copy2", "copyfile", "copytree"}, "torch": {"save"},
                "json": {"dump"}, "pickle": {"dump"}, "np": {"save", "savez", "savetxt"}}
TO_FILE = {"to_csv", "to_json", "to_html", "to_markdown", "to_excel", "to_pickle"}  # with a target: a write
PATH_MOVES = {"rename", "replace"}  # Path.rename(target): one argument, no keyword (not str.replace, DataFrame.rename)
HELPERS = {"models/files.py", "interp/outdir.py"}  # the one atomic writer, and output folders (confined)
# modules that run outside the toolkit's environment, so cannot import its helpers
STANDALONE = {"models/convert/tracr_compile.py": "runs in a Tracr (jax) environment where interp is not installed"}
WRITE_HELPERS = {"write_atomic", "write_output"}  # interp.outdir.write_output: files the user names (devices, pipes)


def _is_write(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        if func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+") and \
                "devnull" not in ast.unparse(node.args[0])
        return func.id in {"save_file", "mkstemp"}
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if owner in MODULE_CALLS:
        return func.attr in MODULE_CALLS[owner]
    if func.attr in TO_FILE:
        return bool(node.args) or any(k.arg == "path_or_buf" for k in node.keywords)
    if func.attr in PATH_MOVES:
        return len(node.args) == 1 and not node.keywords
    return func.attr in ANY_OBJECT


def _writes_outside_helpers(path: Path, source: str) -> list[str]:
    tree = ast.parse(source)
    inside_helper = set()  # calls in a lambda handed to write_atomic / write_output: they write the helper's temporary file
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in WRITE_HELPERS:
            for arg in node.args[1:]:
                inside_helper |= {id(n) for n in ast.walk(arg)}
    return [f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)[:80]}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and id(node) not in inside_helper and _is_write(node)]


def test_every_write_and_delete_goes_through_the_helpers():
    found = []
    for package in ("interp", "models", "analyses"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() not in HELPERS | STANDALONE.keys():
                found += _writes_outside_helpers(path, path.read_text())
    assert found == [], ("write through interp.models.files.write_atomic (interp.outdir.write_output for a file the user "
                         "names, interp.outdir for folders):\n" + "\n".join(found))


def test_the_guard_sees_a_raw_write():
    bad = ["Path('x').write_text('y')", "open('z', 'w')", "os.remove('q')", "frame.to_csv(folder / 'a.csv')",
           "fig.savefig(path)", "torch.save(model, 'm.pt')", "json.dump(d, handle)", "path.rename(other)",
           "shutil.rmtree(folder)", "(out / name).unlink(missing_ok=True)", "save_file(tensors, 'w.safetensors')"]
    for line in bad:
        assert len(_writes_outside_helpers(ROOT / "interp" / "x.py", line)) == 1, line
    good = ["write_atomic(p, lambda tmp: fig.savefig(tmp))", "write_output(p, lambda tmp: fig.savefig(tmp), what='PNG')", "text = frame.to_csv(index=False)", "'a'.replace('a', 'b')",
            "frame.rename(columns={'a': 'b'})", "handle.remove()", "open(path)", "open(os.devnull, 'w')",
            "dataclasses.replace(x, a=1)", "json.dumps(d)"]
    for line in good:
        assert _writes_outside_helpers(ROOT / "interp" / "x.py", line) == [], line


# ------------------------------------------------------------------ 17 (part). an unwritable --out, refused up front

UNWRITABLE = textwrap.dedent(r"""
    import json, os, sys
    from pathlib import Path
    from interp import outdir

    base = Path(sys.argv[1])
    results = {}
    for name in ["empty", "report"]:
        try:
            outdir.check_out_dir(base / name, force=True)
            results[name] = "accepted"
        except Exception as error:
            results[name] = f"{type(error).__name__}: {error}"
    print(json.dumps(results))
""")


def _as_unprivileged() -> dict:
    """subprocess arguments that make a read-only folder unwritable even to root.

    Root writes anywhere through CAP_DAC_OVERRIDE; the child drops it from its bounding set
    (prctl PR_CAPBSET_DROP), so after exec it has the permissions its mode bits say.
    """
    if os.geteuid() != 0:
        return {}
    if not sys.platform.startswith("linux"):
        pytest.skip("root off Linux: no way here to make a folder unwritable to root")

    def drop_dac_override():
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE)")

    return {"preexec_fn": drop_dac_override}


def run_unprivileged(args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120,
                              **_as_unprivileged())
    except subprocess.SubprocessError as error:  # prctl refused (no CAP_SETPCAP): cannot drop root's override here
        pytest.skip(f"cannot run unprivileged here: {error}")


@pytest.fixture
def unwritable(tmp_path):
    """An empty read-only folder, and a report whose plots/ is read-only."""
    (tmp_path / "empty").mkdir(mode=0o555)
    outdir.write(tmp_path / "report", render_files({"a.csv": "1", "plots/x.png": "2"}))
    (tmp_path / "report" / "plots").chmod(0o555)
    yield tmp_path
    for folder in (tmp_path / "empty", tmp_path / "report" / "plots"):
        folder.chmod(0o755)  # so that pytest can remove them


def test_an_unwritable_out_is_refused_by_the_check(unwritable):
    result = run_unprivileged(["-c", UNWRITABLE, str(unwritable)])
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["empty"].startswith("OutputDirError: ") and f"{unwritable / 'empty'} is not writable" in results["empty"]
    assert f"{unwritable / 'report' / 'plots'} is not writable" in results["report"]


@pytest.mark.heavy
def test_cli_report_refuses_an_unwritable_out_before_loading_the_model(unwritable):
    # the spec cannot load: were the folder checked after loading or computing, this error would be about the spec
    result = run_unprivileged(["-m", "interp.cli", "report", "nosuchpkg_interp.module:factory", "--out",
                               str(unwritable / "empty"), "--quiet"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{unwritable / 'empty'} is not writable" in result.stderr and "nosuchpkg" not in result.stderr


# ------------------------------------------------------------------ the table: every sub-case, its class and exit code

CASES = [  # (item, sub-case, test that covers it, error class, exit code)
    *[("1", f"manifest entry: {kind}", "test_a_crafted_manifest_entry_deletes_nothing_outside", "OutputDirError", 2)
      for kind in MANIFEST_KINDS],
    ("1", "manifest is a symlink to a file outside", "test_a_manifest_that_is_a_symlink_is_neither_read_nor_written_through",
     "OutputDirError", 2),
    ("1", "interp report --force, crafted manifest", "test_cli_report_force_on_a_crafted_manifest_is_refused_before_computing",
     "OutputDirError", 2),
    ("1", "folder swapped for a link while computing (write)", "test_a_folder_swapped_for_a_symlink_after_the_check_is_not_written_through",
     "OutputDirError", 2),
    ("1", "destination through a link, foreign check bypassed", "test_commit_confines_every_destination_even_past_the_foreign_check",
     "OutputDirError", 2),
    ("1", "folder swapped for a link while computing (delete)", "test_a_file_of_ours_is_not_deleted_through_a_symlinked_folder",
     "OutputDirError", 2),
    ("2", "old-style folder: edited summary, listed user file, listed outside file",
     "test_force_on_an_old_style_report_loses_nothing", "OutputDirError", 2),
    ("2", "interp report --force, old-style folder", "test_cli_report_force_on_an_old_style_report_is_refused", "OutputDirError", 2),
    *[("3", f"full disk: {name}", "test_a_full_disk_keeps_the_earlier_file_and_leaves_no_temp_file",
       "BadInput" if name == "--json FILE" else "OSError", 2) for name in WRITERS],
    ("3", "full disk: report folder", "test_a_full_disk_keeps_the_earlier_report", "OSError", 2),
    ("17", "read-only empty --out (API)", "test_an_unwritable_out_is_refused_by_the_check", "OutputDirError", 2),
    ("17", "read-only plots/ in a report (API)", "test_an_unwritable_out_is_refused_by_the_check", "OutputDirError", 2),
    ("17", "interp report --out read-only", "test_cli_report_refuses_an_unwritable_out_before_loading_the_model",
     "OutputDirError", 2),
]


def test_the_table_names_real_tests_and_exit_codes():
    names = {name for name in globals() if name.startswith("test_")}
    for _item, case, test, error, code in CASES:
        assert test in names, case
        cls = {"OutputDirError": outdir.OutputDirError, "BadInput": BadInput, "OSError": OSError}[error]
        assert exit_code_for(cls("x")) == code, case
    assert len(CASES) == 21


def test_an_output_onto_the_factorys_own_module_is_refused_from_the_console_script(tmp_path):
    """`interp audit-leakage mygpt:build --json mygpt.py` run where mygpt.py lies: the console script puts its bin/
    first on sys.path, not the working folder the factory is imported from, and the module was overwritten with
    the failure document. It is an input: exit 2, the file untouched."""
    module = tmp_path / "mygpt.py"
    source = "import torch\n\ndef build():\n    return torch.nn.Linear(2, 2)\n"
    module.write_text(source)
    script = Path(sys.executable).with_name("interp")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    done = subprocess.run([str(script), "audit-leakage", "mygpt:build", "--json", "mygpt.py"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "mygpt.py" in done.stderr
    assert module.read_text() == source
