"""The controlled gradient-alignment experiment (experiments/imagenet_alignment) on its tiny config.

Independent checks: advantages and loss weights recomputed per prompt in NumPy from docs/method.md's formulas;
the VJP estimator against per-rollout gradients (``vmap(grad)``); the exact gradient against the
cross-entropy gradient (``jax.grad``); Monte Carlo means of sampled estimates against the analytic
expectations, with a stated standard-error tolerance; the pilot's closed-form moments against a binomial
table; a sharded analysis against a one-device one; a killed-and-resumed run against an uninterrupted one. The
training mode (paper_imagenet_tiny): the authors' learning-rate schedule, the paper config's settings, one RL
step's update and gradient monitor against ``jax.grad``, and a killed-and-resumed comparison's results.json.

Everything compiles the one-block ResNet of the tiny config with LLVM's optimisations off
(``config.fast_compile``), and shares jitted functions with the end-to-end runs (module-scoped fixtures).
"""

import dataclasses
import functools
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.imagenet_alignment import analysis as A
from experiments.imagenet_alignment import budgets as budgets_lib
from experiments.imagenet_alignment import config as config_lib
from experiments.imagenet_alignment import estimators as E
from experiments.imagenet_alignment import experiment
from experiments.imagenet_alignment import main as main_lib
from experiments.imagenet_alignment import methods as methods_lib
from experiments.imagenet_alignment import model as model_lib
from experiments.imagenet_alignment import programs, training
from experiments.imagenet_alignment import weight_profiles as W
from experiments.imagenet_alignment.cosines import cosine_and_error
from experiments.imagenet_alignment.settings import AnalysisSettings
from sera_jax import core
from sera_jax.core import dars as dars_lib
from sera_jax.core import keep as keep_lib
from sera_jax.train import sharding as sh

# A Monte Carlo mean must lie within this many standard errors of its expectation (per entry). With a few
# hundred entries per check, a correct pipeline fails by chance with probability < 1e-4.
Z_TOLERANCE = 5.0
ESTIMATORS = ("maxrl", "maxrl_no_baseline", "grpo", "rloo")
METHOD_STATS = ("cos_expected", "cos_sampled_mean", "cos_sampled_ci95", "rel_err_mean")


# ------------------------------------------------------------------------------------------ fixtures


def tiny_config():
    config = config_lib.get_config("tiny")
    config_lib.validate_config(config)
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny runs on the 8 forced CPU devices: killed after 13 optimizer steps (inside the dynamics)
    then resumed in the same workdir, and an uninterrupted one in another workdir."""
    config = tiny_config()
    resumed_dir = tmp_path_factory.mktemp("resumed")
    fresh_dir = tmp_path_factory.mktemp("fresh")
    # 6 pre-training steps, then cross_entropy seed 0 (4 steps) and 3 steps of seed 1 (checkpointed at step 2).
    stopped = experiment.run(config, resumed_dir, stop_after=13, make_figures=False)
    partial = {"results_exists": (resumed_dir / "results.json").exists(),
               "pretrain_steps": sorted(p.name for p in (resumed_dir / "pretrain").iterdir() if p.name.isdigit())}
    resumed = experiment.run(config, resumed_dir)
    fresh = experiment.run(config, fresh_dir, make_figures=False)
    return {"config": config, "stopped": stopped, "partial": partial, "resumed": resumed, "fresh": fresh,
            "resumed_dir": resumed_dir}


@pytest.fixture(scope="module")
def tiny_model():
    """(graphdef, params, batch_stats, mesh, compiled analysis functions, images, labels) of the tiny
    config, with randomised BatchNorm statistics so that inference mode is not the identity."""
    config = tiny_config()
    data = experiment.load_data(config)
    graphdef, params, stats = model_lib.build_model(config, data.num_classes, 1, config.seed)
    leaves, treedef = jax.tree.flatten(stats)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    stats = jax.tree.unflatten(treedef, [jax.random.uniform(k, l.shape, minval=0.5, maxval=1.5)
                                         for k, l in zip(keys, leaves)])
    # Perturbed weights spread p over ~[0.02, 0.25]: SERA's allocation differs from uniform, and no prompt is
    # so hard that a Monte Carlo test would see no success at all.
    params = jax.tree.map(lambda p: p + 0.2 * jax.random.normal(jax.random.key(8), p.shape), params)
    x, labels = experiment.analysis_set(data, config.analysis.num_prompts)
    mesh = sh.make_mesh(config.mesh)
    fns = programs.compiled(graphdef, mesh, tuple(sh.DATA_AXES), config.analysis.draw_chunk, 1, True)
    params, stats = jax.device_put((params, stats), fns.replicated)
    batch = sh.shard_batch({"x": x, "y": labels}, mesh)
    probs, p, _, exact_block = fns.forward(params, stats, batch["x"], batch["y"])
    assert 0.01 < float(jnp.min(p)) and float(jnp.max(p)) < 0.5, np.asarray(p)
    return dict(config=config, graphdef=graphdef, params=params, stats=stats, mesh=mesh, fns=fns, x=batch["x"],
                labels=batch["y"], x_host=x, labels_host=labels, probs=probs, p=p, exact_block=exact_block)


@pytest.fixture(scope="module")
def tiny_analysis(tiny_model):
    """``analyse_checkpoint`` of the tiny model on the 8-device mesh (every method of the tiny config)."""
    m = tiny_model
    settings = AnalysisSettings.from_config(m["config"])
    host = jax.device_get((m["params"], m["stats"]))
    return A.analyse_checkpoint(settings, m["graphdef"], *host, m["x_host"], m["labels_host"], m["mesh"],
                                jax.random.key(21))


# ------------------------------------------------------------------------------------------ references


def reference_advantages(rewards, estimator):
    """``f(r, K, N)`` of docs/method.md §2 for one prompt's rewards (NumPy float64)."""
    r = np.asarray(rewards, np.float64)
    n, k = len(r), r.sum()
    if estimator == "maxrl":
        return np.zeros(n) if k == 0 else (r - k / n) / (k / n)
    if estimator == "maxrl_no_baseline":
        return np.zeros(n) if k == 0 else r * n / k
    if estimator == "grpo":
        std = math.sqrt(k * (n - k) / (n * (n - 1))) if n > 1 else 0.0
        return (r - k / n) / (std + 1e-6)
    if estimator == "rloo":
        return r - (k - r) / (n - 1)
    raise AssertionError(estimator)


def reference_cotangent(probs, labels, sampled, prompt_ids, budget, estimator, correction):
    """``c_i = sum_j w_ij A_ij (onehot(y_ij) - pi_i)`` prompt by prompt; rows with id P are padding."""
    probs = np.asarray(probs, np.float64)
    num_prompts, num_classes = probs.shape
    sampled, prompt_ids = np.asarray(sampled), np.asarray(prompt_ids)
    cot = np.zeros_like(probs)
    for i in range(num_prompts):
        rows = np.flatnonzero(prompt_ids == i)
        if rows.size == 0:
            continue
        adv = reference_advantages(sampled[rows] == labels[i], estimator)
        weight = 1.0 / (num_prompts * rows.size) if correction else 1.0 / budget
        for j, row in enumerate(rows):
            cot[i] += weight * adv[j] * (np.eye(num_classes)[sampled[row]] - probs[i])
    return cot


def assert_within_standard_errors(samples_NxD, expected_D, what, atol=1e-6, z=Z_TOLERANCE):
    """Every coordinate of the mean of N samples within ``z`` standard errors of its expectation."""
    samples = np.asarray(samples_NxD, np.float64).reshape(len(samples_NxD), -1)
    expected = np.asarray(expected_D, np.float64).reshape(-1)
    mean = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / math.sqrt(len(samples))
    excess = np.abs(mean - expected) - z * se - atol
    worst = int(np.argmax(excess))
    assert excess[worst] <= 0, (f"{what}: coordinate {worst} has mean {mean[worst]:.6g}, expected "
                                f"{expected[worst]:.6g}, standard error {se[worst]:.3g}")


def tree_rows(grads_C, count):
    """Flattened gradients (count x D) from a params pytree with a leading chunk axis."""
    return np.concatenate([np.asarray(g, np.float64).reshape(g.shape[0], -1)[:count]
                           for g in jax.tree.leaves(grads_C)], axis=1)


# ------------------------------------------------------------------------------------------ config


def test_config_validation_names_the_field():
    config = tiny_config()
    bad = config_lib.get_config("tiny")
    bad.analysis.unknown_knob = 3
    with pytest.raises(ValueError, match="config.analysis.unknown_knob"):
        config_lib.validate_config(bad)
    cases = {
        "analysis.budgets": (8, 4),
        "analysis.num_draws": 1,
        "analysis.estimators": ("maxrl", "ppo"),
        "dynamics.methods": ("cross_entropy", "dpo"),
        "dynamics.monitor_every": 3,  # not a multiple of log.every (2): a monitored step would not be kept
        "dynamics.early_step": 3,  # not an evaluated step
        "dynamics.endpoint_k": 2,  # not in pass_k
        "dynamics.activation_threshold": 1.5,
        "optim.max_grad_norm": -1.0,
        "optim.lr": -1.0,
        "pretrain.checkpoint_steps": (0, 99),
        "analysis.norm_budget": 3,
        "analysis.allocators": ("uniform", "thompson"),  # not a registered allocator
        "analysis.keep_per_prompt": 1,  # PODS / Reinforce-Ada keep both classes
        "analysis.round_size": 0,
    }
    for field, value in cases.items():
        bad = config_lib.get_config("tiny")
        section, name = field.split(".")
        bad[section][name] = value
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            config_lib.validate_config(bad)
    for allocators, estimators in ((("sera", "dynamo"), ("maxrl",)),  # no uniform baseline
                                   (("uniform", "uniform"), ("maxrl",)),  # twice
                                   (("uniform", "sera_sum"), ("rloo",)),  # undefined for every estimator
                                   (("uniform", "mopps"), ("maxrl",)),  # registered, but selects prompts
                                   (("uniform", "dapo", "pod"), ("maxrl",))):  # a typo of an online method
        bad = config_lib.get_config("tiny")
        bad.analysis.allocators, bad.analysis.estimators = allocators, estimators
        with pytest.raises(ValueError, match=r"config\.analysis\.allocators"):
            config_lib.validate_config(bad)
    bad = config_lib.get_config("tiny")
    bad.data.name = "imagenet2012"
    with pytest.raises(ValueError, match="data_dir"):
        config_lib.validate_config(bad)
    gpu = config_lib.get_config("gpu")
    gpu.data.data_dir = "/data/tfds"
    config_lib.validate_config(gpu)
    for variant in ("cpu", "paper_imagenet_tiny", "classification", "classification_n16"):
        config_lib.validate_config(config_lib.get_config(variant))
    bad = config_lib.get_config("tiny")
    bad.dynamics.methods = ("ce", "uniform")  # the old name of cross_entropy
    with pytest.raises(ValueError, match=r"config\.dynamics\.methods contains 'ce' \('ce' is now 'cross_entropy'\)"):
        config_lib.validate_config(bad)
    bad = config_lib.get_config("tiny")
    bad.data.analysis_size = 0  # the alignment mode analyses that split
    with pytest.raises(ValueError, match=r"config\.data\.analysis_size"):
        config_lib.validate_config(bad)
    del config


def test_command_line_parses_the_config_and_rejects_bad_overrides(tmp_path, monkeypatch, capsys):
    flags = main_lib.flags.FLAGS
    path = config_lib.__file__

    def parse(*args):
        argv = ["main", f"--config={path}:tiny", f"--workdir={tmp_path}", *args]
        monkeypatch.setattr("sys.argv", argv)  # config_flags reads --config.* overrides from sys.argv
        flags.unparse_flags()
        flags(argv)

    try:
        parse("--config.analysis.budgets=(8,4)")
        with pytest.raises(SystemExit) as exit_info:  # the command line prints the ValueError as one FATAL line
            main_lib.main(["main"])
        assert exit_info.value.code == 1
        assert "FATAL ValueError: config.analysis.budgets" in capsys.readouterr().err
        parse("--stop_after=0")
        main_lib.main(["main"])  # builds everything, then stops before the first optimizer step
    finally:
        flags.unparse_flags()
    assert (tmp_path / "pretrain").is_dir() and not (tmp_path / "results.json").exists()


# ------------------------------------------------------------------------------------------ estimator maths


def sample_and_cotangent(key, probs, labels, counts, budget, *, estimator, total, length, correction):
    sampled, ids = E.sample_rollouts(key, probs, counts, total, length=length)
    return sampled, ids, E.estimator_cotangent(probs, labels, sampled, ids, estimator=estimator,
                                               correction=correction, budget=budget if length else None)


