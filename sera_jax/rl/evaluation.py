"""Evaluation of an RL run: unbiased pass@k on the task's held-out prompts, sampled with the run's evaluation
sampler (``RLContext.eval_sample_fn``) in calls of static shape and scored as in training (``score_rollouts``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import sera_jax.core as core
from sera_jax.core.pass_at_k import mean_bootstrap_pass_at_k
from sera_jax.models.sampler import make_sample_fn
from sera_jax.rl.context import RLContext
from sera_jax.rl.rollouts import pad_prompts, sample_rollouts, score_rollouts, take_prompts
from sera_jax.rl.task import SampleOutput
from sera_jax.train.distributed import host_array, to_host
from sera_jax.train.writers import progress


def evaluate(ctx: RLContext, params: Any, step: int, seed: int, *, show_progress: bool = False) -> dict[str, Any]:
    """Unbiased pass@k on the task's held-out prompts with ``eval.samples_per_prompt`` samples each; the task's
    rewards are checked as in training (``score_rollouts``: 0/1 only, a fraction or NaN is a ValueError). With
    ``eval.bootstrap_repeats > 0`` also the SERA authors' bootstrap pass@k of each prompt's ordered samples
    (``pass_at_k_bootstrap``: ``sera_jax.core.pass_at_k.mean_bootstrap_pass_at_k``)."""
    c = ctx.settings.eval
    prompts = ctx.task.eval_prompts()
    n = c.samples_per_prompt
    num_q = prompts.tokens_PxT.shape[0]
    per_call = max(1, c.max_rollouts_per_call // n)
    correct = np.zeros(num_q, np.int64)
    pools = np.zeros((num_q, n), bool) if c.bootstrap_repeats else None  # the bootstrap reads the order
    key = jax.random.fold_in(jax.random.key(seed + 1_000_003), step)
    chunks = range(0, num_q, per_call)
    ids = jnp.repeat(jnp.arange(per_call, dtype=jnp.int32), n)
    for start in progress(chunks, desc=f"eval at step {step}", leave=False,
                          disable=not show_progress or len(chunks) < 2):
        idx = np.arange(start, min(start + per_call, num_q))
        chunk = pad_prompts(take_prompts(prompts, idx), per_call)  # static shapes: the sampler compiles once
        rollouts = sample_rollouts(ctx, params, chunk, ids, jax.random.fold_in(key, start), c.temperature,
                                   ctx.eval_sample_fn)
        rewards = np.asarray(score_rollouts(ctx.task, chunk, rollouts))  # checked 0/1, as in training
        correct[idx] = np.bincount(host_array(ids), weights=rewards, minlength=per_call)[: len(idx)].astype(np.int64)
        if pools is not None:  # rows are prompt-major (``ids``): each prompt's n samples in sampling order
            pools[idx] = rewards.reshape(per_call, n)[: len(idx)] > 0
    ks = [k for k in c.ks if k <= n]
    curve = core.mean_pass_at_k(n, correct, ks)
    rates = correct / n
    record = {"step": step, "rollouts_spent": step * ctx.settings.rl.rollouts_per_step, "k": ks,
              "pass_at_k": [float(v) for v in curve], "solved_frac": float(np.mean(correct > 0)),
              "p_quantiles": {str(q): float(np.quantile(rates, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}}
    if pools is not None:
        boot = mean_bootstrap_pass_at_k(pools, ks, repeats=c.bootstrap_repeats, seed=c.bootstrap_seed)
        record["pass_at_k_bootstrap"] = [float(v) for v in boot]
    return record


def success_counts(model: nnx.Module, task: Any, prompt_batch: Callable[[np.ndarray], Any], num: int, samples: int, *,
                   seed: int, rows_per_call: int, shard_fn: Callable[[Any], Any] = lambda x: x,
                   temperature: float = 1.0, desc: str = "success counts", show_progress: bool = False) -> np.ndarray:
    """Successes out of ``samples`` rollouts (``temperature``, no top-p) of each of ``num`` prompts, ``prompt_batch(keys)``
    giving the prompts of keys ``0..num-1``: a policy's per-prompt success counts ``(num,)``, e.g. where an RL run
    starts. Its own sampler (a slot per row): a start is profiled once. Calls of static shape: the last wraps round."""
    graphdef, state = nnx.split(model)
    sample_fn = make_sample_fn(graphdef, max_new_tokens=task.max_new_tokens, top_p=1.0, pad_id=task.pad_id)
    per_call = max(1, rows_per_call // samples)
    correct = np.zeros(num, np.int64)
    key = jax.random.fold_in(jax.random.key(seed), 0x9F0)
    ids = np.repeat(np.arange(per_call), samples)
    for start in progress(range(0, num, per_call), desc=desc, disable=not show_progress):
        keys_P = np.arange(start, start + per_call) % num
        batch = prompt_batch(keys_P)
        out = sample_fn(state, jnp.asarray(batch.tokens_PxT), jnp.asarray(batch.lengths_P),
                        shard_fn(jnp.asarray(ids, jnp.int32)), jax.random.fold_in(key, start), temperature,
                        jnp.asarray(task.stop_tokens, jnp.int32))
        rewards = task.rewards(batch, ids, SampleOutput(*to_host(out)))  # gathered from every host
        got = np.bincount(ids, weights=rewards, minlength=per_call).round().astype(np.int64)
        real = min(per_call, num - start)
        correct[start:start + real] = got[:real]
    return correct
