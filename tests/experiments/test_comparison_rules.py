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
