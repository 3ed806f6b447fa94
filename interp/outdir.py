"""Output folders written with a manifest: a command replaces only the files it wrote.

A report (or any other multi-file result) is rendered into a temporary folder beside the
target, then its files are moved into the target one by one, and a manifest
(`MANIFEST`, JSON: each file's relative path, size and SHA-256) records what was written.
On the next run with `force=True`, a file may be replaced or removed only when the manifest
lists it *and* it still has the recorded content; any other file in the folder is the
user's, and the run is refused with those files named. Nothing the toolkit did not write is
ever deleted or moved. A symlinked output folder is written through (the link stays).

Vocabulary: *ours* = listed in the previous manifest with unchanged content; *foreign* =
everything else under the folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from interp.errors import BadInput

MANIFEST = ".interp-manifest.json"
LEGACY_MARKER = ".interp-report"  # reports written before manifests: their report.json lists the files
_LEGACY_EXTRA = ("report.json", "redundancy.csv", LEGACY_MARKER)


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
    """{relative path: {"size", "sha256"}} of the files a previous run wrote ({} if none recorded)."""
    path = folder / MANIFEST
    if path.is_file():
        try:
            entries = json.loads(path.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError, AttributeError):
            return {}
        return entries if isinstance(entries, dict) else {}
    return _legacy_manifest(folder)


def _legacy_manifest(folder: Path) -> dict[str, dict]:
    """A report written before manifests: the files its report.json lists, with their current content."""
    if not (folder / LEGACY_MARKER).is_file():
        return {}
    try:
        listed = json.loads((folder / "report.json").read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError):
        listed = []
    names = [n for n in [*listed, *_LEGACY_EXTRA] if isinstance(n, str) and (folder / n).is_file()]
    return {n: {"sha256": _digest(folder / n)} for n in names}


def ours(folder: Path) -> set[str]:
    """The files under `folder` that a previous run wrote and nobody changed since."""
    manifest = read_manifest(folder)
    owned = {MANIFEST} if (folder / MANIFEST).is_file() else set()
    for name, entry in manifest.items():
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
    previous run wrote. The error names the foreign files and the fix.
    """
    out = target(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"output path {out} exists and is not a directory; choose another --out.")
    if out.is_dir():
        present = _files(out)
        foreign = foreign_files(out)
        if present and not force:
            raise OutputDirError(f"output directory {out} is not empty; pass --force to replace a previous report "
                                 "there, or choose another --out.")
        if foreign:
            shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
            raise OutputDirError(
                f"output directory {out} holds files no previous report wrote (or that were edited since): {shown}. "
                "--force replaces only a report's own files and never deletes yours: move them away, or choose "
                "another --out."
            )
    parent = out.parent
    existing = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"cannot create {out}: {existing or parent} is not a writable directory "
                             "(permission denied, or a file); choose another --out.")
    return out


def write(out_dir: str | os.PathLike, render: Callable[[Path], object], *, force: bool = False):
    """Render into a temporary sibling folder, then move its files into `out_dir` with a manifest.

    Returns what `render(folder)` returned. A failure while rendering leaves `out_dir` as it was;
    the previous run's files that this run did not write again are removed; nothing else is.
    """
    out = check(out_dir, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        result = render(tmp)
        commit(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


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
    previous = {name for name in ours(out) if name != MANIFEST}
    _write_manifest(out, {**{n: read_manifest(out).get(n, {}) for n in previous}, **entries})
    for name in new:
        destination = out / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, destination)
    for name in sorted(previous - set(new)):
        (out / name).unlink(missing_ok=True)
        _remove_empty_parents(out, out / name)
    _write_manifest(out, entries)


def _write_manifest(folder: Path, entries: dict[str, dict]) -> None:
    text = json.dumps({"written_by": "interp", "files": entries}, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{MANIFEST}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, folder / MANIFEST)


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
    return out.is_dir() and not foreign_files(out)


def written(out_dir: str | os.PathLike) -> Iterable[str]:
    """The files the manifest of `out_dir` lists."""
    return sorted(read_manifest(target(out_dir)))