_sample_and_cotangent = jax.jit(sample_and_cotangent, static_argnames=("estimator", "total", "length", "correction"),
                                compiler_options=model_lib.FAST_COMPILE)


@functools.partial(jax.jit, static_argnames=("padded",), compiler_options=model_lib.FAST_COMPILE)
def _all_cotangents(probs, labels, sampled, ids, budget, *, padded):
    """Every estimator's cotangent, with and without the correction, for one given draw of rollouts."""
    return {(est, correction): E.estimator_cotangent(probs, labels, sampled, ids, estimator=est, correction=correction,
                                                     budget=budget if padded else None)
            for est in ESTIMATORS for correction in (True, False)}


def test_cotangent_matches_per_prompt_reference():
    rng = np.random.default_rng(0)
    num_prompts, num_classes = 5, 4
    probs = jax.nn.softmax(jnp.asarray(rng.normal(size=(num_prompts, num_classes)) * 1.5, jnp.float32))
    labels = np.asarray([0, 1, 2, 3, 0])
    counts = np.asarray([2, 5, 3, 2, 4])  # B = 16, uneven as SERA makes them
    ids = np.repeat(np.arange(num_prompts), counts)
    # Labels drawn from the softmax, plus forced successes and failures so every branch is exercised.
    probs64 = np.asarray(probs, np.float64)
    sampled = np.asarray([rng.choice(num_classes, p=probs64[i] / probs64[i].sum()) for i in ids])
    sampled[[0, 2, 7]] = labels[ids[[0, 2, 7]]]
    sampled[1] = (labels[0] + 1) % num_classes
    for padded in (False, True):  # the exact layout, and 8 padding rows (id P) as in the analysis
        ids_in = np.concatenate([ids, np.full(8, num_prompts)]) if padded else ids
        sampled_in = np.concatenate([sampled, rng.integers(0, num_classes, 8)]) if padded else sampled
        cots = _all_cotangents(probs, jnp.asarray(labels), jnp.asarray(sampled_in), jnp.asarray(ids_in), 16,
                               padded=padded)
        for (est, correction), cot in cots.items():
            ref = reference_cotangent(probs, labels, sampled, ids, 16, est, correction)
            np.testing.assert_allclose(cot, ref, rtol=2e-5, atol=2e-6, err_msg=f"{est} {correction} {padded}")


def test_padded_layout_puts_the_budget_first():
    ids = jax.jit(E.flat_layout, static_argnums=2)(jnp.asarray([2, 0, 3]), jnp.int32(5), 9)
    np.testing.assert_array_equal(ids, [0, 0, 2, 2, 2, 3, 3, 3, 3])


def test_sampled_labels_follow_the_softmax():
    probs = jnp.asarray([[0.7, 0.2, 0.1, 0.0], [0.0, 0.05, 0.0, 0.95], [0.25, 0.25, 0.25, 0.25]])
    draws = 30_000
    counts = jnp.full((3,), draws)
    sampled, ids = jax.jit(E.sample_rollouts, static_argnums=3, compiler_options=model_lib.FAST_COMPILE)(
        jax.random.key(3), probs, counts, 3 * draws)
    sampled, ids = np.asarray(sampled), np.asarray(ids)
    for i in range(3):
        freq = np.bincount(sampled[ids == i], minlength=4) / draws
        se = np.sqrt(np.asarray(probs[i]) * (1 - np.asarray(probs[i])) / draws)
        assert np.all(np.abs(freq - np.asarray(probs[i])) <= Z_TOLERANCE * se + 1e-12), (i, freq)
    assert not np.any(sampled[ids == 0] == 3) and not np.any(sampled[ids == 1] == 0)  # zero-probability classes


_sample_rollouts = jax.jit(E.sample_rollouts, static_argnums=3, static_argnames=("length",),
                           compiler_options=model_lib.FAST_COMPILE)


def test_rollouts_are_keyed_by_prompt_and_rank():
    """Common random numbers: with one key, rollout j of prompt i is the same label whatever the counts, in the
    exact layout and in the analysis's padded one, and the pilot is ranks 0..n0-1 of each prompt. Over 1000
    equiprobable classes two independent labels agree with probability 1e-3: a draw keyed by anything else fails."""
    num_classes = 1000
    probs = jnp.full((3, num_classes), 1.0 / num_classes)
    key = jax.random.key(12)
    groups = []
    for counts, length in (((5, 7, 3), None), ((8, 2, 3), None), ((8, 2, 3), 20), ((2, 2, 2), 20)):
        labels, ids = (np.asarray(v) for v in _sample_rollouts(key, probs, jnp.asarray(counts), sum(counts),
                                                                length=length))
        groups.append([labels[ids == i] for i in range(3)])
        assert [len(g) for g in groups[-1]] == list(counts)
    for a in groups:
        for b in groups:
            for i in range(3):
                common = min(len(a[i]), len(b[i]))
                np.testing.assert_array_equal(a[i][:common], b[i][:common])
    assert len(set(np.concatenate(groups[0]).tolist())) > 12  # the labels are not all the same
    pilot, successes = E.sample_pilot(key, probs, jnp.asarray([groups[0][i][0] for i in range(3)]), 2)
    np.testing.assert_array_equal(pilot, [g[:2] for g in groups[0]])
    assert np.all(np.asarray(successes) >= 1)  # the labels of rank 0 were made the targets
    other, _ = _sample_rollouts(jax.random.key(13), probs, jnp.asarray((5, 7, 3)), 15)
    assert np.mean(np.asarray(other) == np.concatenate(groups[0])) < 0.5  # another key, other rollouts


@pytest.mark.parametrize("estimator", ["maxrl", "maxrl_no_baseline"])
def test_pilot_closed_form_moments_match_binomial_table(estimator):
    rng = np.random.default_rng(4)
    p = jnp.asarray(np.concatenate([[0.0, 1.0, 1e-4], rng.uniform(0, 1, 37)]), jnp.float32)
    k0 = jnp.asarray(np.concatenate([[0, 2, 0], rng.integers(0, 3, 37)]))
    counts = jnp.asarray(np.concatenate([[2, 9, 40], rng.integers(2, 41, 37)]))
    jit = functools.partial(jax.jit, static_argnames=("n0", "estimator", "max_extra"),
                            compiler_options=model_lib.FAST_COMPILE)
    closed = jit(E.conditional_moments)(p, k0, n0=2, counts_P=counts, estimator=estimator, max_extra=40)
    table = jit(E.conditional_moments_table)(p, k0, n0=2, counts_P=counts, estimator=estimator, max_extra=40)
    np.testing.assert_allclose(closed, table, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------ the VJP route


def test_exact_gradient_equals_cross_entropy_gradient(tiny_model):
    m = tiny_model
    grads_C, *_ = m["fns"].chunk_grads(m["params"], m["stats"], m["x"], m["exact_block"], m["params"])
    exact = jax.tree.map(lambda g: g[0], grads_C)

    def mean_xent(params):
        logits = model_lib.logits_fn(m["graphdef"], params, m["stats"], m["x"])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), m["labels"][:, None], axis=1))

    xent_grad = jax.jit(jax.grad(mean_xent), compiler_options=model_lib.FAST_COMPILE)(m["params"])
    for g, h in zip(jax.tree.leaves(exact), jax.tree.leaves(xent_grad)):
        np.testing.assert_allclose(g, -h, rtol=1e-4, atol=1e-6)


def test_vjp_estimator_equals_per_example_gradient_estimator(tiny_model):
    """The pipeline's sampler, cotangent and VJP program against the same estimators built from per-rollout
    scores, on the same sampled labels."""
    m = tiny_model
    config = m["config"]
    num_prompts = config.analysis.num_prompts
    n_bar, budget = 4, 4 * num_prompts
    counts_sera = jnp.asarray(np.random.default_rng(5).multinomial(budget - 2 * num_prompts,
                                                                   np.ones(num_prompts) / num_prompts) + 2)
    counts_uniform = jnp.full((num_prompts,), n_bar)
    labels_host = np.asarray(m["labels_host"])
    # The explicit route runs on one device: XLA:CPU splits per-example convolution gradients wrongly across
    # devices (see analysis.compiled).
    params_one, stats_one = jax.device_put(jax.device_get((m["params"], m["stats"])), jax.devices()[0])

    def log_prob(params, x_HxWxC, label):
        logits = model_lib.logits_fn(m["graphdef"], params, stats_one, x_HxWxC[None])[0]
        return jax.nn.log_softmax(logits)[label]

    scores_fn = jax.jit(jax.vmap(jax.grad(log_prob), in_axes=(None, 0, 0)), compiler_options=model_lib.FAST_COMPILE)
    for counts, correction in ((counts_uniform, True), (counts_sera, True), (counts_sera, False)):
        sampled, ids, cot = _sample_and_cotangent(jax.random.key(6), m["probs"], m["labels"], counts, budget,
                                                  estimator="maxrl", total=budget, length=None,
                                                  correction=correction)
        block = jnp.zeros((config.analysis.draw_chunk,) + cot.shape).at[0].set(cot)
        grads_C, *_ = m["fns"].chunk_grads(m["params"], m["stats"], m["x"], jax.device_put(block, m["fns"].chunk_rows),
                                           m["params"])
        vjp_grad = tree_rows(grads_C, 1)[0]

        # Explicit route: the score grad log pi(y_b | x_b) of every rollout by vmap(grad), weighted by
        # w_b A_b recomputed per prompt in NumPy.
        scores = scores_fn(params_one, *jax.device_put((m["x_host"][np.asarray(ids)], np.asarray(sampled)),
                                                       jax.devices()[0]))
        scores_BxD = np.concatenate([np.asarray(g, np.float64).reshape(budget, -1) for g in jax.tree.leaves(scores)],
                                    axis=1)
        ids_host, sampled_host = np.asarray(ids), np.asarray(sampled)
        coef = np.zeros(budget)
        for i in range(num_prompts):
            rows = np.flatnonzero(ids_host == i)
            adv = reference_advantages(sampled_host[rows] == labels_host[i], "maxrl")
            coef[rows] = adv / (num_prompts * rows.size) if correction else adv / budget
        explicit = coef @ scores_BxD
        np.testing.assert_allclose(vjp_grad, explicit, rtol=2e-4, atol=1e-6 * np.abs(explicit).max())
        assert np.abs(explicit).max() > 0


# Each method's counts (which allocation) and loss (multiplicity-corrected or not), as docs/method.md §4 and the RL
# experiments' METHODS tables (experiments/maze/config.py) define them; sera_pilot's counts are each draw's own.
METHOD_LOSS = {"uniform": ("uniform", True), "sera": ("sera", True), "sera_pilot": ("sera_pilot", True),
               "sera_no_correction": ("sera", False), "sera_all_active": ("sera_all_active", True),
               "sera_sum": ("sera_sum", True), "dynamo": ("dynamo", False), "knapsack": ("knapsack", False)}
ORACLE_ALLOCATORS = ("sera", "sera_all_active", "sera_sum", "dynamo", "knapsack")


