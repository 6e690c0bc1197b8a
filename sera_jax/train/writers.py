"""Metric writers (TensorBoard + CSV + console, optionally Weights & Biases), progress bars and lines, results.json
and a run summary.

Only process 0 writes anything, so every host can call these unconditionally -- and must, multi-host: values
sharded over several hosts' devices are gathered from every process first (``distributed.to_host``).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import functools
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import IO, Any, Self

import jax
import numpy as np
import tqdm
from absl import logging

from sera_jax.train.config_utils import config_to_dict, get_field, require, to_jsonable
from sera_jax.train.distributed import to_host
from sera_jax.train.files import write_text_atomic

CSV_NAME = "metrics.csv"
TB_DIR = "tb"
WANDB_DIR = "wandb"  # W&B's own folder under the writer's directory (W&B names it); the run id is kept in it
WANDB_ID_FILE = "run_id"
WANDB_MODES = ("disabled", "offline", "online")


def _is_primary() -> bool:
    return jax.process_index() == 0


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"loss": x}} -> {"train/loss": x} (TensorBoard groups tags by their prefix)."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def _to_float(name: str, value: Any) -> float:
    arr = np.asarray(jax.device_get(value))
    if arr.size != 1:
        raise ValueError(f"metric {name!r} has shape {arr.shape}; scalars must have one element "
                         "(use write_histograms for arrays)")
    if not np.issubdtype(arr.dtype, np.number) and arr.dtype != np.bool_ and arr.dtype.kind != "V":
        raise ValueError(f"metric {name!r} has non-numeric dtype {arr.dtype}")
    return float(arr.astype(np.float64).reshape(()))


def _format_value(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def default_wandb_config() -> dict[str, str]:
    """``config.log.wandb``: ``mode`` one of ``WANDB_MODES`` ("offline": the run's files stay under the workdir,
    ``wandb sync`` uploads them later); empty ``name`` / ``group``: the workdir's name (``wandb_run``)."""
    return dict(mode="disabled", project="sera_jax", entity="", group="", name="")


def _import_wandb():
    try:
        import wandb  # Deferred: an optional extra, and importing it costs seconds.
    except ImportError as e:
        raise ImportError("config.log.wandb.mode is not 'disabled', but the wandb package cannot be imported "
                          f"({e}); install the extra: pip install 'sera_jax[wandb]'") from e
    return wandb


def validate_wandb_config(config: Any) -> None:
    """Checks ``config.log.wandb`` (a config without it logs nothing to W&B); ValueError naming the bad field, or
    ImportError naming the extra when W&B is on but not installed (at the boundary, not after hours of training)."""
    if get_field(config, "log.wandb", None) is None:
        return
    mode = require(config, "log.wandb.mode", lambda m: m in WANDB_MODES, f"must be one of {list(WANDB_MODES)}")
    require(config, "log.wandb.project", lambda p: isinstance(p, str) and p != "", "must be a non-empty str")
    for field in ("entity", "group", "name"):
        require(config, f"log.wandb.{field}", str)
    if mode != "disabled":
        _import_wandb()


@dataclasses.dataclass(frozen=True)
class WandbRun:
    """The Weights & Biases run of one MetricWriter (``wandb_run`` builds it from ``config.log.wandb``)."""

    mode: str  # one of WANDB_MODES ("disabled": no run)
    project: str
    name: str
    group: str = ""
    entity: str = ""
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # recorded with the run

    def __post_init__(self):
        if self.mode not in WANDB_MODES:
            raise ValueError(f"WandbRun.mode={self.mode!r}: must be one of {list(WANDB_MODES)}")


def wandb_run(config: Any, workdir: str | os.PathLike, run_dir: str | os.PathLike) -> WandbRun | None:
    """The W&B run of the writer of ``run_dir`` in an experiment's ``workdir``, or None when ``config.log.wandb``
    is absent or disabled. Every writer of a workdir is one run of the group ``log.wandb.group`` (default: the
    workdir's name), named ``<log.wandb.name or the workdir's name>/<run_dir under workdir>``
    ("maze_cpu/seed_0/uniform"); ``config`` (as a dict) is recorded with it."""
    validate_wandb_config(config)
    settings = get_field(config, "log.wandb", None)
    if settings is None or settings["mode"] == "disabled":
        return None
    workdir, run_dir = pathlib.Path(workdir).resolve(), pathlib.Path(run_dir).resolve()
    where = run_dir.relative_to(workdir).as_posix() if run_dir != workdir else ""
    prefix = settings["name"] or workdir.name
    return WandbRun(mode=settings["mode"], project=settings["project"], entity=settings["entity"],
                    group=settings["group"] or workdir.name, name=f"{prefix}/{where}" if where else prefix,
                    config=config_to_dict(config))


