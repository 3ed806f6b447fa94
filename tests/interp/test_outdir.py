"""interp.outdir: output folders with a manifest. No command deletes a file it did not write (issue 11 #1)."""
import json
import os

import pytest

from interp import outdir
from interp.errors import BadInput


def render_files(files: dict[str, str]):
    def render(folder):
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
        return sorted(files)
    return render


def test_first_write_records_a_manifest_of_exactly_what_was_written(tmp_path):
    out = tmp_path / "rep"
    assert outdir.write(out, render_files({"a.csv": "1", "plots/x.png": "2"})) == ["a.csv", "plots/x.png"]
    manifest = json.loads((out / outdir.MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["a.csv", "plots/x.png"]
    assert list(outdir.written(out)) == ["a.csv", "plots/x.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no temporary folder left


def test_force_replaces_our_files_and_removes_those_not_written_again(tmp_path):
    out = tmp_path / "rep"
    outdir.write(out, render_files({"a.csv": "1", "plots/x.png": "2"}))
    outdir.write(out, render_files({"a.csv": "new"}), force=True)
    assert (out / "a.csv").read_text() == "new"
    assert not (out / "plots").exists()  # the emptied folder of ours goes too
    assert sorted(os.listdir(out)) == [outdir.MANIFEST, "a.csv"]


def test_force_refuses_and_names_user_files_and_deletes_nothing(tmp_path):
    out = tmp_path / "rep"
    outdir.write(out, render_files({"a.csv": "1"}))
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "data.csv").write_text("mine too")
    with pytest.raises(outdir.OutputDirError, match=r"notes\.txt, sub/data\.csv.*never deletes yours") as info:
        outdir.write(out, render_files({"a.csv": "2"}), force=True)
    assert isinstance(info.value, BadInput)
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.csv").read_text() == "mine too"
    assert (out / "a.csv").read_text() == "1"


def test_a_file_of_ours_edited_by_the_user_is_theirs_now(tmp_path):
    out = tmp_path / "rep"
    outdir.write(out, render_files({"a.csv": "1"}))
    (out / "a.csv").write_text("my edits")
    with pytest.raises(outdir.OutputDirError, match="a.csv"):
        outdir.write(out, render_files({"a.csv": "2"}), force=True)
    assert (out / "a.csv").read_text() == "my edits"


def test_without_force_a_non_empty_folder_is_refused(tmp_path):
    out = tmp_path / "rep"
    outdir.write(out, render_files({"a.csv": "1"}))
    with pytest.raises(outdir.OutputDirError, match="not empty; pass --force"):
        outdir.write(out, render_files({"a.csv": "2"}))


def test_a_folder_without_manifest_is_all_foreign(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert outdir.foreign_files(out) == ["notes.txt"]
    assert not outdir.is_replaceable(out)
    with pytest.raises(outdir.OutputDirError, match="notes.txt"):
        outdir.check(out, force=True)


def test_symlinked_out_is_written_through_without_leftovers(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    outdir.write(link, render_files({"a.csv": "1"}))
    outdir.write(link, render_files({"a.csv": "2"}), force=True)
    assert link.is_symlink() and (real / "a.csv").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no .link.old-PID, no temp folder


def test_a_failed_render_leaves_the_folder_as_it_was(tmp_path):
    out = tmp_path / "rep"
    outdir.write(out, render_files({"a.csv": "1"}))

    def broken(folder):
        (folder / "a.csv").write_text("partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        outdir.write(out, broken, force=True)
    assert (out / "a.csv").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_a_legacy_report_folder_is_all_foreign(tmp_path):
    """Before manifests nothing recorded what a report wrote: its files cannot be told from edits (issue 24 #2)."""
    out = tmp_path / "old"
    (out / "plots").mkdir(parents=True)
    (out / outdir.LEGACY_MARKER).write_text("written by interp.analyses.report")
    (out / "report.json").write_text(json.dumps({"files": ["heads.csv", "plots/L0H0.png"]}))
    (out / "heads.csv").write_text("x")
    (out / "plots" / "L0H0.png").write_text("png")
    assert outdir.foreign_files(out) == [outdir.LEGACY_MARKER, "heads.csv", "plots/L0H0.png", "report.json"]
    with pytest.raises(outdir.OutputDirError, match="written before manifests"):
        outdir.check(out, force=True)
