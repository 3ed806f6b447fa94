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
unwritable folder is refused by `check_out_dir`, before any computation.

Vocabulary: *ours* = listed in the previous manifest with unchanged content; *foreign* =
everything else under the folder.

Single output files (`--json`, `--sarif`, `--junit`, `--png`, `AttentionView.save`) go through
`write_output`: a regular file is written atomically (`write_atomic`); a character device
(`/dev/null`, a terminal) or a named pipe is opened and written in place, never renamed over;
a path naming an open file descriptor (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, bash's
`>(cmd)`) is written through that descriptor, at its current offset, so `--json /dev/stdout >
out.txt` appends to what the command printed instead of replacing it. `check_outputs` refuses,
before any work, a target that cannot be written or that is one of the command's inputs or
another output (the same file by inode, or by resolved path while it does not exist yet).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

from interp.errors import BadInput

if TYPE_CHECKING:
    from interp.models.files import Content  # text, bytes, or a function writing the file at the path it gets

# `interp.models.files.write_atomic` is imported where it is used: importing `interp.models` imports torch, and
# the CLI checks its outputs (`check_outputs`) before torch is loaded, so that a bad flag is refused at once

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


def check_out_dir(out_dir: str | os.PathLike, force: bool) -> Path:
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
    out = check_out_dir(out_dir, force)
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
    from interp.models.files import write_atomic

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


# --------------------------------------------------------------------------- single output files

Identity = tuple  # ("inode", st_dev, st_ino) of an existing file; ("path", resolved path) of one not written yet
_STD_PATHS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD_PATH = re.compile(r"/(?:dev/fd|proc/self/fd|proc/thread-self/fd|proc/(\d+)/fd)/(\d+)")


def write_output(target: str | os.PathLike, content: Content, *, what: str) -> Path:
    """Write one output file the user named (`what` names it in messages: "JSON", "SARIF", "the page").

    A regular file (or a new one) is written atomically; a character device or a named pipe is opened and
    written in place; a path naming an open file descriptor (/dev/stdout, /dev/fd/N) is written through that
    descriptor. A directory, a block device or a socket is refused with a BadInput naming `target`; so is any
    failure to write (a full disk, a missing folder), never naming a temporary file. Returns the path written.
    """
    text = os.fspath(target)
    if not text:
        raise BadInput(f"cannot write {what}: the file name is empty; name a FILE.")
    fd = stream_fd(text)
    if fd is not None:
        _write_fd(fd, _as_bytes(content, text), text, what)
        return Path(text)
    path = Path(text)
    mode = _mode(path, text, what)
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        data = _as_bytes(content, text)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)  # a FIFO: waits for its reader, as `cat >` does
        except OSError as error:
            raise BadInput(f"cannot write {what} to {text}: {error.strerror or error}") from None
        try:
            _write_fd(fd, data, text, what)
        finally:
            os.close(fd)
        return path
    from interp.models.files import write_atomic

    # a full disk keeps the earlier file: no 0-byte document
    folder = Path(os.path.realpath(path)).parent
    if mode is None and not folder.is_dir():
        raise BadInput(f"cannot write {what} to {text}: the folder {folder} does not exist (or is a file); create it "
                       "first, or choose another path.")
    try:
        return write_atomic(path, content)
    except OSError as error:
        raise BadInput(f"cannot write {what} to {text}: {error.strerror or error}") from None


def stream_fd(target: str | os.PathLike) -> int | None:
    """The file descriptor of this process that `target` names (/dev/stdout, /dev/fd/3, /proc/self/fd/3, or a
    symlink to one of them), else None. Such a path is written through the descriptor: reopening it would
    start at offset 0 of a redirected file, and renaming over it would replace that file."""
    path = os.path.abspath(os.fspath(target))
    for _ in range(40):  # a chain of links, followed one step at a time: /proc/self/fd/N itself reads "pipe:[...]"
        if path in _STD_PATHS:
            return _STD_PATHS[path]
        match = _FD_PATH.fullmatch(path)
        if match is not None and match.group(1) in (None, str(os.getpid())):
            return int(match.group(2))
        try:
            if not os.path.islink(path):
                return None
            path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        except OSError:
            return None
    return None


def _mode(path: Path, text: str, what: str) -> int | None:
    """`path`'s st_mode (None when it does not exist); BadInput for what no output may be."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise BadInput(f"cannot write {what} to {text}: {error.strerror or error}") from None
    problem = _kind_problem(mode, text)
    if problem is not None:
        raise BadInput(f"cannot write {what} to {text}: {problem}")
    return mode


def _kind_problem(mode: int, text: str) -> str | None:
    """Why a file of this kind cannot take an output (None: a regular file, a character device or a FIFO)."""
    if stat.S_ISDIR(mode):
        return f"it is a directory; name a file (e.g. {os.path.join(text, 'out')}) or another path."
    if stat.S_ISBLK(mode):
        return ("it is a block device (a disk); interp writes regular files, character devices such as /dev/null "
                "and pipes only. Choose another path.")
    if stat.S_ISSOCK(mode):
        return "it is a socket, which cannot be opened as a file; choose another path."
    return None


def _as_bytes(content: Content, name: str) -> bytes:
    """The bytes of `content`; a function renders into a private temporary folder first (for streams and devices)."""
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    with tempfile.TemporaryDirectory(prefix="interp-output-") as folder:
        rendered = Path(folder) / (Path(name).name or "output")
        content(rendered)
        return rendered.read_bytes()


def _write_fd(fd: int, data: bytes, text: str, what: str) -> None:
    """All of `data` to the open descriptor `fd`, after whatever Python still buffers for it."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a stream without a descriptor (a capture)
            if stream.fileno() == fd:
                stream.flush()
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        if fd == 1:
            raise  # stdout closed by its reader: exit 0 (interp.cli.main), as for every other output
        raise BadInput(f"cannot write {what} to {text}: its reader closed the pipe before the end.") from None
    except OSError as error:
        raise BadInput(f"cannot write {what} to {text}: {error.strerror or error}") from None


