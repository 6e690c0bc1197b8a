"""Configs of the maze experiment (docs/method.md §8B).

    python -m experiments.maze.main --config=experiments/maze/config.py:cpu --workdir=/tmp/maze

Variants: ``tiny`` (tests, seconds), ``demo`` (the README's reproduction, ~2 minutes: 7x7 mazes), ``cpu`` and
``cpu_n32`` and ``cpu_n64`` (the powered comparison on 2 cores at N_bar = 16, 32 and 64: 11x11 mazes, 16 paired
seeds, the primary pair and the peers; its regime, endpoints and methods are declared in ``get_config``), ``full`` / ``gpu`` (the paper:
17x17 mazes, the 3.9M-parameter Qwen2-style policy, 256 prompts per step, 256 held-out mazes x 2048 samples) for
one 141 GiB H200:
the update of 4,096 rollouts x 490 tokens in one slice with remat over scanned layers is planned at 41 GiB per
device with each of the 256 prompts through the model once (``rl.share_prompts``; 72 GiB joined); every call's
figure: ``python -m sera_jax.train.plan --config=experiments/maze/config.py:gpu --devices=1``.
``gpu_n128``: ``gpu`` at MaxRL's own budget, 256 prompts x 128 rollouts a step (``maze/maze_17.sh``,
``N_ROLLOUTS=128``; MaxRL compares N from 4 to 128 and its reported pass@k comes from 128), the update
accumulated over 8 slices of 4,096 rollouts. The paper's SERA-vs-MaxRL comparison (docs/method.md §8B) is ``gpu`` /
``full``: 16 rollouts a prompt on average (SERA's allocation between n_min 4 and n_max 128), where a tight
budget leaves hard mazes attenuated under uniform N; at 128 a prompt the factor s(p, N) is near 1 for most
mazes and SERA has little to reallocate.

``paper``: the SERA authors' own maze run (ChenZihao0121/SERA @ 3252ed5, ``maze/maze_17.sh``; each setting's source
line in ``_paper_maze``): MaxRL's SFT policy, 7,424 fixed 17x17 mazes revisited in epochs (29 steps each), 256
mazes x 128 rollouts a step for 3,000 steps, uniform MaxRL against the released SERA on their frozen per-epoch
estimates (n_min 2, n_max 512), verl's micro-batched token-mean, evaluation every 250 steps on 256 mazes x 2,048
samples at temperature 1 with their bootstrap pass@k beside the unbiased one, on one node of 4 GPUs (FSDP)::

    python -m experiments.maze.main --config=experiments/maze/config.py:paper --workdir=/tmp/maze_paper \\
        --config.model.init_dir=/path/to/maxrl/maze/ckpt-1500 \\
        --config.maze.train_parquet=/path/to/SERA-Maze-17x17/train.parquet \\
        --config.maze.eval_parquet=/path/to/SERA-Maze-17x17/test.parquet

``maze.train_parquet``: a local copy of their data (verl's parquet layout: the Hugging Face dataset
capybaraczh/SERA-Maze-17x17's train split, from which their seed-42 draw of 7,424 rows is made again, or their
drawn ``fixed_train7424_seed42/train.parquet``); without it, 7,424 mazes of our MaxRL generator. ``maze.eval_parquet``:
their validation file; without it, 256 generated held-out mazes. ``paper_tiny`` runs the same code paths in seconds
(``tests/experiments/test_maze_paper.py``).

MaxRL's task and settings (docs/method.md §9) in every variant: its vocabulary, prompt layout and reward
(``sera_jax.envs.maze``), responses up to ``maze.response_length(size)`` tokens (180 at 17x17), rope_theta
1e6, AdamW with weight decay 0.01 (SFT betas 0.9/0.95, RL 0.9/0.999), and verl's loss aggregation: MaxRL
and GRPO with the token-mean over the whole batch (``sera.aggregation="token_mean"``, ``correction=False``),
SERA with its multiplicity-corrected counterpart (each prompt's tokens share 1/P). ``gpu`` / ``full`` also
take MaxRL's SFT schedule (constant lr 5e-4, no warm-up); the small variants keep a warm-up and cosine decay,
which a from-scratch model of ~30k parameters needs.

Start from MaxRL's released SFT policy instead of running SFT:

    python -m experiments.maze.main --config=experiments/maze/config.py:gpu --workdir=/tmp/maze \\
        --config.model.init_dir=/path/to/maxrl/maze/ckpt-1500

(a local Hugging Face directory: config.json, model.safetensors, tokenizer.json; the architecture comes from
its config.json, the vocabulary is checked against ``sera_jax.envs.maze``; nothing is downloaded).
"""

from __future__ import annotations

import os

import ml_collections

from sera_jax.envs import maze as maze_env
from sera_jax.rl.config import default_rl_config
from sera_jax.train import config_utils
from sera_jax.train.config_utils import is_fraction
from sera_jax.train.sharding import default_mesh_config
from sera_jax.train.writers import default_wandb_config