def count_method_draws(m, probs, labels, p, *, calls, seed, pilot_expectation_calls=0, with_pilot=True):
    """``calls`` chunks of draws of every count method's cotangent (``METHOD_LOSS``) from the analysis's own
    programs, at the tiny config's largest N_bar (whose programs the fixtures have compiled): (the draws
    {method: (calls * chunk, P, K)}, the oracle counts {allocator: counts_P}, each method's draw counts
    {method: counts_P}, ``sera_pilot``'s Rao-Blackwellised expected cotangent and effective scales averaged over
    the pilot outcomes of the first ``pilot_expectation_calls`` calls, or None). Call c draws with the keys of
    ``key(seed + c)``; each draw's ``sera_pilot`` allocation is made from that draw's first n0 rollouts
    (``with_pilot=False``: allocations once, and no ``sera_pilot`` draws)."""
    fns, config = m["fns"], m["config"]
    settings = AnalysisSettings.from_config(config)
    num_prompts = config.analysis.num_prompts
    chunk = fns.chunk
    n_bar = max(settings.budgets)  # the tiny config's SERA budget (shares the compiled programs)
    budget = num_prompts * n_bar
    n_min, n_max, n0 = settings.bounds(n_bar, "maxrl")
    max_n = max(settings.bounds(n, "maxrl")[1] for n in settings.budgets)
    length = num_prompts * max(settings.budgets)
    counts_uniform = jax.device_put(jnp.full((num_prompts,), n_bar, jnp.int32), fns.replicated)
    methods = tuple(METHOD_LOSS)
    corrections = jax.device_put(np.asarray([METHOD_LOSS[k][1] for k in methods]), fns.replicated)

    cots = {k: [] for k in methods}
    rb_rows, rb_scales = [], []
    for call in range(calls):
        key_draws, key_outcomes = jax.random.split(jax.random.key(seed + call))
        draw_keys = jax.random.split(key_draws, chunk)
        if with_pilot or call == 0:
            pilot_succ, k0 = fns.pilot_draws(draw_keys, key_outcomes, probs, labels, n0=n0,
                                             num_outcomes=settings.pilot_draws)
            oracle, all_counts = fns.allocations(p, jnp.concatenate([pilot_succ, k0]), budget=budget,
                                                 n_min=n_min, n_max=n_max, n0=n0, estimator="maxrl",
                                                 allocators=ORACLE_ALLOCATORS)
            counts = {"uniform": counts_uniform, "sera_pilot": counts_uniform, **oracle}  # the pilot row is replaced
            draw_counts = jax.device_put(jnp.stack([counts[METHOD_LOSS[k][0]] for k in methods]), fns.replicated)
        draws = fns.draws(draw_keys, probs, labels, draw_counts, corrections, all_counts[:chunk],
                          budget, estimator="maxrl", length=length, methods=methods)
        for k in methods:
            cots[k].append(np.asarray(draws[k]))
        if call < pilot_expectation_calls:  # the Rao-Blackwellised pilot expectation over these calls' outcomes
            halves, s_rb = fns.pilot_expected(probs, labels, k0, all_counts[chunk:], n0=n0,
                                              estimator="maxrl", max_extra=max_n - n0, num_groups=2)
            rb_rows.append(np.asarray(halves).mean(axis=0))
            rb_scales.append(np.asarray(s_rb))
    pilot = (np.mean(rb_rows, axis=0), np.mean(rb_scales, axis=0)) if rb_rows else None
    return ({k: np.concatenate(v) for k, v in cots.items() if with_pilot or k != "sera_pilot"}, oracle,
            {k: np.asarray(counts[METHOD_LOSS[k][0]]) for k in methods if k != "sera_pilot"}, pilot)


@pytest.fixture(scope="module")
def monte_carlo(tiny_model):
    """256 draws of every count method's cotangent from the analysis's own programs at the tiny config's largest
    N_bar, with each method's expected cotangent and effective scales ``s_eff`` (the closed form; ``sera_pilot``'s
    Rao-Blackwellised average over 32 x T pilot outcomes)."""
    m = tiny_model
    fns, config = m["fns"], m["config"]
    settings = AnalysisSettings.from_config(config)
    max_n = max(settings.bounds(n, "maxrl")[1] for n in settings.budgets)
    cots, oracle, counts, (rb_row, rb_scales) = count_method_draws(m, m["probs"], m["labels"], m["p"], calls=64,
                                                                   seed=2000, pilot_expectation_calls=32)
    methods = tuple(METHOD_LOSS)
    fixed_methods = [k for k in methods if k != "sera_pilot"]
    fixed, s_fixed = fns.expected_fixed(m["probs"], m["labels"],
                                        jax.device_put(jnp.stack([counts[k] for k in fixed_methods]), fns.replicated),
                                        jax.device_put(np.asarray([METHOD_LOSS[k][1] for k in fixed_methods]),
                                                       fns.replicated), estimator="maxrl", max_n=max_n)
    expected = {k: np.asarray(fixed[i]) for i, k in enumerate(fixed_methods)}
    expected["sera_pilot"] = rb_row
    s_eff = {k: np.asarray(s_fixed[i], np.float64) for i, k in enumerate(fixed_methods)}
    s_eff["sera_pilot"] = rb_scales
    return dict(methods=methods, cots=cots, expected=expected, s_eff=s_eff, oracle=oracle, chunk=fns.chunk)


def test_monte_carlo_mean_of_sampled_estimates_matches_expected_gradient(tiny_model, monte_carlo):
    """The analysis pipeline's own draw programs are unbiased for the expectations it reports: per cotangent
    entry over 256 draws for every method (the registry's other allocators, with their losses: per label
    entry), and per parameter of
    the gradient over 128 draws (6 standard errors: thousands of coordinates) for uniform and SERA's three
    (the VJP is linear in the cotangent, so the other methods' gradients add nothing new)."""
    m = tiny_model
    fns, config = m["fns"], m["config"]
    num_prompts = config.analysis.num_prompts
    chunk, methods, expected, oracle = (monte_carlo[k] for k in ("chunk", "methods", "expected", "oracle"))
    assert not np.allclose(expected["sera"], expected["uniform"])  # SERA's allocation does change the target
    for k in ("sera_sum", "dynamo", "knapsack"):  # each peer's allocation is its own
        assert not np.array_equal(np.asarray(oracle[k]), np.asarray(oracle["sera"])), k
    labels_host = np.asarray(m["labels_host"])
    for k in methods:
        samples, target = monte_carlo["cots"][k], expected[k]
        if k in ("sera_sum", "dynamo", "knapsack"):
            # These give the hardest prompts the fewest rollouts: a failure on a rare class of such a prompt may
            # never be drawn in 256 draws (its sample standard error is then 0). The label coordinates,
            # w (N - K) 1{K > 0} for maxrl, carry the allocation and the loss weight; the other coordinates
            # only check the sampler, which the methods above do.
            samples = samples[:, np.arange(num_prompts), labels_host]
            target = target[np.arange(num_prompts), labels_host]
        assert_within_standard_errors(samples, target, f"cotangent of {k}")

    # Gradient level: 128 draws through the VJP program against the VJP of the expected cotangent.
    vjp_methods = ("uniform", "sera", "sera_pilot", "sera_no_correction")
    exp_block = jnp.stack([jnp.asarray(expected[k], jnp.float32) for k in vjp_methods])
    exp_grads = tree_rows(m["fns"].chunk_grads(m["params"], m["stats"], m["x"],
                                               jax.device_put(exp_block, fns.chunk_rows), m["params"])[0], 4)
    for i, k in enumerate(vjp_methods):
        draws = monte_carlo["cots"][k][:128]
        grads = np.concatenate([tree_rows(m["fns"].chunk_grads(
            m["params"], m["stats"], m["x"], jax.device_put(jnp.asarray(draws[c:c + chunk]), fns.chunk_rows),
            m["params"])[0], chunk) for c in range(0, 128, chunk)])
        assert_within_standard_errors(grads, exp_grads[i], f"gradient of {k}", atol=1e-5, z=6.0)


def test_projected_scales_match_the_closed_form_effective_scales(tiny_model, monte_carlo):
    """The weight profiles' sampled estimate is unbiased for the closed form: over the 256 draws of the analysis's
    own programs, each prompt's mean projection ``P <c_i, d_i> / |d_i|^2`` (``E.projected_scales``) lies within
    5 standard errors of the draws of its ``s_eff_i`` (``E.expected_cotangent``: SERA's corrected and uncorrected
    losses, the peers' uncorrected ones; ``sera_pilot``: the Rao-Blackwellised average), and each bin's sampled
    profile (``W.sampled_weight_profile``) within 5 of its own standard errors of the closed form's
    (``W.weight_profile``)."""
    m = tiny_model
    p = np.asarray(m["p"], np.float64)
    for k in monte_carlo["methods"]:
        x = np.asarray(E.projected_scales(jnp.asarray(monte_carlo["cots"][k]), m["probs"], m["labels"]))
        target = monte_carlo["s_eff"][k]
        assert_within_standard_errors(x, target, f"projected scales of {k}")
        sampled, closed = W.sampled_weight_profile(p, x), W.weight_profile(p, target)
        assert sampled["draws"] == len(x) == 256
        filled = np.asarray(W.profile_bins(p)["count"]) > 0
        gap = np.abs(np.asarray(sampled["mean"]) - np.asarray(closed["mean"]))[filled]
        assert np.all(gap <= 5 * np.asarray(sampled["se"])[filled] + 1e-6), (k, gap, sampled["se"])


# P = 16 prompts (the tiny config's analysis shape: the analysis's compiled programs serve them) whose p runs from
# hopeless to solved; at N_bar = 8 the released sera gives the two at each end no rollouts.
ZERO_COUNT_P = (1e-4, 0.003, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 0.97, 0.995, 0.9999)


@pytest.fixture(scope="module")
def zero_count_case(tiny_model):
    """The analysis's own budget at N_bar = 8 (``budgets.prepare_budget``: every count method's allocation, loss,
    expected cotangent and effective scales) on the prompts of ``ZERO_COUNT_P`` (label ``i mod K`` with probability
    p_i, the other classes sharing 1 - p_i unevenly), and 256 draws of every count method's cotangent
    (``count_method_draws``, sera_pilot's expectation over their 2,048 pilot outcomes)."""
    m = tiny_model
    fns, config = m["fns"], m["config"]
    num_prompts, num_classes = m["probs"].shape
    labels = np.arange(num_prompts) % num_classes
    share = np.linspace(2.0, 1.0, num_classes - 1)
    probs = np.zeros((num_prompts, num_classes))
    for i, p_i in enumerate(ZERO_COUNT_P):
        probs[i, np.arange(num_classes) != labels[i]] = (1.0 - p_i) * share / share.sum()
        probs[i, labels[i]] = p_i
    # Placed as the forward pass places its outputs, so that the compiled programs serve these arrays too.
    probs = jax.device_put(jnp.asarray(probs, jnp.float32), m["probs"].sharding)
    labels = jax.device_put(jnp.asarray(labels, jnp.int32), m["labels"].sharding)
    p = jax.device_put(E.success_probabilities(probs, labels), m["p"].sharding)
    settings = dataclasses.replace(AnalysisSettings.from_config(config),
                                   allocators=tuple(config_lib.ALLOCATOR_CORRECTION))
    b = budgets_lib.prepare_budget(settings, fns, "maxrl", max(settings.budgets), jax.random.key(5), probs, labels, p)
    cots, _, counts, pilot = count_method_draws(m, probs, labels, p, calls=64, seed=3000, pilot_expectation_calls=64)
    return dict(probs=probs, labels=labels, p=p, budget=b, cots=cots, counts=counts, pilot=pilot)


def test_expected_cotangents_match_their_draws_where_prompts_get_no_rollouts(zero_count_case):
    """Every count method's expected cotangent as the analysis computes it (``prepare_budget``'s rows: the closed
    form of fixed counts under the method's loss; ``sera_pilot``'s Rao-Blackwellised average) against the mean of
    its 256 draws, on prompts from p = 1e-4 to 1 - 1e-4 of which the released sera (and so ``sera_no_correction``)
    gives four no rollouts: each prompt's label entry (which carries its allocation, loss weight and factor; the
    others add the sampler's spread of failures over the classes, whose rare classes 256 draws do not resolve),
    and a random projection of the whole cotangent. A prompt without rollouts has the sampled cotangent 0 in every
    draw, so its expected cotangent and effective scale must be exactly 0: with ``s(p, 0) = 1 - 1/(1 - p)``
    (-9,999 at the solved prompt) its label entries were -0.06 (p = 0.995, 0.9999) and -1.9e-4 (p = 0.003). The label
    entries of the prompts that a method samples but 256 draws do not resolve (fewer than 10 draws expected to
    hold a mixed group: the hopeless and solved ends) are left to the projection. ``dapo``'s expectation (uniform
    counts, none of them 0) is checked in test_dapo_expected_cotangent_matches_monte_carlo; the other online
    methods have none (NaN)."""
    case = zero_count_case
    b = case["budget"]
    num_prompts, num_classes = case["probs"].shape
    prompts, labels = np.arange(num_prompts), np.asarray(case["labels"])
    direction = np.random.default_rng(0).normal(size=(num_prompts, num_classes))
    skipped = np.asarray(b.counts["sera"]) == 0
    assert skipped.tolist() == [True, True] + [False] * 12 + [True, True]
    assert set(b.rows) == set(METHOD_LOSS) - {"sera_pilot"} | {"sera_pilot_a", "sera_pilot_b"}
    for method, counts in case["counts"].items():  # the draws sample the analysis's allocations
        np.testing.assert_array_equal(counts, np.asarray(b.counts[METHOD_LOSS[method][0]]), err_msg=method)
    expected = {k: np.asarray(b.rows[k]) for k in METHOD_LOSS if k != "sera_pilot"}
    expected["sera_pilot"] = case["pilot"][0]
    p = np.asarray(case["p"], np.float64)
    for method, target in expected.items():
        draws = np.asarray(case["cots"][method], np.float64)
        # The prompts the draws resolve: 10 or more draws expected to hold a mixed group (only those carry a
        # gradient), or no rollouts at all (exactly 0 in every draw).
        n = np.asarray(b.counts[METHOD_LOSS[method][0]], np.float64)
        resolved = (n == 0) | (len(draws) * (1.0 - p ** n - (1.0 - p) ** n) >= 10)
        assert resolved.sum() >= 12, (method, resolved)
        assert_within_standard_errors(draws[:, prompts, labels][:, resolved], target[prompts, labels][resolved],
                                      f"label entries of {method}")
        assert_within_standard_errors(np.einsum("mpk,pk->m", draws, direction)[:, None],
                                      [np.sum(target * direction)], f"a projection of {method}")
    for method in ("sera", "sera_no_correction"):
        assert not np.any(case["cots"][method][:, skipped]), method  # no rollouts: 0 in every draw
        assert not np.any(np.asarray(b.rows[method])[skipped]), method
        assert not np.any(np.asarray(b.s_eff[method])[skipped]), method


