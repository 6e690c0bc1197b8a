"""Rules both RL comparisons (maze, math) share through ``sera_jax.rl.comparison``, checked on each."""

import pytest

from experiments.math_reasoning import config as math_config
from experiments.math_reasoning import main as math_main
from experiments.maze import config as maze_config
from experiments.maze import experiment as maze_main

EXPERIMENTS = {"maze": (maze_config, maze_main), "math_reasoning": (math_config, math_main)}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_oracle_estimates_are_refused_before_any_work(tmp_path, name):
    config_lib, main_lib = EXPERIMENTS[name]
    config = config_lib.get_config("tiny")
    config.sera.p_estimate = "oracle"  # neither task knows p under the policy
    with pytest.raises(ValueError, match=r"config\.sera\.p_estimate='oracle'.*cannot give the true success rates"):
        main_lib.run(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_field_but_the_declared_ones_is_in_the_fingerprint(name):
    from sera_jax.rl.comparison import MAY_CHANGE, rl_fingerprint

    config = EXPERIMENTS[name][0].get_config("tiny")
    fingerprint = rl_fingerprint(config, getattr(EXPERIMENTS[name][1], "LOCATIONS", ()))
    for field in ("rl.weight_decay", "rl.grad_clip", "rl.b1", "rl.b2", "rl.top_p", "rl.learning_rate",
                  "rl.temperature", "sera.method", "sera.n_max", "model.d_model", "sft.steps"):
        assert field in fingerprint, field
    assert not any(k == m or k.startswith(m + ".") for k in fingerprint for m in MAY_CHANGE)


def _run(seed: int, spent: int, final: float) -> dict:
    return {"seed": seed, "rollouts_spent": spent, "history": [{"step": 0, "loss": final}],
            "evaluations": [{"step": 1, "k": [1], "pass_at_k": [final]}]}


def test_a_rerun_keeps_the_seeds_and_methods_it_does_not_rerun():
    from sera_jax.rl.comparison import with_earlier_runs

    earlier = {"uniform": [_run(0, 32, 0.1), _run(1, 32, 0.2), _run(2, 32, 0.3)],
               "grpo": [_run(0, 32, 0.4), _run(1, 16, 0.5)]}  # grpo seed 1: a shorter run
    now = {"uniform": [_run(1, 32, 0.25)]}  # this invocation reran uniform seed 1 only
    merged, kept = with_earlier_runs(now, earlier, rollouts_spent=32)
    assert [(r["seed"], r["evaluations"][0]["pass_at_k"][0]) for r in merged["uniform"]] == \
        [(0, 0.1), (1, 0.25), (2, 0.3)]  # the rerun replaces its own seed only
    assert [r["seed"] for r in merged["grpo"]] == [0]  # a run of another length is not pooled
    assert kept == ["uniform/0", "uniform/2", "grpo/0"]