def check_outputs(outputs: Mapping[str, str | os.PathLike | None],
                  inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Refuse, before any work, outputs that cannot be written or would destroy something (BadInput, exit 2).

    `outputs`: {flag name ("--json"): target or None}; "-" is stdout. Refused: an empty name, a directory,
    a block device or socket, a file descriptor not open for writing, a folder that is missing or not
    writable, an output that is the same file as one of `inputs` (a checkpoint's files, a prompt or claims
    file) or as another output. Character devices (/dev/null, a terminal) may take several outputs.
    """
    seen: dict[Identity, tuple[str, str]] = {}
    for flag, target in outputs.items():
        if target is None:
            continue
        text = os.fspath(target)
        if not text:
            raise BadInput(f"{flag} needs a FILE (or - for stdout); it got an empty name. Is a shell variable unset?")
        identity, shared = _output_identity(flag, text)
        if identity in seen and not shared:
            first_flag, first = seen[identity]
            if 1 in (_stdout_fd(first), _stdout_fd(text)):
                raise BadInput(f"{first_flag} {first} and {flag} {text} both write to stdout; give all but one of them a "
                               "FILE.")
            raise BadInput(f"{first_flag} {first} and {flag} {text} are the same file, which cannot hold both documents; "
                           "give each output its own file.")
        seen.setdefault(identity, (flag, text))
    for source in inputs:
        identity, shared = _input_identity(source)
        if identity in seen and not shared:
            flag, text = seen[identity]
            raise BadInput(f"{flag} {text} is one of the command's inputs ({os.fspath(source)}); writing it would destroy "
                           f"it. Choose another file for {flag}.")


def _output_identity(flag: str, text: str) -> tuple[Identity, bool]:
    """(what `text` writes to, whether other outputs may share it); BadInput when it cannot be written."""
    fd = 1 if text == "-" else stream_fd(text)
    if fd is not None:
        problem = _fd_problem(fd)
        if problem is not None:
            raise BadInput(f"{flag} {text}: {problem}; choose another target.")
        info = os.fstat(fd)
        return ("inode", info.st_dev, info.st_ino), False
    path = Path(text)
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent, or a part of its folder is a file
        real = Path(os.path.realpath(path))
        _check_folder(flag, text, real.parent)
        return ("path", str(real)), False
    except OSError as error:
        raise BadInput(f"{flag} {text}: {error.strerror or error}; choose another path.") from None
    problem = _kind_problem(info.st_mode, text)
    if problem is not None:
        raise BadInput(f"{flag} {text}: {problem}")
    if stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode):
        if not os.access(path, os.W_OK):
            raise BadInput(f"{flag} {text}: not writable (permission denied); choose another target.")
        return ("inode", info.st_dev, info.st_ino), stat.S_ISCHR(info.st_mode)
    _check_folder(flag, text, Path(os.path.realpath(path)).parent)  # replaced through a new file beside it
    return ("inode", info.st_dev, info.st_ino), False


def _stdout_fd(text: str) -> int | None:
    return 1 if text == "-" else stream_fd(text)


def _input_identity(source: str | os.PathLike) -> tuple[Identity, bool]:
    try:
        info = os.stat(source)
    except OSError:
        return ("path", os.path.realpath(source)), False
    return ("inode", info.st_dev, info.st_ino), stat.S_ISCHR(info.st_mode)


def _fd_problem(fd: int) -> str | None:
    """Why file descriptor `fd` cannot take an output (None: open for writing)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: nothing to ask
        return None
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return f"file descriptor {fd} is not open in this process"
    if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        return f"file descriptor {fd} is open for reading only"
    return None


def _check_folder(flag: str, text: str, folder: Path) -> None:
    """BadInput unless a new file can be created in `folder` (a probe file is created and removed)."""
    if not folder.exists():
        raise BadInput(f"{flag} {text}: the folder {folder} does not exist; create it first, or choose another path.")
    if not folder.is_dir():
        raise BadInput(f"{flag} {text}: {folder} is a file, not a folder; choose another path.")
    try:
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".interp-probe-", delete=True)
    except OSError as error:
        raise BadInput(f"{flag} {text}: cannot create a file in {folder} ({error.strerror or error}: not writable, or "
                       "not a real folder); choose another path.") from None
    probe.close()
