"""Output folders written with a manifest: a command replaces only the files it wrote.

A report (or any other multi-file result) is rendered into a temporary folder beside the
target, then its files are moved into the target one by one, and a manifest
(`MANIFEST`, JSON: each file's relative path, size and SHA-256) records what was written.
On the next run with `force=True`, a file may be replaced or removed only when the manifest
lists it *and* it still has the recorded content; any other file in the folder is the
user's, and the run is refused with those files named. Nothing the toolkit did not write is
ever deleted or moved. A symlinked output folder is written through (the link stays).

Every path written or deleted is resolved and checked to lie inside the folder, with no
symlink on the way (`confined`): a manifest entry such as `../x` (a received folder can carry
one) is refused, never followed. A report written before manifests (`LEGACY_MARKER`, no
manifest) cannot be told from the user's edits, so all its files are the user's. An
unwritable folder is refused by `check`, before any computation.

Vocabulary: *ours* = listed in the previous manifest with unchanged content; *foreign* =
everything else under the folder.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from interp.errors import BadInput
from interp.models.files import write_atomic

MANIFEST = ".interp-manifest.json"
LEGACY_MARKER = ".interp-report"  # in every report folder; without a manifest: a report written before manifests


class OutputDirError(BadInput, FileExistsError):
    """The output folder cannot be used: not a folder, not writable, or holding files we did not write."""


def target(out_dir: str | os.PathLike) -> Path:
    """The folder actually written: a symlink to a folder is followed, so the link itself stays."""
    out = Path(out_dir).expanduser().absolute()
    return out.resolve() if out.is_symlink() else out


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file (and symlink) under `folder`, as sorted POSIX paths relative to it."""
    found = []
    for root, dirs, names in os.walk(folder):
        base = Path(root)
        found += [(base / name).relative_to(folder).as_posix() for name in names]
        found += [(base / d).relative_to(folder).as_posix() for d in dirs if (base / d).is_symlink()]
    return sorted(found)


def read_manifest(folder: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} of the files a previous run wrote ({} if none recorded).

    Raises OutputDirError when an entry names a path outside the folder: we never write one.
    """
    path = folder / MANIFEST
    if not path.is_file() or path.is_symlink():  # a linked manifest is not ours: never read, never written through
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(entries, dict):
        return {}
    outside = [name for name in entries if not _plain_relative(name)]
    if outside:
        shown = ", ".join(repr(name) for name in outside[:8]) + (f" and {len(outside) - 8} more" if len(outside) > 8 else "")
        raise OutputDirError(
            f"output directory {folder}: its manifest {MANIFEST} lists {shown}, {'a path' if len(outside) == 1 else 'paths'} "
            "outside the folder; interp never writes such an entry, so the manifest was edited or came with a received "
            f"folder. Nothing was deleted: delete {path} (every file there then counts as yours) or choose another --out.")
    return entries


def _plain_relative(name: object) -> bool:
    """A manifest name as we write it: relative, '/'-separated, no '', '.' or '..' part."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def confined(folder: Path, name: str) -> Path:
    """`folder/name`, resolved, when it lies inside `folder` and no part of it is a symlink; else OutputDirError.

    Every path the toolkit writes or deletes in an output folder goes through here (a link,
    even the last part, is refused: `write_atomic` would write through it).
    """
    root = Path(os.path.realpath(folder))
    path = root.joinpath(*name.split("/")) if _plain_relative(name) else None
    if path is None or Path(os.path.realpath(path)) != path:
        raise OutputDirError(f"{name!r} is a path outside the output directory {folder} (or through a symlink out "
                             "of it); interp writes and deletes only inside it. Nothing was written there.")
    return path


def _inside(folder: Path, name: str) -> bool:
    try:
        confined(folder, name)
    except OutputDirError:
        return False
    return True


def ours(folder: Path) -> set[str]:
    """The files under `folder` that a previous run wrote and nobody changed since."""
    manifest = read_manifest(folder)
    owned = {MANIFEST} if (folder / MANIFEST).is_file() and not (folder / MANIFEST).is_symlink() else set()
    for name, entry in manifest.items():
        if not isinstance(entry, dict) or not _inside(folder, name):
            continue
        path = folder / name
        if path.is_file() and not path.is_symlink() and entry.get("sha256") == _digest(path):
            owned.add(name)
    return owned


def foreign_files(folder: Path) -> list[str]:
    """Files under `folder` that no previous run of ours wrote (or that were edited since)."""
    if not folder.is_dir():
        return []
    owned = ours(folder)
    return [name for name in _files(folder) if name not in owned]


