"""Configs of the controlled gradient-alignment experiment (docs/method.md §8A) and its training comparisons.

    python -m experiments.imagenet_alignment.main \
        --config=experiments/imagenet_alignment/config.py:cpu --workdir=/tmp/imagenet_alignment

A classifier is a policy whose success rate is known exactly: a rollout is a label sampled from the softmax, its
reward 1 when it is the true label, so p is the softmax probability of the true label. ``config.mode`` says what
a run does:

* ``alignment`` (tiny, demo, cpu, gpu/full): CE pre-training, the alignment analysis at its checkpoints, then the
  training dynamics (``dynamics.methods`` from the same initialisation per seed).
* ``training`` (paper_imagenet, paper_imagenet_tiny, classification, classification_n16): the training runs
  alone, every method of ``dynamics.methods`` from the same initialisation, data order and sampling numbers per
  seed, summarised as the RL comparisons summarise theirs (``results.json`` with per-seed values and
  ``paired_vs_uniform``; ``experiments/imagenet_alignment/comparison.py``). Every RL method allocates on the true
  p: allocation is tested without estimation error.

    python -m experiments.imagenet_alignment.main \
        --config=experiments/imagenet_alignment/config.py:classification --workdir=/tmp/classification_n4

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
  * ``paper_imagenet``: the authors' ImageNet run (``imagenet/imagenet_training_script.sh`` of ChenZihao0121/SERA @
    3252ed5): ResNet-50 trained from scratch by MaxRL with the released SERA allocation on the true p, N0 128,
    n_max 512; every 1,000 steps the cosine of the step's gradient with the exact cross-entropy gradient of the
    same batch, and validation pass@k = mean 1 - (1-p)^k for k up to 1,024. Each setting names its source below;
    needs TFDS imagenet2012 (``--config.data.data_dir``). ``paper_imagenet_tiny``: the same code path on digits
    in seconds (tests).
  * ``classification`` / ``classification_n16``: the powered CPU comparison (its endpoints are declared in
    ``_classification``): the released ``sera``, uniform MaxRL, ``sera_all_active`` and ``cross_entropy`` trained
    on digits at N0 = 4 / 16 rollouts per image, 16 paired seeds (about a minute a seed, all four methods).

Sub-dicts: ``data``, ``model``, ``optim`` (shared by CE pre-training and the training runs), ``pretrain`` (the CE
run whose checkpoints are analysed), ``analysis``, ``sera``, ``dynamics`` (the training runs: methods, seeds,
budget, evaluation, the gradient monitor and, in training mode, the declared endpoints), ``mesh``, ``ckpt``,
``log``. ``validate_config`` checks a (possibly overridden) config at the program boundary.
"""

from __future__ import annotations

import ml_collections

from sera_jax.core import ALLOCATORS, ESTIMATORS, get_allocator, get_estimator
from sera_jax.train import config_utils
from sera_jax.train.config_utils import Rule
from sera_jax.train.sharding import default_mesh_config
from sera_jax.train.writers import default_wandb_config, validate_wandb_config

VARIANTS = ("tiny", "demo", "cpu", "gpu", "full", "paper_imagenet", "paper_imagenet_tiny", "classification",
            "classification_n16")
MODES = ("alignment", "training")
DATASETS = ("digits", "cifar10", "imagenet2012")
# The training runs' methods: plain cross-entropy on the true labels (the limit MaxRL approaches as N grows), and
# MaxRL with the registry's count allocators (sera_jax.core.allocators) on the classifier's true p: ``uniform``,
# ``sera`` (the authors' released rule: an active set, zero rollouts for the images outside it) and
# ``sera_all_active`` (the exact max–min over every image).
CROSS_ENTROPY = "cross_entropy"
RL_METHODS = ("uniform", "sera", "sera_all_active")
DYNAMICS_METHODS = (CROSS_ENTROPY,) + RL_METHODS
# The registry's count allocators (sera_jax.core.allocators) the analysis can compare, each with the loss weights
# its method trains with (``correction``: SERA's multiplicity correction, docs/method.md §4), as the RL experiments'
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
# The registry has them with keep_fn / round_fn hooks (sera_jax.core.allocators), and the analysis runs each as
# its registry entry says (experiments/imagenet_alignment/methods.py), with the core functions themselves on its
# padded layout.
ONLINE_METHODS = ("dapo", "pods", "reinforce_ada", "dars_et")
# Every name ``analysis.allocators`` accepts, in the analysis's order.
ANALYSABLE = tuple(ALLOCATOR_CORRECTION) + ONLINE_METHODS


