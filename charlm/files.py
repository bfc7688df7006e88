"""Writing files so that nothing is lost: the data goes to a temp file beside the target, which is renamed
over it once complete (a reader sees the old file or the new one, never half of one); the temp file is named
after its writer, so the ones a killed process left behind can be removed; and a failed write (a full disk
above all) is one line that says where, never a library's internal error.

Checkpoints, the token and tokenizer caches, metrics.jsonl and chat's /save all write through here.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from charlm.errors import UserError

# [A-Za-z0-9-] only: the host is part of temp file names and of the pattern that finds them again
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "localhost"
# .<target name>.<host>.<pid>.<8 hex digits>.tmp: the host, because a cache directory may be shared with
# other machines whose process ids mean nothing here
_TEMP = re.compile(rf"^\..+\.{re.escape(_HOST)}\.(\d+)\.[0-9a-f]{{8}}\.tmp$")


class WriteError(UserError):
    """A file could not be written (a full disk, a quota, a read-only file system): one line saying where."""

    def __init__(self, message: str, path: Path, full: bool = False):
        super().__init__(message)
        self.path = path
        self.full = full  # the disk or the quota is full: freeing space helps (nothing else does otherwise)


# an OSError in charlm's words: the operating system's own (strerror: "Not a directory", "File exists") read
# wrongly inside our sentences, and differ between systems and languages
_REASONS = {
    errno.ENOENT: "it does not exist",
    errno.ENOTDIR: "a part of its path is a file, not a directory",
    errno.EISDIR: "it is a directory",
    errno.EEXIST: "something else is already there",
    errno.EACCES: "permission is denied",
    errno.EPERM: "permission is denied",
    errno.ELOOP: "a symbolic link (or a loop of them) is in the way",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.ENAMETOOLONG: "its name is too long",
    errno.EIO: "the disk reported an input/output error",
    errno.EMFILE: "too many files are open",
    errno.ENFILE: "too many files are open",
    errno.EBUSY: "it is in use",
    errno.ETXTBSY: "it is in use",
    errno.ENXIO: "it is a device or FIFO nothing is attached to",
    errno.ENODEV: "it is a device that cannot be read as a file",
    errno.EXDEV: "it is on another file system",
    errno.ENOTEMPTY: "the directory is not empty",
    errno.EFBIG: "the file would be too large",
}


def reason(e: OSError) -> str:
    """Why an operation on a path failed, as a clause for a sentence ("cannot read X: <reason>"), for every
    OSError charlm reports; the system's own text (lower-cased) only for an errno not listed here."""
    if e.errno in _REASONS:
        return _REASONS[e.errno]
    text = e.strerror or str(e) or type(e).__name__
    return text[:1].lower() + text[1:]


