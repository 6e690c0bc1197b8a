"""The ``paper_*`` variants: the SERA authors' settings, each with its source.

Shared by all three scripts (the same flag on the same line of each where it is not said otherwise):

- SERA (``algorithm.SERA.*``; smollm.sh:37-48, qwen.sh:31-42, qwen3.sh:38-49): ``adv_estimator=sera`` ->
  ``estimator="maxrl"`` (their centred MaxRL advantage, ray_trainer.py's compute_advantage); ``allocation_mode=
  dynamic_active_equalized`` -> ``method="sera"`` (the released rule); ``pq_estimator=historical`` ->
  ``p_estimate="epoch_history"``; ``n_min=2``, ``n_max=64``; ``activation_useful_threshold=0.05`` ->
  ``activation_threshold``; ``historical_prior_alpha/beta=0.5`` -> ``epoch_prior``; ``historical_discount=0.75``
  -> ``epoch_discount``; ``use_rollout_count_normalization=True`` -> ``correction=True`` (weights N0 / N_i);
  ``use_rho_normalization=False`` (we have no rho normalisation: the same).
- Budget: ``data.train_batch_size=256`` prompts x ``rollout.n=16`` (N_ROLLOUTS; their budget ``P N0``,
  ray_trainer.py's _generate_SERA_epoch_batch) -> 256 x 16 = 4,096 rollouts a step; sampling at
  ``temperature=1.0``, top-p 1 (smollm.sh:74 + yaml ``rollout.top_p: 1``; qwen.sh:82-83, qwen3.sh:88-89).
- Loss: ``loss_agg_mode=token-mean`` (smollm.sh:17/61, qwen.sh:68, qwen3.sh:75) on each micro-batch of
  ``ppo_micro_batch_size_per_gpu`` rows, divided by the micro-batches (verl's dp_actor.update_policy; one
  mini-batch = the whole batch: ``ppo_mini_batch_size=256``, ``ppo_epochs=1``) -> ``aggregation=
  "token_mean_microbatch"``, ``loss_microbatch_rows`` = that micro-batch. One optimizer step per batch on the
  batch's own samples, so PPO's ratio is 1 and its clip (``clip_ratio_low/high=0.2``, qwen.sh:64-65; yaml
  default 0.2 for smollm) never binds: the update is the plain policy gradient we take.
- No KL, no entropy bonus: ``use_kl_in_reward=False``, ``kl_ctrl.kl_coef=0.0``, ``use_kl_loss=False``,
  ``entropy_coeff=0`` (smollm.sh:49-50/60/63, qwen.sh:43-45/62-63/67, qwen3.sh:50-52/69-70/74): our update has
  neither.
- AdamW at a constant rate (``warmup_style=constant``, ``lr_warmup_steps_ratio=0``: qwen.sh:58-59, qwen3.sh:
  65-66, yaml defaults for smollm), ``weight_decay`` 0.01 (yaml ``actor.optim.weight_decay``), betas (0.9,
  0.999) (verl/workers/fsdp_workers.py ``_build_model_optimizer``'s default).
- Evaluation (their standalone protocol, sequence.py): temperature 0.6, top-p 0.95, top-k off, a fixed
  number of samples per prompt, unbiased pass@k at k = 1, 2, 4, ..., n (passk.py's ``pass_at_k`` and
  ``default_ks``: the combination estimator, ours), a response that reaches the cap scored 0
  (``hit_response_cap``, grading.py's ``grade``) -> ``grading.eval_truncation="at_cap"``; math-verify with
  the gold in ``\\boxed{}`` (grading.py's ``initialize``, MaxRL's call: ``backend="math_verify"``). The
  cadence is their in-training validation's ``trainer.test_freq`` (which sampled ``N_VAL=32`` on their
  ``VAL_DATA`` instead); they also evaluate before training where ``val_before_train=True`` and at the last
  step (``val_on_last_step``): our loop evaluates at step 0, every ``eval.every`` and at the end, always.
- Mesh: FSDP over all their GPUs (verl shards parameters over every rank: yaml ``fsdp_size: -1``), the
  rollouts split over the same devices: ``mesh.shape = (1, GPUs, 1)``. Memory: ``rl.update_microbatches``
  slices the update to their per-GPU micro-batch per device (``B / (micro x GPUs)``); sampling through 1,024
  slots a call (their vLLM ``max_num_seqs`` is 512-1,024 per GPU).

Not reproduced: their evaluation reports pass@k per benchmark (passk.py's ``_summarize``); ours pools the
``data.eval_sets`` into one held-out set (per-set numbers need a run per set, ``--config.data.eval_sets``).
Their vLLM context (qwen.sh:75 ``max_model_len=4096``; sequence.py's qwen25 ``context=4096``) cuts a response
short when prompt + response pass 4,096 tokens (only OlympiadBench prompts over 1,096 tokens); ours always
allows the full response. ``balance_batch=True`` (qwen.sh:94, qwen3.sh:100) reorders rows across GPUs by
length before the micro-batches are cut; ours cuts them in the flat layout's order (SmolLM's
``balance_batch=False``, smollm.sh:90, is ours exactly). ``SEED=79`` (qwen.sh:27, qwen3.sh:27) seeds their
framework's streams, which ours cannot replay; our ``seeds`` are our own.
"""

