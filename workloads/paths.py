"""What is wrong with a path a user gave: a readable regular file is expected, and a
FIFO, a device, a socket, a directory or a broken symbolic link must be named as such
(opening a FIFO blocks until something writes to it: `rack run --scenario s.fifo`
used to hang), and an empty or over-long name must be refused before anything is
read or created.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

#: Characters of a path shown in a message (a 300-character name is not repeated whole).
SHOWN = 80


def shown(path: str | os.PathLike) -> str:
    """`path` for a message: cut to its first and last characters when long."""
    text = str(path)
    if len(text) <= SHOWN:
        return text
    return f"{text[:SHOWN // 2 - 2]}...{text[-(SHOWN // 2 - 2):]} ({len(text)} characters)"


def file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be read as a regular file, in a few words ("is a FIFO (named
    pipe)", "is a directory", "is a symbolic link loop", ...), or None when it is a
    regular file or does not exist at all (the caller says what a missing file means:
    an unknown name, a typo). Never opens the file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if exc.errno == errno.ENAMETOOLONG:
            return name_problem(path) or "is a path too long for the file system"
        if exc.errno == errno.ENOENT:
            return "is a symbolic link to a missing file" if os.path.islink(path) else None
        if exc.errno == errno.ENOTDIR:
            return "has a file where a folder is expected in its path"
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"is {what}, not a regular file"
    return "is not a regular file"


def name_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot name a file at all: empty, or a component longer than the file
    system allows (NAME_MAX, 255 bytes on Linux file systems); None when it can."""
    text = os.fspath(path)
    if not str(text).strip():
        return "is empty"
    limit = _name_max(text)
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > limit:
            return f"has a name of {size} bytes; the file system allows at most {limit}"
    return None


def _name_max(path: str) -> int:
    probe = Path(path)
    while True:
        try:
            return os.pathconf(probe, "PC_NAME_MAX")
        except (OSError, ValueError):
            if probe == probe.parent:
                return 255
            probe = probe.parent


__all__ = ["file_problem", "name_problem", "shown"]
