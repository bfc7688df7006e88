"""Writing files so that nothing is lost: the data goes to a temp file beside the target, which is renamed
over it once complete (a reader sees the old file or the new one, never half of one); the temp file is named
after its writer, so the ones a killed process left behind can be removed; and a failed write (a full disk
above all) is one line that says where, never a library's internal error.

Checkpoints, the token and tokenizer caches, metrics.jsonl and chat's /save all write through here.
"""

from __future__ import annotations

import errno
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


def write_error(path: Path, e: OSError) -> WriteError:
    if e.errno == errno.ENOSPC:
        return WriteError(f"no space left on device writing {path.parent}", path, full=True)
    if e.errno == errno.EDQUOT:
        return WriteError(f"disk quota exceeded writing {path.parent}", path, full=True)
    if e.errno == errno.ELOOP:
        return WriteError(f"cannot write {path}: a symbolic link (or a loop of them) is in the way", path)
    return WriteError(f"cannot write {path}: {e.strerror or e}", path)


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
    """Why path (itself, not what a symbolic link points at) is no regular file charlm may replace or read
    (a link, a FIFO, a device...); None for a regular file or nothing there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or str(e)
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


def read_bounded(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a ValueError that says what is wrong for a FIFO,
    a device (/dev/zero never ends), a link to one, or a file too big to be what it claims."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
            data = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise ValueError(f"{what} {path} is larger than {limit // (1 << 20)} MB: it cannot be what charlm wrote")
    return data


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
