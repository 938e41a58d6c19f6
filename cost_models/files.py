"""`write_atomic`: the one way the project writes a file (plans, hardware profiles, CSV, PNG).

The text goes to a temporary file in the target's folder, is flushed to disk, and is renamed over the
target, so a reader never sees half a file and a failed write leaves an existing file as it was.

A rename replaces whatever is at the path, so the target is checked first:
* a path that exists and is not a regular file (a character or block device such as /dev/null, a FIFO,
  a socket, a folder) is refused with an `OutputFileError` that says what it is: renaming over it would
  destroy it (as root, `--out /dev/null` would replace the device node with a plain file);
* a symbolic link is followed, never replaced: the file it points to is written (atomically, in that
  file's folder) and the link stays a link. A link to something that is not a regular file is refused
  like the thing itself.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from cost_models.errors import PlannerError

__all__ = ["OutputFileError", "check_output_path", "write_atomic"]

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class OutputFileError(PlannerError, ValueError):
    """An output path that must not be written: it exists and is not a regular file."""


def check_output_path(path: str | os.PathLike[str], what: str = "the file") -> Path:
    """The path to write for `path` (symbolic links followed); raises OutputFileError when something other
    than a regular file is there."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError:
        return target  # unreadable metadata: the write itself will say what is wrong
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        via = f" (the symbolic link {str(path)!r} points to {str(target)!r})" if str(target) != os.path.abspath(path) else ""
        raise OutputFileError(f"refusing to write {what} to {str(path)!r}: it is {kind}{via}, not a regular file, "
                              "and writing would replace it; give the path of a regular file (new or existing)")
    return target


def write_atomic(path: str | os.PathLike[str], data: str | bytes, what: str = "the file") -> None:
    """Write `data` (text as UTF-8) to `path` atomically (see the module docstring). An existing file keeps
    its permission bits; a new one gets 0o644."""
    target = check_output_path(path, what)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows it
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
