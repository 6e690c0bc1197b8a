"""The memory planner's command line (python -m experiments.plan) on the tiny configs, and each experiment's
planned calls; the library it hands them to (sera_jax.train.plan) is tested in tests/train/test_plan.py."""

import pathlib
import re
import subprocess
import sys

import pytest

from experiments import plan as plan_cli

REPO = pathlib.Path(__file__).resolve().parents[2]
MAZE = "experiments/maze/config.py:tiny"


def _plan(*args, module="experiments.plan"):
    # The planner replaces conftest's device count with its --devices (plan.with_host_device_count).
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_every_call_is_planned_on_the_mesh():
    ok = _plan(f"--config={MAZE}", "--devices=2", "--device_memory=1GiB")
    assert ok.returncode == 0, ok.stderr[-2000:]
    for name in ("pilot sampling", "rollout sampling", "evaluation sampling", "update", "sft step"):
        assert name in ok.stdout
    assert "on 2 device(s)" in ok.stdout and "fits" in ok.stdout and "XLA:CPU buffer assignment" in ok.stdout


def test_the_saved_plans_command_runs_this_command_line_and_a_peak_over_memory_fails():
    """``python -m sera_jax.train.plan``, the command every saved plan (results/plans/*.txt) records and
    scripts/refresh_plans.sh reruns as recorded, hands its arguments here: the same table and exit status."""
    tight = _plan(f"--config={MAZE}", "--devices=1", "--device_memory=64KiB", "--only", "update",
                  module="sera_jax.train.plan")
    assert tight.returncode == 1 and "DOES NOT FIT" in tight.stdout and "> device memory" in tight.stdout, \
        tight.stderr[-2000:]


def test_bad_flags_are_named():
    bad = _plan(f"--config={MAZE}", "--device_memory=lots")
    assert bad.returncode == 2 and "--device_memory='lots'" in bad.stderr


@pytest.mark.parametrize("name", ["maze", "math_reasoning", "imagenet_alignment"])
def test_every_experiment_is_planned_from_its_experiment_module(name):
    """One shape for every experiment: ``experiment.py`` holds ``run`` and ``planned_calls``, the planner reads
    the latter there (found through the registry, ``experiments.EXPERIMENTS``), and ``main.py`` is only the
    command line over ``experiment.run``."""
    import importlib

    import experiments

    module = plan_cli.experiment_of(f"experiments/{name}/config.py")
    assert module.__name__ == experiments.EXPERIMENTS[name] == f"experiments.{name}.experiment"
    assert callable(module.planned_calls) and callable(module.run)
    main = importlib.import_module(f"experiments.{name}.main")
    assert main.run is module.run and not hasattr(main, "planned_calls")


def test_the_registry_names_every_experiment_folder():
    """``experiments.EXPERIMENTS`` is the one list of experiments: every folder with a config.py has its line, each
    naming that folder's experiment module, and importing the package imports none of them."""
    import experiments

    folders = {p.parent.name for p in (REPO / "experiments").glob("*/config.py")}
    assert set(experiments.EXPERIMENTS) == folders
    assert experiments.EXPERIMENTS == {name: f"experiments.{name}.experiment" for name in folders}
    unknown = f"unknown experiment 'mazes'; known experiments: {sorted(folders)}"
    with pytest.raises(ValueError, match=re.escape(unknown)):
        experiments.experiment_module("mazes")


def test_an_unknown_or_unplanned_experiment_is_refused_by_name(tmp_path, monkeypatch):
    """A config whose folder the registry does not name is refused with the known experiments listed (the planner
    looks the name up; it does not probe for a module); a registered one without ``planned_calls`` is named."""
    import experiments

    (tmp_path / "bare").mkdir()
    config = str(tmp_path / "bare" / "config.py")
    known = sorted(experiments.EXPERIMENTS)
    with pytest.raises(ValueError, match=re.escape(f"--config={config}: no experiment named 'bare' in "
                                                   f"experiments.EXPERIMENTS (experiments/__init__.py) to plan from; "
                                                   f"known experiments: {known}")):
        plan_cli.experiment_of(config)
    (tmp_path / "unplanned_experiment_module.py").write_text("def run(config, workdir):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(experiments.EXPERIMENTS, "unplanned", "unplanned_experiment_module")
    (tmp_path / "unplanned").mkdir()
    config = str(tmp_path / "unplanned" / "config.py")
    try:
        with pytest.raises(ValueError, match=re.escape(f"--config={config}: unplanned_experiment_module "
                                                       "(experiments.EXPERIMENTS['unplanned']) defines no "
                                                       "planned_calls(config, devices)")):
            plan_cli.experiment_of(config)
    finally:
        sys.modules.pop("unplanned_experiment_module", None)


@pytest.mark.parametrize("experiment, variant", [("maze", "tiny"), ("math_reasoning", "tiny"),
                                                 ("imagenet_alignment", "tiny")])
def test_planned_calls_lie_on_the_devices_they_are_given(experiment, variant):
    """Every experiment lays its calls' arguments over the devices passed in (the planner passes a GPU's or TPU's
    compile-only devices), not over jax.devices(): here the last 2 (or 1) of the suite's 8 CPU devices."""
    import importlib

    import jax

    import experiments

    config = importlib.import_module(f"experiments.{experiment}.config").get_config(variant)
    module = experiments.experiment_module(experiment)
    for devices in (jax.devices()[-2:], jax.devices()[-1:]):
        calls = module.planned_calls(config, devices)
        assert calls, experiment
        for call in calls:
            for leaf in jax.tree.leaves(call.args):
                sharding = getattr(leaf, "sharding", None)
                if sharding is not None:
                    assert set(sharding.device_set) <= set(devices), (experiment, call.name, sharding)


def test_config_overrides_are_applied_as_a_runs_command_line_would(capsys):
    from experiments.maze import config as maze_config

    config = maze_config.get_config("tiny")
    plan_cli.apply_overrides(config, ["--config.rl.sample_slots=128", "--config.mesh.shape=(1, 8, 1)",
                                      "--config.rl.learning_rate=3e-5", "--config.model.dtype=bfloat16"])
    assert (config.rl.sample_slots, tuple(config.mesh.shape)) == (128, (1, 8, 1))
    assert config.rl.learning_rate == 3e-5 and config.model.dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"--config.rl.no_such_field=1: the config has no field 'rl.no_such_field'"):
        plan_cli.apply_overrides(config, ["--config.rl.no_such_field=1"])
    with pytest.raises(ValueError, match=r"--config.rl.sample_slots=many"):
        plan_cli.apply_overrides(config, ["--config.rl.sample_slots=many"])
    # On the command line (in-process over conftest's 8 CPU devices): a usage error naming the field.
    with pytest.raises(SystemExit) as exit_info:
        plan_cli.main(["--config=experiments/maze/config.py:tiny", "--devices=8", "--config.rl.nope=1"])
    assert exit_info.value.code == 2
    assert "the config has no field 'rl.nope'" in capsys.readouterr().err


