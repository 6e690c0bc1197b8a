"""Cost of one sampled estimator gradient by a VJP of the logits, against a plain backward pass and against
the per-example-gradient route, measured in the same run (experiments/imagenet_alignment, docs/method.md §8A).

    .venv/bin/python benchmarks/bench_estimator_vjp.py            # the cpu config: P = 256 digits, N_bar = 8
    .venv/bin/python benchmarks/bench_estimator_vjp.py --quick    # fewer repeats
    .venv/bin/python benchmarks/bench_estimator_vjp.py --config=gpu --prompts=64   # ResNet-50 at 224 px, on a GPU

The batch is the analysis set of the config (P images, BatchNorm in inference mode; random images of the
right shape for the gpu config) with its model at initialisation; MaxRL's estimator with B = P N_bar labels
sampled from the softmax (uniform allocation). The per-rollout route holds B per-example gradients at once:
keep P small for ResNet-50.

* backward: ``jax.grad`` of the mean cross-entropy, a forward and a backward pass on the batch;
* VJP draw: forward, sample B labels, build the cotangent ``c_i = sum_j w_ij A_ij (onehot(y_ij) - pi_i)``,
  one backward pass (``jax.vjp``): the whole estimator, as the analysis computes it;
* VJP, M draws: one forward and M vmapped backward passes, per draw;
* per-example routes, the same estimator from ``vmap(grad)``: the score ``grad log pi(y_ij|x_i)`` of each of
  the B rollouts weighted by ``w_ij A_ij`` (the definition), and the P per-prompt gradients ``J_i^T c_i``.

Checks (a failure exits with status 1; timings are only reported): the per-example routes give the VJP's
gradient on the same sampled labels.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common import median_ms, report_failures, target_line
from experiments.imagenet_alignment import config as config_lib
from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment import model as model_lib
from sera_jax import core
from sera_jax.models import resnet

ESTIMATOR = "maxrl"


def make_batch(config, num_prompts: int, rng: np.random.Generator):
    """The config's analysis images (digits: the real ones; otherwise random images of the right shape)."""
    if config.data.name == "digits":
        from experiments.imagenet_alignment.experiment import analysis_set, load_data

        x, labels = analysis_set(load_data(config), num_prompts)
        return jnp.asarray(x), jnp.asarray(labels), 10, 1
    size, classes = (224, 1000) if config.data.name == "imagenet2012" else (32, 10)
    x = rng.normal(size=(num_prompts, size, size, 3)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(rng.integers(0, classes, num_prompts), jnp.int32), classes, 3


def build(config, num_prompts: int, n_bar: int, draws: int, rng):
    x, labels, num_classes, channels = make_batch(config, num_prompts, rng)
    graphdef, params, stats = model_lib.build_model(config, num_classes, channels, seed=0)
    logits = functools.partial(model_lib.logits_fn, graphdef)
    budget = num_prompts * n_bar
    counts = core.uniform_counts(num_prompts, budget)

    @jax.jit
    def backward(params):
        """The gradient of the mean cross-entropy: one forward, one backward."""
        return jax.grad(lambda p: -jnp.mean(jnp.take_along_axis(
            jax.nn.log_softmax(logits(p, stats, x)), labels[:, None], axis=1)))(params)

    def sample(key, probs):
        sampled, ids = E.sample_rollouts(key, probs, counts, budget)
        return sampled, ids, E.estimator_cotangent(probs, labels, sampled, ids, estimator=ESTIMATOR, correction=True)

    @jax.jit
    def vjp_draw(params, key):
        """The estimator: forward, sample, cotangent, one backward pass."""
        out, vjp_fn = jax.vjp(lambda p: logits(p, stats, x), params)
        sampled, ids, cot = sample(key, jax.nn.softmax(jax.lax.stop_gradient(out)))
        return vjp_fn(cot)[0], sampled, ids

    @jax.jit
    def vjp_draws(params, keys):
        """M draws: one forward, M vmapped backward passes."""
        out, vjp_fn = jax.vjp(lambda p: logits(p, stats, x), params)
        probs = jax.nn.softmax(jax.lax.stop_gradient(out))
        return jax.vmap(lambda k: vjp_fn(sample(k, probs)[2])[0])(keys)

    probs = jax.nn.softmax(logits(params, stats, x))

    @jax.jit
    def per_rollout(params, sampled, ids):
        """Definition: sum_b w_b A_b grad log pi(y_b | x_b), one vmapped per-example gradient per rollout."""
        rewards = (sampled == labels[ids]).astype(jnp.float32)
        coef = core.loss_weights(ids, num_prompts) * core.advantages(rewards, ids, num_prompts, ESTIMATOR)

        def score(p, x_HxWxC, label):
            return jax.nn.log_softmax(logits(p, stats, x_HxWxC[None])[0])[label]

        scores = jax.vmap(jax.grad(score), in_axes=(None, 0, 0))(params, x[ids], sampled)
        return jax.tree.map(lambda s: jnp.tensordot(coef, s, axes=1), scores)

    @jax.jit
    def per_prompt(params, sampled, ids):
        """P per-prompt gradients J_i^T c_i (vmapped), summed."""
        cot = E.estimator_cotangent(probs, labels, sampled, ids, estimator=ESTIMATOR, correction=True)

        def one(x_HxWxC, c_K):
            _, vjp_fn = jax.vjp(lambda p: logits(p, stats, x_HxWxC[None])[0], params)
            return vjp_fn(c_K)[0]

        return jax.tree.map(lambda g: jnp.sum(g, axis=0), jax.vmap(one)(x, cot))

    return dict(params=params, backward=backward, vjp_draw=vjp_draw, vjp_draws=vjp_draws, per_rollout=per_rollout,
                per_prompt=per_prompt, budget=budget, draws=draws,
                num_params=resnet.count_params(nnx.merge(graphdef, params, stats)))


def interleaved_medians_ms(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall time (ms) of each function, timed round-robin after one warm-up call each.

    Interleaving spreads a shared machine's load changes over all rows alike, so their ratios stay fair
    (``common.median_ms`` times one function after the other).
    """
    for fn in fns.values():
        median_ms(fn, repeats=1, warmup=1)  # compile and warm up
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(median_ms(fn, repeats=1, warmup=0))
    return {name: float(np.median(values)) for name, values in samples.items()}


def flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(g, np.float64).ravel() for g in jax.tree.leaves(tree)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="cpu", choices=("tiny", "cpu", "gpu"), help="experiment variant")
    parser.add_argument("--prompts", type=int, default=0, help="P (default: the config's analysis.num_prompts)")
    parser.add_argument("--n_bar", type=int, default=8, help="average rollouts per prompt")
    parser.add_argument("--draws", type=int, default=8, help="M, the draws of the vmapped-draws row")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeats", type=int, default=11, help="timed calls per row (median reported)")
    args = parser.parse_args(argv)
    config = config_lib.get_config(args.config)
    num_prompts = args.prompts or config.analysis.num_prompts
    repeats = 3 if args.quick else args.repeats
    b = build(config, num_prompts, args.n_bar, args.draws, np.random.default_rng(0))
    params, key = b["params"], jax.random.key(0)
    keys = jax.random.split(key, args.draws)
    grads, sampled, ids = b["vjp_draw"](params, key)

    device = jax.devices()[0]
    print(f"estimator gradient by VJP: config {args.config} ({config.model.name}, {b['num_params']:,} parameters), "
          f"P = {num_prompts}, N_bar = {args.n_bar}, B = {b['budget']} sampled labels, {ESTIMATOR}")
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (wall clock: a busy machine inflates every row)\n")
    rows = {
        "backward (CE forward + backward)": (lambda: b["backward"](params), 1),
        "VJP estimator, one draw": (lambda: b["vjp_draw"](params, key), 1),
        f"VJP estimator, {args.draws} draws vmapped (per draw)": (lambda: b["vjp_draws"](params, keys), args.draws),
        "per-prompt gradients vmap(vjp), P of them": (lambda: b["per_prompt"](params, sampled, ids), 1),
        "per-rollout scores vmap(grad), B of them": (lambda: b["per_rollout"](params, sampled, ids), 1),
    }
    times = interleaved_medians_ms({name: fn for name, (fn, _) in rows.items()}, repeats)
    times = {name: ms / rows[name][1] for name, ms in times.items()}
    base = times["backward (CE forward + backward)"]
    draw = times["VJP estimator, one draw"]
    print(f"{'':48} {'ms':>10} {'/ backward':>11} {'/ VJP draw':>11}")
    for name, ms in times.items():
        print(f"{name:48} {ms:>10.2f} {ms / base:>10.2f}x {ms / draw:>10.1f}x")

    failures = []
    reference = flat(grads)
    scale = np.abs(reference).max()
    for name, fn in (("per-rollout", b["per_rollout"]), ("per-prompt", b["per_prompt"])):
        err = np.abs(flat(fn(params, sampled, ids)) - reference).max() / scale
        status = "ok" if err < 1e-3 else "FAILED"
        print(f"check: {name} route equals the VJP estimator, max relative difference {err:.1e}  {status}")
        if err >= 1e-3:
            failures.append(f"{name} route differs from the VJP by {err:.2e}")

    per_rollout = times["per-rollout scores vmap(grad), B of them"]
    per_prompt = times["per-prompt gradients vmap(vjp), P of them"]
    print("\ntargets (from the issue, for the cpu config; informative only):")
    print(target_line("one VJP draw <= 1.5x a backward pass", f"{draw / base:.2f}x", draw / base <= 1.5))
    print(target_line(">= 10x faster than per-rollout vmap(grad)", f"{per_rollout / draw:.1f}x",
                      per_rollout / draw >= 10))
    print(f"  (the per-prompt route, which already folds each prompt's rollouts into one cotangent, is "
          f"{per_prompt / draw:.1f}x a VJP draw)")
    return report_failures(failures)


if __name__ == "__main__":
    sys.exit(main())
