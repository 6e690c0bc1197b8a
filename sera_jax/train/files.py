"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never half of one.

Standard library only, so any module can use it without an import cycle (``workdir``, ``writers``, an
experiment's cache). Nothing here knows about processes: callers on several hosts decide who writes.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Writes ``text`` to ``path`` through a temporary file in the same directory, fsynced, then renamed over
    ``path``; on any error the temporary file is removed and ``path`` is left as it was. Returns ``path``."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, payload: Any, *, indent: int | None = None, sort_keys: bool = False,
                      trailing_newline: bool = False) -> pathlib.Path:
    """``json.dumps(payload, indent=indent, sort_keys=sort_keys)`` (plus ``"\\n"`` if ``trailing_newline``)
    written atomically to ``path`` (see :func:`write_text_atomic`). The payload is serialised before any file
    is touched, so a value JSON cannot encode raises and leaves an existing ``path`` intact. Returns ``path``."""
    text = json.dumps(payload, indent=indent, sort_keys=sort_keys)
    return write_text_atomic(path, text + "\n" if trailing_newline else text)
