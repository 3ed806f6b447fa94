"""interp.outdir: output folders with a manifest. No command deletes a file it did not write (issue 11 #1)."""
import json
import os
import stat
import threading

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
        outdir.check_out_dir(out, force=True)


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
        outdir.check_out_dir(out, force=True)


# --------------------------------------------------------------------------- single output files (issue 36, round 4)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root (as in CI containers)")


@needs_root
def test_a_character_device_is_written_in_place_never_replaced(tmp_path):
    """L13: the atomic writer renamed a temporary file over `mynull` (as root: over /dev/null)."""
    node = tmp_path / "mynull"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private copy of the null device
    assert outdir.write_output(node, "{}\n", what="JSON") == node
    assert stat.S_ISCHR(node.stat().st_mode) and sorted(os.listdir(tmp_path)) == ["mynull"]
    outdir.write_output(node, lambda tmp: tmp.write_bytes(b"\x89PNG"), what="PNG")  # a renderer too
    assert stat.S_ISCHR(node.stat().st_mode)


def test_a_fifo_is_written_into_its_reader(tmp_path):
    """L14: the FIFO became a regular file and its reader got nothing."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    outdir.write_output(fifo, '{"a": 1}\n', what="JSON")
    reader.join(10)
    assert got == [b'{"a": 1}\n'] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_path_naming_an_open_descriptor_writes_through_it_at_its_offset(tmp_path):
    """L15-L18: /dev/stdout, /dev/fd/N and >(cmd) were reopened or renamed over: a redirected file lost what the
    command printed first, a pipe got a false "No such file or directory"."""
    target = tmp_path / "out.txt"
    with open(target, "wb") as handle:
        handle.write(b"the verdict table\n")
        handle.flush()
        fd = handle.fileno()
        assert outdir.stream_fd(f"/dev/fd/{fd}") == fd and outdir.stream_fd(f"/proc/self/fd/{fd}") == fd
        outdir.write_output(f"/dev/fd/{fd}", "{json}\n", what="JSON")
    assert target.read_text() == "the verdict table\n{json}\n"
    read, write = os.pipe()
    outdir.write_output(f"/dev/fd/{write}", "into the pipe", what="JSON")
    os.close(write)
    assert os.read(read, 100) == b"into the pipe"
    os.close(read)
    link = tmp_path / "link"
    link.symlink_to("/dev/stdout")
    assert outdir.stream_fd("/dev/stdout") == 1 and outdir.stream_fd(link) == 1 and outdir.stream_fd(target) is None


def test_write_output_refuses_what_is_no_file_naming_the_path_the_user_gave(tmp_path):
    """c009 v031 v032 v034: a directory, a missing folder, an empty name gave OSErrors about a temporary file."""
    (tmp_path / "adir.html").mkdir()
    cases = {str(tmp_path / "adir.html"): r"cannot write the page to .*adir\.html: it is a directory",
             str(tmp_path / "missing" / "v.html"): r"cannot write the page to .*v\.html: the folder .*missing does not exist",
             "": r"cannot write the page: the file name is empty"}
    for target, message in cases.items():
        with pytest.raises(BadInput, match=message) as info:
            outdir.write_output(target, "<html>", what="the page")
        assert ".tmp" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["adir.html"]


def test_write_output_keeps_the_atomic_write_of_regular_files(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("earlier")
    target.chmod(0o640)
    outdir.write_output(target, "new", what="JSON")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_check_outputs_refuses_each_bad_target_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "alias.json").symlink_to(tmp_path / "in.json")
    cases = [
        ({"--json": ""}, [], r"--json needs a FILE \(or - for stdout\); it got an empty name"),  # L20
        ({"--png": tmp_path / "adir"}, [], r"--png .*adir: it is a directory"),  # c009
        ({"--junit": tmp_path / "afile" / "x.xml"}, [], r"--junit .*x\.xml: .*afile is a file, not a folder"),  # L05
        ({"--json": tmp_path / "no" / "x.json"}, [], r"the folder .*no does not exist; create it first"),
        ({"--sarif": tmp_path / "s", "--junit": tmp_path / "s"}, [], r"--sarif .*s and --junit .*s are the same file"),  # L02
        ({"--json": "-", "--sarif": "/dev/stdout"}, [], r"--json - and --sarif /dev/stdout both write to stdout"),
        ({"--json": tmp_path / "in.json"}, [tmp_path / "in.json"], r"--json .*in\.json is one of the command's inputs"),
        ({"--json": tmp_path / "alias.json"}, [tmp_path / "in.json"], r"one of the command's inputs"),  # by inode
        ({"--json": "/dev/fd/987"}, [], r"file descriptor 987 is not open"),
    ]
    for outputs, inputs, message in cases:
        with pytest.raises(BadInput, match=message):
            outdir.check_outputs(outputs, inputs)
    assert sorted(os.listdir(tmp_path)) == ["adir", "afile", "alias.json", "in.json"]  # the probes left nothing


def test_check_outputs_accepts_what_can_be_written(tmp_path):
    outdir.check_outputs({"--json": tmp_path / "new.json", "--sarif": "-", "--junit": None,
                          "--png": tmp_path / "c.png"}, [tmp_path / "prompts.json"])
    outdir.check_outputs({"--json": os.devnull, "--sarif": os.devnull})  # a character device takes both


@needs_root
def test_check_outputs_refuses_a_folder_even_root_cannot_write_in(tmp_path):
    """c011: --png /proc/c.png failed after the computation, naming a temporary file."""
    with pytest.raises(BadInput, match=r"--png /proc/c\.png: cannot create a file in /proc"):
        outdir.check_outputs({"--png": "/proc/c.png"})
