"""Training: the cross-entropy run whose checkpoints are analysed, and the training-dynamics runs.

* CE pre-training (MaxRL's recipe: SGD with momentum, weight decay added to the gradient as in PyTorch's SGD,
  linear warm-up then cosine schedule, optionally the gradient clipped first) keeps an orbax
  checkpoint at every step of ``config.pretrain.checkpoint_steps`` (the analysed stages) and every
  ``config.ckpt.every`` steps (for resuming).
* Training dynamics: from the same initialisation (per seed), cross-entropy (``cross_entropy``) and MaxRL with a
  registry allocator (``uniform``, ``sera``: the released rule, ``sera_all_active``: the all-active max–min),
  each on the classifier's true p, at the same total rollouts per step ``B = batch * N_bar``. The RL step samples
  labels from the (train-mode) softmax, builds the estimator's cotangent on the logits and descends the surrogate
  ``L = -sum_i <stop_grad(c_i), logits_i>``, whose gradient is ``-J^T c`` (the estimator's ascent direction).
  Every ``dynamics.monitor_every`` steps it also pulls the exact cross-entropy cotangent back through the same
  forward and logs the cosine of the two parameter gradients (``grad_cosine``). Validation pass@k is analytic:
  ``1 - (1 - p)^k`` averaged over the validation images (inference-mode BatchNorm).

Metrics (loss, accuracy, lr; validation pass@k for the dynamics) go to TensorBoard and CSV under
``<workdir>/metrics/<run>/`` (and to one W&B run each with ``config.log.wandb`` on). The train state is a dict
``{params, batch_stats, opt_state, step}``; the data stream is a pure function of (seed, step) and the sampling
key is ``fold_in(key(seed), step)``, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment.config import CROSS_ENTROPY
from experiments.imagenet_alignment.model import FAST_COMPILE
from sera_jax import core
from sera_jax.models import resnet
from sera_jax.train import checkpoint as ckpt_lib
from sera_jax.train import config_utils, writers
from sera_jax.train import sharding as sh
from sera_jax.train.loop import StepAllowance, run_loop

Array = jnp.ndarray
State = dict[str, Any]

# Fields that change the meaning of a saved train state (a checkpoint written under others is refused).
PRETRAIN_FINGERPRINT = ("seed", "data.name", "data.validation_size", "data.analysis_size", "model", "optim",
                        "pretrain.steps")
DYNAMICS_FINGERPRINT = ("seed", "data.name", "data.validation_size", "data.analysis_size", "model", "optim",
                        "dynamics.steps", "dynamics.rollouts_per_prompt", "dynamics.estimator",
                        "dynamics.correction", "dynamics.activation_threshold", "dynamics.eval_every",
                        "dynamics.pass_k", "sera.n_min", "sera.n_max_factor")


# ------------------------------------------------------------------------------------ optimizer and state


def make_optimizer(momentum: float, weight_decay: float, max_grad_norm: float = 0.0) -> optax.GradientTransformation:
    """PyTorch's SGD without the learning rate: ``buf = momentum buf + (g + wd theta)``; the step is
    ``-lr buf`` with ``lr`` a traced argument of the train step (``learning_rate``), so runs of different
    lengths share one compiled step (built once per invocation: ``compiled_steps``). ``max_grad_norm > 0`` first
    scales ``g`` to that global norm when it is longer (``torch.nn.utils.clip_grad_norm_`` before ``step()``)."""
    clip = (optax.clip_by_global_norm(max_grad_norm),) if max_grad_norm > 0 else ()
    return optax.chain(*clip, optax.add_decayed_weights(weight_decay), optax.trace(decay=momentum))


def learning_rate(step: int, total_steps: int, peak: float, warmup_steps: int) -> float:
    """The learning rate of (0-based) step ``step``: linear warm-up from 0, ``peak * step / warmup``, then cosine
    decay to 0 at ``total_steps``: ``lr = peak (1 + cos(pi (step - warmup) / (total - warmup))) / 2``. The warm-up is
    PyTorch's ``LambdaLR(step / warmup)`` stepped after every update, as the SERA authors' ImageNet script runs it
    (its first update has lr 0 and only fills the momentum buffer)."""
    if step < warmup_steps:
        return peak * step / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * peak * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def optimizer_from_config(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    o = config.optim
    return make_optimizer(float(o.momentum), float(o.weight_decay), float(o.max_grad_norm))


def lr_at(config: ml_collections.ConfigDict, step: int, total_steps: int) -> Array:
    return jnp.float32(learning_rate(step, total_steps, float(config.optim.lr), int(config.optim.warmup_steps)))


def init_state(params, batch_stats, tx: optax.GradientTransformation) -> State:
    return {"params": params, "batch_stats": batch_stats, "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32)}


def _apply_update(state: State, grads, new_stats, tx, lr: Array) -> State:
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    updates = jax.tree.map(lambda u: -lr * u, updates)
    return {"params": optax.apply_updates(state["params"], updates), "batch_stats": new_stats,
            "opt_state": opt_state, "step": state["step"] + 1}


# ------------------------------------------------------------------------------------ train steps


def ce_train_step(state: State, batch: dict[str, Array], lr: Array, *, graphdef, tx) -> tuple[State, dict[str, Array]]:
    """One SGD step on the mean cross-entropy ``-(1/P) sum_i log p_i`` (train-mode BatchNorm)."""

    def loss_fn(params):
        logits_PxK, new_stats = resnet.apply(graphdef, params, state["batch_stats"], batch["image"], train=True)
        logp_P = jnp.take_along_axis(jax.nn.log_softmax(logits_PxK), batch["label"][:, None], axis=1)[:, 0]
        return -jnp.mean(logp_P), (new_stats, logits_PxK)

    (loss, (new_stats, logits_PxK)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    accuracy = jnp.mean(jnp.argmax(logits_PxK, axis=1) == batch["label"])
    return _apply_update(state, grads, new_stats, tx, lr), {"loss": loss, "accuracy": accuracy}


def allocate_counts(p_P: Array, method_index: Array, *, methods: tuple[str, ...], budget: int, estimator: str,
                    n_min: int, n_max: int, threshold: float) -> Array:
    """The counts of registry allocator ``methods[method_index]`` (traced index: one ``lax.switch``, so every
    RL method of a run shares one compiled step and only the selected allocator runs) on the true ``p_P``.
    The released ``sera`` gives the images outside its active set 0 rollouts (floor 0, the authors' default)."""

    def branch(name: str) -> Callable[[Array], Array]:
        allocator = core.get_allocator(name)
        return lambda p: allocator.counts(p, budget, n_min=n_min, n_max=n_max, estimator=estimator, check=False,
                                          floor=0, threshold=threshold).astype(jnp.int32)

    return jax.lax.switch(method_index, [branch(m) for m in methods], p_P)


def rl_train_step(state: State, batch: dict[str, Array], lr: Array, key: Array, method_index: Array, monitor: Array,
                  *, graphdef, tx, methods: tuple[str, ...], budget: int, estimator: str, n_min: int, n_max: int,
                  threshold: float, correction: bool):
    """One MaxRL-family step with ``budget`` sampled labels, allocated by ``methods[method_index]`` (traced).

    One train-mode forward; the estimator's cotangent ``c`` on the logits is pulled back through it (the gradient
    of the surrogate ``-sum <c, logits>``). With ``monitor`` (traced) the exact cross-entropy cotangent
    ``-(onehot(y) - pi) / P`` is pulled back through the same forward too, and ``grad_cosine`` is the cosine of the
    two parameter gradients (the SERA authors' exact-log-p monitor; NaN when not monitored).
    """

    def forward(params):
        return resnet.apply(graphdef, params, state["batch_stats"], batch["image"], train=True)

    logits_PxK, pullback, new_stats = jax.vjp(forward, state["params"], has_aux=True)
    probs_PxK = jax.nn.softmax(logits_PxK, axis=-1)
    labels_P = batch["label"]
    p_P = E.success_probabilities(probs_PxK, labels_P)
    counts_P = allocate_counts(p_P, method_index, methods=methods, budget=budget, estimator=estimator, n_min=n_min,
                               n_max=n_max, threshold=threshold)
    sampled_B, prompt_ids_B = E.sample_rollouts(key, probs_PxK, counts_P, budget)
    cot_PxK = E.estimator_cotangent(probs_PxK, labels_P, sampled_B, prompt_ids_B, estimator=estimator,
                                    correction=correction)
    (grads,) = pullback(-cot_PxK)

    def cosine() -> Array:
        (exact,) = pullback(-E.exact_cotangent(probs_PxK, labels_P))
        return core.cosine_similarity(grads, exact)

    cos = jax.lax.cond(monitor, cosine, lambda: jnp.asarray(jnp.nan, jnp.float32))
    success = jnp.mean((sampled_B == labels_P[prompt_ids_B]).astype(jnp.float32))
    metrics = {"train_pass1": jnp.mean(p_P), "rollout_success": success, "max_count": jnp.max(counts_P),
               "min_count": jnp.min(counts_P), "active_frac": jnp.mean((counts_P > 0).astype(jnp.float32)),
               "grad_cosine": cos}
    return _apply_update(state, grads, new_stats, tx, lr), metrics


def eval_success_probs(graphdef, params, batch_stats, x_BxHxWxC: Array, labels_B: Array) -> tuple[Array, Array]:
    """Inference-mode ``p_i = softmax(logits_i)[y_i]`` and top-1 correctness of a batch."""
    logits_BxK, _ = resnet.apply(graphdef, params, batch_stats, x_BxHxWxC, train=False)
    p_B = E.success_probabilities(jax.nn.softmax(logits_BxK, axis=-1), labels_B)
    return p_B, jnp.argmax(logits_BxK, axis=1) == labels_B


@dataclasses.dataclass(frozen=True)
class Steps:
    ce: Callable
    rl: Callable
    eval: Callable
    replicated: NamedSharding
    rows: NamedSharding


def compiled_steps(graphdef, tx, mesh: Mesh, data_axes: tuple[str, ...], rl_static: tuple,
                   fast_compile: bool = False) -> Steps:
    """The jitted train/eval steps with explicit shardings (state replicated, batch split over the data axes)
    and the state donated. Built once per invocation (``make_context``): every run of it reuses them."""
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = sh.batch_sharding(mesh, data_axes)
    jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE if (
        fast_compile and mesh.devices.flat[0].platform == "cpu") else None)
    ce = jit(functools.partial(ce_train_step, graphdef=graphdef, tx=tx), in_shardings=(replicated, rows, replicated),
             out_shardings=(replicated, replicated), donate_argnums=0)
    rl = jit(functools.partial(rl_train_step, graphdef=graphdef, tx=tx, **dict(rl_static)),
             in_shardings=(replicated, rows, replicated, replicated, replicated, replicated),
             out_shardings=(replicated, replicated), donate_argnums=0)
    ev = jit(functools.partial(eval_success_probs, graphdef), in_shardings=(replicated, replicated, rows, rows),
             out_shardings=(rows, rows))
    return Steps(ce=ce, rl=rl, eval=ev, replicated=replicated, rows=rows)