from __future__ import annotations

import ml_collections

from sera_jax.data.math_data import PROMPT_SUFFIX, QWEN_INSTRUCTION

# The SERA authors' scripts (ChenZihao0121/SERA @ 3252ed5) the paper_* variants restate. Below, "smollm.sh:N" is
# line N of smollm/smollm.sh, "qwen.sh:N" / "qwen3.sh:N" of qwen/qwen.sh / qwen/qwen3.sh; "sequence.py" is
# evaluation/sequence.py (PROFILES, lines 23-35: the standalone evaluation behind their reported pass@k),
# "prepare_data.py" evaluation/prepare_data.py, "paper_assets.json" evaluation/paper_assets.json, "yaml" verl's
# defaults in verl/trainer/config/ppo_trainer.yaml (key path given).
PAPER_SCRIPTS = {"paper_gsm8k": "smollm/smollm.sh", "paper_math": "qwen/qwen.sh", "paper_polaris": "qwen/qwen3.sh",
                 "paper_tiny": "qwen/qwen.sh"}


def shared(c: ml_collections.ConfigDict) -> None:
    """What the three scripts share (the module's docstring gives each flag's line)."""
    c.seeds = (0,)  # one run a method, as each script is one run
    # SERA against uniform MaxRL (their baseline: the same script with SERA's allocation off, ray_trainer.py's
    # _SERA_allocation_active; uniform's loss is verl's token-mean per micro-batch, weights 1).
    c.methods = ("uniform", "sera")
    c.sft.steps = 0  # RL from the pretrained model
    c.log.profile_samples = 0
    c.model = dict(source="pretrained", dir="", hf_repo="", dtype="bfloat16", param_dtype="float32",
                   attention="auto", remat="block", scan_layers=True)
    # The released rule on frozen per-epoch estimates (see the docstring for each flag's line).
    c.sera.update(method="sera", estimator="maxrl", p_estimate="epoch_history", correction=True, n_min=2, n_max=64,
                  activation_threshold=0.05, epoch_prior=(0.5, 0.5), epoch_discount=0.75,
                  aggregation="token_mean_microbatch")
    c.rl.update(prompts_per_step=256, rollouts_per_step=256 * 16, temperature=1.0, top_p=1.0, b1=0.9, b2=0.999,
                weight_decay=0.01, sample_slots=1024, share_prompts=False)
    # Grading: math-verify as MaxRL's reward (verl's math_verify.py) and their evaluation (grading.py) call it.
    c.grading.update(rule="maxrl", backend="math_verify", workers=16, timeout_s=10.0, eval_truncation="at_cap")
    c.data.update(num_sft=0, use_chat_template=True,  # data.apply_chat_template=True (qwen.sh:52; yaml default)
                  system="",  # their rows hold one user turn (prepare_data.py, prepare_polaris.py)
                  strip_question=False,  # the question as it is, then the instruction (prepare_data.py:64)
                  num_eval=0)  # every problem of each set
    c.eval.update(temperature=0.6, top_p=0.95,  # sequence.py PROFILES: temperature=0.6, top_p=0.95
                  max_rollouts_per_call=4096, sample_slots=1024)