def test_statistics_of_a_rule_that_skips_prompts(zero_count_case):
    """What the analysis reports beside the released sera's skipped prompts: its scale statistics
    (``A.scale_statistics``) describe the prompts it samples (``active_frac`` says how many), and are NaN when it
    samples none; its weight profile counts a skipped prompt's weight as 0; the gradient-norm figure's factors
    (``E.scale_factors``) are 0 without rollouts, core's ``s(p, N)`` with them, p = 1 included."""
    case = zero_count_case
    b = case["budget"]
    counts, s_eff = np.asarray(b.counts["sera"]), np.asarray(b.s_eff["sera"], np.float64)
    stats = A.scale_statistics(s_eff, counts)
    active = s_eff[counts > 0]
    assert stats["min"] == pytest.approx(active.min()) and stats["min"] > 0.4
    assert stats["max"] == pytest.approx(active.max())
    assert stats["mean"] == pytest.approx(active.mean())
    assert stats["cv"] == pytest.approx(active.std() / active.mean(), rel=1e-4)
    assert all(math.isnan(v) for v in A.scale_statistics(np.ones(3), np.zeros(3)).values())
    p = np.asarray(case["p"], np.float64)
    first = W.bin_indices(p) == 0  # p = 1e-4, 0.003 (skipped) and 0.02
    assert W.weight_profile(p, s_eff)["mean"][0] == pytest.approx(s_eff[first].sum() / 3, rel=1e-5)
    p_test = jnp.asarray([0.003, 0.5, 0.9999, 1.0, 0.2], jnp.float32)
    for estimator in ("maxrl", "grpo"):
        factors = np.asarray(E.scale_factors(p_test, jnp.asarray([0, 0, 0, 0, 3]), estimator=estimator, max_n=4))
        np.testing.assert_array_equal(factors[:4], 0.0)
        assert factors[4] == pytest.approx(float(core.scale_factor(p_test[4], 3, estimator, max_n=4)))


def test_tiny_config_negative_expected_cosines_are_right(tiny_model):
    """The tiny config's analysis at its step-0 checkpoint (the initial model) reports at N_bar = 8 expected cosines
    with ``G*`` of -0.621 (``dynamo``) and -0.513 (``knapsack``) against 0.877 (``uniform``). Every allocation on
    the oracle p, with its method's loss (``METHOD_LOSS`` but ``sera_pilot``), has an expected cosine
    (``cosine_and_error`` of the analysis's chunk Gram matrix) within 5 standard errors of
    the mean of its 256 draws' ``<J^T c_m, G*> / (|J^T E c| |G*|)`` (linear in the cotangent, so unbiased for the
    expected gradient's), and for those two the whole interval is below 0: the negative cosines are right.

    Why: the initial classifier over-predicts three classes, whose five images have the higher p (0.15-0.19
    against 0.06-0.08) and likelihood gradients pointing against ``G*`` (which pushes those classes down); DynaMO
    and Knapsack RL give exactly those images more than N_bar rollouts (10-12 against 3-8), and without the
    multiplicity correction weigh each image by its rollouts, so these images dominate their expected update."""
    m = tiny_model
    fns, config = m["fns"], m["config"]
    settings = AnalysisSettings.from_config(config)
    num_prompts, num_classes = m["probs"].shape
    n_bar, chunk = max(settings.budgets), fns.chunk
    max_n = max(settings.bounds(n, "maxrl")[1] for n in settings.budgets)
    graphdef, params, stats = model_lib.build_model(config, num_classes, 1, config.seed)  # the CE run's start
    params, stats = jax.device_put((params, stats), fns.replicated)
    probs, p, _, exact_block = fns.forward(params, stats, m["x"], m["labels"])
    exact = jax.tree.map(lambda g: g[0], fns.chunk_grads(params, stats, m["x"], exact_block, params)[0])

    def against_exact(block_CxPxK):
        """(Gram matrix, dot products with G*, |G*|^2) of a chunk of cotangents' gradients."""
        _, gram, dots, target_sq = fns.chunk_grads(params, stats, m["x"], jax.device_put(
            jnp.asarray(block_CxPxK, jnp.float32), fns.chunk_rows), exact)
        return np.asarray(gram, np.float64), np.asarray(dots, np.float64), float(target_sq)

    # u = J G* (P x K), entry by entry: <J^T c, G*> = <c, u> for any cotangent c.
    eye = np.eye(num_prompts * num_classes, dtype=np.float32).reshape(-1, num_prompts, num_classes)
    u = np.concatenate([against_exact(eye[c:c + chunk])[1] for c in range(0, len(eye), chunk)])
    u = u.reshape(num_prompts, num_classes)
    cots, _, counts, _ = count_method_draws(m, probs, m["labels"], p, calls=64, seed=4000, with_pilot=False)
    fixed_methods = [k for k in METHOD_LOSS if k != "sera_pilot"]
    expected, _ = fns.expected_fixed(probs, m["labels"],
                                     jax.device_put(jnp.stack([counts[k] for k in fixed_methods]), fns.replicated),
                                     jax.device_put(np.asarray([METHOD_LOSS[k][1] for k in fixed_methods]),
                                                    fns.replicated), estimator="maxrl", max_n=max_n)
    cos, upper = {}, {}
    for start in range(0, len(fixed_methods), chunk):
        names = fixed_methods[start:start + chunk]
        gram, dots, target_sq = against_exact(np.stack(
            [expected[fixed_methods.index(k)] for k in names] + [np.zeros_like(expected[0])] * (chunk - len(names))))
        cos_C, _ = cosine_and_error(gram, dots, target_sq)
        for i, k in enumerate(names):
            draws_M = np.einsum("mpk,pk->m", cots[k].astype(np.float64), u) / math.sqrt(gram[i, i] * target_sq)
            half = Z_TOLERANCE * draws_M.std(ddof=1) / math.sqrt(len(draws_M))
            assert abs(draws_M.mean() - cos_C[i]) <= half, (k, draws_M.mean(), cos_C[i], half)
            cos[k], upper[k] = cos_C[i], draws_M.mean() + half
    assert cos["uniform"] == pytest.approx(0.877, abs=0.01), cos
    for k, reported in (("dynamo", -0.621), ("knapsack", -0.513)):
        assert cos[k] == pytest.approx(reported, abs=0.01) and upper[k] < 0, (k, cos[k], upper[k])
    # The mechanism: the images whose gradient points against G* are those given more than N_bar rollouts.
    against = np.sum(np.asarray(E.score_directions(probs, m["labels"]), np.float64) * u, axis=1) < 0
    assert 0 < against.sum() < num_prompts // 2
    for k in ("dynamo", "knapsack"):
        np.testing.assert_array_equal(counts[k] > n_bar, against, err_msg=k)


def test_weight_profiles_are_binned_means_of_the_effective_scales():
    """``W.weight_profile``, ``W.sampled_weight_profile`` and ``W.profile_bins`` against a direct loop over the bins
    [e_b, e_b+1) (the last one closed): prompts on an edge belong to the bin above it, p = 1 to the last one, and
    an empty bin gives NaN."""
    rng = np.random.default_rng(0)
    edges = W.WEIGHT_EDGES
    p = np.concatenate([rng.uniform(0.0, 0.3, 30), rng.uniform(0.5, 1.0, 20), [0.0, 0.05, 0.1, 0.7, 0.9, 1.0]])
    s = rng.lognormal(size=p.size)
    x = s + rng.normal(size=(5, p.size))  # 5 draws of a noisy estimate
    last = len(edges) - 2
    profile, sampled, bins = W.weight_profile(p, s), W.sampled_weight_profile(p, x), W.profile_bins(p)
    assert bins["edges"] == list(edges) and sampled["draws"] == 5
    for b in range(last + 1):
        inside = [i for i in range(p.size) if edges[b] <= p[i] < edges[b + 1] or (b == last and p[i] == 1.0)]
        assert bins["count"][b] == len(inside), b
        if not inside:  # [0.3, 0.5)
            assert all(math.isnan(v[b]) for v in (profile["mean"], profile["q10"], sampled["mean"], sampled["se"]))
            continue
        per_draw = [sum(x[d, i] for i in inside) / len(inside) for d in range(5)]
        want = {"mean": sum(s[i] for i in inside) / len(inside), "q10": np.percentile(s[inside], 10),
                "q90": np.percentile(s[inside], 90), "p_mean": sum(p[i] for i in inside) / len(inside),
                "sampled": sum(per_draw) / 5,
                "se": math.sqrt(sum((v - sum(per_draw) / 5) ** 2 for v in per_draw) / 4 / 5)}
        got = {"mean": profile["mean"][b], "q10": profile["q10"][b], "q90": profile["q90"][b],
               "p_mean": bins["p_mean"][b], "sampled": sampled["mean"][b], "se": sampled["se"][b]}
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=1e-5), (b, name)
    assert bins["count"][4] == 0 and bins["count"][-1] == np.sum(p >= 0.9)  # [0.3, 0.5) empty; p = 1 counted


def test_uncorrected_sera_weights_prompts_by_their_rollouts(tiny_analysis):
    """The analysis's weight profiles (results' ``weight_profile``) at every N_bar, against ``s_eff`` computed
    here in float64 from the saved p and counts (docs/method.md §2, §4): uniform ``s(p, N_bar)``, SERA ``s(p, N_i)``
    (corrected: each prompt 1/P) and SERA without the correction ``N_i s(p, N_i) / N_bar`` (the batch mean weighs
    a prompt by its rollouts), ``s = 1 - (1-p)^(N-1)`` and 0 for a prompt without rollouts (the released SERA
    skips some at N_bar = 2), binned by a direct loop. The methods without a closed form have a sampled profile
    only, marked with its number of draws."""
    result = tiny_analysis
    p = np.asarray(result["p"], np.float64)
    profiles = result["estimators"]["maxrl"]["weight_profile"]
    edges = profiles["edges"]
    bins = [(p >= lo) & ((p < hi) | (hi == 1.0)) for lo, hi in zip(edges, edges[1:])]
    assert profiles["count"] == [int(b.sum()) for b in bins]
    for n_bar in result["budgets"]:
        by_method = profiles["budgets"][str(n_bar)]
        counts = np.asarray(result["allocation"][str(n_bar)]["sera"], np.float64)
        s = np.where(counts > 0, 1.0 - (1.0 - p) ** (counts - 1.0), 0.0)  # no rollouts, no gradient
        for method, s_eff in (("uniform", 1.0 - (1.0 - p) ** (n_bar - 1.0)), ("sera", s),
                              ("sera_no_correction", counts * s / n_bar)):
            want = [s_eff[b].mean() if b.any() else np.nan for b in bins]
            np.testing.assert_allclose(by_method[method]["expected"]["mean"], want, rtol=1e-4,
                                       err_msg=f"{method} at N_bar={n_bar}")
        for method, entry in by_method.items():
            assert ("expected" in entry) == (method not in ("pods", "reinforce_ada", "dars_et",
                                                            methods_lib.PILOT_NO_CORRECTION)), method
            assert entry["sampled"]["draws"] == tiny_config().analysis.num_draws, method
    # At N_bar = 8 SERA moves rollouts to the hard prompts: uncorrected, those weigh more than corrected.
    hard = next(k for k, c in enumerate(profiles["count"]) if c)
    eight = profiles["budgets"]["8"]
    assert eight["sera_no_correction"]["expected"]["mean"][hard] > 1.1 * eight["sera"]["expected"]["mean"][hard]


def test_uncorrected_pilot_profile_reweights_the_pilot_draws(tiny_model):
    """``sera_pilot_no_correction``'s projections (``W.uncorrected_projection`` of ``sera_pilot``'s draws) equal, draw
    by draw, those of the draw program run with the batch-mean loss on the same keys and pilot allocations."""
    m = tiny_model
    fns, settings = m["fns"], AnalysisSettings.from_config(m["config"])
    b = budgets_lib.prepare_budget(settings, fns, "maxrl", 8, jax.random.key(5), m["probs"], m["labels"], m["p"])
    row, part = b.methods.index("sera_pilot"), slice(0, fns.chunk)
    pilot_counts = np.asarray(b.pilot_counts[part])
    assert np.any(pilot_counts != 8)  # the pilot moved rollouts: the reweighting matters
    projections = {}
    for corrected in (True, False):
        corrections = jax.device_put(np.asarray(b.draw_corrections).copy(), fns.replicated)
        corrections = corrections.at[row].set(corrected)
        draws = fns.draws(b.draw_keys[part], m["probs"], m["labels"], b.draw_counts, corrections,
                          b.pilot_counts[part], b.budget, **b.static)
        projections[corrected] = np.asarray(E.projected_scales(draws["sera_pilot"], m["probs"], m["labels"]))
    np.testing.assert_allclose(W.uncorrected_projection(projections[True], pilot_counts, 8), projections[False],
                               rtol=1e-4, atol=1e-6)


