"""Configs of the math-reasoning experiment (docs/method.md §8C): uniform MaxRL vs SERA at matched training rollouts.

    python -m experiments.math_reasoning.main --config=experiments/math_reasoning/config.py:cpu --workdir=/tmp/math

Variants:

- ``tiny``: tests (seconds): a handful of arithmetic problems, a minute decoder, three RL steps.
- ``demo``: the README's reproduction (~2 minutes on 2 cores): arithmetic, one seed, a short run.
- ``cpu``: the powered offline comparison (its endpoints are declared in ``configs/offline.py``): procedural
  arithmetic word problems of 5 difficulty levels, a BPE tokenizer trained on them, a small decoder trained
  from scratch (one shared SFT on worked solutions), then RL for 8 epochs over a fixed train set of 128
  problems (so SERA estimates p with the ``history`` tracker), 16 paired seeds x 4 methods; unbiased pass@k
  on 256 held-out problems.
- ``cpu_n64``: the declared comparison, in a regime where uniform MaxRL raised held-out pass@1 and kept
  pass@16 in calibration: the same task, an open pool of 4,096 training problems (none revisited), 8 problems
  x 64 rollouts a step for 128 steps at lr 5e-5; SERA on pilot estimates. Endpoints and methods in
  ``configs/offline.py``.
- ``cpu_epochs``: the released SERA (its authors' frozen per-epoch estimates and token-mean loss) against uniform
  MaxRL on 256 fixed training problems revisited 10 times, 16 paired seeds; endpoints in ``configs/offline.py``.
- ``gpu``: MaxRL's GSM8K setting: SmolLM2-360M-Instruct, 256 prompts x 128 rollouts, lr 1e-5, responses up to
  2048 tokens, 1500 steps, temperature 1.0; evaluation on GSM8K-Platinum at temperature 0.6, top-p 0.95.
  Needs local files: ``--config.data.dir`` (openai/gsm8k), ``--config.data.eval_dir`` (madrylab/gsm8k-platinum),
  ``--config.model.dir`` (HuggingFaceTB/SmolLM2-360M-Instruct).
- ``full``: Qwen3-1.7B-Base (or 4B: ``--config.model.dir`` and ``--config.model.hf_repo``) on POLARIS-53K,
  256 x 16, lr 1e-6, 1000 steps, gradients clipped at 0.3, MaxRL's POLARIS prompt; evaluated on MATH-500.
  Parameters are sharded FSDP-style (``config.mesh``).

MaxRL's released scripts (``smollm/smollm.sh``, ``qwen3_experiments/run_qwen3_training.sh``) against ``gpu`` /
``full``, every difference matched or with its reason:

- GSM8K (``gpu``): a response that fills the 2,048-token cap scores 0 even when its last token is EOS
  (``zero_reward_on_max_response_length``): ``grading.truncation="at_cap"``. MaxRL validates with 32 samples;
  ``gpu`` draws 1,024 per problem, not 32, because the claim is pass@k up to k = 1,024 (MaxRL's paper reports
  pass@1024 too; pass@k needs n >= k).
- POLARIS (``full``): the prompt is the problem then, with no separator, ``POLARIS_PROMPT_SUFFIX``
  (``"\nPlease reason step by step, and put your final answer within \\boxed{{}}."``, the braces doubled as
  in MaxRL's polaris.py, which is not an f-string); truncated responses are graded (the script passes no
  length rule to its reward manager): ``grading.truncation="graded"``; gradients clipped at 0.3 (``GRAD_CLIP``).
  MaxRL evaluates on AIME25 and MATH-500 with 32 samples (seed 79); ``full`` evaluates MATH-500 only, with 256
  samples, not AIME25, because the variant was declared with one evaluation set (the ``paper_*`` variants pool
  several through ``data.eval_sets``; pass ``--config.data.eval_dir`` to swap in another MATH-format set); not 32
  samples, because the comparison is pass@k up to k = 256; and seeds are the comparison's paired seeds, not 79,
  because MaxRL's ``SEED=79`` is one run's seed of its own framework, not a setting that transfers.

The SERA authors' runs (ChenZihao0121/SERA @ 3252ed5, a verl fork), each restated with the source of every
setting beside it (``configs/paper.py``; what could not be reproduced is said there):

- ``paper_gsm8k`` (``smollm/smollm.sh``): SmolLM2-360M-Instruct on GSM8K, 256 prompts x N0 16, lr 1e-5, 2,000
  steps, 2,048-token responses scored 0 at the cap; evaluated on GSM8K-Platinum, 256 samples at temperature 0.6,
  top-p 0.95 (``evaluation/sequence.py``'s smollm profile). 8 GPUs.
- ``paper_math`` (``qwen/qwen.sh``): Qwen2.5-Math-1.5B on their 8,192 SimpleRL-Zoo MATH level 3-5 rows (their
  prepared verl parquet: ``config.data.source="verl"``), lr 1e-6, gradients clipped at 0.3, 600 steps, 3,000
  tokens; evaluated on BeyondAIME, AIME 2025, MATH-500 and OlympiadBench with 512 samples. 8 GPUs.
- ``paper_polaris`` (``qwen/qwen3.sh``): Qwen3-4B-Base on POLARIS-53K, 1,000 steps, 4,096 tokens; evaluated on
  BeyondAIME, AIME 2025, MATH-500 and Minerva Math with 512 samples. 32 GPUs (4 hosts: ``--multihost``).
- ``paper_tiny``: ``paper_math``'s code paths at seconds scale (tests, CI): a tiny random decoder stored as a
  Hugging Face checkpoint, prepared training rows and evaluation files in the authors' layouts, written by
  ``experiment.write_paper_tiny_files(DIR)``, which returns the ``--config.*`` paths to pass.

The three run the released rule (``sera``: ``dynamic_active_equalized``) on the frozen per-epoch estimates
(``epoch_history``) against uniform MaxRL (``paper_tiny``: SERA alone), with the authors' loss
(``token_mean_microbatch`` on their per-GPU micro-batch). Each needs local files (nothing is downloaded)::

    python -m experiments.math_reasoning.main --config=experiments/math_reasoning/config.py:paper_math \
        --workdir=/runs/paper_math --config.model.dir=/models/Qwen2.5-Math-1.5B \
        --config.data.dir=/data/math35/train.parquet --config.data.eval_dirs.beyondaime=/data/BeyondAIME \
        --config.data.eval_dirs.aime25=/data/aime25 --config.data.eval_dirs.math500=/data/MATH-500 \
        --config.data.eval_dirs.olympiadbench=/data/olympiadbench/test.jsonl

Grading (``config.grading``, ``sera_jax.envs.math_grading``) follows MaxRL's rule in every variant: the whole
response is parsed (an unboxed "The answer is 18." can score 1); a response cut at the length limit scores 0
(``truncation``: ``no_stop`` offline, MaxRL's ``at_cap`` on GSM8K and ``graded`` on POLARIS, as above);
``gpu`` / ``full`` run math-verify itself (as MaxRL does), the offline variants the builtin grader. Every
grading call is bounded by ``grading.timeout_s`` (a timeout scores 0 and is logged); a call that raises or
loses its worker scores 0 and is counted too, and the run stops (``math_grading.GradingError``) when more than
``grading.max_error_frac`` of a step's calls fail: a broken grader must not train on all-zero rewards. Each
step logs ``grading_calls`` / ``grading_timeouts`` / ``grading_errors``. Loss aggregation is
verl's token-mean in every variant: over the whole batch for MaxRL (uniform) and GRPO, multiplicity-corrected
(each prompt's tokens share 1/P) for SERA; ``gpu`` / ``full`` also take verl's AdamW weight decay 0.01.
"""

