"""Copying files into and out of a sandbox's private folder without ever following its symlinks.

Code in the sandbox can leave symlinks anywhere in its own tree (``/logs/agent -> /root/.ssh``).
The host copies files in and out as root, so every path is walked one component at a time with
``O_NOFOLLOW`` from an open folder descriptor: a symlink on the way in is replaced by a real folder
or file, and on the way out it is refused (``download_file``) or skipped (``download_dir``). Special
files (fifos, devices, sockets) are skipped too. What is copied in belongs to ``owner`` (the
sandbox's root, so the trial can change it like files it made itself).

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> tree = SafeTree(root)
>>> (root / "evil").symlink_to("/etc")
>>> src = root.parent / "note.txt"; _ = src.write_text("hi")
>>> tree.write_file(("evil", "passwd"), src)       # replaces the link by a folder, never writes /etc
>>> (root / "evil").is_symlink(), (root / "evil" / "passwd").read_text()
(False, 'hi')
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["SafeTree", "SymlinkRefused"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class SymlinkRefused(PermissionError):
    """A path inside the sandbox's tree is (or passes through) a symlink."""


class SafeTree:
    """A folder whose contents untrusted code may have changed; every access stays inside it."""

    def __init__(self, root: Path, owner: tuple[int, int] | None = None) -> None:
        self.root = Path(root)
        self.owner = owner
        """The (uid, gid) that folders and files made here get; None: this process's."""

    def _own(self, fd: int) -> None:
        if self.owner is not None:
            os.fchown(fd, *self.owner)

    @contextlib.contextmanager
    def _dir(self, parts: Sequence[str], *, create: bool) -> Iterator[int]:
        """An open descriptor of the folder ``root/parts``; symlinks are replaced (create) or refused."""
        # the root is the host's own path (it may be /proc/self/fd/N: a trial's tree on a task image,
        # held open since its start), so it is followed; nothing below it is
        fd = os.open(self.root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            for part in parts:
                _check_part(part)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    made = True
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        made = False
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    if made:
                        self._own(child)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if not create:
                        raise SymlinkRefused(f"refusing to follow {'/'.join(parts)}: not a plain folder") from None
                    os.unlink(part, dir_fd=fd)
                    os.mkdir(part, 0o755, dir_fd=fd)
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    self._own(child)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def exists(self, parts: Sequence[str]) -> str | None:
        """``"dir"``, ``"file"``, ``"other"`` or None, without following symlinks."""
        if not parts:
            return "dir"
        try:
            with self._dir(parts[:-1], create=False) as fd:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except (OSError, ValueError):
            return None
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        if stat.S_ISREG(st.st_mode):
            return "file"
        return "other"

    def mkdir(self, parts: Sequence[str], mode: int | None = None) -> None:
        """Create ``root/parts`` and its parents (replacing symlinks on the way)."""
        with self._dir(parts, create=True) as fd:
            if mode is not None:
                os.fchmod(fd, mode)

    def write_file(self, parts: Sequence[str], source: Path | str) -> None:
        """Copy the host file ``source`` to ``root/parts`` (mode bits kept)."""
        if not parts:
            raise ValueError("no file name")
        _check_part(parts[-1])
        mode = os.stat(source).st_mode & 0o777
        with self._dir(parts[:-1], create=True) as fd:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                out = os.open(parts[-1], flags, mode, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.EISDIR:
                    raise IsADirectoryError(f"{'/'.join(parts)} is a folder in the sandbox") from None
                if exc.errno != errno.ELOOP:
                    raise
                os.unlink(parts[-1], dir_fd=fd)
                out = os.open(parts[-1], flags, mode, dir_fd=fd)
            try:
                st = os.fstat(out)
                if not stat.S_ISREG(st.st_mode):
                    raise PermissionError(f"{'/'.join(parts)} is not a regular file in the sandbox")
                self._own(out)
                os.fchmod(out, mode)
                with open(source, "rb") as src:
                    while block := src.read(_CHUNK):
                        os.write(out, block)
            finally:
                os.close(out)

    def write_tree(self, parts: Sequence[str], source_dir: Path | str) -> None:
        """Copy the host folder ``source_dir``'s contents into ``root/parts`` (merging)."""
        source_dir = Path(source_dir)
        self.mkdir(parts)
        for dirpath, dirnames, filenames in os.walk(source_dir, followlinks=False):
            rel = Path(dirpath).relative_to(source_dir).parts
            for name in dirnames:
                if not (Path(dirpath) / name).is_symlink():
                    self.mkdir([*parts, *rel, name])
            for name in filenames:
                src = Path(dirpath) / name
                if src.is_symlink() or not src.is_file():
                    continue
                self.write_file([*parts, *rel, name], src)

    def read_file(self, parts: Sequence[str], target: Path | str) -> None:
        """Copy ``root/parts`` to the host path ``target``; refuses symlinks and special files."""
        if not parts:
            raise ValueError("no file name")
        _check_part(parts[-1])
        with self._dir(parts[:-1], create=False) as fd:
            try:
                src = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SymlinkRefused(f"refusing to copy {'/'.join(parts)} out: it is a symlink") from None
                raise
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                raise PermissionError(f"refusing to copy {'/'.join(parts)} out: not a regular file")
            target = Path(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_out(src, st.st_mode, target)
        finally:
            os.close(src)

    def read_tree(self, parts: Sequence[str], target_dir: Path | str) -> None:
        """Copy the folder ``root/parts`` into the host folder ``target_dir`` (regular files only)."""
        target_dir = Path(target_dir)
        with self._dir(parts, create=False) as top:
            for dirpath, _dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                rel = Path(dirpath)
                (target_dir / rel).mkdir(parents=True, exist_ok=True)
                for name in filenames:
                    try:
                        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    try:
                        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
                    except OSError:
                        continue
                    try:
                        _copy_out(src, st.st_mode, target_dir / rel / name)
                    finally:
                        os.close(src)

    def discard(self, parts: Sequence[str]) -> None:
        """Delete ``root/parts`` (a folder with everything in it, a file or a symlink), following no symlink."""
        if not parts:
            raise ValueError("refusing to discard the whole tree; use remove()")
        try:
            with self._dir(parts[:-1], create=False) as fd:
                _check_part(parts[-1])
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(parts[-1], dir_fd=fd)
                else:
                    os.unlink(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            pass

    def remove(self) -> None:
        """Delete the whole tree (``shutil.rmtree`` never follows symlinks)."""
        shutil.rmtree(self.root, ignore_errors=True)


def _check_part(part: str) -> None:
    if not part or part in (".", "..") or "/" in part or "\0" in part:
        raise ValueError(f"bad path component {part!r}")


def _copy_out(src: int, mode: int, target: Path) -> None:
    """Write the open file ``src`` to the host path ``target`` with ``mode``'s permission bits; a
    symlink at ``target`` is replaced, not followed."""
    with contextlib.suppress(FileNotFoundError):
        if target.is_symlink():
            target.unlink()
    with open(target, "wb") as out:
        while block := os.read(src, _CHUNK):
            out.write(block)
    os.chmod(target, mode & 0o777)
