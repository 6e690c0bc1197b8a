"""Workdir preparation: fail at start-up, with the path and the problem, not hours later at a save."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

DEFAULT_MIN_FREE_BYTES = 1 << 30  # 1 GiB: a few checkpoints of the maze policy plus logs.


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


def _probe_write(path: pathlib.Path) -> None:
    """Creates, writes and deletes a temp file in `path`; raises OSError if any step fails."""
    fd, name = tempfile.mkstemp(prefix=".write_probe_", dir=path)
    try:
        os.write(fd, b"ok")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(name)


def prepare_workdir(path: str | os.PathLike, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES) -> pathlib.Path:
    """Creates `path` (with parents) and checks it is a writable directory with enough free space.

    Returns the absolute path. Raises ValueError naming the path and the problem: a URL (only local
    workdirs are supported), an existing non-directory, a directory that cannot be created or
    written, or less than `min_free_bytes` free on its filesystem.
    """
    text = os.fspath(path)
    if not text:
        raise ValueError("workdir is empty: pass --workdir=/some/path")
    if "://" in text:
        raise ValueError(f"workdir {text!r}: only local paths are supported")
    workdir = pathlib.Path(text).expanduser().absolute()
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir {workdir} exists and is not a directory")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"workdir {workdir} cannot be created: {e.strerror or e}") from e
    try:
        _probe_write(workdir)
    except OSError as e:
        raise ValueError(f"workdir {workdir} is not writable: {e.strerror or e}") from e
    free = shutil.disk_usage(workdir).free
    if free < min_free_bytes:
        raise ValueError(
            f"workdir {workdir} has only {_format_bytes(free)} free; at least "
            f"{_format_bytes(min_free_bytes)} is required (free space or lower min_free_bytes)")
    return workdir