def write_error(path: Path, e: OSError) -> WriteError:
    if e.errno == errno.ENOSPC:
        return WriteError(f"no space left on device writing {path.parent}", path, full=True)
    if e.errno == errno.EDQUOT:
        return WriteError(f"disk quota exceeded writing {path.parent}", path, full=True)
    return WriteError(f"cannot write {path}: {reason(e)}", path)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: Path) -> str | None:
    """Why path (itself, not what a symbolic link points at) is no regular file charlm may replace or read,
    as the end of "it is ...": "a symbolic link", "a FIFO", "a device"...; None for a regular file, for
    nothing there, and for a path that cannot be looked at (a file where a directory should be, a loop of
    links): the open or write that follows fails, and says why in its own words (reason)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def check_regular(path: Path) -> None:
    """WriteError unless path is a regular file or absent: charlm never writes through a symbolic link, and
    never replaces a FIFO, a device or a directory with a file (as root, /dev/null itself)."""
    if why := not_regular(path):
        raise WriteError(f"cannot write {path}: it is {why}, not a regular file", path)


def open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open that never follows a symbolic link (O_NOFOLLOW) and accepts only a regular file: a FIFO would
    block, a device would be written to. OSError (ELOOP for a link) otherwise."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), mode)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"it is {_kind(mode)}, not a regular file")
    return fd


class ReadError(ValueError):
    """A path could not be read as a regular file (absent, a FIFO, a device, a directory, a link where none
    may be, too large): one line saying what and why. A ValueError, so callers that rebuild a damaged cache
    entry catch it with the rest."""


def open_read(path: str | os.PathLike, what: str, links: bool = True) -> BinaryIO:
    """THE way charlm opens a file it did not just write (the cache, a corpus, a prompt, a run's files, a
    teacher): a binary file object on a regular file, or a ReadError. The open never waits: O_NONBLOCK, so
    a FIFO with no writer opens at once (and is then refused) instead of blocking for ever, and the type is
    checked on the opened file (fstat), so nothing swapped in after a check is read. links=False refuses a
    symbolic link (O_NOFOLLOW) where one has no business, as in the cache."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0) | (0 if links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ReadError(f"cannot read {what} {path}: {reason(e)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ReadError(f"{what} {path} is {_kind(mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file never blocks; reads behave as usual
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, limit: int, what: str, links: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (opened by open_read); a ReadError (a ValueError)
    that says what is wrong for a FIFO, a device (/dev/zero never ends), a link to one, or a file too big to
    be what it claims."""
    path = Path(path)
    with open_read(path, what, links) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ReadError(f"cannot read {what} {path}: {reason(e)}") from None
    if len(data) > limit:
        raise ReadError(f"{what} {path} is larger than {_size(limit)}: it cannot be what charlm wrote")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB" if n >= 1 << 10 else f"{n} bytes"


def sha256(path: str | os.PathLike, what: str) -> str:
    """The sha256 of a file's bytes (hex), read through open_read a megabyte at a time."""
    h = hashlib.sha256()
    with open_read(path, what) as f:
        try:
            while block := f.read(1 << 20):
                h.update(block)
        except OSError as e:
            raise ReadError(f"cannot read {what} {path}: {reason(e)}") from None
    return h.hexdigest()


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


class _Sink:
    """The temp file as the writer sees it. Libraries that write through a Python file object (torch.save)
    turn its OSError into their own error and drop the errno; the sink keeps it."""

    def __init__(self, f: BinaryIO):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name):  # seek, tell, flush: the file's own
        return getattr(self.f, name)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object], parents: bool = False) -> None:
    """Call write(f) on a temp file beside path, make it durable, then rename it to path (creating its
    directory first with parents=True). On any failure the temp file is removed and path is untouched;
    an OSError (ENOSPC...) becomes a WriteError."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        check_regular(path)
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        # "xb" rather than mkstemp: the file gets the usual umask permissions, not 0600
        with open(tmp, "xb") as f:
            sink = _Sink(f)
            try:
                write(sink)
            except Exception:
                if sink.error is None:
                    raise
                raise sink.error from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise write_error(path, e) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)  # gone already after the rename
        except OSError:  # no directory to hold it (a path under a file, a link loop): the real error is above
            pass


def append_line(path: Path, line: str) -> None:
    """Append one line; if the disk fills part-way, cut the file back to what it was (a reader never finds
    half a line) and raise WriteError."""
    data = (line + "\n").encode("utf-8")
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link, never a FIFO
        with open(fd, "ab", buffering=0) as f:  # unbuffered: a failed write fails here, not at close
            size = f.seek(0, os.SEEK_END)
            try:
                if f.write(data) != len(data):  # a regular file takes less than all only when the disk is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:
                f.truncate(size)
                raise
    except OSError as e:
        raise write_error(path, e) from None


def remove_dead_temps(directory: Path) -> None:
    """Remove the temp files that writers on this machine left when they were killed mid-write (a live
    writer's, this process's included, stay)."""
    if not directory.is_dir():
        return
    for p in directory.glob(".*.tmp"):
        m = _TEMP.match(p.name)
        if m and not _alive(int(m[1])):
            p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True
