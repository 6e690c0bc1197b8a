"""How the RL trainer is split: the step in ``trainer``, its metrics in ``metrics``, evaluation in ``evaluation``,
sampling and scoring in ``rollouts``, the records they share in ``context``. The modules below the trainer never
import it, the names callers import from ``trainer`` are still there, and the metrics read the allocator they are
handed (the run's ``RLContext.allocator``), not the registry."""

import ast
import dataclasses
import pathlib

import jax.numpy as jnp

import sera_jax.core as core
from sera_jax.rl import context, evaluation, metrics, rollouts
from sera_jax.rl import trainer as T
from sera_jax.rl.config import default_rl_config

RL = pathlib.Path(__file__).resolve().parents[2] / "sera_jax" / "rl"


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_modules_below_the_trainer_do_not_import_it():
    for name in ("context", "rollouts", "metrics", "evaluation"):
        assert "sera_jax.rl.trainer" not in _imports(RL / f"{name}.py"), name


def test_the_names_callers_import_from_the_trainer_are_the_moved_ones():
    moved = {"evaluate": evaluation, "step_metrics": metrics, "weight_metrics": metrics,
             "allocation_metrics": metrics, "scale_inputs": metrics, "task_reward_metrics": metrics,
             "sample_rollouts": rollouts, "score_rollouts": rollouts, "take_prompts": rollouts, "pad_prompts": rollouts,
             "RLContext": context, "Rollouts": context, "Estimate": context}
    for name, module in moved.items():
        assert getattr(T, name) is getattr(module, name), name
    assert "allocator" in {f.name for f in dataclasses.fields(T.RLContext)}


def test_allocation_metrics_read_the_waterline_of_the_allocator_they_are_given():
    """``config.sera.method`` says "sera"; the allocator handed in decides whether a waterline is logged."""
    config = default_rl_config()
    config.rl.update(prompts_per_step=2, rollouts_per_step=8)
    successes_P, counts_P = jnp.asarray([1.0, 0.0]), jnp.asarray([4, 4], jnp.int32)
    estimate = context.Estimate(jnp.asarray([0.2, 0.5], jnp.float32), None)
    uniform = core.get_allocator("uniform")
    assert "waterline_tau" not in metrics.allocation_metrics(config, uniform, successes_P, counts_P, estimate)
    with_level = dataclasses.replace(uniform, waterline_fn=lambda p, budget, **kw: jnp.float32(0.25))
    m = metrics.allocation_metrics(config, with_level, successes_P, counts_P, estimate)
    assert float(m["waterline_tau"]) == 0.25 and m["cold_start"] == 0.0
    assert float(m["useful_group_fraction"]) == 0.5 and float(m["all_fail_group_fraction"]) == 0.5  # 1 of 4, 0 of 4
