"""Configs of the controlled gradient-alignment experiment (SERA.md §8A).

    python -m experiments.imagenet_alignment.main \
        --config=experiments/imagenet_alignment/config.py:cpu --workdir=/tmp/imagenet_alignment

How well each way of estimating p (point / posterior-aware pilot, history, oracle) equalises the true scale
factors and what sampled cosine it gives, at the same checkpoints (reuses the run's pre-training; minutes):

    python -m experiments.imagenet_alignment.p_estimates \
        --config=experiments/imagenet_alignment/config.py:cpu --workdir=/tmp/imagenet_alignment

Variants:
  * ``tiny``: tests and the notebook (seconds): a one-block ResNet on 8x8 digits, 16 analysis images.
  * ``demo``: the README's reproduction (about a minute on 2 cores): the ``cpu`` model and analysis set,
    analysed at the same three checkpoints for the maxrl estimator at N_bar <= 16 with uniform, SERA (and its
    pilot and uncorrected variants) and one published peer (DynaMO), one seed of training dynamics.
  * ``cpu``: a 2-core machine (about ten minutes): a narrow two-stage ResNet on scikit-learn's 8x8 digits,
    256 analysis images, budgets 2..128, every method (``ANALYSABLE``: the count allocators of
    ``ALLOCATOR_CORRECTION`` and the online / train-mask peers of ``ONLINE_METHODS``), 3 seeds of training
    dynamics.
  * ``gpu`` (alias ``full``): the paper's scale: ResNet-50 on ImageNet at 224 px with MaxRL's recipe (batch
    256, SGD momentum 0.9, lr 0.1, weight decay 1e-4, cosine), 10,240 fixed analysis images. Needs TFDS
    imagenet2012 prepared as ArrayRecord in ``--config.data.data_dir`` (see ``sera_jax.data.images``). For one
    141 GiB H200: planned peak 54 GiB per device (an analysis chunk of 4 cotangents' gradients over 10,240
    images; ``python -m sera_jax.train.plan --config=experiments/imagenet_alignment/config.py:gpu``).

Sub-dicts: ``data``, ``model``, ``optim`` (shared by CE pre-training and the training-dynamics runs),
``pretrain`` (the CE run whose checkpoints are analysed), ``analysis``, ``sera``, ``dynamics``, ``mesh``,
``ckpt``, ``log``. ``validate_config`` checks a (possibly overridden) config at the program boundary.
"""

from __future__ import annotations

import ml_collections

from sera_jax.core import ALLOCATORS, ESTIMATORS, get_allocator, get_estimator
from sera_jax.train import config_utils
from sera_jax.train.sharding import default_mesh_config
from sera_jax.train.writers import default_wandb_config, validate_wandb_config

VARIANTS = ("tiny", "demo", "cpu", "gpu", "full")
DATASETS = ("digits", "cifar10", "imagenet2012")
DYNAMICS_METHODS = ("ce", "uniform", "sera")
# The registry's count allocators (sera_jax.core.allocators) the analysis can compare, each with the loss weights
# its method trains with (``correction``: SERA's multiplicity correction, SERA.md §4), as the RL experiments'
# METHODS tables (experiments/maze/config.py) run them: SERA and its sum-objective ablation corrected, the
# published peers with their published loss (no correction); uniform counts make the two losses equal. Every
# one of them allocates from the classifier's exact p (the oracle). ``sera`` also brings its two variants,
# ``sera_pilot`` (p from a pilot inside the budget) and ``sera_no_correction``.
ALLOCATOR_CORRECTION = {"uniform": True, "sera": True, "sera_all_active": True, "sera_sum": True, "dynamo": False,
                        "knapsack": False}
