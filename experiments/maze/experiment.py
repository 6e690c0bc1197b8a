"""Maze navigation: MaxRL (uniform) vs SERA at matched training rollouts (SERA.md §8B).

The experiment as a function, ``run(config, workdir)``; ``main.py`` is its command line:

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze

Per seed: SFT from scratch on BFS paths (so RL starts with p > 0), then RL from that same policy for each
method; unbiased pass@k on held-out mazes. Writes ``WORKDIR/results.json`` and figures; a killed run
resumes from its checkpoints when started again with the same workdir.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
from flax import nnx

from experiments.maze import config as config_lib
from experiments.maze.task import MazeTask
from sera_jax.envs import maze
from sera_jax.models import decoder
from sera_jax.rl import results as results_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.rl.sft import run_sft
from sera_jax.rl.trainer import RLTrainer
from sera_jax.train import config_utils
from sera_jax.train import sharding as sharding_lib
from sera_jax.train.workdir import claim_workdir, prepare_workdir
from sera_jax.train.writers import MetricWriter, print_summary, write_results_json

# Fields whose change makes the workdir's checkpoints meaningless (rl.steps is left out: raising it continues;
# seeds, methods and evaluation settings may change too).
FINGERPRINT_FIELDS = ("maze.size", "maze.data_seed", "model", "sft", "rl", "sera")
FINGERPRINT_EXCLUDE = ("rl.steps", "rl.sample_chunk", "rl.update_microbatches")  # memory knobs may change too


def build_model(config, seed: int) -> decoder.Decoder:
    m = dict(config.model)
    dtype = jnp.dtype(m.pop("dtype", "float32"))
    if m.pop("preset", None) == "maze_full":
        cfg = decoder.maze_full()
        cfg = decoder.DecoderConfig(**{**cfg.__dict__, "dtype": dtype})
    else:
        cfg = decoder.tiny(vocab_size=maze.VOCAB_SIZE, **m, dtype=dtype,
                           max_seq_len=maze.prompt_length(config.maze.size) + maze.answer_length(config.maze.size))
    return decoder.Decoder(cfg, rngs=nnx.Rngs(seed))


def method_config(config, method: str):
    """The shared config with ``config.sera`` changed as ``config_lib.METHODS[method]`` says."""
    return trainer_lib.method_config(config, config_lib.METHODS, method)


def run(config, workdir: str | pathlib.Path) -> dict:
    config_utils.check_no_unknown_fields(config, config_lib.get_config(config.variant))
    placement = sharding_lib.make_placement(config.mesh)  # RL's rollouts split over all devices (SFT on one)
    for method in config.methods:  # unknown methods and rows that do not split: fail before any training
        trainer_lib.check_rows_split(method_config(config, method), placement.num_batch_shards)
    workdir = prepare_workdir(workdir)
    fingerprint = config_utils.fingerprint(config, FINGERPRINT_FIELDS, exclude=FINGERPRINT_EXCLUDE)
    claim_workdir(workdir, fingerprint)
    task = MazeTask(config.maze.size, config.maze.num_eval, seed=config.maze.data_seed)
    runs: dict[str, list[dict]] = {m: [] for m in config.methods}
    sft_logs = {}
    for seed in config.seeds:
        seed_dir = workdir / f"seed_{seed}"
        sft_seed = config.seeds[0] if config.sft.shared else seed
        sft_dir = workdir / f"seed_{sft_seed}" / "sft"
        with MetricWriter(sft_dir) as writer:
            model, sft_logs[sft_seed] = run_sft(
                build_model(config, sft_seed), lambda step: task.sft_batch(step, config.sft.batch_size),
                steps=config.sft.steps, learning_rate=config.sft.learning_rate, warmup_steps=config.sft.warmup_steps,
                workdir=sft_dir, writer=writer, show_progress=config.log.progress)
        sft_state = nnx.state(model)
        for method in config.methods:
            run_dir = seed_dir / method
            policy = build_model(config, seed)
            nnx.update(policy, sft_state)  # every method starts from the same SFT policy
            with MetricWriter(run_dir) as writer:
                trainer = RLTrainer(task, policy, method_config(config, method), run_dir, seed=seed, writer=writer,
                                    placement=placement, fingerprint=fingerprint)
                trainer.restore()
                runs[method].append({"seed": seed, **trainer.train(show_progress=config.log.progress)})
    results = results_lib.summarize_runs(runs)
    results["sft_final_loss"] = {str(s): log[-1]["loss"] if log else None for s, log in sft_logs.items()}
    write_results_json(workdir, results, config)
    make_figures(results, config_utils.config_to_dict(config), workdir)
    print_summary({m: r["pass_at_k"]["mean"] for m, r in results["methods"].items()}, title="pass@k (mean over seeds)")
    return results


def make_figures(results: dict, config: dict, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """Every figure of the experiment from its results and config as saved in ``results.json``."""
    size = config["maze"]["size"]
    return results_lib.pass_at_k_figures(results, out_dir, prefix=prefix, title=f"Mazes {size}x{size}")