# ------------------------------------------------------------------------------------ evaluation


def validation_success_probs(steps: Steps, state: State, data, batch_size: int,
                             mesh: Mesh) -> tuple[np.ndarray, np.ndarray]:
    """``p_i`` and top-1 correctness of every validation image (inference mode), in split order."""
    ps, correct = [], []
    for batch in data.eval_iterator("validation", batch_size):
        sharded = sh.shard_batch({"image": batch["image"], "label": batch["label"]}, mesh)
        p_B, ok_B = jax.device_get(steps.eval(state["params"], state["batch_stats"], sharded["image"],
                                              sharded["label"]))
        ps.append(np.asarray(p_B, np.float64)[batch["mask"]])
        correct.append(np.asarray(ok_B)[batch["mask"]])
    return np.concatenate(ps), np.concatenate(correct)


def analytic_pass_at_k(p_B: np.ndarray, ks) -> dict[str, float]:
    """``pass@k = mean_i 1 - (1 - p_i)^k`` (exact for a classifier: k independent labels from the softmax)."""
    q = 1.0 - np.clip(np.asarray(p_B, np.float64), 0.0, 1.0)
    return {str(k): float(np.mean(1.0 - q ** k)) for k in ks}


# ------------------------------------------------------------------------------------ run plumbing


