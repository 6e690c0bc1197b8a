"""A task-agnostic RL trainer: estimate p -> allocate -> sample -> reward -> advantages -> update.

One step (on-policy, one update per batch, as in MaxRL):

1. the task gives P prompts (a deterministic function of the step, so a resumed run sees the same data);
2. their success rates are estimated: ``pilot`` (n0 rollouts each, inside the budget), ``history`` (the
   Beta tracker over earlier epochs) or ``oracle`` (a task that knows p);
3. the budget B is allocated (``uniform`` or ``sera``) and the rollouts are sampled on the flat layout;
4. the task scores them; advantages (any registered estimator) and multiplicity-corrected loss weights
   give the policy-gradient surrogate; AdamW updates the decoder.

Everything a resumed run needs — parameters, optimizer, step, tracker, rollouts spent — is checkpointed;
the step's randomness is ``fold_in(key(seed), step)`` and the data position is the step itself.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import pathlib
import time
from typing import Any, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import sera_jax.core as core
from sera_jax.rl import step as step_lib
from sera_jax.rl.sampler import SampleOutput, make_sample_fn
from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train import config_utils
from sera_jax.train.sharding import Placement
from sera_jax.train.writers import MetricWriter, progress

P_ESTIMATES = ("pilot", "history", "oracle")


class PromptBatch(NamedTuple):
    """P prompts of a step: dataset keys, left-padded tokens and what the task needs to score them."""

    keys_P: np.ndarray  # int, dataset-wide prompt ids (the history tracker's keys)
    tokens_PxT: np.ndarray  # int32, left-padded
    lengths_P: np.ndarray  # int32
    payload: Any  # task-specific (maze grids, reference answers, ...)


class RLTask(Protocol):
    """What the trainer needs from a task."""

    num_train_prompts: Optional[int]  # dataset size (None: an endless generator, no history tracker)
    stop_tokens: tuple[int, ...]
    pad_id: int
    max_new_tokens: int

    def train_prompts(self, step: int, num: int) -> PromptBatch: ...

    def eval_prompts(self) -> PromptBatch: ...

    def rewards(self, prompts: PromptBatch, prompt_ids_B: np.ndarray, sample: SampleOutput) -> np.ndarray: ...


def default_rl_config() -> ml_collections.ConfigDict:
    """The ``rl``, ``sera``, ``eval`` and ``ckpt`` sub-dicts of an RL experiment config."""
    c = ml_collections.ConfigDict()
    # sample_chunk: rollouts per sampling call (0: the whole step at once); update_microbatches: slices the
    # update accumulates its gradient over. Both bound device memory at large B x response length; neither
    # changes what is estimated (chunked sampling draws other random numbers from the same distribution).
    c.rl = dict(steps=100, prompts_per_step=16, rollouts_per_step=128, learning_rate=1e-4, b1=0.9, b2=0.999,
                weight_decay=0.0, grad_clip=1.0, temperature=1.0, top_p=1.0, sample_chunk=0, update_microbatches=1)
    c.sera = dict(method="sera", estimator="maxrl", p_estimate="pilot", pilot_rollouts=2, n_min=2, n_max=64,
                  correction=True, aggregation="sequence_sum", history_decay=0.5, use_posterior=False)
    c.eval = dict(every=50, samples_per_prompt=32, ks=(1, 2, 4, 8, 16, 32), temperature=1.0, top_p=1.0,
                  max_rollouts_per_call=1024)
    c.ckpt = dict(every=25, max_to_keep=2)
    return ml_collections.ConfigDict(c)


def method_config(config: ml_collections.ConfigDict, methods: dict[str, dict],
                  method: str) -> ml_collections.ConfigDict:
    """A copy of ``config`` with ``config.sera`` updated as ``methods[method]`` says (an experiment compares
    methods that share everything else); ValueError naming an unknown method."""
    if method not in methods:
        raise ValueError(f"config.methods has unknown method {method!r}; known: {sorted(methods)}")
    c = copy.deepcopy(config)
    with c.unlocked():
        c.sera.update(methods[method])
    return c


def validate_rl_config(c: ml_collections.ConfigDict, num_train_prompts: Optional[int], num_devices: int = 1) -> None:
    """Fails with a message naming the field for configs the trainer cannot run (``num_devices``: data shards)."""
    P, B = c.rl.prompts_per_step, c.rl.rollouts_per_step
    config_utils.require(c, "rl.steps", lambda v: isinstance(v, int) and v >= 0, "must be an int >= 0")
    config_utils.require(c, "rl.prompts_per_step", lambda v: isinstance(v, int) and v >= 1, "must be >= 1")
    core.get_estimator(c.sera.estimator)
    if c.sera.method not in core.ALLOCATION_METHODS:
        raise ValueError(f"config.sera.method={c.sera.method!r}: must be one of {list(core.ALLOCATION_METHODS)}")
    if c.sera.p_estimate not in P_ESTIMATES:
        raise ValueError(f"config.sera.p_estimate={c.sera.p_estimate!r}: must be one of {list(P_ESTIMATES)}")
    if not P * c.sera.n_min <= B <= P * c.sera.n_max:
        raise ValueError(
            f"config.rl.rollouts_per_step={B} is infeasible for prompts_per_step={P} with "
            f"n_min={c.sera.n_min}, n_max={c.sera.n_max}")
    if c.sera.method == "sera" and c.sera.p_estimate == "pilot":
        n0 = c.sera.pilot_rollouts
        if not 1 <= n0 or P * n0 >= B:
            raise ValueError(f"config.sera.pilot_rollouts={n0} must be >= 1 with P * n0 < rollouts_per_step ({B})")
    if c.sera.p_estimate == "history" and num_train_prompts is None:
        raise ValueError("config.sera.p_estimate='history' needs a finite training set (the task has none)")
    config_utils.require(c, "rl.sample_chunk", lambda v: isinstance(v, int) and v >= 0,
                         "must be an int >= 0 (0: sample the whole step in one call)")
    config_utils.require(c, "rl.update_microbatches", lambda v: isinstance(v, int) and v >= 1 and B % v == 0,
                         f"must be an int >= 1 that divides rl.rollouts_per_step={B}")
    if c.sera.aggregation not in core.AGGREGATIONS:
        raise ValueError(f"config.sera.aggregation={c.sera.aggregation!r}: must be one of {list(core.AGGREGATIONS)}")
    check_rows_split(c, num_devices)


def rows_per_call(samples_per_prompt: int, max_rollouts_per_call: int) -> int:
    """Rows of one evaluation-style call: whole prompts' samples, as many as fit in ``max_rollouts_per_call``."""
    return max(1, max_rollouts_per_call // samples_per_prompt) * samples_per_prompt


def check_rows_split(c: ml_collections.ConfigDict, num_shards: int, extra: Optional[dict[str, int]] = None) -> None:
    """Every sampling call and update slice puts its rows on the data shards: each count must split evenly.

    ``extra`` adds an experiment's own calls ({description: rows}); call it at start-up to fail before any work.
    """
    if num_shards == 1:
        return
    P, B = c.rl.prompts_per_step, c.rl.rollouts_per_step
    rows = {"config.rl.rollouts_per_step": B,
            "config.eval.samples_per_prompt (rows per call)": rows_per_call(c.eval.samples_per_prompt,
                                                                            c.eval.max_rollouts_per_call)}
    if isinstance(c.rl.update_microbatches, int) and c.rl.update_microbatches >= 1:  # else validate names it
        rows["config.rl.rollouts_per_step / update_microbatches"] = B // c.rl.update_microbatches
    if c.rl.sample_chunk:
        rows["config.rl.sample_chunk"] = c.rl.sample_chunk
    if c.sera.method == "sera" and c.sera.p_estimate == "pilot":
        rows["config.sera.pilot_rollouts * prompts_per_step"] = P * c.sera.pilot_rollouts
    for field, value in {**rows, **(extra or {})}.items():
        if value % num_shards:
            raise ValueError(f"{field}={value} must be a multiple of the {num_shards} data shards (config.mesh)")


@dataclasses.dataclass
class Rollouts:
    """The step's rollouts on the flat layout (host arrays)."""

    prompt_ids_B: np.ndarray
    sample: SampleOutput
    rewards_B: np.ndarray


def _concat_rollouts(a: Rollouts, b: Rollouts) -> Rollouts:
    sample = SampleOutput(*(np.concatenate([x, y]) for x, y in zip(a.sample, b.sample)))
    return Rollouts(np.concatenate([a.prompt_ids_B, b.prompt_ids_B]), sample,
                    np.concatenate([a.rewards_B, b.rewards_B]))


class Timer:
    """Accumulates wall time per phase (the caller blocks on device work inside each phase)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def phase(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.start

        return _Phase()


@functools.partial(jax.jit, static_argnames=("estimator", "aggregation", "correction"))
def policy_gradient_batch(prompt_tokens_PxT, prompt_lengths_P, prompt_ids_B, tokens_BxN, mask_BxN, rewards_B, *,
                          estimator: str, aggregation: str, correction: bool):
    """Advantages and multiplicity-corrected token weights on the flat layout, joined into sequences."""
    num_prompts = prompt_tokens_PxT.shape[0]
    adv = core.advantages(rewards_B, prompt_ids_B, num_prompts, estimator)
    weights = core.loss_weights(prompt_ids_B, num_prompts, token_mask_BxT=mask_BxN, aggregation=aggregation,
                                correction=correction)
    batch = step_lib.sequence_batch(prompt_tokens_PxT[prompt_ids_B], prompt_lengths_P[prompt_ids_B], tokens_BxN,
                                    mask_BxN, weights)
    return batch, adv


@functools.lru_cache(maxsize=None)
def cached_sample_fn(graphdef: nnx.GraphDef, max_new_tokens: int, top_p: float, pad_id: int):
    """One jitted sampler per (architecture, settings): runs over seeds and methods reuse its compilations."""
    return make_sample_fn(graphdef, max_new_tokens=max_new_tokens, top_p=top_p, pad_id=pad_id)


class RLTrainer:
    """Runs RL on a task with a decoder policy. Construct, optionally ``restore()``, then ``train()``."""

    def __init__(self, task: RLTask, model: nnx.Module, config: ml_collections.ConfigDict,
                 workdir: str | pathlib.Path, *, seed: int = 0, writer: Optional[MetricWriter] = None,
                 placement: Optional[Placement] = None, fingerprint: Optional[dict] = None):
        placement = placement or Placement()
        validate_rl_config(config, task.num_train_prompts, placement.num_batch_shards)
        self.task, self.config, self.seed = task, config, seed
        self.workdir = pathlib.Path(workdir)
        self.writer = writer
        self.placement = placement
        rl = config.rl
        self.tx = step_lib.make_optimizer(rl.learning_rate, b1=rl.b1, b2=rl.b2, weight_decay=rl.weight_decay,
                                          grad_clip=rl.grad_clip)
        # Parameters, optimizer moments, counters and the tracker all live on the mesh, so that a restore (which
        # keeps each leaf's placement) never mixes one-device and mesh arrays.
        self.graphdef, state = step_lib.create_train_state(model, self.tx)
        self.state = placement.tree(state)
        self.tracker = placement.tree(core.tracker_init(task.num_train_prompts or 1))
        self.rollouts_spent = 0
        self.sample_fn = cached_sample_fn(self.graphdef, task.max_new_tokens, rl.top_p, task.pad_id)
        self.eval_sample_fn = cached_sample_fn(self.graphdef, task.max_new_tokens, config.eval.top_p, task.pad_id)
        self.checkpointer = ckpt_lib.Checkpointer(self.workdir / "checkpoints", max_to_keep=config.ckpt.max_to_keep,
                                                  config_fingerprint=fingerprint)
        self.history: list[dict[str, float]] = []
        self.evaluations: list[dict[str, Any]] = []

    # -- checkpoints ---------------------------------------------------------------------------------

    def _checkpoint_tree(self) -> dict[str, Any]:
        return {"train": self.state, "tracker": self.tracker,
                "rollouts_spent": np.asarray(self.rollouts_spent, np.int64)}

    def restore(self) -> int:
        """Restores the latest checkpoint if there is one; returns the step to continue from."""
        if self.checkpointer.latest_step() is None:
            return 0
        tree, meta = self.checkpointer.restore(None, ckpt_lib.abstract_like(self._checkpoint_tree()))
        self.state, self.tracker = tree["train"], core.TrackerState(*tree["tracker"])
        self.rollouts_spent = int(tree["rollouts_spent"])
        self.history = list(meta.get("history", []))
        self.evaluations = list(meta.get("evaluations", []))
        return int(self.state.step)

    def save(self) -> None:
        step = int(self.state.step)
        self.checkpointer.save(step, self._checkpoint_tree(),
                               metadata={"history": self.history, "evaluations": self.evaluations}, force=True)

    # -- one step ------------------------------------------------------------------------------------

    def _sample(self, prompts: PromptBatch, prompt_ids_B: np.ndarray, key: jax.Array,
                temperature: float, sample_fn) -> Rollouts:
        """Samples the rollouts ``prompt_ids_B``, ``rl.sample_chunk`` at a time when that is set (the last
        chunk is padded with rollouts of prompt 0, then dropped, so every call has one compiled shape)."""
        limit = self.config.rl.sample_chunk
        chunk = limit if 0 < limit < len(prompt_ids_B) else len(prompt_ids_B)
        tokens, lengths = jnp.asarray(prompts.tokens_PxT), jnp.asarray(prompts.lengths_P)
        stops = jnp.asarray(self.task.stop_tokens, jnp.int32)
        parts = []
        for i, start in enumerate(range(0, len(prompt_ids_B), chunk)):
            ids = np.asarray(prompt_ids_B[start:start + chunk], np.int32)
            padded = np.concatenate([ids, np.zeros(chunk - len(ids), np.int32)])
            part_key = key if chunk >= len(prompt_ids_B) else jax.random.fold_in(key, i)
            out = sample_fn(self.state.params, tokens, lengths, self.placement.batch(jnp.asarray(padded)), part_key,
                            temperature, stops)
            parts.append([np.asarray(x)[:len(ids)] for x in jax.device_get(out)])
        sample = SampleOutput(*(np.concatenate(field) for field in zip(*parts)))
        return Rollouts(np.asarray(prompt_ids_B), sample, None)

    def _rewards(self, prompts: PromptBatch, prompt_ids_B: np.ndarray, sample: SampleOutput) -> np.ndarray:
        """The task's binary rewards, checked: anything but 0/1 is a task bug, not something to train on."""
        rewards = np.asarray(self.task.rewards(prompts, prompt_ids_B, sample), np.float32)
        if rewards.shape != prompt_ids_B.shape or not np.all((rewards == 0) | (rewards == 1)):
            bad = rewards[~((rewards == 0) | (rewards == 1))][:5] if rewards.shape == prompt_ids_B.shape else []
            raise ValueError(f"task.rewards must return {prompt_ids_B.shape[0]} binary (0/1) rewards; got shape "
                             f"{rewards.shape}, offending values {list(bad)}")
        return rewards

    def _estimate_and_allocate(self, prompts: PromptBatch, key: jax.Array, timer: Timer):
        """Returns (counts_P, p_hat_P or None, pilot Rollouts or None)."""
        c = self.config
        P, B = c.rl.prompts_per_step, c.rl.rollouts_per_step
        bounds = dict(n_min=c.sera.n_min, n_max=c.sera.n_max, estimator=c.sera.estimator)
        if c.sera.method == "uniform":
            return np.asarray(core.uniform_counts(P, B)), None, None
        if c.sera.p_estimate == "pilot":
            n0 = c.sera.pilot_rollouts
            ids = np.repeat(np.arange(P), n0)
            with timer.phase("sample"):
                pilot = self._sample(prompts, ids, key, c.rl.temperature, self.sample_fn)
            with timer.phase("reward"):
                pilot.rewards_B = self._rewards(prompts, ids, pilot.sample)
            successes = np.bincount(ids, weights=pilot.rewards_B, minlength=P)
            with timer.phase("allocate"):
                counts = np.asarray(core.pilot_allocate(successes, n0, B, use_posterior=c.sera.use_posterior,
                                                        **bounds))
            return counts, np.asarray(core.pilot_posterior(successes, n0).mean), pilot
        with timer.phase("allocate"):
            if c.sera.p_estimate == "history":
                post = core.tracker_posterior(self.tracker, jnp.asarray(prompts.keys_P))
                target = post if c.sera.use_posterior else post.mean
                p_hat = np.asarray(post.mean)
            else:
                p_hat = np.asarray(self.task.oracle_success_rates(prompts), np.float32)
                target = p_hat
            counts = np.asarray(core.allocate(target, B, **bounds))
        return counts, p_hat, None

    def train_step(self, step: int) -> dict[str, float]:
        c, timer = self.config, Timer()
        P, B = c.rl.prompts_per_step, c.rl.rollouts_per_step
        key = jax.random.fold_in(jax.random.key(self.seed), step)
        k_pilot, k_main = jax.random.split(key)
        with timer.phase("prompts"):
            prompts = self.task.train_prompts(step, P)
        counts, p_hat, pilot = self._estimate_and_allocate(prompts, k_pilot, timer)
        extra = counts - (c.sera.pilot_rollouts if pilot is not None else 0)
        ids = np.repeat(np.arange(P), extra)
        with timer.phase("sample"):
            rollouts = self._sample(prompts, ids, k_main, c.rl.temperature, self.sample_fn)
        with timer.phase("reward"):
            rollouts.rewards_B = self._rewards(prompts, ids, rollouts.sample)
        if pilot is not None:
            rollouts = _concat_rollouts(pilot, rollouts)
        with timer.phase("update"):
            metrics = self._update(prompts, rollouts)
        successes = np.bincount(rollouts.prompt_ids_B, weights=rollouts.rewards_B, minlength=P)
        if self.task.num_train_prompts is not None:
            self.tracker = core.tracker_update(self.tracker, jnp.asarray(prompts.keys_P), successes, counts,
                                               decay=c.sera.history_decay)
        self.rollouts_spent += B
        metrics.update(self._step_metrics(rollouts, counts, successes, p_hat, timer))
        return metrics

    def _update(self, prompts: PromptBatch, rollouts: Rollouts) -> dict[str, float]:
        c = self.config
        batch, adv = policy_gradient_batch(
            jnp.asarray(prompts.tokens_PxT), jnp.asarray(prompts.lengths_P),
            jnp.asarray(rollouts.prompt_ids_B, jnp.int32), jnp.asarray(rollouts.sample.tokens_BxN),
            jnp.asarray(rollouts.sample.mask_BxN), jnp.asarray(rollouts.rewards_B), estimator=c.sera.estimator,
            aggregation=c.sera.aggregation, correction=c.sera.correction)
        batch = jax.tree.map(self.placement.batch, batch)
        self.state, metrics = step_lib.rl_step(self.state, batch, self.placement.batch(adv), graphdef=self.graphdef,
                                               tx=self.tx, microbatches=c.rl.update_microbatches)
        return {k: float(v) for k, v in metrics.items()}

    def _step_metrics(self, rollouts, counts, successes, p_hat, timer: Timer) -> dict[str, float]:
        c = self.config
        total_time = sum(timer.seconds.values())
        m = {"reward_mean": float(rollouts.rewards_B.mean()),
             "prompts_solved_frac": float(np.mean(successes > 0)),
             "response_len_mean": float(rollouts.sample.lengths_B.mean()),
             "truncated_frac": float(1.0 - rollouts.sample.finished_B.mean()),
             "counts_min": float(counts.min()), "counts_max": float(counts.max()),
             "rollouts_spent": float(self.rollouts_spent), "step_seconds": total_time}
        if p_hat is not None:
            scales = core.scale_factor(jnp.asarray(p_hat, jnp.float32), jnp.asarray(counts), c.sera.estimator,
                                       max_n=int(counts.max()))
            for k, v in core.scale_factor_stats(scales).items():
                m[f"scale_{k}"] = float(v)
        for name, seconds in timer.seconds.items():
            m[f"time_share/{name}"] = seconds / max(total_time, 1e-9)
        return m

    # -- evaluation ----------------------------------------------------------------------------------

    def evaluate(self, step: int, *, show_progress: bool = False) -> dict[str, Any]:
        """Unbiased pass@k on the task's held-out prompts with ``eval.samples_per_prompt`` samples each."""
        c = self.config.eval
        prompts = self.task.eval_prompts()
        n = c.samples_per_prompt
        num_q = prompts.tokens_PxT.shape[0]
        per_call = max(1, c.max_rollouts_per_call // n)
        correct = np.zeros(num_q, np.int64)
        key = jax.random.fold_in(jax.random.key(self.seed + 1_000_003), step)
        chunks = range(0, num_q, per_call)
        for start in progress(chunks, desc=f"eval at step {step}", leave=False,
                              disable=not show_progress or len(chunks) < 2):
            idx = np.arange(start, min(start + per_call, num_q))
            chunk = PromptBatch(prompts.keys_P[idx], prompts.tokens_PxT[idx], prompts.lengths_P[idx],
                                _take_payload(prompts.payload, idx))
            # Pad the last chunk to the same number of prompts so the sampler compiles once.
            pad = per_call - len(idx)
            if pad:
                chunk = _pad_prompts(chunk, pad)
            ids = np.repeat(np.arange(per_call), n)
            rollouts = self._sample(chunk, ids, jax.random.fold_in(key, start), c.temperature, self.eval_sample_fn)
            rewards = np.asarray(self.task.rewards(chunk, ids, rollouts.sample))
            correct[idx] = np.bincount(ids, weights=rewards, minlength=per_call)[: len(idx)].round().astype(np.int64)
        ks = [k for k in c.ks if k <= n]
        curve = core.mean_pass_at_k(n, correct, ks)
        rates = correct / n
        return {"step": step, "rollouts_spent": self.rollouts_spent, "k": ks,
                "pass_at_k": [float(v) for v in curve], "solved_frac": float(np.mean(correct > 0)),
                "p_quantiles": {str(q): float(np.quantile(rates, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)}}

    # -- loop ----------------------------------------------------------------------------------------

    def train(self, *, max_steps: Optional[int] = None, show_progress: bool = True) -> dict[str, Any]:
        """Trains from the current step to ``rl.steps`` (or stops after ``max_steps`` more, for tests)."""
        c = self.config
        start = int(self.state.step)
        end = c.rl.steps if max_steps is None else min(c.rl.steps, start + max_steps)
        if start == 0 and c.eval.every and not self.evaluations:
            # The starting policy: curves begin at 0 rollouts.
            self.evaluations.append(self.evaluate(0, show_progress=show_progress))
        for step in progress(range(start, end), desc="rl", disable=not show_progress):
            metrics = self.train_step(step)
            if not math.isfinite(metrics["loss"]):
                last = self.checkpointer.latest_step()
                raise FloatingPointError(
                    f"non-finite loss at step {step}; training stopped. The last good checkpoint "
                    f"(step {last}) in {self.checkpointer.directory} is kept.")
            self.history.append({"step": step, **metrics})
            if self.writer is not None:
                self.writer.write_scalars(step, metrics)
            done = step + 1
            if c.eval.every and (done % c.eval.every == 0 or done == c.rl.steps):
                result = self.evaluate(done, show_progress=show_progress)
                self.evaluations.append(result)
                if self.writer is not None:
                    self.writer.write_scalars(done, {f"eval/pass@{k}": v for k, v in
                                                     zip(result["k"], result["pass_at_k"])})
            if done % c.ckpt.every == 0 or done == end:
                self.save()
        self.checkpointer.wait()
        return {"history": self.history, "evaluations": self.evaluations, "rollouts_spent": self.rollouts_spent}


def _take_payload(payload: Any, idx: np.ndarray) -> Any:
    if payload is None:
        return None
    if isinstance(payload, (list, tuple)):
        return [payload[i] for i in idx]
    return jax.tree.map(lambda x: np.asarray(x)[idx], payload)


def _pad_prompts(batch: PromptBatch, pad: int) -> PromptBatch:
    """Repeats the first prompt ``pad`` times (its samples are ignored) to keep shapes static."""
    idx = np.concatenate([np.arange(len(batch.keys_P)), np.zeros(pad, np.int64)])
    return PromptBatch(batch.keys_P[idx], batch.tokens_PxT[idx], batch.lengths_P[idx],
                       _take_payload(batch.payload, idx))