def test_readme_weights_view_renders_the_profiles(tiny_analysis, tmp_path):
    """``scripts/readme_results.py``'s ``weights`` view on the tiny analysis saved as a results.json: one column per
    non-empty bin of p, the closed form's mean where there is one, the sampled mean with its 95% half-width (t over
    the draws) otherwise, and the prompt-weighted mean over all bins."""
    import importlib.util

    from sera_jax.report.stats import ci95_from_se
    from sera_jax.train import config_utils

    spec = importlib.util.spec_from_file_location("readme_results", pathlib.Path(__file__).resolve().parents[2]
                                                  / "scripts" / "readme_results.py")
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text(json.dumps(config_utils.to_jsonable(
        {"results": {"checkpoints": [{"step": 6, **tiny_analysis}]},
         "provenance": {"command": "python -m x", "commit": "abc", "dirty": False}})))
    table = rr.render("x/results.json view=weights step=6 budget=8", tmp_path)
    profiles = tiny_analysis["estimators"]["maxrl"]["weight_profile"]
    draws = tiny_config().analysis.num_draws
    count = np.asarray(profiles["count"])
    filled = np.flatnonzero(count)
    assert f"| prompts | {' | '.join(str(count[k]) for k in filled)} | {count.sum()} |" in table
    for method, name in (("sera_no_correction", "sera, no multiplicity correction"), ("pods", "pods")):
        entry = profiles["budgets"]["8"][method]
        if "expected" in entry:
            mean = np.asarray(entry["expected"]["mean"])
            cells = [f"{mean[k]:#.3g}" for k in filled]
        else:
            mean, half = np.asarray(entry["sampled"]["mean"]), ci95_from_se(entry["sampled"]["se"], draws)
            name += f" (sampled, {draws} draws)"
            cells = [f"{mean[k]:#.3g} ± {half[k]:.2g}" for k in filled]
        overall = np.sum(mean[filled] * count[filled]) / count.sum()
        assert f"| {name} | {' | '.join(cells)} | {overall:#.3g} |" in table, (method, table)
    assert "Data: `results/x/results.json` (`python -m x`, commit abc)." in table


def test_every_allocator_gets_its_registry_counts_loss_and_expected_cosine(tiny_model, tiny_analysis):
    """Each allocator of the analysis on the oracle p: its counts at every N_bar are
    ``core.get_allocator(name).counts`` on the classifier's p, its draws sample those counts with its method's
    loss (dynamo and knapsack uncorrected), and its expected cosine with G* equals the closed form
    ``E g = (1/P) sum_i s_eff_i grad log p_i`` (``s = 1 - (1-p)^(N-1)``, ``s_eff = s`` corrected, ``P N s / B``
    uncorrected; docs/method.md §2, §4) computed in float64 from per-example gradients ``jax.grad(log p_i)``."""
    m, result = tiny_model, tiny_analysis
    config = m["config"]
    num_prompts = config.analysis.num_prompts
    # The tiny config analyses every method: the count allocators', then the online ones.
    assert tuple(result["methods"]) == tuple(METHOD_LOSS) + config_lib.ONLINE_METHODS
    p32 = jnp.asarray(result["p"], jnp.float32)  # the oracle p (float32, as the analysis holds it)
    for n_bar in config.analysis.budgets:
        for name in ORACLE_ALLOCATORS:
            registry = core.get_allocator(name).counts(p32, num_prompts * n_bar, n_min=config.sera.n_min,
                                                       n_max=config.sera.n_max_factor * n_bar, estimator="maxrl")
            np.testing.assert_array_equal(result["allocation"][str(n_bar)][name], np.asarray(registry),
                                          err_msg=f"{name} at N_bar={n_bar}")
    allocation = {name: np.asarray(result["allocation"]["8"][name]) for name in ORACLE_ALLOCATORS}
    for name in ("sera_sum", "dynamo", "knapsack"):
        assert not np.array_equal(allocation[name], allocation["sera"]), name
        assert not np.array_equal(allocation[name], np.full(num_prompts, 8)), name

    # The draw program's rows: each method's counts and loss.
    settings = AnalysisSettings.from_config(config)
    b = budgets_lib.prepare_budget(settings, m["fns"], "maxrl", 8, jax.random.key(4), m["probs"], m["labels"], m["p"])
    assert b.methods == tuple(METHOD_LOSS)
    for row, method in enumerate(b.methods):
        source, corrected = METHOD_LOSS[method]
        assert bool(b.draw_corrections[row]) is corrected, method
        if source in allocation:
            np.testing.assert_array_equal(b.draw_counts[row], allocation[source], err_msg=method)

    # Per-example gradients grad log p_i (one device: see test_vjp_estimator_equals_per_example_gradient_estimator).
    params_one, stats_one = jax.device_put(jax.device_get((m["params"], m["stats"])), jax.devices()[0])

    def log_p(params, x_HxWxC, label):
        return jax.nn.log_softmax(model_lib.logits_fn(m["graphdef"], params, stats_one, x_HxWxC[None])[0])[label]

    value_and_grads = jax.jit(jax.vmap(jax.value_and_grad(log_p), in_axes=(None, 0, 0)),
                              compiler_options=model_lib.FAST_COMPILE)
    log_p_P, grads = value_and_grads(params_one, *jax.device_put((m["x_host"], m["labels_host"]), jax.devices()[0]))
    scores_PxD = np.concatenate([np.asarray(g, np.float64).reshape(num_prompts, -1) for g in jax.tree.leaves(grads)],
                                axis=1)
    p = np.exp(np.asarray(log_p_P, np.float64))
    exact = scores_PxD.mean(axis=0)
    for j, n_bar in enumerate(config.analysis.budgets):
        budget = num_prompts * n_bar
        for method, (source, corrected) in METHOD_LOSS.items():
            if method == "sera_pilot":  # no closed form (a Monte Carlo average over pilots)
                continue
            counts = np.asarray(result["allocation"][str(n_bar)][source], np.float64)
            assert counts.sum() == budget, method
            s = np.where(counts > 0, 1.0 - (1.0 - p) ** (counts - 1.0), 0.0)  # no rollouts, no gradient
            s_eff = s if corrected else num_prompts * counts * s / budget
            g = s_eff @ scores_PxD / num_prompts
            cos = g @ exact / (np.linalg.norm(g) * np.linalg.norm(exact))
            assert result["methods"][method]["cos_expected"][j] == pytest.approx(cos, abs=2e-4), (method, n_bar)


def test_methods_share_their_rollouts_draw_by_draw(tiny_model):
    """Common random numbers in the analysis's draws. At N_bar = n_min = 2 every allocation but the released SERA's
    (which may give images none) is uniform's, so every such method's sampled cotangent is uniform's draw by draw (it was only equal in expectation when each method drew
    with its own key). At N_bar = 8 each draw's sera_pilot allocation is the one made from the first n0 rollouts
    of that draw's uniform rollouts: the pilot is those rollouts, not an independent sample."""
    m = tiny_model
    fns, settings = m["fns"], AnalysisSettings.from_config(m["config"])
    num_prompts, part = m["config"].analysis.num_prompts, slice(0, m["fns"].chunk)
    key = jax.random.key(31)
    b = budgets_lib.prepare_budget(settings, fns, "maxrl", 2, key, m["probs"], m["labels"], m["p"])
    draws = {k: np.asarray(v) for k, v in fns.draws(b.draw_keys[part], m["probs"], m["labels"], b.draw_counts,
                                                     b.draw_corrections, b.pilot_counts[part], b.budget,
                                                     **b.static).items()}
    assert set(draws) == set(METHOD_LOSS)
    assert not np.allclose(draws["uniform"][0], draws["uniform"][1])  # the draws themselves differ
    for method in ("sera_all_active", "sera_pilot", "sera_sum"):
        np.testing.assert_array_equal(draws[method], draws["uniform"], err_msg=method)
    # The released rule's draws: uniform's rollouts where it kept uniform's counts (the common random numbers).
    same_P = np.asarray(b.counts["sera"]) == np.asarray(b.counts["uniform"])
    assert not same_P.all()  # it skipped some image at N_bar 2
    np.testing.assert_allclose(draws["sera"][:, same_P], draws["uniform"][:, same_P], rtol=1e-6, atol=1e-9)
    # Same rollouts and the same weights 1/(P N) = 1/B, computed another way (1/B rather than 1/(P N_i)).
    for method in ("dynamo", "knapsack"):
        np.testing.assert_allclose(draws[method], draws["uniform"], rtol=1e-6, atol=1e-9, err_msg=method)

    b = budgets_lib.prepare_budget(settings, fns, "maxrl", 8, key, m["probs"], m["labels"], m["p"])
    n_min, n_max, n0 = settings.bounds(8, "maxrl")
    labels_host = np.asarray(m["labels_host"])
    for d in range(fns.chunk):
        sampled, ids = _sample_rollouts(b.draw_keys[d], m["probs"], b.counts["uniform"], b.budget)
        first_n0 = np.asarray(sampled).reshape(num_prompts, 8)[:, :n0]  # uniform: 8 contiguous rollouts a prompt
        np.testing.assert_array_equal(np.asarray(ids), np.repeat(np.arange(num_prompts), 8))
        successes = jnp.asarray(np.sum(first_n0 == labels_host[:, None], axis=1))
        expected = core.pilot_allocate(successes, n0, b.budget, n_min=n_min, n_max=n_max, estimator="maxrl")
        np.testing.assert_array_equal(b.pilot_counts[d], expected, err_msg=f"draw {d}")
    assert np.any(np.asarray(b.pilot_counts[part]) != 8)  # the pilots do move the allocation


# ------------------------------------------------------------------------------------------ online / train-mask peers


def reference_online_kept(method, rewards, keep):
    """One prompt's kept rows (indices into its rollouts, rank order) under ``method``'s published rule (NumPy):
    DAPO / DARS the mixed groups (0 < K < N, or N = 1); PODS ``j`` successes and ``m - j`` failures, ``j`` closest
    to m/2 (ties: ceil) in ``[max(0, m - (N - K)), min(K, m)]``; Reinforce-Ada ``take = min(m, N)`` with
    ``floor(m/2)`` successes targeted, filled from the other class; first arrivals within a class."""
    r = np.asarray(rewards, bool)
    n, k = len(r), int(r.sum())
    if method in ("dapo", "dars_et"):
        return list(range(n)) if (0 < k < n or n == 1) else []
    if method == "pods" and n <= keep:
        return list(range(n))
    take = min(keep, n)
    lo, hi = max(0, take - (n - k)), min(k, take)
    target = (keep + 1) // 2 if method == "pods" else keep // 2
    pos = min(max(target, lo), hi)
    return sorted(list(np.flatnonzero(r)[:pos]) + list(np.flatnonzero(~r)[:take - pos]))


def reference_online_cotangent(method, probs, labels, sampled, prompt_ids, keep, estimator):
    """``c_i = sum_{kept} A (onehot - pi) / |kept|`` prompt by prompt (NumPy float64): advantages from the kept
    rollouts (PODS) or every rollout of the prompt, the plain mean over everything kept (0 when nothing is)."""
    probs = np.asarray(probs, np.float64)
    num_prompts, num_classes = probs.shape
    sampled, prompt_ids = np.asarray(sampled), np.asarray(prompt_ids)
    terms, total = [], 0
    for i in range(num_prompts):
        rows = np.flatnonzero(prompt_ids == i)
        rewards = sampled[rows] == labels[i]
        kept = reference_online_kept(method, rewards, keep)
        base = rewards[kept] if method == "pods" else rewards
        adv = reference_advantages(base, estimator)
        adv_of = dict(zip(kept, adv)) if method == "pods" else dict(enumerate(adv))
        total += len(kept)
        terms += [(i, adv_of[j], sampled[rows[j]]) for j in kept]
    cot = np.zeros_like(probs)
    for i, a, y in terms:
        cot[i] += a * (np.eye(num_classes)[y] - probs[i]) / total
    return cot, total


_reinforce_ada_round = jax.jit(keep_lib.reinforce_ada_round, static_argnames=("round_size", "keep"))