# What each compared method changes in ``config.sera`` (everything else is shared; all use the token-mean).
METHODS = {
    "uniform": dict(method="uniform", estimator="maxrl", correction=False),  # MaxRL: verl's batch token-mean
    "sera": dict(method="sera", estimator="maxrl", correction=True),  # SERA (pilot estimates), corrected
    "sera_no_correction": dict(method="sera", estimator="maxrl", correction=False),
    "sera_all_active": dict(method="sera_all_active", estimator="maxrl", correction=True),  # the max–min, all active
    # The learning-rate arms of the frontier comparison (``cpu_frontier``): the same methods with config.rl's
    # learning rate changed, so that coverage is compared at matched pass@1 rather than at matched steps.
    "uniform_lr_1e-6": dict(method="uniform", estimator="maxrl", correction=False, rl=dict(learning_rate=1e-6)),
    "uniform_lr_3e-6": dict(method="uniform", estimator="maxrl", correction=False, rl=dict(learning_rate=3e-6)),
    "uniform_lr_5e-6": dict(method="uniform", estimator="maxrl", correction=False, rl=dict(learning_rate=5e-6)),
    "sera_lr_2e-5": dict(method="sera", estimator="maxrl", correction=True, rl=dict(learning_rate=2e-5)),
    "grpo": dict(method="uniform", estimator="grpo", correction=False),  # for context, as verl runs it
    # Other allocators of the registry (sera_jax.core.allocators), on SERA's pilot estimates: SERA's sum-objective
    # ablation (corrected, as SERA), and the published peers with the loss they were published with (verl's
    # token-mean, no multiplicity correction). docs/allocators.md gives each rule and its fixed-budget form.
    "sera_sum": dict(method="sera_sum", estimator="maxrl", correction=True),
    "dynamo": dict(method="dynamo", estimator="maxrl", correction=False),
    "knapsack": dict(method="knapsack", estimator="maxrl", correction=False),
    # The peers that choose which rollouts train or sample in rounds (DARS on its pilot of pilot_rollouts); the
    # selection peers (mopps, greso) need prompts that recur, which the maze's endless stream never does
    # (``maze.num_train > 0`` gives them, and sera.p_estimate="history", a fixed set revisited in epochs).
    "dapo": dict(method="dapo", estimator="maxrl", correction=False),
    "pods": dict(method="pods", estimator="maxrl", correction=False),
    "reinforce_ada": dict(method="reinforce_ada", estimator="maxrl", correction=False),
    "dars": dict(method="dars_et", estimator="maxrl", correction=False),
    # SERA under a token budget (docs/method.md §6): the step samples at most ``sera.tokens_per_step`` response tokens,
    # pilot included (set per variant: the sampled tokens of uniform MaxRL at the same N_bar).
    # The token budget has the all-active rule's form only (the released rule spends rollouts).
    "sera_tokens": dict(method="sera_all_active", estimator="maxrl", correction=True, budget="tokens"),
}
MAXRL_ROPE_THETA = 1_000_000.0  # maze/ckpt-1500/config.json


def get_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    """The settings of ``variant``: the shared base, then the few settings that make the variant (``VARIANTS``)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose " + ", ".join(VARIANTS))
    c = _base_config(variant)
    VARIANTS[variant](c)
    if not c.sera.tokens_per_step:
        # sera_tokens' budget where the variant sets none: the rollout budget at half the response cap. A comparison
        # at equal sampled tokens sets it from uniform's measured tokens instead, as cpu / cpu_n32 do.
        cap = c.maze.max_new_tokens or maze_env.response_length(c.maze.size)
        c.sera.tokens_per_step = c.rl.rollouts_per_step * cap // 2
    return c




def _base_config(variant: str) -> ml_collections.ConfigDict:
    """What every variant starts from (the small 7x7 maze of the tests and the demo)."""
    c = default_rl_config()
    c.variant = variant
    c.seeds = (0, 1, 2)
    c.rl.data_order = "seed"  # seeds vary the training prompts' order too; methods of a seed share it
    c.methods = ("uniform", "sera", "grpo")
    # 7x7 mazes have only 192 distinct layouts: 64 are held out, RL trains on the other 128 (many epochs).
    # max_new_tokens: the response cap (0: maze.response_length(size), MaxRL's 180 at 17x17).
    # num_train: 0, an endless stream of training mazes (every variant here); M > 0, a fixed set of M (the stream's
    # first M, held-out ones skipped, the same for every seed) revisited in epochs, each in a per-epoch order (SERA
    # trained on 7,424 fixed 17x17 mazes); needed by sera.p_estimate="history", which reads earlier visits.
    c.maze = dict(size=7, num_eval=64, data_seed=1234, max_new_tokens=0, num_train=0)
    # attention / remat / scan_layers: how the decoder runs (sera_jax.models.decoder.DecoderConfig), not what it is.
    # init_dir: a Hugging Face checkpoint to start RL from (SFT skipped; its config.json gives the architecture).
    c.model = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=128, dtype="float32",
                   rope_theta=MAXRL_ROPE_THETA, attention="auto", remat="none", scan_layers=False, init_dir="")
    # shared=True: one SFT policy for all seeds, made with sft.seed (seeds then vary the RL only); False: one SFT
    # per seed, made with that seed.
    c.sft = dict(steps=500, batch_size=32, learning_rate=3e-3, warmup_steps=20, schedule="cosine", b1=0.9, b2=0.95,
                 weight_decay=0.01, shared=False, seed=0)
    c.mesh = default_mesh_config()
    c.log = dict(progress=True, wandb=default_wandb_config())  # wandb: Weights & Biases, off by default
    # MaxRL used lr 1e-4 for its 3.9M-parameter policy; this 30k-parameter one barely moves at 1e-4 (docs/results.md: 1e-4,
    # 3e-4 and 1e-3 compared).
    c.rl.update(steps=60, prompts_per_step=16, rollouts_per_step=128, learning_rate=3e-4, b1=0.9, b2=0.999,
                weight_decay=0.01)
    c.sera.update(p_estimate="pilot", pilot_rollouts=2, n_min=2, n_max=64, aggregation="token_mean")
    c.eval.update(every=30, samples_per_prompt=64, ks=(1, 2, 4, 8, 16, 32, 64))
    c.ckpt.update(every=30)
    return c


def _tiny(c: ml_collections.ConfigDict) -> None:
    """``tiny``: the tests' run, seconds."""
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