@dataclasses.dataclass
class RunContext:
    """What every run of one invocation shares, the optimizer and compiled steps included (bound once)."""

    config: ml_collections.ConfigDict
    workdir: pathlib.Path
    data: Any  # sera_jax.data.images.ImageData
    mesh: Mesh
    graphdef: Any
    allowance: StepAllowance
    tx: optax.GradientTransformation
    steps: Steps
    data_axes: tuple[str, ...] = sh.DATA_AXES


def make_context(config: ml_collections.ConfigDict, workdir: pathlib.Path, data, mesh: Mesh, graphdef,
                 allowance: StepAllowance, data_axes: tuple[str, ...]) -> RunContext:
    tx = optimizer_from_config(config)
    steps = compiled_steps(graphdef, tx, mesh, data_axes, _rl_static(config), config.fast_compile)
    return RunContext(config=config, workdir=workdir, data=data, mesh=mesh, graphdef=graphdef, allowance=allowance,
                      tx=tx, steps=steps, data_axes=data_axes)


def _fresh_state(ctx: RunContext, params, batch_stats) -> State:
    """A replicated copy of the initial state: the train steps donate their input, and the caller's initial
    parameters are shared by other runs (a device_put alone may alias them on the first device)."""
    return jax.device_put(jax.tree.map(jnp.copy, init_state(params, batch_stats, ctx.tx)), ctx.steps.replicated)