def check(out_dir: str | os.PathLike, force: bool) -> Path:
    """Refuse an output folder we must not write, before any computation starts; returns the target.

    Without `force` the folder must be absent or empty; with `force` it may hold only files a
    previous run wrote. It (and every folder in it) must be writable. The error names the
    foreign files, or the unwritable folder, and the fix.
    """
    out = target(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"output path {out} exists and is not a directory; choose another --out.")
    if out.is_dir():
        if _files(out) and not force:
            raise OutputDirError(f"output directory {out} is not empty; pass --force to replace a previous report "
                                 "there, or choose another --out.")
        _refuse_foreign(out)
        _refuse_unwritable(out)
    parent = out.parent
    existing = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"cannot create {out}: {existing or parent} is not a writable directory "
                             "(permission denied, or a file); choose another --out.")
    return out


def _refuse_foreign(out: Path) -> None:
    """OutputDirError naming the files under `out` that no previous run wrote (or that were edited since)."""
    foreign = foreign_files(out)
    if not foreign:
        return
    if (out / LEGACY_MARKER).is_file() and not (out / MANIFEST).exists():
        raise OutputDirError(
            f"output directory {out} is a report written before manifests ({MANIFEST}): its files cannot be told "
            "from your edits, so --force replaces none of them. Nothing was deleted: delete the folder yourself if it "
            "holds nothing of yours, or choose another --out.")
    shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
    raise OutputDirError(
        f"output directory {out} holds files no previous report wrote (or that were edited since): {shown}. "
        "--force replaces only a report's own files and never deletes yours: move them away, or choose "
        "another --out."
    )


def _refuse_unwritable(out: Path) -> None:
    """OutputDirError when `out` or a folder in it cannot take new files (read-only, permission denied)."""
    for root, _, _ in os.walk(out):
        if not os.access(root, os.W_OK | os.X_OK):
            raise OutputDirError(f"output directory {root} is not writable (permission denied, or a read-only file "
                                 "system); make it writable, or choose another --out.")


def write(out_dir: str | os.PathLike, render: Callable[[Path], object], *, force: bool = False):
    """Render into a temporary sibling folder, then move its files into `out_dir` with a manifest.

    Returns what `render(folder)` returned. A failure while rendering leaves `out_dir` as it was;
    the previous run's files that this run did not write again are removed; nothing else is.
    """
    out = check(out_dir, force)
    with staging(out) as tmp:
        result = render(tmp)
        commit(tmp, out)
    return result


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A fresh temporary folder beside `out` to render into; removed (with whatever is left in it) at the end."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit(tmp: Path, out: Path) -> None:
    """Move the files of the finished folder `tmp` into `out`; record them in out's manifest.

    The manifest is written first with the union of old and new files, so a crash half-way
    leaves every file we touched listed (a later --force can clean up); then last with the new set.
    """
    new = [name for name in _files(tmp) if name != MANIFEST]
    entries = {name: {"size": (tmp / name).stat().st_size, "sha256": _digest(tmp / name)} for name in new}
    if not out.exists():
        _write_manifest(tmp, entries)
        _share(tmp)
        os.rename(tmp, out)  # fresh folder: one atomic rename
        return
    _refuse_foreign(out)  # again: the folder may have changed while we computed
    previous = {name for name in ours(out) if name != MANIFEST}
    stale = sorted(previous - set(new))
    for name in [*new, *stale]:
        confined(out, name)  # every path checked before anything moves
    recorded = read_manifest(out)
    _write_manifest(out, {**{n: recorded.get(n, {}) for n in previous}, **entries})
    for name in new:
        destination = confined(out, name)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, destination)
    for name in stale:
        path = confined(out, name)
        path.unlink(missing_ok=True)
        _remove_empty_parents(Path(os.path.realpath(out)), path)
    _write_manifest(out, entries)


def _write_manifest(folder: Path, entries: dict[str, dict]) -> None:
    text = json.dumps({"written_by": "interp", "files": entries}, indent=2, sort_keys=True) + "\n"
    write_atomic(confined(folder, MANIFEST), text)


def _share(folder: Path) -> None:
    """mkdtemp makes 0700; a report is for sharing: the umask's usual permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)


def _remove_empty_parents(root: Path, path: Path) -> None:
    """Remove folders emptied by removing `path`, up to (not including) `root`."""
    for parent in path.parents:
        if parent == root or root not in parent.parents:
            return
        try:
            parent.rmdir()
        except OSError:
            return


def is_replaceable(out_dir: str | os.PathLike) -> bool:
    """True when `out_dir` is absent, empty, or holds only files a previous run of ours wrote."""
    out = target(out_dir)
    if not out.exists():
        return True
    try:
        return out.is_dir() and not foreign_files(out)
    except OutputDirError:  # a manifest listing paths outside the folder
        return False


def written(out_dir: str | os.PathLike) -> Iterable[str]:
    """The files the manifest of `out_dir` lists."""
    return sorted(read_manifest(target(out_dir)))