# The published peers that decide which sampled rollouts train, or sample online in rounds (docs/allocators.md
# §0 (c)), run here from the core functions (sera_jax.core.keep, DARS's counts) through the analysis's own draw
# path (common random numbers), each with its published loss: the plain mean over the rollouts it keeps
# (``core.loss_weights(correction=False, train_B=keep)``). Name -> what decides it:
#   dapo: uniform counts, trains the mixed groups (0 < K < N; DAPO's filter, loss over the kept groups);
#   pods: uniform counts n, trains the max-variance ``analysis.keep_per_prompt`` of each group, advantages from
#     them (PODS); with n <= m every rollout is kept, i.e. PODS is uniform there;
#   reinforce_ada: rounds of ``analysis.round_size`` rollouts to the unfinished prompts until the budget is spent,
#     trains the balanced ``keep_per_prompt`` of each, advantages from all its rollouts (the global baseline);
#   dars_et: a pilot of ``sera.pilot_rollouts``, the rest by DARS's Equal-Treatment weights from the pilot's raw
#     success fraction (capped at the analysis's n_max), trains the mixed groups.
# The registry has them with keep_fn / round_fn hooks (sera_jax.core.allocators); the analysis runs the core
# functions themselves on its padded layout, and would run a name here that the registry lacks.
ONLINE_METHODS = ("dapo", "pods", "reinforce_ada", "dars_et")
# Every name ``analysis.allocators`` accepts, in the analysis's order.
ANALYSABLE = tuple(ALLOCATOR_CORRECTION) + ONLINE_METHODS