def _demo(c: ml_collections.ConfigDict) -> None:
    """``demo``: the README's reproduction, ~2 minutes (7x7 mazes)."""
    c.seeds = (0, 1, 2)
    c.methods = ("uniform", "sera")
    c.maze.update(num_eval=32)
    c.sft.update(steps=400, shared=True)
    c.rl.update(steps=20)
    c.eval.update(every=20, samples_per_prompt=32, ks=(1, 2, 4, 8, 16, 32))
    c.ckpt.update(every=20)


def _cpu(c: ml_collections.ConfigDict) -> None:
    """``cpu``, ``cpu_n32``, ``cpu_n64``: the powered comparison on an endless stream at N_bar 16, 32, 64."""
    # The powered comparison, declared here before it ran (calibration: docs/results.md "Calibration" and
    # results/cpu/maze/calibration.json; seeds 100+ there, none of the declared ones).
    # REGIME: uniform MaxRL raises held-out pass@1 and does not lower pass@k at the declared large k = 32
    # against its SFT start, as calibration found for these settings (start pass@1 0.080, pass@32 0.681,
    # pass@128 0.863; uniform after 200 steps: pass@1 +0.031 at both budgets, pass@32 -0.002 at N_bar 16 and
    # +0.022 at N_bar 32). It lowered pass@64 / pass@128 by up to 0.013 in those runs (up to 0.039 on another
    # start), so k = 32 is the largest k calibration supports; pass@128 is reported, as secondary.
    # PRIMARY ENDPOINTS, at each budget: the seed-paired difference SERA - uniform MaxRL in final held-out
    # pass@1 and pass@32 (256 mazes x 128 samples), each with its 95% t-interval over the 16 seeds and the
    # minimum detectable effect at 80% power; target interval +-0.03.
    # BUDGETS: N_bar = 16 (``cpu``: 8 mazes x 16 rollouts a step) and N_bar = 32 (``cpu_n32``), 200 steps:
    # 25,600 and 51,200 training rollouts per method. SERA: a pilot of 2 inside the budget, n_min 2,
    # n_max 8 N_bar (the paper's 128 at N_bar 16).
    # METHODS, in the order they are run (the primary pair first; secondary ones as machine time allows,
    # dropped before seeds): uniform, sera | sera_no_correction, grpo, dapo, dynamo, knapsack, reinforce_ada,
    # sera_tokens (SERA's token budget at the sampled tokens of uniform's calibration run, ~17 tokens a
    # rollout: 2,200 a step at N_bar 16, 4,400 at N_bar 32).
    # SEEDS 0..15: each its own RL randomness and order of training mazes (rl.data_order="seed"), shared by
    # the methods with the evaluation key; one shared SFT start (sft.seed 0, 800 steps) for all.
    # Settings: 11x11 mazes, the 125k-parameter decoder, lr 3e-5 (at 1e-4 coverage fell in calibration).
    # SECOND BUDGET, declared after N_bar 16 failed the regime on its first 4 declared seeds (uniform pass@32
    # -0.025 +- 0.026) and before any N_bar 64 seed of 0..15 ran: N_bar = 64 (``cpu_n64``, 102,400 training
    # rollouts per method; n_max 512; token budget 8,800 a step, uniform's calibration runs sampled 8,830).
    # Its calibration (seeds 104, 105, on the start this config trains on a CPU with AVX512: pass@1 0.09,
    # pass@32 0.72): uniform pass@1 +0.019 / +0.018, pass@32 +0.014 / +0.034. Same endpoints, methods, seeds.
    # The start is SFT of a fixed seed, but another CPU's instruction set trains another one from it: a
    # comparison continued on another machine adds whole seeds (``sera_jax.rl.comparison.check_seed_start``).
    n_bar = {"cpu": 16, "cpu_n32": 32, "cpu_n64": 64}[c.variant]
    c.seeds = tuple(range(16))
    c.methods = ("uniform", "sera", "sera_no_correction", "grpo", "dapo", "dynamo", "knapsack", "reinforce_ada",
                 "sera_tokens")
    c.maze.update(size=11, num_eval=256)
    c.model.update(d_model=64, head_dim=16, ffn_dim=256)
    c.sft.update(steps=800, shared=True, seed=0)
    c.rl.update(steps=200, prompts_per_step=8, rollouts_per_step=8 * n_bar, learning_rate=3e-5)
    c.sera.update(pilot_rollouts=2, n_min=2, n_max=8 * n_bar, tokens_per_step=2_200 * n_bar // 16)
    c.eval.update(every=200, samples_per_prompt=128, ks=(1, 2, 4, 8, 16, 32, 64, 128), max_rollouts_per_call=2048,
                  sample_slots=1024)  # 18% faster than a slot per row on this policy, the same rollouts
    c.ckpt.update(every=50)


def _cpu_epochs(c: ml_collections.ConfigDict) -> None:
    """``cpu_epochs`` and the variants built on it: a fixed training set revisited over epochs."""
    # The released SERA where its authors made it work: a fixed training set revisited for many epochs, their
    # frozen per-epoch estimates, n_max = 4 N0, the authors' token-mean loss. Declared here after calibration
    # (results/cpu/maze_epochs/calibration.json; seeds 100+, none of the declared ones) and before any declared
    # seed ran.
    # CALIBRATION: at lr 3e-5 uniform MaxRL lost pass@32 (128 mazes: 0.718 -> 0.629; 512 mazes x 640 steps:
    # -0.035), failing the regime; at lr 1e-5 it raised pass@1 by 0.015 on both calibration seeds and moved
    # pass@32 by -0.005 (seed 100) and +0.018 (seed 101), so the regime is declared at lr 1e-5.
    # REGIME: uniform MaxRL raises held-out pass@1 and does not lower pass@32 (the declared large k) from the
    # SFT start (start pass@1 0.093, pass@32 0.718), checked on the declared seeds and reported either way.
    # PRIMARY ENDPOINTS: the seed-paired differences sera (the released rule, ``sera_epochs``) - uniform in final
    # held-out pass@1 and pass@32 (256 mazes x 128 samples), 95% t-intervals over 16 seeds, target half-width
    # <= 0.01. SECONDARY: sera_all_active (epoch estimates) and dapo against uniform at the same k; every k;
    # per method the active fraction along training and the rollouts spent on unmixed groups.
    # SETTINGS: 11x11 mazes, 128 fixed training mazes, 200 steps x 8 mazes x 16 rollouts (12.5 visits a maze,
    # 25,600 training rollouts per method), n_min 2, n_max 64, lr 1e-5, the cpu SFT start (800 steps, seed 0),
    # evaluated at steps 0, 100 and 200. SEEDS 0..15: each its own RL randomness and order of the training
    # mazes, shared by the methods with the evaluation key.
    c.seeds = tuple(range(16))
    # On a fixed training set revisited in epochs, as the SERA authors train: their frozen per-epoch estimates (epoch 0
    # uniform) for every method that allocates by p (the declared runs named the released rule on them
    # ``sera_epochs`` and the all-active one ``sera_all_active_epochs``: their files keep those names).
    c.sera.p_estimate = "epoch_history"
    c.methods = ("uniform", "sera", "sera_all_active", "dapo")
    c.maze.update(size=11, num_eval=256, num_train=128)
    c.model.update(d_model=64, head_dim=16, ffn_dim=256)
    c.sft.update(steps=800, shared=True, seed=0)
    c.rl.update(steps=200, prompts_per_step=8, rollouts_per_step=8 * 16, learning_rate=1e-5)
    # The authors' loss: verl's token-mean (uniform: over the batch; SERA: its N0 / N_i prompt weights inside it).
    c.sera.update(pilot_rollouts=2, n_min=2, n_max=4 * 16, aggregation="token_mean_microbatch")
    c.eval.update(every=100, samples_per_prompt=128, ks=(1, 2, 4, 8, 16, 32, 64, 128), max_rollouts_per_call=2048,
                  sample_slots=1024)
    c.ckpt.update(every=50)
    EPOCH_VARIANTS.get(c.variant, lambda c: None)(c)


def _cpu_frontier(c: ml_collections.ConfigDict) -> None:
    """``cpu_frontier``: cpu_epochs with learning-rate arms, compared at matched pass@1."""
    # Does the released SERA buy coverage, or learn slower? cpu_epochs with learning-rate arms, so that SERA's pass@k
    # is compared with uniform MaxRL's at SERA's own pass@1, read off uniform's (learning rate, step) curves, on
    # fresh seeds. Declared here after calibration (results/cpu/maze_frontier/calibration.json, seed 100, none of the
    # declared ones) and before any declared seed ran.
    # CALIBRATION (seed 100; start pass@1 0.093, pass@32 0.718; final change in pass@1 / pass@32): uniform at lr 1e-6
    # +0.006 / +0.023, 3e-6 +0.011 / +0.012, 5e-6 +0.013 / +0.008, 1e-5 +0.015 / -0.005; the released sera at 1e-5
    # +0.004 / -0.002, at 2e-5 +0.008 / -0.003. So uniform's paths cross SERA's final pass@1 at both ends of their
    # steps (1e-6 late, 1e-5 early); 5e-6 adds nothing between 3e-6 and 1e-5 and is dropped. About 5 minutes a run
    # alone on 2 cores: 5 arms x 16 seeds, ~7 hours.
    # PRIMARY ENDPOINT (sera_jax.report.matched, stored as results.json's ``matched_pass_at_1``): per seed, the
    # released sera's (lr 1e-5) final pass@32 minus uniform's pass@32 at sera's final pass@1, where uniform's value
    # is the mean over its three arms of each arm's path (evaluations in step order) at its first crossing of that
    # pass@1, linear in pass@1 between the two evaluations around it; where no arm crosses it, the evaluation with
    # the nearest pass@1 (flagged, counted in ``num_clamped``). 95% t-interval over seeds 16..31, target half-width
    # <= 0.01. SECONDARY: the same at k = 16, 64, 128, and for sera at lr 2e-5; the plain paired differences against
    # uniform at lr 1e-5 at equal steps; every method's allocation diagnostics at every step.
    # SETTINGS: cpu_epochs (128 fixed 11x11 mazes, 200 steps x 8 x 16 rollouts, n_min 2, n_max 64, epoch-frozen
    # estimates, the authors' token-mean, the cpu SFT start), evaluated every 50 steps (0, 50, ..., 200) on 256
    # held-out mazes x 128 samples. SEEDS 16..31: each its own RL randomness and order of the training mazes,
    # shared by the arms with the evaluation key.
    c.seeds = tuple(range(16, 32))
    c.methods = ("uniform_lr_1e-6", "uniform_lr_3e-6", "uniform", "sera", "sera_lr_2e-5")
    c.eval.update(every=50)
    c.matched_pass_at_1 = dict(treated=("sera", "sera_lr_2e-5"),
                               references=("uniform_lr_1e-6", "uniform_lr_3e-6", "uniform"),
                               k=32, other_ks=(16, 64, 128))


def _cpu_active_set(c: ml_collections.ConfigDict) -> None:
    """``cpu_active_set``: the authors' maze budget (N0 128), where the active set fires."""
    # The regime where the released rule gives prompts zero rollouts: the authors' maze budget (N0 = 128,
    # n_max = 512 = 4 N0, n_min 2; their maze_17.sh) on a fixed set chosen by the start policy. Declared here after
    # calibration (results/cpu/maze_active_set/calibration.json; seed 100, none of the declared ones) and before any
    # declared seed ran.
    # CALIBRATION: the active set drops hopeless mazes from a step whose budget they make tight (more than
    # N0 / n_max = 1/4 of its mazes at n_max each) beside a near-certain maze, whose n_min = 2 rollouts fail the
    # count test (docs/method.md §3.4). 11x11 mazes with 3/8 hopeless (the start solves none more than 83 times in
    # 128): every maze active at every step. 9x9 (the 800-step SFT start solves 2.3% of a pool 126 or more times in
    # 128, 4.7% never): 1/8 hopeless + 1/8 near-certain, active fraction after epoch 0 0.986; 3/8 + 1/8 0.946;
    # 1/4 + 1/4 0.960; 3/8 + 1/4 at lr 5e-6 0.926; 1/2 + 1/4 at lr 3e-6 0.832. Uniform MaxRL trades pass@1 for
    # coverage on these sets at higher learning rates (3/8 + 1/8: pass@1 -0.010 at lr 1e-5, -0.057 at 3e-5, pass@32
    # +0.071 / +0.099); at 1/2 + 1/4 and lr 3e-6: pass@1 +0.001, pass@32 +0.023.
    # REGIME: uniform raises held-out pass@1 and does not lower pass@32 (the declared large k) by more than 0.01
    # from the SFT start (start pass@1 0.416, pass@32 0.537 on this held-out mix): marginal in calibration (+0.001),
    # checked on the declared seeds and reported either way; and the released rule's active fraction after epoch 0
    # averages 0.9 or less (0.832 in calibration), reported per seed.
    # PRIMARY ENDPOINTS: the seed-paired differences sera (the released rule) - uniform in final held-out pass@1 and
    # pass@32 (256 mazes x 128 samples), 95% t-intervals over the 16 seeds, target half-width <= 0.01.
    # SECONDARY, the reason this comparison exists: sera - sera_all_active (the same waterline without the active
    # set, on the same estimates) at pass@1 and pass@32; every k; per method at every step the active fraction, the
    # mixed groups, the rollouts on unmixed groups and the prompts dropped (all-fail / all-pass side).
    # SETTINGS: 9x9 mazes; 64 fixed training mazes chosen by the start policy from a pool 18 times the set (half
    # hopeless: no success in 128 samples; a quarter the pool's most solved; the rest neither) and 256 held-out mazes
    # of the same mix; 96 steps x 8 mazes x 128 rollouts (12 epochs; 98,304 training rollouts per method), n_min 2,
    # n_max 512, lr 3e-6, epoch-frozen estimates (epoch 0 uniform), the authors' token-mean, the 800-step SFT start
    # (sft.seed 0), evaluated at steps 0, 48 and 96. SEEDS 0..15: each its own RL randomness and order of the training
    # mazes, shared by the methods with the evaluation key. About 20 minutes a seed on two cores.
    c.seeds = tuple(range(16))
    c.methods = ("uniform", "sera", "sera_all_active")
    c.maze.update(size=9, num_train=64, hard_fraction=0.5, easy_fraction=0.25, hard_samples=128, hard_pool_factor=18)
    c.rl.update(steps=96, prompts_per_step=8, rollouts_per_step=8 * 128, learning_rate=3e-6)
    c.sera.update(n_min=2, n_max=4 * 128)
    c.eval.update(every=48)
    c.ckpt.update(every=16)


def _cpu_epochs_hard(c: ml_collections.ConfigDict) -> None:
    """``cpu_epochs_hard``: cpu_epochs with 3/8 of the mazes hopeless for the start policy."""
    # Where the active set matters: cpu_epochs on a training set of which 3/8 are hopeless for the start
    # policy (no success in 128 samples, so p-hat below 1 / n_max = 1/64), the rest not, chosen from pools 6
    # times the sets' sizes by the start policy itself (``experiment.select_hard_mix``); held-out mazes of the
    # same mix. Declared after calibration (results/cpu/maze_epochs_hard/calibration.json, seed 100) and
    # before any declared seed ran.
    # CALIBRATION: the pools' candidates were 10.9% (training) and 10.7% (held-out) hopeless at the start;
    # the mixed held-out set starts at pass@1 0.064, pass@32 0.526, pass@128 0.680. Uniform MaxRL: pass@1
    # +0.007, pass@32 -0.004, pass@128 -0.008. The released sera kept every maze active at every step
    # (under its epoch estimates an all-fail maze's mixed chance at n_max stays far above the 0.05
    # threshold) and spent 79% of its rollouts on unmixed groups (uniform 52%).
    # REGIME: uniform raises held-out pass@1 and does not lower pass@32 by more than 0.01 (marginal in
    # calibration; checked on the declared seeds and reported either way).
    # PRIMARY ENDPOINTS, METHODS, SEEDS: as cpu_epochs (sera_epochs - uniform at pass@1 and pass@32, 95%
    # t-intervals over seeds 0..15; sera_all_active_epochs and dapo secondary); also per method the active
    # fraction along training and the rollouts spent on unmixed groups.
    c.seeds = tuple(range(16))
    c.maze.update(hard_fraction=0.375, hard_samples=128, hard_pool_factor=6)


def _paper(c: ml_collections.ConfigDict) -> None:
    """``paper`` (the SERA authors' maze run, ``_paper_maze``) and ``paper_tiny`` (its code paths in seconds)."""
    _paper_maze(c)
    if c.variant == "paper_tiny":
        # The same code paths in seconds: 8 fixed 7x7 mazes (4 a step: an epoch of 2 steps, so step 2 is SERA's
        # first with estimates), N0 4 and n_max 4 N0, two loss micro-batches, a tiny decoder (SFT of 4 steps, or
        # model.init_dir), the bootstrap evaluation at steps 0 and 3 (4 mazes' samples a call: the training
        # sampler's shape, so one compilation serves both); the mesh over whatever devices there are.
        c.maze.update(size=7, num_eval=2, num_train=8, max_new_tokens=0)
        c.model = dict(d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32, dtype="float32",
                       rope_theta=MAXRL_ROPE_THETA, attention="auto", remat="none", scan_layers=False,
                       init_dir="")
        c.sft.update(steps=4, batch_size=4, learning_rate=3e-3, warmup_steps=1, schedule="cosine")
        c.rl.update(steps=3, prompts_per_step=4, rollouts_per_step=4 * 4)
        c.sera.update(n_max=4 * 4, loss_microbatch_rows=8)
        c.eval.update(every=3, samples_per_prompt=4, ks=(1, 2, 4), max_rollouts_per_call=16)
        c.ckpt.update(every=0)
        c.mesh = default_mesh_config()
        c.log.progress = False


def _gpu(c: ml_collections.ConfigDict) -> None:
    """``gpu``, ``full``, ``gpu_n128``: the paper's scale (17x17 mazes, the 3.9M-parameter policy)."""
    c.maze.update(size=17, num_eval=256)
    c.model = dict(preset="maze_full", dtype="bfloat16", rope_theta=MAXRL_ROPE_THETA, attention="auto",
                   remat="block", scan_layers=True, init_dir="")
    c.sft.update(steps=1500, batch_size=32, learning_rate=5e-4, warmup_steps=0, schedule="constant")
    c.rl.update(steps=1000, prompts_per_step=256, rollouts_per_step=256 * 16, learning_rate=1e-4)
    c.sera.update(pilot_rollouts=4, n_min=4, n_max=128)
    c.eval.update(every=100, samples_per_prompt=2048, ks=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
                  max_rollouts_per_call=65536)
    c.ckpt.update(every=50)
    if c.variant == "gpu_n128":
        c.rl.update(rollouts_per_step=256 * 128, update_microbatches=8)
        c.sera.update(n_max=1024)  # mean 128 a prompt: n_max 128 would force the uniform allocation


EPOCH_VARIANTS = {"cpu_frontier": _cpu_frontier, "cpu_active_set": _cpu_active_set,
                  "cpu_epochs_hard": _cpu_epochs_hard}
# Each variant's settings beyond the base (``get_config`` lists the names in this order when one is unknown).
VARIANTS = {"tiny": _tiny, "demo": _demo, "cpu": _cpu, "cpu_n32": _cpu, "cpu_n64": _cpu, "cpu_epochs": _cpu_epochs,
            "cpu_epochs_hard": _cpu_epochs, "cpu_frontier": _cpu_epochs, "cpu_active_set": _cpu_epochs, "gpu": _gpu,
            "full": _gpu, "gpu_n128": _gpu, "paper": _paper, "paper_tiny": _paper}


PAPER_PROMPTS = 256  # SH:52 data.train_batch_size=256
PAPER_N0 = 128  # SH:14, SH:72 actor_rollout_ref.rollout.n=$N_ROLLOUTS


def _paper_maze(c: ml_collections.ConfigDict) -> None:
    """The settings of ``paper``: the SERA authors' maze run, each with its source in ChenZihao0121/SERA @ 3252ed5
    (SH:N is line N of maze/maze_17.sh; YAML the verl/trainer/config/ppo_trainer.yaml default it keeps; PREP
    maze/prepare_fixed_train.py); differences in the comments."""
    # Their script trains SERA (SH:36-37 adv_estimator=sera, SERA.enabled=True); its baseline is MaxRL, the same run
    # with SERA off (uniform N0 a prompt, weight 1). SH:53 +data.seed=1 orders their data: one run, so one seed.
    c.seeds = (0,)
    c.methods = ("uniform", "sera")
    c.sera.p_estimate = "epoch_history"  # SH:38, below
    c.maze.update(
        size=17,  # SH:8 SERA-Maze-17x17 (MaxRL's 17x17 mazes)
        num_eval=256,  # SH:9 VAL_DATA maze/data/test.parquet: MaxRL's 256 held-out mazes (docs/method.md §9)
        num_train=7_424,  # SH:8 fixed_train7424_seed42; PREP --num-train 7424: 29 steps an epoch at 256
        # SH:8 TRAIN_DATA: a local copy of their data in verl's parquet layout (the HF train split, drawn here as PREP
        # draws, or their drawn 7,424-row file); "" generates 7,424 mazes with our MaxRL generator instead.
        train_parquet="",
        train_draw_seed=42,  # PREP --seed 42: sorted(random.Random(42).sample(range(rows), 7424))
        eval_parquet="",  # SH:9 VAL_DATA: their validation file; "" our 256 generated held-out mazes
        max_new_tokens=180,  # SH:16, SH:55 data.max_response_length=180 (SH:54 prompts up to 320: ours are 310)
    )
    # SH:7, SH:57 MODEL_PATH=maze/ckpt-1500: MaxRL's SFT policy; pass --config.model.init_dir=DIR/ckpt-1500 (SFT is
    # then skipped). Without it, SFT with MaxRL's recipe (c.sft below) makes the start. SH:62, SH:67 actor and rollout
    # float16 with a gradient scaler; ours bfloat16 compute (float32's range, no scaler) on float32 parameters.
    c.model = dict(preset="maze_full", dtype="bfloat16", rope_theta=MAXRL_ROPE_THETA, attention="auto",
                   remat="block", scan_layers=True, init_dir="")
    c.sft.update(steps=1500, batch_size=32, learning_rate=5e-4, warmup_steps=0, schedule="constant", shared=True)
    c.rl.update(
        steps=3_000,  # SH:92 trainer.total_training_steps=3000 (SH:91 total_epochs=400 does not bind)
        prompts_per_step=PAPER_PROMPTS,
        rollouts_per_step=PAPER_PROMPTS * PAPER_N0,  # B = 256 x 128 = 32,768 (SERA's budget: the same total)
        learning_rate=1e-4,  # SH:13, SH:58; YAML optim: constant (lr_warmup_steps_ratio 0, warmup_style constant)
        b1=0.9, b2=0.999,  # YAML optim sets no betas: verl's AdamW default (0.9, 0.999)
        weight_decay=0.01,  # YAML actor.optim.weight_decay
        grad_clip=1.0,  # YAML actor.grad_clip (global norm); YAML clip_ratio 0.2 never binds: SH:63 one
        # mini-batch of all 256 prompts a step, YAML ppo_epochs 1, so the update is on-policy (ratio 1)
        temperature=1.0,  # SH:73 rollout.temperature=1.0; YAML rollout.top_p 1
        # SH:63-64 (with SH:84) each GPU updates 8,192 rows in 2 micro-batches of 4,096: the same 4,096 rows a
        # device per slice on the 4-device mesh below (memory only; the loss micro-batches are sera's). Planned at a
        # 42 GiB peak per device (python -m sera_jax.train.plan --config=experiments/maze/config.py:paper
        # --devices=4 --device_memory=141GiB: the update; sampling 3.4 GiB, evaluation 6.3 GiB).
        update_microbatches=2,
    )
    c.sera.update(
        # SH:38 pq_estimator=historical: frozen per-epoch Beta estimates (p_estimate "epoch_history", set
        # above); SH:45-46 prior Beta(0.5, 0.5); SH:47 discount 0.75. Epoch 0 allocates uniformly.
        epoch_prior=(0.5, 0.5), epoch_discount=0.75,
        n_min=2,  # SH:39
        n_max=512,  # SH:40 (4 N0)
        # SH:41 allocation_mode=dynamic_active_equalized: the released rule (method "sera"); SH:42 its
        # activation_useful_threshold.
        activation_threshold=0.05,
        # SH:17, SH:60 loss_agg_mode=token-mean, each micro-batch's own mean (dp_actor.py) over SH:64 4,096 rows,
        # averaged over the 8 of a step (2 a GPU x SH:84 4 GPUs); SH:43 use_rollout_count_normalization: N0 / N_i
        # on the advantages (correction=True); SH:44 use_rho_normalization=False. SH:61 loss_agg_normalizer is read
        # by seq-mean-token-sum-norm only. No KL (SH:48-49, SH:59).
        aggregation="token_mean_microbatch",
        loss_microbatch_rows=4_096,
    )
    c.eval.update(
        # SH:83 val_before_train, SH:87 test_freq=250: steps 0, 250, ..., 3000.
        every=250,
        samples_per_prompt=2_048,  # SH:15, SH:74 val_kwargs.n=2048
        temperature=1.0, top_p=1.0,  # SH:75-76 do_sample, temperature 1.0; YAML val_kwargs.top_p 1.0
        # Their trainer's metric_utils.process_validation_metrics: mean@2048 (pass@1) and best@k/mean for k = 2, 4,
        # ..., 2048, a bootstrap of 1,000 draws with replacement, seed 42 (eval/pass@k_bootstrap; evaluation/passk.py
        # maze_pass_at_k is the same); the unbiased estimate is reported beside it (eval/pass@k).
        ks=tuple(2**i for i in range(12)),
        bootstrap_repeats=1_000,
        bootstrap_seed=42,
        max_rollouts_per_call=65_536,  # 32 mazes x 2,048 samples a call (memory)
    )
    c.ckpt.update(every=250)  # SH:86 save_freq=250
    # SH:84-85 one node of 4 GPUs (their type is not stated), YAML actor.strategy fsdp over all 4 (fsdp_size -1):
    # parameters sharded and the batch split 4 ways. Other hardware: --config.mesh.shape='(-1, 1, 1)' (the mesh may
    # change on resume) and, on one device, --config.rl.update_microbatches=8.
    c.mesh.shape = (1, 4, 1)


def field_rules(config: ml_collections.ConfigDict) -> list[config_utils.Rule]:
    """The maze's own fields a variant may have, each checked where the config has it: the ``paper`` variants' draw
    and bootstrap, and the start-policy selection of the sets (``cpu_epochs_hard``, ``cpu_active_set``), whose three
    fields come together. The easy share's bound reads the hopeless share, so the rules are built from the config."""
    rules = [
        config_utils.Rule("maze.train_draw_seed", lambda v: config_utils.is_int(v) and v >= 0,
                          "must be an int >= 0 (the seed of the authors' random.Random(seed).sample draw)", True),
        config_utils.Rule("eval.bootstrap_repeats", lambda v: config_utils.is_int(v) and v >= 0,
                          "must be an int >= 0 (draws of the bootstrap pass@k; 0: not reported)", True),
        config_utils.Rule("eval.bootstrap_seed", lambda v: config_utils.is_int(v) and 0 <= v <= 2**32 - 1,
                          "must be an int in [0, 2^32 - 1] (a NumPy RandomState seed)", True),
    ]
    if "hard_fraction" not in config.maze:
        return rules
    hard = config.maze.hard_fraction
    return rules + [
        config_utils.Rule("maze.hard_fraction", is_fraction, "must be in [0, 1]"),
        config_utils.Rule("maze.hard_samples", lambda v: config_utils.is_int(v) and v >= 1,
                          "must be an int >= 1 (samples a pool maze to count its successes)"),
        config_utils.Rule("maze.hard_pool_factor", lambda v: config_utils.is_int(v) and v >= 2,
                          "must be an int >= 2 (pools that many times the sets' sizes)"),
        config_utils.Rule("maze.easy_fraction", lambda v: is_fraction(v) and v + hard <= 1,
                          "must be in [0, 1 - maze.hard_fraction]", True),
    ]


def validate_config(config: ml_collections.ConfigDict) -> None:
    """The maze's own data and evaluation fields, at the program boundary (the RL fields are
    ``sera_jax.rl.config.validate_rl_config``'s): ValueError naming the field. The parquet paths first (a file must
    exist), then :func:`field_rules` in one pass, then the fields that need a fixed training set."""
    maze_cfg = config.maze
    for field in ("train_parquet", "eval_parquet"):
        path = maze_cfg.get(field, "")
        if not isinstance(path, str):
            raise ValueError(f"config.maze.{field}={path!r}: must be a path (str), or '' for generated mazes")
        if path and not os.path.isfile(os.path.expanduser(path)):
            raise ValueError(f"config.maze.{field}={path!r}: no such file (a local copy of the SERA authors' "
                             "capybaraczh/SERA-Maze-17x17 parquet in verl's layout)")
    config_utils.check_fields(config, field_rules(config))
    fixed_set = config_utils.is_int(maze_cfg.num_train) and maze_cfg.num_train > 0
    if maze_cfg.get("train_parquet", "") and not fixed_set:
        raise ValueError(f"config.maze.train_parquet={maze_cfg.train_parquet!r} needs config.maze.num_train > 0 (the "
                         f"rows drawn from it; 7,424 in the authors' runs), got {maze_cfg.num_train!r}")
    if maze_cfg.get("hard_fraction", 0) and not fixed_set:
        raise ValueError(f"config.maze.hard_fraction={maze_cfg.hard_fraction}: needs a fixed training set "
                         f"(config.maze.num_train > 0), got {maze_cfg.num_train!r}")