class MetricWriter:
    """Writes scalars to TensorBoard and `<workdir>/metrics.csv`, histograms to TensorBoard; with `wandb`, both
    to a Weights & Biases run too.

    The CSV has a `step` column plus one column per metric name seen so far; when a new name
    appears, the file is rewritten with the wider header (earlier rows get empty cells). When a
    resumed run writes a step not after the last step already in the CSV, the rows from that step
    on are dropped (they belong to the part of the old run after its last checkpoint), and
    TensorBoard events from that step on are purged for the same reason.

    The W&B run (started at the first write, its files under `<workdir>/wandb/`) records `wandb.config` plus
    `run_provenance()`; its id is kept in `<workdir>/wandb/run_id`, so a resumed writer continues the same run
    (`resume="allow"`; offline, each attempt is a folder of that id, which `wandb sync` joins). W&B keeps a run's
    steps increasing: steps an online run already holds (those the old run logged after its last checkpoint)
    keep their first values there; the CSV and TensorBoard have the resumed ones.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        csv_file: bool = True,
        console: bool = False,
        console_keys: Sequence[str] | None = None,
        console_stream: IO[str] | None = None,
        wandb: WandbRun | None = None,
    ):
        self._dir = pathlib.Path(workdir)
        self._active = _is_primary()
        self._use_tb = tensorboard and self._active
        self._use_csv = csv_file and self._active
        self._wandb_settings = wandb if (wandb is not None and wandb.mode != "disabled" and self._active) else None
        self._wandb = None  # the W&B run, started at the first write
        self._wandb_from = 0  # the first step the W&B run accepts (a resumed online run's next step)
        self._wandb_skipped = False
        self._console = console and self._active
        self._console_keys = tuple(console_keys) if console_keys is not None else None
        self._stream = console_stream
        self._tb = None
        self._csv_path = self._dir / CSV_NAME
        self._columns: list[str] | None = None  # None until the existing CSV (if any) is read

    # -- TensorBoard ---------------------------------------------------------------------------
    def _tb_writer(self, step: int):
        if self._tb is None:
            import tensorboardX  # Deferred: importing it costs a second even when unused.

            logdir = self._dir / TB_DIR
            resumed = logdir.is_dir() and any(logdir.iterdir())
            # purge_step hides events at >= step left by a run that died after its last checkpoint.
            # The default event file name only has second resolution: two writers opened within
            # a second (a quick restart) would overwrite each other's file.
            self._tb = tensorboardX.SummaryWriter(str(logdir), purge_step=step if resumed else None,
                                                  flush_secs=30, filename_suffix=f".{uuid.uuid4().hex[:8]}")
        return self._tb

    # -- Weights & Biases ----------------------------------------------------------------------
    def _wandb_run(self):
        if self._wandb is None:
            wandb = _import_wandb()
            settings = self._wandb_settings
            id_path = self._dir / WANDB_DIR / WANDB_ID_FILE
            if id_path.exists():
                run_id = id_path.read_text().strip()
            else:
                id_path.parent.mkdir(parents=True, exist_ok=True)
                run_id = uuid.uuid4().hex[:12]  # W&B allows [a-z0-9_-] ids, unique within a project
                write_text_atomic(id_path, run_id + "\n")  # before init: a run killed in init resumes this id
            config = {**settings.config, "provenance": {**run_provenance(), "metrics_dir": str(self._dir)}}
            self._wandb = wandb.init(project=settings.project, entity=settings.entity or None,
                                     name=settings.name or None, group=settings.group or None, mode=settings.mode,
                                     dir=str(self._dir), id=run_id, resume="allow", reinit="create_new", config=config)
            self._wandb_from = self._wandb.starting_step
        return self._wandb

    def _write_wandb(self, step: int, values: Mapping[str, Any]) -> None:
        run = self._wandb_run()
        if step >= self._wandb_from:
            run.log(dict(values), step=step)
        elif not self._wandb_skipped:
            self._wandb_skipped = True
            logging.warning("W&B run %s already holds steps up to %d (logged before this resume): this writer's "
                            "steps up to there are left out of it (metrics.csv and TensorBoard have them)", run.id,
                            self._wandb_from - 1)

    # -- CSV -----------------------------------------------------------------------------------
    def _read_csv(self) -> tuple[list[str], list[dict[str, str]]]:
        if not self._csv_path.exists():
            return ["step"], []
        with open(self._csv_path, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or ["step"])
            rows = list(reader)
        return columns, rows

    def _rewrite_csv(self, columns: list[str], rows: Iterable[Mapping[str, Any]]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".metrics_", suffix=".csv", dir=self._dir)
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self._csv_path)

    def _write_csv(self, step: int, values: Mapping[str, float]) -> None:
        row = {"step": step, **values}
        if self._columns is None:  # First write of this writer: adopt (and trim) an existing CSV.
            columns, rows = self._read_csv()
            kept = [r for r in rows if r.get("step", "").isdigit() and int(r["step"]) < step]
            new = [k for k in values if k not in columns]
            if len(kept) != len(rows) or new or not self._csv_path.exists():
                self._rewrite_csv(columns + new, kept)
            self._columns = columns + new
        new = [k for k in values if k not in self._columns]
        if new:  # Rare (new metric names appear at the first steps or evals): rewrite wider.
            _, rows = self._read_csv()
            self._columns += new
            self._rewrite_csv(self._columns, rows)
        with open(self._csv_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self._columns, restval="").writerow(row)

    # -- public --------------------------------------------------------------------------------
    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Writes one value per metric at `step` (nested dicts become "a/b" names)."""
        scalars = to_host(flatten_metrics(scalars))  # on every process: a sharded value is gathered from all
        if not self._active:
            return
        step = int(step)
        values = {k: _to_float(k, v) for k, v in scalars.items()}
        if "step" in values:
            raise ValueError("metric name 'step' is reserved for the CSV step column")
        if self._use_tb:
            tb = self._tb_writer(step)
            for name, value in values.items():
                tb.add_scalar(name, value, step)
        if self._use_csv:
            self._write_csv(step, values)
        if self._wandb_settings is not None:
            self._write_wandb(step, values)
        if self._console:
            shown = values if self._console_keys is None else {
                k: values[k] for k in self._console_keys if k in values}
            line = f"step {step}: " + ", ".join(f"{k}={_format_value(v)}" for k, v in shown.items())
            tqdm.tqdm.write(line, file=self._stream or sys.stdout)

    def write_histograms(self, step: int, arrays: Mapping[str, Any]) -> None:
        """Writes a TensorBoard (and W&B) histogram per array (non-finite entries are dropped, with a warning)."""
        arrays = to_host(flatten_metrics(arrays))  # on every process: a sharded array is gathered from all
        if not (self._active and (self._use_tb or self._wandb_settings is not None)):
            return
        step = int(step)
        finite_arrays = {}
        for name, value in arrays.items():
            values = np.asarray(jax.device_get(value), dtype=np.float64).ravel()
            finite = values[np.isfinite(values)]
            if finite.size != values.size:
                logging.warning("histogram %s at step %d: dropped %d non-finite values", name, step,
                                values.size - finite.size)
            if finite.size:
                finite_arrays[name] = finite
        if self._use_tb:
            tb = self._tb_writer(step)
            for name, finite in finite_arrays.items():
                tb.add_histogram(name, finite, step)
        if finite_arrays and self._wandb_settings is not None:
            wandb = _import_wandb()
            self._write_wandb(step, {name: wandb.Histogram(finite) for name, finite in finite_arrays.items()})

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self, exit_code: int = 0) -> None:
        """Closes the TensorBoard file and finishes the W&B run (``exit_code`` != 0 marks it failed)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish(exit_code=exit_code)
            self._wandb = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(exit_code=0 if exc_type is None else 1)


def progress(
    iterable_or_total: Iterable[Any] | int, desc: str = "", *, disable: bool = False, **kwargs: Any
) -> tqdm.tqdm:
    """A tqdm bar with rate and ETA; silent when `disable`, off process 0, or when the output is not
    a TTY (log files and CI stay clean). An int means `range(total)`."""
    if isinstance(iterable_or_total, int):
        iterable: Iterable[Any] = range(iterable_or_total)
    else:
        iterable = iterable_or_total
    quiet = True if (disable or not _is_primary()) else None  # None: tqdm checks isatty itself
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm.tqdm(iterable, desc=desc, disable=quiet, **kwargs)


def status(message: str, file: IO[str] | None = None) -> None:
    """One line of a run's progress on process 0 (a phase begins, a run resumes): printed at every scale, with
    ``config.log.progress`` off and without a TTY too (bars are not), and flushed, so a log file shows it now."""
    if _is_primary():
        stream = file or sys.stdout
        tqdm.tqdm.write(message, file=stream)
        stream.flush()


def format_pass_at_k(ks: Sequence[int], values: Sequence[float]) -> str:
    """``pass@1 0.123  pass@2 0.234 ...``: each pass@k with its k."""
    if len(ks) != len(values):
        raise ValueError(f"{len(values)} pass@k values for {len(ks)} ks {list(ks)}")
    return "  ".join(f"pass@{k} {float(v):.3f}" for k, v in zip(ks, values))


def write_results_json(
    workdir: str | os.PathLike, results: Mapping[str, Any], config: Any = None,
    filename: str = "results.json",
) -> pathlib.Path:
    """Writes {"results": ..., "config": ..., "provenance": ...} to `<workdir>/<filename>` atomically (temp +
    rename), so a reader never sees half a file. numpy/jax values become JSON numbers and lists. ``provenance``
    (``run_provenance``) says which command and commit produced the numbers."""
    path = pathlib.Path(workdir) / filename
    payload = {"results": to_jsonable(results, "results"),
               "config": None if config is None else config_to_dict(config), "provenance": run_provenance()}
    text = json.dumps(payload, indent=2, sort_keys=True)  # Serialise first: a bad value writes nothing.
    if _is_primary():
        write_text_atomic(path, text + "\n")
    return path


#: The packages whose versions decide the numbers (recorded with every results.json).
NUMERIC_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes", "orbax-checkpoint")
#: CPU instruction sets XLA's CPU code may use: another set compiles other code, so other rounding.
CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def run_environment() -> dict[str, Any]:
    """What besides the code and the config decides a run's numbers: Python and the numeric packages' versions,
    JAX's backend and devices, and the CPU (model and which of ``CPU_FEATURES`` it has; None off Linux). The same
    config and seed trains to other numbers on a machine whose CPU has another instruction set."""
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cpu_model, flags = None, None
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
        cpu_model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), None)
        line = next((line for line in info.splitlines() if line.startswith("flags")), "")
        present = set(line.split(":", 1)[-1].split())
        flags = [f for f in CPU_FEATURES if f in present]
    except OSError:
        pass
    devices = jax.devices()
    return {"python": platform.python_version(), "packages": {n: version(n) for n in NUMERIC_PACKAGES},
            "backend": jax.default_backend(), "devices": f"{len(devices)} x {devices[0].device_kind}",
            "cpu": cpu_model, "cpu_features": flags, "xla_flags": os.environ.get("XLA_FLAGS")}


def run_provenance() -> dict[str, Any]:
    """The command line of this process, the git commit of the code it imported and ``run_environment()``:
    ``commit`` is None outside a git checkout, and ``dirty`` says whether tracked files differed from that commit
    (numbers from a dirty tree cannot be regenerated from the commit alone).

    Read once per process, at its first call, which a run makes when it starts (``record_run_start``): a checkout
    that moves on while a long run goes (a commit, a checkout of another branch) does not relabel the run's numbers
    with code they did not come from. Returns a copy of that first reading."""
    return copy.deepcopy(_first_provenance())


def record_run_start() -> None:
    """Reads the provenance now, at a run's start, for every file the run writes later (``run_provenance``)."""
    run_provenance()