def reinforce_ada_loop(key, probs, labels, budget, round_size, keep, horizon=None):
    """Reinforce-Ada's rounds as the trainer runs them: ``core.keep.reinforce_ada_round`` until the budget is spent,
    each round's successes read from the prompt's next ranks of the draw (``sample_rollouts`` with ``key``, ranks
    below ``horizon``, default the budget)."""
    num_prompts, horizon = probs.shape[0], horizon or budget
    drawn, _ = _sample_rollouts(key, probs, jnp.full((num_prompts,), horizon, jnp.int32), num_prompts * horizon)
    success = np.asarray(drawn).reshape(num_prompts, horizon) == np.asarray(labels)[:, None]
    counts, successes, remaining, rounds = np.zeros(num_prompts, np.int32), np.zeros(num_prompts, np.int32), budget, 0
    while remaining > 0:
        extra = np.asarray(_reinforce_ada_round(counts, successes, jnp.int32(remaining), round_size=round_size,
                                                keep=keep))
        assert 0 < extra.sum() <= remaining
        successes = successes + np.asarray([success[i, counts[i]:counts[i] + extra[i]].sum()
                                            for i in range(num_prompts)], np.int32)
        counts, remaining, rounds = counts + extra, remaining - int(extra.sum()), rounds + 1
    return counts, rounds


def test_reinforce_ada_phases_spend_the_budget_like_the_round_loop():
    """``E.reinforce_ada_counts`` (rounds run as phases of full rounds) against the plain loop of
    ``core.keep.reinforce_ada_round`` on the same ranks: a prompt that never succeeds (p ~ 1e-13: it soaks up the
    budget M at a time), one that almost always does, partial last rounds and the all-finished round-robin, with a
    round size that is not the kept n; one compiled program for every budget."""
    logits = np.random.default_rng(3).normal(size=(6, 5)) * 2
    logits[0, 0], logits[1, 1] = -30.0, 12.0
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32))
    labels = jnp.asarray([0, 1, 2, 3, 4, 0])
    length, seen_rounds = 200, set()
    for round_size, keep in ((3, 2),):  # the analysis's (4, 4): test_online_methods_draws_match_numpy_reference
        phases = jax.jit(functools.partial(E.reinforce_ada_counts, round_size=round_size, keep=keep, length=length),
                         compiler_options=model_lib.FAST_COMPILE)
        for budget, seed in ((40, 0), (40, 1), (200, 2), (200, 3), (117, 4)):
            key = jax.random.key(seed)
            counts, rounds = phases(key, probs, labels, budget)
            expected, expected_rounds = reinforce_ada_loop(key, probs, labels, budget, round_size, keep, length)
            np.testing.assert_array_equal(counts, expected, err_msg=f"budget {budget} seed {seed}")
            assert int(np.sum(counts)) == budget and int(rounds) == expected_rounds, (budget, seed)
            seen_rounds.add(expected_rounds)
    assert len(seen_rounds) > 2 and max(seen_rounds) > 10  # many rounds, not one shape


def test_online_methods_draws_match_numpy_reference(tiny_model, tiny_analysis):
    """Each online method's draws in the analysis's program at N_bar = 8: the counts (Reinforce-Ada's rounds
    against the plain round loop; DARS's from its pilot, the draw's ranks 0..n0-1; uniform's for DAPO and PODS)
    and, from the same sampled labels, the cotangent recomputed in NumPy (kept set, advantages, weights), draw by
    draw; the rollouts trained; and DAPO's sampled cosine equals uniform's draw by draw (maxrl: uniform's estimate
    times P / P_kept), and in the analysis's results at every budget."""
    m = tiny_model
    fns, config = m["fns"], m["config"]
    settings = AnalysisSettings.from_config(config)
    num_prompts, chunk, keep = config.analysis.num_prompts, fns.chunk, settings.keep_per_prompt
    labels_host = np.asarray(m["labels_host"])
    grads, _, _, _ = fns.chunk_grads(m["params"], m["stats"], m["x"], m["exact_block"], m["params"])
    exact = jax.tree.map(lambda g: g[0], grads)

    def cosines(block):
        _, gram, dots, target_sq = fns.chunk_grads(m["params"], m["stats"], m["x"],
                                                   jax.device_put(block, fns.chunk_rows), exact)
        return cosine_and_error(*(np.asarray(v, np.float64) for v in (gram, dots)), float(target_sq))[0]

    for n_bar in (8,):
        b = budgets_lib.prepare_budget(settings, fns, "maxrl", n_bar, jax.random.key(41), m["probs"], m["labels"],
                                       m["p"])
        assert b.online == config_lib.ONLINE_METHODS
        _, n_max, n0 = settings.bounds(n_bar, "maxrl")
        part = slice(0, chunk)
        cots, trained = fns.online_draws(b.draw_keys[part], m["probs"], m["labels"], b.counts_uniform,
                                         b.online_counts[part], b.budget, **b.online_static)
        uniform = fns.draws(b.draw_keys[part], m["probs"], m["labels"], b.draw_counts, b.draw_corrections,
                            b.pilot_counts[part], b.budget, **b.static)["uniform"]
        np.testing.assert_allclose(cosines(cots["dapo"]), cosines(uniform), rtol=1e-5, atol=1e-6)
        for d in range(chunk):
            key = b.draw_keys[d]
            ra_counts, ra_rounds = reinforce_ada_loop(key, m["probs"], labels_host, b.budget, settings.round_size,
                                                      keep)
            uniform_labels, _ = _sample_rollouts(key, m["probs"], jnp.asarray(b.counts_uniform), b.budget)
            pilot = np.asarray(uniform_labels).reshape(num_prompts, n_bar)[:, :n0]  # ranks 0..n0-1 (CRN)
            acc = np.sum(pilot == labels_host[:, None], axis=1) / n0
            expected_counts = {"dapo": np.full(num_prompts, n_bar), "pods": np.full(num_prompts, n_bar),
                               "reinforce_ada": ra_counts,
                               "dars_et": np.asarray(dars_lib.dars_counts(jnp.asarray(acc, jnp.float32), b.budget,
                                                                          n_pilot=n0, n_max=n_max))}
            assert b.sampling_rounds["reinforce_ada"][d] == ra_rounds
            for a, method in enumerate(b.online):
                counts = np.asarray(b.online_counts[d, a])
                np.testing.assert_array_equal(counts, expected_counts[method], err_msg=f"{method} draw {d}")
                sampled, ids = _sample_rollouts(key, m["probs"], jnp.asarray(counts), b.budget)
                ref, total = reference_online_cotangent(method, m["probs"], labels_host, sampled, ids, keep, "maxrl")
                np.testing.assert_allclose(cots[method][d], ref, rtol=2e-5, atol=2e-6,
                                           err_msg=f"{method} N_bar={n_bar} draw {d}")
                assert int(trained[method][d]) == total, (method, d)
        for method in ("pods", "reinforce_ada", "dars_et"):  # the methods do differ
            assert not np.allclose(cots[method], cots["dapo"]), method
        assert np.any(np.asarray(b.online_counts[part, 2]) != n_bar)  # Reinforce-Ada's rounds moved counts
        assert np.any(np.asarray(b.online_counts[part, 3]) != n_bar)  # and so did DARS's pilot
    methods = tiny_analysis["methods"]
    np.testing.assert_allclose(methods["dapo"]["cos_sampled_mean"], methods["uniform"]["cos_sampled_mean"],
                               rtol=1e-5, atol=1e-6)


def test_dapo_expected_cotangent_matches_monte_carlo():
    """``E.dapo_expected_cotangent`` (the P_kept normalisation in closed form: alpha_i = E[1 / (1 + X_-i)]) against
    the mean of sampled DAPO estimates (``E.online_cotangent``), within standard errors, for maxrl and for
    maxrl_no_baseline (whose all-success groups, dropped by the filter, carry weight)."""
    rng = np.random.default_rng(11)
    num_prompts, num_classes, n = 6, 5, 3
    probs = jax.nn.softmax(jnp.asarray(rng.normal(size=(num_prompts, num_classes)) * 1.2, jnp.float32))
    labels = jnp.asarray(rng.integers(0, num_classes, num_prompts))
    counts = jnp.full((num_prompts,), n, jnp.int32)
    estimators = ("maxrl", "maxrl_no_baseline")

    def one(key):
        sampled = E.sample_rollouts(key, probs, counts, num_prompts * n)
        return [E.online_cotangent("dapo", key, probs, labels, counts, num_prompts * n, estimator=est, keep=4,
                                   length=None, sampled=sampled)[0] for est in estimators]

    draws = jax.jit(jax.vmap(one), compiler_options=model_lib.FAST_COMPILE)(jax.random.split(jax.random.key(5), 20_000))
    closed_form = jax.jit(E.dapo_expected_cotangent, static_argnames=("estimator", "max_n"),
                          compiler_options=model_lib.FAST_COMPILE)
    for estimator, samples in zip(estimators, draws):
        expected, s_eff = closed_form(probs, labels, n, estimator=estimator, max_n=2 * n)  # n traced, as analysed
        assert_within_standard_errors(np.asarray(samples), expected, f"dapo {estimator}")
        assert np.all(np.isfinite(s_eff)) and np.all(np.asarray(s_eff) > 0)
        # The weight profiles' sampled estimate of a train-mask method: the draws' projections (P_kept normalises).
        assert_within_standard_errors(E.projected_scales(samples, probs, labels), s_eff, f"dapo {estimator} s_eff")


def test_online_methods_leave_the_other_methods_bit_identical(tiny_model, tiny_analysis):
    """Adding the online methods changes no other method's number (their draws run in a program of their own; the
    draw keys are the ones every method shares): the analysis of the count allocators alone equals, bit for bit,
    their part of the analysis with every method."""
    m = tiny_model
    settings = dataclasses.replace(AnalysisSettings.from_config(m["config"]),
                                   allocators=tuple(config_lib.ALLOCATOR_CORRECTION))
    host = jax.device_get((m["params"], m["stats"]))
    alone = A.analyse_checkpoint(settings, m["graphdef"], *host, m["x_host"], m["labels_host"], m["mesh"],
                                 jax.random.key(21))
    assert set(tiny_analysis["methods"]) - set(alone["methods"]) == set(config_lib.ONLINE_METHODS)
    for method, stats in alone["methods"].items():
        assert stats == tiny_analysis["methods"][method], method
    for n_bar, counts in alone["allocation"].items():
        assert counts == {k: v for k, v in tiny_analysis["allocation"][n_bar].items() if k in counts}, n_bar
    assert alone["grad_norms"] == tiny_analysis["grad_norms"]


@pytest.mark.parametrize("estimator", ["maxrl_no_baseline", "grpo", "rloo"])
def test_other_estimators_are_unbiased_for_their_scale_factors(estimator):
    """``E[c_i] = (1/P) s(p_i, N_i) (onehot(y_i) - pi_i)`` with core's scale factors, by Monte Carlo."""
    rng = np.random.default_rng(9)
    num_prompts, num_classes = 6, 5
    probs = jax.nn.softmax(jnp.asarray(rng.normal(size=(num_prompts, num_classes)) * 1.2, jnp.float32))
    labels = jnp.asarray(rng.integers(0, num_classes, num_prompts))
    counts = jnp.asarray([2, 3, 4, 6, 2, 7])
    total = int(counts.sum())
    keys = jax.random.split(jax.random.key(12), 6000)
    draw = jax.jit(jax.vmap(lambda k: sample_and_cotangent(k, probs, labels, counts, total, estimator=estimator,
                                                           total=total, length=None, correction=True)[2]),
                   compiler_options=model_lib.FAST_COMPILE)
    samples = np.asarray(draw(keys))
    expected, _ = E.expected_cotangent(probs, labels, counts, estimator=estimator, correction=True, max_n=8)
    assert_within_standard_errors(samples, expected, estimator)


# ------------------------------------------------------------------------------------------ sharding


