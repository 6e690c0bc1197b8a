"""scripts/active_set_forecast.py: the released rule's epoch-1 active fraction of a maze set, from the start counts."""

import importlib.util
import json
import pathlib

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "active_set_forecast", pathlib.Path(__file__).resolve().parents[1] / "scripts" / "active_set_forecast.py")
forecast = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(forecast)


def test_one_step_drops_what_the_rule_drops():
    # The step of docs/method.md §3.4: a near-certain maze (126 of 128) beside three hopeless ones takes two of them
    # out; with 100 in its place every maze is served.
    def share(successes):
        return forecast.epoch1_active_fraction(successes, 128, prompts_per_step=8, n_max=512, orders=1)

    assert share([0, 0, 0, 126, 91, 60, 110, 30]) == 6 / 8
    assert share([0, 0, 0, 100, 91, 60, 110, 30]) == 1.0
    with pytest.raises(ValueError, match="7 mazes do not fill steps of 8"):
        share([0] * 7)


def test_the_command_line_chooses_the_set_as_a_run_would(tmp_path, capsys):
    # A pool of 16: 4 hopeless, 2 near-certain, the rest mid-rate. A set of 8 with 3 hopeless and 1 easy is one step.
    pool = [0, 50, 0, 127, 60, 0, 70, 126, 0, 80, 90, 40, 30, 20, 10, 55]
    path = tmp_path / "hard_mix.json"
    path.write_text(json.dumps({"samples": 128, "train": pool, "heldout": pool}))
    assert forecast.main([str(path), "--num_train=8", "--hard=0.375", "--easy=0.125"]) == 0
    assert "epoch-1 active fraction 0.750" in capsys.readouterr().out