# The authors' ImageNet run: imagenet/imagenet_training_script.sh (SH below) calling
# verl/cifar10_experiments/sampling_based_rl_objective_experiments.py (PY) of ChenZihao0121/SERA @ 3252ed5.
# len(train_loader) = ceil(1,281,167 / 256) = 5,005 batches an epoch (PY:102-105: shuffled, the last batch kept).
IMAGENET_TRAIN_IMAGES = 1_281_167
PAPER_BATCH = 256  # SH:28 --batch-size 256
PAPER_STEPS_PER_EPOCH = -(-IMAGENET_TRAIN_IMAGES // PAPER_BATCH)


def get_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    """The config of ``variant`` (tiny, demo, cpu, gpu/full, paper_imagenet(_tiny), classification(_n16))."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)}")
    c = ml_collections.ConfigDict()
    c.variant = variant
    c.mode = "alignment"  # MODES: what a run does (module docstring)
    c.seed = 0  # data split, model init of the CE run, analysis draws
    # Compile with LLVM's optimisations off on CPU (several times faster to compile, slower to run): for the
    # tiny variant, whose run time is all compilation.
    c.fast_compile = False

    c.data = dict(name="digits", data_dir="", validation_size=300, analysis_size=300, eval_batch_size=256)
    c.model = dict(name="cifar_resnet", widths=(8, 16), stage_sizes=(1, 1), dtype="float32")
    # MaxRL's ImageNet recipe; the small variants only change lr (their batches are smaller). ``max_grad_norm``:
    # the global norm the loss gradient is clipped to before weight decay (0: no clipping).
    c.optim = dict(lr=0.05, momentum=0.9, weight_decay=1e-4, warmup_steps=0, batch_size=64, max_grad_norm=0.0)
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
        methods=(CROSS_ENTROPY, "uniform", "sera", "sera_all_active"),
        seeds=(0, 1, 2),
        steps=300,
        rollouts_per_prompt=4,  # N_bar (the authors' N0): every RL step samples batch_size * N_bar labels
        estimator="maxrl",
        correction=True,
        # The released sera's least mixed-group chance of an active image (the registry default, the authors'
        # activation_useful_threshold; the alignment analysis allocates with the default too).
        activation_threshold=0.05,
        eval_every=20,
        pass_k=(1, 4, 16, 64),
        # Every this many steps (0: never) an RL step also computes the exact cross-entropy gradient of its
        # batch (the same train-mode forward) and logs the cosine of its own gradient with it. A multiple of
        # log.every: it is kept in the logged history, which the checkpoints hold.
        monitor_every=0,
        # Training mode: the declared endpoints, top-1 and pass@endpoint_k at the early step (a multiple of
        # eval_every) and at the final step, seed-paired against uniform (comparison.py).
        early_step=0,
        endpoint_k=1,
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
        c.dynamics.update(methods=(CROSS_ENTROPY, "uniform", "sera"), seeds=(0, 1), steps=4, rollouts_per_prompt=4,
                          eval_every=2, pass_k=(1, 4))
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
    elif variant in ("paper_imagenet", "paper_imagenet_tiny"):
        _paper_imagenet(c)
        if variant == "paper_imagenet_tiny":
            # The same code path in seconds: digits and a one-block ResNet, 4 steps with a 1-step warm-up, every
            # step logged, evaluated and monitored every 2. The paper's N0 : n_max (1 : 4) and ks.
            c.fast_compile = True
            c.data.update(name="digits", data_dir="", validation_size=32, eval_batch_size=32)
            c.model.update(name="cifar_resnet", widths=(4,), stage_sizes=(1,))
            c.optim.update(batch_size=16, warmup_steps=1)
            c.dynamics.update(seeds=(0,), steps=4, rollouts_per_prompt=8, eval_every=2, monitor_every=2,
                              early_step=2)
            c.ckpt.update(every=2)
            c.log.update(progress=False, every=1)
    elif variant in ("classification", "classification_n16"):
        _classification(c, n0={"classification": 4, "classification_n16": 16}[variant])
    return c


def _paper_imagenet(c: ml_collections.ConfigDict) -> None:
    """The settings of ``paper_imagenet``, each with its source (SH / PY line); differences in the comments."""
    c.mode = "training"
    # SH:33 --dataset-name imagenet256; PY:99 Hugging Face benjamin-paine/imagenet-1k-256x256 (images stored at
    # 256x256). Ours: TFDS imagenet2012 (full-resolution JPEGs) from a local data_dir, the same transforms:
    # PY:86-89 RandomResizedCrop(224, scale (0.08, 1)), flip, ImageNet mean/std; PY:92-95 resize 256, centre
    # crop 224 (sera_jax.data.images.imagenet_transform). PY:107 evaluates the 50,000 validation images in
    # batches of 1,000 (inference-mode BatchNorm: the batch size does not change the numbers).
    c.data.update(name="imagenet2012", analysis_size=0, eval_batch_size=1000)
    # SH:31-32 --model-type resnet --model-depth 50; PY:405 torchvision resnet50(num_classes=1000), trained from
    # its random initialisation (ours: the same layout, v1.5 strides, conv and BatchNorm init; the head differs:
    # LeCun-normal kernel and zero bias here, PyTorch's Linear uniform +-1/sqrt(2048) for both). SH:26 --no-amp:
    # float32. PY:406-408 wraps it in DataParallel over 4 GPUs (SH:19), so BatchNorm normalises each GPU's 64
    # images; ours normalises the batch of 256 (on one device, or across the mesh).
    c.model.update(name="resnet50", widths=(64, 128, 256, 512), stage_sizes=(3, 4, 6, 3), dtype="float32")
    c.optim.update(
        lr=0.1,  # SH:10, SH:27 --lr 0.1
        momentum=0.9,  # PY:411-413 SGD(momentum=0.9, nesterov=False)
        weight_decay=1e-4,  # PY:413 weight_decay=1e-4 (PyTorch's: added to the gradient, as make_optimizer does)
        batch_size=PAPER_BATCH,  # SH:28
        # PY:416 warmup_steps = 2 * len(train_loader); PY:418-422 lr = 0.1 step / warmup_steps, then
        # 0.5 (1 + cos(pi progress)) (training.learning_rate; their denominator's + 1e-6 is left out).
        warmup_steps=2 * PAPER_STEPS_PER_EPOCH,
        max_grad_norm=1e5,  # SH:41 --max_grad_norm 1e5; PY:474 clip_grad_norm_ before optimizer.step()
    )
    # SH:46 --sera-n-min 2; SH:13, SH:47 --sera-n-max $((4 * N0)) = 512: n_max = 4 N0.
    c.sera.update(n_min=2, n_max_factor=4)
    c.dynamics.update(
        # SH:42 --advantage-type sera; PY:163-172 allocate_rollouts_from_probabilities(p, dynamic_active_equalized)
        # on the exact detached p (float64 there, float32 here): the registry's released ``sera``. Their script
        # runs SERA alone; add "uniform" / "cross_entropy" to compare.
        methods=("sera",),
        seeds=(69,),  # SH:11, SH:30 --seed 69 (our seed: the init, the data order and the label draws)
        steps=20 * PAPER_STEPS_PER_EPOCH,  # SH:29 --epochs 20; PY:415 total_steps = epochs * len(train_loader)
        rollouts_per_prompt=128,  # SH:12, SH:44 N0 = 128: B = 256 * 128 labels a step
        # PY:222 and maxrl_advantage.py:36: A = (r - K/N) / (K/N + 1e-6); ours (maxrl) has no epsilon (0 for
        # K = 0 in both). PY:229-244: weights N0 / N_i over B N0, i.e. 1 / (P N_i): the correction.
        estimator="maxrl",
        correction=True,
        activation_threshold=0.05,  # SH:48 --sera-activation-useful-threshold 0.05
        eval_every=1_000,  # SH:39 --eval_every_k 1000; PY:487 after every 1,000th update (and before training)
        # SH:45 --num_test_rollouts_per_example 1024; PY:273-277, PY:302: pass@k = mean 1 - (1-p)^k, k = 1..1024.
        pass_k=tuple(2**i for i in range(11)),
        # SH:49 --exact-logp-gradient-monitor-every-k 1000; PY:460-472 (gradient_alignment.py:11): the cosine of
        # the loss gradient with that of F.cross_entropy(logits, targets) on the same forward, at the 1,000th,
        # 2,000th, ... update.
        monitor_every=1_000,
        early_step=10_000,  # not theirs: the first evaluation after the warm-up, for the results' endpoints
        endpoint_k=1,
    )
    c.ckpt.update(every=1_000)  # ours, to resume (SH:36 saves at step 100,000 and the end only)
    c.log.update(every=100)


def _classification(c: ml_collections.ConfigDict, n0: int) -> None:
    """The powered CPU comparison at N0 = ``n0`` rollouts per image, declared below before any declared seed ran."""
    # DECLARED before any of seeds 0..15 ran. Calibration: seeds 100-103 (none of the declared ones) of these
    # settings at N0 = 4, 8, 16 and 32 (``--config.dynamics.seeds='(100,101,102,103)'
    # --config.dynamics.rollouts_per_prompt=N``).
    # QUESTION: on a classifier whose success rate per image is known exactly (p = the softmax probability of its
    # label; a rollout is a sampled label, rewarded when it is the label), does the released SERA allocation (true
    # p, no rollouts for the images outside its active set) train faster or better than MaxRL's uniform allocation
    # at the same number of sampled labels, and where do the all-active max–min and cross-entropy (the limit MaxRL
    # approaches as N grows) stand?
    # METHODS, run in this order for every seed: uniform (the baseline), sera (threshold 0.05), sera_all_active,
    # cross_entropy; MaxRL's estimator with the multiplicity-corrected loss 1 / (P N_i), every allocation on the
    # true p.
    # BUDGETS: N0 = 4 (``classification``) and N0 = 16 (``classification_n16``) labels per image on average, 64
    # images a step (256 / 1,024 labels), n_min 2, n_max 4 N0 (the authors' N0 : n_max = 1 : 4). Chosen by regime,
    # not by cost (one seed of all four methods takes about a minute at any N0): in calibration uniform MaxRL trails
    # cross-entropy in held-out pass@1 by up to 0.37 at N0 = 4 (room for an allocation to matter), by at most
    # ~0.08 at N0 = 16 (little room: does SERA cost anything there?), by 0.17 at N0 = 8 and not at all at N0 = 32;
    # N0 = 2 = n_min would make sera_all_active identical to uniform.
    # PRIMARY ENDPOINTS, at each budget, each method minus uniform paired by seed: held-out top-1 accuracy and
    # analytic pass@4 (the mean over the 600 held-out images of 1 - (1-p)^4) at the early step 50 and the final step
    # 300, each with its 95% t-interval over the 16 seeds and the minimum detectable effect at 80% power
    # (results.json ``endpoints``). Step 50: where cross-entropy's lead over uniform (pass@1 and top-1) is largest
    # in calibration at both budgets, a rule that does not look at SERA. k = 4: the largest k whose pass@k is not
    # near 1 at step 50 at both budgets (uniform 0.54 / 0.84; pass@16 0.80 / 0.96).
    # PRECISION, target half-width <= 0.01; predicted from calibration (sd of the paired differences x t_15 / 4):
    # final step <= 0.010 (top-1) and <= 0.004 (pass@4); step 50 0.018-0.06 (top-1) and 0.013-0.046 (pass@4), over
    # the target (early training is noisier; SERA's differences there were 0.06-0.18 at N0 = 4 in calibration).
    # SECONDARY: pass@k for k = 1..64 along training (every 10 steps); the cosine of each RL step's gradient with the
    # exact cross-entropy gradient of its batch every 10 updates, its mean over the run and up to step 50, paired
    # minus uniform (results.json ``gradient_cosine``).
    # SEEDS 0..15: each its own initialisation, order of training images and label draws, shared by the four
    # methods (common random numbers: rollout j of image i is labelled from a number keyed by (seed, step, i, j)).
    # SETTINGS, the cpu variant's training (its 3-seed result at N0 = 4 is where this starts): digits 8x8 (1,197
    # training images; 600 held out, no analysis split), the two-stage ResNet (8, 16), SGD lr 0.05 momentum 0.9
    # weight decay 1e-4, cosine, no warm-up, batch 64, 300 steps (16 epochs).
    c.mode = "training"
    c.data.update(validation_size=600, analysis_size=0)
    c.sera.update(n_min=2, n_max_factor=4)
    c.dynamics.update(methods=("uniform", "sera", "sera_all_active", CROSS_ENTROPY), seeds=tuple(range(16)),
                      steps=300, rollouts_per_prompt=n0, eval_every=10, pass_k=(1, 2, 4, 8, 16, 32, 64),
                      monitor_every=10, early_step=50, endpoint_k=4)
    c.ckpt.update(every=50)
    c.log.update(every=10)


def allocator_defined(name: str, estimator: str) -> bool:
    """Whether the allocator ``name`` is defined for ``estimator``: the registry's ``check_estimator``."""
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
    """Raises ValueError naming the first bad field, in three passes: the variant, its fields and the mode
    (``_check_run``); every field's own rule (``field_rules``, one ``config_utils.check_fields``); then the names the
    lists hold and the rules that tie fields together (``_check_names``, ``_check_ties``)."""
    training_mode = _check_run(config) == "training"
    config_utils.check_fields(config, field_rules(config, training_mode))
    _check_names(config)
    _check_ties(config, training_mode)
    validate_wandb_config(config)


def _check_run(config: ml_collections.ConfigDict) -> str:
    """The variant (and no field its ``get_config`` lacks) and the mode; returns the mode."""
    variant = config_utils.require(config, "variant", str)
    if variant not in VARIANTS:
        raise ValueError(f"config.variant={variant!r}: expected one of {list(VARIANTS)}")
    config_utils.check_no_unknown_fields(config, get_config(variant))
    return config_utils.require(config, "mode", lambda m: m in MODES, f"expected one of {list(MODES)}")


def field_rules(config: ml_collections.ConfigDict, training_mode: bool) -> list[Rule]:
    """Each field's own rule (``config_utils.Rule``), group by group in the order they are checked."""
    return [*_run_rules(), *_data_rules(config, training_mode), *_model_rules(config), *_optim_rules(),
            *_pretrain_rules(config), *_analysis_rules(config), *_dynamics_rules(config), *_schedule_rules(config),
            Rule("ckpt.every", _positive_int, "expected an int >= 1"), Rule("log.progress", bool)]


def _run_rules() -> list[Rule]:
    return [Rule("seed", lambda s: isinstance(s, int) and s >= 0, "expected an int >= 0"), Rule("fast_compile", bool)]


def _data_rules(config: ml_collections.ConfigDict, training_mode: bool) -> list[Rule]:
    """``config.data``: a known dataset (with its data directory off digits) and the split sizes."""
    name = config.data.name
    rules = [Rule("data.name", str), Rule("data.name", lambda n: n in DATASETS, f"expected one of {list(DATASETS)}")]
    if name != "digits":
        rules.append(Rule("data.data_dir", lambda d: isinstance(d, str) and d != "",
                          f"the {name} dataset needs a TFDS data directory (--config.data.data_dir=...)"))
    least = 0 if training_mode else 1  # training mode reads no analysis split (0: every image but validation's)
    return rules + [Rule("data.validation_size", _positive_int, "expected an int >= 1"),
                    Rule("data.eval_batch_size", _positive_int, "expected an int >= 1"),
                    Rule("data.analysis_size", lambda n: config_utils.is_int(n) and n >= least,
                         f"expected an int >= {least}")]


def _model_rules(config: ml_collections.ConfigDict) -> list[Rule]:
    """``config.model``: the network's name, one stage size per width, the dtype."""
    return [Rule("model.name", str),
            Rule("model.widths", lambda w: _int_tuple(w, 1), "expected a non-empty tuple of ints >= 1"),
            Rule("model.stage_sizes", lambda s: _int_tuple(s, 1) and len(s) == len(config.model.widths),
                 "expected one int >= 1 per entry of model.widths"),
            Rule("model.dtype", lambda d: d in ("float32", "bfloat16"), "expected 'float32' or 'bfloat16'")]


def _optim_rules() -> list[Rule]:
    """``config.optim``: the optimizer's numbers and the batch size."""
    return [Rule("optim.lr", lambda x: isinstance(x, (int, float)) and x > 0, "expected a number > 0"),
            Rule("optim.momentum", lambda x: isinstance(x, (int, float)) and 0 <= x < 1, "expected in [0, 1)"),
            Rule("optim.weight_decay", lambda x: isinstance(x, (int, float)) and x >= 0, "expected >= 0"),
            Rule("optim.warmup_steps", lambda x: isinstance(x, int) and x >= 0, "expected an int >= 0"),
            Rule("optim.batch_size", _positive_int, "expected an int >= 1"),
            Rule("optim.max_grad_norm", lambda x: isinstance(x, (int, float)) and x >= 0,
                 "expected a number >= 0 (0: no clipping)")]


def _pretrain_rules(config: ml_collections.ConfigDict) -> list[Rule]:
    """``config.pretrain``: the CE run's steps and its analysed checkpoints among them."""
    steps = config.pretrain.steps
    return [Rule("pretrain.steps", _positive_int, "expected an int >= 1"),
            Rule("pretrain.checkpoint_steps", lambda s: _int_tuple(s, 0) and list(s) == sorted(set(s)) and s[-1] <= steps,
                 f"expected strictly increasing ints in [0, pretrain.steps={steps}]")]


def _analysis_rules(config: ml_collections.ConfigDict) -> list[Rule]:
    """``config.analysis`` and ``config.sera``: the methods analysed, the allocation bounds and the pilot, budgets,
    the analysis set, the draws and how they are chunked, the gradient-norm figure's budget and images, the online
    peers' knobs."""
    n_min, num_prompts = config.sera.n_min, config.analysis.num_prompts
    return [Rule("analysis.estimators", lambda e: isinstance(e, (tuple, list)) and len(e) > 0,
                 "expected a non-empty tuple of estimator names"),
            Rule("analysis.allocators", lambda a: isinstance(a, (tuple, list)) and len(a) > 0 and len(set(a)) == len(a),
                 "expected a non-empty tuple of distinct allocator names"),
            Rule("sera.n_min", _positive_int, "expected an int >= 1"),
            *(Rule(f"sera.{field}", _positive_int, "expected an int >= 1")
              for field in ("n_max_factor", "n_max_table", "pilot_rollouts")),
            Rule("analysis.budgets", lambda b: _int_tuple(b, n_min) and list(b) == sorted(set(b)),
                 f"expected strictly increasing ints >= sera.n_min={n_min}"),
            Rule("analysis.num_prompts", _positive_int, "expected an int >= 1"),
            Rule("analysis.num_draws", lambda r: isinstance(r, int) and r >= 2,
                 "expected an int >= 2 (a confidence interval needs two draws)"),
            Rule("analysis.draw_chunk", lambda c: isinstance(c, int) and c >= 2,
                 "expected an int >= 2 (the two halves of the pilot's expectation share a chunk)"),
            Rule("analysis.microbatch", lambda m: isinstance(m, int) and m >= 0,
                 "expected an int >= 0 (0: all prompts at once)"),
            Rule("analysis.pilot_expectation_draws", lambda t: isinstance(t, int) and t >= 2,
                 "expected an int >= 2 (it is split into two independent halves)"),
            Rule("analysis.norm_budget", lambda b: b in tuple(config.analysis.budgets), "expected one of analysis.budgets"),
            Rule("analysis.norm_examples", lambda n: _positive_int(n) and n <= num_prompts,
                 f"expected an int in [1, analysis.num_prompts={num_prompts}]"),
            Rule("analysis.keep_per_prompt", lambda k: _positive_int(k) and k >= 2,
                 "expected an int >= 2 (PODS's and Reinforce-Ada's rollouts trained per prompt: both classes)"),
            Rule("analysis.round_size", _positive_int, "expected an int >= 1 (Reinforce-Ada's rollouts per round)")]


def _dynamics_rules(config: ml_collections.ConfigDict) -> list[Rule]:
    """What the training runs run: distinct methods and seeds, steps, an estimator whose scale factor depends on N,
    the budget per image, the loss correction and the activation threshold."""
    n_min = config.sera.n_min
    training_mode = config.mode == "training"
    return [Rule("dynamics.methods", lambda m: isinstance(m, (tuple, list)) and len(set(m)) == len(m)
                 and (len(m) > 0 or not training_mode), "expected a tuple of distinct method names"),
            Rule("dynamics.seeds", lambda s: _int_tuple(s, 0) and len(set(s)) == len(s), "expected distinct ints >= 0"),
            Rule("dynamics.steps", _positive_int, "expected an int >= 1"),
            Rule("dynamics.estimator", lambda e: e in ESTIMATORS and get_estimator(e).depends_on_n,
                 "expected an estimator whose scale factor depends on N (maxrl, maxrl_no_baseline, grpo)"),
            Rule("dynamics.rollouts_per_prompt", lambda n: _positive_int(n) and n >= max(n_min, 1),
                 f"expected an int >= sera.n_min={n_min}"),
            Rule("dynamics.correction", bool),
            Rule("dynamics.activation_threshold", lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
                 and 0 <= x <= 1, "expected a number in [0, 1]")]


def _schedule_rules(config: ml_collections.ConfigDict) -> list[Rule]:
    """When the training runs evaluate and monitor (the monitor logs at ``log.every``'s steps) and the declared
    endpoints among the evaluated steps and k."""
    d, log_every = config.dynamics, config.log.every
    steps, eval_every, pass_k = d.steps, d.eval_every, d.pass_k
    return [Rule("dynamics.eval_every", _positive_int, "expected an int >= 1"),
            Rule("dynamics.pass_k", lambda k: _int_tuple(k, 1), "expected a non-empty tuple of ints >= 1"),
            Rule("log.every", _positive_int, "expected an int >= 1"),
            Rule("dynamics.monitor_every", lambda m: isinstance(m, int) and m >= 0 and m % log_every == 0,
                 f"expected an int >= 0 that is a multiple of log.every={log_every} (0: no gradient monitor)"),
            Rule("dynamics.early_step",
                 lambda s: isinstance(s, int) and 0 <= s <= steps and (s % eval_every == 0 or s == steps),
                 f"expected an evaluated step: a multiple of dynamics.eval_every={eval_every} in [0, dynamics.steps="
                 f"{steps}]"),
            Rule("dynamics.endpoint_k", lambda k: k in tuple(pass_k), f"expected one of dynamics.pass_k={pass_k}")]


def _check_names(config: ml_collections.ConfigDict) -> None:
    """The names the lists hold: registered estimators; analysable allocators, each defined for one of the
    estimators, uniform among them; known training methods."""
    estimators, allocators = config.analysis.estimators, config.analysis.allocators
    for est in estimators:
        if est not in ESTIMATORS:
            raise ValueError(f"config.analysis.estimators contains {est!r}; known: {sorted(ESTIMATORS)}")
    for name in allocators:
        if name not in ALLOCATORS:
            raise ValueError(f"config.analysis.allocators contains {name!r}, which is not a registered allocator; "
                             f"known: {sorted(ALLOCATORS)}")
        if name not in ANALYSABLE:
            raise ValueError(f"config.analysis.allocators contains {name!r}, which the analysis does not run (a "
                             f"count allocator needs its loss in ALLOCATOR_CORRECTION; prompt selection has no "
                             f"fixed prompt set to align); analysable: {list(ANALYSABLE)}")
        if not any(allocator_defined(name, est) for est in estimators):
            raise ValueError(f"config.analysis.allocators contains {name!r}, which is undefined for every one of "
                             f"analysis.estimators={list(estimators)}")
    if "uniform" not in allocators:
        raise ValueError(f"config.analysis.allocators={list(allocators)} must contain 'uniform' (the baseline)")
    for m in config.dynamics.methods:
        if m not in DYNAMICS_METHODS:
            hint = " ('ce' is now 'cross_entropy')" if m == "ce" else ""
            raise ValueError(f"config.dynamics.methods contains {m!r}{hint}; known: {list(DYNAMICS_METHODS)}")


def _check_ties(config: ml_collections.ConfigDict, training_mode: bool) -> None:
    """The rules that tie fields together: n_min enough for every estimator, the analysis set inside its split and
    split evenly, every training method defined for the training estimator, the released sera's n_max >= 2."""
    n_min, a, d = config.sera.n_min, config.analysis, config.dynamics
    for est in a.estimators:
        if n_min < get_estimator(est).min_rollouts:
            raise ValueError(f"config.sera.n_min={n_min} is below the {get_estimator(est).min_rollouts} "
                             f"rollouts estimator {est!r} needs")
    if a.num_prompts > config.data.analysis_size and not training_mode:
        raise ValueError(f"config.analysis.num_prompts={a.num_prompts} exceeds config.data.analysis_size="
                         f"{config.data.analysis_size}")
    if a.microbatch and a.num_prompts % a.microbatch:
        raise ValueError(f"config.analysis.microbatch={a.microbatch} must divide analysis.num_prompts={a.num_prompts}")
    if n_min < get_estimator(d.estimator).min_rollouts:
        raise ValueError(f"config.sera.n_min={n_min} is below what dynamics.estimator={d.estimator!r} needs")
    for m in d.methods:
        if m != CROSS_ENTROPY:
            try:
                get_allocator(m).check_estimator(get_estimator(d.estimator))
            except ValueError as e:
                raise ValueError(f"config.dynamics.methods contains {m!r}, undefined for dynamics.estimator="
                                 f"{d.estimator!r}: {e}") from e
    if "sera" in d.methods and config.sera.n_max_factor * d.rollouts_per_prompt < 2:
        raise ValueError(f"config.sera.n_max_factor={config.sera.n_max_factor}: the released sera needs n_max = "
                         f"n_max_factor * dynamics.rollouts_per_prompt >= 2")