def paper_gsm8k(c: ml_collections.ConfigDict) -> None:
    """smollm/smollm.sh: SmolLM2-360M-Instruct on GSM8K."""
    shared(c)
    c.model.update(dir="~/models/SmolLM2-360M-Instruct",
                   hf_repo="HuggingFaceTB/SmolLM2-360M-Instruct")  # MODEL_PATH, smollm.sh:7
    c.data.update(source="gsm8k", dir="~/data/gsm8k",  # TRAIN_DATA data/gsm8k/train.parquet, smollm.sh:8
                  num_train=0,  # the whole GSM8K train split
                  # question, " ", "Let's think ... \\boxed{}." (SMOLLM_INSTRUCTION, prepare_data.py:17)
                  prompt_suffix=PROMPT_SUFFIX, prompt_separator=" ",
                  max_prompt_tokens=512,  # data.max_prompt_length=512 + filter_overlong_prompts, smollm.sh:54-55
                  eval_max_prompt_tokens=512,  # sequence.py smollm max_prompt=512
                  max_new_tokens=2048,  # MAX_RESPONSE_LENGTH=2048, smollm.sh:16
                  eval_sets=("gsm8k_platinum",),  # paper_assets.json profile smollm
                  eval_dirs=dict(gsm8k_platinum="~/data/gsm8k-platinum"))
    # 0 at the cap, EOS or not: zero_reward_on_max_response_length=True, max_resp_len, smollm.sh:82-83
    c.grading.truncation = "at_cap"
    c.rl.update(steps=2000,  # trainer.total_training_steps=2000, smollm.sh:96
                learning_rate=1e-5,  # LR=1e-5, smollm.sh:13
                grad_clip=1.0,  # not set: yaml actor.grad_clip 1.0
                update_microbatches=8, logprob_chunk=128)  # 64 rows a device a slice: 4096 / (64 x 8)
    c.sera.loss_microbatch_rows = 64  # ppo_micro_batch_size_per_gpu=64, smollm.sh:66
    c.eval.update(every=100,  # trainer.test_freq=100, smollm.sh:92
                  samples_per_prompt=256, ks=tuple(2**i for i in range(9)))  # sequence.py smollm samples=256
    c.ckpt.update(every=100)  # trainer.save_freq=100, smollm.sh:91
    c.mesh.shape = (1, 8, 1)  # trainer.n_gpus_per_node=8, nnodes=1, smollm.sh:88-89


def paper_math(c: ml_collections.ConfigDict) -> None:
    """qwen/qwen.sh: Qwen2.5-Math-1.5B on their 8,192 SimpleRL-Zoo MATH level 3-5 rows."""
    shared(c)
    c.model.update(dir="~/models/Qwen2.5-Math-1.5B", hf_repo="Qwen/Qwen2.5-Math-1.5B")  # MODEL_PATH, qwen.sh:7
    c.data.update(source="verl",  # their prepared parquet, its chat turns as they are (no suffix added)
                  dir="~/data/math35/train.parquet",  # TRAIN_DATA, qwen.sh:8
                  num_train=8192,  # their 8,192 MATH level 3-5 rows of SimpleRL-Zoo-Data (their README)
                  # the evaluation sets: problem + "\nPlease reason ... \\boxed{{}}." (prepare_data.py:16)
                  prompt_suffix=QWEN_INSTRUCTION, prompt_separator="",
                  max_prompt_tokens=1024,  # data.max_prompt_length=1024 + filter_overlong_prompts, qwen.sh:49/51
                  eval_max_prompt_tokens=4095,  # sequence.py qwen25 max_prompt=4095
                  max_new_tokens=3000,  # MAX_RESPONSE_LENGTH=3000, qwen.sh:16
                  eval_sets=("beyondaime", "aime25", "math500", "olympiadbench"),  # paper_assets.json qwen25
                  eval_dirs=dict(beyondaime="~/data/BeyondAIME", aime25="~/data/aime25", math500="~/data/MATH-500",
                                 olympiadbench="~/data/olympiadbench"))
    c.grading.truncation = "graded"  # no length rule passed to the reward manager (qwen.sh:93)
    c.rl.update(steps=600,  # trainer.total_training_steps=600, qwen.sh:110
                learning_rate=1e-6,  # LR=1e-6, qwen.sh:13
                grad_clip=0.3,  # actor.grad_clip=0.3, qwen.sh:66
                update_microbatches=32, logprob_chunk=256)  # 16 rows a device a slice: 4096 / (16 x 8)
    c.sera.loss_microbatch_rows = 16  # ppo_micro_batch_size_per_gpu=16, qwen.sh:61
    c.eval.update(every=50,  # trainer.test_freq=50, qwen.sh:108
                  samples_per_prompt=512, ks=tuple(2**i for i in range(10)))  # sequence.py qwen25 samples=512
    c.ckpt.update(every=100)  # trainer.save_freq=100, qwen.sh:105
    c.mesh.shape = (1, 8, 1)  # N_GPUS_PER_NODE=8, NNODES=1, qwen.sh:17-18


