"""MetricWriter (CSV with growing columns, TensorBoard events, a W&B offline run), progress, results.json, summary."""

import csv
import io
import json
import os
import pathlib
import struct
import subprocess
import sys
import types

import jax.numpy as jnp
import ml_collections
import jax
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from sera_jax.train import files, writers


def _read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def _read_events(logdir):
    """All (tag, step, value or histogram) records in a TensorBoard log directory (TFRecord framing)."""
    out = []
    for name in sorted(os.listdir(logdir)):
        data = (logdir / name).read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                out.append((v.tag, event.step, v.histo if v.HasField("histo") else v.simple_value))
    return out


def test_csv_columns_grow_and_tensorboard_gets_scalars(tmp_path):
    with writers.MetricWriter(tmp_path) as w:
        w.write_scalars(1, {"loss": jnp.float32(0.5), "lr": 1e-3})
        w.write_scalars(2, {"loss": np.float64(0.25), "eval": {"pass@1": 0.75}})
        w.write_scalars(3, {"lr": 2e-3})
    header, rows = _read_csv(tmp_path / "metrics.csv")
    assert header == ["step", "loss", "lr", "eval/pass@1"]
    assert rows == [
        {"step": "1", "loss": "0.5", "lr": "0.001", "eval/pass@1": ""},
        {"step": "2", "loss": "0.25", "lr": "", "eval/pass@1": "0.75"},
        {"step": "3", "loss": "", "lr": "0.002", "eval/pass@1": ""},
    ]
    events = {(tag, step): v for tag, step, v in _read_events(tmp_path / "tb")}
    # tensorboardX rewrites characters TensorBoard does not allow in tags ("@" -> "_").
    assert events == {("loss", 1): 0.5, ("lr", 1): pytest.approx(1e-3), ("loss", 2): 0.25,
                      ("eval/pass_1", 2): 0.75, ("lr", 3): pytest.approx(2e-3)}


def test_resumed_writer_drops_rows_after_the_resume_step(tmp_path):
    with writers.MetricWriter(tmp_path, tensorboard=False) as w:
        for step in range(1, 6):
            w.write_scalars(step, {"loss": float(step)})
    # Resumed from a checkpoint at step 3: steps 4 and 5 are redone.
    with writers.MetricWriter(tmp_path, tensorboard=False) as w:
        w.write_scalars(4, {"loss": 40.0, "new": 1})
    header, rows = _read_csv(tmp_path / "metrics.csv")
    assert header == ["step", "loss", "new"]
    assert [(r["step"], r["loss"], r["new"]) for r in rows] == [
        ("1", "1.0", ""), ("2", "2.0", ""), ("3", "3.0", ""), ("4", "40.0", "1.0")]


def test_resumed_tensorboard_purges_from_the_resume_step(tmp_path):
    with writers.MetricWriter(tmp_path, csv_file=False) as w:
        w.write_scalars(5, {"loss": 5.0})
    with writers.MetricWriter(tmp_path, csv_file=False) as w:
        w.write_scalars(4, {"loss": 40.0})
    by_file = {}
    for f in (tmp_path / "tb").iterdir():
        data, pos = f.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            by_file.setdefault(f.name, []).append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
            pos += 12 + length + 4
    # Two event files (a quick restart must not overwrite the first run's file) ...
    assert len(by_file) == 2
    old, new = sorted(by_file.values(), key=lambda evs: any(e.step == 5 for e in evs))[::-1]

    def is_start(e):
        return e.session_log.status == event_pb2.SessionLog.START

    # ... and TensorBoard hides the old events at step >= 4 on reading a SessionLog START at step 4.
    assert not any(is_start(e) for e in old)
    assert [e.step for e in new if is_start(e)] == [4]


def test_bad_metrics_name_the_key(tmp_path):
    w = writers.MetricWriter(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match=r"metric 'x' has shape \(3,\)"):
        w.write_scalars(0, {"x": np.zeros(3)})
    with pytest.raises(ValueError, match="'step' is reserved"):
        w.write_scalars(0, {"step": 1})