def test_sharded_analysis_equals_unsharded(tiny_model, tiny_analysis):
    m = tiny_model
    settings = AnalysisSettings.from_config(m["config"])
    one_device = sh.make_mesh(m["config"].mesh, devices=jax.devices()[:1])
    assert m["mesh"].devices.size == 8
    host = jax.device_get((m["params"], m["stats"]))
    sharded = tiny_analysis  # key 21 on the 8-device mesh
    single = A.analyse_checkpoint(settings, m["graphdef"], *host, m["x_host"], m["labels_host"], one_device,
                                  jax.random.key(21))
    assert sharded["p"] == pytest.approx(single["p"], rel=1e-5)
    for method, stats in sharded["methods"].items():
        for name in ("cos_expected", "cos_sampled_mean", "rel_err_mean", "scale_cv"):
            np.testing.assert_allclose(stats[name], single["methods"][method][name], rtol=2e-4, atol=1e-5,
                                       err_msg=f"{method}.{name}")
    np.testing.assert_allclose(sharded["grad_norms"]["uniform_sampled"], single["grad_norms"]["uniform_sampled"],
                               rtol=2e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------ end to end


def test_tiny_run_writes_results_with_the_required_keys(runs):
    config = runs["config"]
    results_path = runs["resumed_dir"] / "results.json"
    payload = json.loads(results_path.read_text())
    assert payload["config"]["variant"] == "tiny"
    results = payload["results"]
    assert [c["step"] for c in results["checkpoints"]] == list(config.pretrain.checkpoint_steps)
    budgets = list(config.analysis.budgets)
    for ck in results["checkpoints"]:
        assert ck["budgets"] == budgets
        assert set(ck["p_quantiles"]) >= {"0.0", "0.5", "1.0"}
        assert set(ck["methods"]) == set(methods_lib.METHODS)
        for method, stats in ck["methods"].items():
            for name in METHOD_STATS:
                assert len(stats[name]) == len(budgets), (method, name)
            assert all(lo <= mean <= hi for (lo, hi), mean in zip(stats["cos_sampled_ci95"], stats["cos_sampled_mean"]))
            assert all(-1.0 <= c <= 1.0 for c in stats["cos_sampled_mean"])
        # At N_bar = n_min every allocation is uniform: identical expected gradients, and (common random
        # numbers) identical sampled ones. PODS and Reinforce-Ada then keep every rollout with uniform's weights
        # (2 <= m rollouts a prompt, one partial round); DAPO and DARS (no second phase: its pilot is the budget)
        # train the mixed groups, uniform's estimate times P / P_kept for maxrl: the same sampled cosines only.
        same = set(methods_lib.METHODS) - {"dapo", "dars_et"}
        for name, methods in (("cos_expected", same - {"pods", "reinforce_ada"}),
                              ("cos_sampled_mean", methods_lib.METHODS), ("rel_err_mean", same)):
            first = {m: ck["methods"][m][name][0] for m in methods}
            assert max(first.values()) - min(first.values()) < 1e-5, (name, first)
        for m in config_lib.ONLINE_METHODS:
            stats = ck["methods"][m]
            assert all(0 <= d <= config.analysis.num_draws for d in stats["draws_without_update"]), m
            assert all(0 <= f <= 1 for f in stats["trained_fraction_mean"]), m
            assert (m == "dapo") == bool(np.isfinite(stats["cos_expected"]).all()), m  # only DAPO's closed form
        # With the oracle p SERA equalises the scale factors: less dispersion than uniform at N_bar = 8.
        assert ck["methods"]["sera"]["scale_cv"][-1] < ck["methods"]["uniform"]["scale_cv"][-1]
        # The weight profiles: every estimator, budget and method (and the uncorrected pilot).
        for estimator, entry in ck["estimators"].items():
            profiles = entry["weight_profile"]
            assert sum(profiles["count"]) == config.analysis.num_prompts, estimator
            assert set(profiles["budgets"]) == {str(n) for n in budgets}, estimator
            for by_method in profiles["budgets"].values():
                extra = {methods_lib.PILOT_NO_CORRECTION} if "sera_pilot" in entry["methods"] else set()
                assert set(by_method) == set(entry["methods"]) | extra, estimator
                assert all("sampled" in e for e in by_method.values()), estimator
    training = results["training"]
    assert set(training["methods"]) == {"cross_entropy", "uniform", "sera"}
    for run in training["methods"].values():
        assert run["seeds"] == list(config.dynamics.seeds)
        for k in config.dynamics.pass_k:
            curves = np.asarray(run["pass_at_k"][str(k)])
            assert curves.shape == (len(config.dynamics.seeds), len(run["step"]))
            assert np.all((curves >= 0) & (curves <= 1))
        assert run["step"][-1] == config.dynamics.steps
    for name in ("cosine_vs_budget", "allocation_vs_p", "p_histogram", "grad_norms", "training_curves",
                 "effective_weights"):
        assert (runs["resumed_dir"] / f"{name}.png").stat().st_size > 1000


def test_allocation_figure_draws_prompts_without_rollouts():
    """The allocation figure's axis is logarithmic: a prompt without rollouts (the released sera's) is drawn on a
    dotted line of its own (``figures.ZERO_ROLLOUTS``, below 1), not dropped. (After the runs, which have imported
    matplotlib.)"""
    from experiments.imagenet_alignment import figures

    ck = {"step": 0, "budgets": [4], "p": [0.001, 0.3, 0.6, 0.999],
          "allocation": {"4": {"uniform": [4, 4, 4, 4], "sera": [0, 8, 8, 0]}}}
    ax = figures.allocation_vs_p({"checkpoints": [ck]}).axes[0]
    drawn = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    assert sorted(drawn) == [figures.ZERO_ROLLOUTS] * 2 + [8, 8]
    assert any(np.all(np.asarray(line.get_ydata()) == figures.ZERO_ROLLOUTS) for line in ax.lines)
    assert "0 rollouts" in ax.get_title()


def _comparison_results(seeds: dict[str, int]) -> dict:
    """A training-mode results dict (``comparison.summarize``'s fields the figure reads): ``seeds[m]`` seeds of each
    method, near the ends of the ranges (top-1 and pass@1 near 1, the cosine near 1 and -1)."""
    rng = np.random.default_rng(0)
    methods, cosine = {}, {}
    for m, n in seeds.items():
        curves = [{"evaluations": [{"step": s, "k": [1], "accuracy": 1 - 0.05 * rng.random(),
                                    "pass_at_k": [1 - 0.05 * rng.random()]} for s in (0, 2, 4)]} for _ in range(n)]
        methods[m] = {"curves": curves}
        if m != "cross_entropy":
            cosine[m] = {"updates": [2, 4], "per_seed": [[0.99 - 0.3 * rng.random(), -0.99 + 0.3 * rng.random()]
                                                         for _ in range(n)]}
    return {"endpoints": {"k": 1}, "methods": methods, "gradient_cosine": {"methods": cosine},
            "task": {"dataset": "digits", "images_per_step": 16, "rollouts_per_image": 4, "n_max": 16}}


def test_figures_use_the_house_colours_seed_words_bounded_bands_and_one_legend_outside():
    """Issue 47 §4, on the alignment experiment's figures: each method in its house colour
    (``sera_jax.report.figures.method_color``), "1 seed", bands and error bars inside the range of what they bound
    ([0, 1] for top-1 and pass@k, [-1, 1] for a cosine), and one legend beside the panels, covering none."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_hex

    from experiments.imagenet_alignment import figures
    from sera_jax.report import figures as house

    def check_legend(fig):
        assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1
        FigureCanvasAgg(fig).draw()
        box = fig.legends[0].get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes), "the legend covers a panel"

    def labelled_colours(fig):
        return {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()
                if not line.get_label().startswith("_")}

    fig = figures.comparison_curves(_comparison_results({"uniform": 3, "sera": 3, "cross_entropy": 1}))
    colours = labelled_colours(fig)
    assert colours == {f"{figures.LABELS[m]} ({house.seeds_label(n)})": house.method_color(m)
                       for m, n in (("uniform", 3), ("sera", 3), ("cross_entropy", 1))}
    assert "cross-entropy (1 seed)" in colours
    for ax, (lo, hi) in zip(fig.axes, ((0, 1), (0, 1), (-1, 1))):
        y = np.concatenate([path.vertices[:, 1] for band in ax.collections for path in band.get_paths()])
        assert len(ax.collections) == 2 and lo <= y.min() and y.max() <= hi, (ax.get_title(), y.min(), y.max())
        assert y.max() == hi  # a t-interval of 3 seeds near the top runs past it: clipped, not dropped
    check_legend(fig)

    ck = {"step": 0, "budgets": [2, 8], "estimator": "maxrl", "p_quantiles": {"0.5": 0.3},
          "methods": {m: {"cos_expected": [0.5, 0.9], "cos_sampled_mean": [-0.9, 0.98],
                          "cos_sampled_ci95": [[-1.2, -0.5], [0.9, 1.1]]} for m in ("uniform", "sera", "dynamo")}}
    fig = figures.cosine_vs_budget({"checkpoints": [ck, {**ck, "step": 6}]})
    assert labelled_colours(fig) == {figures.LABELS[m]: house.method_color(m) for m in ("uniform", "sera", "dynamo")}
    bars = np.concatenate([seg[:, 1] for ax in fig.axes for c in ax.collections for seg in c.get_segments()])
    assert bars.min() == -1.0 and bars.max() == 1.0
    check_legend(fig)

    # The allocation figure's uniform lines listed by N_bar (results.json's keys are strings: "16" sorts before "2").
    counts = {"uniform": [2, 2], "sera": [0, 4]}
    ck = {"step": 0, "budgets": [2, 16], "p": [0.1, 0.9], "allocation": {"16": counts, "2": counts}}
    fig = figures.allocation_vs_p({"checkpoints": [ck]})
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["uniform, N_bar=2", "uniform, N_bar=16"]


def test_run_reads_its_provenance_when_it_starts(monkeypatch, tmp_path):
    """``experiment.run`` reads the provenance (``writers.record_run_start``) at its door, before anything else:
    results.json names the commit the run started from, not the one its last write sees (a long run's checkout
    may move on)."""
    from sera_jax.train import writers

    calls = []
    monkeypatch.setattr(writers, "record_run_start", lambda: calls.append("start"))
    bad = tiny_config()
    bad.optim.lr = -1.0
    with pytest.raises(ValueError, match="config.optim.lr"):
        experiment.run(bad, tmp_path / "w")
    assert calls == ["start"] and not (tmp_path / "w").exists()


def test_killed_run_resumes_from_its_checkpoints(runs):
    assert runs["stopped"] is None and not runs["partial"]["results_exists"]
    assert runs["partial"]["pretrain_steps"] == ["0", "2", "4", "6"]
    resumed, fresh = runs["resumed"], runs["fresh"]
    assert resumed["pretrain"]["resumed_from_step"] == 6 and fresh["pretrain"]["resumed_from_step"] == 0
    # cross_entropy seed 0 had finished (step 4); seed 1 was killed during its step 2 and resumes from its step-2
    # checkpoint; the runs after it had not started.
    assert resumed["training"]["methods"]["cross_entropy"]["resumed_from_step"] == [4, 2]
    assert resumed["training"]["methods"]["sera"]["resumed_from_step"] == [0, 0]
    for method, run in fresh["training"]["methods"].items():
        for k, curves in run["pass_at_k"].items():
            np.testing.assert_allclose(resumed["training"]["methods"][method]["pass_at_k"][k], curves, rtol=1e-6,
                                       err_msg=f"{method} pass@{k}")
    for a, b in zip(resumed["checkpoints"], fresh["checkpoints"]):
        for method in methods_lib.METHODS:
            np.testing.assert_allclose(a["methods"][method]["cos_sampled_mean"],
                                       b["methods"][method]["cos_sampled_mean"], rtol=1e-6)


# ------------------------------------------------------------------------------------------ training mode


TRAINING_METHODS = ("uniform", "sera", "sera_all_active", "cross_entropy")


@pytest.fixture(scope="module")
def training_runs(tmp_path_factory):
    """``paper_imagenet_tiny`` with every method and two seeds, killed after 6 optimizer steps (seed 0's uniform run,
    then 2 steps of its sera run, checkpointed at step 2) and resumed in the same workdir. (That a resumed run
    continues exactly is checked on the alignment mode's runs: the same ``training.run_dynamics``.)"""
    config = config_lib.get_config("paper_imagenet_tiny")
    config.dynamics.update(methods=TRAINING_METHODS, seeds=(0, 1))
    workdir = tmp_path_factory.mktemp("training")
    stopped = experiment.run(config, workdir, stop_after=6, make_figures=False)
    partial = (workdir / "results.json").exists()
    resumed = experiment.run(config, workdir)
    return {"config": config, "stopped": stopped, "partial": partial, "resumed": resumed, "workdir": workdir}


def test_learning_rate_is_the_authors_warmup_then_cosine():
    """The authors' LambdaLR (PY:418-422 of their ImageNet script), stepped after every update: update s (0-based)
    has ``peak s / warmup`` during the warm-up, then ``peak (1 + cos(pi (s - warmup) / (total - warmup))) / 2``."""
    peak, warmup, total = 0.1, 10, 110
    for step, want in ((0, 0.0), (1, 0.01), (9, 0.09), (10, 0.1), (35, 0.05 * (1 + math.cos(math.pi / 4))),
                       (60, 0.05), (110, 0.0), (150, 0.0)):
        assert training.learning_rate(step, total, peak, warmup) == pytest.approx(want, abs=1e-12), step


def test_paper_imagenet_restates_the_authors_settings():
    """imagenet/imagenet_training_script.sh (SH) and the Python it calls (PY), ChenZihao0121/SERA @ 3252ed5."""
    c = config_lib.get_config("paper_imagenet")
    c.data.data_dir = "/data/tfds"
    config_lib.validate_config(c)
    assert (c.mode, c.dynamics.methods, c.dynamics.seeds) == ("training", ("sera",), (69,))  # SH:11, SH:42
    assert (c.data.name, c.model.name, c.model.dtype) == ("imagenet2012", "resnet50", "float32")  # SH:26, SH:31-33
    o = c.optim
    assert (o.lr, o.momentum, o.weight_decay, o.batch_size, o.max_grad_norm) == (0.1, 0.9, 1e-4, 256, 1e5)
    assert math.ceil(1_281_167 / 256) == 5_005  # len(train_loader), the last batch kept
    assert (c.dynamics.steps, o.warmup_steps) == (20 * 5_005, 2 * 5_005)  # SH:29, PY:415-416
    static = dict(training._rl_static(c))
    assert static == {"methods": ("sera",), "budget": 256 * 128, "estimator": "maxrl", "n_min": 2, "n_max": 512,
                      "threshold": 0.05, "correction": True}  # SH:12-13, SH:44-48
    assert (c.dynamics.eval_every, c.dynamics.monitor_every) == (1_000, 1_000)  # SH:39, SH:49
    assert c.dynamics.pass_k == tuple(2**i for i in range(11))  # SH:45: k = 1, 2, 4, ..., 1024


def test_training_mode_writes_a_paired_comparison_and_resumes(training_runs):
    """The training-mode results.json after a kill and a resume: every method's per-seed final pass@k and
    evaluations (one start per seed at step 0), paired differences from uniform over both seeds, the declared
    endpoints, the gradient cosine at the monitored updates, the method switch's allocators (uniform's counts are
    all N0, sera_all_active samples every image); and the README generator renders the file."""
    import importlib.util

    r = training_runs
    config = r["config"]
    assert r["stopped"] is None and not r["partial"]
    results = r["resumed"]
    assert set(results["methods"]) == set(TRAINING_METHODS)
    ks = list(config.dynamics.pass_k)
    for method, entry in results["methods"].items():
        assert entry["pass_at_k"]["seeds"] == [0, 1] and entry["pass_at_k"]["k"] == ks, method
        for curve in entry["curves"]:
            assert [e["step"] for e in curve["evaluations"]] == [0, 2, 4], method
            starts = {m: e["curves"][curve["seed"]]["evaluations"][0] for m, e in results["methods"].items()}
            assert len({json.dumps(s, sort_keys=True) for s in starts.values()}) == 1  # one start per seed
        assert entry["train_rollouts"] == [0 if method == "cross_entropy" else 4 * 16 * 8] * 2, method
    assert set(results["paired_vs_uniform"]) == {"sera", "sera_all_active", "cross_entropy"}
    assert all(d["num_seeds"] == 2 for d in results["paired_vs_uniform"].values())
    ep = results["endpoints"]
    assert ep["names"] == ["top1@2", "pass@1@2", "top1@4", "pass@1@4"]
    for method, d in ep["paired_vs_uniform"].items():
        per_seed = np.asarray(ep["methods"][method]["per_seed"]) - np.asarray(ep["methods"]["uniform"]["per_seed"])
        np.testing.assert_allclose(d["mean_diff"], per_seed.mean(axis=0), atol=1e-12)
    cos = results["gradient_cosine"]
    assert set(cos["methods"]) == {"uniform", "sera", "sera_all_active"}  # cross-entropy's is 1 by definition
    for entry in cos["methods"].values():
        assert entry["updates"] == [2, 4] and np.all(np.abs(entry["per_seed"]) <= 1)
    history = {m: [h for run in e["history"] for h in run["steps"]] for m, e in results["methods"].items()}
    assert history["sera"][0]["lr"] == 0.0  # the warm-up starts at 0
    assert all(h["max_count"] == h["min_count"] == 8 for h in history["uniform"])
    assert all(h["active_frac"] == 1 and h["min_count"] >= 2 for h in history["sera_all_active"])
    assert all(0 < h["active_frac"] <= 1 for h in history["sera"])
    # Seed 0's uniform run had finished when the run was killed (restored, not retrained), its sera run resumes
    # from its step-2 checkpoint, the others had not started.
    assert results["resumed_from_step"] == {m: {"0": {"uniform": 4, "sera": 2}.get(m, 0), "1": 0}
                                            for m in TRAINING_METHODS}
    assert (r["workdir"] / "comparison_curves.png").stat().st_size > 1000
    spec = importlib.util.spec_from_file_location("readme_results", pathlib.Path(__file__).resolve().parents[2]
                                                  / "scripts" / "readme_results.py")
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    results_dir = r["workdir"].parent
    name = f"{r['workdir'].name}/results.json"
    table = rr.render(f"{name} view=pass_at_k ks=1,4", results_dir)
    assert table.count("\n| ") >= 1 + len(TRAINING_METHODS) and "| sera | " in table
    paired = rr.render(f"{name} view=paired ks=1,4 bold=4", results_dir)
    assert "| sera_all_active |" in paired and "Pairs: 2 seeds" in paired


def test_rl_step_gradient_and_monitor_match_autodiff():
    """One monitored RL step of the tiny model (the released sera, picked by the method switch) against ``jax.grad``
    of the same forward: its update is SGD on the gradient of the surrogate ``-sum <c, logits>`` (c the sampled
    MaxRL cotangent on the registry's sera counts), and its ``grad_cosine`` is the cosine of that gradient with
    ``jax.grad`` of the mean cross-entropy (computed here in float64)."""
    from sera_jax.models import resnet

    config = config_lib.get_config("paper_imagenet_tiny")
    config.dynamics.methods = TRAINING_METHODS
    data = experiment.load_data(config)
    graphdef, params, stats = model_lib.build_model(config, data.num_classes, 1, 3)
    batch = data.train_iterator(config.optim.batch_size, seed=0).make_batch(0)
    x, y = jnp.asarray(batch["image"]), jnp.asarray(batch["label"])
    tx = training.optimizer_from_config(config)
    static = dict(training._rl_static(config))
    key, lr = jax.random.key(5), jnp.float32(0.1)
    # The step as the training-mode run above compiled it (8-device mesh, its config): the compilation cache has it.
    mesh = sh.make_mesh(config.mesh)
    steps = training.compiled_steps(graphdef, tx, mesh, tuple(sh.DATA_AXES), training._rl_static(config), True)

    @functools.partial(jax.jit, compiler_options=model_lib.FAST_COMPILE)
    def reference(params):
        def logits_of(q):
            return resnet.apply(graphdef, q, stats, x, train=True)[0]

        probs = jax.nn.softmax(logits_of(params), axis=-1)
        counts = core.get_allocator("sera").counts(E.success_probabilities(probs, y), static["budget"], n_min=2,
                                                   n_max=static["n_max"], threshold=0.05, check=False)
        sampled, ids = E.sample_rollouts(key, probs, counts, static["budget"])
        cot = E.estimator_cotangent(probs, y, sampled, ids, estimator="maxrl", correction=True)
        g_rl = jax.grad(lambda q: -jnp.sum(cot * logits_of(q)))(params)
        g_ce = jax.grad(lambda q: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits_of(q)), y[:, None], 1)))(
            params)
        return counts, g_rl, g_ce

    state = jax.device_put(jax.tree.map(jnp.copy, training.init_state(params, stats, tx)), steps.replicated)  # donated
    new_state, metrics = steps.rl(state, sh.shard_batch({"image": x, "label": y}, mesh), lr, key,
                                  jnp.int32(TRAINING_METHODS.index("sera")), jnp.bool_(True))
    counts, g_rl, g_ce = reference(params)
    flat_rl, flat_ce = (np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(g)])
                        for g in (g_rl, g_ce))
    cosine = flat_rl @ flat_ce / (np.linalg.norm(flat_rl) * np.linalg.norm(flat_ce))
    assert float(metrics["grad_cosine"]) == pytest.approx(cosine, abs=2e-5)
    counts = np.asarray(counts)
    assert (float(metrics["max_count"]), float(metrics["min_count"])) == (counts.max(), counts.min())
    assert float(metrics["active_frac"]) == pytest.approx(np.mean(counts > 0))
    # SGD from a zero momentum buffer: theta - lr (g + wd theta) (the gradient is far below the clip).
    want = jax.tree.map(lambda q, g: q - 0.1 * (g + config.optim.weight_decay * q), params, g_rl)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6),
                 new_state["params"], want)


