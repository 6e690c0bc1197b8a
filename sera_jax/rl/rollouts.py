"""Sampling and scoring on the flat layout, shared by the RL step (``sera_jax.rl.trainer``) and evaluation
(``sera_jax.rl.evaluation``): ``sample_rollouts`` (chunked calls of the run's sampler, rollouts keyed by (prompt,
rank)), ``score_rollouts`` (the task's rewards, checked to be 0/1), and the prompt-batch helpers that keep the
sampler's shapes static (``take_prompts``, ``pad_prompts``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax.models.sampler import SampleOutput
from sera_jax.rl.context import RLContext, Rollouts
from sera_jax.rl.task import PromptBatch, RLTask
from sera_jax.train.distributed import host_array


def sample_rollouts(ctx: RLContext, params: Any, prompts: PromptBatch, prompt_ids_B: jax.Array, key: jax.Array,
                    temperature: float, sample_fn: Optional[Callable] = None,
                    rank_offset_P: Optional[jax.Array] = None, rows_per_call: int = 0) -> Rollouts:
    """Samples the rollouts ``prompt_ids_B``, ``rl.sample_chunk`` at a time when that is set (the last chunk is
    padded with rollouts of prompt 0, then dropped, so every call has one compiled shape). ``rows_per_call``:
    calls of exactly that many rows (at most ``rl.sample_chunk``), for callers whose row counts vary (rounds).

    Rollouts are keyed by (prompt, rank) with one ``key``: row b is rollout ``rank_offset_P[i] + r`` of its prompt
    i (default offset 0), r the number of rows of prompt i before it in ``prompt_ids_B``; each chunk starts its
    prompts' ranks where the chunks before it left them, so chunking changes no rollout."""
    sample_fn = sample_fn or ctx.sample_fn
    num = prompt_ids_B.shape[0]
    limit = ctx.settings.rl.sample_chunk
    if rows_per_call:
        chunk = min(rows_per_call, limit) if limit else rows_per_call
    else:
        chunk = limit if 0 < limit < num else num
    tokens, lengths = jnp.asarray(prompts.tokens_PxT), jnp.asarray(prompts.lengths_P)
    stops = jnp.asarray(ctx.task.stop_tokens, jnp.int32)
    ids_B = jnp.asarray(prompt_ids_B, jnp.int32)
    num_prompts = tokens.shape[0]
    offset_P = (jnp.zeros(num_prompts, jnp.int32) if rank_offset_P is None
                else jnp.asarray(rank_offset_P, jnp.int32))
    parts = []
    for start in range(0, num, chunk):
        ids = ids_B[start:start + chunk]
        real = ids.shape[0]
        padded = jnp.concatenate([ids, jnp.zeros(chunk - real, jnp.int32)]) if real < chunk else ids
        # The padding rows come after the real ones: they never shift a real row's rank.
        out = sample_fn(params, tokens, lengths, ctx.placement.batch(padded), key, temperature, stops, offset_P)
        parts.append(out if real == chunk else SampleOutput(*(x[:real] for x in out)))
        if start + chunk < num:
            offset_P = offset_P + jnp.bincount(ids, length=num_prompts).astype(jnp.int32)
    sample = parts[0] if len(parts) == 1 else SampleOutput(*(jnp.concatenate(f) for f in zip(*parts)))
    return Rollouts(ids_B, sample, None)


def score_rollouts(task: RLTask, prompts: PromptBatch, rollouts: Rollouts) -> jax.Array:
    """The task's binary rewards, checked: anything but 0/1 is a task bug, not something to train on.

    The task scores the sample as it comes (device arrays, sharded over the mesh; a task that reads them on the
    host uses ``distributed.host_array``); its rewards are read here whole (gathered from every host)."""
    rewards = host_array(task.rewards(prompts, host_array(rollouts.prompt_ids_B), rollouts.sample)).astype(
        np.float32)
    num = rollouts.prompt_ids_B.shape[0]
    ok = (rewards == 0) | (rewards == 1)
    if rewards.shape != (num,) or not np.all(ok):
        bad = rewards[~ok][:5].tolist() if rewards.shape == (num,) else []
        raise ValueError(f"task.rewards ({type(task).__name__}.rewards) must return {num} binary (0/1) rewards; "
                         f"got shape {rewards.shape}, offending values {bad}")
    return jnp.asarray(rewards)


def _take_payload(payload: Any, idx: np.ndarray) -> Any:
    if payload is None:
        return None
    if isinstance(payload, (list, tuple)):
        return [payload[i] for i in idx]
    return jax.tree.map(lambda x: np.asarray(x)[idx], payload)


def take_prompts(batch: PromptBatch, idx: np.ndarray) -> PromptBatch:
    """The prompts ``idx`` of ``batch`` (keys, tokens, lengths and the task's payload alike)."""
    return PromptBatch(batch.keys_P[idx], batch.tokens_PxT[idx], batch.lengths_P[idx],
                       _take_payload(batch.payload, idx))


def pad_prompts(batch: PromptBatch, num: int) -> PromptBatch:
    """Repeats the first prompt up to ``num`` prompts (their samples are ignored) to keep shapes static."""
    pad = num - len(batch.keys_P)
    if pad <= 0:
        return batch
    return take_prompts(batch, np.concatenate([np.arange(len(batch.keys_P)), np.zeros(pad, np.int64)]))