from __future__ import annotations

import ml_collections

from experiments.math_reasoning.configs import maxrl, offline, paper
# Kept here for the callers that read them from this module.
from experiments.math_reasoning.configs.maxrl import POLARIS_PROMPT_SUFFIX  # noqa: F401
from experiments.math_reasoning.configs.paper import PAPER_SCRIPTS  # noqa: F401
from sera_jax.rl.config import default_rl_config
from sera_jax.train.sharding import default_mesh_config
from sera_jax.train.writers import default_wandb_config

# What each compared method changes in ``config.sera`` (everything else is shared), named as the allocator registry
# names it: the estimates of p the allocating methods read are the variant's own field, ``sera.p_estimate`` (the
# base: the SERA authors' frozen per-epoch estimates from earlier epochs' rollouts, epoch 0 uniform; ``cpu_n64``: a
# 2-rollout pilot). The declared runs named SERA on a pilot ``sera_pilot`` (and ``dynamo_pilot``, ``knapsack_pilot``)
# and the all-active rule on epoch estimates ``sera_all_active_epochs``: their files keep those names.
METHODS = {
    "uniform": dict(method="uniform", estimator="maxrl", correction=False),  # MaxRL: verl's batch token-mean
    "sera": dict(method="sera", estimator="maxrl", correction=True),
    "sera_no_correction": dict(method="sera", estimator="maxrl", correction=False),
    "sera_all_active": dict(method="sera_all_active", estimator="maxrl", correction=True),
    "grpo": dict(method="uniform", estimator="grpo", correction=False),  # for context, as verl runs it
    # Other allocators of the registry (sera_jax.core.allocators), on the same estimates as SERA: SERA's
    # sum-objective ablation (corrected), and the published peers with their published loss (no correction).
    "sera_sum": dict(method="sera_sum", estimator="maxrl", correction=True),
    "dynamo": dict(method="dynamo", estimator="maxrl", correction=False),
    "knapsack": dict(method="knapsack", estimator="maxrl", correction=False),
    # The peers that choose which rollouts train, sample in rounds (DARS on its own pilot) or select prompts
    # among sera.candidate_ratio x P candidates of the same stream (MoPPS without decay, as its math scripts).
    "dapo": dict(method="dapo", estimator="maxrl", correction=False),
    "pods": dict(method="pods", estimator="maxrl", correction=False),
    "reinforce_ada": dict(method="reinforce_ada", estimator="maxrl", correction=False),
    "dars": dict(method="dars_et", estimator="maxrl", p_estimate="pilot", correction=False),
    "mopps": dict(method="mopps", estimator="maxrl", history_decay=1.0, correction=False),
    "greso": dict(method="greso", estimator="maxrl", correction=False),
}