def paper_polaris(c: ml_collections.ConfigDict) -> None:
    """qwen/qwen3.sh: Qwen3-4B-Base on POLARIS-53K."""
    shared(c)
    c.model.update(dir="~/models/Qwen3-4B-Base", hf_repo="Qwen/Qwen3-4B-Base")  # MODEL_PATH, qwen3.sh:7
    c.data.update(source="polaris",  # TRAIN_DATA data/polaris/train.parquet, qwen3.sh:8 (prepare_polaris.py)
                  dir="~/data/polaris-53k",  # POLARIS-53K at 296f8e3, or their prepared data/polaris folder
                  num_train=0,  # every row (prepare_polaris.py keeps all, in order)
                  # problem + "\nPlease reason ... \\boxed{{}}." (INSTRUCTION, prepare_polaris.py:10, 15)
                  prompt_suffix=QWEN_INSTRUCTION, prompt_separator="",
                  max_prompt_tokens=1024,  # data.max_prompt_length=1024 + filter_overlong_prompts, qwen3.sh:56/58
                  eval_max_prompt_tokens=27904,  # sequence.py qwen3 max_prompt=27904
                  max_new_tokens=4096,  # MAX_RESPONSE_LENGTH=4096, qwen3.sh:16
                  eval_sets=("beyondaime", "aime25", "math500", "minerva"),  # paper_assets.json qwen3
                  eval_dirs=dict(beyondaime="~/data/BeyondAIME", aime25="~/data/aime25", math500="~/data/MATH-500",
                                 minerva="~/data/minervamath"))
    c.grading.truncation = "graded"  # no length rule passed to the reward manager (qwen3.sh:99)
    c.rl.update(steps=1000,  # trainer.total_training_steps=1000, qwen3.sh:116
                learning_rate=1e-6,  # LR=1e-6, qwen3.sh:13
                grad_clip=0.3,  # actor.grad_clip=0.3, qwen3.sh:73
                update_microbatches=32, logprob_chunk=256)  # 4 rows a device a slice: 4096 / (4 x 32)
    c.sera.loss_microbatch_rows = 4  # ppo_micro_batch_size_per_gpu=4, qwen3.sh:68
    c.eval.update(every=50,  # trainer.test_freq=50, qwen3.sh:114
                  samples_per_prompt=512, ks=tuple(2**i for i in range(10)))  # sequence.py qwen3 samples=512
    c.ckpt.update(every=20)  # trainer.save_freq=20, qwen3.sh:111
    c.mesh.shape = (1, 32, 1)  # N_GPUS_PER_NODE=8 x NNODES=4, qwen3.sh:17-18: 4 hosts, run with --multihost


def paper_tiny(c: ml_collections.ConfigDict) -> None:
    """``paper_math`` at seconds scale (tests, CI), on the files ``experiment.write_paper_tiny_files`` writes."""
    paper_math(c)
    # paper_math's code paths at seconds scale (the decoder runs plainly: remat, scanned layers and decoding
    # slots are execution options, tested on their own): every path from experiment.write_paper_tiny_files.
    c.model.update(dir="", hf_repo="", dtype="float32", remat="none", scan_layers=False)
    c.data.update(dir="", num_train=8, num_eval=2, max_prompt_tokens=128, eval_max_prompt_tokens=256,
                  max_new_tokens=16, eval_sets=("aime25", "olympiadbench", "minerva"))
    c.data.eval_dirs = dict(aime25="", olympiadbench="", minerva="")  # three of the authors' layouts
    c.grading.update(backend="builtin", workers=1)  # offline: no math-verify needed
    c.methods = ("sera",)  # the paper-only paths are SERA's (uniform MaxRL runs in ``tiny``)
    c.log.progress = False
    # 3 steps of 4 prompts over 8: epoch 0 (steps 0-1) is uniform, step 2 reads the frozen estimates.
    c.rl.update(steps=3, prompts_per_step=4, rollouts_per_step=4 * 4, learning_rate=1e-4, sample_slots=0,
                update_microbatches=1, logprob_chunk=0)
    c.sera.update(n_max=8, loss_microbatch_rows=4)
    c.eval.update(every=3, samples_per_prompt=4, ks=(1, 2, 4), max_rollouts_per_call=16, sample_slots=0)
    c.ckpt.update(every=0)  # one checkpoint, at the end
    c.mesh.shape = (1, -1, 1)  # FSDP over whatever devices there are


VARIANTS = {"paper_gsm8k": paper_gsm8k, "paper_math": paper_math, "paper_polaris": paper_polaris,
            "paper_tiny": paper_tiny}
