"""MetricWriter (CSV with growing columns, TensorBoard events), progress, results.json, summary."""

import csv
import io
import json
import os
import pathlib
import struct
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
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
