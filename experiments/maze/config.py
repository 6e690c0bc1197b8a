"""Configs of the maze experiment (SERA.md §8B).

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze

Variants: ``tiny`` (tests, seconds), ``demo`` (the README's reproduction, ~2 minutes), ``cpu`` (a laptop,
tens of minutes: 9x9 mazes, 3 seeds), ``full`` / ``gpu`` (the paper: 17x17 mazes, the 3.9M-parameter
Qwen2-style policy, 256 prompts per step, 256 held-out mazes x 2048 samples) for one 141 GiB H200: planned
peak 70 GiB per device (the update of 4,096 rollouts x 436 tokens in one slice, remat over scanned layers;
``python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --devices=1``).
"""

from __future__ import annotations

import ml_collections

from sera_jax.rl.config import default_rl_config
from sera_jax.train.sharding import default_mesh_config

# What each compared method changes in ``config.sera`` (everything else is shared).
METHODS = {
    "uniform": dict(method="uniform", estimator="maxrl"),  # MaxRL
    "sera": dict(method="sera", estimator="maxrl"),  # SERA with pilot estimates
    "sera_no_correction": dict(method="sera", estimator="maxrl", correction=False),
    "grpo": dict(method="uniform", estimator="grpo"),  # for context
}


def get_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    c = default_rl_config()
    c.variant = variant
    c.seeds = (0, 1, 2)
    c.methods = ("uniform", "sera", "grpo")
    # 7x7 mazes have only 192 distinct layouts: 64 are held out, RL trains on the other 128 (many epochs).
    c.maze = dict(size=7, num_eval=64, data_seed=1234)
    # attention / remat / scan_layers: how the decoder runs (sera_jax.models.decoder.DecoderConfig), not what it is.
    c.model = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=128, dtype="float32",
                   attention="auto", remat="none", scan_layers=False)
    # shared=True: one SFT policy for all seeds (seeds then vary the RL only); False: one SFT per seed.
    c.sft = dict(steps=500, batch_size=32, learning_rate=3e-3, warmup_steps=20, shared=False)
    c.mesh = default_mesh_config()
    c.log = dict(progress=True)
    # MaxRL used lr 1e-4 for its 3.9M-parameter policy; this 30k-parameter one barely moves at 1e-4 (README: 1e-4,
    # 3e-4 and 1e-3 compared).
    c.rl.update(steps=60, prompts_per_step=16, rollouts_per_step=128, learning_rate=3e-4)
    c.sera.update(p_estimate="pilot", pilot_rollouts=2, n_min=2, n_max=64)
    c.eval.update(every=30, samples_per_prompt=64, ks=(1, 2, 4, 8, 16, 32, 64))
    c.ckpt.update(every=30)
    if variant == "tiny":
        c.seeds = (0,)
        c.methods = ("uniform", "sera")
        c.maze.update(size=5, num_eval=2)
        c.model.update(d_model=16, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32)
        c.sft.update(steps=4, batch_size=4, warmup_steps=1)
        c.rl.update(steps=2, prompts_per_step=4, rollouts_per_step=16)
        c.sera.update(n_max=8)
        c.eval.update(every=2, samples_per_prompt=4, ks=(1, 2, 4), max_rollouts_per_call=8)
        c.ckpt.update(every=1)
        c.log.progress = False
    elif variant == "demo":
        c.seeds = (0, 1, 2)
        c.methods = ("uniform", "sera")
        c.maze.update(num_eval=32)
        c.sft.update(steps=400, shared=True)
        c.rl.update(steps=20)
        c.eval.update(every=20, samples_per_prompt=32, ks=(1, 2, 4, 8, 16, 32))
        c.ckpt.update(every=20)
    elif variant in ("gpu", "full"):
        c.maze.update(size=17, num_eval=256)
        c.model = dict(preset="maze_full", dtype="bfloat16", attention="auto", remat="block", scan_layers=True)
        c.sft.update(steps=1500, batch_size=32, learning_rate=5e-4, warmup_steps=50)
        c.rl.update(steps=1000, prompts_per_step=256, rollouts_per_step=256 * 16, learning_rate=1e-4)
        c.sera.update(pilot_rollouts=4, n_min=4, n_max=128)
        c.eval.update(every=100, samples_per_prompt=2048, ks=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
                      max_rollouts_per_call=65536)
        c.ckpt.update(every=50)
    elif variant != "cpu":
        raise ValueError(f"unknown variant {variant!r}; choose tiny, demo, cpu, gpu or full")
    return c
