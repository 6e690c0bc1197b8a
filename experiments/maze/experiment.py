"""Maze navigation: MaxRL (uniform) vs SERA at matched training rollouts (SERA.md §8B).

The experiment as a function, ``run(config, workdir)``; ``main.py`` is its command line:

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze

Per seed: SFT from scratch on BFS paths (so RL starts with p > 0), then RL from that same policy for each
method; unbiased pass@k on held-out mazes. Writes ``WORKDIR/results.json`` and figures; a killed run
resumes from its checkpoints when started again with the same workdir.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

import jax.numpy as jnp
from flax import nnx

from experiments.maze import config as config_lib
from experiments.maze.task import MazeTask
from sera_jax.envs import maze
from sera_jax.models import decoder
from sera_jax.report import figures as figures_lib
from sera_jax.rl import comparison
from sera_jax.rl import config as rl_config


def build_model(config, seed: int) -> decoder.Decoder:
    m = dict(config.model)
    dtype = jnp.dtype(m.pop("dtype", "float32"))
    if m.pop("preset", None) == "maze_full":
        cfg = dataclasses.replace(decoder.maze_full(), dtype=dtype, **m)  # m: how it runs (attention, remat)
    else:
        cfg = decoder.tiny(vocab_size=maze.VOCAB_SIZE, **m, dtype=dtype,
                           max_seq_len=maze.prompt_length(config.maze.size) + maze.answer_length(config.maze.size))
    return decoder.Decoder(cfg, rngs=nnx.Rngs(seed))


def method_config(config, method: str):
    """The shared config with ``config.sera`` changed as ``config_lib.METHODS[method]`` says."""
    return rl_config.method_config(config, config_lib.METHODS, method)


def make_figures(results: dict, config: dict, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """Every figure of the experiment from its results and config as saved in ``results.json``."""
    size = config["maze"]["size"]
    return figures_lib.pass_at_k_figures(results, out_dir, prefix=prefix, title=f"Mazes {size}x{size}")


EXPERIMENT = comparison.Experiment(
    name="maze", methods=config_lib.METHODS, reference_config=config_lib.get_config,
    make_task=lambda config, workdir: MazeTask(config.maze.size, config.maze.num_eval, seed=config.maze.data_seed),
    build_model=lambda config, task, seed, mesh: build_model(config, seed), make_figures=make_figures,
    endless_task=True, knows_success_rates=MazeTask.knows_success_rates)


def run(config, workdir: str | pathlib.Path, *, stop_after: Optional[int] = None) -> Optional[dict]:
    """Runs (or resumes) the comparison of ``config.methods``; returns the results (None if ``stop_after``
    optimizer steps stopped it first, as a kill would)."""
    return comparison.run_comparison(EXPERIMENT, config, workdir, stop_after=stop_after)


def planned_calls(config) -> list:
    """The jitted calls of a run of ``config`` with abstract arguments (``python -m sera_jax.train.plan``)."""
    from sera_jax.rl.memory import planned_rl_calls

    size = config.maze.size
    return planned_rl_calls(lambda: build_model(config, 0), config, prompt_len=maze.prompt_length(size),
                            max_new_tokens=maze.answer_length(size), num_stop_tokens=len(MazeTask.stop_tokens),
                            sft_answer_len=maze.answer_length(size))