def test_the_sampling_calls_are_planned_with_the_configs_decoding_slots():
    """rl.sample_slots / eval.sample_slots reach the planned samplers (the sampler's own tests check that its
    response caches are the slots'; compiling both here would double this file's time)."""
    from experiments.maze import config as maze_config
    from experiments.maze import experiment as maze_experiment

    config = maze_config.get_config("tiny")
    config.rl.sample_slots, config.eval.sample_slots = 2, 4
    calls = {c.name: c for c in maze_experiment.planned_calls(config)}
    for name, slots, rows in (("pilot sampling", 2, 8), ("rollout sampling", 2, 8), ("evaluation sampling", 4, 8)):
        assert calls[name].fn._fn.keywords["num_slots"] == slots, name
        assert f"{slots} slots refilled over the {rows} rows" in calls[name].note, calls[name].note
    config.rl.sample_slots = config.eval.sample_slots = 0
    calls = {c.name: c for c in maze_experiment.planned_calls(config)}
    assert calls["rollout sampling"].fn._fn.keywords["num_slots"] is None
    assert "8 slots x" in calls["rollout sampling"].note


@pytest.mark.parametrize("config, platform, kernel, devices", [
    (MAZE, "tpu", "tpu_custom_call", 1),  # the Pallas TPU flash kernel, lowered through Mosaic
    # Rows over a 2-device data axis: the kernel under shard_map (the compiler cannot partition a Mosaic kernel).
    (MAZE, "tpu", "tpu_custom_call", 2),
    (MAZE, "cuda", None, 1),  # float32: "auto" is blockwise on CUDA too (cuDNN takes only bf16/f16)
    ("experiments/math_reasoning/config.py:tiny", "tpu", "tpu_custom_call", 1),
    ("experiments/imagenet_alignment/config.py:tiny", "tpu", None, 1),  # a ResNet: no attention
])
def test_every_program_of_a_tiny_config_lowers_for_the_platform(config, platform, kernel, devices):
    out = _plan(f"--config={config}", f"--devices={devices}", f"--platform={platform}")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ok_lines = [line for line in out.stdout.splitlines() if line.startswith("OK ")]
    assert ok_lines and "FAILED" not in out.stdout
    assert f"lowered for {platform}: {len(ok_lines)} of {len(ok_lines)} programs" in out.stdout
    update = next(line for line in ok_lines if " update " in line or " ce step " in line)
    assert (kernel in update) if kernel else ("custom calls: none" in update), update


def test_an_allocator_that_samples_in_rounds_is_planned_with_its_round_rows():
    """Reinforce-Ada's rounds sample P x sera.round_size rows a call (padded), not the step's budget at once."""
    from experiments.maze import config as maze_config
    from experiments.maze import experiment as maze_experiment

    config = maze_config.get_config("tiny")
    config.sera.update(method="reinforce_ada", round_size=1)
    P, B = config.rl.prompts_per_step, config.rl.rollouts_per_step
    assert P != B
    calls = {c.name: c for c in maze_experiment.planned_calls(config)}
    assert "pilot sampling" not in calls
    assert calls["rollout sampling"].args[3].shape == (P,)
    assert f"{P} of {B} rows per call" in calls["rollout sampling"].note


@pytest.mark.parametrize("experiment", ["maze", "math_reasoning"])
def test_a_plan_parses_the_runs_settings_as_its_door_would(experiment):
    # The planner lays out parsed settings (comparison.planning_settings): a field a run would refuse is refused
    # before anything is laid out, with the run's message; so is a bad SFT field.
    import importlib

    config_lib = importlib.import_module(f"experiments.{experiment}.config")
    module = importlib.import_module(f"experiments.{experiment}.experiment")
    bad = config_lib.get_config("tiny")
    bad.rl.learning_rate = -1.0
    with pytest.raises(ValueError, match=r"config.rl.learning_rate=-1.0: must be a finite number > 0"):
        module.planned_calls(bad)
    bad = config_lib.get_config("tiny")
    bad.sft.batch_size = 0
    with pytest.raises(ValueError, match=r"config.sft.batch_size=0: must be an int >= 1"):
        module.planned_calls(bad)
