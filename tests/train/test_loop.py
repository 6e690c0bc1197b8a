"""The one training loop on a toy state: cadences, resume after a kill, the NaN guard, metrics."""

import csv
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.train.checkpoint import Checkpointer
from sera_jax.train.loop import StepAllowance, StopRequested, run_loop
from sera_jax.train.writers import MetricWriter


def _state():
    return {"w": jnp.zeros(3, jnp.float32), "step": jnp.zeros((), jnp.int32)}


def _step(state, step):
    """w <- w + (step + 1): after d steps every entry is d (d + 1) / 2; the loss is NaN from step ``nan_at``."""
    w = state["w"] + (step + 1)
    return {"w": w, "step": state["step"] + 1}, {"loss": jnp.sum(w), "hist": w}


def _evaluate(state, step):
    return {"w0": float(state["w"][0])}, {"eval/w0": float(state["w"][0])}


def _run(directory, num_steps=6, step_fn=_step, **kwargs):
    with Checkpointer(directory, max_to_keep=None) as ckpt:
        out = run_loop(_state(), step_fn, num_steps=num_steps, checkpointer=ckpt, desc="toy", evaluate=_evaluate,
                       show_progress=False, **kwargs)
        return out, ckpt.all_steps()


def test_cadences_of_evaluation_checkpoints_and_metrics(tmp_path):
    out, saved = _run(tmp_path / "c", eval_every=4, save_every=4, save_steps=(0, 5), log_every=2)
    assert saved == [0, 4, 5, 6]  # the asked-for start and stage, every 4, the end
    assert [e["step"] for e in out.evaluations] == [0, 4, 6]  # the start, every 4, the end
    assert [e["w0"] for e in out.evaluations] == [0.0, 10.0, 21.0]
    assert [h["step"] for h in out.history] == [1, 3, 5] and out.history[-1]["loss"] == 3 * 21.0
    assert "hist" not in out.history[0]  # arrays are not scalar metrics
    np.testing.assert_array_equal(out.state["w"], [21.0] * 3)


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    straight, _ = _run(tmp_path / "a", eval_every=2, save_every=2)
    allowance = StepAllowance(3)  # killed before step 3: the checkpoint at 2 is the last one
    with pytest.raises(StopRequested):
        _run(tmp_path / "b", eval_every=2, save_every=2, allowance=allowance)
    resumed, saved = _run(tmp_path / "b", eval_every=2, save_every=2)
    assert resumed.start_step == 2 and saved == [2, 4, 6]
    assert resumed.history == straight.history and resumed.evaluations == straight.evaluations
    np.testing.assert_array_equal(resumed.state["w"], straight.state["w"])
    finished, _ = _run(tmp_path / "b", eval_every=2, save_every=2)  # nothing left: nothing recomputed
    assert finished.start_step == 6 and finished.evaluations == straight.evaluations


def test_a_resumed_run_says_from_which_step(tmp_path, capsys):
    """Progress off (the ``tiny`` configs) or on, a restore prints one line: where it resumes and what is left."""
    allowance = StepAllowance(3)
    with pytest.raises(StopRequested):
        _run(tmp_path / "b", save_every=2, allowance=allowance)
    assert capsys.readouterr().out == ""  # a fresh run restores nothing
    _run(tmp_path / "b", save_every=2)
    assert capsys.readouterr().out == (f"toy: resuming from step 2 of 6 (4 steps to go; checkpoint in "
                                       f"{tmp_path / 'b'})\n")
    _run(tmp_path / "b", save_every=2)
    assert "toy: resuming from step 6 of 6 (nothing left to train;" in capsys.readouterr().out


def _csv_rows(directory):
    with open(directory / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def _tensorboard_scalars(logdir):
    """(tag, step, value) of every scalar TensorBoard shows: event files read in the order they were written,
    and a SessionLog START at step s hiding the earlier files' events at steps >= s (TensorBoard's purge)."""
    from tensorboardX.proto import event_pb2

    files = []
    for f in logdir.iterdir():
        data, pos, events = f.read_bytes(), 0, []
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
            pos += 12 + length + 4
        files.append(events)
    shown = []
    for events in sorted(files, key=lambda evs: evs[0].wall_time):
        for e in events:
            if e.session_log.status == event_pb2.SessionLog.START:
                shown = [s for s in shown if s[1] < e.step]
            shown += [(v.tag, e.step, v.simple_value) for v in e.summary.value]
    return sorted(shown)


@pytest.mark.parametrize("kill_before", [3, 4])  # after the checkpoint at 2 (3: with an evaluation past it)
def test_a_resumed_run_logs_every_row_of_the_uninterrupted_run(tmp_path, kill_before):
    """The evaluation logged at the checkpoint's step survives the resume in the CSV and in TensorBoard."""
    kwargs = dict(eval_every=1, save_every=2)

    def logged_run(directory, allowance=None):
        with MetricWriter(directory) as writer:
            return _run(directory / "ckpt", writer=writer, allowance=allowance, **kwargs)

    logged_run(tmp_path / "a")
    with pytest.raises(StopRequested):
        logged_run(tmp_path / "b", StepAllowance(kill_before))
    logged_run(tmp_path / "b")
    assert _csv_rows(tmp_path / "b") == _csv_rows(tmp_path / "a")
    assert any(r.get("eval/w0") for r in _csv_rows(tmp_path / "a") if r["step"] == "2")  # the row at risk
    assert _tensorboard_scalars(tmp_path / "b" / "tb") == _tensorboard_scalars(tmp_path / "a" / "tb")


def test_a_rerun_with_fewer_steps_than_its_checkpoint_is_refused(tmp_path):
    out, _ = _run(tmp_path / "c", num_steps=4, eval_every=2)
    with pytest.raises(ValueError, match=r"config\.rl\.steps=3, but .* after 4 steps"):
        _run(tmp_path / "c", num_steps=3, eval_every=2, num_steps_field="config.rl.steps")
    again, saved = _run(tmp_path / "c", num_steps=4, eval_every=2)  # nothing was lost
    assert saved == [4] and again.evaluations == out.evaluations


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    def step_fn(state, step):
        new, metrics = _step(state, step)
        return new, {"loss": jnp.where(step == 3, jnp.nan, metrics["loss"])}

    with pytest.raises(FloatingPointError, match=r"toy: non-finite loss at step 3.*last good checkpoint \(step 3\)"):
        _run(tmp_path / "n", step_fn=step_fn, save_every=1)
    with Checkpointer(tmp_path / "n") as ckpt:
        assert ckpt.all_steps() == [1, 2, 3]


def test_a_non_finite_state_is_never_saved(tmp_path):
    def step_fn(state, step):
        new, metrics = _step(state, step)
        w = jnp.where(step == 2, jnp.inf, new["w"])
        return {**new, "w": w}, {"other": metrics["loss"]}  # no loss to check: the state guard catches it

    with pytest.raises(FloatingPointError, match=r"non-finite state after 3 steps.*last good checkpoint \(step 2\)"):
        _run(tmp_path / "s", step_fn=step_fn, save_every=1)


def test_metrics_go_to_the_writer_with_a_prefix(tmp_path):
    (tmp_path / "m").mkdir()
    with MetricWriter(tmp_path / "m", tensorboard=False) as writer:
        _run(tmp_path / "c", eval_every=3, save_every=3, writer=writer, metric_prefix="train/")
    with open(tmp_path / "m" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r["train/loss"]] == list(range(6))
    assert [int(r["step"]) for r in rows if r["eval/w0"]] == [0, 3, 6]