def get_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    """The config of ``variant`` (tiny, demo, cpu, gpu/full)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)}")
    c = ml_collections.ConfigDict()
    c.variant = variant
    c.seed = 0  # data split, model init of the CE run, analysis draws
    # Compile with LLVM's optimisations off on CPU (several times faster to compile, slower to run): for the
    # tiny variant, whose run time is all compilation.
    c.fast_compile = False

    c.data = dict(name="digits", data_dir="", validation_size=300, analysis_size=300, eval_batch_size=256)
    c.model = dict(name="cifar_resnet", widths=(8, 16), stage_sizes=(1, 1), dtype="float32")
    # MaxRL's ImageNet recipe; the small variants only change lr (their batches are smaller).
    c.optim = dict(lr=0.05, momentum=0.9, weight_decay=1e-4, warmup_steps=0, batch_size=64)
    # Stages of the CE run on digits: random init (p ~ 0.1 everywhere), p spread (step 40: median ~0.3,
    # 5-95% ~0.07-0.7), and converged (most p near 1, a tail of hard images).
    c.pretrain = dict(steps=300, checkpoint_steps=(0, 40, 300))
    c.analysis = dict(
        num_prompts=256,  # P: the first P images of the fixed analysis split
        budgets=(2, 4, 8, 16, 32, 64, 128),  # average rollouts per prompt N_bar; B = P * N_bar
        # The first is the headline. Every registered estimator is supported; grpo (no closed-form s, so
        # SERA allocates from an O(P n_max^2) table per pilot) is slow on CPU and left to the gpu variant.
        estimators=("maxrl", "maxrl_no_baseline", "rloo"),
        # Registered allocators compared on the oracle p (ALLOCATOR_CORRECTION; uniform is the baseline and is
        # required), then the online / train-mask peers (ONLINE_METHODS); each estimator analyses those defined
        # for it (sera needs a factor that depends on N, sera_sum a power-law one).
        allocators=ANALYSABLE,
        # PODS's m and Reinforce-Ada's n (rollouts trained per prompt; both papers' n = 4 / m = n/4 at our N_bar),
        # and Reinforce-Ada's rollouts per round per unfinished prompt: 4 (published 8) so that a prompt can
        # finish in its first round and the rounds still adapt at the small budgets (N_bar = 4, 8); with 8
        # Reinforce-Ada would sample uniform counts up to N_bar = 8.
        keep_per_prompt=4,
        round_size=4,
        num_draws=16,  # R sampled estimates per (checkpoint, estimator, budget, method)
        draw_chunk=16,  # cotangents per VJP call (one forward, a vmapped backward each)
        microbatch=0,  # images per VJP call (0: all P at once); gradients are summed over microbatches
        pilot_expectation_draws=128,  # pilot outcomes averaged for the sera_pilot expected gradient
        norm_budget=8,  # N_bar of the per-prompt gradient-norm figure
        norm_examples=256,  # per-example gradients are computed for the first this many images
    )
    # n_max = n_max_factor * N_bar; estimators without a closed-form s (grpo) allocate from a table of
    # s(p, N) for every N, O(P n_max^2) memory, so their n_max is capped at max(n_max_table, N_bar).
    c.sera = dict(n_min=2, n_max_factor=16, n_max_table=64, pilot_rollouts=2)
    c.dynamics = dict(
        methods=DYNAMICS_METHODS,
        seeds=(0, 1, 2),
        steps=300,
        rollouts_per_prompt=4,  # N_bar: every RL step samples batch_size * N_bar labels
        estimator="maxrl",
        correction=True,
        eval_every=20,
        pass_k=(1, 4, 16, 64),
    )
    c.mesh = default_mesh_config()
    c.ckpt = dict(every=50)
    c.log = dict(progress=True, every=50, wandb=default_wandb_config())  # wandb: Weights & Biases, off by default

    if variant == "tiny":
        c.fast_compile = True
        c.data.update(validation_size=32, analysis_size=16, eval_batch_size=32)
        c.model.update(widths=(4,), stage_sizes=(1,))
        c.optim.update(lr=0.05, batch_size=16)
        c.pretrain.update(steps=6, checkpoint_steps=(0, 6))
        c.analysis.update(num_prompts=16, budgets=(2, 8), estimators=("maxrl",), num_draws=4, draw_chunk=4,
                          pilot_expectation_draws=32, norm_budget=8, norm_examples=16)
        c.sera.update(n_max_factor=4)
        c.dynamics.update(seeds=(0, 1), steps=4, rollouts_per_prompt=4, eval_every=2, pass_k=(1, 4))
        c.ckpt.update(every=2)
        c.log.update(progress=False, every=2)
    elif variant == "demo":
        # One published peer beside uniform and SERA (the full set is the cpu variant's).
        c.analysis.update(budgets=(2, 4, 8, 16), estimators=("maxrl",), norm_examples=64,
                          allocators=("uniform", "sera", "dynamo"))
        c.dynamics.update(seeds=(0,))
    elif variant in ("gpu", "full"):
        c.data.update(name="imagenet2012", analysis_size=10_240, eval_batch_size=1024)
        c.model.update(name="resnet50", widths=(64, 128, 256, 512), stage_sizes=(3, 4, 6, 3))
        c.optim.update(lr=0.1, batch_size=256)
        # 90 epochs of 1,281,167 images at batch 256.
        c.pretrain.update(steps=450_360, checkpoint_steps=(0, 2_500, 10_000, 50_000, 450_360))
        c.analysis.update(num_prompts=10_240, num_draws=16, draw_chunk=4, microbatch=256, norm_examples=1024,
                          estimators=("maxrl", "maxrl_no_baseline", "grpo", "rloo"))
        c.dynamics.update(steps=450_360, rollouts_per_prompt=16, eval_every=5_000, pass_k=(1, 4, 16, 64, 256))
        c.ckpt.update(every=5_000)
        c.log.update(every=500)
    return c


def allocator_defined(name: str, estimator: str) -> bool:
    """Whether the allocator ``name`` is defined for ``estimator``: the registry's ``check_estimator``; an
    ``ONLINE_METHODS`` name the registry does not have yet is defined for every estimator (its masks and
    rounds read binary rewards only)."""
    if name in ONLINE_METHODS and name not in ALLOCATORS:
        get_estimator(estimator)
        return True
    try:
        get_allocator(name).check_estimator(get_estimator(estimator))
    except ValueError:
        return False
    return True


def _positive_int(x) -> bool:
    return config_utils.is_int(x) and x >= 1


def _int_tuple(values, minimum: int) -> bool:
    return (isinstance(values, (tuple, list)) and len(values) > 0
            and all(config_utils.is_int(v) and v >= minimum for v in values))


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first bad field (unknown fields, wrong types, bad values)."""
    require = config_utils.require
    variant = require(config, "variant", str)
    if variant not in VARIANTS:
        raise ValueError(f"config.variant={variant!r}: expected one of {list(VARIANTS)}")
    config_utils.check_no_unknown_fields(config, get_config(variant))
    require(config, "seed", lambda s: isinstance(s, int) and s >= 0, "expected an int >= 0")
    require(config, "fast_compile", bool)

    name = require(config, "data.name", str)
    if name not in DATASETS:
        raise ValueError(f"config.data.name={name!r}: expected one of {list(DATASETS)}")
    if name != "digits":
        require(config, "data.data_dir", lambda d: isinstance(d, str) and d != "",
                f"the {name} dataset needs a TFDS data directory (--config.data.data_dir=...)")
    for field in ("validation_size", "analysis_size", "eval_batch_size"):
        require(config, f"data.{field}", _positive_int, "expected an int >= 1")

    require(config, "model.name", str)
    require(config, "model.widths", lambda w: _int_tuple(w, 1), "expected a non-empty tuple of ints >= 1")
    require(config, "model.stage_sizes", lambda s: _int_tuple(s, 1) and len(s) == len(config.model.widths),
            "expected one int >= 1 per entry of model.widths")
    require(config, "model.dtype", lambda d: d in ("float32", "bfloat16"), "expected 'float32' or 'bfloat16'")

    require(config, "optim.lr", lambda x: isinstance(x, (int, float)) and x > 0, "expected a number > 0")
    require(config, "optim.momentum", lambda x: isinstance(x, (int, float)) and 0 <= x < 1, "expected in [0, 1)")
    require(config, "optim.weight_decay", lambda x: isinstance(x, (int, float)) and x >= 0, "expected >= 0")
    require(config, "optim.warmup_steps", lambda x: isinstance(x, int) and x >= 0, "expected an int >= 0")
    require(config, "optim.batch_size", _positive_int, "expected an int >= 1")

    steps = require(config, "pretrain.steps", _positive_int, "expected an int >= 1")
    require(config, "pretrain.checkpoint_steps",
            lambda s: _int_tuple(s, 0) and list(s) == sorted(set(s)) and s[-1] <= steps,
            f"expected strictly increasing ints in [0, pretrain.steps={steps}]")

    estimators = require(config, "analysis.estimators", lambda e: isinstance(e, (tuple, list)) and len(e) > 0,
                         "expected a non-empty tuple of estimator names")
    for est in estimators:
        if est not in ESTIMATORS:
            raise ValueError(f"config.analysis.estimators contains {est!r}; known: {sorted(ESTIMATORS)}")
    allocators = require(config, "analysis.allocators",
                         lambda a: isinstance(a, (tuple, list)) and len(a) > 0 and len(set(a)) == len(a),
                         "expected a non-empty tuple of distinct allocator names")
    for name in allocators:
        if name not in ALLOCATORS and name not in ONLINE_METHODS:
            raise ValueError(f"config.analysis.allocators contains {name!r}, which is neither a registered allocator "
                             f"nor one of the online methods {list(ONLINE_METHODS)}; known: "
                             f"{sorted(set(ALLOCATORS) | set(ONLINE_METHODS))}")
        if name not in ANALYSABLE:
            raise ValueError(f"config.analysis.allocators contains {name!r}, which the analysis does not run (a "
                             f"count allocator needs its loss in ALLOCATOR_CORRECTION; prompt selection has no "
                             f"fixed prompt set to align); analysable: {list(ANALYSABLE)}")
        if not any(allocator_defined(name, est) for est in estimators):
            raise ValueError(f"config.analysis.allocators contains {name!r}, which is undefined for every one of "
                             f"analysis.estimators={list(estimators)}")
    if "uniform" not in allocators:
        raise ValueError(f"config.analysis.allocators={list(allocators)} must contain 'uniform' (the baseline)")
    n_min = require(config, "sera.n_min", _positive_int, "expected an int >= 1")
    for est in estimators:
        if n_min < get_estimator(est).min_rollouts:
            raise ValueError(f"config.sera.n_min={n_min} is below the {get_estimator(est).min_rollouts} "
                             f"rollouts estimator {est!r} needs")
    require(config, "sera.n_max_factor", _positive_int, "expected an int >= 1")
    require(config, "sera.n_max_table", _positive_int, "expected an int >= 1")
    require(config, "sera.pilot_rollouts", _positive_int, "expected an int >= 1")
    require(config, "analysis.budgets",
            lambda b: _int_tuple(b, n_min) and list(b) == sorted(set(b)),
            f"expected strictly increasing ints >= sera.n_min={n_min}")
    num_prompts = require(config, "analysis.num_prompts", _positive_int, "expected an int >= 1")
    if num_prompts > config.data.analysis_size:
        raise ValueError(f"config.analysis.num_prompts={num_prompts} exceeds config.data.analysis_size="
                         f"{config.data.analysis_size}")
    require(config, "analysis.num_draws", lambda r: isinstance(r, int) and r >= 2,
            "expected an int >= 2 (a confidence interval needs two draws)")
    require(config, "analysis.draw_chunk", lambda c: isinstance(c, int) and c >= 2,
            "expected an int >= 2 (the two halves of the pilot's expectation share a chunk)")
    microbatch = require(config, "analysis.microbatch", lambda m: isinstance(m, int) and m >= 0,
                         "expected an int >= 0 (0: all prompts at once)")
    if microbatch and num_prompts % microbatch:
        raise ValueError(f"config.analysis.microbatch={microbatch} must divide analysis.num_prompts={num_prompts}")
    require(config, "analysis.pilot_expectation_draws", lambda t: isinstance(t, int) and t >= 2,
            "expected an int >= 2 (it is split into two independent halves)")
    require(config, "analysis.norm_budget", lambda b: b in tuple(config.analysis.budgets),
            "expected one of analysis.budgets")
    require(config, "analysis.norm_examples", lambda n: _positive_int(n) and n <= num_prompts,
            f"expected an int in [1, analysis.num_prompts={num_prompts}]")
    require(config, "analysis.keep_per_prompt", lambda k: _positive_int(k) and k >= 2,
            "expected an int >= 2 (PODS's and Reinforce-Ada's rollouts trained per prompt: both classes)")
    require(config, "analysis.round_size", _positive_int, "expected an int >= 1 (Reinforce-Ada's rollouts per round)")

    methods = require(config, "dynamics.methods", lambda m: isinstance(m, (tuple, list)),
                      "expected a tuple of method names")
    for m in methods:
        if m not in DYNAMICS_METHODS:
            raise ValueError(f"config.dynamics.methods contains {m!r}; known: {list(DYNAMICS_METHODS)}")
    require(config, "dynamics.seeds", lambda s: _int_tuple(s, 0) and len(set(s)) == len(s),
            "expected distinct ints >= 0")
    require(config, "dynamics.steps", _positive_int, "expected an int >= 1")
    est = require(config, "dynamics.estimator", lambda e: e in ESTIMATORS and get_estimator(e).depends_on_n,
                  "expected an estimator whose scale factor depends on N (maxrl, maxrl_no_baseline, grpo)")
    require(config, "dynamics.rollouts_per_prompt", lambda n: _positive_int(n) and n >= max(n_min, 1),
            f"expected an int >= sera.n_min={n_min}")
    if n_min < get_estimator(est).min_rollouts:
        raise ValueError(f"config.sera.n_min={n_min} is below what dynamics.estimator={est!r} needs")
    require(config, "dynamics.correction", bool)
    require(config, "dynamics.eval_every", _positive_int, "expected an int >= 1")
    require(config, "dynamics.pass_k", lambda k: _int_tuple(k, 1), "expected a non-empty tuple of ints >= 1")

    require(config, "ckpt.every", _positive_int, "expected an int >= 1")
    require(config, "log.progress", bool)
    require(config, "log.every", _positive_int, "expected an int >= 1")
    validate_wandb_config(config)