def _shard(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, Array]:
    return sh.shard_batch({"image": batch["image"], "label": batch["label"]}, mesh)


def run_pretraining(ctx: RunContext, init_params, init_stats) -> dict[str, Any]:
    """CE pre-training with checkpoints at ``pretrain.checkpoint_steps``: ``{"checkpoint_steps", "steps",
    "resumed_from_step"}``.

    Resumes from the latest checkpoint in ``<workdir>/pretrain``; a finished run does nothing.
    """
    config = ctx.config
    total = config.pretrain.steps
    checkpointer = ckpt_lib.Checkpointer(ctx.workdir / "pretrain", max_to_keep=None,
                                         config_fingerprint=config_utils.fingerprint(config, PRETRAIN_FINGERPRINT))
    with checkpointer:
        iterator = ctx.data.train_iterator(config.optim.batch_size, seed=config.seed,
                                           start_step=checkpointer.latest_step() or 0)

        def step_fn(state: State, step: int):
            lr = lr_at(config, step, total)
            state, metrics = ctx.steps.ce(state, _shard(next(iterator), ctx.mesh), lr)
            return state, {**metrics, "lr": lr}

        metrics_dir = ctx.workdir / "metrics" / "pretrain"
        wandb = writers.wandb_run(config, ctx.workdir, metrics_dir)
        with iterator, writers.MetricWriter(metrics_dir, wandb=wandb) as writer:
            out = run_loop(_fresh_state(ctx, init_params, init_stats), step_fn, num_steps=total,
                           checkpointer=checkpointer, desc="CE pre-training", save_every=config.ckpt.every,
                           save_steps=tuple(config.pretrain.checkpoint_steps), log_every=config.log.every,
                           writer=writer, allowance=ctx.allowance, show_progress=config.log.progress,
                           num_steps_field="config.pretrain.steps")
    if out.start_step:
        logging.info("pre-training: resumed from step %d", out.start_step)
    return {"checkpoint_steps": list(config.pretrain.checkpoint_steps), "steps": total,
            "resumed_from_step": out.start_step}


