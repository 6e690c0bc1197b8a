"""Workdir preparation: fail at start-up, with the path and the problem, not hours later at a save."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax

from sera_jax.train import config_utils, files
from sera_jax.train.distributed import barrier

DEFAULT_MIN_FREE_BYTES = 1 << 30  # 1 GiB: a few checkpoints of the maze policy plus logs.
FINGERPRINT_FILE = "config_fingerprint.json"
_PROBE_PREFIX = ".write_probe_"  # prepare_workdir's write test (unique names: hosts may probe at once)


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


def _probe_write(path: pathlib.Path) -> None:
    """Creates, writes and deletes a temp file in `path`; raises OSError if any step fails."""
    fd, name = tempfile.mkstemp(prefix=_PROBE_PREFIX, dir=path)
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


def claim_workdir(workdir: pathlib.Path, fingerprint: Mapping[str, Any]) -> None:
    """Ties ``workdir`` to the config fields in ``fingerprint`` (see ``config_utils.fingerprint``).

    The first run writes ``WORKDIR/config_fingerprint.json``; a later run in the same workdir (a resume)
    must agree on every field, or it stops here -- before anything is read or written -- with a ValueError
    listing each differing field (unless the workdir holds nothing else: then the new config takes it). A
    resume with another model or learning rate would otherwise mix two experiments in one set of checkpoints
    and results. Fields left out of the fingerprint (more steps, more seeds, evaluation settings) may change
    between runs.

    Multi-host (every process calls it, on one shared workdir): all processes decide on the same snapshot of
    the workdir (a barrier first, so no process has written yet), so they all stop or all go on; only process 0
    writes the file, and the others wait for it at a second barrier before touching the workdir.
    """
    barrier(f"claim_workdir:check:{workdir}")
    try:
        _check_or_write_fingerprint(workdir, dict(fingerprint))
    finally:
        barrier(f"claim_workdir:written:{workdir}")


def _check_or_write_fingerprint(workdir: pathlib.Path, current: dict[str, Any]) -> None:
    path = workdir / FINGERPRINT_FILE
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} is unreadable ({e}); it records the config this workdir was started "
                             "with -- restore it or use a new workdir") from e
        diff = config_utils.diff_fingerprints(saved, current, names=("workdir", "now"))
        # A run that stopped before writing anything (a missing dataset, say) leaves nothing to protect.
        if diff and any(entry.name != FINGERPRINT_FILE and not entry.name.startswith(_PROBE_PREFIX)
                        for entry in workdir.iterdir()):
            raise ValueError(
                f"workdir {workdir} holds a run with a different config (from {path}):\n  " + "\n  ".join(diff)
                + "\nuse a new --workdir, or rerun with the workdir's config to resume it")
        if not diff:
            return
    if jax.process_index() == 0:
        files.write_json_atomic(path, current, indent=1, sort_keys=True)
