"""Supervised fine-tuning of a decoder on (prompt, answer) pairs, loss on answer tokens only.

Used to give RL a starting policy with p > 0 (MaxRL's maze SFT on BFS paths, the arithmetic SFT on
worked solutions). The batch for step k is ``batch_fn(k)``, a deterministic function of the step, so a
resumed run sees the same data.
"""

from __future__ import annotations

import pathlib
from typing import Callable, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sera_jax.rl import step as step_lib
from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train.loop import StepAllowance, run_loop
from sera_jax.train.writers import MetricWriter


class SFTBatch(NamedTuple):
    prompt_tokens_BxT: np.ndarray  # left-padded
    prompt_lengths_B: np.ndarray
    answer_tokens_BxR: np.ndarray  # right-padded
    answer_lengths_B: np.ndarray


def sft_sequence_batch(batch: SFTBatch) -> step_lib.SequenceBatch:
    """Answer-token mean: every answer token of the batch weighs ``1 / (number of answer tokens)``."""
    n = batch.answer_tokens_BxR.shape[1]
    mask = jnp.arange(n)[None, :] < jnp.asarray(batch.answer_lengths_B)[:, None]
    weights = mask / jnp.maximum(jnp.sum(mask), 1)
    return step_lib.sequence_batch(jnp.asarray(batch.prompt_tokens_BxT), jnp.asarray(batch.prompt_lengths_B),
                                   jnp.asarray(batch.answer_tokens_BxR), mask, weights)


SCHEDULES = ("cosine", "constant")


def sft_optimizer(learning_rate: float, steps: int, warmup_steps: int, b1: float, b2: float,
                  weight_decay: float, schedule: str = "cosine") -> optax.GradientTransformation:
    """AdamW with ``schedule``: ``cosine`` (linear warm-up then cosine decay to 10%) or ``constant`` (linear
    warm-up, none when ``warmup_steps`` is 0, then the constant ``learning_rate``)."""
    if schedule == "cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup_steps, 1), max(steps, 2),
                                                end_value=0.1 * learning_rate)
    elif schedule == "constant":
        lr = (optax.warmup_constant_schedule(0.0, learning_rate, warmup_steps) if warmup_steps
              else optax.constant_schedule(learning_rate))
    else:
        raise ValueError(f"config.sft.schedule={schedule!r}: must be one of {list(SCHEDULES)}")
    return step_lib.make_optimizer(lr, b1=b1, b2=b2, weight_decay=weight_decay)


def run_sft(model: nnx.Module, batch_fn: Callable[[int], SFTBatch], *, steps: int, learning_rate: float,
            workdir: str | pathlib.Path, b1: float = 0.9, b2: float = 0.95, weight_decay: float = 0.0,
            warmup_steps: int = 0, schedule: str = "cosine", checkpoint_every: int = 500, writer: Optional[MetricWriter] = None,
            allowance: Optional[StepAllowance] = None,
            show_progress: bool = True) -> tuple[nnx.Module, list[dict[str, float]]]:
    """Trains ``model`` for ``steps`` SFT steps (resuming from ``workdir/checkpoints`` if present).

    AdamW with ``schedule`` (``sft_optimizer``; MaxRL's SFT: lr 5e-4, betas 0.9/0.95, weight decay 0.01).
    Returns the trained model and the loss log (``{"step", "loss", "grad_norm"}`` per step).
    """
    tx = sft_optimizer(learning_rate, steps, warmup_steps, b1, b2, weight_decay, schedule)
    graphdef, state = step_lib.create_train_state(model, tx)
    update = step_lib.make_sft_step(graphdef, tx)
    checkpointer = ckpt_lib.Checkpointer(pathlib.Path(workdir) / "checkpoints", max_to_keep=1)
    with checkpointer:
        out = run_loop(state, lambda state, step: update(state, sft_sequence_batch(batch_fn(step))),
                       num_steps=steps, checkpointer=checkpointer, desc="sft", save_every=checkpoint_every,
                       writer=writer, metric_prefix="sft/", allowance=allowance, show_progress=show_progress,
                       num_steps_field="config.sft.steps")
    return nnx.merge(graphdef, out.state.params), out.history
