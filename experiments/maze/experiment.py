"""Maze navigation: MaxRL (uniform) vs SERA at matched training rollouts (docs/method.md §8B).

The experiment as a function, ``run(config, workdir)``, and the calls the memory planner compiles,
``planned_calls(config, devices)``; ``main.py`` is its command line:

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze

Per seed: SFT from scratch on BFS paths (so RL starts with p > 0), or, with ``--config.model.init_dir=DIR``,
the Hugging Face checkpoint in DIR (MaxRL's released ``maze/ckpt-1500`` layout) and no SFT; then RL from that
same policy for each method; unbiased pass@k on held-out mazes (and, with ``eval.bootstrap_repeats``, the SERA
authors' bootstrap pass@k beside it). Writes ``WORKDIR/results.json`` and figures;
a killed run resumes from its checkpoints when started again with the same workdir.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from experiments.maze import config as config_lib
from experiments.maze.task import AUTHORS_DRAW_SEED, MazeTask, hopeless_mix
from sera_jax.envs import maze
from sera_jax.models import decoder
from sera_jax.report import figures as figures_lib
from sera_jax.rl import comparison
from sera_jax.rl import config as rl_config
from sera_jax.rl import evaluation
from sera_jax.train import sharding as sharding_lib
from sera_jax.train.files import write_json_atomic


EXECUTION_FIELDS = ("attention", "remat", "scan_layers")  # how the decoder runs, not what it computes


def build_model(config, seed: int) -> decoder.Decoder:
    """The start model: ``config.model.init_dir``'s checkpoint (``load_start_checkpoint``), else a fresh one."""
    if config.model.init_dir:
        return load_start_checkpoint(config)
    m = dict(config.model)
    m.pop("init_dir")
    dtype = jnp.dtype(m.pop("dtype", "float32"))
    if m.pop("preset", None) == "maze_full":
        cfg = dataclasses.replace(decoder.maze_full(), dtype=dtype, **m)  # m: rope_theta and how it runs
    else:
        cfg = decoder.tiny(vocab_size=maze.VOCAB_SIZE, **m, dtype=dtype, max_seq_len=sequence_length(config))
    return decoder.Decoder(cfg, rngs=nnx.Rngs(seed))


def sequence_length(config) -> int:
    """Longest sequence a run feeds the model: the prompt, then an RL response or an SFT answer."""
    size = config.maze.size
    return maze.prompt_length(size) + max(MazeTask.response_cap(config), maze.answer_length(size))


def load_start_checkpoint(config) -> decoder.Decoder:
    """The policy in ``config.model.init_dir``: a Hugging Face checkpoint laid out as MaxRL's ``maze/ckpt-1500``
    (``config.json``, ``model.safetensors``, ``tokenizer.json``), loaded by ``sera_jax.models.hf_loader`` with
    float32 parameters and ``config.model.dtype`` compute. Raises FileNotFoundError for a missing file and
    ValueError, naming the field, for a vocabulary other than ``sera_jax.envs.maze``'s or too few positions."""
    from sera_jax.models import hf_loader  # only this path needs safetensors

    directory = pathlib.Path(config.model.init_dir).expanduser()
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"config.model.init_dir={str(directory)!r} has no tokenizer.json (expected MaxRL's "
                                "maze/ckpt-1500 layout: config.json, model.safetensors, tokenizer.json)")
    try:
        maze.check_tokenizer_json(json.loads(tokenizer_path.read_text()))
    except ValueError as e:
        raise ValueError(f"config.model.init_dir={str(directory)!r}: {e}") from e
    options = {k: config.model[k] for k in EXECUTION_FIELDS}
    model = hf_loader.load_hf_checkpoint(directory, dtype=config.model.dtype, param_dtype="float32", **options)
    needed = sequence_length(config)
    if model.cfg.max_seq_len < needed:
        raise ValueError(f"config.model.init_dir={str(directory)!r} has max_position_embeddings="
                         f"{model.cfg.max_seq_len} < {needed} (prompt + response at config.maze.size="
                         f"{config.maze.size}, config.maze.max_new_tokens={config.maze.max_new_tokens})")
    if model.cfg.vocab_size != maze.VOCAB_SIZE:
        raise ValueError(f"config.model.init_dir={str(directory)!r} has vocab_size={model.cfg.vocab_size}, "
                         f"not the maze's {maze.VOCAB_SIZE}")
    return model


def start_config(config):
    """The config a run uses: with ``model.init_dir`` the checkpoint is the RL start, so SFT is skipped
    (``sft.steps = 0``, also what ``results.json`` records)."""
    if not config.model.init_dir or not config.sft.steps:
        return config
    logging.info("config.model.init_dir=%s: starting RL from that checkpoint, no SFT (config.sft.steps=0)",
                 config.model.init_dir)
    config = copy.deepcopy(config)
    with config.unlocked():
        config.sft.steps = 0
    return config


def method_config(config, method: str):
    """The shared config with ``config.sera`` changed as ``config_lib.METHODS[method]`` says."""
    return rl_config.method_config(config, config_lib.METHODS, method)


def make_figures(results: dict, config: dict, out_dir: pathlib.Path, prefix: str = "") -> list[pathlib.Path]:
    """Every figure of the experiment from its results and config as saved in ``results.json``."""
    size = config["maze"]["size"]
    return figures_lib.pass_at_k_figures(results, out_dir, prefix=prefix, title=f"Mazes {size}x{size}")