@functools.cache
def _first_provenance() -> dict[str, Any]:
    source = pathlib.Path(__file__).resolve().parents[2]  # the checkout sera_jax was imported from

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = None if commit is None else bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]), "commit": commit, "dirty": dirty,
            "environment": run_environment()}


def format_summary(results: Mapping[str, Any], title: str = "Summary", max_items: int = 6) -> str:
    """An aligned 'name  value' block; arrays longer than `max_items` show their shape and range."""
    flat = flatten_metrics(results)
    lines = [title, "-" * len(title)]
    width = max((len(k) for k in flat), default=0)
    for key, value in flat.items():
        if isinstance(value, (jax.Array, np.ndarray, np.generic, int, float, list, tuple)) and not isinstance(
                value, bool):
            arr = np.asarray(jax.device_get(value))
            if arr.ndim == 0 and np.issubdtype(arr.dtype, np.number):
                text = _format_value(float(arr))
            elif arr.size <= max_items and np.issubdtype(arr.dtype, np.number):
                text = "[" + ", ".join(_format_value(float(v)) for v in arr.ravel()) + "]"
            elif np.issubdtype(arr.dtype, np.number) and arr.size:
                text = f"shape {arr.shape}, min {_format_value(float(arr.min()))}, max {_format_value(float(arr.max()))}"
            else:
                text = str(value)
        else:
            text = str(value)
        lines.append(f"{key.ljust(width)}  {text}")
    return "\n".join(lines)


def print_summary(results: Mapping[str, Any], title: str = "Summary", file: IO[str] | None = None) -> None:
    """Prints `format_summary(results)` on process 0 (end of a run)."""
    results = to_host(results)  # on every process: a sharded value is gathered from all
    if _is_primary():
        print(format_summary(results, title), file=file or sys.stdout, flush=True)