# ------------------------------------------------------------------------------------------ ways of estimating p


def test_p_estimate_study_invariants_and_the_plug_in_bias():
    """On a fixed p with 8 prompts at p = 0.01 (the lowest 25%): uniform's true factors are the closed form;
    oracle's max–min is an upper bound on every estimated allocation's min; at N_bar = n0 = n_min every method
    is uniform (paired differences exactly 0); and for the p = 0.01 prompts the plug-in factor at the posterior
    mean (the old ``scale_*``) overstates the true one more than the posterior-expected factor does (which still
    overstates it: its Jeffreys prior puts p = 0.01 prompts' 0/2 pilots at p ~ 0.17 on average)."""
    from experiments.imagenet_alignment import p_estimates as PE
    p = np.concatenate([np.full(8, 0.01), np.linspace(0.1, 0.9, 24)])
    common = dict(estimator="maxrl", n_min=2, n_max_factor=4, n0=2, num_draws=40)
    study = PE.allocation_study(p, jax.random.key(0), budgets=(8,), **common)
    study.update(PE.allocation_study(p, jax.random.key(0), budgets=(2,), methods=PE.ESTIMATED, **common))
    uniform = study["8"]["methods"]["uniform"]
    np.testing.assert_allclose(uniform["true_min"]["mean"], 1 - 0.99**7, rtol=1e-5)
    np.testing.assert_allclose(uniform["true_low"]["mean"], 1 - 0.99**7, rtol=1e-5)  # the lowest 10%: p = 0.01
    s = 1 - (1 - p) ** 7
    np.testing.assert_allclose(uniform["true_cv"]["mean"], s.std() / s.mean(), rtol=1e-4)
    oracle_min = study["8"]["methods"]["oracle"]["true_min"]["mean"]
    for method in PE.ESTIMATED:
        assert study["8"]["methods"][method]["true_min"]["ci95"][1] <= oracle_min + 1e-6, method
    for pair in study["2"]["paired"].values():
        assert all(v["mean"] == 0 and v["ci95"] == [0, 0] for v in pair.values())
    point = study["8"]["methods"]["pilot_point"]
    true, plugin, est = point["true_low"]["mean"], point["plugin_low"]["mean"], point["est_low"]["mean"]
    assert true < est < plugin - 0.2, (true, est, plugin)  # measured: 0.11 < 0.60 < 0.89


def test_p_estimate_cosine_study_pairs_its_draws(tiny_model):
    """The sampled-cosine study through the analysis's draw program: at N_bar = n0 every estimated method has
    the same allocation, pilot labels and sampling keys, so their cosines agree draw by draw; cosines are
    finite and in [-1, 1] at a budget where allocations differ."""
    from experiments.imagenet_alignment import p_estimates as PE
    m = tiny_model
    fns = m["fns"]

    def align(block):
        grads, _, _, _ = fns.chunk_grads(m["params"], m["stats"], m["x"], m["exact_block"], m["params"])
        exact = jax.tree.map(lambda g: g[0], grads)
        _, gram, dots, target_sq = fns.chunk_grads(m["params"], m["stats"], m["x"],
                                                   jax.device_put(block, fns.chunk_rows), exact)
        return cosine_and_error(*(np.asarray(v, np.float64) for v in (gram, dots)), float(target_sq))

    study = PE.cosine_study(fns, align, m["probs"], m["labels"], jax.device_put(m["p"], fns.replicated),
                            jax.random.key(3), budgets=(2, 8), estimator="maxrl", n_min=2, n_max_factor=4, n0=2,
                            num_draws=4)
    for pair in ("pilot_posterior-pilot_point", "history_posterior-history_point"):
        assert study["2"]["paired"][pair]["mean"] == pytest.approx(0.0, abs=1e-6)
    for method in PE.METHODS:  # at N_bar = n_min every method's rollouts are uniform's (common random numbers)
        assert study["2"]["methods"][method]["mean"] == pytest.approx(study["2"]["methods"]["uniform"]["mean"],
                                                                      abs=1e-6), method
    for method, s in study["8"]["methods"].items():
        assert s["draws"] == 4 and -1 <= s["mean"] <= 1 and np.isfinite(s["ci95"]).all(), method