PAPER_VARIANTS = ("paper_gsm8k", "paper_math", "paper_polaris", "paper_tiny")
VARIANTS = ("tiny", "demo", "cpu", "cpu_n64", "cpu_epochs", "gpu", "full", *PAPER_VARIANTS)
# What each variant changes in the base, by the file that holds its settings.
_CONFIGURE = {**offline.VARIANTS, **maxrl.VARIANTS, **paper.VARIANTS}


def base_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    """What every variant starts from, named ``variant``: the offline default (arithmetic word problems, a small
    decoder trained from scratch after one shared SFT)."""
    c = default_rl_config()
    c.variant = variant
    c.seeds = (0, 1, 2)
    c.rl.data_order = "seed"  # seeds vary the training prompts' order too; methods of a seed share it
    c.methods = ("uniform", "sera")
    # Arithmetic word problems (the offline default). num_sft: the SFT pool, disjoint from the RL train set.
    # The one-digit ladder: level k = k steps on one-digit operands (see task.LADDERS).
    # No prompt suffix for the from-scratch model: it would be the same ~16 tokens on every prompt.
    c.data = dict(source="arithmetic", dir="", eval_dir="", num_train=128, num_eval=80, num_sft=8000,
                  ladder="one_digit", levels=(1, 2, 3, 4, 5), level_weights=(), test_fraction=0.1, seed=1234,
                  vocab_size=512, tokenizer_corpus=2000, prompt_suffix="", prompt_separator=" ", use_chat_template=True,
                  system="", max_prompt_tokens=0, max_new_tokens=56)
    # attention / remat / scan_layers: how the decoder runs (sera_jax.models.decoder.DecoderConfig), not what it is.
    c.model = dict(source="scratch", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=256,
                   dtype="float32", dir="", hf_repo="", attention="auto", remat="none", scan_layers=False)
    # shared: one SFT start policy for all seeds, made with sft.seed (the seeds then differ in RL only); else one
    # per seed, made with that seed.
    c.sft = dict(steps=500, batch_size=32, learning_rate=3e-3, warmup_steps=30, schedule="cosine", b1=0.9, b2=0.95,
                 weight_decay=0.0, shared=True, seed=0)
    # rule: "maxrl" (the whole response, as math-verify reads it) or "final_answer" (\boxed{} / #### only);
    # backend: "builtin" (offline) or "math_verify"; timeout_s bounds every grading call; workers: processes
    # that grade a step's responses in parallel; truncation: which responses score 0 for their length
    # (task.TRUNCATION_RULES); max_error_frac: the fraction of a step's grading calls that may fail (raise, or
    # lose their worker) before the run stops with math_grading.GradingError.
    c.grading = dict(rule="maxrl", backend="builtin", timeout_s=10.0, workers=1, truncation="no_stop",
                     max_error_frac=0.1)
    c.mesh = default_mesh_config()
    # profile: per-prompt success rates of the RL start; wandb: Weights & Biases, off by default
    c.log = dict(progress=True, profile_samples=32, wandb=default_wandb_config())
    # 16 prompts x 8 rollouts on average; 128 training prompts = 8 steps per epoch, 32 steps = 4 epochs.
    # lr 1e-4: at 3e-4 the policy's entropy rose and held-out pass@k fell below the SFT start for both methods.
    c.rl.update(steps=32, prompts_per_step=16, rollouts_per_step=128, learning_rate=1e-4)
    c.sera.update(p_estimate="epoch_history", n_min=2, n_max=32, history_decay=0.5, aggregation="token_mean")
    # Evaluation and the start profile both sample 32 prompts x 32 rows per call: one sampler compile.
    c.eval.update(every=32, samples_per_prompt=32, ks=(1, 2, 4, 8, 16, 32), max_rollouts_per_call=1024)
    c.ckpt.update(every=8)
    return c