def load_pretrained(ctx: RunContext, step: int, init_params, init_stats):
    """(params, batch_stats) of the CE checkpoint at ``step``."""
    config = ctx.config
    replicated = NamedSharding(ctx.mesh, PartitionSpec())
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                            jax.eval_shape(lambda: init_state(init_params, init_stats, ctx.tx)))
    with ckpt_lib.Checkpointer(ctx.workdir / "pretrain", max_to_keep=None,
                               config_fingerprint=config_utils.fingerprint(config, PRETRAIN_FINGERPRINT)) as c:
        state, _ = c.restore(step, template)
    return state["params"], state["batch_stats"]


def rl_methods(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The RL methods of ``config.dynamics.methods`` in order: the branches of the RL step's allocator switch."""
    return tuple(m for m in config.dynamics.methods if m != CROSS_ENTROPY)


def _rl_static(config: ml_collections.ConfigDict) -> tuple:
    """Static settings of the RL step (hashable, for the jit cache)."""
    d = config.dynamics
    n_bar = d.rollouts_per_prompt
    n_min = max(config.sera.n_min, core.get_estimator(d.estimator).min_rollouts)
    return (("methods", rl_methods(config)), ("budget", config.optim.batch_size * n_bar),
            ("estimator", d.estimator), ("n_min", n_min), ("n_max", max(config.sera.n_max_factor * n_bar, n_min)),
            ("threshold", float(d.activation_threshold)), ("correction", bool(d.correction)))


def rule_fingerprint(method: str) -> dict[str, str]:
    """What a run's checkpoints record beyond the config: the released SERA rule for the methods that run it
    ('sera' named the all-active max–min before the released rule took its name; a checkpoint saved then lacks
    this entry, so resuming it under the new rule is refused with the field named)."""
    if method != CROSS_ENTROPY and core.get_allocator(method).may_skip_prompts:
        return {"sera_rule": "released (active set, zero-rollout prompts)"}
    return {}


P_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def evaluation_record(p_B: np.ndarray, correct_B: np.ndarray, ks, rollouts_spent: int) -> dict[str, Any]:
    """One validation evaluation as the RL comparisons record theirs (``sera_jax.report.stats.summarize_runs``
    reads ``k`` and ``pass_at_k``; ``rollouts_spent`` 0 marks the start): analytic pass@k at ``ks``, top-1
    ``accuracy`` and quantiles of the per-image p."""
    pass_at_k = analytic_pass_at_k(p_B, ks)
    return {"k": [int(k) for k in ks], "pass_at_k": [pass_at_k[str(k)] for k in ks],
            "accuracy": float(np.mean(correct_B)), "rollouts_spent": int(rollouts_spent),
            "p_quantiles": {str(q): float(np.quantile(p_B, q)) for q in P_QUANTILES}}


def run_dynamics(ctx: RunContext, method: str, seed: int, build_model: Callable,
                 run_dir: pathlib.Path | None = None) -> dict[str, Any]:
    """One training run: ``method`` (``config.DYNAMICS_METHODS``) from the initialisation of ``seed``.

    Every method of a seed shares the initialisation, the data order (``train_iterator(seed=seed)``) and the
    sampling key ``fold_in(key(seed), step)``, whose rollout j of image i is labelled from a number keyed by (i, j)
    alone (``estimators.rollout_uniforms``): common random numbers, so a seed's methods differ by their allocation.
    Checkpoints and metrics go to ``run_dir`` (``checkpoints/``, ``metrics/``), by default to
    ``<workdir>/dynamics/<method>_seed<seed>`` and ``<workdir>/metrics/<method>_seed<seed>``.

    Returns ``{"step": [...], "pass_at_k": {k: [...]}, "accuracy": [...], "resumed_from_step": s, "evaluations",
    "history", "rollouts_spent"}``: the validation curves (at step 0, every ``eval_every`` steps and at the end),
    where this invocation started, the evaluation records (``evaluation_record``), the logged training metrics
    (``grad_cosine`` at the monitored steps) and the rollouts the run sampled.
    """
    config = ctx.config
    d = config.dynamics
    _, params, stats = build_model(seed)  # the same initialisation for every method of this seed
    fingerprint = config_utils.fingerprint(config, DYNAMICS_FINGERPRINT)
    fingerprint.update(method=method, seed=seed, **rule_fingerprint(method))
    base_key = jax.random.key(seed)
    rl = method != CROSS_ENTROPY
    budget = config.optim.batch_size * d.rollouts_per_prompt if rl else 0
    put = functools.partial(jax.device_put, device=ctx.steps.replicated)
    index = put(jnp.int32(rl_methods(config).index(method))) if rl else None
    monitor_flags = {True: put(jnp.bool_(True)), False: put(jnp.bool_(False))}

    def evaluate(state: State, step: int):
        p_val, correct = validation_success_probs(ctx.steps, state, ctx.data, config.data.eval_batch_size, ctx.mesh)
        record = evaluation_record(p_val, correct, d.pass_k, step * budget)
        scalars = {"val/accuracy": record["accuracy"],
                   **{f"val/pass@{k}": v for k, v in zip(record["k"], record["pass_at_k"])}}
        return record, scalars

    if run_dir is None:
        ckpt_dir = ctx.workdir / "dynamics" / f"{method}_seed{seed}"
        metrics_dir = ctx.workdir / "metrics" / f"{method}_seed{seed}"
    else:
        ckpt_dir, metrics_dir = run_dir / "checkpoints", run_dir / "metrics"
    checkpointer = ckpt_lib.Checkpointer(ckpt_dir, max_to_keep=2, config_fingerprint=fingerprint)
    with checkpointer:
        iterator = ctx.data.train_iterator(config.optim.batch_size, seed=seed,
                                           start_step=checkpointer.latest_step() or 0)

        def step_fn(state: State, step: int):
            batch = _shard(next(iterator), ctx.mesh)
            lr = lr_at(config, step, d.steps)
            if not rl:
                state, metrics = ctx.steps.ce(state, batch, lr)
                return state, {**metrics, "lr": lr}
            key = put(jax.random.fold_in(base_key, step))
            monitor = bool(d.monitor_every) and (step + 1) % d.monitor_every == 0  # after the m-th, 2m-th ... update
            state, metrics = ctx.steps.rl(state, batch, lr, key, index, monitor_flags[monitor])
            if not monitor:
                metrics = {k: v for k, v in metrics.items() if k != "grad_cosine"}
            return state, {**metrics, "lr": lr}

        wandb = writers.wandb_run(config, ctx.workdir, metrics_dir)
        with iterator, writers.MetricWriter(metrics_dir, wandb=wandb) as writer:
            out = run_loop(_fresh_state(ctx, params, stats), step_fn, num_steps=d.steps, checkpointer=checkpointer,
                           desc=f"{method} seed {seed}", evaluate=evaluate, eval_every=d.eval_every,
                           save_every=config.ckpt.every, log_every=config.log.every, writer=writer,
                           metric_prefix="train/", allowance=ctx.allowance, show_progress=config.log.progress,
                           num_steps_field="config.dynamics.steps")
    evals = out.evaluations
    return {"step": [e["step"] for e in evals], "accuracy": [e["accuracy"] for e in evals],
            "pass_at_k": {str(k): [e["pass_at_k"][j] for e in evals] for j, k in enumerate(d.pass_k)},
            "resumed_from_step": out.start_step, "evaluations": evals, "history": out.history,
            "rollouts_spent": d.steps * budget}