def make_task(config, workdir=None) -> MazeTask:
    """The task of ``config.maze``: an endless stream of training mazes, or ``maze.num_train`` fixed ones
    (generated, or drawn from ``maze.train_parquet`` as the SERA authors draw them); held-out mazes generated or
    from ``maze.eval_parquet``."""
    m = config.maze
    return MazeTask(m.size, m.num_eval, seed=m.data_seed, max_new_tokens=MazeTask.response_cap(config),
                    num_train=MazeTask.train_set_size(config), train_parquet=m.get("train_parquet", ""),
                    draw_seed=m.get("train_draw_seed", AUTHORS_DRAW_SEED), eval_parquet=m.get("eval_parquet", ""),
                    pool_factor=m.get("hard_pool_factor", 1))


def select_hard_mix(config, task: MazeTask, model: nnx.Module, seed: int, start_dir: pathlib.Path,
                    placement: sharding_lib.Placement) -> Optional[dict]:
    """With ``maze.hard_fraction > 0``: the training and held-out sets chosen from their pools by the start policy,
    ``hard_fraction`` of each hopeless for it (no success in ``maze.hard_samples`` samples: p below 1 / n_max when
    hard_samples >= n_max), ``maze.easy_fraction`` (if set) the pool's most solved ones, and the rest neither; the
    counts cached in ``start_dir/hard_mix.json`` so a resumed run
    chooses the same sets without sampling. Returns the choice's summary (``results.json``'s ``start_profile``)."""
    m = config.maze
    fraction = m.get("hard_fraction", 0.0)
    if not fraction:
        return None
    path = start_dir / "hard_mix.json"
    if path.is_file():
        counts = json.loads(path.read_text())
        pools = {"samples": m.hard_samples, "train": len(task.train_set), "heldout": len(task.heldout)}
        cached = {"samples": counts["samples"], "train": len(counts["train"]), "heldout": len(counts["heldout"])}
        if cached != pools:
            raise ValueError(f"{path} counts {cached}, but this config's pools and samples are {pools} "
                             "(config.maze.hard_pool_factor, hard_samples): move the file away to count again")
    else:
        def count(grids, what):
            return evaluation.success_counts(
                model, task, lambda keys: task.prompt_batch_of(grids, keys), len(grids), m.hard_samples,
                seed=seed, rows_per_call=config.eval.max_rollouts_per_call, shard_fn=placement.batch,
                temperature=config.rl.temperature, desc=f"hard mix: {what}", show_progress=config.log.progress).tolist()

        counts = {"samples": m.hard_samples, "train": count(task.train_set, "training pool"),
                  "heldout": count(task.heldout, "held-out pool")}
        if jax.process_index() == 0:
            write_json_atomic(path, counts)
    easy = m.get("easy_fraction", 0.0)
    chosen = {k: hopeless_mix(np.asarray(counts[k]), size, fraction, f"config.maze.hard_fraction ({name})", easy)
              for k, size, name in (("train", m.num_train, "training"), ("heldout", m.num_eval, "held-out"))}
    summary = {"hard_fraction": fraction, "samples": counts["samples"], "pool_factor": task.pool_factor,
               "pool_hopeless_fraction": {k: float(np.mean(np.asarray(counts[k]) == 0)) for k in ("train", "heldout")},
               "start_p_selected_mean": {k: float(np.mean(np.asarray(counts[k])[chosen[k]]) / counts["samples"])
                                         for k in ("train", "heldout")}}
    if easy:  # the most solved share: the least successes among them says how easy they are
        summary["easy_fraction"] = easy
        summary["easy_min_successes"] = {k: int(np.sort(np.asarray(counts[k]))[::-1][int(round(easy * size)) - 1])
                                         for k, size in (("train", m.num_train), ("heldout", m.num_eval))}
    train, heldout = chosen["train"], chosen["heldout"]
    task.select(train, heldout, summary)
    logging.info("hard mix: %s", summary)
    return summary


# The endless stream's experiment (the default, maze.num_train = 0); ``experiment_for`` gives any config's.
EXPERIMENT = comparison.Experiment(
    name="maze", methods=config_lib.METHODS, reference_config=config_lib.get_config, make_task=make_task,
    build_model=lambda config, task, seed, mesh: build_model(config, seed), make_figures=make_figures,
    endless_task=True, knows_success_rates=MazeTask.knows_success_rates,
    describe_task=lambda config, task: task.describe(), profile_start=select_hard_mix)


def experiment_for(config) -> comparison.Experiment:
    """``EXPERIMENT`` for ``config``'s training mazes: endless unless ``maze.num_train > 0`` (a fixed set, so
    history estimates are allowed); a bad ``maze.num_train`` or data or evaluation field
    (``config_lib.validate_config``) fails here, naming the field, before any work."""
    config_lib.validate_config(config)
    return dataclasses.replace(EXPERIMENT, endless_task=not MazeTask.train_set_size(config))


def run(config, workdir: str | pathlib.Path, *, stop_after: Optional[int] = None) -> Optional[dict]:
    """Runs (or resumes) the comparison of ``config.methods``; returns the results (None if ``stop_after``
    optimizer steps stopped it first, as a kill would)."""
    return comparison.run_comparison(experiment_for(config), start_config(config), workdir, stop_after=stop_after)


def planned_calls(config, devices=None) -> list:
    """The jitted calls of a run of ``config`` with abstract arguments (``python -m experiments.plan``), laid
    over ``devices`` (default: JAX's)."""
    from sera_jax.rl.memory import planned_rl_calls

    config = start_config(config)
    settings, sft = comparison.planning_settings(experiment_for(config), config)
    size = config.maze.size
    return planned_rl_calls(lambda: build_model(config, 0), settings, mesh_config=config.mesh,
                            prompt_len=maze.prompt_length(size), max_new_tokens=MazeTask.response_cap(config),
                            num_stop_tokens=len(MazeTask.stop_tokens), sft=sft, sft_answer_len=maze.answer_length(size),
                            devices=devices)