def get_config(variant: str = "cpu") -> ml_collections.ConfigDict:
    """The config of ``variant`` (one of ``VARIANTS``): ``base_config()`` changed as its file in ``configs/`` says."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    c = base_config(variant)
    _CONFIGURE[variant](c)
    return c


def validate_config(config: ml_collections.ConfigDict) -> None:
    """ValueError naming the field for a bad value of the fields only some variants have (``data.eval_sets``,
    ``data.eval_dirs``, ``data.eval_max_prompt_tokens``, ``data.strip_question``, ``grading.eval_truncation``) and
    for ``data.source`` / ``grading.truncation``; the rest is checked where it is used (``task.make_task``, the
    trainer's ``validate_rl_config``)."""
    from experiments.math_reasoning.task import SOURCES, TRUNCATION_RULES
    from sera_jax.data.math_data import EVAL_SETS

    d, g = config.data, config.grading
    if d.source not in SOURCES:
        raise ValueError(f"config.data.source={d.source!r}: must be one of {list(SOURCES)}")
    for field, rule, allowed in (("truncation", g.truncation, TRUNCATION_RULES),
                                 ("eval_truncation", g.get("eval_truncation", ""), ("", *TRUNCATION_RULES))):
        if rule not in allowed:
            raise ValueError(f"config.grading.{field}={rule!r}: must be one of {list(allowed)}"
                             + (" ('' : as in training)" if field == "eval_truncation" else ""))
    if "eval_sets" in d:
        sets = d.eval_sets
        if not isinstance(sets, (tuple, list)) or not all(isinstance(n, str) for n in sets):
            raise ValueError(f"config.data.eval_sets={sets!r}: must be a tuple of names from {list(EVAL_SETS)}")
        unknown = [n for n in sets if n not in EVAL_SETS]
        if unknown:
            raise ValueError(f"config.data.eval_sets has {unknown}: each must be one of {list(EVAL_SETS)}")
        repeated = sorted({n for n in sets if list(sets).count(n) > 1})
        if repeated:
            raise ValueError(f"config.data.eval_sets={tuple(sets)!r} repeats {repeated}")
        if not sets and d.source == "verl":
            raise ValueError("config.data.eval_sets is empty: config.data.source='verl' evaluates on it")
        dirs = d.get("eval_dirs", {})
        for name in sets:
            if not isinstance(dirs.get(name, None), str):
                raise ValueError(f"config.data.eval_dirs.{name}={dirs.get(name, None)!r}: every set of "
                                 "config.data.eval_sets needs its folder or file (a string)")
        stray = sorted(set(dirs.keys()) - set(sets))
        if stray:
            raise ValueError(f"config.data.eval_dirs has {stray}, not in config.data.eval_sets={tuple(sets)!r}")
    elif d.source == "verl":
        raise ValueError("config.data.source='verl' evaluates on config.data.eval_sets, which this config lacks")
    for field in ("max_prompt_tokens", "eval_max_prompt_tokens"):
        value = d.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"config.data.{field}={value!r}: must be an int >= 0 (0: no limit)")
    if not isinstance(d.get("strip_question", True), bool):
        raise ValueError(f"config.data.strip_question={d.strip_question!r}: must be True or False")
