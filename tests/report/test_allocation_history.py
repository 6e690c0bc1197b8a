"""A summary keeps the allocation diagnostics of every step (sera_jax.report.stats.allocation_by_step), through a
round trip from results.json, and a step counts the prompts it dropped by side (sera_jax.rl.metrics)."""

import jax.numpy as jnp
import numpy as np

from sera_jax.report import stats
from sera_jax.rl.metrics import dropped_prompts


def _history(steps):
    return [{"step": s, "loss": 0.1, "active_frac": 1.0 - s / 100, "useful_group_fraction": 0.5, "rollouts_sampled": 8}
            for s in range(steps)]


def test_every_step_is_kept_though_the_history_is_thinned():
    run = {"seed": 3, "history": _history(50), "evaluations": [], "rollouts_spent": 400}
    summary = stats.summarize_runs({"m": [run]})["methods"]["m"]["history"][0]
    assert len(summary["steps"]) < 50
    assert summary["allocation"]["steps"] == list(range(50))
    np.testing.assert_allclose(summary["allocation"]["active_frac"], [1.0 - s / 100 for s in range(50)])
    assert "loss" not in summary["allocation"] and "all_pass_group_fraction" not in summary["allocation"]
    # Read back from a results.json and summarised again (a comparison pooling earlier seeds): still every step.
    again = stats.summarize_runs(stats.runs_from_summary({"methods": {"m": {
        "seeds": [3], "train_rollouts": [400], "curves": [{"seed": 3, "evaluations": []}],
        "history": [summary]}}}))["methods"]["m"]["history"][0]
    assert again["allocation"] == summary["allocation"]


def test_a_sparsely_logged_history_has_no_allocation_by_step():
    assert stats.allocation_by_step(_history(10)[::2]) is None
    assert "allocation" not in stats.summarize_history({"seed": 0, "history": _history(10)[::2]})


def test_dropped_prompts_by_the_side_of_their_estimate():
    counts = jnp.array([0, 4, 0, 0, 2])
    p_hat = jnp.array([0.01, 0.01, 0.99, 0.49, 0.5])
    m = dropped_prompts(counts, p_hat)
    assert (float(m["dropped_hard"]), float(m["dropped_easy"])) == (2.0, 1.0)


def test_a_step_without_estimates_logs_no_prompt_dropped_so_every_step_has_the_counts():
    # Epoch 0 of epoch estimates (and uniform at every step) allocates without estimates: every prompt is sampled,
    # and the step says so, so that a run's every step carries dropped_hard / dropped_easy into its summary.
    import sera_jax.core as core
    from sera_jax.rl.config import default_rl_config
    from sera_jax.rl.context import Estimate
    from sera_jax.rl.metrics import allocation_metrics
    from sera_jax.rl.settings import parse_run_settings

    config = default_rl_config()
    config.rl.update(prompts_per_step=4, rollouts_per_step=16)
    config.sera.update(n_max=8)
    settings = parse_run_settings(config, endless=False, knows_success_rates=False)
    counts, successes = jnp.array([4, 4, 4, 4]), jnp.array([0, 1, 4, 2])
    cold = allocation_metrics(settings, core.get_allocator("uniform"), successes, counts, Estimate(None, None))
    assert (float(cold["dropped_hard"]), float(cold["dropped_easy"])) == (0.0, 0.0)
    steps = [{"step": s, "active_frac": 1.0, "dropped_hard": 0.0, "dropped_easy": float(s == 2)} for s in range(3)]
    assert stats.allocation_by_step(steps)["dropped_easy"] == [0.0, 0.0, 1.0]
