"""Atomic file writes: a reader (or a crash) never sees half a file.

asv writes its JSON in place, so a process killed mid-write leaves a truncated file; what
this project writes goes to a temporary file in the same folder, is flushed to disk, and
is renamed over the target (a rename within one file system is atomic on POSIX).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _replace_with(path: Path, fill) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` (parent folders created) through a temporary file and a rename."""
    _replace_with(Path(path), lambda fh: fh.write(data))


def write_text_atomic(path: str | Path, text: str) -> None:
    """write_bytes_atomic of `text` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def copy_atomic(src: str | Path, dest: str | Path) -> None:
    """Copy the file `src` to `dest` through a temporary file and a rename."""
    with open(src, "rb") as fin:
        _replace_with(Path(dest), lambda fh: shutil.copyfileobj(fin, fh))
