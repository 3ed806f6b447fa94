"""interp.models.files: the umask's mode for files a writer recreates (d048), and `remove_files`' confinement."""
import os

import pytest

from interp.models.files import remove_files, write_atomic


def test_a_writer_that_recreates_the_file_still_gives_the_umasks_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a", lambda tmp: (tmp.unlink(), tmp.write_bytes(b"x"), os.chmod(tmp, 0o600)))
        (tmp_path / "b").write_bytes(b"old")
        os.chmod(tmp_path / "b", 0o604)
        write_atomic(tmp_path / "b", b"new")  # an existing file keeps its own mode
    finally:
        os.umask(old)
    assert oct((tmp_path / "a").stat().st_mode & 0o777) == "0o640"
    assert oct((tmp_path / "b").stat().st_mode & 0o777) == "0o604"


def test_remove_files_deletes_plain_files_inside_the_folder_only(tmp_path):
    (tmp_path / "run.json").write_text("x")
    (tmp_path / "keep").mkdir()
    (tmp_path / "outside.txt").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "outside.txt")
    remove_files(tmp_path, ["run.json", "absent.json"])
    assert not (tmp_path / "run.json").exists()
    for bad in ("keep", "link", "../outside.txt", "keep/../outside.txt", ".."):
        with pytest.raises(ValueError, match="not a plain file directly inside"):
            remove_files(tmp_path, [bad])
    assert (tmp_path / "outside.txt").read_text() == "mine" and (tmp_path / "keep").is_dir()
