"""The one way the toolkit writes a file: to a temporary file in the same folder, then renamed (and deletes one:
`remove_files`, plain files directly inside a folder).

`write_atomic(path, content)` leaves either the earlier file or the new one, whole: a full
disk, a crash or Ctrl-C part-way never leaves a half-written or empty file, and never a
temporary file behind. Every writer of `models/`, `interp/` and `analyses/` goes through it, a file the
user names through `interp.outdir.write_output`, which writes devices and pipes in place
(`tests/reliability/test_files.py` checks the source for any other write).

A symlink at `path` is written through (its target is replaced; the link stays), and the new
file keeps the earlier file's permissions (else the umask's usual ones, not mkstemp's 0600).
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Callable, Union

Content = Union[str, bytes, Callable[[Path], object]]


def write_atomic(path: str | os.PathLike, content: Content, *, encoding: str = "utf-8") -> Path:
    """Write `content` (text, bytes, or a function that writes the file at the path it is given) to `path`.

    Returns the path written (a symlink's target). The folder must exist.
    """
    final = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    tmp = _reserve(final)
    try:
        usual = stat.S_IMODE(tmp.stat().st_mode)  # 0666 less the umask, before a writer may change it
        if callable(content):
            content(tmp)  # a writer may recreate the file with its own mode (safetensors: 0600)
        else:
            data = content.encode(encoding) if isinstance(content, str) else bytes(content)
            with open(tmp, "wb") as handle:
                handle.write(data)
        _keep_mode(final, tmp, usual)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def remove_files(folder: str | os.PathLike, names: list[str]) -> None:
    """Delete the regular files `names` directly inside `folder` (what a command wrote there before, e.g. an
    earlier training run replaced with --force); a name with a path separator, a symlink or a folder is refused,
    so nothing outside `folder` or not a plain file is ever deleted."""
    folder = Path(folder)
    for name in names:
        path = folder / name
        if Path(name).name != name or name in (".", "..") or path.is_symlink() or (path.exists() and not path.is_file()):
            raise ValueError(f"{path}: not a plain file directly inside {folder}; not deleted.")
        path.unlink(missing_ok=True)


def _reserve(final: Path) -> Path:
    """Create an empty, unused temporary file beside `final` (mode 0666 less the umask)."""
    while True:
        tmp = final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _keep_mode(final: Path, tmp: Path, usual: int) -> None:
    """Give the new file the permissions of the file it replaces, else `usual` (the umask's)."""
    try:
        mode = stat.S_IMODE(final.stat().st_mode)
    except FileNotFoundError:
        mode = usual
    os.chmod(tmp, mode)