def test_console_line_and_histograms(tmp_path):
    stream = io.StringIO()
    with writers.MetricWriter(tmp_path, console=True, console_keys=("loss", "nan"),
                              console_stream=stream) as w:
        w.write_scalars(7, {"loss": 0.123456, "hidden": 1.0, "nan": float("nan")})
        w.write_histograms(7, {"s_i": np.array([0.1, 0.5, 0.9, np.nan])})
    assert stream.getvalue() == "step 7: loss=0.1235, nan=nan\n"
    histos = [(tag, step, h) for tag, step, h in _read_events(tmp_path / "tb") if tag == "s_i"]
    assert len(histos) == 1
    _, step, h = histos[0]
    assert step == 7 and h.num == 3 and h.min == pytest.approx(0.1) and h.max == pytest.approx(0.9)


# -- Weights & Biases: offline runs only (files under the workdir, nothing sent) -----------------------------------


def _read_wandb(path):
    """The records of a W&B transaction log (``run-<id>.wandb``): a 7-byte header (":W&B", magic 0xBEE1, version
    0), then LevelDB's log format: 32 KiB blocks of chunks (crc32c, length, type: 1 full, 2 first, 3 middle,
    4 last; a block's tail shorter than a chunk header is padding), each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:7] == struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def _wandb_run_summary(path):
    """What an offline run recorded: its identity, its config and its history as {(step, metric): value}."""
    run, config, history = None, {}, {}
    for record in _read_wandb(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({i.key: json.loads(i.value_json) for i in run.config.update if i.key != "_wandb"})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update if i.key != "_wandb"})
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history.update({(items["_step"], k): v for k, v in items.items() if not k.startswith("_")})
    return {"id": run.run_id, "name": run.display_name, "group": run.run_group, "project": run.project,
            "config": config, "history": history}


WANDB_CONFIG = ml_collections.ConfigDict({
    "sera": {"n_min": 2}, "betas": (0.9, 0.95),
    "log": {"wandb": {**writers.default_wandb_config(), "mode": "offline", "project": "sera-test"}}})


@pytest.fixture(scope="module")
def wandb_offline(tmp_path_factory):
    """One offline run written by a writer, then by a resumed writer of the same folder (W&B's service starts
    once per process: every test of the sink reads these)."""
    wandb = pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                           "WANDB_DIR": root / "env_dir", "WANDB_CACHE_DIR": root / "cache",
                           "WANDB_CONFIG_DIR": root / "config", "WANDB_DATA_DIR": root / "data",
                           "WANDB_X_DISABLE_META": "true", "WANDB_X_DISABLE_STATS": "true"}.items():
            mp.setenv(var, str(value))
        mp.delenv("WANDB_API_KEY", raising=False)
        workdir = root / "maze_tiny"
        run_dir = workdir / "seed_0" / "uniform"
        run_dir.mkdir(parents=True)
        settings = writers.wandb_run(WANDB_CONFIG, workdir, run_dir)
        with writers.MetricWriter(run_dir, tensorboard=False, wandb=settings) as w:
            w.write_scalars(1, {"loss": jnp.float32(0.5), "eval": {"pass@1": 0.25}})
            w.write_scalars(3, {"loss": 0.125})
            w.write_histograms(3, {"s_i": np.array([0.1, 0.5, 0.9, np.nan])})
        first = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        # Killed after a checkpoint at step 2 and resumed: steps 3 on are written again, to the same run id.
        with writers.MetricWriter(run_dir, tensorboard=False, wandb=settings) as w:
            w.write_scalars(3, {"loss": 0.25})
        wandb.teardown()  # waits for W&B's service to exit: a finished run's log may still be buffered before
        second = sorted(set(run_dir.glob("wandb/offline-run-*/run-*.wandb")) - set(first))
    return {"root": root, "workdir": workdir, "run_dir": run_dir, "first": first, "second": second}


def test_wandb_offline_run_records_scalars_histograms_and_config(wandb_offline):
    run_dir = wandb_offline["run_dir"]
    assert len(wandb_offline["first"]) == 1
    run = _wandb_run_summary(wandb_offline["first"][0])
    assert (run["name"], run["group"], run["project"]) == ("maze_tiny/seed_0/uniform", "maze_tiny", "sera-test")
    histogram = {k: run["history"].pop((3, f"s_i/{k}")) for k in ("_type", "bins", "values")}
    assert run["history"] == {(1, "loss"): 0.5, (1, "eval/pass@1"): 0.25, (3, "loss"): 0.125}
    assert histogram["_type"] == "histogram" and sum(histogram["values"]) == 3  # the NaN is dropped
    assert histogram["bins"][0] == pytest.approx(0.1) and histogram["bins"][-1] == pytest.approx(0.9)
    provenance = run["config"].pop("provenance")
    assert run["config"] == {"sera": {"n_min": 2}, "betas": [0.9, 0.95],
                             "log": {"wandb": {**writers.default_wandb_config(), "mode": "offline",
                                               "project": "sera-test"}}}
    assert provenance["metrics_dir"] == str(run_dir) and set(provenance) >= {"command", "commit", "dirty"}
    # Everything lies under the writer's folder, beside metrics.csv; nothing in WANDB_DIR.
    assert not (wandb_offline["root"] / "env_dir").exists()
    assert sorted(os.listdir(run_dir)) == ["metrics.csv", "wandb"]


def test_wandb_resumed_writer_continues_the_same_run(wandb_offline):
    assert len(wandb_offline["second"]) == 1
    first = _wandb_run_summary(wandb_offline["first"][0])
    second = _wandb_run_summary(wandb_offline["second"][0])
    stored = (wandb_offline["run_dir"] / "wandb" / "run_id").read_text().strip()
    assert first["id"] == second["id"] == stored
    assert second["history"] == {(3, "loss"): 0.25}


def test_wandb_off_by_default_and_bad_settings_name_the_field(tmp_path, monkeypatch):
    config = ml_collections.ConfigDict({"log": {"wandb": writers.default_wandb_config()}})
    assert writers.wandb_run(config, tmp_path, tmp_path / "run") is None
    assert writers.wandb_run(ml_collections.ConfigDict({"log": {}}), tmp_path, tmp_path) is None  # no log.wandb
    monkeypatch.setenv("WANDB_MODE", "offline")  # the environment alone does not turn the sink on
    with writers.MetricWriter(tmp_path, tensorboard=False, wandb=writers.wandb_run(config, tmp_path, tmp_path)) as w:
        w.write_scalars(1, {"loss": 1.0})
        w.write_histograms(1, {"s_i": np.ones(3)})
    assert sorted(os.listdir(tmp_path)) == ["metrics.csv"]
    config.log.wandb.mode = "x"
    with pytest.raises(ValueError, match=r"config\.log\.wandb\.mode='x': must be one of \['disabled', 'offline', "
                                         r"'online'\]"):
        writers.wandb_run(config, tmp_path, tmp_path)
    config.log.wandb.update(mode="offline", project="")
    with pytest.raises(ValueError, match=r"config\.log\.wandb\.project=''"):
        writers.validate_wandb_config(config)
    with pytest.raises(ValueError, match=r"WandbRun\.mode='x'"):
        writers.WandbRun(mode="x", project="p", name="n")


def test_wandb_resumed_online_run_skips_the_steps_it_holds(tmp_path, monkeypatch):
    """Online, a resumed run starts at W&B's next step (``starting_step``): the resumed writer's earlier steps are
    left out (W&B would drop them, warning at each), not sent; a stand-in for wandb records the calls."""
    calls = {}

    class Run:
        id, starting_step = "abc", 5

        def log(self, values, step):
            calls.setdefault("log", []).append((step, dict(values)))

        def finish(self, exit_code=0):
            calls["finish"] = exit_code

    def init(**kwargs):
        calls["init"] = kwargs
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "run_id").write_text("abc\n")
    with pytest.raises(RuntimeError, match="killed"):
        with writers.MetricWriter(tmp_path, tensorboard=False, csv_file=False,
                                  wandb=writers.WandbRun(mode="online", project="p", name="n")) as w:
            for step in (3, 4, 5):
                w.write_scalars(step, {"loss": float(step)})
            raise RuntimeError("killed")
    assert calls["log"] == [(5, {"loss": 5.0})]
    assert {k: calls["init"][k] for k in ("id", "resume", "dir", "mode")} == {
        "id": "abc", "resume": "allow", "dir": str(tmp_path), "mode": "online"}
    assert calls["finish"] == 1  # an exception inside the writer's block marks the run failed


def test_wandb_missing_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'sera_jax\[wandb\]'"):
        writers.validate_wandb_config(WANDB_CONFIG)
    w = writers.MetricWriter(tmp_path, tensorboard=False, csv_file=False,
                             wandb=writers.WandbRun(mode="offline", project="p", name="n"))
    with pytest.raises(ImportError, match=r"pip install 'sera_jax\[wandb\]'"):
        w.write_scalars(1, {"loss": 1.0})


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_quiet_unless_tty():
    quiet = io.StringIO()
    assert list(writers.progress(3, "x", file=quiet)) == [0, 1, 2]
    assert quiet.getvalue() == ""
    tty = _Tty()
    assert list(writers.progress(iter("ab"), "y", total=2, file=tty, mininterval=0)) == ["a", "b"]
    assert "y" in tty.getvalue() and "2/2" in tty.getvalue()
    off = _Tty()
    list(writers.progress(2, "z", disable=True, file=off))
    assert off.getvalue() == ""


def test_write_results_json_atomic_and_converted(tmp_path):
    config = ml_collections.ConfigDict({"sera": {"n_min": 2}, "betas": (0.9, 0.95)})
    results = {"pass_at_k": jnp.array([0.5, 0.75]), "cos": np.float32(0.25), "k": np.int64(3)}
    path = writers.write_results_json(tmp_path, results, config)
    assert path == tmp_path / "results.json"
    data = json.loads(path.read_text())
    provenance = data.pop("provenance")
    assert data == {"results": {"pass_at_k": [0.5, 0.75], "cos": 0.25, "k": 3},
                    "config": {"sera": {"n_min": 2}, "betas": [0.9, 0.95]}}
    # The command and the commit of the code that wrote it (this checkout's HEAD).
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pathlib.Path(writers.__file__).parents[2],
                          capture_output=True, text=True).stdout.strip()
    assert provenance["commit"] == (head or None) and isinstance(provenance["dirty"], (bool, type(None)))
    assert provenance["command"].split()[0] == pathlib.Path(sys.executable).name  # this process's command line
    # ... and what else decides the numbers: the numeric packages as installed, the devices, the CPU.
    env = provenance["environment"]
    assert env["packages"]["jax"] == jax.__version__ and env["packages"]["numpy"] == np.__version__
    assert env["backend"] == jax.default_backend() and env["devices"].startswith(f"{jax.device_count()} x ")
    if pathlib.Path("/proc/cpuinfo").exists():
        flags = set(next(line for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split())
        assert env["cpu_features"] == [f for f in writers.CPU_FEATURES if f in flags]
    data["provenance"] = provenance
    # A value that cannot be converted leaves the previous file intact and no temp files behind.
    with pytest.raises(ValueError, match=r"results\.bad"):
        writers.write_results_json(tmp_path, {"bad": object()}, config)
    assert json.loads(path.read_text()) == data
    assert sorted(os.listdir(tmp_path)) == ["results.json"]
    assert path.read_text() == json.dumps(data, indent=2, sort_keys=True) + "\n"  # the bytes readers rely on


def test_write_json_atomic_failure_leaves_existing_file(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    assert files.write_json_atomic(path, {"b": 1, "a": [1.5]}, indent=1, sort_keys=True) == path
    before = path.read_bytes()
    assert before == b'{\n "a": [\n  1.5\n ],\n "b": 1\n}'
    files.write_json_atomic(tmp_path / "nl.json", {"a": 1}, trailing_newline=True)
    assert (tmp_path / "nl.json").read_text() == '{"a": 1}\n'
    # Serialisation fails: nothing is written, not even a temp file.
    with pytest.raises(TypeError, match="not JSON serializable"):
        files.write_json_atomic(path, {"a": 2, "bad": object()})
    assert path.read_bytes() == before

    # Writing fails after serialisation (a full disk, a kill): the old file stays and the temp file goes.
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        files.write_json_atomic(path, {"a": 3})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["cache.json", "nl.json"]


def test_summary_format():
    text = writers.format_summary({"pass@1": 0.84444, "s": np.arange(10.0), "few": [1, 2],
                                   "eval": {"name": "maze"}}, title="Run")
    assert text.splitlines() == [
        "Run",
        "---",
        "pass@1     0.8444",
        "s          shape (10,), min 0, max 9",
        "few        [1, 2]",
        "eval/name  maze",
    ]
    out = io.StringIO()
    writers.print_summary({"a": 1}, file=out)
    assert out.getvalue() == "Summary\n-------\na  1\n"
